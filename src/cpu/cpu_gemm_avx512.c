/* AVX-512 kernels (F, BW, VL, DQ, VNNI), picked at run time.
 *
 * q4_K/q5_K: 64 nibbles per load; vpmaddubsw (u8 q x s8 x -> s16 pairs, no
 *   saturation: 2*31*127 < 2^15) then vpdpwssd with the sub-block scale
 *   accumulates s32. Weight vectors are regrouped with vshufi64x2 so that each
 *   holds two consecutive sub-blocks and activations load as plain 64 bytes.
 *   The mins term of a row is computed for all tokens of a tile at once.
 * q8_0/q4_0/mxfp4: two blocks per vector; weights made unsigned by an offset
 *   (q8_0/mxfp4: +128, q4_0: the nibble itself, offset 8), vpdpbusd starts
 *   from -offset * sum(x) per token so the block sum comes out exact.
 * q6_K: like q4_K with 16 sub-blocks of 16 (vpermw spreads the scales) and the
 *   -32 offset taken out through the activations' bsums.
 * q4_K/q5_K decode (one token) has a kernel of its own (k45_dec_micro): 8 rows
 *   per tile, the activations regrouped to the weights' layout once per tile,
 *   scales of 4 rows unpacked in one vector, vpdpbusd + vpackssdw + vpdpwssd.
 * q8_0/mxfp4 decode have their own too (q80_dec_micro, mxfp4_dec_micro): 8 rows
 *   per tile, the scales of all of them converted in one vector and picked per
 *   row with vpermps; mxfp4 takes four blocks per step into one vector of sums.
 * Float types fall back to the AVX2 kernels. Decode (one token) prefetches the
 * next row tile while computing the current one. */
#include <stdlib.h>

#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/cpu_gemm_tile.h"

#define TM_AVX512_INLINE TM_AVX512 static inline __attribute__((always_inline))

TM_AVX512_INLINE float h2f(tm_half h) {
    return _cvtsh_ss(h);
}

#define ROW(type, i, b) ((const type *)(a->w + (size_t)(r + (i)) * a->wrb) + (b))
#define TOK(type, j, b) ((const type *)(a->x + (size_t)(t + (j)) * a->xrb) + (b))

/* Prefetch the same block of the next tile's rows (decode walks rows in tiles). */
TM_AVX512_INLINE void prefetch_next(const tm_tile_args *a, int64_t r, int nr, int i, size_t off,
                                    size_t bytes) {
    const char *p = a->w + (size_t)(r + nr + i) * a->wrb + off;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* ---- q4_K / q5_K ---- */

TM_AVX512_INLINE void k45_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                                int q5) {
    __m512 acc[4][4], accm[4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++) {
        accm[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(0xF), b16 = _mm512_set1_epi8(16);
    /* pshufb controls: vector m holds sub-blocks 2m (low 256 bits) and 2m+1 (high);
     * each 128-bit lane broadcasts one int16 scale */
    __m512i ctrl[4];
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        char lo0 = (char)(4 * m), lo1 = (char)(4 * m + 1), hi0 = (char)(4 * m + 2),
             hi1 = (char)(4 * m + 3);
        __m128i cl = _mm_setr_epi8(lo0, lo1, lo0, lo1, lo0, lo1, lo0, lo1, lo0, lo1, lo0, lo1, lo0,
                                   lo1, lo0, lo1);
        __m128i ch = _mm_setr_epi8(hi0, hi1, hi0, hi1, hi0, hi1, hi0, hi1, hi0, hi1, hi0, hi1, hi0,
                                   hi1, hi0, hi1);
        ctrl[m] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(cl, cl)),
                                     _mm256_set_m128i(ch, ch), 1);
    }
    const size_t bsize = q5 ? sizeof(tm_block_q5_k) : sizeof(tm_block_q4_k);
    const int64_t nb = a->k / TM_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        const tm_block_q8_k *x[4];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) x[j] = TOK(tm_block_q8_k, j, b);
        /* tokens' bsums per 32 (8 int16 each) side by side, and their scales per lane group */
        __m512i bsv = _mm512_setzero_si512();
        float dxs[16];
        for (int j = 0; j < (nt == 1 ? 0 : 4); j++) {
            float dx = j < nt ? x[j]->d : 0.f;
#pragma GCC unroll 4
            for (int l = 0; l < 4; l++) dxs[4 * j + l] = dx;
        }
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) {
            __m128i bj = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x[j]->bsums),
                                        _mm_loadu_si128((const __m128i *)(x[j]->bsums + 8)));
            switch (j) {
            case 0:
                bsv = _mm512_inserti32x4(bsv, bj, 0);
                break;
            case 1:
                bsv = _mm512_inserti32x4(bsv, bj, 1);
                break;
            case 2:
                bsv = _mm512_inserti32x4(bsv, bj, 2);
                break;
            default:
                bsv = _mm512_inserti32x4(bsv, bj, 3);
                break;
            }
        }
        const __m512 dxv = nt == 1 ? _mm512_set1_ps(x[0]->d)
                                   : _mm512_loadu_ps(dxs); /* lanes past nt meet zero bsums */
        __m512 dx1[4];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) dx1[j] = _mm512_set1_ps(x[j]->d);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const char *blk = a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize;
            if (nt == 1) prefetch_next(a, r, nr, i, (size_t)b * bsize, bsize);
            const tm_block_q4_k *w4 = (const tm_block_q4_k *)blk;
            const tm_block_q5_k *w5 = (const tm_block_q5_k *)blk;
            uint8_t sm[16];
            cpu_k4_unpack_scales(q5 ? w5->scales : w4->scales, sm);
            const __m512i sc =
                _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm)));
            const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8)));
            const uint8_t *qs = q5 ? w5->qs : w4->qs;
            __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
            __m512i l0 = _mm512_and_si512(q0, m4),
                    h0 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
            __m512i l1 = _mm512_and_si512(q1, m4),
                    h1 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
            /* l0 = [s0 | s2], h0 = [s1 | s3]: regroup to [s0 | s1], [s2 | s3], ... */
            __m512i v[4];
            v[0] = _mm512_shuffle_i64x2(l0, h0, 0x44);
            v[1] = _mm512_shuffle_i64x2(l0, h0, 0xEE);
            v[2] = _mm512_shuffle_i64x2(l1, h1, 0x44);
            v[3] = _mm512_shuffle_i64x2(l1, h1, 0xEE);
            if (q5) { /* fifth bit: qh[l] bit s for value l of sub-block s */
                const __m512i qh =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)w5->qh));
