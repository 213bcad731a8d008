/* Unpacking of the low-bit weight types for the AVX2 and AVX-512 kernels
 * (cpu_gemm_lowbit_avx2.c, cpu_gemm_lowbit_avx512.c): each type's values come
 * out as 32 int8 lanes in the activations' order, so both files share one
 * form of product (AVX-512 joins two such chunks into one vector).
 *
 * 256-value blocks (times q8_K): a row's block is first read into an lb_row
 * (scales as int16, d, dmin, the q3_K high bits), then chunk c (values
 * 32c..32c+31) is unpacked to:
 *   q2_K: q in 0..3; q3_K: q + 4 in 0..7; tq1_0/tq2_0: code in 0..2  (unsigned,
 *         the offsets 4 and 1 are taken out through the activations' bsums)
 *   iq4_xs: the signed non-linear values (-127..113), multiplied by the sign trick
 * and the chunk's int16 scales: per 16 values (q2_K/q3_K: the low 128 bits take
 * sub-block 2c, the high 2c+1), per 32 (iq4_xs) or ones (tq1_0/tq2_0).
 *
 * 32-value blocks (times q8_0): q4_1/q5_1 q in 0..15/0..31 (their min term
 * m*d_x*sum(x) is summed by the kernels), q5_0 q in 0..31 with offset 16,
 * iq4_nl the signed non-linear values. */
#ifndef TM_CPU_CPU_GEMM_LOWBIT_H
#define TM_CPU_CPU_GEMM_LOWBIT_H

#include "cpu/cpu_internal.h"
#include "quant/quant_grids.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TM_LB_INLINE TM_AVX2 static inline __attribute__((always_inline))

enum { LB_Q2_K, LB_Q3_K, LB_IQ4_XS, LB_TQ1_0, LB_TQ2_0, LB_Q4_1, LB_Q5_0, LB_Q5_1, LB_IQ4_NL };

/* unsigned kinds multiply by vpmaddubsw directly; signed ones need the sign trick */
#define LB_SIGNED(kind) ((kind) == LB_IQ4_XS || (kind) == LB_IQ4_NL)

TM_LB_INLINE float lb_h2f(tm_half h) {
    return _cvtsh_ss(h);
}

static inline size_t lb_block_bytes(int kind) {
    switch (kind) {
    case LB_Q2_K:
        return sizeof(tm_block_q2_k);
    case LB_Q3_K:
        return sizeof(tm_block_q3_k);
    case LB_IQ4_XS:
        return sizeof(tm_block_iq4_xs);
    case LB_TQ1_0:
        return sizeof(tm_block_tq1_0);
    case LB_TQ2_0:
        return sizeof(tm_block_tq2_0);
    case LB_Q4_1:
        return sizeof(tm_block_q4_1);
    case LB_Q5_0:
        return sizeof(tm_block_q5_0);
    case LB_Q5_1:
        return sizeof(tm_block_q5_1);
    default:
        return sizeof(tm_block_iq4_nl);
    }
}

/* ---- 256-value blocks ---- */

typedef struct lb_row {
    const uint8_t *p;
    int16_t sc[16]; /* sub-block scales (q2_K/q3_K 16, iq4_xs 8) */
    __m256i aux;    /* q2_K: the 16 mins as int16; q3_K: hmask */
    float d, dmin;
} lb_row;

