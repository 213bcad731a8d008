/* AMX-INT8 kernels for q8_0, q4_0, mxfp4, q4_K and q5_K weights, and the
 * low-bit types with 8-bit activations (cpu_gemm_amx_lowbit.c unpacks them),
 * with many tokens (n_tok >= 16); q6_K stays on AVX-512.
 *
 * C (16 tokens x 16 weight rows, s32) = A (16 tokens x 32 s8 activations, read
 * straight from the q8_0/q8_K rows with the row stride) . B (the same 32
 * values of 16 weight rows, repacked to the VNNI layout B[k/4][row][4]) via
 * TDPBSSD, one tile product per 32 values because every 32 values carry their
 * own scales (per 16 values, half tiles, for iq2_xs, iq2_s and iq1_m; 4
 * products of 64 values into one C for q2_K, q3_K, tq1_0 and tq2_0, whose
 * values carry their sub-block scales, cpu_gemm_amx_lowbit.c). Each C is then
 * scaled in float and added to 16 zmm accumulators:
 *   q8_0/q4_0/mxfp4: acc += C * d_w[row] * d_x[tok]  (q4_0 as q-8, mxfp4 as
 *                    its doubled e2m1 values, scale e8m0/2)
 *   q4_K/q5_K: acc += C * (d sc_j)[row] * d_x[tok] - (dmin m_j)[row] * bsum_j[tok] * d_x[tok]
 *   low-bit:   the same with sv, mv of cpu_amx_lowbit_unpack (bsum: q8_0's sum of qs);
 *              q2_K's mins as dmin[row] d_x[tok] sum_j m_j[row] bsum_j[tok] (vpdpwssd)
 * Weights are unpacked and repacked once per 16-row tile and reused by every
 * 16-token tile. Tokens past the last full tile (expert runs of a prompt are
 * ~32 tokens, so this is a large share) are copied into one zero-padded tile
 * when there are at least 2 of them: a padded tile costs about what
 * one more token costs the AVX-512 kernel, which gets a single leftover token.
 * Scratch lives in per-thread buffers that grow as needed. */
#include "cpu/cpu_internal.h"
#include "cpu/cpu_gemm_iq.h" /* IQ_TYPES: the grid i-quants */

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define TM_AMX                                                                                     \
    __attribute__((                                                                                \
        target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))

typedef struct amx_scratch {
    size_t cap_w, cap_x;
    uint8_t *tmp;      /* 16 rows x k unpacked s8 weights */
    uint8_t *b;        /* k/32 B tiles of 512 bytes */
    float *sv, *mv;    /* per sub-block, 16 rows: scale and min factors */
    int32_t *mp;       /* q2_K: per block, 8 pairs of 16 rows' int16 mins */
    float *dxs, *bsdx; /* per token, per sub-block: d_x and bsum * d_x */
    uint8_t *xpad;     /* the last, partial token tile: 16 activation rows, zeros past the tokens */
    size_t cap_pad;
} amx_scratch;

static _Thread_local amx_scratch amx_tls;

/* Row tiles packed per pass: each 16-token tile of activations is then read
 * from memory once per 64 weight rows and reused from L1/L2 for the rest. */
enum { AMX_SLOTS = 4 };

/* Leftover tokens (past the last full 16-token tile) from which they go
 * through a zero-padded AMX tile instead of the AVX-512 kernel; 2 unless
 * TIERMOE_AMX_PAD_MIN says otherwise (17 turns padding off), for tuning. */
static int amx_pad_min(void) {
    static atomic_int cached; /* 0: not read yet */
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v) return v;
    const char *env = getenv("TIERMOE_AMX_PAD_MIN");
    v = env && *env ? atoi(env) : 2;
    v = v < 1 ? 1 : v > 17 ? 17 : v;
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}

/* Frees a pool thread's scratch when the thread ends (the key's value is only
 * a non-NULL marker; the buffers live in the thread-local struct). */
static pthread_key_t amx_key;
static pthread_once_t amx_key_once = PTHREAD_ONCE_INIT;

