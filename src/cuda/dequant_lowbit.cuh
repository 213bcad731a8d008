/* Decoders of the low-bit weight types on the GPU: values j .. j+7 of a row
 * (j % 8 == 0) as the f32 values quant_row_dequantize gives, for
 *   q4_1 q5_0 q5_1 iq4_nl      32-value blocks
 *   q2_K q3_K iq4_xs iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m tq1_0 tq2_0
 *                              256-value blocks
 * Used by tm_dq8_f16 (dequant.cuh: rounded to f16 for the prompt GEMMs and
 * the fused expert kernels) and by the generic decode rows of mmvq.cuh (an
 * f32 dot with the activations). 8 consecutive values never cross a scale's
 * group (the smallest, q2_K/q3_K/iq2_xs/iq2_s/iq1_m, is 16 values) nor a grid
 * entry's (8 values; iq3's entries are 4).
 *
 * The float operations are those of the reference dequantizers (the gguf
 * package's numpy code, which src/quant's C dequantizers match bit for bit)
 * in the same order, with __fmul_rn / __fadd_rn / __fsub_rn so nvcc cannot
 * contract d*q + m into an FMA:
 *   q4_1 q5_1  d*q + m            q5_0 tq1_0 tq2_0  d*q
 *   q2_K       (d*sc)*q - dmin*m  q3_K iq4_xs       (d*sc)*q
 *   iq4_nl     d*kvalue           iq2_*             ((d*(0.5+s))*0.25)*g, sign
 *   iq3_xxs    ((d*(0.5+s))*0.5)*g, sign            iq3_s  (d*(1+2s))*g, sign
 *   iq1_s iq1_m  (d*(2s+1))*(g + delta)
 * Every field is read byte by byte: blocks have odd sizes (66, 110 bytes...)
 * and the fused expert kernels decode from shared memory at any offset. */
#ifndef TM_CUDA_DEQUANT_LOWBIT_CUH
#define TM_CUDA_DEQUANT_LOWBIT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/cuda_common.cuh" /* tm_ld_f16 */
#include "cuda/quant_grids_dev.cuh"
#include "quant/quant.h"

/* The low-bit types these decoders handle, for switches: X(type, block values) */
#define TM_LOWBIT_TYPES(X)                                                                         \
    X(TM_TYPE_Q4_1, 32)                                                                            \
    X(TM_TYPE_Q5_0, 32)                                                                            \
    X(TM_TYPE_Q5_1, 32)                                                                            \
    X(TM_TYPE_IQ4_NL, 32)                                                                          \
    X(TM_TYPE_Q2_K, 256)                                                                           \
    X(TM_TYPE_Q3_K, 256)                                                                           \
    X(TM_TYPE_IQ4_XS, 256)                                                                         \
    X(TM_TYPE_IQ2_XXS, 256)                                                                        \
    X(TM_TYPE_IQ2_XS, 256)                                                                         \
    X(TM_TYPE_IQ2_S, 256)                                                                          \
    X(TM_TYPE_IQ3_XXS, 256)                                                                        \
    X(TM_TYPE_IQ3_S, 256)                                                                          \
    X(TM_TYPE_IQ1_S, 256)                                                                          \
    X(TM_TYPE_IQ1_M, 256)                                                                          \
    X(TM_TYPE_TQ1_0, 256)                                                                          \
    X(TM_TYPE_TQ2_0, 256)

/* ---- byte-wise loads ---- */

static __device__ __forceinline__ uint32_t tm_lb_u16(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}

static __device__ __forceinline__ uint32_t tm_lb_u32(const uint8_t *p) {
    return tm_lb_u16(p) | (tm_lb_u16(p + 2) << 16);
}

static __device__ __forceinline__ float tm_lb_f16(uint32_t bits) {
    return __half2float(__ushort_as_half((unsigned short)bits));
}

/* Byte i of a grid entry (value i of the lattice point). */
static __device__ __forceinline__ uint32_t tm_lb_gbyte(uint64_t g, int i) {
    return (uint32_t)(g >> (8 * i)) & 0xffu;
}

