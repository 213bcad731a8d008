#!/usr/bin/env python3
"""Build tiny Mixtral / OLMoE / GLM-4-MoE / DeepSeek-V3 test models with llama.cpp's converter, and their HF float64 goldens.

What it makes (under tests/data/hf_<arch>/, see docs/golden-format.md):
  tiny-f16.gguf         random-weight model written by llama.cpp's own convert_hf_to_gguf.py
                        (--outtype f16; glm4moe also --no-mtp): matrices F16, norms / biases / vectors F32 as the
                        converter decides
  tiny.golden.gguf      HF transformers (float64) run on dump.tokens = 40 prompt tokens + 8 decode
                        tokens: logits and per layer attn_out, router_logits, topk_ids, topk_weights,
                        ffn_out (routed experts only), shexp_out (shared experts), dense_out (dense
                        FFN of a leading dense layer), x_out; F64, I32 for ids
  config.json           the HF config the model was made from

Architectures (--arch):
  mixtral    HF MixtralForCausalLM  -> GGUF arch `llama` (experts): 3 MoE layers, 4 heads / 2 KV heads
             of 16, rope theta 1e6, 8 experts top-2 (softmax, top-k renormalised) of 32
  olmoe      HF OlmoeForCausalLM    -> `olmoe`: 3 MoE layers, 4 heads / 2 KV heads of 16, q_norm /
             k_norm over the whole q / k projection, 8 experts top-2 (softmax, NOT renormalised) of 32
  glm4moe    HF Glm4MoeForCausalLM  -> `glm4moe`: 4 layers (layer 0 dense FFN 96, 1..3 MoE),
             4 heads / 2 KV heads of 16, q/k/v bias, per-head q_norm / k_norm (use_qk_norm), partial
             rotary 0.5 (rope dim 8, NeoX), 8 routed experts top-2 of 16 + 1 shared expert of 16,
             sigmoid router with e_score_correction_bias, n_group 4 / topk_group 2, norm_topk_prob,
             routed_scaling_factor 2.5
  deepseek2  HF DeepseekV3ForCausalLM -> `deepseek2`: 4 layers (layer 0 dense FFN 96, 1..3 MoE),
             MLA with 4 heads, q_lora_rank 32, kv_lora_rank 32, qk_nope 16, qk_rope 8 (interleaved
             pairs = llama.cpp "normal" RoPE), v_head 16; YaRN as DeepSeek-V3 (factor 40, original
             ctx 4096, mscale 1, mscale_all_dim 1, beta_fast 32, beta_slow 1); experts as glm4moe
             (sigmoid + bias, 4 groups / 2, norm_topk_prob, scaling 2.5), scoring_func "sigmoid"
             written into config.json (the converter needs it: it is what writes
             expert_gating_func; without it llama.cpp falls back to softmax for deepseek2)
All: n_embd 64, vocab 256, untied output.

How (as scripts/make_qwen3next_goldens.py):
 1. Random float32 weights (numpy, fixed seed) set into the HF model (e_score_correction_bias, a
    buffer, too), save_pretrained (per-expert checkpoint layout) with a tiny byte-level BPE
    tokenizer (240 byte tokens + merges + the special tokens the converter wants = 256).
 2. llama.cpp's convert_hf_to_gguf.py (subprocess, code untouched) writes tiny-f16.gguf; the
    subprocess goes through a wrapper that only replaces TextModel.get_vocab_base_pre (our
    tokenizer's hash is unknown to it).
 3. The GGUF is read back with gguf.GGUFReader and loaded into the HF model in float64, undoing the
    converter's transforms: mixtral's q/k rows re-permuted from llama.cpp's interleaved-pair order back
    to HF's half-split order, deepseek2's k_b / v_b put back together into kv_b_proj, experts
    unstacked into gate_up_proj / down_proj, biases / correction bias / norms as they are. The round
    trip is asserted bit for bit (every HF parameter and the correction bias equal the original
    float32 value, rounded to f16 where the GGUF tensor is F16); every GGUF tensor is used.
 4. Float64 end to end: transformers computes in float32 in RMSNorm (x.to(float32)), the routers
    (softmax(.., float) / F.linear(x.type(float32), w.type(float32))) and the rotary table
    (inv_freq, freqs; YaRN's ramp). Those forwards / rope-init functions are re-compiled from
    transformers' own source with only the casts changed (each replacement asserted to match exactly
    once, each patched forward counted as called); SDPA attention. The unpatched model's distance is
    recorded as hf.float32_islands_max_rel_diff.
 5. Run (a): the 40-token prompt as one forward with a cache, then 8 single-token decode steps
    through the cache; this is the golden. Run (b): all 48 tokens in one no-cache forward; (a) and
    (b) must agree to 1e-10 relative.

Dump conventions (beyond docs/golden-format.md):
  router_logits  the router's raw logits W_r . x (before softmax, or before sigmoid for glm4moe /
                 deepseek2: the correction bias is NOT in them)
  topk_ids       softmax routers: by probability, highest first; sigmoid routers: by selection score
                 sigmoid(logit) + e_score_correction_bias, highest first
  topk_weights   the final weights the expert outputs are multiplied by, in topk_ids order: mixtral
                 softmax-renormalised, olmoe plain softmax probabilities, glm4moe / deepseek2
                 sigmoid(logit) (no bias) / sum over the k * routed_scaling_factor
  ffn_out        routed experts' weighted sum only; shexp_out the shared expert's output (unweighted,
                 added as is); dense_out a dense layer's FFN output. x_out = x + attn_out +
                 ffn_out + shexp_out (MoE layer) or x + attn_out + dense_out (dense layer).

Needs (NOT needed by CI; the outputs are committed): torch, transformers 5.x, numpy, safetensors,
tokenizers, and llama.cpp's source tree (its gguf-py is used for reading/writing):
  python3 scripts/make_moe_goldens.py --llama-cpp /path/to/llama.cpp [--arch mixtral olmoe glm4moe deepseek2]
"""

