#!/usr/bin/env python3
"""`tiermoe mkmodel` for Mixtral (arch llama), OLMoE, GLM-4.5 (glm4moe) and DeepSeek-V3 / Kimi K2
(deepseek2), against llama.cpp's converter, transformers' configs and the engine.

- tiny-mixtral / tiny-olmoe / tiny-glm4moe / tiny-deepseek-v3 against tests/data/hf_*/tiny-f16.gguf (written by
  llama.cpp's convert_hf_to_gguf.py): the same tensors in the same order with the same types
  and shapes, the same keys with the same GGUF value types and values, but for
  KEYS_DIFFERENT.
- mixtral-8x7b, olmoe-1b-7b, glm-4.5-air, glm-4.5: the presets' counts from mkmodel's own
  lines (a file that cannot be created: the lines come before the write) against
  transformers' MixtralConfig / OlmoeConfig / Glm4MoeConfig defaults with the released
  models' values where they differ (OLMoE's experts 1024 wide; GLM's heads of 128 (the
  default: hidden / heads); GLM-4.5's 92 layers of 5120,
  160 experts of 1536, 3 dense layers of 12288, scale 2.5, QK norm); then each written with
  narrow widths (--n-embd 256, heads of 128, --n-ff 512, --n-ff-exp 256, 16 experts, vocab
  1024, --fill repeat): every tensor of the converter's layout (GLM's dense layers, shared
  expert, selection bias, q/k/v biases, its NextN layer after the others: block_count one
  more, nextn.eh_proj / enorm / hnorm / shared_head_norm), the presets' types (experts q4_K,
  GLM-4.5-Air's ffn_down_exps q5_0 (rows of 1408 take no K-quant), attention, dense FFN and
  shared expert q8_0, norms, routers and biases f32), and the keys.
- deepseek-v3, kimi-k2: the counts against DeepseekV3Config's defaults (DeepSeek-V3's) and
  against Kimi-K2-Instruct's config.json (64 heads, 384 experts in one group, 1 dense layer,
  scale 2.827, rope_theta 50000, YaRN factor 32 with beta_fast = beta_slow = 1), the MLA
  ranks and YaRN included; written narrow (4 and 2 layers) with the converter's MLA tensors
  (attn_q_a / q_a_norm / q_b, kv_a_mqa, kv_a_norm, k_b [nope, kv_lora, heads], v_b, output,
  ffn_norm), q8_0 attention (k_b's rows of 64 take it), and the MLA and YaRN keys.
- tiny-gemma-4 against tests/data/hf_gemma4/tiny-f16.gguf as the tiny ones above;
  gemma-4-26b-a4b: its counts (transformers has no config of it: the numbers the preset
  states), then written with 6 layers and narrow widths (heads and the experts' 704 kept):
  the converter's layout, types (ffn_down_exps q5_0), rope_freqs' factors, the keys.
- The engine loads every file: all logits finite, each MoE layer's router reaches most
  experts, and the NextN layer is not run (n_layer one less than block_count).
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import DATA, TIERMOE, TMP, TOOLS, check, finish  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402

T = gguf.GGMLQuantizationType
TINY = {"tiny-mixtral": ("llama", "hf_mixtral"), "tiny-olmoe": ("olmoe", "hf_olmoe"),
        "tiny-glm4moe": ("glm4moe", "hf_glm4moe"), "tiny-deepseek-v3": ("deepseek2", "hf_deepseek2"),
        "tiny-gemma-4": ("gemma4", "hf_gemma4")}
KEYS_DIFFERENT = {
    "general.name": "mkmodel names its files",
    "general.size_label": "the converter's label of the parameter count; mkmodel writes none",
    "vocab_size": "mkmodel writes no tokenizer by default (no_vocab): llama.cpp then reads "
                  "the vocabulary's size here (the converter writes llama's always)",
}
NARROW = ["--n-embd", "256", "--n-head", "2", "--n-head-kv", "1", "--head-dim", "128", "--n-ff", "512",
          "--n-ff-exp", "256", "--n-expert", "16", "--n-vocab", "1024", "--fill", "repeat"]


def mk(name, *flags, expect=0):
    path = os.path.join(TMP, name + ".gguf")
    if os.path.exists(path):
        os.remove(path)
    r = subprocess.run([TIERMOE, "mkmodel", "-t", "2", "-o", path, *flags], capture_output=True, text=True)
    check(r.returncode == expect, f"mkmodel {' '.join(flags)}: exit {r.returncode}, want {expect}: {r.stderr}")
    return path, r


def tensors(r):
    return [(t.name, t.tensor_type, [int(x) for x in t.shape]) for t in r.tensors]


def fields(r):
    return {k: (tuple(int(x) for x in f.types), f.contents()) for k, f in r.fields.items()
            if not k.startswith("GGUF.") and not k.startswith("tokenizer.") and not k.startswith("tiermoe.")}


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def versus_converter(preset):
    arch, data = TINY[preset]
    conv = gguf.GGUFReader(os.path.join(DATA, data, "tiny-f16.gguf"))
    path, _ = mk(preset, "--preset", preset)
    mine = gguf.GGUFReader(path)
    a, b = tensors(mine), tensors(conv)
    check(a == b, f"{preset}: tensors differ from the converter's: "
                  f"{[(x, y) for x, y in zip(a, b) if x != y][:4]} (counts {len(a)}, {len(b)})")
    fa, fb = fields(mine), fields(conv)
    skip = {k if k.startswith("general.") else f"{arch}.{k}" for k in KEYS_DIFFERENT}
    for k in sorted(set(fa) | set(fb)):
        if k in skip:
            continue
        va, vb = fa.get(k), fb.get(k)
        if va and vb and isinstance(va[1], float):
            same = va[0] == vb[0] and abs(va[1] - vb[1]) <= 1e-6 * abs(vb[1])
        else:
            same = va == vb
        check(same, f"{preset}: key {k}: mkmodel {va}, converter {vb}")
    check([k for k in fa if k in fb and k not in skip] == [k for k in fb if k in fa and k not in skip],
          f"{preset}: keys in another order than the converter's")
    print(f"  {preset}: {len(a)} tensors (names, order, types, shapes) and "
          f"{len([k for k in fb if k not in skip])} keys as the converter's {data}/tiny-f16.gguf")
    return path


def hf_configs():
    """The released models' shapes: transformers' defaults, with the releases' values."""
    from transformers import Glm4MoeConfig, MixtralConfig, OlmoeConfig
    mix, olm, air = MixtralConfig(), OlmoeConfig(intermediate_size=1024), Glm4MoeConfig(head_dim=128)
    glm = Glm4MoeConfig(head_dim=128, num_hidden_layers=92, hidden_size=5120, intermediate_size=12288,
                        moe_intermediate_size=1536, n_routed_experts=160, first_k_dense_replace=3,
                        routed_scaling_factor=2.5, use_qk_norm=True)
    E = lambda c: getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None) or c.n_routed_experts  # noqa: E731
    F = lambda c: getattr(c, "moe_intermediate_size", None) or c.intermediate_size  # noqa: E731
    D = lambda c: getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads  # noqa: E731
    out = {}
    for preset, c in (("mixtral-8x7b", mix), ("olmoe-1b-7b", olm), ("glm-4.5-air", air), ("glm-4.5", glm)):
        line = (f"{c.num_hidden_layers} layers, n_embd {c.hidden_size}, {c.num_attention_heads} heads "
                f"({c.num_key_value_heads} kv) of {D(c)}, {E(c)} experts ({c.num_experts_per_tok} used) of "
                f"{F(c)}, vocab {c.vocab_size}")
        glm_line = None
        if preset.startswith("glm"):
            rot = int(D(c) * c.rope_parameters["partial_rotary_factor"])
            glm_line = (f"{c.first_k_dense_replace} dense layers of {c.intermediate_size}, {c.n_shared_experts} "
                        f"shared experts, RoPE on {rot} of {D(c)}, {c.topk_group} of {c.n_group} expert groups, "
                        f"scale {c.routed_scaling_factor:g}, QK norm {'yes' if c.use_qk_norm else 'no'}, "
                        f"{c.num_nextn_predict_layers} NextN layers")
        out[preset] = (line, glm_line)
    return out


