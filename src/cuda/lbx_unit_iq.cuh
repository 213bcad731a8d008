/* The grid i-quants' unpackers to 8-bit values (lbx_unit.cuh's contract):
 * iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m. A unit is 32 values = 4
 * groups of 8 (one iq2/iq1 grid entry, two iq3 entries); group g gives q[2g]
 * (its values 0-3) and q[2g + 1] (values 4-7), and both halves' d are the
 * reference dequantizer's scale in its float order (dequant_lowbit.cuh), so
 * d[h] * q equals its value bit for bit:
 *   iq2_*    q = ±grid, d = (d * (0.5 + s)) * 0.25     (the sign flips exactly)
 *   iq3_xxs  q = ±grid, d = (d * (0.5 + s)) * 0.5
 *   iq3_s    q = ±grid, d = d * (1 + 2s)
 *   iq1_*    q = 8g ± 1, d = (d * (2s + 1)) * 0.125    (d * (g ± 1/8) with g + delta and
 *            the product both exact in float: the same real number, rounded once)
 * m is 0 (no MIN).
 *
 * Speed: one lane unpacks one unit in every decode step, so everything is
 * word-wide. Fields are read as aligned 4-byte words funnel-shifted by the
 * block's misalignment (blocks of 2 mod 4 bytes are 2-byte aligned; iq1_m's
 * are 4-byte aligned and read as plain words), the last 2 bytes of a field as
 * a u16 (tm_lbx_ld8: never a byte past the field). A grid entry is
 * 8 (or 4) magnitudes in bytes; its signs are applied 4 at a time: sign bit i
 * of a nibble goes to the top of byte i by one multiply, PRMT's sign mode
 * widens it to a 0x00/0xff byte mask, and the masked bytes take -g from
 * 0x01010100 - g (exact per byte: every magnitude is 1..62, so each byte
 * borrows exactly the 1 its neighbour gives). The 7-bit sign fields of
 * iq2_xxs, iq2_xs and iq3_xxs get their 8th bit (even parity, the ksigns
 * table) by POPC. iq1's entries come from a table of PRMT selectors derived
 * from its grid at compile time (4 bytes an entry instead of 8; one PRMT
 * gives 4 values 8g ± 1). Small integers become floats as 2^23 + n - 2^23 (a
 * LOP and an FADD rather than the quarter-rate I2F). */
#ifndef TM_CUDA_LBX_UNIT_IQ_CUH
#define TM_CUDA_LBX_UNIT_IQ_CUH

#include "cuda/lbx_unit.cuh"

/* ---- loads (read-only path): p 2-byte aligned ---- */

static __device__ __forceinline__ uint32_t tm_lbx_ld2(const uint8_t *p) {
    return __ldg((const unsigned short *)p);
}

/* n < 2^23 as a float, exactly */
static __device__ __forceinline__ float tm_lbx_i2f(uint32_t n) {
    return __uint_as_float(0x4b000000u | n) - 8388608.0f;
}

/* The aligned word holding p and the shift that brings p's byte to the bottom:
 * bytes [p + 4i, p + 4i + 4) are __funnelshift_r(w[i], w[i + 1], s). */
struct tm_lbx_aligned {
    const uint32_t *w;
    uint32_t s;
};
static __device__ __forceinline__ tm_lbx_aligned tm_lbx_at(const uint8_t *p) {
    const uintptr_t a = (uintptr_t)p;
    return {(const uint32_t *)(a & ~(uintptr_t)3), ((uint32_t)a & 2u) * 8u};
}

/* Bytes [p, p + 4) (reads [p - 2, p + 4)). */
static __device__ __forceinline__ uint32_t tm_lbx_ld4(const uint8_t *p) {
    const tm_lbx_aligned a = tm_lbx_at(p);
    return __funnelshift_r(__ldg(a.w), tm_lbx_ld2(p + 2), a.s);
}

/* Bytes [p, p + 8) (reads [p - 2, p + 8)). */
static __device__ __forceinline__ void tm_lbx_ld8(const uint8_t *p, uint32_t &v0, uint32_t &v1) {
    const tm_lbx_aligned a = tm_lbx_at(p);
    const uint32_t x1 = __ldg(a.w + 1);
    v0 = __funnelshift_r(__ldg(a.w), x1, a.s);
    v1 = __funnelshift_r(x1, tm_lbx_ld2(p + 6), a.s);
}