#pragma GCC unroll 4
                for (int m = 0; m < 4; m++) {
                    const __m512i bits =
                        _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * m))),
                                           _mm256_set1_epi8((char)(2 << (2 * m))), 1);
                    __mmask64 k = _mm512_test_epi8_mask(qh, bits);
                    v[m] = _mm512_mask_add_epi8(v[m], k, v[m], b16);
                }
            }
            __m512i s[4];
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++) s[m] = _mm512_shuffle_epi8(sc, ctrl[m]);
            const float d = h2f(q5 ? w5->d : w4->d), dmin = h2f(q5 ? w5->dmin : w4->dmin);
            const __m512 dv = _mm512_set1_ps(d);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                __m512i acci = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int m = 0; m < 4; m++) {
                    __m512i xv = _mm512_loadu_si512(x[j]->qs + 64 * m);
                    acci = _mm512_dpwssd_epi32(acci, _mm512_maddubs_epi16(v[m], xv), s[m]);
                }
                acc[i][j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci), _mm512_mul_ps(dv, dx1[j]), acc[i][j]);
            }
            /* mins for all tokens: lanes 4j..4j+3 hold token j's partial sums */
            __m512i pm = _mm512_madd_epi16(_mm512_broadcast_i32x4(mins), bsv);
            accm[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pm),
                                      _mm512_mul_ps(_mm512_set1_ps(dmin), dxv), accm[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++) {
        float mt[16];
        _mm512_storeu_ps(mt, accm[i]);
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            a->y[(t + j) * a->ldy + r + i] =
                _mm512_reduce_add_ps(acc[i][j]) -
                ((mt[4 * j] + mt[4 * j + 1]) + (mt[4 * j + 2] + mt[4 * j + 3]));
    }
}

#define q4k_micro(R, T, a, r, t) k45_micro(R, T, a, r, t, 0)
#define q5k_micro(R, T, a, r, t) k45_micro(R, T, a, r, t, 1)

/* ---- q4_K / q5_K decode (one token): K45D_NR rows per tile ----
 * The prompt kernel spends most of its time per weight byte on work the
 * token could carry: here the activations are regrouped once per block of the
 * tile to match the weights' nibble layout ([s0 | s2], [s1 | s3], [s4 | s6],
 * [s5 | s7] for low and high nibbles of the two 64-byte loads), vpdpbusd sums
 * 4 products per lane without scales (at most 4*31*128 < 2^15), vpackssdw
 * pairs two such vectors into int16 and one vpdpwssd applies the sub-block
 * scales of both. The scales, mins, d and dmin of 4 rows are unpacked
 * together, one 128-bit lane per row, and the mins term of those rows is one
 * madd. Integer block sums are the same as the prompt kernel's; only the
 * float summation order differs. */

#define K45D_NR 8 /* rows unpack 4 to a vector; TM_DEFINE_GEMV leaves tails of 4, 2 and 1 */

TM_AVX512_INLINE __m512i bcast16(char b0, char b1, char b2, char b3, char b4, char b5, char b6,
                                 char b7, char b8, char b9, char b10, char b11, char b12, char b13,
                                 char b14, char b15) {
    return _mm512_broadcast_i32x4(
        _mm_setr_epi8(b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15));
}

