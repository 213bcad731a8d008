#!/usr/bin/env python3
"""`tiermoe mkmodel --fill repeat` (speed-bench files), read back with the gguf package.

- The normal fill is unchanged: a tiny model with low-bit experts (iq2_xxs / q3_K /
  iq1_m) and locality is byte for byte what the build before --fill wrote (its
  sha256, recorded with that build), and `--fill random` writes the same bytes.
- --fill repeat --fill-rows N against the normal file of the same flags: the same
  tensors in the same order, types, shapes, sizes and relative offsets; the same
  metadata plus tiermoe.synth.fill_rows = N.
- Token embeddings, norms, routers (and gpt-oss's biases and sinks) are the normal
  file's bytes; so are the rows the locality layout sets (the rows where the normal
  file with locality differs from one without it).
- Every other row of a weight matrix (attention, experts, output) is one of the
  first N rows of the normal file without locality: at most N distinct rows a
  tensor, all N of them used, and the first N rows are those rows themselves.
- Rows are repeated in a different order in each expert (not one block copied).
- The file loads and runs, and bench says its weights repeat (not for a normal file);
  bad --fill / --fill-rows values exit 2 naming the flag.
"""
import hashlib
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import TIERMOE, TMP, check, finish  # noqa: E402

# sha256 of `tiermoe mkmodel -q -t 2 --preset tiny` with LOW below, written by the build
# before --fill existed (a94c1c6). A deliberate change of the generator or the quantizers
# must update it; anything else that changes it is a bug.
LOW = ["--type-gate-exps", "iq2_xxs", "--type-up-exps", "q3_K", "--type-down-exps", "iq1_m",
       "--locality", "0.5"]
LOW_SHA256 = "c8fa16f57878a911231c5cfd73724c792f4e50f91721ff0c31fdfa723c45c79e"
N = 8  # --fill-rows
POOLED = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps",
          "ffn_down_exps", "output")


def mk(name, *flags, expect=0):
    path = os.path.join(TMP, name + ".gguf")
    if os.path.exists(path):
        os.remove(path)
    r = subprocess.run([TIERMOE, "mkmodel", "-q", "-t", "2", "-o", path, *flags],
                       capture_output=True, text=True)
    check(r.returncode == expect,
          f"mkmodel {' '.join(flags)}: exit {r.returncode}, want {expect}: {r.stderr}")
    return path, r


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def rows_of(t):
    """Raw bytes of a tensor as [rows, bytes per row]."""
    data = np.asarray(t.data)
    n = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
    return np.ascontiguousarray(data).view(np.uint8).reshape(n, -1)


def kind_of(name):
    parts = name.split(".")
    if parts[-1] != "weight":
        return parts[-1]  # biases
    return parts[2] if name.startswith("blk.") else parts[0]


def fields_of(rd):
    return {k: f.contents() for k, f in rd.fields.items() if not k.startswith("GGUF.")}


def compare(label, plain, rep, base=None):
    """plain: the normal file; rep: the same flags with --fill repeat --fill-rows N; base: the
    normal file without locality (None: the flags have none; plain is then that file)."""
    a, b = gguf.GGUFReader(plain), gguf.GGUFReader(rep)
    z = gguf.GGUFReader(base) if base else a
    fa, fb = fields_of(a), fields_of(b)
    check(fb.get("tiermoe.synth.fill_rows") == N,
          f"{label}: tiermoe.synth.fill_rows is {fb.get('tiermoe.synth.fill_rows')}, want {N}")
    fb.pop("tiermoe.synth.fill_rows", None)
    check(fa == fb, f"{label}: metadata differs beyond fill_rows: "
                    f"{sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))}")
    lay = lambda rd: [(t.name, t.tensor_type.name, list(map(int, t.shape)), int(t.n_bytes),
                       int(t.data_offset) - int(rd.tensors[0].data_offset)) for t in rd.tensors]
    check(lay(a) == lay(b), f"{label}: tensor layout (names, types, shapes, sizes, offsets) differs")
    zt = {t.name: t for t in z.tensors}
    n_pooled = n_rows = 0
    for ta, tb in zip(a.tensors, b.tensors):
        ra, rb, rz = rows_of(ta), rows_of(tb), rows_of(zt[ta.name])
        if kind_of(ta.name) not in POOLED or ra.shape[0] <= N:
            check(np.array_equal(ra, rb), f"{label}: {ta.name} ({kind_of(ta.name)}) is not the normal "
                                          "file's bytes")
            continue
        touched = np.any(ra != rz, axis=1)  # the rows locality sets (none without it)
        same = np.all(ra == rb, axis=1)
        check(np.all(same[touched]), f"{label}: {ta.name}: rows {np.nonzero(touched & ~same)[0][:5]} "
                                     "that locality sets are not the normal file's")
        free = np.nonzero(~touched)[0]
        if not len(free):  # the recency head's output: every row set
            continue
        n_pooled += 1
        # each free row: the index of the pool row (one of the first N rows without locality)
        pool = {rz[i].tobytes(): i for i in range(N)}
        slot = np.array([pool.get(rb[i].tobytes(), -1) for i in free])
        check(np.all(slot >= 0), f"{label}: {ta.name}: rows {free[slot < 0][:5]} are none of the "
                                 f"{N} pool rows")
        check(len(set(slot.tolist()) - {-1}) == N, f"{label}: {ta.name}: {len(set(slot.tolist()))} of "
                                                   f"the {N} pool rows used")
        head = free < N
        check(np.array_equal(slot[head], free[head]), f"{label}: {ta.name}: the first rows are not "
                                                      "the pool rows themselves")
        if len(ta.shape) == 3:  # experts: each its own order
            per = int(ta.shape[1])
            s_full = np.full(ra.shape[0], -1)
            s_full[free] = slot
            orders = {tuple(s_full[e * per:(e + 1) * per]) for e in range(1, int(ta.shape[2]))}
            check(len(orders) == int(ta.shape[2]) - 1,
                  f"{label}: {ta.name}: experts repeat their rows in the same order")
        n_rows += len(free)
    check(n_pooled > 0, f"{label}: no tensor was pooled")
    print(f"  {label}: {n_pooled} matrices of {N} distinct rows repeated ({n_rows} rows), "
          "the rest the normal file's bytes; layout and metadata the same")
    return rep