static void amx_scratch_free(void *unused) {
    (void)unused;
    amx_scratch *s = &amx_tls;
    free(s->tmp);
    free(s->b);
    free(s->sv);
    free(s->mv);
    free(s->mp);
    free(s->dxs);
    free(s->bsdx);
    free(s->xpad);
    memset(s, 0, sizeof *s);
}

static void amx_key_create(void) {
    pthread_key_create(&amx_key, amx_scratch_free);
}

static void *amx_grow(void *p, size_t bytes) {
    free(p);
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static int amx_reserve(int64_t k, int64_t n16, size_t pad_bytes) {
    amx_scratch *s = &amx_tls;
    size_t ns = (size_t)(k / 32), nsub = (size_t)(k / 16);
    if (!s->cap_w && !s->cap_x) {
        pthread_once(&amx_key_once, amx_key_create);
        pthread_setspecific(amx_key, s);
    }
    if ((size_t)k > s->cap_w) {
        s->tmp = amx_grow(s->tmp, 16 * (size_t)k);
        s->b = amx_grow(s->b, AMX_SLOTS * ns * 512);
        s->sv = amx_grow(s->sv, AMX_SLOTS * nsub * 16 * sizeof(float));
        s->mv = amx_grow(s->mv, AMX_SLOTS * nsub * 16 * sizeof(float));
        s->mp = amx_grow(s->mp, AMX_SLOTS * ((size_t)k / 256 + 1) * 8 * 16 * sizeof(int32_t));
        if (!s->tmp || !s->b || !s->sv || !s->mv || !s->mp) {
            s->cap_w = 0;
            return -1;
        }
        s->cap_w = (size_t)k;
    }
    size_t nx = nsub * (size_t)n16;
    if (nx > s->cap_x) {
        s->dxs = amx_grow(s->dxs, nx * sizeof(float));
        s->bsdx = amx_grow(s->bsdx, nx * sizeof(float));
        if (!s->dxs || !s->bsdx) {
            s->cap_x = 0;
            return -1;
        }
        s->cap_x = nx;
    }
    if (pad_bytes > s->cap_pad) {
        s->xpad = amx_grow(s->xpad, pad_bytes);
        if (!s->xpad) {
            s->cap_pad = 0;
            return -1;
        }
        s->cap_pad = pad_bytes;
    }
    return 0;
}

/* Thread-local, not on the stack: ldtilecfg's asm names only 8 bytes of its
 * operand, so the compiler could drop stores to a local it thinks unread. */
static _Thread_local _Alignas(64) cpu_amx_tilecfg amx_cfg;

TM_AMX void cpu_amx_configure(const uint8_t rows[8], const uint16_t colsb[8]) {
    cpu_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = rows[t], cfg.colsb[t] = colsb[t];
    amx_cfg = cfg;
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&amx_cfg);
}

/* Two sets of tiles, for two sub-blocks in flight: C (16 tokens x 16 rows of
 * s32), A (16 tokens x width s8), B (width / 4 groups of 4 values x 16 rows);
 * width: the values of one tile product (16, 32 or 64). */
static void amx_configure(int width) {
    const uint8_t g = (uint8_t)(width / 4);
    const uint8_t rows[8] = {16, 16, g, 16, 16, g};
    const uint16_t colsb[8] = {64, (uint16_t)width, 64, 64, (uint16_t)width, 64};
    cpu_amx_configure(rows, colsb);
}

/* Blocks of 32 with one scale and q8_0 activations, K-quants with q8_K, then
 * the low-bit types (either activation type). */
enum { AMX_Q8_0, AMX_Q4_0, AMX_MXFP4, AMX_Q4_K, AMX_Q5_K, AMX_LB };

/* Unpack rows r..r+nr-1 into tmp (16 x k s8, natural order; missing rows zero),
 * their per-sub-block factors into sv/mv, then transpose into B tiles. */
