#!/usr/bin/env python3
"""Qwen3-Next and Qwen3.5-MoE: the C engine's forward pass against HuggingFace transformers.

Reference: tests/data/hf_qwen3next and tests/data/hf_qwen35moe
(scripts/make_qwen3next_goldens.py): tiny random Qwen3NextForCausalLM and
Qwen3_5MoeForCausalLM written to GGUF by llama.cpp's own converter
(convert_hf_to_gguf.py, f16 matrices), run by HF in float64 on exactly the
file's values: a 150-token prompt (HF's chunked delta rule, 3 chunks of 64),
then 8 decode steps through its cache (the recurrent form). 4 layers: linear
attention (conv of width 4, 2 key heads and 4 value heads, grouped for
qwen3next, tiled for qwen35moe), gated full attention with partial RoPE (8 of
32), 8 experts top-2 and a gated shared expert. Every named intermediate is
compared: attention or linear-attention output, the delta rule's output
(lin_core), router logits, top-k ids and weights, routed-expert output, gated
shared-expert output, residual stream, logits. The first tensor out of
tolerance is named.

Tolerances (relative L2 error, ||ours - ref|| / ||ref||):
- precise (products in double from the f16 weights, f32 KV and states):
  float32 storage and accumulation between products (~sqrt(n) 2^-24 a sum of
  n <= 128), the delta rule's float32 state over 158 steps of a contracting
  recurrence (test_cpu_ssm: within 2e-5 of the largest value), a handful of
  stages a layer over 4 layers: TOL_PRECISE = 1e-5 (measured 5e-7).
- quantized (the products' activations rounded: f16 weights take f16
  activations, 2^-11 relative a value; bf16 on AMX, 2^-8), f16 KV: about
  2^-11..2^-8 relative a product, several products a layer: TOL_QUANT = 1e-2
  (measured 2.4e-4 at AVX2).
- top-k ids exact, except a near tie (gap_fn).
Also: the prompt in batches of 1, 3 and 7 (the chunked delta rule over
chunks that start anywhere, and token by token) gives every intermediate
within TOL_PRECISE (logits are compared only where computed: the last token
of a batch); the prompt as one batch against token by token: logits within
1e-5; 1 and 2 threads give the same logits bit for bit.
"""
import os
import sys

try:
    import numpy as np
    import gguf  # noqa: F401
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import DATA, failures, finish  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402
from test_forward_ref import compare, gap_fn, ours  # noqa: E402

TOL_PRECISE = 1e-5
TOL_QUANT = 1e-2


def check_arch(arch):
    gold = os.path.join(DATA, "hf_" + arch)
    model = os.path.join(gold, "tiny-f16.gguf")
    want, meta = ref.read_dump(os.path.join(gold, "tiny.golden.gguf"))
    toks = list(meta["dump.tokens"])
    n_prompt = int(meta["dump.n_prompt"])
    compare(f"HF {arch} precise", want, ours(model, toks, n_prompt, True, "f32"), TOL_PRECISE, gap_fn(want))
    compare(f"HF {arch} quantized", want, ours(model, toks, n_prompt, False, "f16"), TOL_QUANT, gap_fn(want))
    inner = {k: v for k, v in want.items() if k != "logits"}  # a batch computes its last token's
    for batch in (3, 7):
        compare(f"HF {arch} precise, batches of {batch}", inner,
                ours(model, toks, n_prompt, True, "f32", batch=batch), TOL_PRECISE, gap_fn(want))

    # the prompt token by token (the recurrence only) against one batch (chunks)
    a = ours(model, toks, n_prompt, True, "f32")
    b = ours(model, toks, 1, True, "f32")
    compare(f"HF {arch} precise, token by token", want, b, TOL_PRECISE, gap_fn(want))
    err = np.linalg.norm(a["logits"] - b["logits"]) / np.linalg.norm(a["logits"])
    if not err <= 1e-5:
        failures.append(f"{arch}: prompt as one batch vs token by token: logits rel err {err:.3e} > 1e-5")
    c = ours(model, toks, n_prompt, False, "f16", threads=1)
    d = ours(model, toks, n_prompt, False, "f16", threads=2)
    if not np.array_equal(c["logits"], d["logits"]):
        failures.append(f"{arch}: 1 vs 2 threads: logits differ")
    print(f"  {arch}: batch vs token-by-token logits rel err {err:.1e}; thread count invariance checked")


def main():
    for arch in ("qwen3next", "qwen35moe"):
        check_arch(arch)
    return finish("qwen3next and qwen35moe forwards match HF transformers")


if __name__ == "__main__":
    sys.exit(main())
