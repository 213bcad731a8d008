/* AVX-512 (F, BW, VL, DQ, VNNI) kernels of the low-bit types, on the unpacking
 * of cpu_gemm_lowbit.h: two 32-value chunks make one 64-byte vector.
 *
 * 256-value blocks (q2_K q3_K iq4_xs tq1_0 tq2_0, times q8_K): vpmaddubsw
 *   (unsigned weights times s8 activations; iq4_xs: |w| times x negated where w
 *   is negative) then vpdpwssd with the int16 sub-block scales; the offsets of
 *   the unsigned forms come out through the activations' bsums. No pair
 *   saturates (2*127*127 at most).
 * 32-value blocks (q4_1 q5_0 q5_1 iq4_nl, times q8_0): two blocks per vector;
 *   weights unsigned (q5_0 with offset 16, iq4_nl its values + 128), vpdpbusd
 *   starts from -offset * sum(x) so the block sums come out exact; q4_1/q5_1
 *   add m*d_x*sum(x) with sum(x) from vpdpbusd of ones.
 * Block sums are exact int32 as in the scalar reference; the float scaling and
 * summation order differ. Every tile prefetches the next row tile's blocks. */
#include "cpu/cpu_gemm_lowbit.h"

#if defined(__x86_64__)
#include "cpu/cpu_gemm_tile.h"

#define TM_AVX512_INLINE TM_AVX512 static inline __attribute__((always_inline))

#define TOK(type, j, b) ((const type *)(a->x + (size_t)(t + (j)) * a->xrb) + (b))

TM_AVX512_INLINE __m512i lb_join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

TM_AVX512_INLINE __m512 lb_join_ps(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(lo)), _mm256_set1_ps(hi), 1);
}

/* ---- 256-value blocks times q8_K ---- */

TM_AVX512_INLINE void lb256_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                                  int kind) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_setzero_ps();
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
        __m512i acci[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acci[i][j] = _mm512_zextsi256_si512(lb_block_start(kind, &w[i], x[j]));
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i v[4], s[4];
            __mmask64 neg[4];
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                v[i] = lb_join(lb_chunk(kind, &w[i], 2 * c), lb_chunk(kind, &w[i], 2 * c + 1));
                s[i] = lb_join(lb_chunk_scales(kind, &w[i], 2 * c),
                               lb_chunk_scales(kind, &w[i], 2 * c + 1));
                if (LB_SIGNED(kind)) {
                    neg[i] = _mm512_movepi8_mask(v[i]);
                    v[i] = _mm512_abs_epi8(v[i]);
                }
            }
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                const __m512i xv = _mm512_loadu_si512((const void *)(x[j]->qs + 64 * c));
#pragma GCC unroll 4
                for (int i = 0; i < nr; i++) {
                    const __m512i xs =
                        LB_SIGNED(kind)
                            ? _mm512_mask_sub_epi8(xv, neg[i], _mm512_setzero_si512(), xv)
                            : xv;
                    acci[i][j] =
                        _mm512_dpwssd_epi32(acci[i][j], _mm512_maddubs_epi16(v[i], xs), s[i]);
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(w[i].d * x[j]->d),
                                            _mm512_cvtepi32_ps(acci[i][j]), acc[i][j]);
                if (kind == LB_Q2_K) {
                    const __m256i mb = _mm256_madd_epi16(
                        w[i].aux, _mm256_loadu_si256((const __m256i *)x[j]->bsums));
                    acc[i][j] =
                        _mm512_fnmadd_ps(_mm512_set1_ps(w[i].dmin * x[j]->d),
                                         _mm512_cvtepi32_ps(_mm512_zextsi256_si512(mb)), acc[i][j]);
                }
            }
    }
    cpu_tile_store_avx512(nr, nt, a, r, t, acc);
}

/* ---- 32-value blocks times q8_0, two blocks per vector ---- */