TM_AMX static void amx_pack_weights(int kind, tm_type type, int64_t k, const char *w, size_t wrb,
                                    int64_t r, int nr, int slot) {
    amx_scratch *s = &amx_tls;
    const int64_t ns = k / 32, nsub = k / 16; /* nsub: the factors' slot stride */
    float *sv = s->sv + (size_t)slot * (size_t)nsub * 16,
          *mv = s->mv + (size_t)slot * (size_t)nsub * 16;
    memset(sv, 0, (size_t)nsub * 16 * sizeof(float));
    memset(mv, 0, (size_t)nsub * 16 * sizeof(float));
    int32_t *mp = s->mp + (size_t)slot * (size_t)(k / 256 + 1) * 128;
    if (kind == AMX_LB) memset(mp, 0, (size_t)(k / 256 + 1) * 128 * sizeof(int32_t));
    for (int n = 0; n < 16; n++) {
        uint8_t *dst = s->tmp + (size_t)n * (size_t)k;
        if (n >= nr) {
            memset(dst, 0, (size_t)k);
            continue;
        }
        const char *row = w + (size_t)(r + n) * wrb;
        if (kind == AMX_LB) {
            cpu_amx_lowbit_unpack(type, k, row, dst, sv + n, mv + n, mp + n);
        } else if (kind == AMX_Q8_0) {
            const tm_block_q8_0 *blk = (const tm_block_q8_0 *)row;
            for (int64_t b = 0; b < ns; b++) {
                _mm256_storeu_si256((__m256i *)(dst + 32 * b),
                                    _mm256_loadu_si256((const __m256i *)blk[b].qs));
                sv[b * 16 + n] = _cvtsh_ss(blk[b].d);
            }
        } else if (kind == AMX_Q4_0 || kind == AMX_MXFP4) {
            const __m128i m4 = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
            const __m128i lut = _mm_loadu_si128((const __m128i *)cpu_mxfp4_values);
            const size_t bsize = kind == AMX_Q4_0 ? sizeof(tm_block_q4_0) : sizeof(tm_block_mxfp4);
            const size_t qoff =
                kind == AMX_Q4_0 ? offsetof(tm_block_q4_0, qs) : offsetof(tm_block_mxfp4, qs);
            for (int64_t b = 0; b < ns; b++) {
                const char *blk = row + (size_t)b * bsize;
                __m128i q = _mm_loadu_si128((const __m128i *)(blk + qoff));
                __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
                if (kind == AMX_Q4_0) {
                    lo = _mm_sub_epi8(lo, eight);
                    hi = _mm_sub_epi8(hi, eight);
                    sv[b * 16 + n] = _cvtsh_ss(((const tm_block_q4_0 *)blk)->d);
                } else {
                    lo = _mm_shuffle_epi8(lut, lo);
                    hi = _mm_shuffle_epi8(lut, hi);
                    sv[b * 16 + n] = cpu_e8m0_half(((const tm_block_mxfp4 *)blk)->e);
                }
                _mm_storeu_si128((__m128i *)(dst + 32 * b), lo);
                _mm_storeu_si128((__m128i *)(dst + 32 * b + 16), hi);
            }
        } else {
            const int q5 = kind == AMX_Q5_K;
            const size_t bsize = q5 ? sizeof(tm_block_q5_k) : sizeof(tm_block_q4_k);
            const __m512i m4 = _mm512_set1_epi8(0xF), b16 = _mm512_set1_epi8(16);
            for (int64_t b = 0; b < k / TM_QK_K; b++) {
                const char *blkp = row + (size_t)b * bsize;
                const tm_block_q4_k *b4 = (const tm_block_q4_k *)blkp;
                const tm_block_q5_k *b5 = (const tm_block_q5_k *)blkp;
                const uint8_t *qs = q5 ? b5->qs : b4->qs;
                __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
                __m512i l0 = _mm512_and_si512(q0, m4),
                        h0 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
                __m512i l1 = _mm512_and_si512(q1, m4),
                        h1 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
                __m512i v[4] = {
                    _mm512_shuffle_i64x2(l0, h0, 0x44), _mm512_shuffle_i64x2(l0, h0, 0xEE),
                    _mm512_shuffle_i64x2(l1, h1, 0x44), _mm512_shuffle_i64x2(l1, h1, 0xEE)};
                if (q5) { /* fifth bit: qh[l] bit j for value l of sub-block j */
                    const __m512i qh =
                        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b5->qh));
                    for (int m = 0; m < 4; m++) {
                        const __m512i bits =
                            _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * m))),
                                               _mm256_set1_epi8((char)(2 << (2 * m))), 1);
                        v[m] =
                            _mm512_mask_add_epi8(v[m], _mm512_test_epi8_mask(qh, bits), v[m], b16);
                    }
                }
                uint8_t *o = dst + TM_QK_K * b;
                for (int m = 0; m < 4; m++)
                    _mm512_storeu_si512(o + 64 * m, v[m]); /* sub-blocks 2m, 2m+1 */
                uint8_t sm[16];
                cpu_k4_unpack_scales(q5 ? b5->scales : b4->scales, sm);
                float d = _cvtsh_ss(q5 ? b5->d : b4->d), dmin = _cvtsh_ss(q5 ? b5->dmin : b4->dmin);
                for (int j = 0; j < 8; j++) {
                    sv[(8 * b + j) * 16 + n] = d * (float)sm[j];
                    mv[(8 * b + j) * 16 + n] = dmin * (float)sm[8 + j];
                }
            }
        }
    }
    /* B tile of sub-block q: dword (group g, row n) = tmp[n][32q + 4g .. +3], an
     * 8 x 8 dword transpose done in both 256-bit halves at once (rows n and n+8) */
    const __m512i lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int64_t q = 0; q < ns; q++) {
        __m512i z[8], t[8], u[8];
        for (int i = 0; i < 8; i++)
            z[i] = _mm512_inserti64x4(
                _mm512_castsi256_si512(
                    _mm256_loadu_si256((const __m256i *)(s->tmp + (size_t)i * (size_t)k + 32 * q))),
                _mm256_loadu_si256(
                    (const __m256i *)(s->tmp + (size_t)(i + 8) * (size_t)k + 32 * q)),
                1);
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
            t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
        }
        for (int h = 0; h < 8; h += 4) {                          /* rows h..h+3 */
            u[h + 0] = _mm512_unpacklo_epi64(t[h], t[h + 2]);     /* dwords 0, 4 */
            u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);     /* 1, 5 */
            u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]); /* 2, 6 */
            u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]); /* 3, 7 */
        }
        uint8_t *bt = s->b + ((size_t)slot * (size_t)ns + (size_t)q) * 512;
        for (int g = 0; g < 4; g++) {
            _mm512_store_si512(bt + 64 * g, _mm512_permutex2var_epi64(u[g], lo_idx, u[g + 4]));
            _mm512_store_si512(bt + 64 * (g + 4),
                               _mm512_permutex2var_epi64(u[g], hi_idx, u[g + 4]));
        }
    }
}