/* ---- per-type decoders: bp is the block, off = j % block (off % 8 == 0) ---- */

template <int TYPE> struct tm_lb;

/* Legacy 32-value blocks: low nibbles are values 0..15, high nibbles 16..31;
 * q5's fifth bit of value i is bit i of the little-endian u32 qh. */
template <int TYPE> struct tm_lb_legacy {
    static constexpr bool MIN = TYPE == TM_TYPE_Q4_1 || TYPE == TM_TYPE_Q5_1;
    static constexpr bool Q5 = TYPE != TM_TYPE_Q4_1;
    static constexpr int BYTES = TYPE == TM_TYPE_Q4_1 ? 20 : TYPE == TM_TYPE_Q5_0 ? 22 : 24;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const float d = tm_ld_f16(bp);
        const float m = MIN ? tm_ld_f16(bp + 2) : 0.0f;
        const uint8_t *qh = bp + (MIN ? 4 : 2), *qs = bp + BYTES - 16;
        const uint32_t h = Q5 ? tm_lb_u32(qh) >> off : 0u;
        const int hi = off >> 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t b = qs[(off & 15) + i];
            int n = (int)(hi ? b >> 4 : b & 0x0fu);
            if (Q5) n |= (int)((h >> i) & 1u) << 4;
            if (MIN)
                v[i] = __fadd_rn(__fmul_rn(d, (float)n), m);
            else
                v[i] = __fmul_rn(d, (float)(Q5 ? n - 16 : n));
        }
    }
};
template <> struct tm_lb<TM_TYPE_Q4_1> : tm_lb_legacy<TM_TYPE_Q4_1> {};
template <> struct tm_lb<TM_TYPE_Q5_0> : tm_lb_legacy<TM_TYPE_Q5_0> {};
template <> struct tm_lb<TM_TYPE_Q5_1> : tm_lb_legacy<TM_TYPE_Q5_1> {};

/* iq4_nl: q4_0's layout, codes index the non-linear table. */
template <> struct tm_lb<TM_TYPE_IQ4_NL> {
    static constexpr int BYTES = 18;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const float d = tm_ld_f16(bp);
        const uint8_t *qs = bp + 2 + (off & 15);
        const int hi = off >> 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t n = hi ? qs[i] >> 4 : qs[i] & 0x0fu;
            v[i] = __fmul_rn(d, (float)tm_grid::quant_iq4nl_values[n]);
        }
    }
};

/* The 2-bit planes of q2_K, q3_K and tq2_0: value off + i (h = off/128,
 * s = off/32 % 4, l = off % 32) is bits 2s..2s+1 of qs[32h + l + i]. */
static __device__ __forceinline__ uint32_t tm_lb_q2(const uint8_t *qs, int off, int i) {
    return (qs[32 * (off >> 7) + (off & 31) + i] >> (2 * ((off >> 5) & 3))) & 3u;
}

/* q2_K: scales[16] (scale low nibble, min high), qs[64], d, dmin. */
template <> struct tm_lb<TM_TYPE_Q2_K> {
    static constexpr int BYTES = 84;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const uint32_t sc = bp[off >> 4];
        const float dl = __fmul_rn(tm_ld_f16(bp + 80), (float)(sc & 0x0fu));
        const float ml = __fmul_rn(tm_ld_f16(bp + 82), (float)(sc >> 4));
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = __fsub_rn(__fmul_rn(dl, (float)tm_lb_q2(bp + 16, off, i)), ml);
    }
};

/* q3_K: hmask[32] (bit off/32 of hmask[off % 32]: the value is not offset by
 * -4), qs[64], 12 bytes of 6-bit scales, d. Scale j (16 values): low nibble
 * from byte j % 8 (high nibble for j >= 8), top 2 bits from byte 8 + j % 4 at
 * bit 2 (j / 4); offset 32. */
