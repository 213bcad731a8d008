#!/usr/bin/env python3
"""Validates the numpy reference (tests/ref/qwen3moe_ref.py) against HuggingFace.

The goldens in tests/data/hf_qwen3moe/ were written by scripts/make_hf_goldens.py:
HF transformers' Qwen3MoeForCausalLM in float64 on exactly the weights stored in
tiny-{f32,q8_0}.gguf. Here the reference runs on the same GGUF files and must
agree array by array, layer by layer; on failure the first wrong layer and
stage are named.

Tolerance (stated, derived): both sides compute in float64 (u = 2^-53 ≈ 1.1e-16)
on identical weight values, so they differ only by rounding in a different
operation order. Metric per array: e = max|ref - hf| / max|hf|. Each layer is
about S = 10 dependent steps whose worst-case dot-product error is n·u with
n ≤ 128 (the longest reduction: n_head·d_v), i.e. ≤ 1.4e-14 a step; softmax,
RMSNorm, SiLU and the residual sums amplify relative error by at most ~10 for
these O(1) activations. Over L = 2 layers plus the output head that bounds e
by about L·S·n·u·10 ≈ 3e-12. The limit TOL = 1e-10 keeps a 30× margin over
that bound and sits far below float32 rounding (6e-8): the HF model run
without the float64 patches differs by ~1e-7 (recorded in the golden's
metadata), so a float32 slip anywhere would fail this test. Measured: ≤ 6e-15.
Top-k ids must match exactly; the test first checks that no token's k-th and
(k+1)-th router probabilities are within 1e-8 (a near tie would make that
comparison meaningless rather than wrong).

Also checked: the CLI writes an F32 dump that reads back equal to the forward
within F32 storage rounding (limit 1e-6 relative: rounding is ≤ 2^-24 ≈ 6e-8),
with topk_ids stored as I32 and dump.tokens as an int32 array; and the tied
output path (no output.weight) gives rmsnorm(x)·output_norm·token_embdᵀ.
Exit 77 when numpy or gguf is missing.
"""

import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
except ImportError as e:  # reference package missing: skip
    print(f"skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
REF_DIR = os.path.join(HERE, "..", "ref")
sys.path.insert(0, REF_DIR)
import qwen3moe_ref as ref  # noqa: E402

TOL = 1e-10           # float64 vs float64 (derivation above)
TOL_F32_DUMP = 1e-6   # F32 storage rounding of the CLI dump
NEAR_TIE = 1e-8

DATA = os.environ.get("TM_TEST_DATA", os.path.join(HERE, "..", "data"))
GOLD_DIR = os.path.join(DATA, "hf_qwen3moe")
TMP = os.environ.get("TM_TEST_TMP") or tempfile.mkdtemp(prefix="tm_ref_vs_hf_")

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))


def compare(tag, got, gold, tol):
    """Compare in dump order; report the first wrong layer/stage. Returns max error seen."""
    first = None
    worst = 0.0
    for name in sorted(gold, key=ref.dump_sort_key):
        if name not in got:
            fail(f"{tag}: reference produced no {name}")
            first = first or name
            continue
        a, b = got[name], gold[name]
        if a.shape != b.shape:
            fail(f"{tag}: {name} shape {a.shape} vs golden {b.shape}")
            first = first or name
            continue
        if name.endswith("topk_ids"):
            ok = np.array_equal(a, b)
            print(f"  {tag:10s} {name:24s} {'equal' if ok else 'DIFFERENT'}")
            if not ok:
                rows = np.nonzero(np.any(a != b, axis=1))[0]
                fail(f"{tag}: {name} differs at token(s) {rows.tolist()}")
                first = first or name
            continue
        e = rel_err(a, b)
        worst = max(worst, e)
        print(f"  {tag:10s} {name:24s} rel err {e:.3e}")
        if not e <= tol:
            fail(f"{tag}: {name} rel err {e:.3e} > {tol:g}")
            first = first or name
    if first is not None:
        layer = first.split(".")[1] if first.startswith("blk.") else "output head"
        print(f"{tag}: first mismatch at {first} (layer {layer})")
    return worst


def check_no_near_ties(tag, gold, k):
    for name in gold:
        if not name.endswith("router_logits"):
            continue
        p = ref.softmax(gold[name], axis=-1)
        s = -np.sort(-p, axis=-1)
        gap = float(np.min(s[:, k - 1] - s[:, k])) if s.shape[1] > k else 1.0
        if gap < NEAR_TIE:
            fail(f"{tag}: {name} has a near tie between the k-th and (k+1)-th expert "
                 f"(gap {gap:.2e}); regenerate the golden with another seed")


