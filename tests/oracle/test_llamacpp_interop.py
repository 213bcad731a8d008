#!/usr/bin/env python3
"""tiermoe and llama.cpp read each other's low-bit files (issue 33).

Goldens: tests/data/llamacpp/, made by scripts/make_llamacpp_goldens.py with
llama.cpp's CPU build (manifest.json names the version).

1. Files llama.cpp's llama-quantize wrote (lq-a, lq-b: the 16 low-bit types
   over experts, attention, embedding and output, from an F16 model):
   - our reader finds the tensors the gguf package finds (name, type, shape,
     data offset and size: tests/tools/gguf_dump);
   - every tensor's bytes dequantize (tests/tools/quant_tool) bit-exactly to
     what the gguf package's numpy dequantizer gives;
   - our forward pass matches the float64 reference (tests/ref/qwen3moe_ref.py,
     weights dequantized by the gguf package: independent of our kernels), in
     precise mode and in normal mode, every intermediate (test_forward_ref's
     tolerances and near-tie rule).
2. mkmodel's files with every matrix in one low-bit type, for each of the 16
   types: mkmodel still writes the bytes llama.cpp read (sha256), and
3. for every file of 1 and 2, logits at every position (a prompt batch, then
   llama.cpp's greedy tokens teacher-forced one at a time through the KV
   cache) against llama.cpp's logits and the float64 reference's.
4. Bad input: lq-a with one field broken (an unknown type id, a type whose
   blocks are larger than the data llama.cpp wrote, a type whose block does
   not divide the row, a row length that is not a multiple of the block) is
   refused by `tiermoe inspect` and by the loader (forward_dump) with exit 1,
   no sanitizer report, and a message naming the tensor and the type.

Tolerances (relative L2 error of a position's logits):
- llama.cpp's CPU backend, like our normal mode, multiplies with activations
  quantized to 8 bits per block (q8_K for the K- and i-quants, q8_0 / q8_1 for
  the legacy types) and keeps K and V in f16: test_forward_ref derives
  TOL_QUANT = 4% for such a computation against the exact one. So llama.cpp vs
  the reference <= TOL_QUANT, and ours vs llama.cpp <= 2 TOL_QUANT (both are
  within TOL_QUANT of the reference); the goldens are stored in f16 (2^-11).
- A position where the reference's router has a near tie in some layer (the
  k-th and k+1-th logits closer than 4x our normal mode's router error there)
  may route differently in llama.cpp: it is reported, not compared.
Argmax agreement with llama.cpp's greedy tokens is reported."""
import hashlib
import json
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import DATA, TIERMOE, TMP, TOOLS, check, failures, finish, run  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402
from test_forward_ref import TOL_PRECISE, TOL_QUANT, compare, gap_fn, ours  # noqa: E402

LC = os.path.join(DATA, "llamacpp")
TOL_LLAMA = TOL_QUANT
TOL_OURS_LLAMA = 2 * TOL_QUANT


def check_reader_and_dequant(label, path):
    """Our reader and dequantizers against the gguf package, tensor by tensor."""
    dump = json.loads(run([os.path.join(TOOLS, "gguf_dump"), "--no-hash", path]))
    mine = {t["name"]: t for t in dump["tensors"]}
    r = gguf.GGUFReader(path)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n_checked, types = 0, set()
    for t in r.tensors:
        m = mine.get(t.name)
        if not check(m is not None, f"{label}: our reader lacks tensor {t.name}"):
            continue
        qt = t.tensor_type
        want = (int(qt), [int(x) for x in t.shape], int(t.data_offset), int(t.n_bytes))
        got = (m["type"], m["ne"][:len(t.shape)], m["file_offset"], m["n_bytes"])
        if not check(want == got, f"{label}: {t.name}: ours (type, ne, offset, bytes) {got} != gguf's {want}"):
            continue
        if qt in (gguf.GGMLQuantizationType.F32,):
            continue
        types.add(qt.name.lower())
        blob = os.path.join(TMP, "lc_tensor.bin")
        out = os.path.join(TMP, "lc_tensor.f32")
        raw[m["file_offset"]:m["file_offset"] + m["n_bytes"]].tofile(blob)
        run([os.path.join(TOOLS, "quant_tool"), "dequant", m["type_name"], blob, out])
        g = np.fromfile(out, dtype=np.float32)
        w = gguf.quants.dequantize(np.asarray(t.data).reshape(-1), qt).astype(np.float32).reshape(-1)
        bad = np.flatnonzero(g.view(np.uint32) != w.view(np.uint32)) if g.size == w.size else [0]
        n_checked += check(len(bad) == 0, f"{label}: {t.name} ({qt.name}): {len(bad)} values differ from "
                           f"the gguf package's dequantization (first at {bad[0] if len(bad) else '-'})")
    print(f"  {label}: {n_checked} tensors read and dequantized as the gguf package does "
          f"({len(types)} types)")
    return types


