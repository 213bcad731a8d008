/* AVX-512 (F, BW, VL, DQ, VNNI) kernels of the grid i-quants (iq2_xxs iq2_xs
 * iq2_s iq3_xxs iq3_s iq1_s iq1_m) with q8_K activations;
 * cpu_gemm_avx512_get reaches them.
 *
 * One vector holds two groups (64 values) of a row: the grid entries by
 * table loads (cpu_gemm_iq.h) as unsigned magnitudes m, the 64 sign bits as
 * a mask register that negates the activations (vpsubb under the mask), or
 * for iq1 the signed w = 8 g + delta with m = |w| and the mask from w's sign.
 * vpmaddubsw(m, +-x) gives int16 pairs (|pair| <= 2 * 62 * 127 < 2^15) and
 * vpdpwssd with the multipliers 2 s + 1 (one per 16 values, a 128-bit lane
 * each, spread by one vpshufb) sums them in int32: the block's integer sums
 * are the scalar reference's exactly (cpu_gemm_ref_iq.c). Each block's 16
 * int32 lanes are scaled by (d_w c) d_x in float and accumulated, so only
 * the float summation order differs from the reference. Decode (one token)
 * runs 4-row tiles and prefetches the next tile's blocks. */
#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/cpu_gemm_iq.h"
#include "cpu/cpu_gemm_tile.h"

#define TM_AVX512                                                                                  \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define IQ_AVX512_INLINE TM_AVX512 static inline __attribute__((always_inline))

/* Groups 2p and 2p+1 of block blk: magnitudes *m, negation mask *neg,
 * multipliers *sc (int16, one per 128-bit lane). */
IQ_AVX512_INLINE void iq_pair_avx512(tm_type t, const void *blk, int p, __m512i *m, __mmask64 *neg,
                                     __m512i *sc) {
    uint64_t e[8];
    iq_grid(t, blk, 2 * p, e);
    iq_grid(t, blk, 2 * p + 1, e + 4);
    __m512i v =
        _mm512_set_epi64((long long)e[7], (long long)e[6], (long long)e[5], (long long)e[4],
                         (long long)e[3], (long long)e[2], (long long)e[1], (long long)e[0]);
    if (t == TM_TYPE_IQ1_S || t == TM_TYPE_IQ1_M) {
        const __mmask64 dneg = (__mmask64)((uint64_t)iq1_delta_signs(t, blk, 2 * p) |
                                           (uint64_t)iq1_delta_signs(t, blk, 2 * p + 1) << 32);
        const __m512i delta =
            _mm512_mask_blend_epi8(dneg, _mm512_set1_epi8(1), _mm512_set1_epi8(-1));
        /* 8 g per byte: g is -1, 0 or 1, and the bits a 16-bit shift carries
         * into the next byte land in its low 3 bits, which the mask clears */
        const __m512i g8 = _mm512_and_si512(_mm512_slli_epi16(v, 3), _mm512_set1_epi8((char)0xF8));
        v = _mm512_add_epi8(g8, delta);
        *m = _mm512_abs_epi8(v);
        *neg = _mm512_movepi8_mask(v);
    } else {
        *m = v;
        *neg = (__mmask64)((uint64_t)iq_signs(t, blk, 2 * p) | (uint64_t)iq_signs(t, blk, 2 * p + 1)
                                                                   << 32);
    }
    int l0, h0, l1, h1;
    iq_mults(t, blk, 2 * p, &l0, &h0);
    iq_mults(t, blk, 2 * p + 1, &l1, &h1);
    const uint64_t s4 = (uint64_t)l0 | (uint64_t)h0 << 16 | (uint64_t)l1 << 32 | (uint64_t)h1 << 48;
    const __m512i spread = _mm512_set_epi64(
        0x0706070607060706ll, 0x0706070607060706ll, 0x0504050405040504ll, 0x0504050405040504ll,
        0x0302030203020302ll, 0x0302030203020302ll, 0x0100010001000100ll, 0x0100010001000100ll);
    *sc = _mm512_shuffle_epi8(_mm512_set1_epi64((long long)s4), spread);
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
        const char *blk[4];
        const tm_block_q8_k *x[4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            blk[i] = a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize;
            if (nt == 1) {
                const char *next = blk[i] + (size_t)nr * a->wrb;
                _mm_prefetch(next, _MM_HINT_T0);
                _mm_prefetch(next + bsize - 1, _MM_HINT_T0);
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            x[j] = (const tm_block_q8_k *)(a->x + (size_t)(t + j) * a->xrb) + b;
        __m512i acci[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) acci[i][j] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            __m512i xv[4];
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) xv[j] = _mm512_loadu_si512(x[j]->qs + 64 * p);
#pragma GCC unroll 4
            for (int i = 0; i < nr; i++) {
                __m512i m, sc;
                __mmask64 neg;
                iq_pair_avx512(type, blk[i], p, &m, &neg, &sc);
#pragma GCC unroll 4
                for (int j = 0; j < nt; j++) {
                    const __m512i xs =
                        _mm512_mask_sub_epi8(xv[j], neg, _mm512_setzero_si512(), xv[j]);
                    acci[i][j] = _mm512_dpwssd_epi32(acci[i][j], _mm512_maddubs_epi16(m, xs), sc);
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const float dw = iq_block_scale(type, blk[i]);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(dw * x[j]->d),
                                            _mm512_cvtepi32_ps(acci[i][j]), acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++)
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
            a->y[(t + j) * a->ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
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
