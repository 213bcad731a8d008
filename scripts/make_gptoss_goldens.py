#!/usr/bin/env python3
"""Build the tiny gpt-oss test model and its HuggingFace transformers goldens.

What it makes (committed under tests/data/hf_gptoss/, see docs/golden-format.md):
  tiny-mxfp4.gguf            random-weight gpt-oss in llama.cpp's gpt-oss GGUF layout:
                             experts MXFP4, everything else F32 (biases, sinks included)
  tiny-mxfp4.golden.gguf     HF GptOssForCausalLM (float64) run on dump.tokens: logits and
                             per-layer attn_out, router_logits, topk_ids, topk_weights,
                             ffn_out, x_out (F64; I32 for ids)
  config.json                the HF config used

The tiny config covers what gpt-oss adds to a Qwen3-style MoE: 4 layers, so
both attention kinds run (HF's default layer_types: even layers sliding, odd
layers full), a sliding window of 8 with a 20-token prompt and 8 decode steps
(both the prompt and the decode run past the window), learned sinks, q/k/v/o
and router biases, per-expert biases, the clamped SwiGLU with weights large
enough that the clamps bite (gate above 7, up outside +-7), and the real
model's YaRN RoPE (theta 150000, factor 32, original context 4096, no
truncation of the correction range, attention factor 0.1 ln 32 + 1).

How: weights are drawn with numpy (fixed seed), experts rounded through MXFP4
by writing them with gguf.quants.quantize, written to GGUF the way
convert_hf_to_gguf.py's GptOssModel writes them (gate_up_proj [E, H, 2I]
de-interleaved: gate = [..., ::2], up = [..., 1::2], transposed to [E, I, H];
down_proj [E, I, H] transposed to [E, H, I]; biases split the same way;
sinks as attn_sinks.weight; post_attention_layernorm as post_attention_norm),
then the GGUF is read back with gguf.GGUFReader, dequantized by the gguf
package, and loaded into the HF model, so HF computes on exactly the file's
values.

Float64: model.double() is not enough: GptOssRMSNorm casts to float32 and the
rotary table (inv_freq from the YaRN init, cos/sin) is float32. The script
replaces those spots with the same formulas in float64 (the YaRN inv_freq is
recomputed in float64 from HF's formula and checked against HF's own float32
table) and runs the eager attention (HF's only one for gpt-oss on CPU with
sinks), whose softmax runs in the input dtype. It also runs the unpatched model
and records the difference ("hf.float32_islands_max_rel_diff").

Needs torch and transformers (NOT needed by CI; the outputs are committed):
  pip install torch transformers gguf numpy
  python3 scripts/make_gptoss_goldens.py [--out tests/data/hf_gptoss]
"""

import argparse
import json
import math
import os
import sys

import numpy as np

import gguf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from hf_dump import hf_run, max_rel_diff, patched_forwards, rms_forward_in_dtype  # noqa: E402  (beside this script)
import qwen3moe_ref  # noqa: E402  (the dump writer only)

SEED = 20251125
N_PROMPT = 20   # a prompt longer than the window ...
N_DECODE = 8    # ... and decode steps past it

HP = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=64,       # the experts' size (gpt-oss has no dense FFN)
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    num_local_experts=8,
    num_experts_per_tok=4,
    sliding_window=8,
    swiglu_limit=7.0,
    tie_word_embeddings=False,
    attention_bias=True,
)
ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
        "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}


# ---------------------------------------------------------------- weights (HF names, numpy f32)