def router_near_tie(want, got):
    """Positions where some layer's top-k is a near tie for our router error."""
    ties = set()
    for name in want:
        if not name.endswith("topk_ids"):
            continue
        lname = name.replace("topk_ids", "router_logits")
        w = np.asarray(want[lname])
        g = np.asarray(got[lname]).reshape(w.shape)
        k = want[name].shape[1]
        err = np.abs(g - w).max()
        for t in range(w.shape[0]):
            s = np.sort(w[t])[::-1]
            if s[k - 1] - s[k] < 4 * err:
                ties.add(t)
    return ties


def rel_rows(a, b):
    return np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-30)


def check_model(label, path, tokens, llama_logits, n_prompt):
    want = ref.forward(path, tokens)
    compare(label + " precise", want, ours(path, tokens, n_prompt, True, "f32"), TOL_PRECISE, gap_fn(want))
    mine = ours(path, tokens, n_prompt, False, "f16")
    compare(label + " quantized", want, mine, TOL_QUANT, gap_fn(want))
    ties = router_near_tie(want, mine)
    # a near tie is rare (4 experts, router error ~1%): many mean a wrong router, not ties
    if not check(len(ties) <= len(tokens) // 4,
                 f"{label}: {len(ties)} of {len(tokens)} positions are router near ties for our error"):
        return
    keep = np.array([t not in ties for t in range(len(tokens))])
    lref = np.asarray(want["logits"])
    lmine = np.asarray(mine["logits"]).reshape(lref.shape)
    ll = llama_logits.astype(np.float64)
    e_lr = rel_rows(ll, lref)[keep]
    e_ol = rel_rows(lmine, ll)[keep]
    check(np.isfinite(ll).all(), f"{label}: llama.cpp's logits are not finite")
    check(e_lr.max() <= TOL_LLAMA,
          f"{label}: llama.cpp vs reference logits rel err {e_lr.max():.3e} > {TOL_LLAMA:g}")
    check(e_ol.max() <= TOL_OURS_LLAMA,
          f"{label}: ours vs llama.cpp logits rel err {e_ol.max():.3e} > {TOL_OURS_LLAMA:g}")
    agree = int((lmine[n_prompt - 1:-1].argmax(1) == np.asarray(tokens[n_prompt:])).sum())
    print(f"  {label}: logits rel err llama.cpp-ref {e_lr.max():.2e}, ours-llama.cpp {e_ol.max():.2e}"
          f"{f', {len(ties)} near-tie positions skipped' if ties else ''}; our argmax = llama.cpp's greedy"
          f" token {agree}/{len(tokens) - n_prompt}")


def tensor_info_at(path, name):
    """Byte offsets of a tensor's ne[0] and type fields in its info record."""
    for t in gguf.GGUFReader(path).tensors:
        if t.name == name:
            ne_at = t.field.offset + 8 + len(name.encode()) + 4
            return ne_at, ne_at + 8 * len(t.shape)
    raise SystemExit(f"{path}: no tensor {name}")