def main():
    # the normal fill is unchanged
    plain, _ = mk("low", "--preset", "tiny", *LOW)
    check(sha(plain) == LOW_SHA256,
          f"the normal fill changed: sha256 {sha(plain)}, the build before --fill wrote {LOW_SHA256}")
    rnd, _ = mk("low_random", "--preset", "tiny", *LOW, "--fill", "random")
    check(sha(rnd) == sha(plain), "--fill random is not the default's bytes")

    base, _ = mk("low_noloc", "--preset", "tiny", *LOW[:-2])
    rep, _ = mk("low_rep", "--preset", "tiny", *LOW, "--fill", "repeat", "--fill-rows", str(N))
    compare("tiny, low-bit experts, locality 0.5", plain, rep, base)
    # attention and output in low-bit types too, gpt-oss (biases, sinks)
    flags = ["--preset", "tiny", "--mix", "IQ2_XXS", "--n-layer", "2"]
    compare("tiny --mix IQ2_XXS", mk("mix", *flags)[0],
            mk("mix_rep", *flags, "--fill", "repeat", "--fill-rows", str(N))[0])
    g = ["--preset", "tiny-gpt-oss", "--n-layer", "2"]
    rep_g = compare("tiny-gpt-oss", mk("oss", *g)[0],
                    mk("oss_rep", *g, "--fill", "repeat", "--fill-rows", str(N))[0])

    # the files load and run; bench says the weights repeat, and only for such files
    for p in (rep, rep_g):
        r = subprocess.run([TIERMOE, "run", "-m", p, "--tokens", "1,2,3", "-n", "2", "-t", "2"],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"run on {os.path.basename(p)}: exit {r.returncode}: {r.stderr[-300:]}")
    for p, says in ((rep, True), (plain, False)):
        r = subprocess.run([TIERMOE, "bench", "-m", p, "-p", "8", "-n", "2", "-r", "1", "-t", "2",
                            "--no-membw"], capture_output=True, text=True)
        line = f"synthetic weights: {N} distinct rows a matrix, repeated"
        check(r.returncode == 0 and (line in r.stderr) == says,
              f"bench on {os.path.basename(p)}: exit {r.returncode}, says the weights repeat: "
              f"{line in r.stderr}, want {says}")

    # bad flags: exit 2 naming the flag, no file
    for flags, words in ((["--fill", "zeros"], ["--fill", "zeros", "random or repeat"]),
                         (["--fill-rows", "16"], ["--fill-rows", "--fill repeat"]),
                         (["--fill", "repeat", "--fill-rows", "0"], ["--fill-rows", "0"])):
        p, r = mk("bad", *flags, expect=2)
        check(all(w in r.stderr for w in words), f"{flags}: message {r.stderr!r} should name {words}")
        check(not os.path.exists(p), f"{flags}: a refused command wrote {p}")
    return finish("mkmodel --fill repeat: same layout and types, pooled rows repeated, the rest the "
                  "normal bytes; the normal fill unchanged")


if __name__ == "__main__":
    sys.exit(main())