/* 128-bit lane i of v in every lane. The shuffle wants an immediate: the
 * switch gives one per case, which -O0 needs and an unrolled loop folds away. */
TM_AVX512_INLINE __m512i lane_broadcast(__m512i v, int i) {
    switch (i) {
    case 0:
        return _mm512_shuffle_i32x4(v, v, 0x00);
    case 1:
        return _mm512_shuffle_i32x4(v, v, 0x55);
    case 2:
        return _mm512_shuffle_i32x4(v, v, 0xAA);
    default:
        return _mm512_shuffle_i32x4(v, v, 0xFF);
    }
}

TM_AVX512_INLINE void k45_dec_micro(int nr, const tm_tile_args *a, int64_t r, int q5) {
    enum { Z = -1 }; /* pshufb: a zero byte */
    const int ng = (nr + 3) / 4;
    __m512 acc[K45D_NR], accm[K45D_NR / 4];
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int g = 0; g < ng; g++) accm[g] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0xF), c30 = _mm512_set1_epi8(0x30);
    /* a lane holds a block's first 16 bytes (d, dmin, scales q[0..11] at 4..15);
     * unpacked to scales 0..7 then mins 0..7 (cpu_k4_scale_min): low bits from
     * ua (bytes 12..15 shifted down 4), masked by um; bits 4-5 from ub's bits 6-7 */
    const __m512i ua = bcast16(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i ub = bcast16(Z, Z, Z, Z, 4, 5, 6, 7, Z, Z, Z, Z, 8, 9, 10, 11);
    const __m512i um = bcast16(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    const __mmask64 hi4 = 0xF000F000F000F000ull;
    /* mins as int16; scale words of the packed pairs: lanes 0-1 hold sub-blocks
     * (0, 1) or (4, 5), lanes 2-3 (2, 3) or (6, 7), four words each */
    const __m512i mw = bcast16(8, Z, 9, Z, 10, Z, 11, Z, 12, Z, 13, Z, 14, Z, 15, Z);
    __m512i sw[2];
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
        const char s0 = (char)(4 * p), s1 = (char)(4 * p + 1), s2 = (char)(4 * p + 2),
                   s3 = (char)(4 * p + 3);
        const __m256i lo = _mm256_broadcastsi128_si256(
            _mm_setr_epi8(s0, Z, s0, Z, s0, Z, s0, Z, s1, Z, s1, Z, s1, Z, s1, Z));
        const __m256i hi = _mm256_broadcastsi128_si256(
            _mm_setr_epi8(s2, Z, s2, Z, s2, Z, s2, Z, s3, Z, s3, Z, s3, Z, s3, Z));
        sw[p] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    /* d (then dmin) of row i of a group, from the two halves of its float heads */
    __m512i didx[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) didx[i] = _mm512_set1_epi32(8 * i);
    const __m512i midx = _mm512_setr_epi32(1, 1, 1, 1, 9, 9, 9, 9, 17, 17, 17, 17, 25, 25, 25, 25);
    const size_t bsize = q5 ? sizeof(tm_block_q5_k) : sizeof(tm_block_q4_k);
    const size_t qoff = q5 ? offsetof(tm_block_q5_k, qs) : offsetof(tm_block_q4_k, qs);
    const int64_t nb = a->k / TM_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        const tm_block_q8_k *x = (const tm_block_q8_k *)a->x + b;
        const __m512i x0 = _mm512_loadu_si512(x->qs), x1 = _mm512_loadu_si512(x->qs + 64);
        const __m512i x2 = _mm512_loadu_si512(x->qs + 128), x3 = _mm512_loadu_si512(x->qs + 192);
        const __m512i xv[4] = {
            _mm512_shuffle_i64x2(x0, x1, 0x44), _mm512_shuffle_i64x2(x0, x1, 0xEE),
            _mm512_shuffle_i64x2(x2, x3, 0x44), _mm512_shuffle_i64x2(x2, x3, 0xEE)};
        const __m512i bsum = _mm512_broadcast_i32x4(
            _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x->bsums),
                           _mm_loadu_si128((const __m128i *)(x->bsums + 8))));
        const __m512 dx = _mm512_set1_ps(x->d);
        const char *blk0 = a->w + (size_t)r * a->wrb + (size_t)b * bsize;
#pragma GCC unroll 2
        for (int g = 0; g < ng; g++) {
            /* heads of rows 4g.. (row 4g again where the tile has fewer) */
            const char *bg = blk0 + (size_t)(4 * g) * a->wrb;
            __m512i head = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)bg));