TM_LB_INLINE void lb_row_load(int kind, const uint8_t *blk, lb_row *w) {
    w->p = blk;
    w->dmin = 0;
    if (kind == LB_Q2_K) {
        const tm_block_q2_k *q = (const tm_block_q2_k *)blk;
        const __m128i s = _mm_loadu_si128((const __m128i *)q->scales), m4 = _mm_set1_epi8(0xF);
        _mm256_storeu_si256((__m256i *)w->sc, _mm256_cvtepu8_epi16(_mm_and_si128(s, m4)));
        w->aux = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
        w->d = lb_h2f(q->d), w->dmin = lb_h2f(q->dmin);
    } else if (kind == LB_Q3_K) {
        const tm_block_q3_k *q = (const tm_block_q3_k *)blk;
        const __m128i m4 = _mm_set1_epi8(0xF);
        const __m128i l8 = _mm_loadl_epi64((const __m128i *)q->scales);
        /* bytes 0..7: low nibbles (scales 0..7), 8..15: high nibbles (8..15) */
        const __m128i lo =
            _mm_unpacklo_epi64(_mm_and_si128(l8, m4), _mm_and_si128(_mm_srli_epi16(l8, 4), m4));
        uint32_t h32;
        memcpy(&h32, q->scales + 8, 4);
        /* scale j's high 2 bits: bits 2*(j/4) of byte j%4, i.e. dword j/4 shifted */
        const __m128i hi = _mm_and_si128(
            _mm_srlv_epi32(_mm_set1_epi32((int)h32), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
        const __m128i s = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
        _mm256_storeu_si256((__m256i *)w->sc, _mm256_cvtepi8_epi16(s));
        w->aux = _mm256_loadu_si256((const __m256i *)q->hmask);
        w->d = lb_h2f(q->d);
    } else if (kind == LB_IQ4_XS) {
        const tm_block_iq4_xs *q = (const tm_block_iq4_xs *)blk;
        for (int j = 0; j < 8; j++)
            w->sc[j] = (int16_t)((((q->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) |
                                  ((q->scales_h >> (2 * j)) & 3) << 4) -
                                 32);
        w->d = lb_h2f(q->d);
    } else if (kind == LB_TQ1_0) {
        w->d = lb_h2f(((const tm_block_tq1_0 *)blk)->d);
    } else {
        w->d = lb_h2f(((const tm_block_tq2_0 *)blk)->d);
    }
}

/* Bytes times per-byte factors, mod 256 (vpmullw on the even and odd bytes). */
TM_LB_INLINE __m256i lb_mul8(__m256i a, __m256i f) {
    const __m256i lo = _mm256_and_si256(_mm256_mullo_epi16(a, f), _mm256_set1_epi16(0xFF));
    const __m256i hi =
        _mm256_slli_epi16(_mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(f, 8)), 8);
    return _mm256_or_si256(lo, hi);
}

/* tq1_0 chunk c: bytes times their powers of 3, then the top trit (q*3)>>8 is
 * 0 below 86, 1 below 171, else 2. */
TM_LB_INLINE __m256i lb_tq1_chunk(const tm_block_tq1_0 *q, int c) {
    __m256i b, f;
    if (c < 5) {
        static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
        b = _mm256_loadu_si256((const __m256i *)q->qs);
        f = _mm256_set1_epi8((char)pow3[c]);
    } else {
        const __m128i s = _mm_loadu_si128((const __m128i *)(q->qs + 32));
        if (c < 7) {
            b = _mm256_set_m128i(s, s);
            f = c == 5 ? _mm256_set_m128i(_mm_set1_epi8(3), _mm_set1_epi8(1))
                       : _mm256_set_m128i(_mm_set1_epi8(27), _mm_set1_epi8(9));
        } else { /* values 224..239 from qs[32..47] (power 81), 240..255 from qh */
            uint32_t h;
            memcpy(&h, q->qh, 4);
            b = _mm256_set_m128i(_mm_set1_epi32((int)h), s);
            f = _mm256_set_m128i(_mm_setr_epi8(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27),
                                 _mm_set1_epi8(81));
        }
    }
    const __m256i v = lb_mul8(b, f);
    const __m256i ge86 = _mm256_cmpeq_epi8(_mm256_max_epu8(v, _mm256_set1_epi8(86)), v);
    const __m256i ge171 = _mm256_cmpeq_epi8(_mm256_max_epu8(v, _mm256_set1_epi8((char)171)), v);
    return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge86, ge171));
}

/* Chunk c (values 32c..32c+31) of a 256-value block, in the form the top comment gives. */
TM_LB_INLINE __m256i lb_chunk(int kind, const lb_row *w, int c) {
    if (kind == LB_IQ4_XS) {
        const tm_block_iq4_xs *q = (const tm_block_iq4_xs *)w->p;
        const __m128i v = _mm_loadu_si128((const __m128i *)(q->qs + 16 * c)),
                      m4 = _mm_set1_epi8(0xF);
        const __m256i idx =
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
        const __m256i lut =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4nl_values));
        return _mm256_shuffle_epi8(lut, idx);
    }
    if (kind == LB_TQ1_0) return lb_tq1_chunk((const tm_block_tq1_0 *)w->p, c);
    /* q2_K, q3_K, tq2_0: value 32c + l has 2 bits at qs[32*(c/4) + l], shift 2*(c%4) */
    const uint8_t *qs = kind == LB_Q2_K   ? ((const tm_block_q2_k *)w->p)->qs
                        : kind == LB_Q3_K ? ((const tm_block_q3_k *)w->p)->qs
                                          : ((const tm_block_tq2_0 *)w->p)->qs;
    const __m256i q = _mm256_and_si256(
        _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 4))), 2 * (c % 4)),
        _mm256_set1_epi8(3));
    if (kind != LB_Q3_K) return q;
    /* hmask bit c set: the value is not offset by -4, so q + 4 = q | 4 */
    const __m256i h = _mm256_and_si256(_mm256_srli_epi16(w->aux, c), _mm256_set1_epi8(1));
    return _mm256_or_si256(q, _mm256_slli_epi16(h, 2));
}

/* The int16 scales of chunk c (pairs of values of one sub-block share a lane). */
TM_LB_INLINE __m256i lb_chunk_scales(int kind, const lb_row *w, int c) {
    if (kind == LB_Q2_K || kind == LB_Q3_K)
        return _mm256_set_m128i(_mm_set1_epi16(w->sc[2 * c + 1]), _mm_set1_epi16(w->sc[2 * c]));
    if (kind == LB_IQ4_XS) return _mm256_set1_epi16(w->sc[c]);
    return _mm256_set1_epi16(1);
}

/* The block sum's start for one token: minus the offsets the unsigned forms add,
 * -4 sum_j sc_j bsum_j (q3_K) or -sum bsums (tq); 8 int32 lanes. */
