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

IQ_INLINE uint64_t iq_u64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
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

#if defined(__x86_64__)
#include <immintrin.h>

#define IQ_AVX2_INLINE TM_AVX2 static inline __attribute__((always_inline))

/* c * d of the block (see cpu_gemm_ref_iq.c). */
IQ_AVX2_INLINE float iq_block_scale(tm_type t, const void *blk) {
    switch (t) {
    case TM_TYPE_IQ3_XXS:
        return _cvtsh_ss(((const tm_block_iq3_xxs *)blk)->d) * 0.25f;
    case TM_TYPE_IQ3_S:
        return _cvtsh_ss(((const tm_block_iq3_s *)blk)->d);
    case TM_TYPE_IQ1_M: {
        const uint8_t *sc = ((const tm_block_iq1_m *)blk)->scales;
        const uint16_t s0 = iq_u16(sc), s1 = iq_u16(sc + 2), s2 = iq_u16(sc + 4),
                       s3 = iq_u16(sc + 6);
        const tm_half d =
            (tm_half)((s0 >> 12) | (s1 >> 8 & 0xF0) | (s2 >> 4 & 0xF00) | (s3 & 0xF000));
        return _cvtsh_ss(d) * 0.125f;
    }
    default: /* iq2_xxs, iq2_xs, iq2_s and iq1_s start with d */
        return _cvtsh_ss(((const tm_block_iq2_xxs *)blk)->d) * 0.125f;
    }
}

/* Two table entries of 8 bytes as one 128-bit vector (loads, one shuffle). */
IQ_AVX2_INLINE __m128i iq_load2x64(const uint64_t *grid, unsigned i0, unsigned i1) {
    return _mm_castpd_si128(
        _mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)(grid + i0))),
                     (const double *)(grid + i1)));
}

/* Four entries of 4 bytes (iq3_xxs: byte indices). */
IQ_AVX2_INLINE __m128i iq_load4x32(const uint32_t *grid, const uint8_t *idx) {
    __m128i v = _mm_cvtsi32_si128((int)grid[idx[0]]);
    v = _mm_insert_epi32(v, (int)grid[idx[1]], 1);
    v = _mm_insert_epi32(v, (int)grid[idx[2]], 2);
    return _mm_insert_epi32(v, (int)grid[idx[3]], 3);
}

/* iq2_xs, iq2_s, iq3_s, iq1_s, iq1_m: the block's grid indices (32, iq3_s 64),
 * computed 16 at a time in vectors: each word's high bits come from a byte or
 * u16 spread to the words that need it (one byte shuffle) and moved into place
 * by a multiply (a shift per word). */
