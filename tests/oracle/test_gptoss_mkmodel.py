#!/usr/bin/env python3
"""`tiermoe mkmodel` for gpt-oss against the gguf package and the engine.

- tiny-gpt-oss: every tensor the gguf package (llama.cpp's constants) lists for
  MODEL_ARCH.GPT_OSS, per layer, with weights and biases, and nothing else;
  the keys llama.cpp's converter writes (sliding window, YaRN type / factor /
  original context); experts MXFP4, biases, sinks and norms F32. It loads and
  runs, and tokens spread over the experts (healthy routing: most experts are
  reached by 64 random tokens).
- gpt-oss-20b and gpt-oss-120b: the real shapes and types (written here with one
  layer and 4 experts to stay small; the shapes per tensor do not depend on
  the counts): [2880, 4096] q, [2880, 512] k/v, [4096, 2880] output, experts
  [2880, 2880, E] MXFP4, Q8_0 matrices, vocabulary 201088.
- --skew makes the routing skewed (the most chosen expert well above uniform).
- --locality for gpt-oss: refused with a message naming it.
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import TIERMOE, TMP, TOOLS, check, finish, run  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402
from test_mkmodel_oracle import field, mk  # noqa: E402


def routed(path, n_tok=64):
    toks = np.random.default_rng(3).integers(0, 1024, n_tok).tolist()
    out = os.path.join(TMP, "oss_dump.gguf")
    run([os.path.join(TOOLS, "forward_dump"), path, "--tokens", ",".join(map(str, toks)),
         "--prompt", str(n_tok), "--threads", "2", "-o", out])
    d = ref.read_dump(out)[0]
    return [np.asarray(d[n]) for n in sorted(d) if n.endswith("topk_ids")]


def main():
    path, _ = mk("oss_tiny", "--preset", "tiny-gpt-oss")
    r = gguf.GGUFReader(path)
    arch = "gpt-oss"
    check(field(r, "general.architecture") == arch, "general.architecture")
    L = field(r, f"{arch}.block_count")
    for k in ("attention.sliding_window", "rope.scaling.factor", "rope.scaling.original_context_length",
              "expert_feed_forward_length", "attention.key_length", "attention.value_length"):
        check(field(r, f"{arch}.{k}") is not None, f"missing key {arch}.{k}")
    check(field(r, f"{arch}.rope.scaling.type") == "yarn", "rope.scaling.type")
    want = set()
    for t in MODEL_TENSORS[MODEL_ARCH.GPT_OSS]:
        stem = TENSOR_NAMES[t]
        if "{bid}" not in stem:
            want.add(stem + ".weight")
            continue
        for il in range(L):
            s = stem.format(bid=il)
            want.add(s + ".weight")
            if any(p in s for p in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp",
                                    "_exps")):
                want.add(s + ".bias")
    got = {t.name: t for t in r.tensors}
    # the gguf list has post_attention_norm, not ffn_norm; names must match it exactly
    check(set(got) == want, f"tensor names: extra {sorted(set(got) - want)[:5]}, "
                            f"missing {sorted(want - set(got))[:5]}")
    for n, t in got.items():
        T = gguf.GGMLQuantizationType
        if n.endswith("_exps.weight"):
            check(t.tensor_type == T.MXFP4, f"{n}: {t.tensor_type.name}, want MXFP4")
        elif n.endswith(".bias") or "norm" in n or "sinks" in n or "gate_inp" in n:
            check(t.tensor_type == T.F32, f"{n}: {t.tensor_type.name}, want F32")
        else:
            check(t.tensor_type == T.Q8_0, f"{n}: {t.tensor_type.name}, want Q8_0")
    ids = routed(path)
    reached = [len(np.unique(x)) for x in ids]
    n_exp = field(r, f"{arch}.expert_count")
    check(min(reached) >= n_exp * 3 // 4, f"experts reached per layer {reached} of {n_exp}: unhealthy")
    print(f"  tiny-gpt-oss: {len(got)} tensors as gguf lists them; experts reached {reached} of {n_exp}")

    skewed, _ = mk("oss_skew", "--preset", "tiny-gpt-oss", "--skew", "1.5")
    ids = routed(skewed)
    top = max(np.bincount(x.ravel(), minlength=n_exp).max() / x.size for x in ids)
    check(top > 2.0 / n_exp, f"--skew 1.5: the most chosen expert takes {top:.3f}, uniform {1 / n_exp:.3f}")
    print(f"  --skew 1.5: the most chosen expert takes {top:.2f} of the slots (uniform {1 / n_exp:.3f})")

    for preset, n_layer_real, n_exp_real in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)):
        p, _ = mk("oss_" + preset, "--preset", preset, "--n-layer", "1", "--n-expert", "4",
                  "--n-vocab", "1024")
        r = gguf.GGUFReader(p)
        t = {x.name: x for x in r.tensors}
        shapes = {"blk.0.attn_q.weight": [2880, 4096], "blk.0.attn_k.weight": [2880, 512],
                  "blk.0.attn_output.weight": [4096, 2880], "blk.0.attn_sinks.weight": [64],
                  "blk.0.ffn_gate_exps.weight": [2880, 2880, 4], "blk.0.ffn_down_exps.weight": [2880, 2880, 4],
                  "blk.0.ffn_gate_exps.bias": [2880, 4], "blk.0.ffn_gate_inp.bias": [4]}
        for n, s in shapes.items():
            check(n in t and list(map(int, t[n].shape)) == s,
                  f"{preset}: {n} shape {list(map(int, t[n].shape)) if n in t else None}, want {s}")
        check(field(r, f"{arch}.attention.sliding_window") == 128, f"{preset}: window")
        check(field(r, f"{arch}.rope.freq_base") == 150000, f"{preset}: rope base")
        out = subprocess.run([TIERMOE, "mkmodel", "--help"], capture_output=True, text=True)
        check(preset in out.stdout + out.stderr, f"mkmodel --help names {preset}")
    print("  gpt-oss-20b / 120b: real shapes and types")

    _, res = mk("oss_loc", "--preset", "tiny-gpt-oss", "--locality", "0.5", expect=2)
    check("locality" in res.stderr and "gpt-oss" in res.stderr, f"--locality refused: {res.stderr}")
    return finish("mkmodel writes gpt-oss as llama.cpp's converter does")


if __name__ == "__main__":
    sys.exit(main())
