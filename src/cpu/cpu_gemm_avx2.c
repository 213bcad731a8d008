/* AVX2 kernels (with FMA and F16C), compiled with function target attributes
 * so the library stays portable and cpu_gemm picks them at run time.
 *
 * Integer types use vpmaddubsw (u8 x s8 -> pairs of s16) then vpmaddwd with
 * the sub-block scale (or ones) -> s32; no sum can saturate: |pair| <= 2*63*127
 * for q6_K, 2*31*127 for q5_K, 2*128*127 for q8_0's sign trick. Block sums are
 * scaled to float once per block and tile (nr rows x nt tokens) so each weight
 * block is unpacked once per nt tokens and each activation block is loaded
 * once per nr rows. */
#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/cpu_gemm_tile.h"

#define TM_AVX2_INLINE TM_AVX2 static inline __attribute__((always_inline))

TM_AVX2_INLINE float h2f(tm_half h) {
    return _cvtsh_ss(h);
}

#define ROW(type, i, b) ((const type *)(a->w + (size_t)(r + (i)) * a->wrb) + (b))
#define TOK(type, j, b) ((const type *)(a->x + (size_t)(t + (j)) * a->xrb) + (b))

/* ---- q4_K and q5_K (q5: the fifth bit from qh, bit j of qh[l] for sub-block j) ---- */

TM_AVX2_INLINE void k45_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t, int q5) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), b16 = _mm256_set1_epi8(16);
    const int64_t nb = a->k / TM_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        /* q4_K and q5_K share d, dmin, scales at the same offsets */
        const tm_block_q4_k *w4[4];
        const tm_block_q5_k *w5[4];
        const tm_block_q8_k *x[4];
        uint8_t sm[4][16];
        __m256i qh[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            w4[i] = ROW(tm_block_q4_k, i, b);
            w5[i] = ROW(tm_block_q5_k, i, b);
            cpu_k4_unpack_scales(q5 ? w5[i]->scales : w4[i]->scales, sm[i]);
            if (q5) qh[i] = _mm256_loadu_si256((const __m256i *)w5[i]->qh);
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) x[j] = TOK(tm_block_q8_k, j, b);
        __m256i acci[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) acci[i][j] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i lo[4], hi[4], slo[4], shi[4];
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                __m256i q =
                    _mm256_loadu_si256((const __m256i *)((q5 ? w5[i]->qs : w4[i]->qs) + 32 * c));
                lo[i] = _mm256_and_si256(q, m4);
                hi[i] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (q5) {
                    const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * c)));
                    const __m256i bh = _mm256_set1_epi8((char)(2 << (2 * c)));
                    lo[i] = _mm256_or_si256(
                        lo[i],
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh[i], bl), bl), b16));
                    hi[i] = _mm256_or_si256(
                        hi[i],
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh[i], bh), bh), b16));
                }
                slo[i] = _mm256_set1_epi16(sm[i][2 * c]);
                shi[i] = _mm256_set1_epi16(sm[i][2 * c + 1]);
            }
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                __m256i x0 = _mm256_loadu_si256((const __m256i *)(x[j]->qs + 64 * c));
                __m256i x1 = _mm256_loadu_si256((const __m256i *)(x[j]->qs + 64 * c + 32));
#pragma GCC unroll 4
                for (int i = 0; i < nr; i++) {
                    __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[i], x0), slo[i]);
                    __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[i], x1), shi[i]);
                    acci[i][j] = _mm256_add_epi32(acci[i][j], _mm256_add_epi32(p0, p1));
                }
            }
        }
        __m128i bs[4], mins[4];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) /* bsums per 32 = pairs of the per-16 sums */
            bs[j] = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x[j]->bsums),
                                   _mm_loadu_si128((const __m128i *)(x[j]->bsums + 8)));
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
            mins[i] = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm[i] + 8)));
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            float d = h2f(w4[i]->d), dmin = h2f(w4[i]->dmin);
            if (q5) d = h2f(w5[i]->d), dmin = h2f(w5[i]->dmin);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                __m256 pm =
                    _mm256_cvtepi32_ps(_mm256_zextsi128_si256(_mm_madd_epi16(mins[i], bs[j])));
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[j]->d),
                                            _mm256_cvtepi32_ps(acci[i][j]), acc[i][j]);
                acc[i][j] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * x[j]->d), pm, acc[i][j]);
            }
        }
    }
    cpu_tile_store_avx2(nr, nt, a, r, t, acc);
}

#define q4k_micro(R, T, a, r, t) k45_micro(R, T, a, r, t, 0)
#define q5k_micro(R, T, a, r, t) k45_micro(R, T, a, r, t, 1)

/* ---- q6_K: 6-bit q in 0..63 times x, minus 32 * sum_j sc_j bsum_j ---- */

