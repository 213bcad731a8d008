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
   The low-bit types (q4_1 ... tq2_0, LOWBIT) likewise on random blocks, and on
   adversarial ones: special scales (zero, -0, subnormal, max, negative) with
   codes all-0x00 / all-0xFF / random, all-0x00 and all-0xFF blocks, inf and
   NaN scales (NaN wherever the reference gives NaN; finite values bit for bit), and for
   the grid types blocks that use every grid index, sign pattern, sub-scale
   and delta sign.
3. Quantization, bit-exact where the package can quantize: f16 (numpy
   astype), bf16, q8_0, q4_0, mxfp4. Our documented deviations are checked
   separately: finite inputs that would give an infinite f16/bf16 or an
   infinite q8_0/q4_0 scale saturate instead.
   Low-bit: q4_1 q5_0 q5_1 tq1_0 tq2_0 likewise (EXACT_LOWBIT).
4. Quantization where the package cannot (q4_K, q5_K, q6_K): our blocks,
   dequantized by the PACKAGE, stay within the per-value bounds of
   docs/quant.md (re-derived here in float64). q8_K has no dequantizer in
   the package; tests/test_quant.c covers it.
5. The searched low-bit quantizers (iq4_nl iq4_xs q2_K q3_K): round trip on
   N(0, 1) rows through the package's dequantizer must beat plain min/max
   (max-magnitude) rounding written here in numpy and packed into the same
   format; zeros give zeros, constant rows come back within 2^-10, inf/NaN and
   1e30-scale inputs give finite blocks (for every low-bit quantizer).

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
         T.Q4_K: "q4_K", T.Q5_K: "q5_K", T.Q6_K: "q6_K", T.MXFP4: "mxfp4",
         T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q2_K: "q2_K", T.Q3_K: "q3_K",
         T.IQ4_NL: "iq4_nl", T.IQ4_XS: "iq4_xs", T.IQ2_XXS: "iq2_xxs", T.IQ2_XS: "iq2_xs",
         T.IQ2_S: "iq2_s", T.IQ3_XXS: "iq3_xxs", T.IQ3_S: "iq3_s", T.IQ1_S: "iq1_s",
         T.IQ1_M: "iq1_m", T.TQ1_0: "tq1_0", T.TQ2_0: "tq2_0"}

# The low-bit types: dequantized bit-exactly; (block size, offsets of their f16 scale fields).
# iq1_m keeps its f16 scale in the top nibbles of four u16 (see put_scale).
LOWBIT = {T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q2_K: (80, 82), T.Q3_K: (108,),
          T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,),
          T.IQ3_XXS: (0,), T.IQ3_S: (0,), T.IQ1_S: (0,), T.IQ1_M: ("iq1_m",), T.TQ1_0: (52,),
          T.TQ2_0: (64,)}


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


def report_equal(what, ours, ref, inputs=None, nan_any_sign=False):
    eq = same_bits(ours.astype(np.float32), ref.astype(np.float32).reshape(-1))
    if nan_any_sign:  # a NaN where the reference has one, whatever its sign and payload
        eq |= np.isnan(ours.astype(np.float32)) & np.isnan(ref.astype(np.float32).reshape(-1))
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


# ---------------------------------------------------------------- low-bit dequantization

def put_scale(b, qtype, halves):
    """Write f16 scale bit patterns (one per block and field: shape (nb,) or (nb, fields))."""
    halves = np.asarray(halves, dtype=np.uint16).reshape(b.shape[0], -1)
    for k, off in enumerate(LOWBIT[qtype]):
        h = halves[:, k % halves.shape[1]]
        if off == "iq1_m":  # nibble j of d is the top nibble of u16 scales[j] (byte 49 + 2j)
            for j in range(4):
                b[:, 49 + 2 * j] = (b[:, 49 + 2 * j] & 0x0F) | (((h >> (4 * j)) & 0xF) << 4).astype(np.uint8)
        else:
            b[:, off:off + 2] = h.astype(np.uint16).view(np.uint8).reshape(-1, 2)


def u16_bytes(v):
    return np.asarray(v, dtype=np.uint16).view(np.uint8)


def u32_bytes(v):
    return np.asarray(v, dtype=np.uint32).view(np.uint8)