/* ---- signs ---- */

/* Magnitudes g (bytes 1..127) with byte i negated where the top bit of byte i
 * of t is set. */
static __device__ __forceinline__ uint32_t tm_lbx_neg4(uint32_t g, uint32_t t) {
    const uint32_t m = tm_prmt(t, 0u, 0xba98u); /* 0xff where t's byte is negative */
    return g ^ ((g ^ (0x01010100u - g)) & m);
}

/* ... where bit i (i < 4) of n is set; n may have bits 4-6 set too: bit j of n
 * goes to bits j + 7 + 7k (k < 4), only j = k lands on a byte's top bit, and
 * no two of those positions collide, so nothing carries. */
static __device__ __forceinline__ uint32_t tm_lbx_sign4(uint32_t g, uint32_t n) {
    return tm_lbx_neg4(g, n * 0x10204080u);
}

/* A group of 8 with 8 sign bits s (bits 8+ clear). */
static __device__ __forceinline__ void tm_lbx_sign8(int *q, uint64_t g, uint32_t s) {
    q[0] = (int)tm_lbx_sign4((uint32_t)g, s & 0x7fu);
    q[1] = (int)tm_lbx_sign4((uint32_t)(g >> 32), s >> 4);
}

/* The same with 7 sign bits f (bits 7+ clear): the 8th makes the count even.
 * For the high 4 values, f * 0x01020408 takes bits 4-6 to bytes 0-2's top
 * bits (bit j to j + 3 + 7k: again no collisions, nothing on bit 31) and the
 * parity is added as bit 31. */
static __device__ __forceinline__ void tm_lbx_sign7(int *q, uint64_t g, uint32_t f) {
    q[0] = (int)tm_lbx_sign4((uint32_t)g, f);
    q[1] = (int)tm_lbx_neg4((uint32_t)(g >> 32), f * 0x01020408u + ((uint32_t)__popc(f) << 31));
}

/* What every type here shares: 256-value blocks, no offsets. */
template <int B> struct tm_lbx_grid {
    static constexpr int BS = 256, BYTES = B;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void scales(tm_lbx_unit &w, float d0, float d1) {
        w.d[0] = d0, w.d[1] = d1, w.m[0] = w.m[1] = 0.0f;
    }
};

/* s + 0.5 (s < 2^22) exactly, as 0.5f + (float)s */
static __device__ __forceinline__ float tm_lbx_half(uint32_t s) {
    return __uint_as_float(0x4b000000u | s) - 8388607.5f;
}

/* iq2's scale (d * (0.5 + s)) * 0.25 */
static __device__ __forceinline__ float tm_lbx_iq2_d(float d, uint32_t s) {
    return __fmul_rn(__fmul_rn(d, tm_lbx_half(s)), 0.25f);
}

/* iq2_xxs: per unit 4 grid index bytes, then 4 x 7 sign bits and the scale. */
template <> struct tm_lbx<TM_TYPE_IQ2_XXS> : tm_lbx_grid<66> {
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *b, int j) {
        uint32_t idx, aux;
        tm_lbx_ld8(b + 2 + 8 * j, idx, aux);
        const float d = tm_lbx_iq2_d(tm_lb_f16(tm_lbx_ld2(b)), aux >> 28);
        scales(w, d, d);
#pragma unroll
        for (int g = 0; g < 4; g++)
            tm_lbx_sign7(w.q + 2 * g, tm_grid::quant_grid_iq2_xxs[(idx >> (8 * g)) & 0xffu],
                         (aux >> (7 * g)) & 0x7fu);
    }
};

/* iq2_xs: per 8 values a u16 (9-bit index | 7 sign bits << 9); a scale byte
 * per unit (a nibble per half). */
template <> struct tm_lbx<TM_TYPE_IQ2_XS> : tm_lbx_grid<74> {
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *b, int j) {
        uint32_t v[2];
        tm_lbx_ld8(b + 2 + 8 * j, v[0], v[1]);
        const float d = tm_lb_f16(tm_lbx_ld2(b));
        const uint32_t sc = __ldg(b + 66 + j);
        scales(w, tm_lbx_iq2_d(d, sc & 0x0fu), tm_lbx_iq2_d(d, sc >> 4));
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t u = v[g >> 1] >> (16 * (g & 1)); /* bits 16+: the next entry */
            tm_lbx_sign7(w.q + 2 * g, tm_grid::quant_grid_iq2_xs[u & 0x1ffu], (u >> 9) & 0x7fu);
        }
    }
};