#pragma GCC unroll 3
            for (int i = 1; i < 4; i++)
                if (4 * g + i < nr) {
                    const __m128i h = _mm_loadu_si128((const __m128i *)(bg + (size_t)i * a->wrb));
                    head = i == 1   ? _mm512_inserti32x4(head, h, 1)
                           : i == 2 ? _mm512_inserti32x4(head, h, 2)
                                    : _mm512_inserti32x4(head, h, 3);
                }
            const __m512i sa = _mm512_shuffle_epi8(head, ua);
            const __m512i lo =
                _mm512_and_si512(_mm512_mask_mov_epi8(sa, hi4, _mm512_srli_epi16(sa, 4)), um);
            const __m512i hi =
                _mm512_and_si512(_mm512_srli_epi16(_mm512_shuffle_epi8(head, ub), 2), c30);
            const __m512i sm = _mm512_or_si512(lo, hi);
            /* d, dmin of each row (dword 0 of its lane) as floats times dx */
            const __m512i dd = _mm512_shuffle_epi32(head, _MM_PERM_AAAA);
            const __m512 f0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(dd)), dx);
            const __m512 f1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(dd, 1)), dx);
            /* mins: lanes 4i..4i+3 hold row 4g+i's partial sums */
            accm[g] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_madd_epi16(_mm512_shuffle_epi8(sm, mw), bsum)),
                _mm512_permutex2var_ps(f0, midx, f1), accm[g]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int row = 4 * g + i;
                if (row >= nr) break;
                const char *blk = bg + (size_t)i * a->wrb;
                prefetch_next(a, r, nr, row, (size_t)b * bsize, bsize);
                const __m512i q0 = _mm512_loadu_si512(blk + qoff);
                const __m512i q1 = _mm512_loadu_si512(blk + qoff + 64);
                __m512i v[4] = {
                    _mm512_and_si512(q0, m4), _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4),
                    _mm512_and_si512(q1, m4), _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4)};
                if (q5) { /* fifth bit: qh[l] bit s for value l of sub-block s */
                    const __m512i qh = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)((const tm_block_q5_k *)blk)->qh));
#pragma GCC unroll 4
                    for (int m = 0; m < 4; m++) { /* v[m] holds sub-blocks s and s + 2 */
                        const int s = (m & 1) + 4 * (m >> 1);
                        const __m512i bits = _mm512_inserti64x4(
                            _mm512_set1_epi8((char)(1 << s)), _mm256_set1_epi8((char)(4 << s)), 1);
                        v[m] = _mm512_mask_add_epi8(v[m], _mm512_test_epi8_mask(qh, bits), v[m],
                                                    _mm512_set1_epi8(16));
                    }
                }
                const __m512i scl = lane_broadcast(sm, i);
                __m512i acci = _mm512_setzero_si512();
#pragma GCC unroll 2
                for (int p = 0; p < 2; p++) {
                    const __m512i z = _mm512_setzero_si512();
                    const __m512i pk =
                        _mm512_packs_epi32(_mm512_dpbusd_epi32(z, v[2 * p], xv[2 * p]),
                                           _mm512_dpbusd_epi32(z, v[2 * p + 1], xv[2 * p + 1]));
                    acci = _mm512_dpwssd_epi32(acci, pk, _mm512_shuffle_epi8(scl, sw[p]));
                }
                acc[row] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci),
                                           _mm512_permutex2var_ps(f0, didx[i], f1), acc[row]);
            }
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < ng; g++) {
        float mt[16];
        _mm512_storeu_ps(mt, accm[g]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            if (4 * g + i < nr)
                a->y[r + 4 * g + i] =
                    _mm512_reduce_add_ps(acc[4 * g + i]) -
                    ((mt[4 * i] + mt[4 * i + 1]) + (mt[4 * i + 2] + mt[4 * i + 3]));
    }
}

#define q4k_dec_micro(nr, a, r) k45_dec_micro(nr, a, r, 0)
#define q5k_dec_micro(nr, a, r) k45_dec_micro(nr, a, r, 1)
TM_DEFINE_GEMV(TM_AVX512, q4k_dec, q4k_dec_micro, K45D_NR)
TM_DEFINE_GEMV(TM_AVX512, q5k_dec, q5k_dec_micro, K45D_NR)

/* ---- q6_K: 6-bit q in 0..63 times x, minus 32 * sum_j sc_j bsum_j ----
 * Per half of 128 values, one 64-byte ql load gives values 0..63 (low nibbles,
 * high bits from qh bits 0-1 / 2-3) and 64..127 (high nibbles, qh bits 4-5 /
 * 6-7); each 128-bit lane of those vectors is one sub-block of 16. */