def grid_blocks(qtype):
    """Blocks that use every grid index, every sign pattern, every sub-scale and both delta
    signs at least once (the rest of each block random). Returns (blocks, coverage text)."""
    ts = GGML_QUANT_SIZES[qtype][1]
    if qtype == T.IQ2_XXS:  # per 32 values: 4 index bytes, u32 of 4 x 7 sign bits | scale << 28
        nb = 32
        b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)
        k = np.arange(nb * 32)
        grp = np.arange(nb * 8)
        sg = [(4 * grp + l) % 128 for l in range(4)]
        aux1 = sg[0] | sg[1] << 7 | sg[2] << 14 | sg[3] << 21 | (grp % 16) << 28
        q = b[:, 2:].reshape(nb, 8, 8)
        q[:, :, :4] = (k % 256).reshape(nb, 8, 4)
        q[:, :, 4:] = u32_bytes(aux1).reshape(nb, 8, 4)
        return b, "256 indices, 128 signs, 16 scales"
    if qtype == T.IQ2_XS:  # u16: 9-bit index | 7 sign bits << 9
        nb = 16
        b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)
        k = np.arange(nb * 32)
        b[:, 2:66] = u16_bytes(k % 512 | ((k * 5) % 128) << 9).reshape(nb, 64)
        b[:, 66:74] = (np.arange(nb * 8) * 17 % 256).reshape(nb, 8)  # nibbles cycle 0..15
        return b, "512 indices, 128 signs, 16 scales"
    if qtype == T.IQ2_S:  # qs[32] low index bits, signs[32], qh[8] (2 bits each), scales[8]
        nb = 32
        b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)
        k = np.arange(nb * 32)
        idx = k % 1024
        b[:, 2:34] = (idx & 255).reshape(nb, 32)
        b[:, 34:66] = ((k * 3) % 256).reshape(nb, 32)
        hi = (idx >> 8).reshape(nb, 8, 4) << np.array([0, 2, 4, 6])
        b[:, 66:74] = hi.sum(axis=2)
        b[:, 74:82] = (np.arange(nb * 8) * 17 % 256).reshape(nb, 8)
        return b, "1024 indices, 256 sign bytes, 16 scales"
    if qtype == T.IQ3_XXS:  # qs[64] indices, then per 32 values u32 of 4 x 7 signs | scale << 28
        nb = 8
        b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)
        b[:, 2:66] = (np.arange(nb * 64) % 256).reshape(nb, 64)
        grp = np.arange(nb * 8)
        sg = [(4 * grp + l) % 128 for l in range(4)]
        aux = sg[0] | sg[1] << 7 | sg[2] << 14 | sg[3] << 21 | (grp % 16) << 28
        b[:, 66:98] = u32_bytes(aux).reshape(nb, 32)
        return b, "256 indices, 128 signs, 16 scales"
    if qtype == T.IQ3_S:  # qs[64] low index bits, qh[8], signs[32], scales[4]
        nb = 8
        b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)
        idx = np.arange(nb * 64) % 512
        b[:, 2:66] = (idx & 255).reshape(nb, 64)
        b[:, 66:74] = ((idx >> 8).reshape(nb, 8, 8) << np.arange(8)).sum(axis=2)
        b[:, 74:106] = (np.arange(nb * 32) % 256).reshape(nb, 32)
        b[:, 106:110] = (np.arange(nb * 4) * 17 % 256).reshape(nb, 4)
        return b, "512 indices, 256 sign bytes, 16 scales"
    if qtype == T.IQ1_S:  # qs[32] low index bits; u16 qh per 32: 4 x 3 index bits, scale, delta
        nb = 64
        b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)
        idx = np.arange(nb * 32) % 2048
        b[:, 2:34] = (idx & 255).reshape(nb, 32)
        grp = np.arange(nb * 8)
        hi = ((idx >> 8).reshape(nb * 8, 4) << np.array([0, 3, 6, 9])).sum(axis=1)
        qh = hi | (grp % 8) << 12 | ((grp // 8) % 2) << 15
        b[:, 34:50] = u16_bytes(qh).reshape(nb, 16)
        return b, "2048 indices, 8 scales, both delta signs"
    if qtype == T.IQ1_M:  # qs[32]; qh[16]: nibble per 8 values = 3 index bits | delta << 3
        nb = 64
        b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)
        k = np.arange(nb * 32)
        idx = k % 2048
        b[:, 0:32] = (idx & 255).reshape(nb, 32)
        nib = (idx >> 8) | ((k // 2048 + k) % 2) << 3
        b[:, 32:48] = (nib.reshape(nb, 16, 2) << np.array([0, 4])).sum(axis=2)
        sc = (np.arange(nb * 16) % 8).reshape(nb, 4, 4) << np.array([0, 3, 6, 9])
        b[:, 48:56] = u16_bytes(sc.sum(axis=2)).reshape(nb, 8)
        return b, "2048 indices, 8 scales, both delta signs"
    raise ValueError(qtype)


SPECIAL_HALVES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF,
                           0x3C00, 0xBC00, 0x3555], dtype=np.uint16)
NONFINITE_HALVES = np.array([0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7FFF, 0xFFFF], dtype=np.uint16)


def compare_dequant(qtype, what, blocks):
    ours = tool("dequant", qtype, blocks.reshape(-1))
    with np.errstate(all="ignore"):  # inf * 0 and NaN scales give NaN on both sides
        ref = quants.dequantize(blocks, qtype).reshape(-1)
    # Finite values bit for bit. NaN scales: a NaN wherever numpy has one; its sign and
    # payload are not values, and gcc -O3 may fold a product by -1.0f into a negation.
    report_equal(what, ours, ref, nan_any_sign=True)


def test_dequant_lowbit():
    for qtype in LOWBIT:
        name = NAMES[qtype]
        ts = GGML_QUANT_SIZES[qtype][1]
        nfields = len(LOWBIT[qtype])
        # (a) random bytes, scale fields finite halves across the whole range
        nb = 20000 if GGML_QUANT_SIZES[qtype][0] == 32 else 4000
        b = RNG.integers(0, 256, (nb, ts), dtype=np.uint8)
        put_scale(b, qtype, finite_halves(nb * nfields).reshape(nb, nfields))
        compare_dequant(qtype, f"dequant {name} {nb} random blocks", b)
        # (b) adversarial: special scales x codes all-0x00 / all-0xFF / random
        sp = np.array(np.meshgrid(*[SPECIAL_HALVES] * nfields)).reshape(nfields, -1).T
        blocks = []
        for fill in (0x00, 0xFF, None):
            b = (RNG.integers(0, 256, (sp.shape[0], ts), dtype=np.uint8) if fill is None
                 else np.full((sp.shape[0], ts), fill, dtype=np.uint8))
            put_scale(b, qtype, sp)
            blocks.append(b)
        compare_dequant(qtype, f"dequant {name} special scales (zero, subnormal, max, negative)"
                               f" x codes 0x00/0xFF/random", np.concatenate(blocks))
        # all-0x00 and all-0xFF blocks as they are (0xFF scales are NaN halves)
        compare_dequant(qtype, f"dequant {name} all-0x00 blocks", np.zeros((4, ts), np.uint8))
        compare_dequant(qtype, f"dequant {name} all-0xFF blocks (NaN scale)",
                        np.full((4, ts), 0xFF, np.uint8))
        # non-finite scales (inf, -inf, quiet and signalling NaNs) on random codes
        nf = np.array(np.meshgrid(*[np.concatenate([NONFINITE_HALVES, [0x3C00, 0x0000]])]
                                  * nfields)).reshape(nfields, -1).T
        b = RNG.integers(0, 256, (nf.shape[0] * 8, ts), dtype=np.uint8)
        put_scale(b, qtype, np.repeat(nf, 8, axis=0))
        compare_dequant(qtype, f"dequant {name} inf/NaN scales", b)
        # the grid types: every index, sign pattern, sub-scale and delta sign
        if qtype in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M):
            b, what = grid_blocks(qtype)
            put_scale(b, qtype, finite_halves(b.shape[0]))
            compare_dequant(qtype, f"dequant {name} grid coverage ({what})", b)


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