template <> struct tm_lb<TM_TYPE_Q3_K> {
    static constexpr int BYTES = 110;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const int j = off >> 4;
        const uint8_t *sc = bp + 96;
        const uint32_t lo = (sc[j & 7] >> (4 * (j >> 3))) & 0x0fu;
        const uint32_t hi = (sc[8 + (j & 3)] >> (2 * (j >> 2))) & 3u;
        const float dl = __fmul_rn(tm_ld_f16(bp + 108), (float)((int)(lo | hi << 4) - 32));
        const uint8_t *hm = bp + (off & 31);
        const int bit = off >> 5;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = (int)tm_lb_q2(bp + 32, off, i) - ((hm[i] >> bit) & 1 ? 0 : 4);
            v[i] = __fmul_rn(dl, (float)q);
        }
    }
};

/* iq4_xs: d, scales_h (u16: 2 bits per 32 values), scales_l[4] (4 bits), then
 * 8 runs of 16 qs bytes as iq4_nl blocks. */
template <> struct tm_lb<TM_TYPE_IQ4_XS> {
    static constexpr int BYTES = 136;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const int ib = off >> 5, o = off & 31;
        const uint32_t ls = ((bp[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0x0fu) |
                            (((tm_lb_u16(bp + 2) >> (2 * ib)) & 3u) << 4);
        const float dl = __fmul_rn(tm_ld_f16(bp), (float)((int)ls - 32));
        const uint8_t *qs = bp + 8 + 16 * ib + (o & 15);
        const int hi = o >> 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t n = hi ? qs[i] >> 4 : qs[i] & 0x0fu;
            v[i] = __fmul_rn(dl, (float)tm_grid::quant_iq4nl_values[n]);
        }
    }
};

/* A grid group of 8 values: db * g[i], negated where bit i of `signs` is set. */
static __device__ __forceinline__ void tm_lb_grid8(float db, uint64_t g, uint32_t signs, float *v) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float a = __fmul_rn(db, (float)tm_lb_gbyte(g, i));
        v[i] = (signs >> i) & 1u ? -a : a;
    }
}

/* iq2's scale: (d * (0.5 + s)) * 0.25 */
static __device__ __forceinline__ float tm_lb_iq2_db(float d, uint32_t s) {
    return __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, (float)s)), 0.25f);
}

/* iq2_xxs: d, then per 32 values two u32: 4 grid indices (bytes of the
 * first); 4 x 7 sign bits (ksigns) and the scale (top nibble) in the second. */
template <> struct tm_lb<TM_TYPE_IQ2_XXS> {
    static constexpr int BYTES = 66;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const uint8_t *q = bp + 2 + 8 * (off >> 5);
        const int g = (off >> 3) & 3;
        const uint32_t aux = tm_lb_u32(q + 4);
        const float db = tm_lb_iq2_db(tm_ld_f16(bp), aux >> 28);
        tm_lb_grid8(db, tm_grid::quant_grid_iq2_xxs[q[g]],
                    tm_grid::quant_ksigns_iq2[(aux >> (7 * g)) & 127u], v);
    }
};

/* iq2_xs: d, u16 per 8 values (9-bit index | 7 sign bits << 9), 4-bit scales
 * per 16 values. */
template <> struct tm_lb<TM_TYPE_IQ2_XS> {
    static constexpr int BYTES = 74;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const uint32_t q = tm_lb_u16(bp + 2 + 2 * (off >> 3));
        const int si = off >> 4;
        const float db =
            tm_lb_iq2_db(tm_ld_f16(bp), (bp[66 + (si >> 1)] >> (4 * (si & 1))) & 0x0fu);
        tm_lb_grid8(db, tm_grid::quant_grid_iq2_xs[q & 511u], tm_grid::quant_ksigns_iq2[q >> 9], v);
    }
};

/* iq2_s: d, qs[32] (low 8 index bits per 8 values), signs[32], qh[8] (top 2
 * bits of 4 indices a byte), 4-bit scales per 16 values. */