/* C tile = A (16 tokens' values of sub-block q) . B (16 rows' values), stored
 * to buf (tile numbers must be literals): np products of tw values. A
 * width-16 sub-block's B is half of its 32 values' packed tile, a 64-value
 * product's B two of them (the packed tiles follow each other). */
#define AMX_PRODUCT(C, A, B, q, buf)                                                               \
    do {                                                                                           \
        const char *abase_ =                                                                       \
            !xk ? xa + (q) * (int64_t)sizeof(tm_block_q8_0) + offsetof(tm_block_q8_0, qs)          \
                : xa + ((q) / spb) * (int64_t)sizeof(tm_block_q8_k) +                              \
                      offsetof(tm_block_q8_k, qs) + width * ((q) % spb);                           \
        _tile_zero(C);                                                                             \
        for (int p_ = 0; p_ < np; p_++) {                                                          \
            _tile_loadd(A, abase_ + tw * p_, xstride);                                             \
            _tile_loadd(B, bs + ((q)*width + tw * p_) * 16, 64);                                   \
            _tile_dpbssd(C, A, B);                                                                 \
        }                                                                                          \
        _tile_stored(C, buf, 64);                                                                  \
    } while (0)

/* acc[token] += C[token] scaled, for sub-block q (C in buf). */
#define AMX_SCALE(q, buf)                                                                          \
    do {                                                                                           \
        const __m512 sv_ = _mm512_load_ps(svs + (q)*16);                                           \
        const float *dx_ = s->dxs + t * ns + (q);                                                  \
        if (!has_min) {                                                                            \
            for (int m = 0; m < 16; m++)                                                           \
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((buf) + 16 * m)),    \
                                         _mm512_mul_ps(sv_, _mm512_set1_ps(dx_[m * ns])), acc[m]); \
        } else {                                                                                   \
            const __m512 mv_ = _mm512_load_ps(mvs + (q)*16);                                       \
            const float *bd_ = s->bsdx + t * ns + (q);                                             \
            for (int m = 0; m < 16; m++) {                                                         \
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((buf) + 16 * m)),    \
                                         _mm512_mul_ps(sv_, _mm512_set1_ps(dx_[m * ns])), acc[m]); \
                acc[m] = _mm512_fnmadd_ps(mv_, _mm512_set1_ps(bd_[m * ns]), acc[m]);               \
            }                                                                                      \
        }                                                                                          \
        if (pair_min) { /* q2_K: acc -= (dmin dx) sum_j m_j bsum_j, 8 int16 pairs a token */       \
            const __m512 dm_ = _mm512_load_ps(mvs + (q)*16);                                       \
            __m512i mp_[8];                                                                        \
            for (int p = 0; p < 8; p++) mp_[p] = _mm512_load_si512(mps + ((q)*8 + p) * 16);        \
            for (int m = 0; m < 16; m++) {                                                         \
                const char *bs_ = xa + m * xstride + (q) * (int64_t)sizeof(tm_block_q8_k) +        \
                                  offsetof(tm_block_q8_k, bsums);                                  \
                __m512i si_ = _mm512_setzero_si512();                                              \
                for (int p = 0; p < 8; p++) {                                                      \
                    int32_t pair_;                                                                 \
                    memcpy(&pair_, bs_ + 4 * p, 4);                                                \
                    si_ = _mm512_dpwssd_epi32(si_, mp_[p], _mm512_set1_epi32(pair_));              \
                }                                                                                  \
                acc[m] =                                                                           \
                    _mm512_fnmadd_ps(_mm512_cvtepi32_ps(si_),                                      \
                                     _mm512_mul_ps(dm_, _mm512_set1_ps(dx_[m * ns])), acc[m]);     \
            }                                                                                      \
        }                                                                                          \
    } while (0)