def preset_type(preset, name):
    stem = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1]
    if name == "output.weight":
        return T.Q8_0
    if name == "token_embd.weight":
        return T.Q4_K
    if stem == "ffn_down_exps" and preset == "glm-4.5-air":
        return T.Q5_0
    if stem.endswith("_exps") and name.endswith(".weight"):
        return T.Q4_K
    if stem in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "ffn_gate_shexp",
                "ffn_up_shexp", "ffn_down_shexp", "eh_proj", "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_k_b",
                "attn_v_b") and name.endswith(".weight"):
        return T.Q8_0
    return T.F32  # norms, routers, biases


def expected_tensors(preset, n_layer, n_dense, nextn, qk):
    """name -> shape of the converter's layout with NARROW's widths."""
    E, Hd, Q, KV, F, FD, X, V = 256, 128, 2 * 128, 128, 256, 512, 16, 1024
    glm, olmoe = preset.startswith("glm"), preset.startswith("olmoe")
    t = {"output.weight": [E, V], "token_embd.weight": [E, V], "output_norm.weight": [E]}
    for l in range(n_layer + nextn):
        b = f"blk.{l}."
        t.update({b + "attn_norm.weight": [E], b + "attn_q.weight": [E, Q], b + "attn_k.weight": [E, KV],
                  b + "attn_v.weight": [E, KV], b + "attn_output.weight": [Q, E]})
        t[b + ("post_attention_norm.weight" if glm else "ffn_norm.weight")] = [E]
        if olmoe:
            t.update({b + "attn_q_norm.weight": [Q], b + "attn_k_norm.weight": [KV]})
        if glm:
            t.update({b + "attn_q.bias": [Q], b + "attn_k.bias": [KV], b + "attn_v.bias": [KV]})
            if qk:
                t.update({b + "attn_q_norm.weight": [Hd], b + "attn_k_norm.weight": [Hd]})
        if glm and l < n_dense:
            t.update({b + "ffn_gate.weight": [E, FD], b + "ffn_up.weight": [E, FD], b + "ffn_down.weight": [FD, E]})
            continue
        t.update({b + "ffn_gate_inp.weight": [E, X], b + "ffn_gate_exps.weight": [E, F, X],
                  b + "ffn_up_exps.weight": [E, F, X], b + "ffn_down_exps.weight": [F, E, X]})
        if glm:
            t.update({b + "exp_probs_b.bias": [X], b + "ffn_gate_shexp.weight": [E, F],
                      b + "ffn_up_shexp.weight": [E, F], b + "ffn_down_shexp.weight": [F, E]})
        if l >= n_layer:
            t.update({b + "nextn.eh_proj.weight": [2 * E, E], b + "nextn.enorm.weight": [E],
                      b + "nextn.hnorm.weight": [E], b + "nextn.shared_head_norm.weight": [E]})
    return t