def make_weights(rng):
    H, L, E, I = HP["hidden_size"], HP["num_hidden_layers"], HP["num_local_experts"], HP["intermediate_size"]
    nh, nkv, dk, V = HP["num_attention_heads"], HP["num_key_value_heads"], HP["head_dim"], HP["vocab_size"]

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((V, H), 1.0)}
    for il in range(L):
        p = f"model.layers.{il}."
        w[p + "input_layernorm.weight"] = norm_w(H)
        for proj, rows in (("q", nh * dk), ("k", nkv * dk), ("v", nkv * dk)):
            w[p + f"self_attn.{proj}_proj.weight"] = normal((rows, H), H ** -0.5)
            w[p + f"self_attn.{proj}_proj.bias"] = normal((rows,), 0.3)
        w[p + "self_attn.o_proj.weight"] = normal((H, nh * dk), 0.5 * (nh * dk) ** -0.5)
        w[p + "self_attn.o_proj.bias"] = normal((H,), 0.1)
        # sinks of the size of the scores: they take a real share of the softmax
        w[p + "self_attn.sinks"] = normal((nh,), 1.0)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
        w[p + "mlp.router.weight"] = normal((E, H), 1.5 * H ** -0.5)
        w[p + "mlp.router.bias"] = normal((E,), 0.5)
        # gate/up of std 3: a few percent of the values pass the clamp at 7
        w[p + "mlp.experts.gate_up_proj"] = normal((E, H, 2 * I), 3.0 * H ** -0.5)
        w[p + "mlp.experts.gate_up_proj_bias"] = normal((E, 2 * I), 0.5)
        w[p + "mlp.experts.down_proj"] = normal((E, I, H), 0.1 * I ** -0.5)
        w[p + "mlp.experts.down_proj_bias"] = normal((E, H), 0.1)
    w["model.norm.weight"] = norm_w(H)
    w["lm_head.weight"] = normal((V, H), H ** -0.5)
    return w


# ---------------------------------------------------------------- HF → GGUF (as convert_hf_to_gguf.py)

HF_TO_GGUF = {   # per layer: HF parameter → GGUF tensor
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.router.weight": "ffn_gate_inp.weight", "mlp.router.bias": "ffn_gate_inp.bias",
}


def check_names(names):
    """Every name is one gguf's gpt-oss tensor list knows (MODEL_TENSORS[GPT_OSS])."""
    known = set()
    for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GPT_OSS]:
        stem = gguf.TENSOR_NAMES[t]
        for il in range(HP["num_hidden_layers"]):
            known.add(stem.format(bid=il))
    for n in names:
        assert n.rsplit(".", 1)[0] in known, n


def gguf_tensors(w):
    """(gguf name, numpy array in numpy order, is_expert_matrix), in file order."""
    out = [("token_embd.weight", w["model.embed_tokens.weight"], False)]
    for il in range(HP["num_hidden_layers"]):
        p = f"model.layers.{il}."
        for hf, gg in HF_TO_GGUF.items():
            out.append((f"blk.{il}.{gg}", w[p + hf], False))
        gu, gub = w[p + "mlp.experts.gate_up_proj"], w[p + "mlp.experts.gate_up_proj_bias"]
        out.append((f"blk.{il}.ffn_gate_exps.weight", np.ascontiguousarray(gu[..., ::2].transpose(0, 2, 1)), True))
        out.append((f"blk.{il}.ffn_up_exps.weight", np.ascontiguousarray(gu[..., 1::2].transpose(0, 2, 1)), True))
        out.append((f"blk.{il}.ffn_down_exps.weight",
                    np.ascontiguousarray(w[p + "mlp.experts.down_proj"].transpose(0, 2, 1)), True))
        out.append((f"blk.{il}.ffn_gate_exps.bias", np.ascontiguousarray(gub[..., ::2]), False))
        out.append((f"blk.{il}.ffn_up_exps.bias", np.ascontiguousarray(gub[..., 1::2]), False))
        out.append((f"blk.{il}.ffn_down_exps.bias", w[p + "mlp.experts.down_proj_bias"], False))
    out.append(("output_norm.weight", w["model.norm.weight"], False))
    out.append(("output.weight", w["lm_head.weight"], False))
    check_names([n for n, _, _ in out])
    return out


def write_model_gguf(path, w, name="tiermoe-tiny-gpt-oss", skip=(), extra_kv=None, window=None,
                     expert_type=None):
    """The model as llama.cpp's converter writes gpt-oss (GptOssModel.set_gguf_parameters)."""
    gw = gguf.GGUFWriter(path, "gpt-oss")
    gw.add_name(name)
    gw.add_context_length(HP["max_position_embeddings"])
    gw.add_embedding_length(HP["hidden_size"])
    gw.add_feed_forward_length(HP["intermediate_size"])
    gw.add_block_count(HP["num_hidden_layers"])
    gw.add_head_count(HP["num_attention_heads"])
    gw.add_head_count_kv(HP["num_key_value_heads"])
    gw.add_rope_freq_base(ROPE["rope_theta"])
    gw.add_layer_norm_rms_eps(HP["rms_norm_eps"])
    gw.add_expert_used_count(HP["num_experts_per_tok"])
    gw.add_key_length(HP["head_dim"])
    gw.add_value_length(HP["head_dim"])
    gw.add_expert_count(HP["num_local_experts"])
    gw.add_sliding_window(HP["sliding_window"] if window is None else window)
    gw.add_expert_feed_forward_length(HP["intermediate_size"])
    gw.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    gw.add_rope_scaling_factor(ROPE["factor"])
    gw.add_rope_scaling_orig_ctx_len(ROPE["original_max_position_embeddings"])
    gw.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    gw.add_quantization_version(gguf.GGML_QUANT_VERSION)
    gw.add_tokenizer_model("none")
    for k, (fn, v) in (extra_kv or {}).items():
        getattr(gw, fn)(k, v)
    for tname, arr, expert in gguf_tensors(w):
        if tname in skip:
            continue
        if expert:
            qt = expert_type or gguf.GGMLQuantizationType.MXFP4
            data = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qt)
            gw.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=qt)
        else:
            gw.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()


