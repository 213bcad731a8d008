/* Scalar unpacking of one group (32 values) of a grid i-quant block, shared
 * by the SIMD kernel files (cpu_gemm_iq_avx2.c, cpu_gemm_iq_avx512.c). The
 * scalar reference (cpu_gemm_ref_iq.c) documents the integer form these
 * produce: weights w = magnitude * sign (iq2/iq3) or 8 g + delta (iq1), one
 * odd multiplier 2 s + 1 per 16 values, and the block factor c * d.
 * Every function is always_inline with a constant type, so the switches fold. */
#ifndef TM_CPU_CPU_GEMM_IQ_H
#define TM_CPU_CPU_GEMM_IQ_H

#include "cpu/cpu_internal.h"
#include "quant/quant_grids.h"

#define IQ_INLINE static inline __attribute__((always_inline))

/* X(name, type) for each type: the kernel files' names and getters. */
#define IQ_TYPES(X)                                                                                \
    X(iq2xxs, TM_TYPE_IQ2_XXS)                                                                     \
    X(iq2xs, TM_TYPE_IQ2_XS)                                                                       \
    X(iq2s, TM_TYPE_IQ2_S)                                                                         \
    X(iq3xxs, TM_TYPE_IQ3_XXS)                                                                     \
    X(iq3s, TM_TYPE_IQ3_S)                                                                         \
    X(iq1s, TM_TYPE_IQ1_S)                                                                         \
    X(iq1m, TM_TYPE_IQ1_M)
#define IQ_GET_CASE(name, type)                                                                    \
    case type:                                                                                     \
        return name##_auto;

IQ_INLINE uint32_t iq_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

IQ_INLINE uint16_t iq_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

IQ_INLINE size_t iq_block_bytes(tm_type t) {
    switch (t) {
    case TM_TYPE_IQ2_XXS:
        return sizeof(tm_block_iq2_xxs);
    case TM_TYPE_IQ2_XS:
        return sizeof(tm_block_iq2_xs);
    case TM_TYPE_IQ2_S:
        return sizeof(tm_block_iq2_s);
    case TM_TYPE_IQ3_XXS:
        return sizeof(tm_block_iq3_xxs);
    case TM_TYPE_IQ3_S:
        return sizeof(tm_block_iq3_s);
    case TM_TYPE_IQ1_S:
        return sizeof(tm_block_iq1_s);
    default:
        return sizeof(tm_block_iq1_m);
    }
}

/* c * d of the block (see cpu_gemm_ref_iq.c). */
IQ_INLINE float iq_block_scale(tm_type t, const void *blk) {
    switch (t) {
    case TM_TYPE_IQ3_XXS:
        return quant_f16_to_f32(((const tm_block_iq3_xxs *)blk)->d) * 0.25f;
    case TM_TYPE_IQ3_S:
        return quant_f16_to_f32(((const tm_block_iq3_s *)blk)->d);
    case TM_TYPE_IQ1_M: {
        const uint8_t *sc = ((const tm_block_iq1_m *)blk)->scales;
        const uint16_t s0 = iq_u16(sc), s1 = iq_u16(sc + 2), s2 = iq_u16(sc + 4),
                       s3 = iq_u16(sc + 6);
        const tm_half d =
            (tm_half)((s0 >> 12) | (s1 >> 8 & 0xF0) | (s2 >> 4 & 0xF00) | (s3 & 0xF000));
        return quant_f16_to_f32(d) * 0.125f;
    }
    default: /* iq2_xxs, iq2_xs, iq2_s and iq1_s start with d */
        return quant_f16_to_f32(((const tm_block_iq2_xxs *)blk)->d) * 0.125f;
    }
}

/* The group's 32 grid bytes as 4 little-endian u64 (values 8e..8e+7 in e[e]):
 * magnitudes for iq2/iq3, int8 -1/0/1 for iq1. */
IQ_INLINE void iq_grid(tm_type t, const void *blk, int g, uint64_t e[4]) {
    switch (t) {
    case TM_TYPE_IQ2_XXS: {
        const uint8_t *idx = (const uint8_t *)(((const tm_block_iq2_xxs *)blk)->qs + 4 * g);
        for (int k = 0; k < 4; k++) e[k] = quant_grid_iq2_xxs[idx[k]];
        break;
    }
    case TM_TYPE_IQ2_XS: {
        const uint16_t *qs = ((const tm_block_iq2_xs *)blk)->qs + 4 * g;
        for (int k = 0; k < 4; k++) e[k] = quant_grid_iq2_xs[qs[k] & 511];
        break;
    }
    case TM_TYPE_IQ2_S: {
        const tm_block_iq2_s *b = blk;
        const unsigned qh = b->qh[g];
        for (int k = 0; k < 4; k++)
            e[k] = quant_grid_iq2_s[b->qs[4 * g + k] | (qh << (8 - 2 * k) & 0x300)];
        break;
    }
    case TM_TYPE_IQ3_XXS: {
        const uint8_t *qs = ((const tm_block_iq3_xxs *)blk)->qs + 8 * g;
        for (int k = 0; k < 4; k++)
            e[k] = quant_grid_iq3_xxs[qs[2 * k]] | (uint64_t)quant_grid_iq3_xxs[qs[2 * k + 1]]
                                                       << 32;
        break;
    }
    case TM_TYPE_IQ3_S: {
        const tm_block_iq3_s *b = blk;
        const unsigned qh = b->qh[g];
        const uint8_t *qs = b->qs + 8 * g;
        for (int k = 0; k < 4; k++)
            e[k] = quant_grid_iq3_s[qs[2 * k] | (qh << (8 - 2 * k) & 0x100)] |
                   (uint64_t)quant_grid_iq3_s[qs[2 * k + 1] | (qh << (7 - 2 * k) & 0x100)] << 32;
        break;
    }
    case TM_TYPE_IQ1_S: {
        const tm_block_iq1_s *b = blk;
        const unsigned qh = b->qh[g];
        for (int k = 0; k < 4; k++)
            e[k] = quant_grid_iq1_s[b->qs[4 * g + k] | (qh >> 3 * k & 7) << 8];
        break;
    }
    default: { /* iq1_m */
        const tm_block_iq1_m *b = blk;
        const unsigned qh = iq_u16(b->qh + 2 * g);
        for (int k = 0; k < 4; k++)
            e[k] = quant_grid_iq1_s[b->qs[4 * g + k] | (qh >> 4 * k & 7) << 8];
        break;
    }
    }
}