def check_model(tag):
    model_path = os.path.join(GOLD_DIR, f"tiny-{tag}.gguf")
    gold_path = os.path.join(GOLD_DIR, f"tiny-{tag}.golden.gguf")
    gold, meta = ref.read_dump(gold_path)
    tokens = meta["dump.tokens"]
    if not tokens or meta.get("dump.model") != os.path.basename(model_path):
        fail(f"{gold_path}: dump.tokens missing or dump.model is not {os.path.basename(model_path)}")
        return None
    m = ref.Qwen3MoeFile(model_path)
    check_no_near_ties(tag, gold, m.n_expert_used)
    got = ref.forward(None, tokens, model=m)
    worst = compare(tag, got, gold, TOL)
    print(f"{tag}: max rel err vs HF {worst:.3e} (limit {TOL:g}); HF float32 islands would give "
          f"{meta.get('hf.float32_islands_max_rel_diff', float('nan')):.3e}; "
          f"transformers {meta.get('hf.transformers_version')}, torch {meta.get('hf.torch_version')}")
    return model_path, tokens, got, gold


def check_cli(model_path, tokens, got):
    out = os.path.join(TMP, "ref_cli_dump.gguf")
    cmd = [sys.executable, os.path.join(REF_DIR, "qwen3moe_ref.py"), model_path,
           "--tokens", ",".join(str(t) for t in tokens), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"CLI failed ({r.returncode}): {r.stderr.strip()}")
        return
    rd = gguf.GGUFReader(out, "r")
    types = {t.name: t.tensor_type for t in rd.tensors}
    if types.get("blk.0.topk_ids") != gguf.GGMLQuantizationType.I32:
        fail(f"CLI dump: blk.0.topk_ids type {types.get('blk.0.topk_ids')}, expected I32")
    if types.get("logits") != gguf.GGMLQuantizationType.F32:
        fail(f"CLI dump: logits type {types.get('logits')}, expected F32")
    tf = rd.fields.get("dump.tokens")
    if tf is None or tf.types != [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]:
        fail("CLI dump: dump.tokens is not an int32 array")
    logits_t = next(t for t in rd.tensors if t.name == "logits")
    if [int(d) for d in logits_t.shape] != [got["logits"].shape[1], len(tokens)]:
        fail(f"CLI dump: logits ne {list(logits_t.shape)}, expected [n_vocab, n_tok]")
    dumped, meta = ref.read_dump(out)
    if meta["dump.tokens"] != list(tokens):
        fail("CLI dump: dump.tokens differs from --tokens")
    worst = compare("cli-f32", dumped, got, TOL_F32_DUMP)
    print(f"cli: F32 dump vs in-memory forward max rel err {worst:.3e} (limit {TOL_F32_DUMP:g})")


def check_tied_output(model_path, tokens, gold):
    """Drop output.weight: logits must be rmsnorm(x_last)·output_norm·token_embdᵀ."""
    src = gguf.GGUFReader(model_path, "r")
    tied = os.path.join(TMP, "tiny-tied.gguf")
    w = gguf.GGUFWriter(tied, "qwen3moe")
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        v = f.contents()
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, v, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(key, v, vt)
    for t in src.tensors:
        if t.name == "output.weight":
            continue
        w.add_tensor(t.name, np.array(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = ref.forward(tied, tokens)
    m = ref.Qwen3MoeFile(tied)
    if m.output_name != "token_embd.weight":
        fail("tied model: reference did not fall back to token_embd for the output")
    embd = np.array([t for t in src.tensors if t.name == "token_embd.weight"][0].data, dtype=np.float64)
    onorm = np.array([t for t in src.tensors if t.name == "output_norm.weight"][0].data, dtype=np.float64)
    x = gold[f"blk.{m.n_layer - 1}.x_out"]
    xn = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + m.eps) * onorm
    e = rel_err(got["logits"], xn @ embd.T)
    print(f"tied output: rel err {e:.3e} (limit {TOL:g})")
    if not e <= TOL:
        fail(f"tied output: logits rel err {e:.3e} > {TOL:g}")


def main():
    os.makedirs(TMP, exist_ok=True)
    if not os.path.isdir(GOLD_DIR):
        print(f"FAIL: golden directory {GOLD_DIR} is missing")
        return 1
    first = None
    for tag in ("f32", "q8_0"):
        r = check_model(tag)
        if tag == "f32":
            first = r
    if first is not None:
        model_path, tokens, got, gold = first
        check_cli(model_path, tokens, got)
        check_tied_output(model_path, tokens, gold)
    if failures:
        print(f"test_ref_vs_hf: {len(failures)} check(s) failed")
        return 1
    print("test_ref_vs_hf: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
