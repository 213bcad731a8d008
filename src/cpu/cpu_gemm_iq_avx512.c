/* AVX-512 (F, BW, VL, DQ, VNNI) kernels of the grid i-quants (iq2_xxs iq2_xs
 * iq2_s iq3_xxs iq3_s iq1_s iq1_m) with q8_K activations;
 * cpu_gemm_avx512_get reaches them.
 *
 * Per block and row, vector code unpacks once what covers all 256 values
 * (cpu_gemm_iq.h): the 32 sign bytes and the 16 multipliers 2 s + 1. Then
 * one vector holds two groups (64 values): the grid entries by loads straight
 * into vector lanes, as unsigned magnitudes m with the pair's 64 sign bits as
 * a mask register that negates the activations (vpsubb under the mask); iq1
 * as u = 8 g + delta + 9 in 0..18, whose offset 9 comes back out per 16
 * values through the activations' bsums. vpmaddubsw(m, +-x) gives int16 pairs
 * (|pair| <= 2 * 62 * 127 < 2^15) and vpdpwssd with the multipliers (one per
 * 16 values, a 128-bit lane each, placed by one vpermw) sums them in int32:
 * the block's integer sums are the scalar reference's exactly
 * (cpu_gemm_ref_iq.c). Each block's 16 int32 lanes are scaled by (d_w c) d_x
 * in float and accumulated, so only the float summation order differs from
 * the reference. Decode (one token) runs 4-row tiles; every tile prefetches
 * the next one's blocks. */
#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/cpu_gemm_iq.h"
#include "cpu/cpu_gemm_tile.h"

#define IQ_AVX512_INLINE TM_AVX512 static inline __attribute__((always_inline))

#define IQ1(t) ((t) == TM_TYPE_IQ1_S || (t) == TM_TYPE_IQ1_M)

/* What a row's block unpacks to before its pairs of groups: sign bytes (iq2/iq3),
 * multipliers, the float scale c * d. */
typedef struct iq_blk512 {
    const void *p;
    uint16_t idx[64];  /* grid indices where they are not plain bytes (iq_block_idx) */
    uint64_t signs[4]; /* iq2/iq3: sign bytes; iq1: delta bytes dd (iq1_block_delta) */
    __m512i mults;
    float d;
} iq_blk512;

IQ_AVX512_INLINE void iq_blk_load512(tm_type t, const void *blk, iq_blk512 *b) {
    b->p = blk;
    if (t != TM_TYPE_IQ2_XXS && t != TM_TYPE_IQ3_XXS) iq_block_idx(t, blk, b->idx);
    _mm256_storeu_si256((__m256i *)b->signs,
                        IQ1(t) ? iq1_block_delta(t, blk) : iq_block_signs(t, blk));
    b->mults = _mm512_zextsi256_si512(iq_block_mults(t, blk));
    b->d = iq_block_scale(t, blk);
}

/* Groups 2p and 2p+1: weights *m (magnitudes, or iq1's unsigned form), negation
 * mask *neg (iq2/iq3), multipliers *sc (int16, one per 128-bit lane). */
IQ_AVX512_INLINE void iq_pair_avx512(tm_type t, const iq_blk512 *b, int p, __m512i *m,
                                     __mmask64 *neg, __m512i *sc) {
    __m256i g0 = iq_group_grid(t, b->p, b->idx, 2 * p),
            g1 = iq_group_grid(t, b->p, b->idx, 2 * p + 1);
    *neg = IQ1(t) ? 0 : (__mmask64)b->signs[p];
    *m = _mm512_inserti64x4(_mm512_castsi256_si512(g0), g1, 1);
    if (IQ1(t)) { /* byte 2L + e of the pair's dd to the 8 values of run e of lane L */
        const __m512i spread = _mm512_set_epi64(
            0x0707070707070707ll, 0x0606060606060606ll, 0x0505050505050505ll, 0x0404040404040404ll,
            0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0x0000000000000000ll);
        *m = _mm512_sub_epi8(
            *m, _mm512_shuffle_epi8(_mm512_set1_epi64((long long)b->signs[p]), spread));
    }
    /* word w of the pair's vector: multiplier 4p + w / 8 */
    const __m512i idx = _mm512_or_si512(
        _mm512_set1_epi16((short)(4 * p)),
        _mm512_srli_epi16(_mm512_set_epi64(0x001F001E001D001Cll, 0x001B001A00190018ll,
                                           0x0017001600150014ll, 0x0013001200110010ll,
                                           0x000F000E000D000Cll, 0x000B000A00090008ll,
                                           0x0007000600050004ll, 0x0003000200010000ll),
                          3));
    *sc = _mm512_permutexvar_epi16(idx, b->mults);
}

