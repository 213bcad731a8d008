#!/usr/bin/env python3
"""Build tiny qwen3next / qwen35moe test models with llama.cpp's converter, and their HF float64 goldens.

What it makes (under tests/data/hf_qwen3next/ and tests/data/hf_qwen35moe/, see docs/golden-format.md):
  tiny-f16.gguf         random-weight model written by llama.cpp's own convert_hf_to_gguf.py
                        (--outtype f16 --no-mtp): matrices F16, norms / vectors / conv / routers
                        F32 as the converter decides
  tiny.golden.gguf      HF transformers (float64) run on dump.tokens = 150 prompt tokens + 8
                        decode tokens: logits and per layer attn_out, lin_core (linear layers),
                        router_logits, topk_ids, topk_weights, ffn_out (routed experts only),
                        shexp_out (gated shared expert), x_out; F64, I32 for ids
  config.json           the HF config the model was made from

Architectures: qwen3next = HF Qwen3NextForCausalLM, qwen35moe = HF Qwen3_5MoeForCausalLM
(text only). Both: 4 layers [linear, full, linear, full], n_embd 64, 4 heads / 2 KV heads of 32,
partial rotary 0.25 (rope dim 8, theta 1e4), gated delta-net with 2 K heads and 4 V heads of 16
(so grouped vs tiled V-head order matters), conv kernel 4, 8 experts top-2 (renormalised) of 16,
sigmoid-gated shared expert of 32, vocab 256.

How:
 1. Random weights (numpy, fixed seed) are set into the HF model in float32 and saved with
    save_pretrained (per-expert checkpoint layout) together with a tiny byte-level BPE tokenizer
    (240 byte tokens + 16 merges = 256, built with the `tokenizers` package).
 2. llama.cpp's convert_hf_to_gguf.py (run as a subprocess, its code untouched) writes
    tiny-f16.gguf. It identifies the BPE pre-tokenizer by hashing the encoding of a test string;
    our tokenizer's hash is unknown to it, so the subprocess is started through a small wrapper
    that replaces only TextModel.get_vocab_base_pre (the vocab-identification step) with one
    returning "qwen2" (qwen3next) or "qwen35" (qwen35moe), what the real models' tokenizers get.
 3. The GGUF is read back with gguf.GGUFReader and loaded into the HF model in float64, undoing
    the converter's transforms (GGUF -> HF): norm weights -1 (the converter adds 1 to every
    *norm.weight except linear_attn.norm), A_log = log(-ssm_a), dt_bias = ssm_dt.bias, conv1d
    unsqueezed, qwen3next's attn_qkv + attn_gate re-interleaved per K-head group into
    in_proj_qkvz, qwen35moe's V heads (attn_qkv V rows, attn_gate, ssm_beta, ssm_alpha, ssm_a,
    ssm_dt, ssm_conv1d V channels, ssm_out columns) put back from tiled to grouped order, experts
    unstacked into gate_up_proj / down_proj. The round trip is asserted bit for bit: every HF
    parameter read back equals the original float32 weight, rounded to f16 where the GGUF tensor
    is F16 (A_log: -exp(A_log) equals the file's ssm_a to 1 ulp of float64, ssm_a itself is
    checked bit for bit against float32 -exp(A_log)). So HF computes on exactly the file's values.
 4. Float64 end to end: model.double() is not enough; transformers computes in float32 in
    RMSNorm (x.float(), weight.float()), RMSNormGated, the router softmax, the rotary table
    (inv_freq and freqs), the decay g (A_log.float(), a.float()) and both delta-rule functions
    (torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule cast to float32). Each of
    those functions / forwards is re-compiled from transformers' own source with only the casts
    changed (each replacement asserted to match exactly once), and inv_freq is recomputed in
    float64; SDPA attention. That the patches take effect is asserted (each patched function
    counted as called; the recurrent states left in the cache are float64). The unpatched model's
    distance is recorded as hf.float32_islands_max_rel_diff.
 5. Run (a): the 150-token prompt as one forward with a cache (chunked delta rule, 3 chunks of
    64), then 8 single-token decode steps through the cache (recurrent delta rule); this is the
    golden. Run (b): all 158 tokens as one no-cache forward; (a) and (b) must agree to 1e-10
    relative (hf.chunked_vs_recurrent_max_rel_diff).

Dump conventions: lin_core is the delta rule's output before the gated RMSNorm, [n_v_heads *
head_v_dim] in the GGUF's V-head order (grouped = HF order for qwen3next, tiled for qwen35moe).

Needs (NOT needed by CI; the outputs are committed): torch, transformers 5.x, numpy,
safetensors, tokenizers, and llama.cpp's source tree (its gguf-py is used for reading/writing):
  python3 scripts/make_qwen3next_goldens.py --llama-cpp /path/to/llama.cpp [--arch qwen3next qwen35moe]
"""

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hf_convert import (convert, hook_catcher, load_and_check, read_gguf, recompile,  # noqa: E402
                        run_hooked, write_tokenizer)
