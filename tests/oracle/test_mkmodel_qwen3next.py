#!/usr/bin/env python3
"""`tiermoe mkmodel` for the hybrid architectures qwen3next (Qwen3-Next) and qwen35moe
(Qwen3.5 / 3.6 MoE), against llama.cpp's converter, transformers' configs and the engine.

- tiny-qwen3next / tiny-qwen35moe against tests/data/hf_*/tiny-f16.gguf (written by
  llama.cpp's convert_hf_to_gguf.py from config.json beside it): the same tensors in the
  same order with the same types and shapes, the same keys with the same GGUF value types
  and values (attention.recurrent_layers a bool array, rope.dimension_sections an int32
  array), but for the differences listed in KEYS_DIFFERENT.
- qwen3-next-80b-a3b and qwen3.5-35b-a3b: every tensor's shape as derived from
  transformers' Qwen3NextConfig / Qwen3_5MoeTextConfig defaults (the derivation,
  expected_tensors, is first checked against the converter's tiny files), the types of
  the preset (experts q4_K, attention and linear-attention matrices q8_0, shared expert
  q8_0, token_embd q4_K, output q8_0; conv, ssm_a, ssm_dt, norms, routers f32), the keys
  (RoPE on 64 of 256 at base 1e7, context 262144); written with --fill repeat, 4 layers
  16 experts and vocabulary 4096 (the preset's layer, expert and vocabulary counts and its
  top-k from mkmodel's own line).
- Random init is healthy, from the file with numpy: ssm_a < 0, the decay e^g over random
  tokens spread within [0.3, 0.99], beta = sigmoid(b) within [0.2, 0.8], norms 1.
- The engine loads the tiny files and the reduced 80B file: every forward stage finite,
  each layer's router reaches most experts, and greedy decoding is not one token.
- --type-attn reaches the linear-attention matrices (ssm_conv1d, ssm_a, ssm_dt stay f32),
  --type-shexp the shared expert, --tensor-type and --mix Q4_K_M (attn_qkv q5_K as
  llama.cpp's rule) pick per tensor; --fill repeat keeps the tensors and sizes.
- Routing on 512 experts top-10: --skew raises the top expert; the qwen3-30b-a3b profile
  makes consecutive tokens share experts from the first full-attention layer on (the
  recency head is there), far above the uniform model.
- Refusals: --locality without a full-attention layer, hybrid flags on qwen3moe.
"""
import json
import os
import subprocess
import sys
import types

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import DATA, TIERMOE, TMP, TOOLS, check, finish, run  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402
from routing_health import profile_stats  # noqa: E402

T = gguf.GGMLQuantizationType
ARCHS = {"qwen3next": ("tiny-qwen3next", "hf_qwen3next", "qwen3-next-80b-a3b"),
         "qwen35moe": ("tiny-qwen35moe", "hf_qwen35moe", "qwen3.5-35b-a3b")}
# keys that differ from the converter's file, and why
KEYS_DIFFERENT = {
    "general.name": "mkmodel names its files",
    "general.size_label": "the converter's label of the parameter count; mkmodel writes none",
    "vocab_size": "mkmodel writes no tokenizer by default (no_vocab): llama.cpp then reads "
                  "the vocabulary's size here, as for mkmodel's qwen3moe files",
}


def mk(name, *flags, expect=0, quiet=True):
    path = os.path.join(TMP, name + ".gguf")
    if os.path.exists(path):
        os.remove(path)
    r = subprocess.run([TIERMOE, "mkmodel", *(["-q"] if quiet else []), "-t", "2", "-o", path,
                        *flags], capture_output=True, text=True)
    check(r.returncode == expect, f"mkmodel {' '.join(flags)}: exit {r.returncode}, want {expect}: "
                                  f"{r.stderr}")
    return path, r


def tensors(r):
    return [(t.name, t.tensor_type, [int(x) for x in t.shape]) for t in r.tensors]