TM_AVX512_INLINE void q6k_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    /* word shifts: low 256 bits move qh bits 0-1 (4-5) to 4-5, high bits 2-3 (6-7) */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    /* vpermw indices: 128-bit lane L of vector v (0..3) takes scale word 4v + L */
    __m512i sidx[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++)
        sidx[v] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)(4 * v + 1)),
                                                    _mm_set1_epi16((short)(4 * v)))),
            _mm256_set_m128i(_mm_set1_epi16((short)(4 * v + 3)),
                             _mm_set1_epi16((short)(4 * v + 2))),
            1);
    const int64_t nb = a->k / TM_QK_K;
    for (int64_t b = 0; b < nb; b++) {
        const tm_block_q8_k *x[4];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) x[j] = TOK(tm_block_q8_k, j, b);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const tm_block_q6_k *w = ROW(tm_block_q6_k, i, b);
            if (nt == 1)
                prefetch_next(a, r, nr, i, (size_t)b * sizeof(tm_block_q6_k),
                              sizeof(tm_block_q6_k));
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
            const __m512i scz = _mm512_castsi256_si512(sc16);
            __m512i q[4], s[4];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i ql = _mm512_loadu_si512(w->ql + 64 * h);
                __m512i qh =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w->qh + 32 * h)));
                q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                           _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
                q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                               _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
            }
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) s[v] = _mm512_permutexvar_epi16(sidx[v], scz);
            const float d = h2f(w->d);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                __m256i corr =
                    _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x[j]->bsums));
                __m512i acci = _mm512_castsi256_si512(
                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5)));
                acci = _mm512_inserti64x4(acci, _mm256_setzero_si256(), 1);
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++)
                    acci = _mm512_dpwssd_epi32(
                        acci, _mm512_maddubs_epi16(q[v], _mm512_loadu_si512(x[j]->qs + 64 * v)),
                        s[v]);
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci), _mm512_set1_ps(d * x[j]->d),
                                            acc[i][j]);
            }
        }
    }
    cpu_tile_store_avx512(nr, nt, a, r, t, acc);
}

/* ---- blocks of 32 times q8_0, two blocks per vector ---- */

enum { B32_Q8_0, B32_Q4_0, B32_MXFP4 };

/* Unsigned weights of blocks b (low 256 bits) and b+1 (high; zero when !two),
 * and their scales per 8 lanes. */
TM_AVX512_INLINE __m512i b32_load2(int kind, const char *blk, size_t bsize, int two,
                                   __m512 *scale) {
    const char *blk1 = blk + bsize;
    float s0, s1 = 0;
    __m512i u;
    if (kind == B32_Q8_0) {
        const tm_block_q8_0 *q0 = (const tm_block_q8_0 *)blk, *q1 = (const tm_block_q8_0 *)blk1;
        s0 = h2f(q0->d);
        __m256i lo = _mm256_loadu_si256((const __m256i *)q0->qs);
        __m256i hi = two ? _mm256_loadu_si256((const __m256i *)q1->qs) : _mm256_set1_epi8(-128);
        if (two) s1 = h2f(q1->d);
        u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                             _mm512_set1_epi8(-128));
    } else {
        size_t qoff = kind == B32_Q4_0 ? offsetof(tm_block_q4_0, qs) : offsetof(tm_block_mxfp4, qs);
        __m128i a0 = _mm_loadu_si128((const __m128i *)(blk + qoff));
        __m128i a1 = two ? _mm_loadu_si128((const __m128i *)(blk1 + qoff)) : _mm_setzero_si128();
        __m256i q = _mm256_set_m128i(a1, a0);
        const __m256i m4 = _mm256_set1_epi8(0xF);
        __m256i l = _mm256_and_si256(q, m4), h = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        /* [l0 l1 h0 h1] -> [l0 h0 l1 h1]: block b's values 0..15, 16..31, then block b+1's */
        u = _mm512_shuffle_i64x2(_mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1),
                                 _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1),
                                 _MM_SHUFFLE(3, 1, 2, 0));
        if (kind == B32_Q4_0) {
            s0 = h2f(((const tm_block_q4_0 *)blk)->d);
            if (two) s1 = h2f(((const tm_block_q4_0 *)blk1)->d);
        } else {
            /* doubled e2m1 values + 128, so the q8_0 offset applies */
            const __m512i lut = _mm512_broadcast_i32x4(_mm_xor_si128(
                _mm_loadu_si128((const __m128i *)cpu_mxfp4_values), _mm_set1_epi8(-128)));
            u = _mm512_shuffle_epi8(lut, u);
            s0 = cpu_e8m0_half(((const tm_block_mxfp4 *)blk)->e);
            if (two) s1 = cpu_e8m0_half(((const tm_block_mxfp4 *)blk1)->e);
        }
    }
    *scale = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)), _mm256_set1_ps(s1), 1);
    return u;
}

TM_AVX512_INLINE void b32_micro(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                                int kind, size_t bsize) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi8(kind == B32_Q4_0 ? 8 : -128); /* as u8: 8 or 128 */
    const int64_t nb = a->k / 32;
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512i xv[4], neg[4];
        __m512 dx[4];