def expected_mla_tensors(n_layer, n_dense):
    """deepseek2's layout with NARROW's widths: heads of 128 = 64 nope + 64 RoPE, the presets'
    q_lora 1536, kv_lora 512, values of 128."""
    E, H, DK, R, C, QL, V, F, FD, X, NV = 256, 2, 128, 64, 512, 1536, 128, 256, 512, 16, 1024
    t = {"output.weight": [E, NV], "token_embd.weight": [E, NV], "output_norm.weight": [E]}
    for l in range(n_layer):
        b = f"blk.{l}."
        t.update({b + "attn_norm.weight": [E], b + "ffn_norm.weight": [E], b + "attn_kv_a_norm.weight": [C],
                  b + "attn_kv_a_mqa.weight": [E, C + R], b + "attn_k_b.weight": [DK - R, C, H],
                  b + "attn_v_b.weight": [C, V, H], b + "attn_output.weight": [H * V, E],
                  b + "attn_q_a_norm.weight": [QL], b + "attn_q_a.weight": [E, QL], b + "attn_q_b.weight": [QL, H * DK]})
        if l < n_dense:
            t.update({b + "ffn_gate.weight": [E, FD], b + "ffn_up.weight": [E, FD], b + "ffn_down.weight": [FD, E]})
            continue
        t.update({b + "ffn_gate_inp.weight": [E, X], b + "ffn_gate_exps.weight": [E, F, X],
                  b + "ffn_up_exps.weight": [E, F, X], b + "ffn_down_exps.weight": [F, E, X],
                  b + "exp_probs_b.bias": [X], b + "ffn_gate_shexp.weight": [E, F],
                  b + "ffn_up_shexp.weight": [E, F], b + "ffn_down_shexp.weight": [F, E]})
    return t


