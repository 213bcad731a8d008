/* AMX-BF16 kernel for q4_K and q5_K weights with many tokens (n_tok >= 16).
 *
 * The int8 AMX kernel (cpu_gemm_amx.c) has to leave the tile unit after every
 * 32 values, because every sub-block carries its own scale and min: it stores
 * each C tile and scales it with AVX-512, and that, not the tile products, is
 * where its time goes. Here the weights are dequantized to bf16 with scale
 * and min folded in, and the activations are d_x q_x in bf16, so one C tile
 * sums a whole row in f32 without leaving the tile unit:
 *   C (16 weight rows x 16 tokens, f32) += A (16 rows x 32 values) . B (32 values x 16 tokens)
 * A is the dequantized weights in their natural row-major order (no
 * transpose); B is built once per call for all its tokens (fewer than the
 * rows) in the pair layout TDPBF16PS reads: B[value/2][token][2]. Two row
 * tiles times two token tiles give four C tiles, each A and B load feeding two
 * products.
 *
 * Dequantization is most of the time at ~32 tokens a call (one core, device:
 * ~50 of ~105 us for 256 rows x 2048). It is a table lookup per sub-block, and
 * it runs one block column (256 values of 32 rows, 16 KB) at a time right
 * before that column's tile loads, which then read A from L1 rather than L2.
 *
 * Rounding: each weight and each activation is rounded to bf16 (8 significant
 * bits, 2^-9 relative), so every product errs by at most (2^-8 + 2^-18) |w x|
 * beyond the integer kernels' exact block sums (cpu_gemm_error_rel says so
 * to the tests). That is the size of the q8 activation rounding every kernel
 * already has, and far below the 4-5 bit weights' own. */