#pragma GCC unroll 4
        for (int j = 0; j < nt; j++) {
            const tm_block_q8_0 *x0 = TOK(tm_block_q8_0, j, b), *x1 = x0 + 1;
            __m256i lo = _mm256_loadu_si256((const __m256i *)x0->qs);
            __m256i hi = two ? _mm256_loadu_si256((const __m256i *)x1->qs) : _mm256_setzero_si256();
            xv[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            neg[j] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, xv[j]));
            dx[j] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(h2f(x0->d))),
                                       _mm256_set1_ps(two ? h2f(x1->d) : 0.f), 1);
        }
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const char *blk = a->w + (size_t)(r + i) * a->wrb + (size_t)b * bsize;
            if (nt == 1) prefetch_next(a, r, nr, i, (size_t)b * bsize, 2 * bsize);
            __m512 ws;
            __m512i u = b32_load2(kind, blk, bsize, two, &ws);
#pragma GCC unroll 4
            for (int j = 0; j < nt; j++) {
                __m512i dp = _mm512_dpbusd_epi32(neg[j], u, xv[j]);
                acc[i][j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(ws, dx[j]), acc[i][j]);
            }
        }
    }
    cpu_tile_store_avx512(nr, nt, a, r, t, acc);
}

/* ---- q8_0 / mxfp4 decode (one token) ----
 * B32D_NR rows per tile, what is left in tiles of 4, 2 and 1. The weights'
 * scales of all rows of a tile are gathered as bytes/halves, converted in one
 * vector and multiplied by the activation scales there; each row then picks
 * its own with one vpermps. q8_0 takes two blocks per vector (block b in the
 * low 256 bits), mxfp4 four: its low nibbles (values 0..15 of blocks b..b+3,
 * one 128-bit lane each) and high nibbles (16..31) go to two vpdpbusd into the
 * same sums, the activations regrouped to match once per tile. */

enum { B32D_NR = 8 };

/* The rows' scales go to a small array by scalar stores and come back as one
 * vector load; left to itself the compiler builds that vector with vpinsrw and
 * vpunpck (port 5), so the stores are volatile and the array goes through
 * memory. */
#define B32D_IN_MEMORY(arr) __asm__("" : "+m"(arr))

/* Row i's scales in a vector of rows' scales, PER blocks of each row side by
 * side: lane l takes scale PER * i + l / (16 / PER). */
TM_AVX512_INLINE __m512i b32d_sidx(int i, int per) {
    int32_t v[16];
    for (int l = 0; l < 16; l++) v[l] = per * i + l / (16 / per);
    return _mm512_loadu_si512(v);
}

/* Blocks b, b+1 (two) of a q8_0 row tile; hs: the tile's scales as halves. */
TM_AVX512_INLINE void q80_dec_step(int nr, const tm_tile_args *a, int64_t r, int64_t b, int two,
                                   uint32_t (*hsp)[B32D_NR], __m512 *acc, const __m512i *sidx) {
    uint32_t *hs = *hsp;
    const tm_block_q8_0 *x = (const tm_block_q8_0 *)a->x + b;
    const __m256i xhi = two ? _mm256_loadu_si256((const __m256i *)x[1].qs) : _mm256_setzero_si256();
    const __m512i xv = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x->qs)), xhi, 1);
    const __m512i sgn = _mm512_set1_epi8(-128);
    const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), sgn, xv));
    /* [d(b), d(b+1)] repeated, as floats */
    const __m512 dx = _mm512_cvtph_ps(
        _mm256_set1_epi32((int)((uint32_t)x->d | (two ? (uint32_t)x[1].d << 16 : 0))));
    const char *blk0 = a->w + (size_t)r * a->wrb + (size_t)b * sizeof(tm_block_q8_0);
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) {
        const tm_block_q8_0 *w = (const tm_block_q8_0 *)(blk0 + (size_t)i * a->wrb);
        ((volatile uint32_t *)hs)[i] = w->d | (two ? (uint32_t)w[1].d << 16 : 0);
    }
    B32D_IN_MEMORY(*hsp);
    const __m512 s = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hs)), dx);
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) {
        const tm_block_q8_0 *w = (const tm_block_q8_0 *)(blk0 + (size_t)i * a->wrb);
        prefetch_next(a, r, nr, i, (size_t)b * sizeof(tm_block_q8_0), 2 * sizeof(tm_block_q8_0));
        const __m256i whi =
            two ? _mm256_loadu_si256((const __m256i *)w[1].qs) : _mm256_setzero_si256();
        const __m512i u = _mm512_xor_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)w->qs)),
                               whi, 1),
            sgn);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(neg, u, xv)),
                                 _mm512_permutexvar_ps(sidx[i], s), acc[i]);
    }
}