def ds_configs():
    """DeepSeek-V3 (DeepseekV3Config's defaults are its shape) and Kimi K2 (its config.json)."""
    from transformers import DeepseekV3Config
    v3 = (DeepseekV3Config(), 40.0, 32.0, 1.0, 10000.0)
    k2 = (DeepseekV3Config(num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384, n_group=1,
                           topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.827, vocab_size=163840),
          32.0, 1.0, 1.0, 50000.0)
    out = {}
    for preset, (c, factor, beta_fast, beta_slow, theta) in (("deepseek-v3", v3), ("kimi-k2", k2)):
        line = (f"{c.num_hidden_layers} layers, n_embd {c.hidden_size}, {c.num_attention_heads} heads (1 kv) of "
                f"{c.qk_nope_head_dim + c.qk_rope_head_dim}, {c.n_routed_experts} experts "
                f"({c.num_experts_per_tok} used) of {c.moe_intermediate_size}, vocab {c.vocab_size}")
        ds_line = (f"{c.first_k_dense_replace} dense layers of {c.intermediate_size}, {c.n_shared_experts} shared "
                   f"experts, MLA q_lora {c.q_lora_rank}, kv_lora {c.kv_lora_rank}, heads of {c.qk_nope_head_dim} "
                   f"nope + {c.qk_rope_head_dim} RoPE, values of {c.v_head_dim}, {c.topk_group} of {c.n_group} "
                   f"expert groups, scale {c.routed_scaling_factor:g}, YaRN factor {factor:g} over 4096")
        out[preset] = (line, ds_line, beta_fast, beta_slow, theta, c)
    return out


def ds_preset(preset, want):
    line, ds_line, beta_fast, beta_slow, theta, c = want
    out = subprocess.run([TIERMOE, "mkmodel", "--preset", preset, "-o", os.path.join(TMP, "no_such_dir", "x.gguf")],
                         capture_output=True, text=True).stderr
    check(line in out, f"{preset}: the preset's counts: want '{line}' in: {out}")
    check(ds_line in out, f"{preset}: want '{ds_line}' in: {out}")
    n_dense = c.first_k_dense_replace
    n_layer = n_dense + 1
    path, _ = mk(preset, "--preset", preset, "--n-layer", str(n_layer), *NARROW)
    r = gguf.GGUFReader(path)
    got = {n: s for n, _, s in tensors(r)}
    want_t = expected_mla_tensors(n_layer, n_dense)
    bad = [(n, got.get(n), want_t.get(n)) for n in sorted(set(got) | set(want_t)) if got.get(n) != want_t.get(n)]
    check(not bad, f"{preset}: tensors: {bad[:4]}")
    for n, ty, _ in tensors(r):
        check(ty == preset_type(preset, n), f"{preset}: {n} is {ty.name}, want {preset_type(preset, n).name}")
    a = "deepseek2"
    keys = {"block_count": n_layer, "attention.head_count_kv": 1, "attention.q_lora_rank": c.q_lora_rank,
            "attention.kv_lora_rank": c.kv_lora_rank, "attention.key_length": c.kv_lora_rank + 64,
            "attention.value_length": c.kv_lora_rank, "attention.key_length_mla": 128,
            "attention.value_length_mla": c.v_head_dim, "rope.dimension_count": 64,
            "leading_dense_block_count": n_dense, "expert_shared_count": 1, "expert_gating_func": 2,
            "expert_weights_norm": True, "expert_group_count": c.n_group, "expert_group_used_count": c.topk_group,
            "rope.freq_base": theta, "rope.scaling.type": "yarn", "rope.scaling.original_context_length": 4096,
            "rope.scaling.yarn_beta_fast": beta_fast, "rope.scaling.yarn_beta_slow": beta_slow}
    for k, v in keys.items():
        check(field(r, f"{a}.{k}") == v, f"{preset}: {a}.{k} {field(r, f'{a}.{k}')}, want {v}")
    for k, v in (("expert_weights_scale", c.routed_scaling_factor), ("rope.scaling.yarn_log_multiplier", 0.1)):
        check(abs(field(r, f"{a}.{k}") - v) <= 1e-6 * v, f"{preset}: {a}.{k} {field(r, f'{a}.{k}')}, want {v}")
    engine(preset, path, n_layer, n_dense)
    print(f"  {preset}: counts as the release ({line}; {ds_line}); narrow file: {len(got)} tensors of the "
          f"converter's MLA layout, types, keys; the engine runs it")