#include "cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define TM_AMXBF                                                                                   \
    __attribute__((                                                                                \
        target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

enum { AMXBF_TOK_TILES = 8 }; /* token tiles (of 16) per B block: 128 tokens, 512 KB at k 2048 */

typedef struct amxbf_scratch {
    size_t cap_a; /* k both buffers hold */
    uint16_t *a;  /* 32 weight rows of k bf16, amxbf_lda(k) apart */
    uint8_t *b;   /* AMXBF_TOK_TILES x k/32 B tiles of 1 KB */
} amxbf_scratch;

static _Thread_local amxbf_scratch amxbf_tls;

/* Frees a pool thread's scratch when it ends (the key's value is a marker). */
static pthread_key_t amxbf_key;
static pthread_once_t amxbf_key_once = PTHREAD_ONCE_INIT;

static void amxbf_scratch_free(void *unused) {
    (void)unused;
    free(amxbf_tls.a);
    free(amxbf_tls.b);
    memset(&amxbf_tls, 0, sizeof amxbf_tls);
}

static void amxbf_key_create(void) {
    pthread_key_create(&amxbf_key, amxbf_scratch_free);
}

/* Row stride of the dequantized weights, in bf16 values: k plus one cache
 * line, so the 16 rows a tile load reads do not all fall into one L1 set when
 * 2k is a multiple of 4 KB (k = 2048). */
static inline int64_t amxbf_lda(int64_t k) {
    return k + 32;
}

static int amxbf_reserve(int64_t k) {
    amxbf_scratch *s = &amxbf_tls;
    if (!s->cap_a) {
        pthread_once(&amxbf_key_once, amxbf_key_create);
        pthread_setspecific(amxbf_key, s);
    }
    if ((size_t)k > s->cap_a) {
        free(s->a), free(s->b);
        s->a = aligned_alloc(64, 32 * 2 * (size_t)amxbf_lda(k));
        s->b = aligned_alloc(64, AMXBF_TOK_TILES * (size_t)(k / 32) * 1024);
        s->cap_a = s->a && s->b ? (size_t)k : 0;
        if (!s->cap_a) return -1;
    }
    return 0;
}

/* Tiles 0-3: C (row tile rt, token tile tt) = 2 rt + tt; 4, 5: A of row tiles
 * 0, 1; 6, 7: B of token tiles 0, 1. All 16 rows of 64 bytes. */
static void amxbf_configure(void) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    cpu_amx_configure(rows, colsb);
}

/* One q4_K or q5_K block (256 values) into dst as bf16: d sc_j q - dmin m_j.
 * A sub-block has only 16 (q4_K) or 32 (q5_K) distinct values, so they are
 * computed once as a bf16 table and each value is a word lookup (vpermw) by
 * its quant: no integer-to-float conversion per value. The table entries are
 * the same fma and rounding a per-value conversion would do. */
TM_AMXBF static inline void amxbf_dequant_block(int q5, const char *blkp, uint16_t *dst) {
    static const float iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const tm_block_q4_k *b4 = (const tm_block_q4_k *)blkp;
    const tm_block_q5_k *b5 = (const tm_block_q5_k *)blkp;
    const uint8_t *qs = q5 ? b5->qs : b4->qs;
    uint8_t sm[16];
    cpu_k4_unpack_scales(q5 ? b5->scales : b4->scales, sm);
    const float d = _cvtsh_ss(q5 ? b5->d : b4->d), dmin = _cvtsh_ss(q5 ? b5->dmin : b4->dmin);
    /* sc[j] = d sc_j, sc[8 + j] = -dmin m_j */
    float sc[16];
    const __m512 dd = _mm512_insertf32x8(_mm512_set1_ps(d), _mm256_set1_ps(-dmin), 1);
    _mm512_storeu_ps(sc, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                           _mm_loadu_si128((const __m128i *)sm))),
                                       dd));
    const __m512 q0 = _mm512_loadu_ps(iota), q16 = _mm512_add_ps(q0, _mm512_set1_ps(16));
    const __m256i m4 = _mm256_set1_epi8(0xF), b16 = _mm256_set1_epi8(16);
    const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)b5->qh) : _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) { /* 32 bytes: sub-block 2i in the low nibbles, 2i+1 high */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
        __m256i v[2] = {_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)};
        __m512i tab[2];
        if (q5) { /* fifth bit: bit j of qh[l] for value l; a 32-entry table per sub-block */
            for (int h = 0; h < 2; h++) {
                const int j = 2 * i + h;
                const __m256i bit = _mm256_set1_epi8((char)(1 << j));
                const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                v[h] = _mm256_add_epi8(v[h], _mm256_and_si256(set, b16));
                const __m512 s = _mm512_set1_ps(sc[j]), m = _mm512_set1_ps(sc[8 + j]);
                const __m512bh t =
                    _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(q16, s, m), _mm512_fmadd_ps(q0, s, m));
                memcpy(&tab[h], &t, 64);
            }
        } else { /* one table for the pair: words 0-15 sub-block 2i, 16-31 sub-block 2i+1 */
            const int j = 2 * i;
            const __m512bh t = _mm512_cvtne2ps_pbh(
                _mm512_fmadd_ps(q0, _mm512_set1_ps(sc[j + 1]), _mm512_set1_ps(sc[9 + j])),
                _mm512_fmadd_ps(q0, _mm512_set1_ps(sc[j]), _mm512_set1_ps(sc[8 + j])));
            memcpy(&tab[0], &t, 64);
            tab[1] = tab[0];
            v[1] = _mm256_or_si256(v[1], b16);
        }
        for (int h = 0; h < 2; h++)
            _mm512_storeu_si512(dst + 32 * (2 * i + h),
                                _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(v[h]), tab[h]));
    }
}