IQ_AVX512_INLINE void iq_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                               tm_type type) {
    const size_t bsize = iq_block_bytes(type);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_setzero_ps();
    const int64_t nb = a->k / TM_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        iq_blk512 w[4];
        const tm_block_q8_k *x[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const char *blk = a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize;
            cpu_tile_prefetch(a, r, nr, i, (size_t)b * bsize, bsize);
            iq_blk_load512(type, blk, &w[i]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            x[j] = (const tm_block_q8_k *)(a->x + (size_t)(t + j) * a->xrb) + b;
        __m512i acci[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acci[i][j] = IQ1(type) ? _mm512_zextsi256_si512(iq1_block_start(
                                             _mm512_castsi512_si256(w[i].mults), x[j]))
                                       : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m512i xv[4];
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) xv[j] = _mm512_loadu_si512(x[j]->qs + 64 * p);
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                __m512i m, sc;
                __mmask64 neg;
                iq_pair_avx512(type, &w[i], p, &m, &neg, &sc);
#pragma GCC unroll 4
                for (int j = 0; j < nt; j++) {
                    const __m512i xs =
                        IQ1(type) ? xv[j]
                                  : _mm512_mask_sub_epi8(xv[j], neg, _mm512_setzero_si512(), xv[j]);
                    acci[i][j] = _mm512_dpwssd_epi32(acci[i][j], _mm512_maddubs_epi16(m, xs), sc);
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(w[i].d * x[j]->d),
                                            _mm512_cvtepi32_ps(acci[i][j]), acc[i][j]);
    }
    cpu_tile_store_avx512(nr, nt, a, r, t, acc);
}

/* Decode: 4 rows a tile (each pair of groups' x loaded once for 4 rows); prompts 3 x 4. */
#define IQ_GEMMS(name, type)                                                                       \
    IQ_AVX512_INLINE void name##_micro(int nr, int nt, const tm_tile_args *a, int64_t r,           \
                                       int64_t t) {                                                \
        iq_micro(nr, nt, a, r, t, type);                                                           \
    }                                                                                              \
    TM_DEFINE_GEMM(TM_AVX512, name##_gemv, name##_micro, 4, 1, 64)                                 \
    TM_DEFINE_GEMM(TM_AVX512, name##_gemm, name##_micro, 3, 4, 48)                                 \
    TM_AVX512 static void name##_auto(int64_t k, const void *w, size_t wrb, int64_t r0,            \
                                      int64_t r1, const void *xq, size_t xrb, int64_t n, float *y, \
                                      int64_t ldy) {                                               \
        (n == 1 ? name##_gemv : name##_gemm)(k, w, wrb, r0, r1, xq, xrb, n, y, ldy);               \
    }
IQ_TYPES(IQ_GEMMS)

cpu_gemm_fn cpu_gemm_iq_avx512_get(tm_type wtype) {
    if (wtype == TM_TYPE_IQ1_S || wtype == TM_TYPE_IQ1_M) cpu_iq1_grid_init();
    switch (wtype) {
        IQ_TYPES(IQ_GET_CASE)
    default:
        return NULL;
    }
}
#else
cpu_gemm_fn cpu_gemm_iq_avx512_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
#endif
