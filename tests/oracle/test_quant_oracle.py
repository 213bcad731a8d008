#!/usr/bin/env python3
"""Oracle test for src/quant: our block types against the gguf package (PyPI).

1. Type table: every id, name, block size and type size equals gguf's
   GGML_QUANT_SIZES.
2. Dequantization: for every compute type the package can dequantize, many
   random valid blocks (random bytes, scale fields set to finite halves across
   the whole range incl. zeros, negatives and subnormals; MXFP4 exponents
   0..255) go through `quant_tool dequant` and must equal
   gguf.quants.dequantize bit for bit (+0.0 and -0.0 count as equal).
   f16: all 65536 halves; bf16: all 65536 values; f32: random bit patterns.
3. Quantization, bit-exact where the package can quantize: f16 (numpy
   astype), bf16, q8_0, q4_0, mxfp4. Our documented deviations are checked
   separately: finite inputs that would give an infinite f16/bf16 or an
   infinite q8_0/q4_0 scale saturate instead.
4. Quantization where the package cannot (q4_K, q5_K, q6_K): our blocks,
   dequantized by the PACKAGE, stay within the per-value bounds of
   docs/quant.md (re-derived here in float64). q8_K has no dequantizer in
   the package; tests/test_quant.c covers it.

Exit 77 (skipped) when numpy or gguf is missing.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

TOOL = os.path.join(os.environ.get("TM_TOOLS_DIR", "build/tests"), "quant_tool")
TMP = os.environ.get("TM_TEST_TMP") or tempfile.mkdtemp()
os.makedirs(TMP, exist_ok=True)
RNG = np.random.default_rng(20240601)
failures = []

NAMES = {T.F32: "f32", T.F16: "f16", T.BF16: "bf16", T.Q8_0: "q8_0", T.Q4_0: "q4_0",
         T.Q4_K: "q4_K", T.Q5_K: "q5_K", T.Q6_K: "q6_K", T.MXFP4: "mxfp4"}


def check(ok, msg):
    print(("ok    " if ok else "FAIL  ") + msg)
    if not ok:
        failures.append(msg)


def tool(mode, qtype, data):
    src = os.path.join(TMP, f"{mode}_{NAMES[qtype]}.in")
    dst = os.path.join(TMP, f"{mode}_{NAMES[qtype]}.out")
    data.tofile(src)
    subprocess.run([TOOL, mode, NAMES[qtype], src, dst], check=True)
    out = np.fromfile(dst, dtype=np.float32 if mode == "dequant" else np.uint8)
    os.remove(src)
    os.remove(dst)
    return out


def same_bits(a, b):
    """Bitwise equality of float32 arrays, +0.0 == -0.0."""
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    return (ua == ub) | ((a == 0) & (b == 0))


def report_equal(what, ours, ref, inputs=None):
    eq = same_bits(ours.astype(np.float32), ref.astype(np.float32).reshape(-1))
    bad = np.flatnonzero(~eq)
    detail = ""
    if bad.size:
        i = bad[0]
        detail = f": {bad.size} differ, first at {i}: ours {ours[i]!r} ref {ref.reshape(-1)[i]!r}"
        if inputs is not None:
            detail += f" input {inputs.reshape(-1)[i]!r}"
    check(bad.size == 0, f"{what}: {ours.size} values bit-identical{detail}")


# ---------------------------------------------------------------- type table

def test_table():
    out = subprocess.run([TOOL, "types"], check=True, capture_output=True, text=True).stdout
    ours = {}
    for line in out.splitlines():
        tid, name, bs, ts, _ = line.split()
        ours[int(tid)] = (name, int(bs), int(ts))
    ref = {t.value: (t.name, *GGML_QUANT_SIZES[t]) for t in T if t in GGML_QUANT_SIZES}
    bad = [(k, ours.get(k), ref.get(k)) for k in sorted(set(ours) | set(ref))
           if k not in ours or k not in ref or ours[k][0].lower() != ref[k][0].lower()
           or ours[k][1:] != ref[k][1:]]
    check(not bad, f"type table: {len(ref)} ids match gguf's GGML_QUANT_SIZES {bad[:3]}")


# ---------------------------------------------------------------- dequantization

def finite_halves(n):
    """Finite f16 bit patterns: a third anywhere in the finite range (subnormals
    included), a third in a sane range, a third special values."""
    bits = RNG.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits)  # exponent 31 -> 15
    sane = (RNG.standard_normal(n) * 10.0 ** RNG.uniform(-6, 1, n)).astype(np.float16).view(np.uint16)
    special = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF,
                        0x3C00, 0xBC00, 0x0200, 0x83FF], dtype=np.uint16)
    pick = RNG.integers(0, 3, n)
    out = np.where(pick == 0, bits, np.where(pick == 1, sane, special[RNG.integers(0, special.size, n)]))
    return out.astype(np.uint16)


def random_blocks(qtype, nb):
    _, ts = GGML_QUANT_SIZES[qtype]
    b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)

    def put_half(off):
        b[:, off:off + 2] = finite_halves(nb).view(np.uint8).reshape(nb, 2)

    if qtype in (T.Q8_0, T.Q4_0):
        put_half(0)
    elif qtype in (T.Q4_K, T.Q5_K):
        put_half(0)
        put_half(2)
    elif qtype == T.Q6_K:
        put_half(ts - 2)
    elif qtype == T.MXFP4:
        b[:, 0] = np.arange(nb) % 256  # every exponent, 0 and 254 included
    return b


def test_dequant():
    # f32: raw bit patterns, NaNs included, pass through unchanged
    x = RNG.integers(0, 1 << 32, 100000, dtype=np.uint64).astype(np.uint32)
    report_equal("dequant f32 random bit patterns", tool("dequant", T.F32, x), x.view(np.float32))
    # f16 and bf16: every bit pattern, NaN payloads included
    allh = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    report_equal("dequant f16 all 65536 halves", tool("dequant", T.F16, allh),
                 quants.dequantize(allh.view(np.uint8), T.F16))
    report_equal("dequant bf16 all 65536 values", tool("dequant", T.BF16, allh),
                 quants.dequantize(allh.view(np.uint8), T.BF16))
    for qtype, nb in ((T.Q8_0, 40000), (T.Q4_0, 40000), (T.Q4_K, 6000), (T.Q5_K, 6000),
                      (T.Q6_K, 6000), (T.MXFP4, 40000)):
        blocks = random_blocks(qtype, nb)
        ours = tool("dequant", qtype, blocks.reshape(-1))
        with np.errstate(over="ignore"):  # MXFP4 e = 255 is 2^127: 12 * 2^127 is inf in both
            ref = quants.dequantize(blocks, qtype)
        report_equal(f"dequant {NAMES[qtype]} {nb} random blocks", ours, ref)
        # all-zero blocks (zero scales) as well
        zb = np.zeros_like(blocks[:16])
        report_equal(f"dequant {NAMES[qtype]} zero blocks", tool("dequant", qtype, zb.reshape(-1)),
                     quants.dequantize(zb, qtype))


# ---------------------------------------------------------------- quantization data

def datasets():
    n = 256 * 512
    g = RNG.standard_normal(n).astype(np.float32)
    u = RNG.random(n, dtype=np.float32)
    scale = np.repeat(10.0 ** RNG.uniform(-4, 3, n // 256), 256).astype(np.float32)
    mant = RNG.uniform(1, 2, n).astype(np.float32)
    pw = np.ldexp(np.float32(1), RNG.integers(-30, 15, n)).astype(np.float32)
    nbr = RNG.integers(-1, 2, n)  # powers of two and their float neighbours
    pow2 = np.where(nbr < 0, np.nextafter(pw, 0), np.where(nbr > 0, np.nextafter(pw, 2 * pw), pw))
    ints = (RNG.integers(-127, 128, n) / np.where(np.arange(n) % 3, 1, 2)).astype(np.float32)
    d = {
        "normal 0.02": g * 0.02,
        "normal 1e3": g * 1e3,
        "uniform": u * 2 - 1,
        "positive": u * 3 + 0.5,
        "negative": -u * 0.1 - 2,
        "heavy-tailed": g * 0.01 / np.sqrt(RNG.random(n, dtype=np.float32) + 1e-6),
        "outliers": g * np.where(u < 0.01, 100, 0.05),
        "zeros": np.zeros(n),
        "constant": np.full(n, 0.7),
        "negative constant": np.full(n, -3.25),
        "half-subnormal scales": g * 1e-6,
        "mixed scales": g * scale,
        "integers and halves (ties)": ints,
        "powers of two +-1ulp": pow2 * np.where(u < 0.5, -1, 1),
        "random exponents": mant * pw * np.where(u < 0.5, -1, 1),
        "sparse": np.where(u < 0.05, g, 0),
    }
    return {k: np.asarray(v, dtype=np.float32) for k, v in d.items()}


def block_amax(x, bs):
    return np.abs(x.reshape(-1, bs).astype(np.float64)).max(axis=1)


# ---------------------------------------------------------------- bit-exact quantization

def test_quant_exact(data):
    # f16: numpy's IEEE round-to-nearest-even conversion
    rand_bits = RNG.integers(0, 1 << 32, 400000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for name, x in list(data.items()) + [("random f32 bit patterns", rand_bits)]:
        ours = tool("quant", T.F16, x).view(np.uint16)
        with np.errstate(over="ignore"):
            ref = x.astype(np.float16).view(np.uint16)
        fin = np.isfinite(x) & (np.abs(x) < 65520)
        sat = np.isfinite(x) & ~fin
        nan = np.isnan(x)
        ok = (np.array_equal(ours[fin], ref[fin])
              and np.all((ours[sat] & 0x7FFF) == 0x7BFF)
              and np.all((ours[nan] & 0x7C00) == 0x7C00) and np.all(ours[nan] & 0x3FF))
        check(ok, f"quant f16 == numpy astype(float16) on {name} "
                  f"({fin.sum()} exact, {sat.sum()} saturated, {nan.sum()} NaN)")
        # bf16: gguf's ggml-equivalent rounding
        ours = tool("quant", T.BF16, x).view(np.uint16)
        with np.errstate(over="ignore"):
            ref = quants.quantize(x, T.BF16).view(np.uint16)
        overflow = np.isfinite(x) & ((ref & 0x7FFF) == 0x7F80)
        ok = (np.array_equal(ours[~overflow], ref[~overflow])
              and np.all((ours[overflow] & 0x7FFF) == 0x7F7F))
        check(ok, f"quant bf16 == gguf on {name} ({overflow.sum()} saturated)")

    for qtype, bs, limit in ((T.Q8_0, 32, 127 * 65504.0), (T.Q4_0, 32, 8 * 65504.0),
                             (T.MXFP4, 32, np.inf)):
        for name, x in data.items():
            ours = tool("quant", qtype, x).reshape(-1, GGML_QUANT_SIZES[qtype][1])
            with np.errstate(all="ignore"):
                ref = quants.quantize(x, qtype).reshape(ours.shape)
            amax = block_amax(x, bs)
            # where ggml's own math is defined: scale fits a half, its reciprocal
            # fits a float, MXFP4's exponent needs no clamp
            valid = (amax <= limit) & ((amax == 0) | (amax >= 2.0 ** -100))
            same = np.all(ours == ref, axis=1)
            bad = np.flatnonzero(valid & ~same)
            check(bad.size == 0, f"quant {NAMES[qtype]} == gguf.quants.quantize on {name}: "
                                 f"{valid.sum()}/{amax.size} blocks compared, {bad.size} differ")
    # saturation instead of infinite scales (where ggml would store inf)
    huge = (RNG.standard_normal(256 * 8) * 1e30).astype(np.float32)
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4):
        y = quants.dequantize(tool("quant", qtype, huge), qtype)
        check(bool(np.all(np.isfinite(y))), f"quant {NAMES[qtype]} of 1e30-scale data: finite blocks")


# ---------------------------------------------------------------- error bounds

def ceil_h(v):
    return v * (1 + 2.0 ** -10) + 2.0 ** -24


def bounds(qtype, x):
    """Per-value error bounds of docs/quant.md, or NaN where the block is beyond
    the type's range (saturated: finiteness only)."""
    x = x.astype(np.float64)
    if qtype in (T.Q4_K, T.Q5_K):
        L = 15 if qtype == T.Q4_K else 31
        s = x.reshape(-1, 8, 32)
        nm = np.maximum(0, -s.min(axis=2))
        R = s.max(axis=2) + nm
        NM, RM = nm.max(axis=1, keepdims=True), R.max(axis=1, keepdims=True)
        dm = ceil_h(NM / 63)
        d = ceil_h((RM + dm) / (63 * L))
        b = ((R + dm) / L + d) / 2
        ok = (NM / 63 <= 65504) & ((RM + dm) / (63 * L) <= 65504)
        b = np.where(ok, b, np.nan)[:, :, None] + np.zeros((1, 1, 32))
    elif qtype == T.Q6_K:
        s = x.reshape(-1, 16, 16)
        p, m = np.maximum(0, s.max(axis=2)), np.maximum(0, -s.min(axis=2))
        need = np.maximum(np.maximum(p, m) / 32, np.minimum(p, m) / 31)
        NN = need.max(axis=1, keepdims=True)
        b = (need + ceil_h(NN / 127)) / 2
        b = np.where(NN / 127 <= 65504, b, np.nan)[:, :, None] + np.zeros((1, 1, 16))
    else:
        raise ValueError(qtype)
    A = np.abs(x).reshape(-1, 256).max(axis=1)
    return b.reshape(-1, 256) + 2.0 ** -18 * A[:, None]