from hf_dump import max_rel_diff  # noqa: E402
DEFAULT_LLAMA_CPP = "/work/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"

SEED = 20260315
N_PROMPT = 150        # > conv width, 3 chunks of HF's 64-token chunked delta rule
N_DECODE = 8          # single-token decode steps through the cache (recurrent delta rule)
AGREE_LIMIT = 1e-10   # run (a) vs run (b), float64

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    tie_word_embeddings=False,
    attention_bias=False,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    full_attention_interval=2,     # kept in config.json: the converter reads it (default 4)
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=32,
)
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}

ARCHS = {
    "qwen3next": dict(
        out="hf_qwen3next", hf_class="Qwen3NextForCausalLM", module="qwen3_next", prefix="Qwen3Next",
        rotary="Qwen3NextRotaryEmbedding", config="Qwen3NextConfig", tokpre="qwen2",
        extra=dict(intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                   rope_parameters=dict(ROPE))),
    "qwen35moe": dict(
        out="hf_qwen35moe", hf_class="Qwen3_5MoeForCausalLM", module="qwen3_5_moe", prefix="Qwen3_5Moe",
        rotary="Qwen3_5MoeTextRotaryEmbedding", config="Qwen3_5MoeTextConfig", tokpre="qwen35",
        # text-only positions: all three MRoPE sections see the same position; [2,1,1] sums to rope dim / 2
        extra=dict(rope_parameters=dict(ROPE, mrope_section=[2, 1, 1], mrope_interleaved=True))),
}

# Run as `python -c WRAPPER LLAMA_CPP TOKPRE converter-args...`: the converter, unchanged, except
# for the pre-tokenizer identification (our tiny tokenizer's hash is not in its table).
# ---------------------------------------------------------------- weights