template <> struct tm_lb<TM_TYPE_IQ2_S> {
    static constexpr int BYTES = 82;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const int g = off >> 3, si = off >> 4;
        const uint32_t idx = bp[2 + g] | (((bp[66 + (g >> 2)] >> (2 * (g & 3))) & 3u) << 8);
        const float db =
            tm_lb_iq2_db(tm_ld_f16(bp), (bp[74 + (si >> 1)] >> (4 * (si & 1))) & 0x0fu);
        tm_lb_grid8(db, tm_grid::quant_grid_iq2_s[idx], bp[34 + g], v);
    }
};

/* Two 4-value iq3 grid entries as one 8-value group. */
static __device__ __forceinline__ uint64_t tm_lb_grid44(uint32_t a, uint32_t b) {
    return (uint64_t)a | ((uint64_t)b << 32);
}

/* iq3_xxs: d, qs[64] (a grid index per 4 values), then per 32 values a u32 of
 * 4 x 7 sign bits (ksigns) and the scale (top nibble); db = (d*(0.5+s))*0.5. */
template <> struct tm_lb<TM_TYPE_IQ3_XXS> {
    static constexpr int BYTES = 98;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const uint32_t aux = tm_lb_u32(bp + 66 + 4 * (off >> 5));
        const float db =
            __fmul_rn(__fmul_rn(tm_ld_f16(bp), __fadd_rn(0.5f, (float)(aux >> 28))), 0.5f);
        const uint8_t *qs = bp + 2 + (off >> 2);
        const uint64_t g =
            tm_lb_grid44(tm_grid::quant_grid_iq3_xxs[qs[0]], tm_grid::quant_grid_iq3_xxs[qs[1]]);
        tm_lb_grid8(db, g, tm_grid::quant_ksigns_iq2[(aux >> (7 * ((off >> 3) & 3))) & 127u], v);
    }
};

/* iq3_s: d, qs[64] (low 8 bits of an index per 4 values), qh[8] (9th bits),
 * signs[32] (a bit a value), 4-bit scales per 32 values; db = d*(1+2s). */
template <> struct tm_lb<TM_TYPE_IQ3_S> {
    static constexpr int BYTES = 110;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const int ib = off >> 5, e = off >> 2; /* e, e + 1: the two grid entries */
        const uint32_t s = (bp[106 + (ib >> 1)] >> (4 * (ib & 1))) & 0x0fu;
        const float db = __fmul_rn(tm_ld_f16(bp), (float)(1u + 2u * s));
        const uint32_t h = bp[66 + (e >> 3)] >> (e & 7); /* e is even: e, e + 1 in one byte */
        const uint64_t g = tm_lb_grid44(tm_grid::quant_grid_iq3_s[bp[2 + e] | ((h & 1u) << 8)],
                                        tm_grid::quant_grid_iq3_s[bp[3 + e] | ((h & 2u) << 7)]);
        tm_lb_grid8(db, g, bp[74 + (off >> 3)], v);
    }
};

/* iq1: (dl * (g + delta)) for the 8 signed grid values of g. */
static __device__ __forceinline__ void tm_lb_iq1(float dl, uint64_t g, float delta, float *v) {
#pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = __fmul_rn(dl, __fadd_rn((float)(int8_t)tm_lb_gbyte(g, i), delta));
}

/* iq1_s: d, qs[32] (low 8 bits of an 11-bit index per 8 values), qh u16 per
 * 32 values: 3 index bits per 8 values, the scale (bits 12-14), the delta's
 * sign (bit 15). */
template <> struct tm_lb<TM_TYPE_IQ1_S> {
    static constexpr int BYTES = 50;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const int g = off >> 3;
        const uint32_t qh = tm_lb_u16(bp + 34 + 2 * (off >> 5));
        const float dl = __fmul_rn(tm_ld_f16(bp), (float)(2u * ((qh >> 12) & 7u) + 1u));
        const uint32_t idx = bp[2 + g] | (((qh >> (3 * (g & 3))) & 7u) << 8);
        tm_lb_iq1(dl, tm_grid::quant_grid_iq1_s[idx], qh & 0x8000u ? -TM_IQ1_DELTA : TM_IQ1_DELTA,
                  v);
    }
};