TM_LB_INLINE __m256i lb_block_start(int kind, const lb_row *w, const tm_block_q8_k *x) {
    const __m256i bs = _mm256_loadu_si256((const __m256i *)x->bsums);
    if (kind == LB_Q3_K)
        return _mm256_slli_epi32(
            _mm256_sub_epi32(_mm256_setzero_si256(),
                             _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)w->sc), bs)),
            2);
    if (kind == LB_TQ1_0 || kind == LB_TQ2_0)
        return _mm256_sub_epi32(_mm256_setzero_si256(),
                                _mm256_madd_epi16(_mm256_set1_epi16(1), bs));
    return _mm256_setzero_si256();
}

/* ---- 32-value blocks ---- */

/* The fifth bits of a q5 block: 0x10 in byte i where bit i of qh is set. */
TM_LB_INLINE __m256i lb_q5_high(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i q = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(q, bits), bits),
                            _mm256_set1_epi8(0x10));
}

/* A 32-value block's values (the forms of the top comment), its d and, for
 * q4_1/q5_1, its m. */
TM_LB_INLINE __m256i lb32_load(int kind, const uint8_t *blk, float *d, float *m) {
    const uint8_t *qs;
    *m = 0;
    switch (kind) {
    case LB_Q4_1:
        qs = ((const tm_block_q4_1 *)blk)->qs;
        *d = lb_h2f(((const tm_block_q4_1 *)blk)->d), *m = lb_h2f(((const tm_block_q4_1 *)blk)->m);
        break;
    case LB_Q5_0:
        qs = ((const tm_block_q5_0 *)blk)->qs;
        *d = lb_h2f(((const tm_block_q5_0 *)blk)->d);
        break;
    case LB_Q5_1:
        qs = ((const tm_block_q5_1 *)blk)->qs;
        *d = lb_h2f(((const tm_block_q5_1 *)blk)->d), *m = lb_h2f(((const tm_block_q5_1 *)blk)->m);
        break;
    default:
        qs = ((const tm_block_iq4_nl *)blk)->qs;
        *d = lb_h2f(((const tm_block_iq4_nl *)blk)->d);
        break;
    }
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0xF);
    __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    if (kind == LB_IQ4_NL)
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4nl_values)), q);
    if (kind == LB_Q5_0) q = _mm256_or_si256(q, lb_q5_high(((const tm_block_q5_0 *)blk)->qh));
    if (kind == LB_Q5_1) q = _mm256_or_si256(q, lb_q5_high(((const tm_block_q5_1 *)blk)->qh));
    return q;
}

/* Each kernel file defines lb256_micro and lb32_micro, then its NAME_auto
 * products from these microkernels of exact tile sizes, and its getter. */
#define q2k_micro(R, T, a, r, t)   lb256_micro(R, T, a, r, t, LB_Q2_K)
#define q3k_micro(R, T, a, r, t)   lb256_micro(R, T, a, r, t, LB_Q3_K)
#define iq4xs_micro(R, T, a, r, t) lb256_micro(R, T, a, r, t, LB_IQ4_XS)
#define tq10_micro(R, T, a, r, t)  lb256_micro(R, T, a, r, t, LB_TQ1_0)
#define tq20_micro(R, T, a, r, t)  lb256_micro(R, T, a, r, t, LB_TQ2_0)
#define q41_micro(R, T, a, r, t)   lb32_micro(R, T, a, r, t, LB_Q4_1)
#define q50_micro(R, T, a, r, t)   lb32_micro(R, T, a, r, t, LB_Q5_0)
#define q51_micro(R, T, a, r, t)   lb32_micro(R, T, a, r, t, LB_Q5_1)
#define iq4nl_micro(R, T, a, r, t) lb32_micro(R, T, a, r, t, LB_IQ4_NL)

#define TM_LB_DEFINE_GET(getter)                                                                   \
    cpu_gemm_fn getter(tm_type wtype) {                                                            \
        switch (wtype) {                                                                           \
        case TM_TYPE_Q2_K:                                                                         \
            return q2k_auto;                                                                       \
        case TM_TYPE_Q3_K:                                                                         \
            return q3k_auto;                                                                       \
        case TM_TYPE_IQ4_XS:                                                                       \
            return iq4xs_auto;                                                                     \
        case TM_TYPE_TQ1_0:                                                                        \
            return tq10_auto;                                                                      \
        case TM_TYPE_TQ2_0:                                                                        \
            return tq20_auto;                                                                      \
        case TM_TYPE_Q4_1:                                                                         \
            return q41_auto;                                                                       \
        case TM_TYPE_Q5_0:                                                                         \
            return q50_auto;                                                                       \
        case TM_TYPE_Q5_1:                                                                         \
            return q51_auto;                                                                       \
        case TM_TYPE_IQ4_NL:                                                                       \
            return iq4nl_auto;                                                                     \
        default:                                                                                   \
            return NULL;                                                                           \
        }                                                                                          \
    }

#endif
#endif