/* iq2_s: per unit 4 low index bytes at 2 + 4j, 4 sign bytes at 34 + 4j, the
 * top index bits (2 a group) at 66 + j, the scales at 74 + j. */
template <> struct tm_lbx<TM_TYPE_IQ2_S> : tm_lbx_grid<82> {
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *b, int j) {
        const uint32_t lo = tm_lbx_ld4(b + 2 + 4 * j), sg = tm_lbx_ld4(b + 34 + 4 * j);
        const uint32_t qh = __ldg(b + 66 + j), sc = __ldg(b + 74 + j);
        const float d = tm_lb_f16(tm_lbx_ld2(b));
        scales(w, tm_lbx_iq2_d(d, sc & 0x0fu), tm_lbx_iq2_d(d, sc >> 4));
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t idx = ((lo >> (8 * g)) & 0xffu) | (((qh >> (2 * g)) & 3u) << 8);
            tm_lbx_sign8(w.q + 2 * g, tm_grid::quant_grid_iq2_s[idx], (sg >> (8 * g)) & 0xffu);
        }
    }
};

/* iq3_xxs: per unit 8 index bytes at 2 + 8j (an entry of 4 values each), and
 * at 66 + 4j 4 x 7 sign bits and the scale. */
template <> struct tm_lbx<TM_TYPE_IQ3_XXS> : tm_lbx_grid<98> {
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *b, int j) {
        uint32_t v[2];
        tm_lbx_ld8(b + 2 + 8 * j, v[0], v[1]);
        const uint32_t aux = tm_lbx_ld4(b + 66 + 4 * j);
        const float d =
            __fmul_rn(__fmul_rn(tm_lb_f16(tm_lbx_ld2(b)), tm_lbx_half(aux >> 28)), 0.5f);
        scales(w, d, d);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t e = v[g >> 1] >> (16 * (g & 1));
            const uint64_t gr = tm_grid::quant_grid_iq3_xxs[e & 0xffu] |
                                (uint64_t)tm_grid::quant_grid_iq3_xxs[(e >> 8) & 0xffu] << 32;
            tm_lbx_sign7(w.q + 2 * g, gr, (aux >> (7 * g)) & 0x7fu);
        }
    }
};

/* iq3_s: per unit 8 low index bytes at 2 + 8j, their 9th bits at 66 + j, 4
 * sign bytes at 74 + 4j, the scale nibble j % 2 of byte 106 + j / 2. */
template <> struct tm_lbx<TM_TYPE_IQ3_S> : tm_lbx_grid<110> {
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *b, int j) {
        uint32_t v[2];
        tm_lbx_ld8(b + 2 + 8 * j, v[0], v[1]);
        const uint32_t qh = __ldg(b + 66 + j), sg = tm_lbx_ld4(b + 74 + 4 * j);
        const uint32_t s = (__ldg(b + 106 + (j >> 1)) >> (4 * (j & 1))) & 0x0fu;
        const float d = __fmul_rn(tm_lb_f16(tm_lbx_ld2(b)), tm_lbx_i2f(2u * s + 1u));
        scales(w, d, d);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t e = v[g >> 1] >> (16 * (g & 1)), h = qh >> (2 * g);
            const uint64_t gr =
                tm_grid::quant_grid_iq3_s[(e & 0xffu) | ((h & 1u) << 8)] |
                (uint64_t)tm_grid::quant_grid_iq3_s[((e >> 8) & 0xffu) | ((h & 2u) << 7)] << 32;
            tm_lbx_sign8(w.q + 2 * g, gr, (sg >> (8 * g)) & 0xffu);
        }
    }
};

/* iq1's grid as PRMT selectors: nibble k of entry i is byte k of
 * quant_grid_iq1_s[i] & 3 (0, 1, or 3 for -1), so __byte_perm of a word
 * holding the values for g = 0, 1 and -1 in bytes 0, 1 and 3 gives 4 values
 * at once: half the table's bytes and 3 instructions a group. Derived at
 * compile time from the same generated grid text (quant_grids.c), here read
 * as constexpr tables. */
namespace tm_lbx_src {
#define uint64_t constexpr uint64_t
#define uint32_t constexpr uint32_t
#define uint8_t  constexpr uint8_t
#define int8_t   constexpr int8_t
#include "quant/quant_grids.c"
#undef uint64_t
#undef uint32_t
#undef uint8_t
#undef int8_t
} // namespace tm_lbx_src