def engine(preset, path, n_layer, n_dense):
    out = os.path.join(TMP, f"fd_{preset}.gguf")
    toks = ",".join(str(t) for t in np.random.default_rng(3).integers(0, 200, 32))
    r = subprocess.run([os.path.join(TOOLS, "forward_dump"), path, "--tokens", toks, "--prompt", "24", "-o", out],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"{preset}: forward_dump: {r.stderr[-400:]}")
    if r.returncode:
        return
    d, _ = ref.read_dump(out)
    check(all(np.isfinite(v).all() for v in d.values() if v.dtype.kind == "f"), f"{preset}: a non-finite stage")
    layers = sorted({int(k.split(".")[1]) for k in d if k.startswith("blk.")})
    check(layers == list(range(n_layer)), f"{preset}: layers run {layers}, want {n_layer} (the NextN one not)")
    for l in range(n_dense, n_layer):
        used = len(np.unique(d[f"blk.{l}.topk_ids"]))
        check(used >= 8, f"{preset}: layer {l}'s router reaches {used} of 16 experts")
    for l in range(n_dense):
        check(f"blk.{l}.dense_out" in d, f"{preset}: layer {l} has no dense_out")


def big_preset(preset, want):
    line, glm_line = want
    out = subprocess.run([TIERMOE, "mkmodel", "--preset", preset, "-o", os.path.join(TMP, "no_such_dir", "x.gguf")],
                         capture_output=True, text=True).stderr
    check(line in out, f"{preset}: the preset's counts: want '{line}' in: {out}")
    if glm_line:
        check(glm_line in out, f"{preset}: want '{glm_line}' in: {out}")
    glm = preset.startswith("glm")
    n_layer = 4 if preset == "glm-4.5" else 2
    n_dense, nextn = (3 if preset == "glm-4.5" else 1 if glm else 0), (1 if glm else 0)
    path, _ = mk(preset.replace(".", "_"), "--preset", preset, "--n-layer", str(n_layer), *NARROW)
    r = gguf.GGUFReader(path)
    got = {n: s for n, _, s in tensors(r)}
    want_t = expected_tensors(preset, n_layer, n_dense, nextn, preset == "glm-4.5")
    bad = [(n, got.get(n), want_t.get(n)) for n in sorted(set(got) | set(want_t)) if got.get(n) != want_t.get(n)]
    check(not bad, f"{preset}: tensors: {bad[:4]}")
    for n, ty, _ in tensors(r):
        check(ty == preset_type(preset, n), f"{preset}: {n} is {ty.name}, want {preset_type(preset, n).name}")
    arch = field(r, "general.architecture")
    check(field(r, f"{arch}.block_count") == n_layer + nextn, f"{preset}: block_count {field(r, f'{arch}.block_count')}")
    if glm:
        keys = {"nextn_predict_layers": 1, "leading_dense_block_count": n_dense, "expert_shared_count": 1,
                "rope.dimension_count": 64, "expert_gating_func": 2, "expert_weights_norm": True,
                "expert_weights_scale": 2.5 if preset == "glm-4.5" else 1.0, "feed_forward_length": 512,
                "expert_feed_forward_length": 256, "rope.freq_base": 1e6}
    else:
        keys = {"feed_forward_length": 256, "rope.freq_base": 1e6 if arch == "llama" else 1e4}
    for k, v in keys.items():
        check(field(r, f"{arch}.{k}") == v, f"{preset}: {arch}.{k} {field(r, f'{arch}.{k}')}, want {v}")
    engine(preset, path, n_layer, n_dense)
    print(f"  {preset}: counts as the release ({line}{'; ' + glm_line if glm_line else ''}); "
          f"narrow file: {len(got)} tensors of the converter's layout, types, keys; the engine runs it")


# gemma-4-26B-A4B: transformers 5.24 has no config of it (configuration_gemma4.py's defaults are
# a dense model's); the release's text_config as src/model/synth_gemma4.c states it, the global
# heads (512, 2 KV heads, 16 query heads) and the experts' 704 as llama.cpp's sources have them
GEMMA4_LINE = ("30 layers, n_embd 2816, 16 heads (2 kv) of 512, 128 experts (8 used) of 704, vocab 262144")
GEMMA4_ARCH_LINE = ("every 6-th layer and the last global (heads of 512, 2 KV heads, RoPE on 128, K as V yes), "
                    "the others sliding (window 1024, heads of 256, 8 KV heads); dense MLP 2112 (q8_0); "
                    "soft-cap 30")


