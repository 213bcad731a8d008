#!/usr/bin/env python3
"""gpt-oss: the C engine's forward pass against HuggingFace transformers, layer by layer.

Reference: tests/data/hf_gptoss (scripts/make_gptoss_goldens.py): a tiny random
GptOssForCausalLM run by HF in float64 on exactly the GGUF's values (MXFP4
experts dequantized by the `gguf` package). 4 layers (sliding and full
attention), window 8, a 20-token prompt as one batch, then 8 decode steps, both
past the window; sinks, q/k/v/o, router and expert biases, the clamped SwiGLU
(clamps active on 1-2% of values), YaRN RoPE. Every named intermediate is
compared: attention output, router logits, top-k ids and weights, expert
output, residual stream, logits. The first tensor out of tolerance is named.

Tolerances (relative L2 error, ||ours - ref|| / ||ref||), derived as in
test_forward_ref.py:
- precise (products in double from dequantized weights, f32 KV): float32
  storage and accumulation between products, ~sqrt(n) 2^-24 per dot of n <= 256
  (1e-6), a handful of stages per layer over 4 layers: TOL_PRECISE = 1e-5.
- quantized (activations 8-bit per block for the integer products, f16 KV):
  about 0.7% per product (Gaussian activations) to 1.4% (SwiGLU output into
  down); the clamped SwiGLU's (u + 1) keeps the down input's tail like SiLU's:
  TOL_QUANT = 4%, as for qwen3moe.
- top-k ids exact, except a near tie (the reference's k-th and (k+1)-th
  router logits closer than 4x our router-logit error for that token).
Also: the prompt in batches of 3, so the sliding layers' KV caches are rings
of window + 3 = 11 rows that the 28 positions turn over twice (precise, every
intermediate but the logits of tokens inside a batch, which are not computed);
the prompt as 20 single-token steps gives the same as one batch (the window and
sinks in the batch path equal those of the decode path; rings of 9 rows), and
the thread count does not change the result.
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
TOL_QUANT = 0.04
GOLD = os.path.join(DATA, "hf_gptoss")



def main():
    model = os.path.join(GOLD, "tiny-mxfp4.gguf")
    want, meta = ref.read_dump(os.path.join(GOLD, "tiny-mxfp4.golden.gguf"))
    toks = list(meta["dump.tokens"])
    n_prompt = int(meta["dump.n_prompt"])
    compare("HF gpt-oss precise", want, ours(model, toks, n_prompt, True, "f32"), TOL_PRECISE, gap_fn(want))
    compare("HF gpt-oss quantized", want, ours(model, toks, n_prompt, False, "f16"), TOL_QUANT, gap_fn(want))
    inner = {k: v for k, v in want.items() if k != "logits"}  # a batch computes its last token's
    compare("HF gpt-oss precise, batches of 3 (KV rings of 11 rows)", inner,
            ours(model, toks, n_prompt, True, "f32", batch=3), TOL_PRECISE, gap_fn(want))

    # the whole sequence one token at a time (decode path only) against one batch
    a = ours(model, toks, n_prompt, True, "f32")
    b = ours(model, toks, 1, True, "f32")
    err = np.linalg.norm(a["logits"] - b["logits"]) / np.linalg.norm(a["logits"])
    if not err <= 1e-6:
        failures.append(f"prompt as one batch vs token by token: logits rel err {err:.3e} > 1e-6")
    c = ours(model, toks, n_prompt, False, "f16", threads=1)
    d = ours(model, toks, n_prompt, False, "f16", threads=2)
    if not np.array_equal(c["logits"], d["logits"]):
        failures.append("1 vs 2 threads: logits differ")
    print(f"  batch vs token-by-token logits rel err {err:.1e}; thread count invariance checked")
    return finish("gpt-oss forward matches HF transformers")


if __name__ == "__main__":
    sys.exit(main())