/* iq1_m: qs[32], qh[16] (a nibble per 8 values: 3 index bits, the delta's
 * sign), scales (4 u16: 3-bit scales per 16 values; their top nibbles are
 * the f16 block scale, lowest first). */
template <> struct tm_lb<TM_TYPE_IQ1_M> {
    static constexpr int BYTES = 56;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const uint8_t *sc = bp + 48;
        const uint32_t dbits = (tm_lb_u16(sc) >> 12) | ((tm_lb_u16(sc + 2) >> 8) & 0x00f0u) |
                               ((tm_lb_u16(sc + 4) >> 4) & 0x0f00u) | (tm_lb_u16(sc + 6) & 0xf000u);
        const int g = off >> 3, si = off >> 4;
        const uint32_t s = (tm_lb_u16(sc + 2 * (si >> 2)) >> (3 * (si & 3))) & 7u;
        const float dl = __fmul_rn(tm_lb_f16(dbits), (float)(2u * s + 1u));
        const uint32_t qh = bp[32 + (g >> 1)] >> (4 * (g & 1));
        const uint32_t idx = bp[g] | ((qh & 7u) << 8);
        tm_lb_iq1(dl, tm_grid::quant_grid_iq1_s[idx], qh & 8u ? -TM_IQ1_DELTA : TM_IQ1_DELTA, v);
    }
};

/* tq1_0: qs[48], qh[4], d. Value v's base-3 digit: byte qs[v % 32] times 3^(v/32)
 * for v < 160, qs[32 + (v-160) % 16] times 3^((v-160)/16) below 240, else
 * qh[(v-240) % 4] times 3^((v-240)/4), each product modulo 256; the digit is
 * (byte * 3) >> 8, minus 1. */
template <> struct tm_lb<TM_TYPE_TQ1_0> {
    static constexpr int BYTES = 54;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const float d = tm_ld_f16(bp + 52);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int x = off + i;
            uint32_t b, p;
            if (x < 160)
                b = bp[x & 31], p = (uint32_t)(x >> 5);
            else if (x < 240)
                b = bp[32 + ((x - 160) & 15)], p = (uint32_t)((x - 160) >> 4);
            else
                b = bp[48 + ((x - 240) & 3)], p = (uint32_t)((x - 240) >> 2);
            const uint32_t pw = p == 0 ? 1u : p == 1 ? 3u : p == 2 ? 9u : p == 3 ? 27u : 81u;
            const int q = (int)((((b * pw) & 0xffu) * 3u) >> 8) - 1;
            v[i] = __fmul_rn(d, (float)q);
        }
    }
};

/* tq2_0: qs[64] as q2_K's 2-bit planes holding code + 1, then d. */
template <> struct tm_lb<TM_TYPE_TQ2_0> {
    static constexpr int BYTES = 66;
    static __device__ __forceinline__ void dq8(const uint8_t *bp, int off, float *v) {
        const float d = tm_ld_f16(bp + 64);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn(d, (float)((int)tm_lb_q2(bp, off, i) - 1));
    }
};

/* Values j .. j+7 (j % 8 == 0) of a row of low-bit type TYPE. */
template <int TYPE, int BS>
static __device__ __forceinline__ void tm_lb_dq8(const uint8_t *row, int64_t j, float *v) {
    tm_lb<TYPE>::dq8(row + (j / BS) * tm_lb<TYPE>::BYTES, (int)(j % BS), v);
}

/* The same for a type known at run time; false (v untouched) if not a low-bit type. */
static __device__ __forceinline__ bool tm_lb_dq8_any(int type, const uint8_t *row, int64_t j,
                                                     float *v) {
    switch (type) {
#define TM_LB_CASE(T, BS)                                                                          \
    case T:                                                                                        \
        tm_lb_dq8<T, BS>(row, j, v);                                                               \
        return true;
        TM_LOWBIT_TYPES(TM_LB_CASE)
#undef TM_LB_CASE
    default:
        return false;
    }
}

#endif