def fields(r):
    """key -> (GGUF value types, contents), without the header and the tokenizer."""
    return {k: (tuple(int(x) for x in f.types), f.contents()) for k, f in r.fields.items()
            if not k.startswith("GGUF.") and not k.startswith("tokenizer.")}


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def expected_tensors(cfg, n_layer=None, n_expert=None, n_vocab=None, fused_ba=True):
    """name -> shape (GGUF order: row length first) of what llama.cpp's converter writes
    for an HF config (attributes or dict), derived from the config's fields alone."""
    g = (lambda k: cfg[k]) if isinstance(cfg, dict) else (lambda k: getattr(cfg, k))
    E, V, D = g("hidden_size"), n_vocab or g("vocab_size"), g("head_dim")
    Q, KV = g("num_attention_heads") * D, g("num_key_value_heads") * D
    hk, hv = g("linear_num_key_heads"), g("linear_num_value_heads")
    dk, dv, K = g("linear_key_head_dim"), g("linear_value_head_dim"), g("linear_conv_kernel_dim")
    F, FS = g("moe_intermediate_size"), g("shared_expert_intermediate_size")
    X = n_expert or g("num_experts")
    L = n_layer or g("num_hidden_layers")
    CH = 2 * hk * dk + hv * dv
    t = {"output.weight": [E, V], "token_embd.weight": [E, V], "output_norm.weight": [E]}
    for l in range(L):
        b = f"blk.{l}."
        t.update({b + "attn_norm.weight": [E], b + "post_attention_norm.weight": [E],
                  b + "ffn_gate_inp.weight": [E, X], b + "ffn_gate_exps.weight": [E, F, X],
                  b + "ffn_up_exps.weight": [E, F, X], b + "ffn_down_exps.weight": [F, E, X],
                  b + "ffn_gate_shexp.weight": [E, FS], b + "ffn_up_shexp.weight": [E, FS],
                  b + "ffn_down_shexp.weight": [FS, E], b + "ffn_gate_inp_shexp.weight": [E, 1]})
        if g("layer_types")[l] == "linear_attention":
            t.update({b + "ssm_a": [hv], b + "ssm_dt.bias": [hv], b + "ssm_conv1d.weight": [K, CH],
                      b + "attn_qkv.weight": [E, CH], b + "attn_gate.weight": [E, hv * dv],
                      b + "ssm_norm.weight": [dv], b + "ssm_out.weight": [hv * dv, E]})
            if fused_ba:
                t[b + "ssm_ba.weight"] = [E, 2 * hv]
            else:
                t.update({b + "ssm_alpha.weight": [E, hv], b + "ssm_beta.weight": [E, hv]})
        else:
            t.update({b + "attn_q.weight": [E, 2 * Q], b + "attn_k.weight": [E, KV],
                      b + "attn_v.weight": [E, KV], b + "attn_output.weight": [Q, E],
                      b + "attn_q_norm.weight": [D], b + "attn_k_norm.weight": [D]})
    return t


def preset_type(name):
    """The types the big presets give each tensor."""
    stem = name.split(".")[-2] if name.endswith(".weight") or name.endswith(".bias") else name.split(".")[-1]
    if name == "output.weight":
        return T.Q8_0
    if name == "token_embd.weight":
        return T.Q4_K
    if stem.endswith("_exps"):
        return T.Q4_K
    if stem in ("attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv", "attn_gate", "ssm_ba",
                "ssm_alpha", "ssm_beta", "ssm_out", "ffn_gate_shexp", "ffn_up_shexp",
                "ffn_down_shexp"):
        return T.Q8_0
    return T.F32  # norms, routers, ssm_conv1d, ssm_a, ssm_dt, the shared expert's gate


def versus_converter(arch):
    preset, data, _ = ARCHS[arch]
    conv = gguf.GGUFReader(os.path.join(DATA, data, "tiny-f16.gguf"))
    path, _ = mk(arch + "_tiny", "--preset", preset)
    mine = gguf.GGUFReader(path)
    a, b = tensors(mine), tensors(conv)
    check(a == b, f"{preset}: tensors differ from the converter's: "
                  f"{[(x, y) for x, y in zip(a, b) if x != y][:4]} (counts {len(a)}, {len(b)})")
    fa, fb = fields(mine), fields(conv)
    skip = {k if "." in k and k.startswith("general.") else f"{arch}.{k}" for k in KEYS_DIFFERENT}
    for k in sorted(set(fa) | set(fb)):
        if k in skip or k.startswith("tiermoe.synth."):
            continue
        va, vb = fa.get(k), fb.get(k)
        if isinstance(va, tuple) and isinstance(vb, tuple) and isinstance(va[1], float):
            same = va[0] == vb[0] and abs(va[1] - vb[1]) <= 1e-6 * abs(vb[1])
        else:
            same = va == vb
        check(same, f"{preset}: key {k}: mkmodel {va}, converter {vb}")
    check(field(mine, "tokenizer.ggml.model") == "no_vocab", f"{preset}: no tokenizer")
    # the derivation of shapes from a config, checked on the converter's file
    import json
    cfg = json.load(open(os.path.join(DATA, data, "config.json")))
    want = expected_tensors(cfg, fused_ba=arch == "qwen3next")
    got = {n: s for n, _, s in b}
    bad = [(n, got.get(n), want.get(n)) for n in sorted(set(got) | set(want)) if got.get(n) != want.get(n)]
    check(not bad, f"expected_tensors({data}/config.json) disagrees with the converter: {bad[:4]}")
    print(f"  {preset}: {len(a)} tensors (names, order, types, shapes) and "
          f"{len([k for k in fb if k not in skip])} keys as the converter's {data}/tiny-f16.gguf; "
          f"different: {', '.join(KEYS_DIFFERENT)}")
    return path, mine