# ---------------------------------------------------------------- low-bit quantization

# q4_1 q5_0 q5_1 tq1_0 tq2_0: the package quantizes them; ours must match it bit for bit
# where ggml's math stays finite: (block size, validity of a block of float64 values).
def _affine_ok(nmax):
    def ok(x):
        r = x.max(axis=1) - x.min(axis=1)
        return (r / nmax <= 65504) & (np.abs(x.min(axis=1)) <= 65504) & ((r == 0) | (r >= 2.0 ** -100))
    return ok


def _absmax_ok(limit):
    def ok(x):
        a = np.abs(x).max(axis=1)
        return (a <= limit) & ((a == 0) | (a >= 2.0 ** -100))
    return ok


EXACT_LOWBIT = {T.Q4_1: (32, _affine_ok(15)), T.Q5_0: (32, _absmax_ok(16 * 65504.0)),
                T.Q5_1: (32, _affine_ok(31)), T.TQ1_0: (256, _absmax_ok(65504.0)),
                T.TQ2_0: (256, _absmax_ok(65504.0))}
SEARCHED_LOWBIT = (T.IQ4_NL, T.IQ4_XS, T.Q2_K, T.Q3_K)


def ternary_ties(n):
    """Rows whose x / max|x| hit 0, +-0.5 (ties), +-1 and their float neighbours."""
    v = RNG.choice(np.array([0, 0.5, -0.5, 1, -1, 0.25, 0.75, -0.75], np.float32), n)
    v = np.where(RNG.random(n) < 0.2, np.nextafter(v, np.float32(2) * RNG.choice([-1, 1], n)), v)
    v = v.reshape(-1, 256)
    v[:, 0] = 1.0  # the block's max|x| is exactly 1 times the scale
    return (v * np.repeat(10.0 ** RNG.uniform(-3, 3, v.shape[0]), 256).reshape(v.shape)).reshape(-1)