def gemma4_preset():
    """gemma-4-26b-a4b: its counts; written with 6 layers (5 sliding, 1 global), 16 experts,
    n_embd 256, dense MLP 512, vocab 1024 (heads and the experts' 704 kept): the converter's
    layout (the fused ffn_gate_up_exps, the scales, five FFN norms, no attn_v in the global
    layer, rope_freqs, no output.weight), the types (ffn_down_exps q5_0: rows of 704 take no
    K-quant), the keys; the engine runs it."""
    preset = "gemma-4-26b-a4b"
    out = subprocess.run([TIERMOE, "mkmodel", "--preset", preset, "-o", os.path.join(TMP, "no_such_dir", "x.gguf")],
                         capture_output=True, text=True).stderr
    check(GEMMA4_LINE in out and GEMMA4_ARCH_LINE in out, f"{preset}: the preset's counts: {out}")
    n_layer, E, F, FD, X, V, H = 6, 256, 704, 512, 16, 1024, 16
    path, _ = mk("gemma4_26b", "--preset", preset, "--n-layer", str(n_layer), "--n-embd", str(E), "--n-ff",
                 str(FD), "--n-expert", str(X), "--n-vocab", str(V), "--fill", "repeat")
    r = gguf.GGUFReader(path)
    want = {"rope_freqs.weight": ([256], T.F32), "token_embd.weight": ([E, V], T.Q4_K),
            "output_norm.weight": ([E], T.F32)}
    for l in range(n_layer):
        b, glob = f"blk.{l}.", l == n_layer - 1
        D, KV = (512, 2) if glob else (256, 8)
        want.update({b + "ffn_down_exps.weight": ([F, E, X], T.Q5_0),
                     b + "ffn_gate_up_exps.weight": ([E, 2 * F, X], T.Q4_K),
                     b + "ffn_down.weight": ([FD, E], T.Q8_0), b + "ffn_gate.weight": ([E, FD], T.Q8_0),
                     b + "ffn_up.weight": ([E, FD], T.Q8_0), b + "ffn_gate_inp.weight": ([E, X], T.F32),
                     b + "ffn_gate_inp.scale": ([E], T.F32), b + "ffn_down_exps.scale": ([X], T.F32),
                     b + "layer_output_scale.weight": ([1], T.F32),
                     b + "attn_q.weight": ([E, H * D], T.Q8_0), b + "attn_k.weight": ([E, KV * D], T.Q8_0),
                     b + "attn_output.weight": ([H * D, E], T.Q8_0), b + "attn_q_norm.weight": ([D], T.F32),
                     b + "attn_k_norm.weight": ([D], T.F32)})
        if not glob:
            want[b + "attn_v.weight"] = ([E, KV * D], T.Q8_0)
        for nm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_ffw_norm_1",
                   "post_ffw_norm_2", "pre_ffw_norm_2"):
            want[b + nm + ".weight"] = ([E], T.F32)
    got = {n: (s, ty) for n, ty, s in tensors(r)}
    bad = [(n, got.get(n), want.get(n)) for n in sorted(set(got) | set(want)) if got.get(n) != want.get(n)]
    check(not bad, f"{preset}: tensors: {bad[:4]}")
    rf = [t for t in r.tensors if t.name == "rope_freqs.weight"][0]
    check(list(np.asarray(rf.data)) == [1.0] * 64 + [np.float32(1e30)] * 192, f"{preset}: rope_freqs {rf.data[:4]}")
    a = "gemma4"
    keys = {"block_count": n_layer, "attention.head_count": 16, "attention.head_count_kv": [8] * 5 + [2],
            "attention.sliding_window_pattern": [True] * 5 + [False], "attention.key_length": 512,
            "attention.value_length": 512, "attention.key_length_swa": 256, "attention.value_length_swa": 256,
            "rope.dimension_count": 512, "rope.dimension_count_swa": 256, "rope.freq_base": 1e6,
            "rope.freq_base_swa": 1e4, "attention.sliding_window": 1024, "final_logit_softcapping": 30.0,
            "expert_feed_forward_length": F, "feed_forward_length": FD, "expert_count": X, "expert_used_count": 8,
            "attention.shared_kv_layers": 0, "embedding_length_per_layer_input": 0}
    for k, v in keys.items():
        check(field(r, f"{a}.{k}") == v, f"{preset}: {a}.{k} {field(r, f'{a}.{k}')}, want {v}")
    engine(preset, path, n_layer, 0)
    print(f"  {preset}: counts ({GEMMA4_LINE}); narrow file: {len(got)} tensors of the converter's layout, "
          "types, keys; the engine runs it")