def health(arch, r):
    """Linear attention's gates and the norms from the file (numpy)."""
    t = {x.name: x for x in r.tensors}
    f = lambda n: np.asarray(t[n].data, dtype=np.float64)  # noqa: E731
    E = field(r, f"{arch}.embedding_length")
    hk, hv = field(r, f"{arch}.ssm.group_count"), field(r, f"{arch}.ssm.time_step_rank")
    toks = np.random.default_rng(1).integers(0, field(r, f"{arch}.vocab_size"), 512)
    x = f("token_embd.weight")[toks]
    h = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6)
    decays, betas = [], []
    for l in range(field(r, f"{arch}.block_count")):
        b = f"blk.{l}."
        for n in ("attn_norm.weight", "post_attention_norm.weight"):
            check(np.all(f(b + n) == 1), f"{arch} {b + n}: not 1")
        if b + "ssm_a" not in t:
            continue
        a_ = f(b + "ssm_a")
        check(np.all(a_ < 0), f"{arch} {b}ssm_a: not negative: {a_}")
        if arch == "qwen3next":  # per key head: its value heads' b, then their a
            ba = (h * f(b + "attn_norm.weight")) @ f(b + "ssm_ba.weight").T
            ba = ba.reshape(len(h), hk, 2, hv // hk)
            bb, aa = ba[:, :, 0].reshape(len(h), hv), ba[:, :, 1].reshape(len(h), hv)
        else:
            bb = h @ f(b + "ssm_beta.weight").T
            aa = h @ f(b + "ssm_alpha.weight").T
        g = a_ * np.log1p(np.exp(aa + f(b + "ssm_dt.bias")))
        decays.append(np.exp(g).ravel())
        betas.append((1 / (1 + np.exp(-bb))).ravel())
    d, be = np.concatenate(decays), np.concatenate(betas)
    q = lambda v, p: float(np.quantile(v, p))  # noqa: E731
    check(q(d, 0.02) >= 0.3 and q(d, 0.98) <= 0.995 and q(d, 0.8) - q(d, 0.2) > 0.1,
          f"{arch}: decay e^g quantiles 2/20/80/98%: {q(d, .02):.3f} {q(d, .2):.3f} "
          f"{q(d, .8):.3f} {q(d, .98):.3f}, want spread over [0.3, 0.99]")
    check(q(be, 0.02) >= 0.2 and q(be, 0.98) <= 0.8 and abs(q(be, 0.5) - 0.5) < 0.1,
          f"{arch}: beta quantiles 2/50/98%: {q(be, .02):.3f} {q(be, .5):.3f} {q(be, .98):.3f}")
    emb_rms = float(np.sqrt((x[:, 1:] ** 2).mean()))
    check(0.8 < emb_rms < 1.2, f"{arch}: token embedding rms {emb_rms}")
    print(f"  {arch}: decay e^g 2-98% {q(d, .02):.2f}-{q(d, .98):.3f} (median {q(d, .5):.2f}), "
          f"beta {q(be, .02):.2f}-{q(be, .98):.2f}, norms 1, embedding rms {emb_rms:.2f}")


def forward(path, n_vocab, n_tok=64, seed=3, label=""):
    toks = np.random.default_rng(seed).integers(0, n_vocab, n_tok).tolist()
    out = os.path.join(TMP, "q3n_dump.gguf")
    run([os.path.join(TOOLS, "forward_dump"), path, "--tokens", ",".join(map(str, toks)),
         "--prompt", str(n_tok * 3 // 4), "--threads", "2", "-o", out])
    d = ref.read_dump(out)[0]
    for n, v in d.items():
        check(np.all(np.isfinite(np.asarray(v, dtype=np.float64))), f"{label}: {n} not finite")
    return d


def runs(path, n_expert, n_vocab, label):
    d = forward(path, n_vocab, label=label)
    reached = [len(np.unique(np.asarray(d[n]))) for n in sorted(d) if n.endswith("topk_ids")]
    check(len(reached) > 0 and min(reached) >= n_expert * 3 // 4,
          f"{label}: experts reached per layer {reached} of {n_expert}")
    check("blk.0.lin_core" in d, f"{label}: no linear-attention stage in layer 0")
    out = run([TIERMOE, "run", "-m", path, "--tokens", "1,2,3,4,5,6,7,8", "-n", "24", "--temp", "0",
               "-t", "2"])
    gen = [int(x) for x in out.split("|")[-1].split()]
    check(len(gen) == 24 and len(set(gen)) >= 4, f"{label}: greedy tokens {gen}")
    print(f"  {label}: forward finite, experts reached {reached} of {n_expert}, greedy "
          f"{len(set(gen))} distinct of {len(gen)}: {' '.join(map(str, gen[:12]))} ...")


CONFIG_KEYS = ["hidden_size", "vocab_size", "head_dim", "num_attention_heads", "num_key_value_heads",
               "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
               "linear_value_head_dim", "linear_conv_kernel_dim", "moe_intermediate_size",
               "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok",
               "num_hidden_layers", "layer_types", "rope_parameters", "rms_norm_eps"]


def hf_config(arch):
    """transformers' config defaults for arch: from transformers when it is installed, else
    the snapshot tests/data/hf_configs/<arch>.json it wrote (--write-configs; CI has no
    transformers)."""
    try:
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig
    except ImportError:
        with open(os.path.join(DATA, "hf_configs", arch + ".json")) as f:
            d = json.load(f)
        return types.SimpleNamespace(**{k: d[k] for k in CONFIG_KEYS},
                                     name="the snapshot of " + d["_source"].split(" (")[0])
    c = Qwen3NextConfig() if arch == "qwen3next" else Qwen3_5MoeTextConfig()
    return types.SimpleNamespace(**{k: getattr(c, k) for k in CONFIG_KEYS},
                                 name=f"transformers' {type(c).__name__}() defaults")


def write_configs():
    import transformers
    for arch in ARCHS:
        c = hf_config(arch)
        d = {k: getattr(c, k) for k in CONFIG_KEYS}
        d["_source"] = (f"transformers {transformers.__version__} {c.name.split()[1]} defaults "
                        "(tests/oracle/test_mkmodel_qwen3next.py --write-configs)")
        with open(os.path.join(DATA, "hf_configs", arch + ".json"), "w") as f:
            json.dump(d, f, indent=1)


def big_preset(arch):
    _, data, preset = ARCHS[arch]
    hf = hf_config(arch)
    # 4 layers, 16 experts and a vocabulary of 4096 keep the file small (~100 MB); the
    # preset's own counts are checked from mkmodel's line below
    path, res = mk(arch + "_big", "--preset", preset, "--n-layer", "4", "--n-expert", "16",
                   "--n-vocab", "4096", "--fill", "repeat", quiet=False)
    r = gguf.GGUFReader(path)
    got = {n: s for n, _, s in tensors(r)}
    want = expected_tensors(hf, n_layer=4, n_expert=16, n_vocab=4096, fused_ba=arch == "qwen3next")
    bad = [n for n in sorted(set(got) | set(want)) if got.get(n) != want.get(n)]
    check(not bad, f"{preset}: shapes against transformers' defaults: "
                   f"{[(n, got.get(n), want.get(n)) for n in bad[:4]]}")
    for n, ty, _ in tensors(r):
        check(ty == preset_type(n), f"{preset}: {n} is {ty.name}, want {preset_type(n).name}")
    line = f"{hf.num_experts} experts ({hf.num_experts_per_tok} used) of {hf.moe_intermediate_size}"
    check(line.replace(f"{hf.num_experts} experts", "16 experts") in res.stderr,
          f"{preset}: top-k: mkmodel says {res.stderr.strip()}")
    # the full preset's counts from mkmodel's own line (a file that cannot be created: the
    # line comes before the write, and nothing of 40+ GiB is written)
    out = subprocess.run([TIERMOE, "mkmodel", "--preset", preset, "-o",
                          os.path.join(TMP, "no_such_dir", "x.gguf")], capture_output=True, text=True).stderr
    check(line in out and f"{hf.num_hidden_layers} layers" in out and
          f"vocab {hf.vocab_size}" in out, f"{preset}: the preset's counts: {out}")
    rot = int(hf.head_dim * hf.rope_parameters["partial_rotary_factor"])
    keys = {"rope.dimension_count": rot, "rope.freq_base": 1e7, "context_length": 262144,
            "full_attention_interval": 4, "expert_used_count": hf.num_experts_per_tok,
            "attention.key_length": hf.head_dim, "ssm.inner_size":
            hf.linear_num_value_heads * hf.linear_value_head_dim,
            "attention.layer_norm_rms_epsilon": hf.rms_norm_eps}
    for k, v in keys.items():
        got_v = field(r, f"{arch}.{k}")
        check(got_v is not None and abs(got_v - v) <= 1e-6 * abs(v), f"{preset}: {k} {got_v}, want {v}")
    check(list(field(r, f"{arch}.attention.recurrent_layers")) ==
          [x == "linear_attention" for x in hf.layer_types[:4]], f"{preset}: recurrent_layers")
    if arch == "qwen35moe":  # transformers' default mrope_section (modeling_qwen3_5_moe)
        check(list(field(r, f"{arch}.rope.dimension_sections")) == [11, 11, 10, 0],
              f"{preset}: rope.dimension_sections {field(r, f'{arch}.rope.dimension_sections')}")
    check(field(r, "tiermoe.synth.fill_rows") == 256, f"{preset}: fill_rows")
    print(f"  {preset}: {len(got)} tensors' shapes as {hf.name} "
          f"(4 layers, 16 experts, vocab 4096), its types, RoPE {rot} of {hf.head_dim} at 1e7; "
          f"{hf.num_experts} experts top-{hf.num_experts_per_tok}")
    return path, r


def knobs():
    shape = ["--preset", "tiny-qwen3next", "--n-embd", "256", "--head-dim", "64", "--ssm-v-dim", "64", "--n-ff-exp", "256",
             "--n-ff-shexp", "256"]
    p, _ = mk("q3n_types", *shape, "--type-attn", "q6_K", "--type-shexp", "q5_K", "--type-experts",
              "q4_K", "--type-embd", "q8_0", "--type-output", "q8_0", "--tensor-type", "ssm_out=q4_0")
    r = gguf.GGUFReader(p)
    for n, ty, _ in tensors(r):
        stem = n.split(".")[2] if n.startswith("blk.") else n
        want = (T.Q4_0 if stem == "ssm_out" else
                T.Q6_K if stem in ("attn_qkv", "attn_gate", "ssm_ba", "attn_q", "attn_k", "attn_v",
                                   "attn_output") else
                T.Q5_K if stem.endswith("_shexp") and stem != "ffn_gate_inp_shexp" else T.Q4_K if stem.endswith("_exps") else
                T.Q8_0 if n in ("output.weight", "token_embd.weight") else T.F32)
        check(ty == want, f"--type-attn etc.: {n} is {ty.name}, want {want.name}")
    p, _ = mk("q3n_mix", *shape, "--n-layer", "8", "--mix", "Q4_K_M")
    r = gguf.GGUFReader(p)
    ty = {n: t for n, t, _ in tensors(r)}
    check(ty["blk.0.attn_qkv.weight"] == T.Q5_K, f"--mix Q4_K_M: attn_qkv {ty['blk.0.attn_qkv.weight'].name}")
    check(ty["blk.0.ssm_out.weight"] == T.Q4_K, "--mix Q4_K_M: ssm_out")
    downs = {ty[f"blk.{l}.ffn_down_shexp.weight"] for l in range(8)}
    check(downs == {T.Q4_K, T.Q6_K}, f"--mix Q4_K_M: shared expert down {downs}, want q4_K and q6_K")
    check(ty["blk.0.ssm_conv1d.weight"] == T.F32 and ty["blk.0.ssm_a"] == T.F32, "--mix: conv f32")
    # --fill repeat: same tensors and sizes, the weights repeat
    p1, _ = mk("q3n_plain", *shape)
    p2, _ = mk("q3n_fill", *shape, "--fill", "repeat", "--fill-rows", "8")
    a, b = gguf.GGUFReader(p1), gguf.GGUFReader(p2)
    check(tensors(a) == tensors(b) and [t.n_bytes for t in a.tensors] == [t.n_bytes for t in b.tensors],
          "--fill repeat: tensors or sizes differ")
    tb = {t.name: t for t in b.tensors}
    for n in ("blk.0.attn_qkv.weight", "blk.0.ssm_out.weight", "blk.1.attn_q.weight",
              "blk.0.ffn_gate_shexp.weight"):
        rows = np.ascontiguousarray(tb[n].data).view(np.uint8).reshape(int(tb[n].shape[1]), -1)
        check(len(np.unique(rows, axis=0)) <= 8, f"--fill repeat: {n} has {len(np.unique(rows, axis=0))} rows")
    print("  --type-attn reaches attn_qkv/attn_gate/ssm_ba, --type-shexp, --tensor-type, --mix Q4_K_M "
          "(attn_qkv q5_K), --fill repeat")


def routing():
    shape = ["--preset", "tiny-qwen3next", "--n-embd", "256", "--n-expert", "512",
             "--n-expert-used", "10"]
    out = {}
    for label, flags in (("uniform", []), ("skew", ["--skew", "1.2"]),
                         ("profile", ["--routing", "qwen3-30b-a3b"])):
        p, _ = mk("q3n_r_" + label, *shape, *flags)
        per = {}
        for s in range(3):
            d = forward(p, 256, n_tok=192, seed=s, label=label)
            for n in d:
                if n.endswith("topk_ids"):
                    per.setdefault(n, []).append(np.asarray(d[n]))
        out[label] = [profile_stats(per[n], 512) for n in sorted(per)]
    u, s, pr = out["uniform"], out["skew"], out["profile"]
    check(all(x["top1"] > 2 * y["top1"] for x, y in zip(s, u)),
          f"--skew 1.2: top expert {[round(x['top1'], 3) for x in s]} vs uniform "
          f"{[round(y['top1'], 3) for y in u]}")
    # tiny-qwen3next: layer 1 is the first full-attention layer (the recency head)
    check(all(x["reuse_prev"] > 0.3 for x in pr[1:]) and all(y["reuse_prev"] < 0.1 for y in u),
          f"profile: reuse of the previous token's experts {[round(x['reuse_prev'], 2) for x in pr]}, "
          f"uniform {[round(y['reuse_prev'], 2) for y in u]}")
    print(f"  512 experts top-10: --skew 1.2 top expert {max(x['top1'] for x in s):.3f} (uniform "
          f"{max(y['top1'] for y in u):.3f}); qwen3-30b-a3b profile reuse_prev per layer "
          f"{[round(float(x['reuse_prev']), 2) for x in pr]} (uniform "
          f"{[round(float(y['reuse_prev']), 3) for y in u]})")


def refusals():
    _, r = mk("q3n_noattn", "--preset", "tiny-qwen3next", "--n-embd", "256", "--n-layer", "1",
              "--locality", "0.5", expect=2)
    check("full-attention" in r.stderr, f"--locality with no full-attention layer: {r.stderr}")
    _, r = mk("q3n_wrongarch", "--preset", "tiny", "--ssm-conv", "4", expect=2)
    check("--ssm-conv" in r.stderr, f"hybrid flag on qwen3moe: {r.stderr}")
    _, r = mk("q3n_badheads", "--preset", "tiny-qwen35moe", "--ssm-v-heads", "3", expect=2)
    check("--ssm-v-heads" in r.stderr, f"value heads not a multiple of key heads: {r.stderr}")


def main():
    for arch in ARCHS:
        path, r = versus_converter(arch)
        health(arch, r)
        runs(path, 8, 256, ARCHS[arch][0])
    big, r = big_preset("qwen3next")
    runs(big, 16, 4096, "qwen3-next-80b-a3b (4 layers, 16 experts, vocab 4096, fill repeat)")
    del r
    os.remove(big)  # ~280 MB each
    big, r = big_preset("qwen35moe")
    del r
    os.remove(big)
    knobs()
    routing()
    refusals()
    return finish("mkmodel writes qwen3next and qwen35moe as llama.cpp's converter does")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-configs"]:
        sys.exit(write_configs())
    sys.exit(main())