IQ_AVX2_INLINE void iq_block_idx_vec(tm_type t, const void *blk, uint16_t *idx) {
    if (t == TM_TYPE_IQ2_XS) { /* the low 9 bits of each u16 */
        const uint16_t *qs = ((const tm_block_iq2_xs *)blk)->qs;
        for (int h = 0; h < 2; h++)
            _mm256_storeu_si256((__m256i *)(idx + 16 * h),
                                _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(qs + 16 * h)),
                                                 _mm256_set1_epi16(511)));
        return;
    }
    if (t == TM_TYPE_IQ3_S) { /* bit n % 8 of qh[n / 8] is bit 8 of index n */
        const tm_block_iq3_s *b = blk;
        const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)b->qh));
        const __m256i mul =
            _mm256_setr_epi16(256, 128, 64, 32, 16, 8, 4, 2, 256, 128, 64, 32, 16, 8, 4, 2);
        for (int c = 0; c < 4; c++) { /* indices 16c..16c+15: groups 2c and 2c + 1 */
            const char g0 = (char)(2 * c), g1 = (char)(2 * c + 1), z = (char)0x80;
            const __m256i h = _mm256_shuffle_epi8(
                qh, _mm256_setr_epi8(g0, z, g0, z, g0, z, g0, z, g0, z, g0, z, g0, z, g0, z, g1, z,
                                     g1, z, g1, z, g1, z, g1, z, g1, z, g1, z, g1, z));
            const __m256i lo =
                _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b->qs + 16 * c)));
            _mm256_storeu_si256((__m256i *)(idx + 16 * c),
                                _mm256_or_si256(lo, _mm256_and_si256(_mm256_mullo_epi16(h, mul),
                                                                     _mm256_set1_epi16(0x100))));
        }
        return;
    }
    /* iq2_s (a qh byte per group, 2 bits an index), iq1_s / iq1_m (a u16 per group, 3 bits) */
    const uint8_t *qs = t == TM_TYPE_IQ2_S   ? ((const tm_block_iq2_s *)blk)->qs
                        : t == TM_TYPE_IQ1_S ? ((const tm_block_iq1_s *)blk)->qs
                                             : ((const tm_block_iq1_m *)blk)->qs;
    const void *qhp = t == TM_TYPE_IQ2_S   ? (const void *)((const tm_block_iq2_s *)blk)->qh
                      : t == TM_TYPE_IQ1_S ? (const void *)((const tm_block_iq1_s *)blk)->qh
                                           : (const void *)((const tm_block_iq1_m *)blk)->qh;
    const __m256i qh = t == TM_TYPE_IQ2_S
                           ? _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)qhp))
                           : _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qhp));
    /* index k of a group: iq2_s (qh << (8 - 2k)) & 0x300; iq1_s (qh >> 3k & 7) << 8,
     * iq1_m (qh >> 4k & 7) << 8, k = 3 through the high half of the product */
    const __m256i mul =
        t == TM_TYPE_IQ2_S
            ? _mm256_setr_epi16(256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4)
        : t == TM_TYPE_IQ1_S
            ? _mm256_setr_epi16(256, 32, 4, 0, 256, 32, 4, 0, 256, 32, 4, 0, 256, 32, 4, 0)
            : _mm256_setr_epi16(256, 16, 1, 0, 256, 16, 1, 0, 256, 16, 1, 0, 256, 16, 1, 0);
    const __m256i mulhi = _mm256_setr_epi16(
        0, 0, 0, t == TM_TYPE_IQ1_S ? -32768 : 4096, 0, 0, 0, t == TM_TYPE_IQ1_S ? -32768 : 4096, 0,
        0, 0, t == TM_TYPE_IQ1_S ? -32768 : 4096, 0, 0, 0, t == TM_TYPE_IQ1_S ? -32768 : 4096);
    const __m256i keep = _mm256_set1_epi16(t == TM_TYPE_IQ2_S ? 0x300 : 0x700);
    for (int h = 0; h < 2; h++) { /* indices 16h..16h+15: groups 4h..4h+3, 4 each */
        __m256i pick;
        if (t == TM_TYPE_IQ2_S) {
            const char a = (char)(4 * h), z = (char)0x80;
            pick = _mm256_setr_epi8(a, z, a, z, a, z, a, z, a + 1, z, a + 1, z, a + 1, z, a + 1, z,
                                    a + 2, z, a + 2, z, a + 2, z, a + 2, z, a + 3, z, a + 3, z,
                                    a + 3, z, a + 3, z);
        } else {
            const char a = (char)(8 * h);
            pick = _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a + 2, a + 3, a + 2,
                                    a + 3, a + 2, a + 3, a + 2, a + 3, a + 4, a + 5, a + 4, a + 5,
                                    a + 4, a + 5, a + 4, a + 5, a + 6, a + 7, a + 6, a + 7, a + 6,
                                    a + 7, a + 6, a + 7);
        }
        const __m256i q = _mm256_shuffle_epi8(qh, pick);
        __m256i hb = _mm256_mullo_epi16(q, mul);
        if (t != TM_TYPE_IQ2_S) hb = _mm256_or_si256(hb, _mm256_mulhi_epu16(q, mulhi));
        const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16 * h)));
        _mm256_storeu_si256((__m256i *)(idx + 16 * h),
                            _mm256_or_si256(lo, _mm256_and_si256(hb, keep)));
    }
}

/* The same, kept in memory: without the barrier the compiler would take each
 * index out of the vectors with a vpextrw (two uops) rather than a load. */
IQ_AVX2_INLINE void iq_block_idx(tm_type t, const void *blk, uint16_t idx[64]) {
    iq_block_idx_vec(t, blk, idx);
    __asm__("" : "+m"(*(uint16_t(*)[64])idx));
}

/* The same from u16 indices (iq3_s). */
IQ_AVX2_INLINE __m128i iq_load4x32_16(const uint32_t *grid, const uint16_t *idx) {
    __m128i v = _mm_cvtsi32_si128((int)grid[idx[0]]);
    v = _mm_insert_epi32(v, (int)grid[idx[1]], 1);
    v = _mm_insert_epi32(v, (int)grid[idx[2]], 2);
    return _mm_insert_epi32(v, (int)grid[idx[3]], 3);
}

/* The group's 32 grid bytes (values 32g..32g+31): magnitudes for iq2/iq3,
 * for iq1 the unsigned 8 (g + 1) + 2 of cpu_iq1_grid_u; idx from iq_block_idx (unused for iq2_xxs / iq3_xxs,
 * whose indices are bytes of the block). */