TM_AVX2_INLINE void q6k_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    /* pshufb controls: low 128 bits take int16 lane 2p, high bits lane 2p+1 */
    __m256i ctrl[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        char c0 = (char)(4 * p), c1 = (char)(4 * p + 1), c2 = (char)(4 * p + 2),
             c3 = (char)(4 * p + 3);
        ctrl[p] = _mm256_setr_epi8(c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1, c0, c1,
                                   c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3, c2, c3);
    }
    const int64_t nb = a->k / TM_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        const tm_block_q6_k *w[4];
        const tm_block_q8_k *x[4];
        __m256i sc16[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            w[i] = ROW(tm_block_q6_k, i, b);
            sc16[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i]->scales));
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) x[j] = TOK(tm_block_q8_k, j, b);
        __m256i acci[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) /* start from -32 * sum sc*bsum */
                acci[i][j] = _mm256_slli_epi32(
                    _mm256_sub_epi32(_mm256_setzero_si256(),
                                     _mm256_madd_epi16(sc16[i], _mm256_loadu_si256(
                                                                    (const __m256i *)x[j]->bsums))),
                    5);
#pragma GCC unroll 4
        for (int h = 0; h < 2; h++) {
            __m256i q[4][4], s[4][4];
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                __m256i qa = _mm256_loadu_si256((const __m256i *)(w[i]->ql + 64 * h));
                __m256i qb = _mm256_loadu_si256((const __m256i *)(w[i]->ql + 64 * h + 32));
                __m256i hb = _mm256_loadu_si256((const __m256i *)(w[i]->qh + 32 * h));
                q[i][0] = _mm256_or_si256(_mm256_and_si256(qa, m4),
                                          _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
                q[i][1] = _mm256_or_si256(_mm256_and_si256(qb, m4),
                                          _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
                q[i][2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4),
                                          _mm256_and_si256(hb, m30));
                q[i][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
                __m256i half = h ? _mm256_permute2x128_si256(sc16[i], sc16[i], 0x11)
                                 : _mm256_permute2x128_si256(sc16[i], sc16[i], 0x00);
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) s[i][p] = _mm256_shuffle_epi8(half, ctrl[p]);
            }
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x[j]->qs + 128 * h + 32 * p));
#pragma GCC unroll 4
                    for (int i = 0; i < nr; i++)
                        acci[i][j] = _mm256_add_epi32(
                            acci[i][j],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(q[i][p], xv), s[i][p]));
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            float d = h2f(w[i]->d);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[j]->d),
                                            _mm256_cvtepi32_ps(acci[i][j]), acc[i][j]);
        }
    }
    cpu_tile_store_avx2(nr, nt, a, r, t, acc);
}

/* ---- blocks of 32 signed values with one scale, times q8_0 ---- */

enum { B32_Q8_0, B32_Q4_0, B32_MXFP4 };

TM_AVX2_INLINE __m256i b32_load(int kind, const char *blk, float *scale) {
    if (kind == B32_Q8_0) {
        const tm_block_q8_0 *q = (const tm_block_q8_0 *)blk;
        *scale = h2f(q->d);
        return _mm256_loadu_si256((const __m256i *)q->qs);
    }
    const __m128i m4 = _mm_set1_epi8(0xF);
    const uint8_t *qs =
        kind == B32_Q4_0 ? ((const tm_block_q4_0 *)blk)->qs : ((const tm_block_mxfp4 *)blk)->qs;
    __m128i q = _mm_loadu_si128((const __m128i *)qs); /* q4_0: 18 bytes, mxfp4: 17; reads 16 */
    __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    if (kind == B32_Q4_0) {
        *scale = h2f(((const tm_block_q4_0 *)blk)->d);
        const __m128i eight = _mm_set1_epi8(8);
        return _mm256_set_m128i(_mm_sub_epi8(hi, eight), _mm_sub_epi8(lo, eight));
    }
    *scale = cpu_e8m0_half(((const tm_block_mxfp4 *)blk)->e);
    const __m128i lut = _mm_loadu_si128((const __m128i *)cpu_mxfp4_values);
    return _mm256_set_m128i(_mm_shuffle_epi8(lut, hi), _mm_shuffle_epi8(lut, lo));
}

TM_AVX2_INLINE void b32_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t, int kind,
                              size_t bsize) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t nb = a->k / 32;
    for (int64_t b = 0; b < nb; b++) {
        __m256i wv[4], aw[4];
        float ws[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            wv[i] = b32_load(kind, a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize, &ws[i]);
            aw[i] = _mm256_sign_epi8(wv[i], wv[i]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) {
            const tm_block_q8_0 *x = TOK(tm_block_q8_0, j, b);
            __m256i xv = _mm256_loadu_si256((const __m256i *)x->qs);
            float dx = h2f(x->d);
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                __m256i s = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(aw[i], _mm256_sign_epi8(xv, wv[i])), ones);
                acc[i][j] =
                    _mm256_fmadd_ps(_mm256_set1_ps(ws[i] * dx), _mm256_cvtepi32_ps(s), acc[i][j]);
            }
        }
    }
    cpu_tile_store_avx2(nr, nt, a, r, t, acc);
}