TM_AVX512_INLINE void lb32_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                                 int kind) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_setzero_ps();
    const int has_min = kind == LB_Q4_1 || kind == LB_Q5_1;
    const int off_shift = kind == LB_Q5_0 ? 4 : kind == LB_IQ4_NL ? 7 : 0; /* offset 16 or 128 */
    const __m512i ones8 = _mm512_set1_epi8(1);
    const size_t bsize = lb_block_bytes(kind);
    const int64_t nb = a->k / 32;
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512i xv[4], xsum[4], start[4];
        __m512 dx[4];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) {
            const tm_block_q8_0 *x0 = TOK(tm_block_q8_0, j, b), *x1 = x0 + 1;
            xv[j] =
                lb_join(_mm256_loadu_si256((const __m256i *)x0->qs),
                        two ? _mm256_loadu_si256((const __m256i *)x1->qs) : _mm256_setzero_si256());
            xsum[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones8, xv[j]);
            start[j] = off_shift ? _mm512_sub_epi32(_mm512_setzero_si512(),
                                                    _mm512_slli_epi32(xsum[j], off_shift))
                                 : _mm512_setzero_si512();
            dx[j] = lb_join_ps(lb_h2f(x0->d), two ? lb_h2f(x1->d) : 0.f);
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const uint8_t *blk =
                (const uint8_t *)a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize;
            cpu_tile_prefetch(a, r, nr, i, (size_t)b * bsize, (two ? 2 : 1) * bsize);
            float d0, m0, d1 = 0, m1 = 0;
            const __m256i lo = lb32_load(kind, blk, &d0, &m0);
            const __m256i hi =
                two ? lb32_load(kind, blk + bsize, &d1, &m1) : _mm256_setzero_si256();
            __m512i u = lb_join(lo, hi);
            if (kind == LB_IQ4_NL) u = _mm512_xor_si512(u, _mm512_set1_epi8(-128));
            const __m512 ws = lb_join_ps(d0, d1), ms = lb_join_ps(m0, m1);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                const __m512i dp = _mm512_dpbusd_epi32(start[j], u, xv[j]);
                acc[i][j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(ws, dx[j]), acc[i][j]);
                if (has_min)
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(xsum[j]),
                                                _mm512_mul_ps(ms, dx[j]), acc[i][j]);
            }
        }
    }
    cpu_tile_store_avx512(nr, nt, a, r, t, acc);
}

/* decode 4 rows x 1 token; prompts 3 x 4 (256-value blocks) or 4 x 4 (32-value) */
#define LB_GEMM(name, NR, NT, CHUNK)                                                               \
    TM_DEFINE_GEMM(TM_AVX512, name##_gemv, name##_micro, 4, 1, 64)                                 \
    TM_DEFINE_GEMM(TM_AVX512, name##_gemm, name##_micro, NR, NT, CHUNK)                            \
    TM_AVX512 static void name##_auto(int64_t k, const void *w, size_t wrb, int64_t r0,            \
                                      int64_t r1, const void *xq, size_t xrb, int64_t n, float *y, \
                                      int64_t ldy) {                                               \
        (n == 1 ? name##_gemv : name##_gemm)(k, w, wrb, r0, r1, xq, xrb, n, y, ldy);               \
    }
LB_GEMM(q2k, 3, 4, 48)
LB_GEMM(q3k, 3, 4, 48)
LB_GEMM(iq4xs, 3, 4, 48)
LB_GEMM(tq10, 3, 4, 48)
LB_GEMM(tq20, 3, 4, 48)
LB_GEMM(q41, 4, 4, 64)
LB_GEMM(q50, 4, 4, 64)
LB_GEMM(q51, 4, 4, 64)
LB_GEMM(iq4nl, 4, 4, 64)

TM_LB_DEFINE_GET(cpu_gemm_lowbit_avx512_get)
#else
cpu_gemm_fn cpu_gemm_lowbit_avx512_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
#endif