def init_weights(model, rng, torch):
    """Random float32 weights, scaled for a healthy tiny model (see the module docstring)."""
    c = model.config
    H, E = c.hidden_size, c.num_experts
    nv, nk = c.linear_num_value_heads, c.linear_num_key_heads
    vdim = nv * c.linear_value_head_dim

    def normal(shape, std):
        return rng.standard_normal(shape) * std

    def stored_norm(n):
        # the norm's multiplier s (what the GGUF stores), in [0.5, 1.9] so that the HF form
        # w = s - 1 and the converter's w + 1 are exact in float32
        return np.clip(1.0 + 0.2 * rng.standard_normal(n), 0.5, 1.9).astype(np.float32)

    out = {}
    for name, p in model.named_parameters():
        shp = tuple(p.shape)
        if name == "model.embed_tokens.weight":
            v = normal(shp, 1.0)                        # token identity dominates the residual
        elif name == "lm_head.weight":
            v = normal(shp, H ** -0.5)
        elif name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")) or name == "model.norm.weight":
            s = stored_norm(shp)
            v = (s - np.float32(1.0)).astype(np.float32)     # zero-centred HF form: HF multiplies by (1 + w)
            assert np.array_equal(v + np.float32(1.0), s)
        elif name.endswith("linear_attn.norm.weight"):
            v = stored_norm(shp)                        # RMSNormGated multiplies by w itself
        elif name.endswith(("in_proj_qkvz.weight", "in_proj_qkv.weight", "in_proj_z.weight")):
            v = normal(shp, H ** -0.5)
        elif name.endswith(("in_proj_ba.weight", "in_proj_b.weight", "in_proj_a.weight")):
            v = normal(shp, 0.05)                       # b, a ~ N(0, 0.4): beta = sigmoid(b) in ~(0.23, 0.77)
        elif name.endswith("linear_attn.dt_bias"):
            v = rng.uniform(-0.5, 0.5, shp)
        elif name.endswith("linear_attn.A_log"):
            # per-head decay rates: exp(g) = exp(-A softplus(a + dt_bias)) spans ~0.3 .. 0.99
            v = np.log(rng.permutation([0.05, 0.15, 0.35, 0.75])[:nv] * np.exp(0.1 * rng.standard_normal(nv)))
        elif name.endswith("conv1d.weight"):
            v = normal(shp, 0.5)
        elif name.endswith("out_proj.weight"):
            v = normal(shp, 0.5 * vdim ** -0.5)
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            v = normal(shp, H ** -0.5)
        elif name.endswith("o_proj.weight"):
            v = normal(shp, 0.5 * shp[1] ** -0.5)
        elif name.endswith("mlp.gate.weight"):
            v = normal(shp, 1.5 * H ** -0.5)            # router logits of std ~1.5
        elif name.endswith("experts.gate_up_proj"):
            v = normal(shp, H ** -0.5)
        elif name.endswith("experts.down_proj"):
            v = normal(shp, 0.5 * shp[2] ** -0.5)
        elif name.endswith(("shared_expert.gate_proj.weight", "shared_expert.up_proj.weight")):
            v = normal(shp, H ** -0.5)
        elif name.endswith("shared_expert.down_proj.weight"):
            v = normal(shp, 0.5 * shp[1] ** -0.5)
        elif name.endswith("shared_expert_gate.weight"):
            v = normal(shp, H ** -0.5)
        else:
            raise RuntimeError(f"no init rule for {name} {shp}")
        out[name] = np.ascontiguousarray(v, dtype=np.float32)
    assert E == c.num_experts and nk > 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(out[name]))
    return out


# ---------------------------------------------------------------- GGUF -> HF

def v_heads_tiled_to_grouped(x, axis, nk, r, hd):
    """Inverse of the converter's _reorder_v_heads (grouped [nk, r, hd] -> tiled [r, nk, hd])."""
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(r, nk, hd, *rest).transpose(1, 0, 2, *range(3, 3 + len(rest))).reshape(nk * r * hd, *rest)
    return np.moveaxis(x, 0, axis)


def v_heads_grouped_to_tiled(x, axis, nk, r, hd):
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(nk, r, hd, *rest).transpose(1, 0, 2, *range(3, 3 + len(rest))).reshape(nk * r * hd, *rest)
    return np.moveaxis(x, 0, axis)


