#!/usr/bin/env python3
"""Mixtral (arch llama), OLMoE, GLM-4-MoE, DeepSeek-V3 (arch deepseek2) and Gemma 4's MoE form (arch
gemma4): the C engine's forward pass against HuggingFace transformers.

Reference: tests/data/hf_mixtral, hf_olmoe, hf_glm4moe and hf_deepseek2 (scripts/make_moe_goldens.py):
tiny random MixtralForCausalLM, OlmoeForCausalLM, Glm4MoeForCausalLM and DeepseekV3ForCausalLM written to GGUF
by llama.cpp's own converter (convert_hf_to_gguf.py, f16 matrices), run by HF in float64
on exactly the file's values: a 40-token prompt, then 8 decode steps through its cache.
Mixtral: q/k rows permuted by the converter (normal RoPE), softmax top-2 renormalised.
OLMoE: RMSNorm over the whole q and k projections, NeoX RoPE, softmax top-2 not
renormalised. GLM-4-MoE: q/k/v biases, per-head QK norm, partial NeoX RoPE (8 of 16),
a leading dense layer, a shared expert, a sigmoid router with a selection bias, 4 groups
of which 2 are used, renormalised and scaled by 2.5. DeepSeek-V3: GLM's FFNs and router
behind Multi-head Latent Attention (q_lora 32, kv_lora 32, nope 16 + rope 8, v 16; YaRN
factor 40 with its softmax mscale; interleaved RoPE), which the engine runs in the absorbed
form over a cache of 40 values a position. Gemma 4 (tests/data/hf_gemma4,
scripts/make_gemma4_goldens.py): sliding (window 8, head 16, 2 KV heads) and global
layers (head 32, 1 KV head, K as V, proportional RoPE through rope_freqs), QK norms and a
scale-free V norm, a GELU-tanh dense MLP beside 8 GELU-tanh experts top-2 with the
router's own norm and per-expert scales, five FFN norms, a layer scale, a final logit
soft-cap. Every named intermediate is
compared: attention output, router logits, top-k ids and weights, routed-expert output,
shared-expert and dense-FFN outputs, residual stream, logits. The first tensor out of
tolerance is named.

Tolerances (relative L2 error, ||ours - ref|| / ||ref||), as test_qwen3next_hf's:
- precise (products in double from the f16 weights, f32 KV): float32 storage and
  accumulation between products, a handful of stages a layer over 3-4 layers:
  TOL_PRECISE = 1e-5.
- quantized (f16 weights take f16 activations, 2^-11 relative a value; bf16 on AMX,
  2^-8), f16 KV: TOL_QUANT = 1e-2.
- top-k ids exact, except a near tie: for softmax routers the reference's k-th and
  (k+1)-th router logits closer than 4x our router-logit error; for GLM's, the same on
  the selection scores sigmoid(logit) + bias (and on the groups' scores).
Also: the prompt in batches of 3 and 7 and token by token gives every intermediate
within TOL_PRECISE (logits only where computed: a batch's last token); 1 and 2 threads
give the same logits bit for bit.
"""
import os
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import DATA, failures, finish  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402
from test_forward_ref import compare, gap_fn, ours  # noqa: E402

TOL_PRECISE = 1e-5
TOL_QUANT = 1e-2


def sel_gap_fn(want, model):
    """Near ties of a sigmoid router with a selection bias and groups (GLM's): the gap
    between the k-th and (k+1)-th selection score of the kept groups, or between the
    last kept and the first dropped group, against 4x our router-logit error."""
    r = gguf.GGUFReader(model)
    arch = r.fields["general.architecture"].contents()
    n_group = int(r.fields[f"{arch}.expert_group_count"].contents())
    n_used_g = int(r.fields[f"{arch}.expert_group_used_count"].contents())
    bias = {t.name: np.asarray(t.data, dtype=np.float64) for t in r.tensors if t.name.endswith("exp_probs_b.bias")}

    def near_tie(name, t, got):
        lname = name.replace("topk_ids", "router_logits")
        w = np.asarray(want[lname][t], dtype=np.float64)
        g = np.asarray(got[lname]).reshape(np.shape(want[lname]))[t]
        sel = 1 / (1 + np.exp(-w)) + bias[name.replace("topk_ids", "exp_probs_b.bias")]
        grp = np.sort(sel.reshape(n_group, -1), axis=1)[:, -2:].sum(axis=1)
        gs = np.sort(grp)[::-1]
        keep = np.argsort(-grp, kind="stable")[:n_used_g]
        masked = np.where(np.isin(np.arange(len(sel)) // (len(sel) // n_group), keep), sel, -np.inf)
        k = want[name].shape[1]
        s = np.sort(masked)[::-1]
        gap = min(s[k - 1] - s[k], gs[n_used_g - 1] - gs[n_used_g] if n_used_g < n_group else np.inf)
        return gap < 4 * np.abs(g - w).max()
    return near_tie


def check_arch(arch):
    gold = os.path.join(DATA, "hf_" + arch)
    model = os.path.join(gold, "tiny-f16.gguf")
    want, meta = ref.read_dump(os.path.join(gold, "tiny.golden.gguf"))
    toks = list(meta["dump.tokens"])
    n_prompt = int(meta["dump.n_prompt"])
    near = sel_gap_fn(want, model) if arch in ("glm4moe", "deepseek2") else gap_fn(want)
    precise = ours(model, toks, n_prompt, True, "f32")
    compare(f"HF {arch} precise", want, precise, TOL_PRECISE, near)
    quant = ours(model, toks, n_prompt, False, "f16")
    compare(f"HF {arch} quantized", want, quant, TOL_QUANT, near)
    if str(meta.get("hf.decode_tokens", "")).startswith("greedy"):  # the decode tokens are HF's choices
        for label, got in (("precise", precise), ("quantized", quant)):
            lg = np.asarray(got["logits"]).reshape(np.shape(want["logits"]))
            mine = [int(np.argmax(lg[t])) for t in range(n_prompt - 1, len(toks) - 1)]
            if mine != toks[n_prompt:]:
                failures.append(f"{arch} {label}: greedy tokens {mine} != HF's {toks[n_prompt:]}")
        print(f"  {arch}: greedy tokens {toks[n_prompt:]} as HF's, precise and quantized")
    inner = {k: v for k, v in want.items() if k != "logits"}  # a batch computes its last token's
    for batch in (3, 7):
        compare(f"HF {arch} precise, batches of {batch}", inner,
                ours(model, toks, n_prompt, True, "f32", batch=batch), TOL_PRECISE, near)
    compare(f"HF {arch} precise, token by token", want, ours(model, toks, 1, True, "f32"), TOL_PRECISE, near)
    c = ours(model, toks, n_prompt, False, "f16", threads=1)
    d = ours(model, toks, n_prompt, False, "f16", threads=2)
    if not np.array_equal(c["logits"], d["logits"]):
        failures.append(f"{arch}: 1 vs 2 threads: logits differ")
    names = sorted({n.split(".", 2)[-1] for n in want if n.startswith("blk.")})
    print(f"  {arch}: compared {', '.join(names)}, logits; thread count invariance checked")


def main():
    for arch in ("mixtral", "olmoe", "glm4moe", "deepseek2", "gemma4"):
        check_arch(arch)
    return finish("mixtral, olmoe, glm4moe, deepseek2 and gemma4 forwards match HF transformers")


if __name__ == "__main__":
    sys.exit(main())