def check_bad_variants(path):
    """A llama.cpp file with one field broken must be refused with an error that
    names the tensor and the type (exit 1, no crash) by the reader and the loader."""
    src = open(path, "rb").read()
    down, knorm = "blk.0.ffn_down_exps.weight", "blk.0.attn_k_norm.weight"  # iq1_s [256, 256, 4]; f32 [64]
    cases = [  # (what, tensor, field, new value, words the message must have)
        ("unknown type id 42", down, "type", 42, [down, "type", "got 42"]),
        ("iq1_s data read as iq2_xxs (66-byte blocks, not 50)", down, "type", 16, [down, "iq2_xxs", "overlaps"]),
        ("iq1_s data read as q4_1 (blocks of 32)", down, "type", 3, [down, "q4_1", "overlaps"]),
        ("a row of 64 as q2_K (blocks of 256)", knorm, "type", 10, [knorm, "q2_K's block size 256", "ne[0]"]),
        ("a row of 288 iq1_s values", down, "ne0", 288, [down, "iq1_s's block size 256", "ne[0]"]),
    ]
    for what, name, field, value, words in cases:
        ne_at, type_at = tensor_info_at(path, name)
        b = bytearray(src)
        if field == "type":
            b[type_at:type_at + 4] = value.to_bytes(4, "little")
        else:
            b[ne_at:ne_at + 8] = value.to_bytes(8, "little")
        bad = os.path.join(TMP, "lc_bad.gguf")
        with open(bad, "wb") as f:
            f.write(b)
        for cmd in ([TIERMOE, "inspect", bad],
                    [os.path.join(TOOLS, "forward_dump"), bad, "--tokens", "1,2", "-o", bad + ".dump"]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            tool = os.path.basename(cmd[0])
            if check(r.returncode == 1 and "Sanitizer" not in r.stderr,
                     f"bad input ({what}), {tool}: exit {r.returncode}, expected 1: {r.stderr[-300:]}"):
                missing = [w for w in words if w not in r.stderr]
                check(not missing, f"bad input ({what}), {tool}: message lacks {missing}: {r.stderr.strip()}")
    print(f"  {len(cases)} broken variants of a llama.cpp file refused, naming the tensor and the type")


def main():
    mpath = os.path.join(LC, "manifest.json")
    if not os.path.exists(mpath):
        print(f"FAIL  {mpath} missing")
        return 1
    with open(mpath) as f:
        man = json.load(f)
    gold = np.load(os.path.join(LC, "llamacpp_logits.npz"))
    n_prompt = len(man["prompt"])

    # 1. llama.cpp's quantized files
    seen = set()
    for name, info in man["quantized"].items():
        path = os.path.join(LC, name + ".gguf")
        seen |= check_reader_and_dequant(name, path)
        check_model(f"llama-quantize {name}", path, gold[name + ".tokens"].tolist(),
                    gold[name + ".logits"], n_prompt)
    check_bad_variants(os.path.join(LC, "lq-a.gguf"))
    missing = {t.lower() for t in man["mkmodel"]} - seen
    check(not missing, f"llama-quantize's files lack types {sorted(missing)}")

    # 2. mkmodel's files, as llama.cpp read them
    for ty, info in man["mkmodel"].items():
        path = os.path.join(TMP, f"lc-mk-{ty}.gguf")
        run([TIERMOE, "mkmodel", "-q", "-o", path, *info["flags"]])
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if not check(digest == info["sha256"],
                     f"mkmodel {ty}: the file differs from the one llama.cpp read (sha256 {digest[:12]} != "
                     f"{info['sha256'][:12]}); if mkmodel's quantizer changed on purpose, rerun "
                     "scripts/make_llamacpp_goldens.py"):
            continue
        check_model(f"mkmodel {ty}", path, gold[f"mk-{ty}.tokens"].tolist(), gold[f"mk-{ty}.logits"], n_prompt)
    return finish("tiermoe reads llama.cpp's low-bit files and llama.cpp reads ours; logits agree")


if __name__ == "__main__":
    sys.exit(main())
