#!/usr/bin/env python3
"""`tiermoe mkmodel` and `tiermoe inspect` against the gguf package.

- The tensors mkmodel writes are exactly the qwen3moe tensors the gguf package
  (llama.cpp's own constants) lists for MODEL_ARCH.QWEN3MOE, with shapes that
  follow from the hyper-parameter keys, and every key llama.cpp needs is there
  (FACTS: key_length/value_length explicitly, expert counts, rope base, eps).
- Per-class quant types are what was asked; norms and router are F32.
- Same seed, same bytes; another seed, other bytes.
- Weight scales as designed (synth.h): token embedding std near 1 with the
  constant bias channel, expert-down and attention-output std small.
- `inspect` reports the expert / non-expert split that the package's tensor
  table gives.
- Bad flags and impossible shapes: exit 2 with a message naming the flag.
"""
import hashlib
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

from oracle_common import TIERMOE, TMP, check, finish  # noqa: E402


def mk(name, *flags, expect=0):
    path = os.path.join(TMP, name + ".gguf")
    r = subprocess.run([TIERMOE, "mkmodel", "-q", "-o", path, *flags], capture_output=True, text=True)
    check(r.returncode == expect, f"mkmodel {' '.join(flags)}: exit {r.returncode}, want {expect}: {r.stderr}")
    return path, r


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def main():
    types = {"experts": "q5_K", "attn": "q6_K", "embd": "q8_0", "output": "q4_0"}
    path, _ = mk("a", "--preset", "tiny", "--n-layer", "2", "--seed", "9",
                 *[x for k, v in types.items() for x in (f"--type-{k}", v)])
    r = gguf.GGUFReader(path)
    arch = "qwen3moe"
    check(field(r, "general.architecture") == arch, "general.architecture")
    hp = {k: field(r, f"{arch}.{k}") for k in (
        "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "expert_used_count",
        "expert_count", "expert_feed_forward_length", "attention.key_length", "attention.value_length")}
    for k, v in hp.items():
        check(v is not None, f"missing key {arch}.{k}")
    L, E, H, HKV = hp["block_count"], hp["embedding_length"], hp["attention.head_count"], hp["attention.head_count_kv"]
    D, X, F = hp["attention.key_length"], hp["expert_count"], hp["expert_feed_forward_length"]
    V = r.get_tensor(0).shape[1] if r.tensors[0].name == "token_embd.weight" else None

    allowed = {TENSOR_NAMES[t] for t in MODEL_TENSORS[MODEL_ARCH.QWEN3MOE]}
    want_shape = {
        "token_embd": [E, V], "output_norm": [E], "output": [E, V],
        "attn_norm": [E], "attn_q": [E, H * D], "attn_k": [E, HKV * D], "attn_v": [E, HKV * D],
        "attn_output": [H * D, E], "attn_q_norm": [D], "attn_k_norm": [D], "ffn_norm": [E],
        "ffn_gate_inp": [E, X], "ffn_gate_exps": [E, F, X], "ffn_up_exps": [E, F, X], "ffn_down_exps": [F, E, X],
    }
    cls = {"ffn_gate_exps": "experts", "ffn_up_exps": "experts", "ffn_down_exps": "experts",
           "attn_q": "attn", "attn_k": "attn", "attn_v": "attn", "attn_output": "attn",
           "token_embd": "embd", "output": "output"}
    seen = set()
    for t in r.tensors:
        base = t.name[:-len(".weight")]
        generic = base if not base.startswith("blk.") else "blk.{bid}." + base.split(".", 2)[2]
        short = generic.split(".")[-1]
        check(t.name.endswith(".weight") and generic in allowed, f"tensor {t.name} is not a llama.cpp qwen3moe tensor")
        check(list(map(int, t.shape)) == want_shape[short], f"{t.name}: shape {list(t.shape)} != {want_shape[short]}")
        want_type = types[cls[short]].upper() if short in cls else "F32"
        check(t.tensor_type.name == want_type, f"{t.name}: type {t.tensor_type.name}, want {want_type}")
        seen.add(t.name)
    n_expected = 3 + 12 * L
    check(len(seen) == n_expected, f"{len(seen)} tensors, want {n_expected}")

    # weight scales (synth.h): embedding std ~1 with bias channel 0 == beta; small output projections
    emb = gguf.quants.dequantize(r.get_tensor(0).data, r.get_tensor(0).tensor_type).reshape(V, E)
    check(0.85 < emb[:, 1:].std() < 1.15, f"token_embd std {emb[:, 1:].std():.3f}, want ~1")
    # q8_0 stores 2.0 in a block whose max is ~3.5: within half a step (3.5 / 127 / 2)
    check(np.abs(emb[:, 0] - 2.0).max() < 0.02, f"bias channel of token_embd: {emb[:4, 0]}")
    byname = {t.name: t for t in r.tensors}
    down = gguf.quants.dequantize(byname["blk.0.ffn_down_exps.weight"].data, byname["blk.0.ffn_down_exps.weight"].tensor_type)
    wo = gguf.quants.dequantize(byname["blk.0.attn_output.weight"].data, byname["blk.0.attn_output.weight"].tensor_type)
    check(down.std() < 0.1 / np.sqrt(F) * 2, f"ffn_down_exps std {down.std():.4f} too large for healthy routing")
    check(wo.std() < 0.1 / np.sqrt(H * D), f"attn_output std {wo.std():.4f} too large")
    print(f"  tensors, shapes, types and keys match gguf's MODEL_ARCH.QWEN3MOE; embd std {emb[:, 1:].std():.3f}")

    # determinism
    p1, _ = mk("s1", "--preset", "tiny", "--seed", "3", "--skew", "0.7")
    p2, _ = mk("s2", "--preset", "tiny", "--seed", "3", "--skew", "0.7", "-t", "1")
    p3, _ = mk("s3", "--preset", "tiny", "--seed", "4", "--skew", "0.7")
    check(sha(p1) == sha(p2), "same seed (2 threads vs 1) gave different bytes")
    check(sha(p1) != sha(p3), "another seed gave the same bytes")
    print("  same seed, same bytes (across thread counts); other seed, other bytes")

    # inspect's expert split against the package's tensor table
    out = subprocess.run([TIERMOE, "inspect", p1], capture_output=True, text=True)
    check(out.returncode == 0, f"inspect failed: {out.stderr}")
    rr = gguf.GGUFReader(p1)
    exp = sum(int(t.n_bytes) for t in rr.tensors if "_exps" in t.name)
    other = sum(int(t.n_bytes) for t in rr.tensors) - exp
    def mib(b):
        return f"{b / 1048576:.2f} MiB"
    check(f"expert bytes     {mib(exp)}" in out.stdout, f"inspect: expert bytes {mib(exp)} not in output")
    check(f"non-expert bytes {mib(other)}" in out.stdout, f"inspect: non-expert bytes {mib(other)} not in output")
    for t in rr.tensors:
        check(f" {t.data_offset} " in out.stdout or f" {t.data_offset}\n" in out.stdout,
              f"inspect: offset {t.data_offset} of {t.name} not shown")
        break
    print(f"  inspect: expert {mib(exp)} / non-expert {mib(other)} as the package counts them")

    # bad input
    for flags, word in [(["--preset", "huge"], "preset"), (["--n-embd", "100"], "block size"),
                        (["--type-experts", "nvfp4"], "--type-experts"), (["--skew", "-1"], "--skew"),
                        (["--n-expert-used", "99"], "n-expert-used"), (["--bogus", "1"], "--bogus"),
                        (["--n-head", "3"], "n-head")]:
        _, res = mk("bad", *flags, expect=2)
        check(word in res.stderr, f"mkmodel {flags}: message does not name {word!r}: {res.stderr.strip()}")
    res = subprocess.run([TIERMOE, "inspect", os.path.join(TMP, "missing.gguf")], capture_output=True, text=True)
    check(res.returncode == 1 and "missing.gguf" in res.stderr, f"inspect of a missing file: {res.stderr}")
    check(not os.path.exists(os.path.join(TMP, "bad.gguf")), "a failed mkmodel left a file behind")

    return finish("mkmodel and inspect agree with the gguf package")


if __name__ == "__main__":
    sys.exit(main())