def gemma4_skew():
    """--skew on gemma4: its router reads rmsnorm(x) x scale x n_embd^-0.5 and every block's
    output is post-normed, so the preset's scales (synth_gemma4.c) must keep the skew's bias
    channel: the 4 most used of 16 experts take most slots with --skew 2 in every layer, about
    a quarter without."""
    toks = ",".join(str(t) for t in np.random.default_rng(1).integers(0, 288, 200))
    shares = {}
    for sk in ("0", "2"):
        path, _ = mk(f"gemma4_skew{sk}", "--preset", "tiny-gemma-4", "--n-embd", "256", "--n-expert", "16",
                     "--n-ff-exp", "64", "--skew", sk)
        out = os.path.join(TMP, f"fd_gemma4_skew{sk}.gguf")
        r = subprocess.run([os.path.join(TOOLS, "forward_dump"), path, "--tokens", toks, "--prompt", "200",
                            "-o", out], capture_output=True, text=True)
        check(r.returncode == 0, f"gemma4 --skew {sk}: forward_dump: {r.stderr[-400:]}")
        if r.returncode:
            return
        d, _ = ref.read_dump(out)
        shares[sk] = [np.sort(np.bincount(np.asarray(d[f"blk.{l}.topk_ids"]).reshape(-1), minlength=16))[::-1][:4]
                      .sum() / (200 * 2) for l in range(5)]
    check(max(shares["0"]) < 0.45 and min(shares["2"]) > 0.6,
          f"gemma4: the top 4 experts' share of the slots per layer: --skew 0 {shares['0']}, --skew 2 {shares['2']}")
    print(f"  tiny-gemma-4 --skew 2: the top 4 of 16 experts take {min(shares['2']):.2f}-{max(shares['2']):.2f} "
          f"of a layer's slots ({min(shares['0']):.2f}-{max(shares['0']):.2f} without)")


def main():
    os.makedirs(TMP, exist_ok=True)
    for preset in TINY:
        path = versus_converter(preset)
        four = preset in ("tiny-glm4moe", "tiny-deepseek-v3")
        engine(preset, path, 5 if preset == "tiny-gemma-4" else 4 if four else 3, 1 if four else 0)
    try:
        want = hf_configs()
    except ImportError:
        print("  transformers not installed: the big presets' counts are not compared")
        want = None
    if want:
        for preset, w in want.items():
            big_preset(preset, w)
        for preset, w in ds_configs().items():
            ds_preset(preset, w)
    gemma4_preset()
    gemma4_skew()
    _, r = mk("gemma4_locality", "--preset", "tiny-gemma-4", "--n-embd", "256", "--locality", "0.5", expect=2)
    check("not gemma4's yet" in r.stderr, f"--locality on gemma4: {r.stderr}")
    _, r = mk("glm_locality", "--preset", "tiny-glm4moe", "--locality", "0.5", expect=2)
    check("not glm4moe's yet" in r.stderr, f"--locality on glm4moe: {r.stderr}")
    _, r = mk("glm_groups", "--preset", "tiny-glm4moe", "--n-expert", "6", expect=2)
    check("groups must divide" in r.stderr, f"6 experts in 4 groups: {r.stderr}")
    _, r = mk("ds_groups", "--preset", "tiny-deepseek-v3", "--n-expert", "6", expect=2)
    check("groups must divide" in r.stderr, f"deepseek2: 6 experts in 4 groups: {r.stderr}")
    return finish("mkmodel writes Mixtral, OLMoE, GLM-4.5, DeepSeek-V3, Kimi K2 and Gemma 4 as llama.cpp's "
                  "converter does")


if __name__ == "__main__":
    sys.exit(main())