# ---------------------------------------------------------------- GGUF → HF

def load_gguf_into_hf(model, path, torch):
    r = gguf.GGUFReader(path, "r")
    t = {x.name: np.asarray(gguf.quants.dequantize(x.data, x.tensor_type), dtype=np.float64) for x in r.tensors}
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
          "lm_head.weight": t["output.weight"]}
    for il in range(HP["num_hidden_layers"]):
        p = f"model.layers.{il}."
        for hf, gg in HF_TO_GGUF.items():
            sd[p + hf] = t[f"blk.{il}.{gg}"]
        g, u = t[f"blk.{il}.ffn_gate_exps.weight"], t[f"blk.{il}.ffn_up_exps.weight"]   # [E, I, H]
        gu = np.empty((g.shape[0], g.shape[2], 2 * g.shape[1]))
        gu[..., ::2], gu[..., 1::2] = g.transpose(0, 2, 1), u.transpose(0, 2, 1)      # re-interleave
        sd[p + "mlp.experts.gate_up_proj"] = gu
        gb, ub = t[f"blk.{il}.ffn_gate_exps.bias"], t[f"blk.{il}.ffn_up_exps.bias"]
        gub = np.empty((gb.shape[0], 2 * gb.shape[1]))
        gub[..., ::2], gub[..., 1::2] = gb, ub
        sd[p + "mlp.experts.gate_up_proj_bias"] = gub
        sd[p + "mlp.experts.down_proj"] = t[f"blk.{il}.ffn_down_exps.weight"].transpose(0, 2, 1)
        sd[p + "mlp.experts.down_proj_bias"] = t[f"blk.{il}.ffn_down_exps.bias"]
    params = dict(model.named_parameters())
    missing = set(params) - set(sd)
    if missing:
        raise RuntimeError(f"HF parameters not set from {path}: {sorted(missing)}")
    with torch.no_grad():
        for k, v in sd.items():
            if tuple(params[k].shape) != v.shape:
                raise RuntimeError(f"{k}: HF shape {tuple(params[k].shape)} vs GGUF {v.shape}")
            params[k].copy_(torch.from_numpy(np.ascontiguousarray(v)))


# ---------------------------------------------------------------- float64 patches