/* iq2/iq3: the group's 4 sign bytes (byte e: values 8e..8e+7, bit set = negative). */
IQ_INLINE uint32_t iq_signs(tm_type t, const void *blk, int g) {
    uint32_t aux;
    switch (t) {
    case TM_TYPE_IQ2_XXS:
        aux = iq_u32(((const tm_block_iq2_xxs *)blk)->qs + 4 * g + 2);
        break;
    case TM_TYPE_IQ3_XXS:
        aux = iq_u32(((const tm_block_iq3_xxs *)blk)->qs + 64 + 4 * g);
        break;
    case TM_TYPE_IQ2_XS: {
        const uint16_t *qs = ((const tm_block_iq2_xs *)blk)->qs + 4 * g;
        return (uint32_t)quant_ksigns_iq2[qs[0] >> 9] |
               (uint32_t)quant_ksigns_iq2[qs[1] >> 9] << 8 |
               (uint32_t)quant_ksigns_iq2[qs[2] >> 9] << 16 |
               (uint32_t)quant_ksigns_iq2[qs[3] >> 9] << 24;
    }
    case TM_TYPE_IQ2_S:
        return iq_u32(((const tm_block_iq2_s *)blk)->qs + 32 + 4 * g);
    default: /* iq3_s */
        return iq_u32(((const tm_block_iq3_s *)blk)->signs + 4 * g);
    }
    return (uint32_t)quant_ksigns_iq2[aux & 127] | (uint32_t)quant_ksigns_iq2[aux >> 7 & 127] << 8 |
           (uint32_t)quant_ksigns_iq2[aux >> 14 & 127] << 16 |
           (uint32_t)quant_ksigns_iq2[aux >> 21 & 127] << 24;
}

/* iq1: the delta signs of the group's 4 runs of 8 as sign bytes (byte e: 0xFF
 * where run e has -delta, else 0), the form iq_signs gives for iq2/iq3. */
IQ_INLINE uint32_t iq1_delta_signs(tm_type t, const void *blk, int g) {
    if (t == TM_TYPE_IQ1_S) return ((const tm_block_iq1_s *)blk)->qh[g] & 0x8000 ? ~0u : 0u;
    const unsigned qh = iq_u16(((const tm_block_iq1_m *)blk)->qh + 2 * g);
    uint32_t s = 0;
    for (int k = 0; k < 4; k++) s |= qh >> (4 * k + 3) & 1 ? 0xFFu << 8 * k : 0u;
    return s;
}

/* Multipliers 2 s + 1 of the group's values 0..15 (*lo) and 16..31 (*hi). */
IQ_INLINE void iq_mults(tm_type t, const void *blk, int g, int *lo, int *hi) {
    unsigned s0, s1;
    switch (t) {
    case TM_TYPE_IQ2_XXS:
        s0 = s1 = iq_u32(((const tm_block_iq2_xxs *)blk)->qs + 4 * g + 2) >> 28;
        break;
    case TM_TYPE_IQ3_XXS:
        s0 = s1 = iq_u32(((const tm_block_iq3_xxs *)blk)->qs + 64 + 4 * g) >> 28;
        break;
    case TM_TYPE_IQ2_XS:
        s0 = ((const tm_block_iq2_xs *)blk)->scales[g] & 15;
        s1 = ((const tm_block_iq2_xs *)blk)->scales[g] >> 4;
        break;
    case TM_TYPE_IQ2_S:
        s0 = ((const tm_block_iq2_s *)blk)->scales[g] & 15;
        s1 = ((const tm_block_iq2_s *)blk)->scales[g] >> 4;
        break;
    case TM_TYPE_IQ3_S:
        s0 = s1 = ((const tm_block_iq3_s *)blk)->scales[g / 2] >> 4 * (g % 2) & 15;
        break;
    case TM_TYPE_IQ1_S:
        s0 = s1 = ((const tm_block_iq1_s *)blk)->qh[g] >> 12 & 7;
        break;
    default: { /* iq1_m: 3-bit scales, 4 per u16 */
        const unsigned w = iq_u16(((const tm_block_iq1_m *)blk)->scales + 2 * (g / 2));
        s0 = w >> 6 * (g % 2) & 7;
        s1 = w >> (6 * (g % 2) + 3) & 7;
        break;
    }
    }
    *lo = (int)(2 * s0 + 1);
    *hi = (int)(2 * s1 + 1);
}

#endif