TM_AVX512_INLINE void q80_dec_micro(int nr, const tm_tile_args *a, int64_t r) {
    __m512 acc[B32D_NR];
    __m512i sidx[B32D_NR];
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps(), sidx[i] = b32d_sidx(i, 2);
    uint32_t hs[B32D_NR] = {0};
    const int64_t nb = a->k / 32;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) q80_dec_step(nr, a, r, b, 1, &hs, acc, sidx);
    if (b < nb) q80_dec_step(nr, a, r, b, 0, &hs, acc, sidx);
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) a->y[r + i] = _mm512_reduce_add_ps(acc[i]);
}

/* e8m0 exponents (one per dword) to cpu_e8m0_half's floats */
TM_AVX512_INLINE __m512 e8m0_half_ps(__m512i e) {
    const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(
        _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), big, small));
}

/* Blocks b..b+nq-1 (nq <= 4) of an mxfp4 row tile; es: the tile's exponents. */
TM_AVX512_INLINE void mxfp4_dec_step(int nr, const tm_tile_args *a, int64_t r, int64_t b, int nq,
                                     uint32_t (*esp)[B32D_NR], __m512 *acc, const __m512i *sidx) {
    uint32_t *es = *esp;
    const tm_block_q8_0 *x = (const tm_block_q8_0 *)a->x + b;
    /* xl: values 0..15 of blocks b..b+3 (a lane each), xh: values 16..31 */
    __m512i xl = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)x->qs));
    __m512i xh = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(x->qs + 16)));
    uint16_t dh[4] = {x->d, 0, 0, 0};
#pragma GCC unroll 3
    for (int q = 1; q < 4; q++) {
        const __m128i l = q < nq ? _mm_loadu_si128((const __m128i *)x[q].qs) : _mm_setzero_si128();
        const __m128i h =
            q < nq ? _mm_loadu_si128((const __m128i *)(x[q].qs + 16)) : _mm_setzero_si128();
        if (q < nq) dh[q] = x[q].d;
        xl = q == 1   ? _mm512_inserti32x4(xl, l, 1)
             : q == 2 ? _mm512_inserti32x4(xl, l, 2)
                      : _mm512_inserti32x4(xl, l, 3);
        xh = q == 1   ? _mm512_inserti32x4(xh, h, 1)
             : q == 2 ? _mm512_inserti32x4(xh, h, 2)
                      : _mm512_inserti32x4(xh, h, 3);
    }
    const __m512i c128 = _mm512_set1_epi8(-128), m4 = _mm512_set1_epi8(0xF);
    const __m512i neg = _mm512_sub_epi32(
        _mm512_setzero_si512(),
        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, xl), c128, xh));
    int64_t dq;
    memcpy(&dq, dh, 8);
    const __m512 dx = _mm512_cvtph_ps(_mm256_set1_epi64x(dq)); /* [d(b)..d(b+3)] repeated */
    /* doubled e2m1 values + 128, so the offset above applies */
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)cpu_mxfp4_values), _mm_set1_epi8(-128)));
    const char *blk0 = a->w + (size_t)r * a->wrb + (size_t)b * sizeof(tm_block_mxfp4);
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) {
        const tm_block_mxfp4 *w = (const tm_block_mxfp4 *)(blk0 + (size_t)i * a->wrb);
        uint32_t e = w->e;
#pragma GCC unroll 3
        for (int q = 1; q < 4; q++) e |= q < nq ? (uint32_t)w[q].e << (8 * q) : 0;
        ((volatile uint32_t *)es)[i] = e;
    }
    B32D_IN_MEMORY(*esp);
    __m512 s[B32D_NR / 4];
#pragma GCC unroll 2
    for (int g = 0; g < (nr + 3) / 4; g++)
        s[g] = _mm512_mul_ps(
            e8m0_half_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(es + 4 * g)))), dx);
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) {
        const tm_block_mxfp4 *w = (const tm_block_mxfp4 *)(blk0 + (size_t)i * a->wrb);
        prefetch_next(a, r, nr, i, (size_t)b * sizeof(tm_block_mxfp4), 4 * sizeof(tm_block_mxfp4));
        __m512i qv = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)w->qs));
#pragma GCC unroll 3
        for (int q = 1; q < 4; q++) {
            const __m128i v =
                q < nq ? _mm_loadu_si128((const __m128i *)w[q].qs) : _mm_setzero_si128();
            qv = q == 1   ? _mm512_inserti32x4(qv, v, 1)
                 : q == 2 ? _mm512_inserti32x4(qv, v, 2)
                          : _mm512_inserti32x4(qv, v, 3);
        }
        const __m512i ul = _mm512_shuffle_epi8(lut, _mm512_and_si512(qv, m4));
        const __m512i uh = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(qv, 4), m4));
        const __m512i dp = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(neg, ul, xl), uh, xh);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(sidx[i], s[i / 4]),
                                 acc[i]);
    }
}