struct tm_lbx_iq1_table {
    uint32_t sel[2048];
};
static constexpr tm_lbx_iq1_table tm_lbx_iq1_table_make() {
    tm_lbx_iq1_table t{};
    for (int i = 0; i < 2048; i++)
        for (int k = 0; k < 8; k++)
            t.sel[i] |= (uint32_t)((tm_lbx_src::quant_grid_iq1_s[i] >> (8 * k)) & 3u) << (4 * k);
    return t;
}
static __device__ const tm_lbx_iq1_table tm_lbx_iq1_sel = tm_lbx_iq1_table_make();

/* The bytes 8g + 1 (g = 0, 1, -1 in bytes 0, 1, 3), or 8g - 1 where neg. */
#define TM_LBX_IQ1_POS 0xf9000901u
#define TM_LBX_IQ1_NEG 0xf70007ffu

static __device__ __forceinline__ void tm_lbx_iq1_group(int *q, uint32_t idx, uint32_t vals) {
    const uint32_t sel = tm_lbx_iq1_sel.sel[idx];
    q[0] = (int)__byte_perm(vals, 0u, sel);
    q[1] = (int)__byte_perm(vals, 0u, sel >> 16);
}

/* iq1_s: per unit 4 low index bytes at 2 + 4j and the u16 at 34 + 2j: 3 top
 * index bits a group, the scale (bits 12-14), the delta's sign (bit 15). */
template <> struct tm_lbx<TM_TYPE_IQ1_S> : tm_lbx_grid<50> {
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *b, int j) {
        const uint32_t lo = tm_lbx_ld4(b + 2 + 4 * j), qh = tm_lbx_ld2(b + 34 + 2 * j);
        const float dl = __fmul_rn(tm_lb_f16(tm_lbx_ld2(b)), tm_lbx_i2f(((qh >> 11) & 0x0eu) | 1u));
        scales(w, __fmul_rn(dl, 0.125f), __fmul_rn(dl, 0.125f));
        const uint32_t vals = qh & 0x8000u ? TM_LBX_IQ1_NEG : TM_LBX_IQ1_POS;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t idx = ((lo >> (8 * g)) & 0xffu) | (((qh >> (3 * g)) & 7u) << 8);
            tm_lbx_iq1_group(w.q + 2 * g, idx, vals);
        }
    }
};

/* iq1_m: per unit 4 low index bytes at 4j, at 32 + 2j a nibble a group (3 top
 * index bits, the delta's sign), 3-bit scales per half in the u16 at
 * 48 + 2 (j / 2); the block's f16 scale is the top nibbles of the 4 u16 at 48.
 * 56-byte blocks: rows of this type are 4-byte aligned (cuda_mmvq_q8x_ok), so
 * its words are plain aligned loads. */
template <> struct tm_lbx<TM_TYPE_IQ1_M> : tm_lbx_grid<56> {
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *b, int j) {
        const uint32_t *bw = (const uint32_t *)b;
        const uint32_t lo = __ldg(bw + j), qh = tm_lbx_ld2(b + 32 + 2 * j);
        const uint32_t s0 = __ldg(bw + 12), s1 = __ldg(bw + 13);
        const float d = tm_lb_f16(((s0 >> 12) & 0x000fu) | ((s0 >> 24) & 0x00f0u) |
                                  ((s1 >> 4) & 0x0f00u) | ((s1 >> 16) & 0xf000u));
        const uint32_t sc = tm_lbx_ld2(b + 48 + 2 * (j >> 1)) >> (6 * (j & 1));
        scales(w, __fmul_rn(__fmul_rn(d, tm_lbx_i2f(((sc << 1) & 0x0eu) | 1u)), 0.125f),
               __fmul_rn(__fmul_rn(d, tm_lbx_i2f(((sc >> 2) & 0x0eu) | 1u)), 0.125f));
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint32_t nib = qh >> (4 * g);
            const uint32_t idx = ((lo >> (8 * g)) & 0xffu) | ((nib & 7u) << 8);
            tm_lbx_iq1_group(w.q + 2 * g, idx, nib & 8u ? TM_LBX_IQ1_NEG : TM_LBX_IQ1_POS);
        }
    }
};

#endif
