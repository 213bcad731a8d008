/* AVX2 kernels of the grid i-quants (iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s
 * iq1_s iq1_m) with q8_K activations; cpu_gemm_avx2_get reaches them.
 *
 * Per block and row, vector code unpacks once the 32 sign bytes and the 16
 * multipliers 2 s + 1 (cpu_gemm_iq.h). Per group of 32 values: the grid
 * entries by loads straight into vector lanes, as unsigned magnitudes m
 * (iq2/iq3) with a sign carrier s (0xFF where the sign bit is set, else 1,
 * from the group's 4 sign bytes by one byte shuffle and a bit test) for
 * vpsignb(x, s), or as iq1's unsigned u = 8 g + delta + 9 in 0..18 times x
 * directly (the offset 9 comes back out per 16 values through the
 * activations' bsums). vpmaddubsw gives int16 pairs (|pair| <= 2 * 62 * 127 <
 * 2^15, no saturation) and vpmaddwd with the multipliers (per 16 values) sums
 * them in int32: the block's sums are the scalar reference's exactly. Each
 * block's eight int32 lanes are scaled by (d_w c) d_x in float and
 * accumulated, so only the float summation order differs from the reference.
 * Every tile prefetches the next row tile's blocks. */
#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/cpu_gemm_iq.h"
#include "cpu/cpu_gemm_tile.h"

#define IQ1(t) ((t) == TM_TYPE_IQ1_S || (t) == TM_TYPE_IQ1_M)

/* What a row's block unpacks to before its groups: sign bytes and multipliers,
 * each 128-bit half in both lanes (group g reads half g / 4), and c * d. */
typedef struct iq_blk256 {
    const void *p;
    uint16_t idx[64];           /* grid indices where they are not plain bytes (iq_block_idx) */
    __m256i signs[2], mults[2]; /* signs: iq1's delta bytes dd (iq1_block_delta) */
    float d;
} iq_blk256;

IQ_AVX2_INLINE void iq_blk_load256(tm_type t, const void *blk, iq_blk256 *b) {
    b->p = blk;
    if (t != TM_TYPE_IQ2_XXS && t != TM_TYPE_IQ3_XXS) iq_block_idx(t, blk, b->idx);
    const __m256i s = IQ1(t) ? iq1_block_delta(t, blk) : iq_block_signs(t, blk);
    b->signs[0] = _mm256_permute2x128_si256(s, s, 0x00);
    b->signs[1] = _mm256_permute2x128_si256(s, s, 0x11);
    const __m256i m = iq_block_mults(t, blk);
    b->mults[0] = _mm256_permute2x128_si256(m, m, 0x00);
    b->mults[1] = _mm256_permute2x128_si256(m, m, 0x11);
    b->d = iq_block_scale(t, blk);
}

/* Group g: weights *m (magnitudes, or iq1's unsigned form), sign carrier *s
 * (iq2/iq3), multipliers *sc (int16: values 0..15 low lane, 16..31 high). */
IQ_AVX2_INLINE void iq_group_avx2(tm_type t, const iq_blk256 *b, int g, __m256i *m, __m256i *s,
                                  __m256i *sc) {
    const int h = g / 4, c = g % 4;
    *m = iq_group_grid(t, b->p, b->idx, g);
    /* sign (or dd) byte 4c + e of the half to the 8 bytes of values 8e..8e+7 */
    const __m256i spread =
        _mm256_add_epi8(_mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                         2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
                        _mm256_set1_epi8((char)(4 * c)));
    const __m256i v = _mm256_shuffle_epi8(b->signs[h], spread);
    if (IQ1(t)) {
        *m = _mm256_sub_epi8(*m, v);
        *s = _mm256_setzero_si256();
    } else {
        const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        *s = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits),
                             _mm256_set1_epi8(1));
    }
    /* words 2c (low lane) and 2c + 1 (high lane) of the half */
    const __m256i pick =
        _mm256_add_epi8(_mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3,
                                         2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3),
                        _mm256_set1_epi8((char)(4 * c)));
    *sc = _mm256_shuffle_epi8(b->mults[h], pick);
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
        iq_blk256 w[4];
        const tm_block_q8_k *x[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            cpu_tile_prefetch(a, r, nr, i, (size_t)b * bsize, bsize);
            iq_blk_load256(type, a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize, &w[i]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            x[j] = (const tm_block_q8_k *)(a->x + (size_t)(t + j) * a->xrb) + b;
        __m256i acci[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acci[i][j] = IQ1(type) ? iq1_block_start(iq_block_mults(type, w[i].p), x[j])
                                       : _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            __m256i xv[4];
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                xv[j] = _mm256_loadu_si256((const __m256i *)(x[j]->qs + 32 * g));
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                __m256i m, s, sc;
                iq_group_avx2(type, &w[i], g, &m, &s, &sc);
#pragma GCC unroll 4
                for (int j = 0; j < nt; j++) {
                    const __m256i xs = IQ1(type) ? xv[j] : _mm256_sign_epi8(xv[j], s);
                    const __m256i p = _mm256_maddubs_epi16(m, xs);
                    acci[i][j] = _mm256_add_epi32(acci[i][j], _mm256_madd_epi16(p, sc));
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(w[i].d * x[j]->d),
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
    if (wtype == TM_TYPE_IQ1_S || wtype == TM_TYPE_IQ1_M) cpu_iq1_grid_init();
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