def yarn_inv_freq_f64():
    """HF's _compute_yarn_parameters in float64 (truncate as configured)."""
    D, base, factor = HP["head_dim"], ROPE["rope_theta"], ROPE["factor"]
    orig = ROPE["original_max_position_embeddings"]

    def corr_dim(rot):
        return D * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = corr_dim(ROPE["beta_fast"]), corr_dim(ROPE["beta_slow"])
    if ROPE["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, D - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ramp = np.clip((np.arange(D // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrap = 1 - ramp
    inv = (1 / (factor * pos_freqs)) * (1 - extrap) + (1 / pos_freqs) * extrap
    return inv, 0.1 * math.log(factor) + 1.0


def float64_patches(mod, torch, inv_freq, mscale):
    inv = torch.from_numpy(inv_freq)

    def rotary_forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv
        return (freqs.cos() * mscale).to(x.dtype), (freqs.sin() * mscale).to(x.dtype)

    return patched_forwards(((mod.GptOssRMSNorm, rms_forward_in_dtype(torch)),
                             (mod.GptOssRotaryEmbedding, rotary_forward)))


# ---------------------------------------------------------------- HF run (hf_dump.hf_run)

def moe_router(layer):
    return layer.mlp.router


def moe_out(o):  # GptOssMLP returns (output, router scores)
    return o[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "hf_gptoss"))
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import GptOssConfig, GptOssForCausalLM
    from transformers.models.gpt_oss import modeling_gpt_oss as mod

    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    os.makedirs(args.out, exist_ok=True)

    config = GptOssConfig(**HP, rope_parameters=dict(ROPE))
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    assert config.swiglu_alpha == 1.702 and config.swiglu_limit == 7.0
    assert config.layer_types == ["sliding_attention", "full_attention"] * (HP["num_hidden_layers"] // 2)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(json.loads(config.to_json_string()), f, indent=1, sort_keys=True)
        f.write("\n")

    weights = make_weights(rng)
    tokens = [int(t) for t in rng.integers(0, HP["vocab_size"], N_PROMPT + N_DECODE)]
    model = GptOssForCausalLM(config).double().eval()

    inv64, mscale = yarn_inv_freq_f64()
    rot = model.model.rotary_emb
    hf_inv = rot.inv_freq.double().numpy()
    if not np.allclose(hf_inv, inv64, rtol=1e-6, atol=0) or abs(rot.attention_scaling - mscale) > 1e-12:
        raise RuntimeError(f"float64 YaRN table differs from HF's: {hf_inv} vs {inv64}, "
                           f"{rot.attention_scaling} vs {mscale}")

    mpath = os.path.join(args.out, "tiny-mxfp4.gguf")
    write_model_gguf(mpath, weights)
    load_gguf_into_hf(model, mpath, torch)
    with float64_patches(mod, torch, inv64, mscale):
        gold = hf_run(model, tokens, torch, moe_router, moe_out)
    raw = hf_run(model, tokens, torch, moe_router, moe_out)
    islands = max_rel_diff(raw["logits"], gold["logits"])
    meta = {"hf.transformers_version": transformers.__version__, "hf.torch_version": torch.__version__,
            "hf.attn_implementation": "eager",
            "hf.float64_patches": "GptOssRMSNorm, GptOssRotaryEmbedding (YaRN inv_freq in float64)",
            "hf.float32_islands_max_rel_diff": islands, "dump.n_prompt": N_PROMPT, "dump.seed": SEED}
    gpath = os.path.join(args.out, "tiny-mxfp4.golden.gguf")
    qwen3moe_ref.write_dump(gpath, gold, tokens, os.path.basename(mpath),
                            "HF transformers GptOssForCausalLM, float64 (scripts/make_gptoss_goldens.py)",
                            extra_meta=meta, float_type=np.float64)

    # how much of the model's special parts the tokens exercise
    E, L = HP["num_local_experts"], HP["num_hidden_layers"]
    used = [len(np.unique(gold[f"blk.{il}.topk_ids"])) for il in range(L)]
    gaps = []
    for il in range(L):
        lg = np.sort(gold[f"blk.{il}.router_logits"], axis=1)[:, ::-1]
        k = HP["num_experts_per_tok"]
        gaps.append(float((lg[:, k - 1] - lg[:, k]).min()))
    print(f"{mpath}: {os.path.getsize(mpath)} bytes; golden {os.path.getsize(gpath)} bytes; "
          f"experts reached per layer {used} of {E}; min top-k gap per layer {['%.2g' % g for g in gaps]}; "
          f"unpatched-vs-float64 logits {islands:.3g}")
    clamp_share = clamp_stats(model, tokens, torch, mod, inv64, mscale)
    print(f"share of gate values above the limit / up values outside it, per layer: {clamp_share}")


def clamp_stats(model, tokens, torch, mod, inv64, mscale):
    """How often the SwiGLU clamps bite on the routed tokens (a test that cannot see them is weak)."""
    seen = []
    orig = mod.GptOssExperts._apply_gate

    def spy(self, gate_up):
        g, u = gate_up[..., ::2], gate_up[..., 1::2]
        seen.append((float((g > self.limit).double().mean()), float((u.abs() > self.limit).double().mean())))
        return orig(self, gate_up)
    mod.GptOssExperts._apply_gate = spy
    try:
        with float64_patches(mod, torch, inv64, mscale):
            hf_run(model, tokens, torch, moe_router, moe_out)
    finally:
        mod.GptOssExperts._apply_gate = orig
    return ["%.3f/%.3f" % (np.mean([s[0] for s in seen]), np.mean([s[1] for s in seen]))]


if __name__ == "__main__":
    main()