TM_AMX static void amx_gemm(int kind, tm_type type, int64_t k, const void *wv, size_t wrb,
                            int64_t r0, int64_t r1, const void *xqv, size_t xrb, int64_t n_tok,
                            float *y, int64_t ldy) {
    /* values a sub-block (one tile product and scaling each), sub-blocks an
     * activation block of q8_K, q8_K activations, a min term */
    const int width = kind == AMX_LB ? cpu_amx_lowbit_width(type) : 32, spb = TM_QK_K / width;
    /* values a tile product (at most 64: a tile row), products a sub-block */
    const int tw = width < 64 ? width : 64, np = width / tw;
    const int xk = cpu_act_type(type) == TM_TYPE_Q8_K;
    const int has_min =
        kind == AMX_Q4_K || kind == AMX_Q5_K || (kind == AMX_LB && cpu_amx_lowbit_has_min(type));
    const int pair_min = kind == AMX_LB && cpu_amx_lowbit_pair_mins(type);
    const int64_t n16 = n_tok & ~(int64_t)15, ns = k / width, tail = n_tok - n16;
    /* tokens through AMX: the full tiles, and the leftover ones padded to a tile */
    const int64_t n_amx = tail >= amx_pad_min() ? n16 + 16 : n16;
    const size_t act_bytes = cpu_act_row_size(type, k);
    cpu_gemm_fn rest = cpu_gemm_avx512_get(type);
    if (n_amx == 0 || amx_reserve(k, n_amx, n_amx > n16 ? 16 * act_bytes : 0)) {
        rest(k, wv, wrb, r0, r1, xqv, xrb, n_tok, y, ldy);
        return;
    }
    amx_scratch *s = &amx_tls;
    const char *w = wv, *xq = xqv;
    if (n_amx > n16) { /* zero rows give C = 0 and zero factors; they are never stored */
        for (int64_t t = 0; t < tail; t++)
            memcpy(s->xpad + (size_t)t * act_bytes, xq + (size_t)(n16 + t) * xrb, act_bytes);
        memset(s->xpad + (size_t)tail * act_bytes, 0, (size_t)(16 - tail) * act_bytes);
    }
    /* activation factors per token and sub-block */
    for (int64_t t = 0; t < n_amx; t++) {
        const char *xr =
            t < n16 ? xq + (size_t)t * xrb : (const char *)s->xpad + (size_t)(t - n16) * act_bytes;
        for (int64_t q = 0; q < ns; q++) {
            if (!xk) {
                const tm_block_q8_0 *xb = (const tm_block_q8_0 *)xr + q;
                s->dxs[t * ns + q] = _cvtsh_ss(xb->d);
                if (has_min) { /* q4_1/q5_1: the block's sum of activations */
                    int sum = 0;
                    for (int i = 0; i < 32; i++) sum += xb->qs[i];
                    s->bsdx[t * ns + q] = (float)sum * s->dxs[t * ns + q];
                }
            } else {
                const tm_block_q8_k *xb = (const tm_block_q8_k *)xr + q / spb;
                const int j = (int)(q % spb) * width / 16; /* first bsum of the sub-block */
                s->dxs[t * ns + q] = xb->d;
                if (has_min)
                    s->bsdx[t * ns + q] =
                        (float)(width == 16 ? xb->bsums[j] : xb->bsums[j] + xb->bsums[j + 1]) *
                        xb->d;
            }
        }
    }
    amx_configure(tw);
    _Alignas(64) int32_t cbuf[512];
    for (int64_t rg = r0; rg < r1; rg += 16 * AMX_SLOTS) {
        int n_slots = 0;
        for (int64_t r = rg; r < r1 && n_slots < AMX_SLOTS; r += 16, n_slots++)
            amx_pack_weights(kind, type, k, w, wrb, r, (int)(r1 - r < 16 ? r1 - r : 16), n_slots);
        __asm__ volatile("" ::: "memory"); /* tileloadd's asm does not say it reads memory */
        for (int64_t ts = 0; ts < n_amx * n_slots;
             ts += 16) { /* token tiles outer, row tiles inner */
            const int64_t t = ts / n_slots / 16 * 16;
            const int slot = (int)(ts / 16 % n_slots);
            const int64_t r = rg + 16 * slot;
            const int nr = (int)(r1 - r < 16 ? r1 - r : 16);
            const __mmask16 mask = (__mmask16)((1u << nr) - 1);
            const uint8_t *bs = s->b + (size_t)slot * (size_t)(k / 32) * 512;
            const float *svs = s->sv + (size_t)slot * (size_t)(k / 16) * 16,
                        *mvs = s->mv + (size_t)slot * (size_t)(k / 16) * 16;
            const int32_t *mps = s->mp + (size_t)slot * (size_t)(k / 256 + 1) * 128;
            __m512 acc[16];
            for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
            const char *xa = t < n16 ? xq + (size_t)t * xrb : (const char *)s->xpad;
            const long xstride = t < n16 ? (long)xrb : (long)act_bytes;
            const int n_store = t < n16 ? 16 : (int)tail;
            /* Sub-blocks in pairs on two tile sets: the second product runs
             * while the first one's result is scaled (one set alone waits for
             * each product, its store and the reload in turn). */
            for (int64_t q = 0; q < ns; q += 2) {
                const int two = q + 1 < ns;
                AMX_PRODUCT(0, 1, 2, q, cbuf);
                if (two) AMX_PRODUCT(3, 4, 5, q + 1, cbuf + 256);
                AMX_SCALE(q, cbuf);
                if (two) AMX_SCALE(q + 1, cbuf + 256);
            }
            for (int m = 0; m < 16; m++) /* a constant count keeps acc in registers */
                if (m < n_store) _mm512_mask_storeu_ps(y + (t + m) * ldy + r, mask, acc[m]);
        }
    }
    _tile_release();
    if (n_amx < n_tok)
        rest(k, wv, wrb, r0, r1, xq + (size_t)n16 * xrb, xrb, n_tok - n16, y + n16 * ldy, ldy);
}