def test_quant_lowbit_exact(data):
    data = dict(data)
    data["ternary ties"] = ternary_ties(256 * 256).astype(np.float32)
    for qtype, (bs, valid_of) in EXACT_LOWBIT.items():
        for name, x in data.items():
            ts = GGML_QUANT_SIZES[qtype][1]
            ours = tool("quant", qtype, x).reshape(-1, ts)
            with np.errstate(all="ignore"):
                ref = quants.quantize(x, qtype).reshape(ours.shape)
            valid = valid_of(x.astype(np.float64).reshape(-1, bs))
            bad = np.flatnonzero(valid & ~np.all(ours == ref, axis=1))
            check(bad.size == 0, f"quant {NAMES[qtype]} == gguf.quants.quantize on {name}: "
                                 f"{valid.sum()}/{valid.size} blocks compared, {bad.size} differ")


def _f16(v):
    with np.errstate(all="ignore"):
        return np.asarray(v, np.float32).astype(np.float16)


def _div0(a, b):
    with np.errstate(all="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0)


def _signed_absmax(x):
    return np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)[..., 0]


def _pack2(q):
    """256 two-bit codes per block -> 64 bytes (byte 32h + l: values 128h + 32j + l at bits 2j)."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8) << np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return np.bitwise_or.reduce(q, axis=2).reshape(-1, 64)


KV = np.array(quants.IQ4_NL.kvalues, np.float32)


def _nearest_kv(t):
    return np.abs(t[..., None] - KV).argmin(axis=-1).astype(np.uint8)


def naive_encode(qtype, x):
    """Plain min/max (or max-magnitude) rounding in numpy, packed into real blocks: the
    bound our searched quantizers must beat (both dequantized by the package)."""
    if qtype == T.Q2_K:
        s = x.reshape(-1, 16, 16)
        mn = np.minimum(s.min(axis=2), 0)
        S, M = (s.max(axis=2) - mn) / 3, -mn
        d, dm = _f16(S.max(axis=1) / 15), _f16(M.max(axis=1) / 15)
        sc = np.clip(np.rint(_div0(S, d.astype(np.float32)[:, None])), 0, 15)
        m = np.clip(np.rint(_div0(M, dm.astype(np.float32)[:, None])), 0, 15)
        dl = d.astype(np.float32)[:, None] * sc
        ml = dm.astype(np.float32)[:, None] * m
        q = np.clip(np.rint(_div0(s + ml[:, :, None], dl[:, :, None])), 0, 3)
        return np.concatenate([(sc + 16 * m).astype(np.uint8), _pack2(q),
                               d.view(np.uint8).reshape(-1, 2), dm.view(np.uint8).reshape(-1, 2)], axis=1)
    if qtype == T.Q3_K:
        s = x.reshape(-1, 16, 16)
        S = _signed_absmax(s) / -4
        d = _f16(_signed_absmax(S) / -32)
        sc = np.clip(np.rint(_div0(S, d.astype(np.float32)[:, None])), -32, 31)
        dl = d.astype(np.float32)[:, None] * sc
        q = (np.clip(np.rint(_div0(s, dl[:, :, None])), -4, 3) + 4).astype(np.uint8).reshape(-1, 256)
        u = (sc + 32).astype(np.uint8)
        low = (u[:, :8] & 15) | ((u[:, 8:] & 15) << 4)
        high = np.bitwise_or.reduce((u.reshape(-1, 4, 4) >> 4) << np.array([0, 2, 4, 6], np.uint8)
                                    .reshape(1, 4, 1), axis=1)
        hmask = np.bitwise_or.reduce((q.reshape(-1, 8, 32) >> 2) << np.arange(8, dtype=np.uint8)
                                     .reshape(1, 8, 1), axis=1)
        return np.concatenate([hmask, _pack2(q & 3), low, high, d.view(np.uint8).reshape(-1, 2)], axis=1)
    if qtype == T.IQ4_NL:
        s = x.reshape(-1, 32)
        d = _f16(_signed_absmax(s) / -127)
        c = _nearest_kv(_div0(s, d.astype(np.float32)[:, None]))
        return np.concatenate([d.view(np.uint8).reshape(-1, 2), c[:, :16] | (c[:, 16:] << 4)], axis=1)
    if qtype == T.IQ4_XS:
        s = x.reshape(-1, 8, 32)
        S = _signed_absmax(s) / -127
        d = _f16(_signed_absmax(S) / -32)
        ls = np.clip(np.rint(_div0(S, d.astype(np.float32)[:, None])), -32, 31)
        dl = d.astype(np.float32)[:, None] * ls
        c = _nearest_kv(_div0(s, dl[:, :, None]))
        u = (ls + 32).astype(np.uint16)
        sh = np.bitwise_or.reduce((u >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=1).astype(np.uint16)
        sl = ((u[:, 0::2] & 15) | ((u[:, 1::2] & 15) << 4)).astype(np.uint8)
        qs = (c[:, :, :16] | (c[:, :, 16:] << 4)).reshape(-1, 128)
        return np.concatenate([d.view(np.uint8).reshape(-1, 2), sh.view(np.uint8).reshape(-1, 2), sl, qs],
                              axis=1)
    raise ValueError(qtype)


def rel_rmse(x, y):
    x = x.astype(np.float64)
    return float(np.sqrt(np.mean((x - y.astype(np.float64).reshape(-1)) ** 2) / np.mean(x ** 2)))


def test_quant_lowbit_searched():
    """Round trip through the package's dequantizer on N(0, 1) rows of 4096: our searched
    scales must beat naive min/max rounding packed into the same format."""
    x = RNG.standard_normal(4096 * 64).astype(np.float32)
    for qtype in SEARCHED_LOWBIT:
        ours = rel_rmse(x, quants.dequantize(tool("quant", qtype, x), qtype))
        with np.errstate(all="ignore"):
            naive = rel_rmse(x, quants.dequantize(naive_encode(qtype, x), qtype))
        check(ours < naive, f"{NAMES[qtype]} on N(0,1): rmse/rms {ours:.5f} below naive "
                            f"min/max rounding's {naive:.5f}")


def test_quant_lowbit_properties():
    for qtype in list(EXACT_LOWBIT) + list(SEARCHED_LOWBIT):
        name = NAMES[qtype]
        n = 256 * 8
        y = quants.dequantize(tool("quant", qtype, np.zeros(n, np.float32)), qtype)
        check(bool(np.all(y == 0)), f"quant {name}: zeros dequantize to zeros")
        # a constant row is one scale times one code: it comes back within the f16
        # rounding of the scale(s), for constants whose scales are normal halves
        # (iq4_xs stores c / (32 * 127): c = 1e-3 gives a subnormal half, 2^-24 steps)
        worst = 0.0
        for c in (0.7, -3.25, -0.3, 1000.0):
            y = quants.dequantize(tool("quant", qtype, np.full(n, c, np.float32)), qtype)
            worst = max(worst, float(np.max(np.abs(y.astype(np.float64) - np.float32(c)) / abs(c))))
        check(worst <= 2.0 ** -10, f"quant {name}: constant rows come back within 2^-10 "
                                   f"relative (worst {worst:.2e})")
        # non-finite and huge inputs give finite blocks (scales saturate, NaN codes clamp)
        x = (RNG.standard_normal(n) * 1e30).astype(np.float32)
        x[::97] = np.inf
        x[5::89] = -np.inf
        x[7::61] = np.nan
        with np.errstate(all="ignore"):
            y = quants.dequantize(tool("quant", qtype, x), qtype)
        check(bool(np.all(np.isfinite(y))), f"quant {name} of 1e30-scale data with inf/NaN: finite")


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
    test_dequant_lowbit()
    data = datasets()
    test_quant_exact(data)
    test_quant_bounds(data)
    test_quant_lowbit_exact(data)
    test_quant_lowbit_searched()
    test_quant_lowbit_properties()
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