/* 16 rows of 16 dwords transposed in place: r[c] becomes column c. */
TM_AMXBF static inline void amxbf_transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[i + j], lane L: rows i..i+3 of column 4L + j */
    for (int i = 0; i < 16; i += 4) {
        u[i + 0] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88),
                      v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD),
                      v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88),
                      v3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
        r[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[4 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

/* B tiles for tokens [t0, t0 + 16 n_tt) (zero past n_tok): tile (T, c) holds
 * values [32c, 32c + 32) of tokens t0 + 16T .. + 15 as 16 rows (value pairs)
 * of 16 tokens x 2 bf16, each value d_x q_x. */
TM_AMXBF static void amxbf_pack_x(int64_t k, const char *xq, size_t xrb, int64_t t0, int64_t n_tok,
                                  int64_t n_tt, uint8_t *b) {
    const int64_t nc = k / 32;
    for (int64_t T = 0; T < n_tt; T++)
        for (int64_t c = 0; c < nc; c++) {
            __m512i r[16]; /* r[n]: token n's 32 values as 16 dwords of pairs */
            for (int n = 0; n < 16; n++) {
                const int64_t tok = t0 + 16 * T + n;
                if (tok >= n_tok) {
                    r[n] = _mm512_setzero_si512();
                    continue;
                }
                const tm_block_q8_k *xb = (const tm_block_q8_k *)(xq + (size_t)tok * xrb) + c / 8;
                const int8_t *q = xb->qs + 32 * (c % 8);
                const __m512 dx = _mm512_set1_ps(xb->d);
                const __m512 lo = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))),
                    dx);
                const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                    _mm_loadu_si128((const __m128i *)(q + 16)))),
                                                dx);
                const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
                memcpy(&r[n], &v, 64);
            }
            amxbf_transpose16(r);
            uint8_t *bt = b + (size_t)(T * nc + c) * 1024;
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(bt + 64 * p, r[p]);
        }
}

/* y[tok][row] for a stored C tile: row r + m, token t + n, within nr x nt. */
static void amxbf_store(const float *cb, float *y, int64_t ldy, int64_t r, int nr, int64_t t,
                        int nt) {
    for (int m = 0; m < nr; m++)
        for (int n = 0; n < nt; n++) y[(t + n) * ldy + r + m] = cb[16 * m + n];
}

/* C tiles 0-3 += A (rows a0, a1) . B (tokens b0, b1) over n 32-value chunks;
 * two_r / two_t say whether a1 / b1 hold rows / tokens. */