IQ_AVX2_INLINE __m256i iq_group_grid(tm_type t, const void *blk, const uint16_t *idx, int g) {
    __m128i lo, hi;
    switch (t) {
    case TM_TYPE_IQ2_XXS: {
        const uint8_t *q = (const uint8_t *)(((const tm_block_iq2_xxs *)blk)->qs + 4 * g);
        lo = iq_load2x64(quant_grid_iq2_xxs, q[0], q[1]);
        hi = iq_load2x64(quant_grid_iq2_xxs, q[2], q[3]);
        break;
    }
    case TM_TYPE_IQ3_XXS: {
        const uint8_t *qs = ((const tm_block_iq3_xxs *)blk)->qs + 8 * g;
        lo = iq_load4x32(quant_grid_iq3_xxs, qs);
        hi = iq_load4x32(quant_grid_iq3_xxs, qs + 4);
        break;
    }
    case TM_TYPE_IQ3_S:
        lo = iq_load4x32_16(quant_grid_iq3_s, idx + 8 * g);
        hi = iq_load4x32_16(quant_grid_iq3_s, idx + 8 * g + 4);
        break;
    default: {
        const uint64_t *grid = t == TM_TYPE_IQ2_XS  ? quant_grid_iq2_xs
                               : t == TM_TYPE_IQ2_S ? quant_grid_iq2_s
                                                    : cpu_iq1_grid_u;
        lo = iq_load2x64(grid, idx[4 * g], idx[4 * g + 1]);
        hi = iq_load2x64(grid, idx[4 * g + 2], idx[4 * g + 3]);
        break;
    }
    }
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* Sign bytes from 7-bit fields (bit 7 clear): bit 7 := parity of bits 0..6,
 * so every byte has an even count of set bits (quant_ksigns_iq2's rule). The
 * 16-bit shifts carry bits across bytes only into bits 4..7, which the fold
 * never reads back into bit 0. */
IQ_AVX2_INLINE __m256i iq_signs_parity(__m256i s) {
    __m256i p = _mm256_xor_si256(s, _mm256_srli_epi16(s, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 1));
    return _mm256_or_si256(s, _mm256_slli_epi16(_mm256_and_si256(p, _mm256_set1_epi8(1)), 7));
}

/* iq2_xxs/iq3_xxs: the 4 x 7 sign bits of each dword of a (one group each) as bytes. */
IQ_AVX2_INLINE __m256i iq_signs_from_aux(__m256i a) {
    __m256i s = _mm256_and_si256(a, _mm256_set1_epi32(0x7F));
    s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(a, 1), _mm256_set1_epi32(0x7F00)));
    s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(a, 2), _mm256_set1_epi32(0x7F0000)));
    s = _mm256_or_si256(s,
                        _mm256_and_si256(_mm256_slli_epi32(a, 3), _mm256_set1_epi32(0x7F000000)));
    return iq_signs_parity(s);
}

/* iq2_xxs/iq3_xxs: the 8 groups' sign-and-scale dwords (4 x 7 sign bits, scale atop). */
IQ_AVX2_INLINE __m256i iq_xxs_aux(tm_type t, const void *blk) {
    if (t == TM_TYPE_IQ3_XXS)
        return _mm256_loadu_si256((const __m256i *)(((const tm_block_iq3_xxs *)blk)->qs + 64));
    /* iq2_xxs: the second dword of each group's pair */
    const uint16_t *qs = ((const tm_block_iq2_xxs *)blk)->qs;
    const __m256 lo = _mm256_loadu_ps((const float *)qs),
                 hi = _mm256_loadu_ps((const float *)(qs + 16));
    const __m256 odd =
        _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)); /* g0 g1 g4 g5 | g2 g3 g6 g7 */
    return _mm256_permute4x64_epi64(_mm256_castps_si256(odd), _MM_SHUFFLE(3, 1, 2, 0));
}

/* iq2/iq3: the block's 32 sign bytes (byte e: values 8e..8e+7, bit set = negative). */
IQ_AVX2_INLINE __m256i iq_block_signs(tm_type t, const void *blk) {
    switch (t) {
    case TM_TYPE_IQ2_XXS:
    case TM_TYPE_IQ3_XXS:
        return iq_signs_from_aux(iq_xxs_aux(t, blk));
    case TM_TYPE_IQ2_XS: { /* 7 sign bits atop each u16 */
        const uint16_t *qs = ((const tm_block_iq2_xs *)blk)->qs;
        const __m256i a = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)qs), 9);
        const __m256i b = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(qs + 16)), 9);
        return iq_signs_parity(
            _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), _MM_SHUFFLE(3, 1, 2, 0)));
    }
    case TM_TYPE_IQ2_S:
        return _mm256_loadu_si256((const __m256i *)(((const tm_block_iq2_s *)blk)->qs + 32));
    default: /* iq3_s */
        return _mm256_loadu_si256((const __m256i *)((const tm_block_iq3_s *)blk)->signs);
    }
}

