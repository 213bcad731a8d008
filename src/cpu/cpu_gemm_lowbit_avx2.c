/* AVX2 kernels of the low-bit types (q4_1 q5_0 q5_1 iq4_nl q2_K q3_K iq4_xs
 * tq1_0 tq2_0), on the unpacking of cpu_gemm_lowbit.h.
 *
 * Per 32 values: vpmaddubsw (unsigned weights times s8 activations, or |w| times
 * sign(w)*x for iq4_xs/iq4_nl) then vpmaddwd with the sub-block scales (or ones)
 * into int32; no pair can saturate: 2*7*127 (q3_K), 2*31*127 (q5), 2*127*127
 * (iq4). The block's int32 sums are exact, as in the scalar reference; floats
 * enter once per block and row/token (d_w*d_x, and dmin (q2_K) or m (q4_1/q5_1)
 * times their integer sums), in another order than the reference's. Every tile
 * prefetches the next row tile's blocks. */
#include "cpu/cpu_gemm_lowbit.h"

#if defined(__x86_64__)
#include "cpu/cpu_gemm_tile.h"

#define TM_AVX2_INLINE TM_AVX2 static inline __attribute__((always_inline))

#define TOK(type, j, b) ((const type *)(a->x + (size_t)(t + (j)) * a->xrb) + (b))

/* ---- 256-value blocks times q8_K ---- */

TM_AVX2_INLINE void lb256_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                                int kind) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    const size_t bsize = lb_block_bytes(kind);
    const int64_t nb = a->k / TM_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        lb_row w[4];
        const tm_block_q8_k *x[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            cpu_tile_prefetch(a, r, nr, i, (size_t)b * bsize, bsize);
            lb_row_load(kind, (const uint8_t *)a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize,
                        &w[i]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) x[j] = TOK(tm_block_q8_k, j, b);
        __m256i acci[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) acci[i][j] = lb_block_start(kind, &w[i], x[j]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            __m256i v[4], av[4], s[4];
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                v[i] = lb_chunk(kind, &w[i], c);
                av[i] = LB_SIGNED(kind) ? _mm256_sign_epi8(v[i], v[i]) : v[i];
                s[i] = lb_chunk_scales(kind, &w[i], c);
            }
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x[j]->qs + 32 * c));
#pragma GCC unroll 4
                for (int i = 0; i < nr; i++) {
                    const __m256i xs = LB_SIGNED(kind) ? _mm256_sign_epi8(xv, v[i]) : xv;
                    acci[i][j] = _mm256_add_epi32(
                        acci[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(av[i], xs), s[i]));
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(w[i].d * x[j]->d),
                                            _mm256_cvtepi32_ps(acci[i][j]), acc[i][j]);
                if (kind == LB_Q2_K) {
                    const __m256i mb = _mm256_madd_epi16(
                        w[i].aux, _mm256_loadu_si256((const __m256i *)x[j]->bsums));
                    acc[i][j] = _mm256_fnmadd_ps(_mm256_set1_ps(w[i].dmin * x[j]->d),
                                                 _mm256_cvtepi32_ps(mb), acc[i][j]);
                }
            }
    }
    cpu_tile_store_avx2(nr, nt, a, r, t, acc);
}

/* ---- 32-value blocks times q8_0 ---- */

TM_AVX2_INLINE void lb32_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                               int kind) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    const __m256i ones16 = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1);
    const size_t bsize = lb_block_bytes(kind);
    const int64_t nb = a->k / 32;
    for (int64_t b = 0; b < nb; b++) {
        __m256i wv[4], aw[4];
        float wd[4], wm[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            cpu_tile_prefetch(a, r, nr, i, (size_t)b * bsize, bsize);
            wv[i] = lb32_load(kind,
                              (const uint8_t *)a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize,
                              &wd[i], &wm[i]);
            aw[i] = LB_SIGNED(kind) ? _mm256_sign_epi8(wv[i], wv[i]) : wv[i];
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) {
            const tm_block_q8_0 *x = TOK(tm_block_q8_0, j, b);
            const __m256i xv = _mm256_loadu_si256((const __m256i *)x->qs);
            const float dx = lb_h2f(x->d);
            /* sum(x) in 8 lanes: q5_0's offset 16, q4_1/q5_1's min term */
            const __m256i xsum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xv), ones16);
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                const __m256i xs = LB_SIGNED(kind) ? _mm256_sign_epi8(xv, wv[i]) : xv;
                __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[i], xs), ones16);
                if (kind == LB_Q5_0) s = _mm256_sub_epi32(s, _mm256_slli_epi32(xsum, 4));
                acc[i][j] =
                    _mm256_fmadd_ps(_mm256_set1_ps(wd[i] * dx), _mm256_cvtepi32_ps(s), acc[i][j]);
                if (kind == LB_Q4_1 || kind == LB_Q5_1)
                    acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(wm[i] * dx),
                                                _mm256_cvtepi32_ps(xsum), acc[i][j]);
            }
        }
    }
    cpu_tile_store_avx2(nr, nt, a, r, t, acc);
}

/* decode 4 rows x 1 token, prompts 2 x 2 (256-value blocks) or 4 x 2 (32-value) */
#define LB256_GEMM(name)                                                                           \
    TM_DEFINE_GEMM(TM_AVX2, name##_gemv, name##_micro, 4, 1, 64)                                   \
    TM_DEFINE_GEMM(TM_AVX2, name##_gemm, name##_micro, 2, 2, 64)                                   \
    TM_AVX2 static void name##_auto(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,  \
                                    const void *xq, size_t xrb, int64_t n, float *y,               \
                                    int64_t ldy) {                                                 \
        (n == 1 ? name##_gemv : name##_gemm)(k, w, wrb, r0, r1, xq, xrb, n, y, ldy);               \
    }
LB256_GEMM(q2k)
LB256_GEMM(q3k)
LB256_GEMM(iq4xs)
LB256_GEMM(tq10)
LB256_GEMM(tq20)
TM_DEFINE_GEMM(TM_AVX2, q41_auto, q41_micro, 4, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, q50_auto, q50_micro, 4, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, q51_auto, q51_micro, 4, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, iq4nl_auto, iq4nl_micro, 4, 2, 64)

TM_LB_DEFINE_GET(cpu_gemm_lowbit_avx2_get)
#else
cpu_gemm_fn cpu_gemm_lowbit_avx2_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
#endif