#define AMX_ENTRY(name, kind, type)                                                                \
    TM_AMX static void amx_gemm_##name(int64_t k, const void *w, size_t wrb, int64_t r0,           \
                                       int64_t r1, const void *xq, size_t xrb, int64_t n_tok,      \
                                       float *y, int64_t ldy) {                                    \
        amx_gemm(kind, type, k, w, wrb, r0, r1, xq, xrb, n_tok, y, ldy);                           \
    }
AMX_ENTRY(q8_0, AMX_Q8_0, TM_TYPE_Q8_0)
AMX_ENTRY(q4_0, AMX_Q4_0, TM_TYPE_Q4_0)
AMX_ENTRY(mxfp4, AMX_MXFP4, TM_TYPE_MXFP4)
AMX_ENTRY(q4_k, AMX_Q4_K, TM_TYPE_Q4_K)
AMX_ENTRY(q5_k, AMX_Q5_K, TM_TYPE_Q5_K)
#define AMX_LB_TYPES(X)                                                                            \
    X(q2k, TM_TYPE_Q2_K)                                                                           \
    X(q3k, TM_TYPE_Q3_K)                                                                           \
    X(iq4xs, TM_TYPE_IQ4_XS)                                                                       \
    X(tq10, TM_TYPE_TQ1_0)                                                                         \
    X(tq20, TM_TYPE_TQ2_0)                                                                         \
    X(q41, TM_TYPE_Q4_1)                                                                           \
    X(q50, TM_TYPE_Q5_0)                                                                           \
    X(q51, TM_TYPE_Q5_1)                                                                           \
    X(iq4nl, TM_TYPE_IQ4_NL)                                                                       \
    IQ_TYPES(X)