/* The block's 16 multipliers 2 s + 1 as int16 (word j: values 16j..16j+15). */
IQ_AVX2_INLINE __m256i iq_block_mults(tm_type t, const void *blk) {
    __m256i s; /* the scales s, one a word */
    switch (t) {
    case TM_TYPE_IQ2_XXS:
    case TM_TYPE_IQ3_XXS: { /* the top 4 bits of each group's sign dword, for both its halves */
        const __m256i n = _mm256_srli_epi32(iq_xxs_aux(t, blk), 28);
        s = _mm256_or_si256(n, _mm256_slli_epi32(n, 16));
        break;
    }
    case TM_TYPE_IQ2_XS:
    case TM_TYPE_IQ2_S: { /* a nibble per 16 values, low nibble first */
        const uint8_t *sc = t == TM_TYPE_IQ2_XS ? ((const tm_block_iq2_xs *)blk)->scales
                                                : ((const tm_block_iq2_s *)blk)->scales;
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc));
        s = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(15)),
                            _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0xF0)), 12));
        break;
    }
    case TM_TYPE_IQ3_S: { /* a nibble per 32 values */
        const __m256i n = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32((int)iq_u32(((const tm_block_iq3_s *)blk)->scales)),
                              _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
            _mm256_set1_epi32(15));
        s = _mm256_or_si256(n, _mm256_slli_epi32(n, 16));
        break;
    }
    case TM_TYPE_IQ1_S: { /* bits 12..14 of each group's qh, for both its halves */
        const __m256i q = _mm256_cvtepu16_epi32(
            _mm_loadu_si128((const __m128i *)((const tm_block_iq1_s *)blk)->qh));
        const __m256i n = _mm256_and_si256(_mm256_srli_epi32(q, 12), _mm256_set1_epi32(7));
        s = _mm256_or_si256(n, _mm256_slli_epi32(n, 16));
        break;
    }
    default: { /* iq1_m: 3 bits each, 4 to a u16 (the top nibble is d's) */
        /* dword i holds u16 i/2: word 2i is its field 2 (i % 2), word 2i+1 the next */
        const char z = (char)0x80;
        const __m256i u = _mm256_shuffle_epi8(
            _mm256_set1_epi64x((long long)iq_u64(((const tm_block_iq1_m *)blk)->scales)),
            _mm256_setr_epi8(0, 1, z, z, 0, 1, z, z, 2, 3, z, z, 2, 3, z, z, 4, 5, z, z, 4, 5, z, z,
                             6, 7, z, z, 6, 7, z, z));
        const __m256i lo = _mm256_srlv_epi32(u, _mm256_setr_epi32(0, 6, 0, 6, 0, 6, 0, 6));
        const __m256i hi = _mm256_srlv_epi32(u, _mm256_setr_epi32(3, 9, 3, 9, 3, 9, 3, 9));
        s = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(7)),
                            _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(7)), 16));
        break;
    }
    }
    return _mm256_or_si256(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1));
}

/* iq1: the weights in the unsigned form u = 8 g + delta + 9 = 8 (g + 1) + 2 - dd, in
 * 0..18 (8 (g + 1) + 2 from cpu_iq1_grid_u; dd = 2 where delta is -1, else 0, by
 * byte from iq1_block_delta): the kernels multiply u with x and take the 9 back
 * out per 16 values through the activations' bsums. */
/* iq1: byte r is dd of run r (values 8r..8r+7): 2 where its delta is -1, else 0.
 * The delta sign is iq1_s bit 15 of each group's qh u16, iq1_m bit 3 of each
 * run's qh nibble. */
IQ_AVX2_INLINE __m256i iq1_block_delta(tm_type t, const void *blk) {
    if (t == TM_TYPE_IQ1_S) { /* word g: 2 or 0; then each group's byte to its 4 runs */
        const __m256i w = _mm256_and_si256(
            _mm256_srli_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128(
                                  (const __m128i *)((const tm_block_iq1_s *)blk)->qh)),
                              14),
            _mm256_set1_epi16(2));
        return _mm256_shuffle_epi8(w, _mm256_setr_epi8(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6,
                                                       6, 8, 8, 8, 8, 10, 10, 10, 10, 12, 12, 12,
                                                       12, 14, 14, 14, 14));
    }
    /* iq1_m: word i from qh byte i, whose nibbles are runs 2i and 2i + 1 */
    const __m256i w =
        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)((const tm_block_iq1_m *)blk)->qh));
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(w, 2), _mm256_set1_epi16(2));
    const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(w, 2), _mm256_set1_epi16(0x200));
    return _mm256_or_si256(lo, hi);
}

/* iq1: -9 sum_j m_j bsum_j, the offset of the unsigned form, as 8 int32 lanes. */
IQ_AVX2_INLINE __m256i iq1_block_start(__m256i mults, const tm_block_q8_k *x) {
    const __m256i mb = _mm256_madd_epi16(mults, _mm256_loadu_si256((const __m256i *)x->bsums));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_add_epi32(_mm256_slli_epi32(mb, 3), mb));
}
#endif

#endif