TM_AMXBF static inline void amxbf_tiles(const uint16_t *a0, const uint16_t *a1, const uint8_t *b0,
                                        const uint8_t *b1, int64_t n, long astride, int two_r,
                                        int two_t) {
    if (two_r && two_t) { /* the common case, without tests in the loop */
        for (int64_t c = 0; c < n; c++) {
            _tile_loadd(4, a0 + 32 * c, astride);
            _tile_loadd(6, b0 + 1024 * c, 64);
            _tile_loadd(7, b1 + 1024 * c, 64);
            _tile_loadd(5, a1 + 32 * c, astride);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        return;
    }
    for (int64_t c = 0; c < n; c++) {
        _tile_loadd(4, a0 + 32 * c, astride);
        _tile_loadd(6, b0 + 1024 * c, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_t) {
            _tile_loadd(7, b1 + 1024 * c, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (two_r) {
            _tile_loadd(5, a1 + 32 * c, astride);
            _tile_dpbf16ps(2, 5, 6);
        }
    }
}

TM_AMXBF static void amxbf_gemm(int q5, int64_t k, const void *wv, size_t wrb, int64_t r0,
                                int64_t r1, const void *xqv, size_t xrb, int64_t n_tok, float *y,
                                int64_t ldy) {
    if (amxbf_reserve(k)) { /* out of memory: the AVX-512 kernel needs none */
        cpu_gemm_avx512_get(q5 ? TM_TYPE_Q5_K : TM_TYPE_Q4_K)(k, wv, wrb, r0, r1, xqv, xrb, n_tok,
                                                              y, ldy);
        return;
    }
    amxbf_scratch *s = &amxbf_tls;
    const char *w = wv, *xq = xqv;
    const int64_t nc = k / 32;
    const int64_t lda = amxbf_lda(k);
    const long astride = (long)lda * 2;
    const size_t bsize = q5 ? sizeof(tm_block_q5_k) : sizeof(tm_block_q4_k);
    _Alignas(64) float cbuf[4][256];
    amxbf_configure();
    for (int64_t tb = 0; tb < n_tok; tb += 16 * AMXBF_TOK_TILES) { /* token blocks of B */
        const int64_t n_tt =
            (n_tok - tb + 15) / 16 < AMXBF_TOK_TILES ? (n_tok - tb + 15) / 16 : AMXBF_TOK_TILES;
        amxbf_pack_x(k, xq, xrb, tb, n_tok, n_tt, s->b);
        for (int64_t r = r0; r < r1; r += 32) {
            const int nr = (int)(r1 - r < 32 ? r1 - r : 32), two_r = nr > 16;
            for (int n = nr; n < (two_r ? 32 : 16); n++) /* zero rows give zero C rows */
                memset(s->a + (size_t)n * lda, 0, (size_t)k * 2);
            for (int64_t T = 0; T < n_tt; T += 2) {
                const int two_t = T + 1 < n_tt;
                const uint8_t *b0 = s->b + (size_t)(T * nc) * 1024, *b1 = b0 + (size_t)nc * 1024;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                /* The first token pair dequantizes one block column at a time
                 * just before its tile loads, which then find it in L1. */
                for (int64_t c = 0; c < nc; c += TM_QK_K / 32) {
                    if (T == 0) {
                        for (int n = 0; n < nr; n++)
                            amxbf_dequant_block(q5,
                                                w + (size_t)(r + n) * wrb + (size_t)c / 8 * bsize,
                                                s->a + (size_t)n * lda + 32 * c);
                        __asm__ volatile(
                            "" ::
                                : "memory"); /* tileloadd's asm does not say it reads memory */
                    }
                    amxbf_tiles(s->a + 32 * c, s->a + 16 * lda + 32 * c, b0 + 1024 * c,
                                b1 + 1024 * c, TM_QK_K / 32, astride, two_r, two_t);
                }
                _tile_stored(0, cbuf[0], 64);
                _tile_stored(1, cbuf[1], 64);
                _tile_stored(2, cbuf[2], 64);
                _tile_stored(3, cbuf[3], 64);
                __asm__ volatile("" ::: "memory"); /* nor that tilestored writes it */
                const int64_t t = tb + 16 * T;
                const int nt0 = (int)(n_tok - t < 16 ? n_tok - t : 16);
                const int nt1 = two_t ? (int)(n_tok - t - 16 < 16 ? n_tok - t - 16 : 16) : 0;
                const int nr0 = nr < 16 ? nr : 16, nr1 = nr - nr0;
                amxbf_store(cbuf[0], y, ldy, r, nr0, t, nt0);
                amxbf_store(cbuf[1], y, ldy, r, nr0, t + 16, nt1);
                amxbf_store(cbuf[2], y, ldy, r + 16, nr1, t, nt0);
                amxbf_store(cbuf[3], y, ldy, r + 16, nr1, t + 16, nt1);
            }
        }
    }
    _tile_release();
}

TM_AMXBF static void amxbf_gemm_q4_k(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,
                                     const void *xq, size_t xrb, int64_t n_tok, float *y,
                                     int64_t ldy) {
    amxbf_gemm(0, k, w, wrb, r0, r1, xq, xrb, n_tok, y, ldy);
}

TM_AMXBF static void amxbf_gemm_q5_k(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,
                                     const void *xq, size_t xrb, int64_t n_tok, float *y,
                                     int64_t ldy) {
    amxbf_gemm(1, k, w, wrb, r0, r1, xq, xrb, n_tok, y, ldy);
}

static cpu_gemm_fn amxbf_kernel(tm_type wtype) {
    return wtype == TM_TYPE_Q4_K ? amxbf_gemm_q4_k : wtype == TM_TYPE_Q5_K ? amxbf_gemm_q5_k : NULL;
}

/* TIERMOE_AMX_BF16=0 keeps K-quants on the int8 AMX kernel (for comparisons). */
cpu_gemm_fn cpu_gemm_amx_bf16_get(tm_type wtype) {
    static atomic_int enabled; /* 0: not decided yet, 1 yes, 2 no */
    int e = atomic_load_explicit(&enabled, memory_order_relaxed);
    if (!e) {
        const tm_cpu_features *f = cpu_features();
        const char *env = getenv("TIERMOE_AMX_BF16");
        e = f->amx_bf16 && f->avx512bf16 && !(env && !strcmp(env, "0")) ? 1 : 2;
        atomic_store_explicit(&enabled, e, memory_order_relaxed);
    }
    return e == 1 ? amxbf_kernel(wtype) : NULL;
}
#else
cpu_gemm_fn cpu_gemm_amx_bf16_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
#endif