#define AMX_LB_ENTRY(name, type) AMX_ENTRY(name, AMX_LB, type)
AMX_LB_TYPES(AMX_LB_ENTRY)
#define AMX_LB_CASE(name, type)                                                                    \
    case type:                                                                                     \
        return amx_gemm_##name;

cpu_gemm_fn cpu_gemm_amx_get(tm_type wtype) {
    cpu_gemm_fn bf16 = cpu_gemm_amx_bf16_get(wtype);
    if (bf16) return bf16;
    if (wtype == TM_TYPE_IQ1_S || wtype == TM_TYPE_IQ1_M) cpu_iq1_grid_init();
    switch (wtype) {
    case TM_TYPE_Q8_0:
        return amx_gemm_q8_0;
    case TM_TYPE_Q4_0:
        return amx_gemm_q4_0;
    case TM_TYPE_MXFP4:
        return amx_gemm_mxfp4;
    case TM_TYPE_Q4_K:
        return amx_gemm_q4_k;
    case TM_TYPE_Q5_K:
        return amx_gemm_q5_k;
        AMX_LB_TYPES(AMX_LB_CASE)
    default:
        return NULL;
    }
}
#else
cpu_gemm_fn cpu_gemm_amx_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
#endif

int64_t cpu_gemm_amx_min_tokens(void) {
    return 16;
}