def gguf_to_hf(arch, cfg, t):
    """{HF parameter name: (float64 array, [source GGUF tensor names], kind)}; kind 'plain',
    'norm' (stored = w + 1) or 'a_log' (stored = -exp(A_log))."""
    H = cfg.hidden_size
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    hk, hv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = nv // nk
    kd, vd = nk * hk, nv * hv
    tiled = arch == "qwen35moe" and nk != nv    # the converter reorders V heads only there

    def ungroup(x, axis, hd):
        return v_heads_tiled_to_grouped(x, axis, nk, r, hd) if tiled else x

    sd = {}

    def put(hf, val, srcs, kind="plain"):
        sd[hf] = (val, srcs, kind)

    put("model.embed_tokens.weight", t["token_embd.weight"], ["token_embd.weight"])
    put("lm_head.weight", t["output.weight"], ["output.weight"])
    put("model.norm.weight", t["output_norm.weight"] - 1.0, ["output_norm.weight"], "norm")
    for il, lt in enumerate(cfg.layer_types):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        put(p + "input_layernorm.weight", t[b + "attn_norm.weight"] - 1.0, [b + "attn_norm.weight"], "norm")
        put(p + "post_attention_layernorm.weight", t[b + "post_attention_norm.weight"] - 1.0,
            [b + "post_attention_norm.weight"], "norm")
        if lt == "linear_attention":
            q = p + "linear_attn."
            qkv, z = t[b + "attn_qkv.weight"], t[b + "attn_gate.weight"]
            assert qkv.shape == (2 * kd + vd, H) and z.shape == (vd, H)
            if arch == "qwen3next":
                # converter: in_proj_qkvz rows [nk groups of (q hk, k hk, v r*hv, z r*hv)] ->
                # attn_qkv = [all q; all k; all v], attn_gate = all z (group order kept)
                qkvz = np.concatenate([qkv[:kd].reshape(nk, hk, H), qkv[kd:2 * kd].reshape(nk, hk, H),
                                       qkv[2 * kd:].reshape(nk, r * hv, H), z.reshape(nk, r * hv, H)], axis=1)
                put(q + "in_proj_qkvz.weight", qkvz.reshape(-1, H), [b + "attn_qkv.weight", b + "attn_gate.weight"])
                put(q + "in_proj_ba.weight", t[b + "ssm_ba.weight"], [b + "ssm_ba.weight"])
            else:
                put(q + "in_proj_qkv.weight", np.concatenate([qkv[:2 * kd], ungroup(qkv[2 * kd:], 0, hv)]),
                    [b + "attn_qkv.weight"])
                put(q + "in_proj_z.weight", ungroup(z, 0, hv), [b + "attn_gate.weight"])
                put(q + "in_proj_b.weight", ungroup(t[b + "ssm_beta.weight"], 0, 1), [b + "ssm_beta.weight"])
                put(q + "in_proj_a.weight", ungroup(t[b + "ssm_alpha.weight"], 0, 1), [b + "ssm_alpha.weight"])
            conv = t[b + "ssm_conv1d.weight"]
            conv = np.concatenate([conv[:2 * kd], ungroup(conv[2 * kd:], 0, hv)])
            put(q + "conv1d.weight", conv[:, None, :], [b + "ssm_conv1d.weight"])
            put(q + "A_log", np.log(-ungroup(t[b + "ssm_a"], 0, 1)), [b + "ssm_a"], "a_log")
            put(q + "dt_bias", ungroup(t[b + "ssm_dt.bias"], 0, 1), [b + "ssm_dt.bias"])
            put(q + "norm.weight", t[b + "ssm_norm.weight"], [b + "ssm_norm.weight"])
            put(q + "out_proj.weight", ungroup(t[b + "ssm_out.weight"], 1, hv), [b + "ssm_out.weight"])
        else:
            q = p + "self_attn."
            for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                put(q + hf + ".weight", t[b + gg + ".weight"], [b + gg + ".weight"])
            for hf, gg in (("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
                put(q + hf + ".weight", t[b + gg + ".weight"] - 1.0, [b + gg + ".weight"], "norm")
        m = p + "mlp."
        put(m + "gate.weight", t[b + "ffn_gate_inp.weight"], [b + "ffn_gate_inp.weight"])
        put(m + "experts.gate_up_proj",
            np.concatenate([t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]], axis=1),
            [b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight"])
        put(m + "experts.down_proj", t[b + "ffn_down_exps.weight"], [b + "ffn_down_exps.weight"])
        for w in ("gate", "up", "down"):
            put(m + f"shared_expert.{w}_proj.weight", t[b + f"ffn_{w}_shexp.weight"], [b + f"ffn_{w}_shexp.weight"])
        put(m + "shared_expert_gate.weight", t[b + "ffn_gate_inp_shexp.weight"].reshape(1, H),
            [b + "ffn_gate_inp_shexp.weight"])
    used = {s for _, srcs, _ in sd.values() for s in srcs}
    assert used == set(t), f"GGUF tensors not used: {sorted(set(t) - used)}"
    return sd


def a_log_checks(ssm_a_file, torch):
    """hf_convert.load_and_check's special checks of the A_log parameters: the file holds
    float32(-exp(A_log)) (torch float32 exp), HF gets log(-ssm_a) in float64."""
    def check(name):
        def f(val, o, ty):
            assert ty == "F32", (name, ty)
            want = (-torch.from_numpy(o).exp()).numpy()
            assert np.array_equal(ssm_a_file[name], want.astype(np.float64)), name
            back = -np.exp(val)
            assert np.all(np.abs(back - ssm_a_file[name]) <= 4.5e-16 * np.abs(ssm_a_file[name])), name
        return f
    return {name: check(name) for name in ssm_a_file}


# ---------------------------------------------------------------- float64 patches

F32_CAST = "x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)"
F64_CAST = "x.transpose(1, 2).to(initial_dtype, memory_format=torch.contiguous_format)"


@contextlib.contextmanager
def float64_patches(mod, arch, model, counter, torch):
    P = ARCHS[arch]["prefix"]
    g = vars(mod)
    funcs = {
        "torch_chunk_gated_delta_rule": [(F32_CAST, F64_CAST)],
        "torch_recurrent_gated_delta_rule": [(F32_CAST, F64_CAST)],
    }
    methods = {
        P + "GatedDeltaNet": [("g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)",
                               "g = -self.A_log.exp() * F.softplus(a + self.dt_bias)")],
        P + "RMSNormGated": [("hidden_states = hidden_states.to(torch.float32)\n", "\n"),
                             ("ACT2FN[self.activation](gate.to(torch.float32))", "ACT2FN[self.activation](gate)")],
        P + "RMSNorm": [("self._norm(x.float())", "self._norm(x)"),
                        ("(1.0 + self.weight.float())", "(1.0 + self.weight)")],
        P + "TopKRouter": [("softmax(router_logits, dtype=torch.float, dim=-1)", "softmax(router_logits, dim=-1)")],
        ARCHS[arch]["rotary"]: [("position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)",
                                 "position_ids[..., None].to(x.dtype) * self.inv_freq.to(device=x.device, dtype=x.dtype)")],
    }
    saved_f = {k: g[k] for k in funcs}
    saved_m = {k: getattr(mod, k).forward for k in methods}
    rot = model.model.rotary_emb
    saved_inv = rot.inv_freq.clone()
    c = model.config
    dim = int(c.head_dim * c.rope_parameters["partial_rotary_factor"])
    inv64 = 1.0 / (c.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    assert torch.allclose(inv64, saved_inv.double(), rtol=1e-6, atol=0)
    try:
        for k, reps in funcs.items():
            g[k] = recompile(saved_f[k], reps, g, counter, k)
        for k, reps in methods.items():
            getattr(mod, k).forward = recompile(saved_m[k], reps, g, counter, k)
        rot.inv_freq = inv64
        yield sorted(list(funcs) + [k + ".forward" for k in methods]) + ["rotary inv_freq"]
    finally:
        for k, f in saved_f.items():
            g[k] = f
        for k, f in saved_m.items():
            getattr(mod, k).forward = f
        rot.inv_freq = saved_inv


# ---------------------------------------------------------------- HF runs

def run_hf(model, arch, tokens, n_prompt, torch, cached=True):
    """Run (a) (cached: prompt + single-token decode steps) or (b) (one no-cache forward).
    Returns ({name: [n_tok, ...] numpy}, extra) where extra holds beta / exp(g) samples."""
    c = model.config
    nk, nv, hv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_value_head_dim
    r = nv // nk
    tiled = arch == "qwen35moe" and nk != nv
    caught, hooks, add, fwd = hook_catcher()

    for il, layer in enumerate(model.model.layers):
        p = f"blk.{il}."
        if c.layer_types[il] == "linear_attention":
            la = layer.linear_attn
            fwd(la, lambda i, o, p=p: add(p + "attn_out", o))

            def core(_m, inp, p=p):
                x = inp[0].detach().reshape(-1, nv * hv)
                if tiled:
                    x = torch.from_numpy(np.ascontiguousarray(v_heads_grouped_to_tiled(x.numpy(), 1, nk, r, hv)))
                caught.setdefault(p + "lin_core", []).append(x)
            hooks.append(la.norm.register_forward_pre_hook(core))
            if arch == "qwen3next":
                fwd(la.in_proj_ba, lambda i, o, p=p: add(p + "_ba", o))
            else:
                fwd(la.in_proj_b, lambda i, o, p=p: add(p + "_b", o))
                fwd(la.in_proj_a, lambda i, o, p=p: add(p + "_a", o))
        else:
            fwd(layer.self_attn, lambda i, o, p=p: add(p + "attn_out", o[0]))
        mlp = layer.mlp

        def router(i, o, p=p):
            add(p + "router_logits", o[0])
            add(p + "topk_weights", o[1])
            add(p + "topk_ids", o[2])
        fwd(mlp.gate, router)
        fwd(mlp.experts, lambda i, o, p=p: add(p + "ffn_out", o))
        fwd(mlp.shared_expert, lambda i, o, p=p: add(p + "_shexp", o))
        fwd(mlp.shared_expert_gate, lambda i, o, p=p: add(p + "_shexp_gate", o))
        fwd(layer, lambda i, o, p=p: add(p + "x_out", o[0] if isinstance(o, tuple) else o))

    logits, cache = run_hooked(model, tokens, n_prompt, cached, hooks, torch)

    cat = {k: torch.cat(v, dim=0) for k, v in caught.items()}
    arrays = {"logits": logits}
    extra = {"beta": [], "decay": []}
    for il, layer in enumerate(model.model.layers):
        p = f"blk.{il}."
        for k in ("attn_out", "lin_core", "router_logits", "topk_weights", "ffn_out", "x_out"):
            if p + k in cat:
                arrays[p + k] = cat[p + k].numpy()
        arrays[p + "topk_ids"] = cat[p + "topk_ids"].numpy().astype(np.int32)
        # the shared expert exactly as Qwen3*SparseMoeBlock.forward combines it
        arrays[p + "shexp_out"] = (torch.sigmoid(cat[p + "_shexp_gate"]) * cat[p + "_shexp"]).numpy()
        if c.layer_types[il] == "linear_attention":
            la = layer.linear_attn
            if arch == "qwen3next":
                ba = cat[p + "_ba"].numpy().reshape(-1, nk, 2 * r)
                b, a = ba[:, :, :r].reshape(-1, nv), ba[:, :, r:].reshape(-1, nv)
            else:
                b, a = cat[p + "_b"].numpy(), cat[p + "_a"].numpy()
            A = np.exp(la.A_log.detach().double().numpy())
            dt = la.dt_bias.detach().double().numpy()
            extra["beta"].append(1.0 / (1.0 + np.exp(-b)))
            extra["decay"].append(np.exp(-A * np.logaddexp(0.0, a + dt)))
    for k, v in arrays.items():
        assert v.shape[0] == len(tokens), (k, v.shape)
    return arrays, extra, cache


def check_lin_core_order(gold, t, tokens, cfg):
    """Recompute the linear layers' attn_out from the dumped lin_core with the GGUF's own attn_gate,
    ssm_norm and ssm_out (numpy): proves lin_core is in the file's V-head order. Returns the max
    relative difference."""
    nv, hv, eps = cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.rms_norm_eps
    worst = 0.0
    for il, lt in enumerate(cfg.layer_types):
        if lt != "linear_attention":
            continue
        b = f"blk.{il}."
        x = t["token_embd.weight"][tokens] if il == 0 else gold[f"blk.{il - 1}.x_out"]
        h = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * t[b + "attn_norm.weight"]
        z = (h @ t[b + "attn_gate.weight"].T).reshape(len(tokens), nv, hv)
        core = gold[b + "lin_core"].reshape(len(tokens), nv, hv)
        y = core / np.sqrt(np.mean(core * core, axis=2, keepdims=True) + eps) * t[b + "ssm_norm.weight"]
        y = y * (z / (1.0 + np.exp(-z)))
        out = y.reshape(len(tokens), nv * hv) @ t[b + "ssm_out.weight"].T
        worst = max(worst, max_rel_diff(out, gold[b + "attn_out"]))
    return worst


def routing_health(arrays, n_layer, E, k):
    fr, margins = [], []
    for il in range(n_layer):
        ids = arrays[f"blk.{il}.topk_ids"]
        fr.append(np.bincount(ids.reshape(-1), minlength=E) / ids.shape[0])
        lg = arrays[f"blk.{il}.router_logits"]
        pr = np.exp(lg - lg.max(axis=1, keepdims=True))
        pr /= pr.sum(axis=1, keepdims=True)
        srt = -np.sort(-pr, axis=1)
        margins.append(float(np.min(srt[:, k - 1] - srt[:, k])))
    return fr, margins


# ---------------------------------------------------------------- main

def make_one(arch, out_dir, lcpp, keep_hf, torch, transformers, gguf, qwen3moe_ref):
    import importlib
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
        write_tokenizer(hf_dir, ["<|endoftext|>"], COMMON["vocab_size"], 256)
        with open(os.path.join(hf_dir, "config.json")) as f:
            saved_cfg = json.load(f)
        assert saved_cfg.get("full_attention_interval") == COMMON["full_attention_interval"]
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(saved_cfg, f, indent=1, sort_keys=True)
            f.write("\n")
        mpath = os.path.join(out_dir, "tiny-f16.gguf")
        convert(hf_dir, mpath, arch, ARCHS[arch]["tokpre"], lcpp, ["--no-mtp"])
    finally:
        if keep_hf:
            dst = os.path.join(keep_hf, f"tiny-{arch}")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(hf_dir, dst)
        shutil.rmtree(tmp, ignore_errors=True)

    reader, t, types = read_gguf(mpath, gguf)
    assert reader.fields["general.architecture"].contents() == arch
    sd = gguf_to_hf(arch, config, t)
    model = model.double()
    ssm_a = {n: t[srcs[0]] for n, (v, srcs, kind) in sd.items() if kind == "a_log"}
    ssm_a = {n: (v2 if arch != "qwen35moe" else v_heads_tiled_to_grouped(v2, 0, config.linear_num_key_heads,
             config.linear_num_value_heads // config.linear_num_key_heads, 1)) for n, v2 in ssm_a.items()}
    n_f16 = load_and_check(model, {n: (v, srcs) for n, (v, srcs, _) in sd.items()}, orig, types, torch,
                           special=a_log_checks(ssm_a, torch))

    counter = {}
    with float64_patches(mod, arch, model, counter, torch) as patched:
        gold, extra, cache = run_hf(model, arch, tokens, N_PROMPT, torch, cached=True)
        for il, lt in enumerate(config.layer_types):
            if lt == "linear_attention":
                st = cache.get_recurrent_state(il, state_idx=0)
                assert st.dtype == torch.float64, (il, st.dtype)
        missing = [k for k in patched if k != "rotary inv_freq" and counter.get(k.removesuffix(".forward"), 0) == 0]
        assert not missing, f"patched but never called: {missing}"
        full, _, _ = run_hf(model, arch, tokens, N_PROMPT, torch, cached=False)
    raw, _, _ = run_hf(model, arch, tokens, N_PROMPT, torch, cached=True)   # transformers as shipped
    islands = max_rel_diff(raw["logits"], gold["logits"])

    agree = 0.0
    for k in gold:
        if k.endswith("topk_ids"):
            assert np.array_equal(gold[k], full[k]), k
        else:
            agree = max(agree, max_rel_diff(gold[k], full[k]))
    assert agree < AGREE_LIMIT, f"chunked (a) vs one-pass (b): {agree}"
    assert set(gold) == set(full)

    lin_check = check_lin_core_order(gold, t, tokens, config)
    assert lin_check < 1e-12, f"lin_core is not in the GGUF's V-head order: {lin_check}"

    E, k = config.num_experts, config.num_experts_per_tok
    fr, margins = routing_health(gold, config.num_hidden_layers, E, k)
    beta = np.concatenate([x.reshape(-1) for x in extra["beta"]])
    decay = np.concatenate([x.reshape(-1) for x in extra["decay"]])

    meta = {"dump.n_prompt": N_PROMPT, "dump.seed": seed,
            "hf.transformers_version": transformers.__version__,
            "hf.torch_version": torch.__version__,
            "hf.attn_implementation": "sdpa",
            "hf.float64_patches": ", ".join(patched),
            "hf.float32_islands_max_rel_diff": islands,
            "hf.chunked_vs_recurrent_max_rel_diff": agree,
            "hf.converter": "llama.cpp convert_hf_to_gguf.py --outtype f16 --no-mtp (get_vocab_base_pre -> "
                            f"'{spec['tokpre']}')"}
    gpath = os.path.join(out_dir, "tiny.golden.gguf")
    qwen3moe_ref.write_dump(gpath, gold, tokens, os.path.basename(mpath),
                            f"HF transformers {spec['hf_class']}, float64 (scripts/make_qwen3next_goldens.py)",
                            extra_meta=meta, float_type=np.float64)

    # readback of the golden
    back, bmeta = qwen3moe_ref.read_dump(gpath)
    for name in gold:
        assert np.array_equal(back[name], gold[name].astype(back[name].dtype)), name

    print(f"== {arch}: {mpath} {os.path.getsize(mpath)} bytes, golden {os.path.getsize(gpath)} bytes, "
          f"config {os.path.getsize(os.path.join(out_dir, 'config.json'))} bytes; {n_f16} HF params from F16")
    print(f"   chunked+recurrent (a) vs one-pass (b): max rel diff {agree:.3g}; "
          f"unpatched-vs-float64 logits {islands:.3g}; lin_core order check {lin_check:.3g}")
    print(f"   beta in [{beta.min():.3f}, {beta.max():.3f}]; exp(g) in [{decay.min():.3f}, {decay.max():.3f}] "
          f"(1%..99%: {np.percentile(decay, 1):.3f}..{np.percentile(decay, 99):.3f})")
    for il in range(config.num_hidden_layers):
        print(f"   layer {il}: tokens per expert " + " ".join(f"{x:.3f}" for x in fr[il])
              + f"; min top-{k} margin {margins[il]:.3g}")
    xo = [np.linalg.norm(gold[f"blk.{il}.x_out"], axis=1).mean() for il in range(config.num_hidden_layers)]
    print("   mean |x_out| per layer " + " ".join(f"{v:.2f}" for v in xo)
          + f"; patched calls {counter}")
    return dict(arch=arch, islands=islands, agree=agree, margins=margins, fractions=fr)


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
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for arch in args.arch:
        make_one(arch, os.path.join(args.data, ARCHS[arch]["out"]), lcpp, args.keep_hf,
                 torch, transformers, gguf, qwen3moe_ref)


if __name__ == "__main__":
    main()