import argparse
import contextlib
import importlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hf_convert import (convert, hook_catcher, load_and_check, read_gguf, recompile, run_hooked,  # noqa: E402
                        write_tokenizer)
from hf_dump import max_rel_diff  # noqa: E402
DEFAULT_LLAMA_CPP = "/work/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"

SEED = 20260432
N_PROMPT = 40
N_DECODE = 8
AGREE_LIMIT = 1e-10     # run (a) vs run (b), float64
MIN_MARGIN = 1e-6       # routing decisiveness asked of the data (selection-score gap)

COMMON = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, hidden_act="silu",
              tie_word_embeddings=False)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
            mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1)

ARCHS = {
    "mixtral": dict(
        out="hf_mixtral", gguf_arch="llama", hf_class="MixtralForCausalLM", module="mixtral", prefix="Mixtral",
        config="MixtralConfig", router="MixtralTopKRouter", tokpre="llama-bpe", specials=["<|endoftext|>"],
        extra=dict(num_hidden_layers=3, num_key_value_heads=2, intermediate_size=32, num_local_experts=8,
                   num_experts_per_tok=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
                   rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    "olmoe": dict(
        out="hf_olmoe", gguf_arch="olmoe", hf_class="OlmoeForCausalLM", module="olmoe", prefix="Olmoe",
        config="OlmoeConfig", router="OlmoeTopKRouter", tokpre="olmo", specials=["<|endoftext|>"],
        # rms_norm_eps must be 1e-5: the converter writes 1e-5 whatever the config says
        extra=dict(num_hidden_layers=3, num_key_value_heads=2, intermediate_size=32, num_experts=8,
                   num_experts_per_tok=2, norm_topk_prob=False, max_position_embeddings=4096, rms_norm_eps=1e-5,
                   pad_token_id=255, eos_token_id=255,
                   rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    "glm4moe": dict(
        out="hf_glm4moe", gguf_arch="glm4moe", hf_class="Glm4MoeForCausalLM", module="glm4_moe", prefix="Glm4Moe",
        config="Glm4MoeConfig", router="Glm4MoeTopkRouter", tokpre="glm4",
        specials=["<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>"],
        extra=dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                   moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                   n_group=4, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True,
                   routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True, rms_norm_eps=1e-5,
                   max_position_embeddings=4096,
                   rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5))),
    "deepseek2": dict(
        out="hf_deepseek2", gguf_arch="deepseek2", hf_class="DeepseekV3ForCausalLM", module="deepseek_v3",
        prefix="DeepseekV3", config="DeepseekV3Config", router="DeepseekV3TopkRouter", tokpre="deepseek-v3",
        specials=["<|endoftext|>"],
        extra=dict(num_hidden_layers=4, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=16,
                   n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2,
                   first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                   q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                   rms_norm_eps=1e-6, max_position_embeddings=163840, rope_interleave=True,
                   rope_parameters=dict(YARN), scoring_func="sigmoid", topk_method="noaux_tc",
                   bos_token_id=255, eos_token_id=255)),
}

# ---------------------------------------------------------------- weights

def init_weights(model, rng, torch):
    """Random float32 weights and correction biases, scaled for a healthy tiny model."""
    H = model.config.hidden_size

    def normal(shape, std):
        return rng.standard_normal(shape) * std

    def norm_w(n):
        return np.clip(1.0 + 0.2 * rng.standard_normal(n), 0.5, 1.9)

    out = {}
    tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers()
                                                if n.endswith("e_score_correction_bias")]
    for name, p in tensors:
        shp = tuple(p.shape)
        if name == "model.embed_tokens.weight":
            v = normal(shp, 1.0)
        elif name == "lm_head.weight":
            v = normal(shp, H ** -0.5)
        elif name.endswith("norm.weight"):
            v = norm_w(shp)                             # every norm here multiplies by w itself
        elif name.endswith(".bias") and "self_attn" in name:
            v = normal(shp, 0.1)
        elif name.endswith("e_score_correction_bias"):
            v = normal(shp, 0.1)                        # moves the selection, not the weights
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_a_proj.weight",
                            "kv_a_proj_with_mqa.weight", "q_b_proj.weight", "kv_b_proj.weight")):
            v = normal(shp, shp[1] ** -0.5)
        elif name.endswith("o_proj.weight"):
            v = normal(shp, 0.5 * shp[1] ** -0.5)
        elif name.endswith("mlp.gate.weight"):
            v = normal(shp, 1.5 * H ** -0.5)            # router logits of std ~1.5
        elif name.endswith("experts.gate_up_proj") or name.endswith(("gate_proj.weight", "up_proj.weight")):
            v = normal(shp, H ** -0.5)
        elif name.endswith("experts.down_proj") or name.endswith("down_proj.weight"):
            v = normal(shp, 0.5 * shp[-1] ** -0.5)
        else:
            raise RuntimeError(f"no init rule for {name} {shp}")
        out[name] = np.ascontiguousarray(v, dtype=np.float32)
    with torch.no_grad():
        for name, p in tensors:
            p.copy_(torch.from_numpy(out[name]))
    return out