TM_AVX512_INLINE void mxfp4_dec_micro(int nr, const tm_tile_args *a, int64_t r) {
    __m512 acc[B32D_NR];
    __m512i sidx[B32D_NR];
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps(), sidx[i] = b32d_sidx(i % 4, 4);
    uint32_t es[B32D_NR] = {0};
    const int64_t nb = a->k / 32;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) mxfp4_dec_step(nr, a, r, b, 4, &es, acc, sidx);
    if (b < nb) mxfp4_dec_step(nr, a, r, b, (int)(nb - b), &es, acc, sidx);
#pragma GCC unroll 8
    for (int i = 0; i < nr; i++) a->y[r + i] = _mm512_reduce_add_ps(acc[i]);
}

TM_DEFINE_GEMV(TM_AVX512, q80_dec, q80_dec_micro, B32D_NR)
TM_DEFINE_GEMV(TM_AVX512, mxfp4_dec, mxfp4_dec_micro, B32D_NR)

#define q80_micro(R, T, a, r, t)   b32_micro(R, T, a, r, t, B32_Q8_0, sizeof(tm_block_q8_0))
#define q40_micro(R, T, a, r, t)   b32_micro(R, T, a, r, t, B32_Q4_0, sizeof(tm_block_q4_0))
#define mxfp4_micro(R, T, a, r, t) b32_micro(R, T, a, r, t, B32_MXFP4, sizeof(tm_block_mxfp4))

TM_DEFINE_GEMM(TM_AVX512, q4k_gemm, q4k_micro, 3, 4, 48)
TM_DEFINE_GEMM(TM_AVX512, q5k_gemm, q5k_micro, 3, 4, 48)
TM_DEFINE_GEMM(TM_AVX512, q6k_gemv, q6k_micro, 4, 1, 64)
TM_DEFINE_GEMM(TM_AVX512, q6k_gemm, q6k_micro, 3, 4, 48)
TM_DEFINE_GEMM(TM_AVX512, q80_gemm, q80_micro, 4, 4, 64)
TM_DEFINE_GEMM(TM_AVX512, q80_tile_gemv, q80_micro, 4, 1, 64) /* TIERMOE_Q80_DEC=0 */
TM_DEFINE_GEMM(TM_AVX512, q40_gemv, q40_micro, 4, 1, 64)
TM_DEFINE_GEMM(TM_AVX512, q40_gemm, q40_micro, 4, 4, 64)
TM_DEFINE_GEMM(TM_AVX512, mxfp4_gemm, mxfp4_micro, 4, 4, 64)

#define GEMV_OR_GEMM(name) GEMV_OR_GEMM_FN(name, name##_gemv)
#define GEMV_OR_GEMM_FN(name, gemv)                                                                \
    TM_AVX512 static void name##_auto(int64_t k, const void *w, size_t wrb, int64_t r0,            \
                                      int64_t r1, const void *xq, size_t xrb, int64_t n, float *y, \
                                      int64_t ldy) {                                               \
        (n == 1 ? gemv : name##_gemm)(k, w, wrb, r0, r1, xq, xrb, n, y, ldy);                      \
    }
GEMV_OR_GEMM_FN(q4k, q4k_dec)
GEMV_OR_GEMM_FN(q5k, q5k_dec)
GEMV_OR_GEMM(q6k)
GEMV_OR_GEMM_FN(q80, q80_dec)
GEMV_OR_GEMM(q40)
GEMV_OR_GEMM_FN(mxfp4, mxfp4_dec)
/* q8_0 decode through the generic 4-row tile: TIERMOE_Q80_DEC=0, for comparisons */
#define q80_tile_gemm q80_gemm
GEMV_OR_GEMM_FN(q80_tile, q80_tile_gemv)

cpu_gemm_fn cpu_gemm_avx512_get(tm_type wtype) {
    switch (wtype) {
    case TM_TYPE_Q4_K:
        return q4k_auto;
    case TM_TYPE_Q5_K:
        return q5k_auto;
    case TM_TYPE_Q6_K:
        return q6k_auto;
    case TM_TYPE_Q8_0: {
        static int tile = -1; /* read once: this runs for every product */
        if (tile < 0) {
            const char *e = getenv("TIERMOE_Q80_DEC");
            tile = e && !strcmp(e, "0");
        }
        return tile ? q80_tile_auto : q80_auto;
    }
    case TM_TYPE_Q4_0:
        return q40_auto;
    case TM_TYPE_MXFP4:
        return mxfp4_auto;
    default: {
        cpu_gemm_fn fn = cpu_gemm_iq_avx512_get(wtype);
        return fn ? fn : cpu_gemm_lowbit_avx512_get(wtype);
    }
    }
}
#else
cpu_gemm_fn cpu_gemm_avx512_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
#endif