#define q80_micro(R, T, a, r, t)   b32_micro(R, T, a, r, t, B32_Q8_0, sizeof(tm_block_q8_0))
#define q40_micro(R, T, a, r, t)   b32_micro(R, T, a, r, t, B32_Q4_0, sizeof(tm_block_q4_0))
#define mxfp4_micro(R, T, a, r, t) b32_micro(R, T, a, r, t, B32_MXFP4, sizeof(tm_block_mxfp4))

/* ---- float weights times f32 activations ---- */

enum { FW_F32, FW_F16, FW_BF16 };

TM_AVX2_INLINE __m256 fw_load8(int kind, const char *row, int64_t i) {
    if (kind == FW_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (kind == FW_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

TM_AVX2_INLINE float fw_load1(int kind, const char *row, int64_t i) {
    if (kind == FW_F32) return ((const float *)row)[i];
    if (kind == FW_F16) return h2f(((const uint16_t *)row)[i]);
    return quant_bf16_to_f32(((const uint16_t *)row)[i]);
}

TM_AVX2_INLINE void fw_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                             int kind) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm256_setzero_ps();
    const char *row[4];
    const float *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++) row[i] = a->w + (size_t)(r + i) * a->wrb;
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++) x[j] = (const float *)(a->x + (size_t)(t + j) * a->xrb);
    int64_t k8 = a->k & ~(int64_t)7;
    for (int64_t e = 0; e < k8; e += 8) {
        __m256 wv[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) wv[i] = fw_load8(kind, row[i], e);
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) {
            __m256 xv = _mm256_loadu_ps(x[j] + e);
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++)
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            float s = cpu_hsum8_avx2(acc[i][j]);
            for (int64_t e = k8; e < a->k; e++) s += fw_load1(kind, row[i], e) * x[j][e];
            a->y[(t + j) * a->ldy + r + i] = s;
        }
}

#define f32_micro(R, T, a, r, t)  fw_micro(R, T, a, r, t, FW_F32)
#define f16_micro(R, T, a, r, t)  fw_micro(R, T, a, r, t, FW_F16)
#define bf16_micro(R, T, a, r, t) fw_micro(R, T, a, r, t, FW_BF16)

/* Decode (one token) and prompt tiles; rows in chunks of 64 keep a chunk's
 * weights in L2 while token tiles sweep over them. */
TM_DEFINE_GEMM(TM_AVX2, q4k_gemv, q4k_micro, 4, 1, 64)
TM_DEFINE_GEMM(TM_AVX2, q4k_gemm, q4k_micro, 2, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, q5k_gemv, q5k_micro, 4, 1, 64)
TM_DEFINE_GEMM(TM_AVX2, q5k_gemm, q5k_micro, 2, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, q6k_gemv, q6k_micro, 2, 1, 64)
TM_DEFINE_GEMM(TM_AVX2, q6k_gemm, q6k_micro, 2, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, q80_gemm, q80_micro, 4, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, q40_gemm, q40_micro, 4, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, mxfp4_gemm, mxfp4_micro, 4, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, f32_gemm, f32_micro, 4, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, f16_gemm, f16_micro, 4, 2, 64)
TM_DEFINE_GEMM(TM_AVX2, bf16_gemm, bf16_micro, 4, 2, 64)

#define GEMV_OR_GEMM(gemv, gemm)                                                                   \
    TM_AVX2 static void gemv##_auto(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,  \
                                    const void *xq, size_t xrb, int64_t n, float *y,               \
                                    int64_t ldy) {                                                 \
        (n == 1 ? gemv : gemm)(k, w, wrb, r0, r1, xq, xrb, n, y, ldy);                             \
    }
GEMV_OR_GEMM(q4k_gemv, q4k_gemm)
GEMV_OR_GEMM(q5k_gemv, q5k_gemm)
GEMV_OR_GEMM(q6k_gemv, q6k_gemm)

cpu_gemm_fn cpu_gemm_avx2_get(tm_type wtype) {
    switch (wtype) {
    case TM_TYPE_Q4_K:
        return q4k_gemv_auto;
    case TM_TYPE_Q5_K:
        return q5k_gemv_auto;
    case TM_TYPE_Q6_K:
        return q6k_gemv_auto;
    case TM_TYPE_Q8_0:
        return q80_gemm;
    case TM_TYPE_Q4_0:
        return q40_gemm;
    case TM_TYPE_MXFP4:
        return mxfp4_gemm;
    case TM_TYPE_F32:
        return f32_gemm;
    case TM_TYPE_F16:
        return f16_gemm;
    case TM_TYPE_BF16:
        return bf16_gemm;
    default: {
        cpu_gemm_fn fn = cpu_gemm_iq_avx2_get(wtype);
        return fn ? fn : cpu_gemm_lowbit_avx2_get(wtype);
    }
    }
}
#else
cpu_gemm_fn cpu_gemm_avx2_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
#endif