# ---------------------------------------------------------------- GGUF -> HF

def unpermute_llama(w, n_head):
    """Inverse of the converter's LlamaModel.permute (HF half-split rows -> interleaved pairs)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_to_hf(arch, cfg, t):
    """{HF name: (float64 array, [source GGUF tensor names])}."""
    sd = {}

    def put(hf, val, *srcs):
        sd[hf] = (val, list(srcs))

    def same(hf, gg):
        put(hf, t[gg], gg)

    same("model.embed_tokens.weight", "token_embd.weight")
    same("lm_head.weight", "output.weight")
    same("model.norm.weight", "output_norm.weight")
    n_dense = getattr(cfg, "first_k_dense_replace", 0) or 0
    for il in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        a = p + "self_attn."
        same(p + "input_layernorm.weight", b + "attn_norm.weight")
        same(p + "post_attention_layernorm.weight", b + ("post_attention_norm.weight" if arch == "glm4moe"
                                                         else "ffn_norm.weight"))
        if arch == "deepseek2":
            same(a + "q_a_proj.weight", b + "attn_q_a.weight")
            same(a + "q_a_layernorm.weight", b + "attn_q_a_norm.weight")
            same(a + "q_b_proj.weight", b + "attn_q_b.weight")
            same(a + "kv_a_proj_with_mqa.weight", b + "attn_kv_a_mqa.weight")
            same(a + "kv_a_layernorm.weight", b + "attn_kv_a_norm.weight")
            kb, vb = t[b + "attn_k_b.weight"], t[b + "attn_v_b.weight"]
            nh, r = cfg.num_attention_heads, cfg.kv_lora_rank
            assert kb.shape == (nh, r, cfg.qk_nope_head_dim) and vb.shape == (nh, cfg.v_head_dim, r), (kb.shape, vb.shape)
            kv_b = np.concatenate([kb.transpose(0, 2, 1), vb], axis=1).reshape(-1, r)
            put(a + "kv_b_proj.weight", kv_b, b + "attn_k_b.weight", b + "attn_v_b.weight")
            same(a + "o_proj.weight", b + "attn_output.weight")
        else:
            for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                w = t[b + gg + ".weight"]
                if arch == "mixtral" and hf in ("q_proj", "k_proj"):
                    w = unpermute_llama(w, cfg.num_attention_heads if hf == "q_proj" else cfg.num_key_value_heads)
                put(a + hf + ".weight", w, b + gg + ".weight")
                if cfg.to_dict().get("attention_bias") and hf != "o_proj":
                    same(a + hf + ".bias", b + gg + ".bias")
            if arch == "olmoe" or (arch == "glm4moe" and cfg.use_qk_norm):
                same(a + "q_norm.weight", b + "attn_q_norm.weight")
                same(a + "k_norm.weight", b + "attn_k_norm.weight")
        m = p + "mlp."
        if il < n_dense:
            for w in ("gate", "up", "down"):
                same(m + f"{w}_proj.weight", b + f"ffn_{w}.weight")
            continue
        same(m + "gate.weight", b + "ffn_gate_inp.weight")
        put(m + "experts.gate_up_proj",
            np.concatenate([t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]], axis=1),
            b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight")
        same(m + "experts.down_proj", b + "ffn_down_exps.weight")
        if arch in ("glm4moe", "deepseek2"):
            same(m + "gate.e_score_correction_bias", b + "exp_probs_b.bias")
            for w in ("gate", "up", "down"):
                same(m + f"shared_experts.{w}_proj.weight", b + f"ffn_{w}_shexp.weight")
    used = {s for _, srcs in sd.values() for s in srcs}
    assert used == set(t), f"GGUF tensors not used: {sorted(set(t) - used)}; missing: {sorted(used - set(t))}"
    return sd


# ---------------------------------------------------------------- float64 patches

ROUTER_PATCH = {
    "mixtral": [("softmax(router_logits.float(), dim=-1)", "softmax(router_logits, dim=-1)")],
    "olmoe": [("softmax(router_logits, dtype=torch.float, dim=-1)", "softmax(router_logits, dim=-1)")],
    "glm4moe": [("F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))",
                 "F.linear(hidden_states, self.weight)")],
}
ROUTER_PATCH["deepseek2"] = ROUTER_PATCH["glm4moe"]


def inv_freq64(model, torch, rope_utils, counter):
    """The rotary table's inv_freq and attention factor recomputed in float64 from transformers' own
    rope-init source (float32 casts replaced)."""
    c = model.config
    rot = model.model.rotary_emb
    if rot.rope_type == "default":
        fn = type(rot).compute_default_rope_parameters
        g = vars(sys.modules[type(rot).__module__])
        reps = [("torch.arange(0, dim, 2, dtype=torch.float)", "torch.arange(0, dim, 2, dtype=torch.float64)")]
    else:
        assert rot.rope_type == "yarn"
        fn = rope_utils._compute_yarn_parameters
        g = vars(rope_utils)
        reps = [("torch.arange(dim, dtype=torch.float32)", "torch.arange(dim, dtype=torch.float64)"),
                ("torch.arange(0, dim, 2).to(device=device, dtype=torch.float)",
                 "torch.arange(0, dim, 2).to(device=device, dtype=torch.float64)"),
                ("linear_ramp_factor(low, high, dim // 2).to(device=device, dtype=torch.float)",
                 "linear_ramp_factor(low, high, dim // 2).to(device=device, dtype=torch.float64)")]
    inv, att = recompile(fn, reps, g, counter, "rope_init")(c)
    assert inv.dtype == torch.float64
    assert torch.allclose(inv, rot.inv_freq.double(), rtol=1e-6, atol=0), (inv, rot.inv_freq)
    assert att == rot.attention_scaling
    return inv


@contextlib.contextmanager
def float64_patches(mod, arch, model, counter, torch, rope_utils):
    P = ARCHS[arch]["prefix"]
    g = vars(mod)
    methods = {
        P + "RMSNorm": [("hidden_states = hidden_states.to(torch.float32)\n", "\n")],
        ARCHS[arch]["router"]: ROUTER_PATCH[arch],
        P + "RotaryEmbedding": [("position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)",
                                 "position_ids[..., None].to(x.dtype) * self.inv_freq.to(device=x.device, dtype=x.dtype)")],
    }
    saved_m = {k: getattr(mod, k).forward for k in methods}
    rot = model.model.rotary_emb
    saved_inv = rot.inv_freq.clone()
    inv64 = inv_freq64(model, torch, rope_utils, counter)
    try:
        for k, reps in methods.items():
            getattr(mod, k).forward = recompile(saved_m[k], reps, g, counter, k)
        rot.inv_freq = inv64
        yield sorted(k + ".forward" for k in methods) + [f"rotary inv_freq ({rot.rope_type}, float64)"]
    finally:
        for k, f in saved_m.items():
            getattr(mod, k).forward = f
        rot.inv_freq = saved_inv


# ---------------------------------------------------------------- HF runs

def sigmoid_router(arch):
    return arch in ("glm4moe", "deepseek2")


def run_hf(model, arch, tokens, n_prompt, torch, cached=True):
    """Run (a) (cached: prompt + single-token decode steps) or (b) (one no-cache forward)."""
    caught, hooks, add, fwd = hook_catcher()

    n_dense = getattr(model.config, "first_k_dense_replace", 0) or 0
    for il, layer in enumerate(model.model.layers):
        p = f"blk.{il}."
        fwd(layer.self_attn, lambda i, o, p=p: add(p + "attn_out", o[0]))
        mlp = layer.mlp
        if il < n_dense:
            fwd(mlp, lambda i, o, p=p: add(p + "dense_out", o))
        else:
            def router(i, o, p=p):
                add(p + "router_logits", o[0])
                add(p + "topk_weights", o[1])
                add(p + "topk_ids", o[2])
            fwd(mlp.gate, router)
            fwd(mlp.experts, lambda i, o, p=p: add(p + "ffn_out", o))
            if hasattr(mlp, "shared_experts"):
                fwd(mlp.shared_experts, lambda i, o, p=p: add(p + "shexp_out", o))
        fwd(layer, lambda i, o, p=p: add(p + "x_out", o[0] if isinstance(o, tuple) else o))

    logits, cache = run_hooked(model, tokens, n_prompt, cached, hooks, torch)

    arrays = {"logits": logits}
    for k, v in caught.items():
        arrays[k] = torch.cat(v, dim=0).numpy()
    for il in range(n_dense, len(model.model.layers)):
        p = f"blk.{il}."
        ids = arrays[p + "topk_ids"].astype(np.int64)
        w = arrays[p + "topk_weights"]
        if sigmoid_router(arch):
            # HF's topk(sorted=False): order by selection score sigmoid(logit) + bias, highest first
            bias = model.model.layers[il].mlp.gate.e_score_correction_bias.detach().double().numpy()
            sel = 1.0 / (1.0 + np.exp(-arrays[p + "router_logits"])) + bias
            order = np.argsort(-np.take_along_axis(sel, ids, axis=1), axis=1, kind="stable")
            ids = np.take_along_axis(ids, order, axis=1)
            w = np.take_along_axis(w, order, axis=1)
        arrays[p + "topk_ids"] = ids.astype(np.int32)
        arrays[p + "topk_weights"] = w
    for k, v in arrays.items():
        assert v.shape[0] == len(tokens), (k, v.shape)
    return arrays, cache


def routing_health(arrays, model, arch):
    """Per MoE layer: tokens per expert, min selection gap (k-th vs (k+1)-th selection score; for
    grouped routers also the group gap), and for sigmoid routers a numpy re-derivation of the
    selection and weights checked against HF's."""
    c = model.config
    k = c.num_experts_per_tok
    n_dense = getattr(c, "first_k_dense_replace", 0) or 0
    res = []
    for il in range(n_dense, c.num_hidden_layers):
        p = f"blk.{il}."
        ids, lg, w = arrays[p + "topk_ids"], arrays[p + "router_logits"], arrays[p + "topk_weights"]
        E = lg.shape[1]
        fr = np.bincount(ids.reshape(-1), minlength=E) / ids.shape[0]
        if not sigmoid_router(arch):
            pr = np.exp(lg - lg.max(axis=1, keepdims=True))
            pr /= pr.sum(axis=1, keepdims=True)
            srt = -np.sort(-pr, axis=1)
            gap, ggap = float(np.min(srt[:, k - 1] - srt[:, k])), None
            want_ids = np.argsort(-pr, axis=1, kind="stable")[:, :k]
            tw = np.take_along_axis(pr, want_ids, axis=1)
            if arch == "mixtral" or getattr(c, "norm_topk_prob", False):
                tw = tw / tw.sum(axis=1, keepdims=True)
        else:
            ng, tg = c.n_group, c.topk_group
            bias = model.model.layers[il].mlp.gate.e_score_correction_bias.detach().double().numpy()
            s = 1.0 / (1.0 + np.exp(-lg))
            sel = s + bias
            gs = np.sort(sel.reshape(-1, ng, E // ng), axis=2)[:, :, -2:].sum(axis=2)
            gsrt = -np.sort(-gs, axis=1)
            ggap = float(np.min(gsrt[:, tg - 1] - gsrt[:, tg]))
            keep = np.argsort(-gs, axis=1, kind="stable")[:, :tg]
            mask = np.zeros_like(gs, dtype=bool)
            np.put_along_axis(mask, keep, True, axis=1)
            msel = np.where(np.repeat(mask, E // ng, axis=1), sel, -np.inf)
            srt = -np.sort(-msel, axis=1)
            gap = float(np.min(srt[:, k - 1] - srt[:, k]))
            want_ids = np.argsort(-msel, axis=1, kind="stable")[:, :k]
            tw = np.take_along_axis(s, want_ids, axis=1)
            if c.norm_topk_prob:
                tw = tw / (tw.sum(axis=1, keepdims=True) + 1e-20)
            tw = tw * c.routed_scaling_factor
        assert np.array_equal(want_ids, ids), f"layer {il}: numpy selection differs from HF's"
        werr = max_rel_diff(w, tw)
        assert werr < 1e-14, f"layer {il}: numpy weights differ from HF's: {werr}"
        res.append(dict(layer=il, fractions=fr, gap=gap, group_gap=ggap, experts_used=int(np.sum(fr > 0))))
    return res


# ---------------------------------------------------------------- main

def make_one(arch, out_dir, lcpp, keep_hf, torch, transformers, gguf, qwen3moe_ref):
    from transformers import modeling_rope_utils as rope_utils
    spec = ARCHS[arch]
    mod = importlib.import_module(f"transformers.models.{spec['module']}.modeling_{spec['module']}")
    cfg_mod = importlib.import_module(f"transformers.models.{spec['module']}.configuration_{spec['module']}")
    ConfigCls, ModelCls = getattr(cfg_mod, spec["config"]), getattr(mod, spec["hf_class"])

    os.makedirs(out_dir, exist_ok=True)
    seed = SEED + list(ARCHS).index(arch)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    config = ConfigCls(**COMMON, **spec["extra"])
    config._attn_implementation = "sdpa"
    config._experts_implementation = "eager"
    model = ModelCls(config).eval()
    orig = init_weights(model, rng, torch)
    tokens = [int(t) for t in rng.integers(0, COMMON["vocab_size"], N_PROMPT + N_DECODE)]

    tmp = tempfile.mkdtemp(prefix="tiermoe-")
    hf_dir = os.path.join(tmp, f"tiny-{arch}")
    try:
        model.save_pretrained(hf_dir)
        write_tokenizer(hf_dir, spec["specials"], COMMON["vocab_size"], 4096)
        with open(os.path.join(hf_dir, "config.json")) as f:
            saved_cfg = json.load(f)
        if arch == "deepseek2":
            assert saved_cfg.get("scoring_func") == "sigmoid", "config.json lost scoring_func"
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(saved_cfg, f, indent=1, sort_keys=True)
            f.write("\n")
        mpath = os.path.join(out_dir, "tiny-f16.gguf")
        log = convert(hf_dir, mpath, arch, spec["tokpre"], lcpp,
                      ["--no-mtp"] if arch == "glm4moe" else [])
        for line in log.splitlines():
            if line.startswith("WARNING"):
                print(f"   converter: {line}")
    finally:
        if keep_hf:
            dst = os.path.join(keep_hf, f"tiny-{arch}")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(hf_dir, dst)
        shutil.rmtree(tmp, ignore_errors=True)

    reader, t, types = read_gguf(mpath, gguf)
    assert reader.fields["general.architecture"].contents() == spec["gguf_arch"]
    sd = gguf_to_hf(arch, config, t)
    model = model.double()
    n_f16 = load_and_check(model, sd, orig, types, torch, buffers=("e_score_correction_bias",))

    counter = {}
    with float64_patches(mod, arch, model, counter, torch, rope_utils) as patched:
        gold, cache = run_hf(model, arch, tokens, N_PROMPT, torch, cached=True)
        missing = [k for k in patched if not k.startswith("rotary") and counter.get(k.removesuffix(".forward"), 0) == 0]
        assert not missing, f"patched but never called: {missing}"
        full, _ = run_hf(model, arch, tokens, N_PROMPT, torch, cached=False)
    raw, _ = run_hf(model, arch, tokens, N_PROMPT, torch, cached=True)   # transformers as shipped
    islands = max_rel_diff(raw["logits"], gold["logits"])

    assert set(gold) == set(full)
    agree = 0.0
    for name in gold:
        if name.endswith("topk_ids"):
            assert np.array_equal(gold[name], full[name]), name
        else:
            agree = max(agree, max_rel_diff(gold[name], full[name]))
    assert agree < AGREE_LIMIT, f"cached (a) vs one-pass (b): {agree}"

    health = routing_health(gold, model, arch)
    for h in health:
        assert h["gap"] >= MIN_MARGIN and (h["group_gap"] is None or h["group_gap"] >= MIN_MARGIN), h
    n_dense = getattr(config, "first_k_dense_replace", 0) or 0
    # the residual identity of the dumped stages
    resid = 0.0
    for il in range(config.num_hidden_layers):
        p = f"blk.{il}."
        x = t["token_embd.weight"][tokens] if il == 0 else gold[f"blk.{il - 1}.x_out"]
        y = x + gold[p + "attn_out"] + (gold[p + "dense_out"] if il < n_dense
                                        else gold[p + "ffn_out"] + gold.get(p + "shexp_out", 0.0))
        resid = max(resid, max_rel_diff(y, gold[p + "x_out"]))
    assert resid < 1e-14, resid

    meta = {"dump.n_prompt": N_PROMPT, "dump.seed": seed,
            "hf.transformers_version": transformers.__version__,
            "hf.torch_version": torch.__version__,
            "hf.attn_implementation": "sdpa",
            "hf.float64_patches": ", ".join(patched),
            "hf.float32_islands_max_rel_diff": islands,
            "hf.cached_vs_full_max_rel_diff": agree,
            "hf.converter": "llama.cpp convert_hf_to_gguf.py --outtype f16" + (" --no-mtp" if arch == "glm4moe" else "") + " (get_vocab_base_pre -> "
                            f"'{spec['tokpre']}')",
            "hf.router_logits": "raw logits before " + ("sigmoid (correction bias not included)"
                                                        if sigmoid_router(arch) else "softmax"),
            "hf.topk_order": "selection score sigmoid(logit)+bias, highest first" if sigmoid_router(arch)
                             else "probability, highest first"}
    gpath = os.path.join(out_dir, "tiny.golden.gguf")
    qwen3moe_ref.write_dump(gpath, gold, tokens, os.path.basename(mpath),
                            f"HF transformers {spec['hf_class']}, float64 (scripts/make_moe_goldens.py)",
                            extra_meta=meta, float_type=np.float64)
    back, _ = qwen3moe_ref.read_dump(gpath)
    for name in gold:
        assert np.array_equal(back[name], gold[name].astype(back[name].dtype)), name

    print(f"== {arch}: {mpath} {os.path.getsize(mpath)} bytes, golden {os.path.getsize(gpath)} bytes, "
          f"config {os.path.getsize(os.path.join(out_dir, 'config.json'))} bytes; {n_f16} HF params from F16")
    print(f"   cached (a) vs one-pass (b): max rel diff {agree:.3g}; unpatched-vs-float64 logits {islands:.3g}; "
          f"residual identity {resid:.3g}")
    for h in health:
        print(f"   layer {h['layer']}: tokens per expert " + " ".join(f"{x:.3f}" for x in h["fractions"])
              + f"; experts used {h['experts_used']}; min selection gap {h['gap']:.3g}"
              + ("" if h["group_gap"] is None else f"; min group gap {h['group_gap']:.3g}"))
    xo = [np.linalg.norm(gold[f"blk.{il}.x_out"], axis=1).mean() for il in range(config.num_hidden_layers)]
    print("   mean |x_out| per layer " + " ".join(f"{v:.2f}" for v in xo) + f"; patched calls {counter}")
    return health


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR", DEFAULT_LLAMA_CPP),
                    help="llama.cpp source tree (convert_hf_to_gguf.py, conversion/, gguf-py/)")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "tests", "data"), help="tests/data folder")
    ap.add_argument("--arch", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    ap.add_argument("--keep-hf", default=None, help="also keep the HF model folders here (debugging)")
    args = ap.parse_args()
    lcpp = os.path.abspath(args.llama_cpp)
    sys.path.insert(0, os.path.join(lcpp, "gguf-py"))
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
    import gguf
    import torch
    import transformers
    import qwen3moe_ref  # noqa: E402  (the dump writer / reader only)
    torch.set_num_threads(1)
    for arch in args.arch:
        make_one(arch, os.path.join(args.data, ARCHS[arch]["out"]), lcpp, args.keep_hf,
                 torch, transformers, gguf, qwen3moe_ref)


if __name__ == "__main__":
    main()
