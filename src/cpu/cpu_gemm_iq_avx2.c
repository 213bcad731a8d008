/* AVX2 kernels of the grid i-quants (iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s
 * iq1_s iq1_m) with q8_K activations; cpu_gemm_avx2_get reaches them.
 *
 * Per group of 32 values and row: the grid entries go into one vector by
 * table loads (cpu_gemm_iq.h), as unsigned magnitudes m (iq2/iq3) with a
 * sign carrier s (0xFF where the sign bit is set, else 1, from the 4 sign
 * bytes by a byte broadcast and a bit test), or as signed w = 8 g + delta
 * (iq1: m = |w|, s = w). Then per token vpsignb(x, s) and vpmaddubsw(m, .)
 * give pairs of m * sign * x (|pair| <= 2 * 62 * 127 < 2^15, no saturation)
 * and vpmaddwd with the multipliers 2 s + 1 (per 16 values) sums them in
 * int32: the block's sums are the scalar reference's exactly. Each block's
 * eight int32 lanes are scaled by (d_w c) d_x in float and accumulated, so
 * only the float summation order differs from the reference. */
#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/cpu_gemm_iq.h"
#include "cpu/cpu_gemm_tile.h"

#define IQ_AVX2_INLINE TM_AVX2 static inline __attribute__((always_inline))

/* 0xFF for values whose sign bit is set in the 4 bytes of s4, else 1. */
IQ_AVX2_INLINE __m256i iq_sign_carrier(uint32_t s4) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                            2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s4), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
    return _mm256_or_si256(v, _mm256_set1_epi8(1));
}

/* Group g of block blk: magnitudes *m, sign carrier *s, multipliers *sc. */
IQ_AVX2_INLINE void iq_group_avx2(tm_type t, const void *blk, int g, __m256i *m, __m256i *s,
                                  __m256i *sc) {
    uint64_t e[4];
    iq_grid(t, blk, g, e);
    __m256i v =
        _mm256_set_epi64x((long long)e[3], (long long)e[2], (long long)e[1], (long long)e[0]);
    if (t == TM_TYPE_IQ1_S || t == TM_TYPE_IQ1_M) {
        const __m256i delta = iq_sign_carrier(iq1_delta_signs(t, blk, g)); /* -1 or 1 */
        v = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), v), delta);
        *m = _mm256_abs_epi8(v);
        *s = v;
    } else {
        *m = v;
        *s = iq_sign_carrier(iq_signs(t, blk, g));
    }
    int lo, hi;
    iq_mults(t, blk, g, &lo, &hi);
    *sc = _mm256_inserti128_si256(_mm256_set1_epi16((short)lo), _mm_set1_epi16((short)hi), 1);
}

IQ_AVX2_INLINE void iq_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                             tm_type type) {
    const size_t bsize = iq_block_bytes(type);
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    const int64_t nb = a->k / TM_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        const char *blk[4];
        const tm_block_q8_k *x[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) blk[i] = a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize;
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            x[j] = (const tm_block_q8_k *)(a->x + (size_t)(t + j) * a->xrb) + b;
        __m256i acci[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) acci[i][j] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            __m256i xv[4];
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                xv[j] = _mm256_loadu_si256((const __m256i *)(x[j]->qs + 32 * g));
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                __m256i m, s, sc;
                iq_group_avx2(type, blk[i], g, &m, &s, &sc);
#pragma GCC unroll 4
                for (int j = 0; j < nt; j++) {
                    const __m256i p = _mm256_maddubs_epi16(m, _mm256_sign_epi8(xv[j], s));
                    acci[i][j] = _mm256_add_epi32(acci[i][j], _mm256_madd_epi16(p, sc));
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const float dw = iq_block_scale(type, blk[i]);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x[j]->d),
                                            _mm256_cvtepi32_ps(acci[i][j]), acc[i][j]);
        }
    }
    cpu_tile_store_avx2(nr, nt, a, r, t, acc);
}

/* Decode: 4 rows a tile (each group's x loaded once for 4 rows); prompts 2 x 2. */
#define IQ_GEMMS(name, type)                                                                       \
    IQ_AVX2_INLINE void name##_micro(int nr, int nt, const tm_tile_args *a, int64_t r,             \
                                     int64_t t) {                                                  \
        iq_micro(nr, nt, a, r, t, type);                                                           \
    }                                                                                              \
    TM_DEFINE_GEMM(TM_AVX2, name##_gemv, name##_micro, 4, 1, 64)                                   \
    TM_DEFINE_GEMM(TM_AVX2, name##_gemm, name##_micro, 2, 2, 64)                                   \
    TM_AVX2 static void name##_auto(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,  \
                                    const void *xq, size_t xrb, int64_t n, float *y,               \
                                    int64_t ldy) {                                                 \
        (n == 1 ? name##_gemv : name##_gemm)(k, w, wrb, r0, r1, xq, xrb, n, y, ldy);               \
    }
IQ_TYPES(IQ_GEMMS)

cpu_gemm_fn cpu_gemm_iq_avx2_get(tm_type wtype) {
    switch (wtype) {
        IQ_TYPES(IQ_GET_CASE)
    default:
        return NULL;
    }
}
#else
cpu_gemm_fn cpu_gemm_iq_avx2_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
#endif