def test_quant_bounds(data):
    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        worst, rms = 0.0, []
        for name, x in data.items():
            y = quants.dequantize(tool("quant", qtype, x), qtype).astype(np.float64)
            err = np.abs(x.astype(np.float64) - y).reshape(-1, 256)
            b = bounds(qtype, x)
            inr = ~np.isnan(b)
            over = inr & (err > b)
            if name == "zeros":
                check(bool(np.all(y == 0)), f"{NAMES[qtype]} zeros dequantize to zeros")
            check(bool(np.all(np.isfinite(y))) and not over.any(),
                  f"{NAMES[qtype]} {name}: package-dequantized error within bound "
                  f"({inr.sum()} values checked, {over.sum()} over)")
            worst = max(worst, float(np.max(np.where(inr & (b > 0), err / np.where(b > 0, b, 1), 0))))
            if name == "normal 0.02":
                rms.append(np.sqrt(np.mean(err ** 2)) / np.sqrt(np.mean(x.astype(np.float64) ** 2)))
        print(f"      {NAMES[qtype]}: worst error/bound {worst:.4f}, "
              f"normal rmse/rms {rms[0]:.5f}")


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"FAIL  quant_tool not found at {TOOL} (set TM_TOOLS_DIR)")
        return 1
    test_table()
    test_dequant()
    data = datasets()
    test_quant_exact(data)
    test_quant_bounds(data)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
