/* Causal attention over a KV cache (see cpu_ops.h).
 *
 * Flash-attention style: a task takes the query rows of one kv group (its G
 * heads times a block of queries, or one decode query) and walks the keys in
 * blocks of ATTN_KEY_BLOCK. Each block is converted to f32 once (K transposed
 * to kT[d][key], V as rows) and used by every row; rows go through it in
 * tiles of ATTN_ROW_TILE, so each K or V value loaded from cache serves four
 * rows (one row at a time, the block streams from L2 once per row and the
 * products wait on it). Per row an online softmax keeps a running max m, sum l
 * and accumulator o:
 *   s_j = scale · q · k_j,   m' = max(m, max s),   p_j = exp(s_j - m')
 *   o = o · exp(m - m') + Σ p_j v_j,   l = l · exp(m - m') + Σ p_j
 * A row's result depends only on its query position and the key range, never
 * on the other rows of the tile or task. Tiles come in plain C, AVX2 and
 * AVX-512 (head_dim a multiple of 16); the two SIMD ones give the same bits.
 * Blocks follow key positions; a ring cache (tm_attention_shape.ring) only
 * changes which rows a block is loaded from (two runs where it wraps). Keys
 * are dk = head_dim wide, values dv = v_dim (MLA: 576 and 512, the value the
 * key's first dv values, read from the K rows). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TM_X86 1
#endif

#define ATTN_KEY_BLOCK 64             /* keys per block */
#define ATTN_KV_CHUNK  ATTN_KEY_BLOCK /* keys per task when one query is split over threads */
#define ATTN_TASK_ROWS 128 /* (query, head) rows per prompt task, at least one query's heads */
#define ATTN_ROW_TILE  4   /* rows that share each loaded K/V value */

typedef struct attn_job {
    const tm_attention_shape *s;
    const float *q;
    const uint8_t *k, *v;
    float *out;
    float *scratch;
    int64_t scratch_per_thread;
    float *records;      /* split decode: per (head, chunk) max, sum, acc[head_dim] */
    atomic_int *pending; /* split decode: per kv group, chunks not yet done */
    size_t k_row_bytes, v_row_bytes, kv_elem;
    int64_t dk, dv;            /* key and value widths */
    int64_t n_chunks;          /* decode split: key chunks per head */
    int64_t q_block, n_blocks; /* prompt: queries per task, query blocks */
    int simd; /* 0 plain C, ATTN_AVX2 or ATTN_AVX512 tiles (block loads: AVX2 for both) */
} attn_job;

enum { ATTN_AVX2 = 1, ATTN_AVX512 = 2 };

/* One tile of up to ATTN_ROW_TILE rows against the current key block. */
typedef struct attn_tile {
    int nr;
    const float *q[ATTN_ROW_TILE];
    int64_t n[ATTN_ROW_TILE];  /* keys of the block row i sees: 0 (none) .. nk */
    int64_t lo[ATTN_ROW_TILE]; /* ... from this one on (a sliding window's start; else 0) */
    int64_t n_max;             /* the most any row sees */
    float *o[ATTN_ROW_TILE], *m[ATTN_ROW_TILE], *l[ATTN_ROW_TILE];
} attn_tile;

/* Per-thread scratch: kT and V of a block, scores of a tile, and per task row
 * an accumulator, a max and a sum. */
static int64_t attn_dv(const tm_attention_shape *s) {
    return s->v_dim ? s->v_dim : s->head_dim;
}

/* The V buffer holds dk-wide K rows too on their way to kT. */
static int64_t attn_scratch_per_thread(const tm_attention_shape *s) {
    const int64_t G = s->n_head / s->n_head_kv, rows = G > ATTN_TASK_ROWS ? G : ATTN_TASK_ROWS;
    const int64_t dk = s->head_dim, dv = attn_dv(s);
    return (dk + (dk > dv ? dk : dv)) * ATTN_KEY_BLOCK + ATTN_ROW_TILE * ATTN_KEY_BLOCK +
           rows * (dv + 2);
}

int64_t cpu_attention_scratch_floats(const tm_attention_shape *s, int64_t n_ctx, int n_threads) {
    /* per thread, plus for the split: per (head, chunk) a max, a sum and an
     * accumulator, and per kv group a counter (a float's room each) */
    int64_t chunks = (n_ctx + ATTN_KV_CHUNK - 1) / ATTN_KV_CHUNK;
    return attn_scratch_per_thread(s) * (n_threads > 0 ? n_threads : 1) +
           s->n_head * chunks * (attn_dv(s) + 2) + s->n_head_kv;
}

/* ---- plain C tile ---- */

static void attn_tile_ref(const attn_tile *t, const float *kT, const float *vf, int64_t d,
                          int64_t dv, float scale, float *sc) {
    for (int r = 0; r < t->nr; r++) {
        const int64_t n = t->n[r];
        if (n <= 0) continue;
        float *s = sc + r * ATTN_KEY_BLOCK;
        for (int64_t j = 0; j < n; j++) s[j] = 0;
        for (int64_t i = 0; i < d; i++)
            for (int64_t j = 0; j < n; j++) s[j] += t->q[r][i] * kT[i * ATTN_KEY_BLOCK + j];
        for (int64_t j = 0; j < t->lo[r]; j++) s[j] = -INFINITY; /* before the window */
        float mb = *t->m[r];
        for (int64_t j = 0; j < n; j++) mb = s[j] * scale > mb ? s[j] * scale : mb;
        const float alpha = expf(*t->m[r] - mb); /* 0 on the first block: m = -inf */
        float sum = 0;
        for (int64_t j = 0; j < n; j++) sum += s[j] = expf(s[j] * scale - mb);
        *t->m[r] = mb, *t->l[r] = *t->l[r] * alpha + sum;
        float *o = t->o[r];
        for (int64_t i = 0; i < dv; i++) o[i] *= alpha;
        for (int64_t j = 0; j < n; j++) cpu_axpy(o, s[j], vf + j * dv, dv);
    }
}

/* K cache rows [row, row + nk) of kv group g, transposed into columns
 * [col, col + nk) of kT[dk][ATTN_KEY_BLOCK], and V rows into vf[col..][dv]. */
static void attn_block_load_ref(const attn_job *j, int64_t row, int64_t nk, int64_t col, int64_t g,
                                float *kT, float *vf) {
    const int64_t d = j->dk, dv = j->dv;
    const size_t koff = (size_t)(g * d) * j->kv_elem,
                 voff = (size_t)(g * (j->s->v_in_k ? d : dv)) * j->kv_elem;
    for (int64_t t = col; t < col + nk; t++) {
        float *r = vf + t * d; /* K row through the V buffer, then transposed */
        cpu_load_kv(r, j->k + (row + t - col) * j->k_row_bytes + koff, j->s->kv_type, d);
        for (int64_t i = 0; i < d; i++) kT[i * ATTN_KEY_BLOCK + t] = r[i];
    }
    for (int64_t t = col; t < col + nk; t++)
        cpu_load_kv(vf + t * dv, j->v + (row + t - col) * j->v_row_bytes + voff, j->s->kv_type, dv);
}

#ifdef TM_X86
TM_AVX2 static inline float hmax8(__m256 v) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
}

/* 8 rows of 8 floats (r[i] = row i) transposed in place. */
TM_AVX2 static inline void transpose8_avx2(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

TM_AVX2 static inline __m256 attn_load8(const uint8_t *p, int f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p))
               : _mm256_loadu_ps((const float *)p);
}

/* attn_block_load_ref with 8 x 8 transposes (d a multiple of 8). */
TM_AVX2 static void attn_block_load_avx2(const attn_job *j, int64_t row, int64_t nk, int64_t col,
                                         int64_t g, float *kT, float *vf) {
    const int64_t d = j->dk, dv = j->dv;
    const int f16 = j->s->kv_type == TM_TYPE_F16;
    const size_t es = j->kv_elem;
    const size_t koff = (size_t)(g * d) * es, voff = (size_t)(g * (j->s->v_in_k ? d : dv)) * es;
    const uint8_t *kb = j->k + row * j->k_row_bytes + koff;
    float *kc = kT + col; /* the segment's first column */
    int64_t t = 0;
    for (; t + 8 <= nk; t += 8)
        for (int64_t i = 0; i < d; i += 8) {
            __m256 r[8];
            for (int u = 0; u < 8; u++)
                r[u] = attn_load8(kb + (t + u) * j->k_row_bytes + i * es, f16);
            transpose8_avx2(r);
            for (int u = 0; u < 8; u++) _mm256_storeu_ps(kc + (i + u) * ATTN_KEY_BLOCK + t, r[u]);
        }
    for (; t < nk; t++)
        for (int64_t i = 0; i < d; i += 8) {
            _Alignas(32) float x[8];
            _mm256_store_ps(x, attn_load8(kb + t * j->k_row_bytes + i * es, f16));
            for (int u = 0; u < 8; u++) kc[(i + u) * ATTN_KEY_BLOCK + t] = x[u];
        }
    for (t = 0; t < nk; t++)
        cpu_load_kv(vf + (col + t) * dv, j->v + (row + t) * j->v_row_bytes + voff, j->s->kv_type,
                    dv);
}

/* Each row's online-softmax step over its scores sc row r, [0, n_pad) with n_pad a
 * multiple of 8 covering n_max: sc becomes p (0 past the row's keys) and alpha[r]
 * the rescale of the row's accumulator; a row that sees no key of the block gets
 * p = 0 and alpha = 1. */
TM_AVX2 __attribute__((always_inline)) static inline void
attn_tile_exp_avx2(const attn_tile *t, int NR, int64_t n_pad, float *sc,
                   float alpha[ATTN_ROW_TILE]) {
    for (int r = 0; r < NR; r++) {
        float *s = sc + r * ATTN_KEY_BLOCK;
        const int64_t n = t->n[r] > 0 ? t->n[r] : 0;
        for (int64_t j = n; j < n_pad; j++) s[j] = -INFINITY;
        for (int64_t j = 0; j < t->lo[r] && j < n; j++) s[j] = -INFINITY; /* before the window */
        if (n == 0) {
            memset(s, 0, (size_t)n_pad * sizeof(float));
            alpha[r] = 1;
            continue;
        }
        __m256 mx = _mm256_set1_ps(*t->m[r]);
        for (int64_t j = 0; j < n_pad; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
        const float mb = hmax8(mx);
        alpha[r] = expf(*t->m[r] - mb); /* 0 on the first block: m = -inf */
        __m256 sum = _mm256_setzero_ps();
        const __m256 vmb = _mm256_set1_ps(mb);
        for (int64_t j = 0; j < n_pad; j += 8) {
            const __m256 e = cpu_exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmb));
            _mm256_storeu_ps(s + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        *t->m[r] = mb, *t->l[r] = *t->l[r] * alpha[r] + cpu_hsum8_avx2(sum);
    }
}

/* Scores of NR rows for keys [0, n_max) in steps of 16 (rows past their n are
 * masked by attn_tile_exp_avx2), scaled, into sc. */
TM_AVX2 __attribute__((always_inline)) static inline void
attn_tile_softmax_avx2(const attn_tile *t, int NR, const float *kT, int64_t d, float scale,
                       float *sc, float alpha[ATTN_ROW_TILE]) {
    const int64_t n16 = (t->n_max + 15) & ~(int64_t)15;
    for (int64_t kb = 0; kb < n16; kb += 16) {
        __m256 acc[ATTN_ROW_TILE][2];
        for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t i = 0; i < d; i++) {
            const __m256 k0 = _mm256_loadu_ps(kT + i * ATTN_KEY_BLOCK + kb),
                         k1 = _mm256_loadu_ps(kT + i * ATTN_KEY_BLOCK + kb + 8);
            for (int r = 0; r < NR; r++) {
                const __m256 b = _mm256_broadcast_ss(t->q[r] + i);
                acc[r][0] = _mm256_fmadd_ps(b, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(b, k1, acc[r][1]);
            }
        }
        const __m256 vs = _mm256_set1_ps(scale);
        for (int r = 0; r < NR; r++) {
            _mm256_storeu_ps(sc + r * ATTN_KEY_BLOCK + kb, _mm256_mul_ps(acc[r][0], vs));
            _mm256_storeu_ps(sc + r * ATTN_KEY_BLOCK + kb + 8, _mm256_mul_ps(acc[r][1], vs));
        }
    }
    attn_tile_exp_avx2(t, NR, n16, sc, alpha);
}

/* o[r][c, c + 8 NV) = o · alpha[r] + Σ_j p[r][j] v_j[c, c + 8 NV) for NR rows. */
TM_AVX2 __attribute__((always_inline)) static inline void
attn_tile_pv_avx2(const attn_tile *t, int NR, int NV, int64_t c, const float *vf, int64_t d,
                  const float *sc, const float alpha[ATTN_ROW_TILE]) {
    __m256 acc[ATTN_ROW_TILE][2];
    for (int r = 0; r < NR; r++)
        for (int u = 0; u < NV; u++)
            acc[r][u] =
                _mm256_mul_ps(_mm256_loadu_ps(t->o[r] + c + 8 * u), _mm256_set1_ps(alpha[r]));
    for (int64_t j = 0; j < t->n_max; j++) {
        __m256 v[2];
        for (int u = 0; u < NV; u++) v[u] = _mm256_loadu_ps(vf + j * d + c + 8 * u);
        for (int r = 0; r < NR; r++) {
            const __m256 b = _mm256_broadcast_ss(sc + r * ATTN_KEY_BLOCK + j);
            for (int u = 0; u < NV; u++) acc[r][u] = _mm256_fmadd_ps(b, v[u], acc[r][u]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int u = 0; u < NV; u++) _mm256_storeu_ps(t->o[r] + c + 8 * u, acc[r][u]);
}

/* NR is a constant in each copy, so the row loops unroll and the
 * accumulators stay in registers. */
TM_AVX2 __attribute__((always_inline)) static inline void
attn_tile_avx2_n(const attn_tile *t, int NR, const float *kT, const float *vf, int64_t d,
                 int64_t dv, float scale, float *sc) {
    float alpha[ATTN_ROW_TILE];
    attn_tile_softmax_avx2(t, NR, kT, d, scale, sc, alpha);
    int64_t c = 0;
    for (; c + 16 <= dv; c += 16) attn_tile_pv_avx2(t, NR, 2, c, vf, dv, sc, alpha);
    if (c < dv) attn_tile_pv_avx2(t, NR, 1, c, vf, dv, sc, alpha);
}

TM_AVX2 static void attn_tile_avx2(const attn_tile *t, const float *kT, const float *vf, int64_t d,
                                   int64_t dv, float scale, float *sc) {
    switch (t->nr) {
    case 1:
        attn_tile_avx2_n(t, 1, kT, vf, d, dv, scale, sc);
        break;
    case 2:
        attn_tile_avx2_n(t, 2, kT, vf, d, dv, scale, sc);
        break;
    case 3:
        attn_tile_avx2_n(t, 3, kT, vf, d, dv, scale, sc);
        break;
    default:
        attn_tile_avx2_n(t, 4, kT, vf, d, dv, scale, sc);
        break;
    }
}

/* ---- AVX-512 tile: the AVX2 tile with 16-wide vectors (head_dim a multiple of 16).
 * Every score and output lane sums the same products in the same order as the
 * AVX2 tile, and the padding adds only zeros, so the results are the same bits. */

#define TM_ATTN_AVX512 __attribute__((target("avx2,fma,f16c,avx512f")))

TM_ATTN_AVX512 __attribute__((always_inline)) static inline void
attn_tile_softmax_avx512(const attn_tile *t, int NR, const float *kT, int64_t d, float scale,
                         float *sc, float alpha[ATTN_ROW_TILE]) {
    const int64_t n32 = (t->n_max + 31) & ~(int64_t)31; /* at most ATTN_KEY_BLOCK */
    for (int64_t kb = 0; kb < n32; kb += 32) {
        __m512 acc[ATTN_ROW_TILE][2];
        for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int64_t i = 0; i < d; i++) {
            const __m512 k0 = _mm512_loadu_ps(kT + i * ATTN_KEY_BLOCK + kb),
                         k1 = _mm512_loadu_ps(kT + i * ATTN_KEY_BLOCK + kb + 16);
            for (int r = 0; r < NR; r++) {
                const __m512 b = _mm512_set1_ps(t->q[r][i]);
                acc[r][0] = _mm512_fmadd_ps(b, k0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(b, k1, acc[r][1]);
            }
        }
        const __m512 vs = _mm512_set1_ps(scale);
        for (int r = 0; r < NR; r++) {
            _mm512_storeu_ps(sc + r * ATTN_KEY_BLOCK + kb, _mm512_mul_ps(acc[r][0], vs));
            _mm512_storeu_ps(sc + r * ATTN_KEY_BLOCK + kb + 16, _mm512_mul_ps(acc[r][1], vs));
        }
    }
    attn_tile_exp_avx2(t, NR, n32, sc, alpha);
}

TM_ATTN_AVX512 __attribute__((always_inline)) static inline void
attn_tile_pv_avx512(const attn_tile *t, int NR, int NV, int64_t c, const float *vf, int64_t d,
                    const float *sc, const float alpha[ATTN_ROW_TILE]) {
    __m512 acc[ATTN_ROW_TILE][2];
    for (int r = 0; r < NR; r++)
        for (int u = 0; u < NV; u++)
            acc[r][u] =
                _mm512_mul_ps(_mm512_loadu_ps(t->o[r] + c + 16 * u), _mm512_set1_ps(alpha[r]));
    for (int64_t j = 0; j < t->n_max; j++) {
        __m512 v[2];
        for (int u = 0; u < NV; u++) v[u] = _mm512_loadu_ps(vf + j * d + c + 16 * u);
        for (int r = 0; r < NR; r++) {
            const __m512 b = _mm512_set1_ps(sc[r * ATTN_KEY_BLOCK + j]);
            for (int u = 0; u < NV; u++) acc[r][u] = _mm512_fmadd_ps(b, v[u], acc[r][u]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int u = 0; u < NV; u++) _mm512_storeu_ps(t->o[r] + c + 16 * u, acc[r][u]);
}

TM_ATTN_AVX512 __attribute__((always_inline)) static inline void
attn_tile_avx512_n(const attn_tile *t, int NR, const float *kT, const float *vf, int64_t d,
                   int64_t dv, float scale, float *sc) {
    float alpha[ATTN_ROW_TILE];
    attn_tile_softmax_avx512(t, NR, kT, d, scale, sc, alpha);
    int64_t c = 0;
    for (; c + 32 <= dv; c += 32) attn_tile_pv_avx512(t, NR, 2, c, vf, dv, sc, alpha);
    if (c < dv) attn_tile_pv_avx512(t, NR, 1, c, vf, dv, sc, alpha);
}

TM_ATTN_AVX512 static void attn_tile_avx512(const attn_tile *t, const float *kT, const float *vf,
                                            int64_t d, int64_t dv, float scale, float *sc) {
    switch (t->nr) {
    case 1:
        attn_tile_avx512_n(t, 1, kT, vf, d, dv, scale, sc);
        break;
    case 2:
        attn_tile_avx512_n(t, 2, kT, vf, d, dv, scale, sc);
        break;
    case 3:
        attn_tile_avx512_n(t, 3, kT, vf, d, dv, scale, sc);
        break;
    default:
        attn_tile_avx512_n(t, 4, kT, vf, d, dv, scale, sc);
        break;
    }
}
#endif

/* Keys [t0, t0 + nk) of kv group g into kT (columns past nk zero) and vf:
 * one run of cache rows, or in a ring the rows to its end and then from its start
 * (nk <= ring: at most one wrap). */
static void attn_block_load(const attn_job *j, int64_t t0, int64_t nk, int64_t g, float *kT,
                            float *vf) {
    const int64_t ring = j->s->ring, row = ring ? t0 % ring : t0;
    const int64_t n1 = ring && row + nk > ring ? ring - row : nk;
    for (int seg = 0; seg < 2; seg++) {
        const int64_t r = seg ? 0 : row, n = seg ? nk - n1 : n1, col = seg ? n1 : 0;
        if (n <= 0) continue;
#ifdef TM_X86
        if (j->simd)
            attn_block_load_avx2(j, r, n, col, g, kT, vf);
        else
#endif
            attn_block_load_ref(j, r, n, col, g, kT, vf);
    }
    for (int64_t i = 0; i < j->dk && nk < ATTN_KEY_BLOCK; i++)
        memset(kT + i * ATTN_KEY_BLOCK + nk, 0, (size_t)(ATTN_KEY_BLOCK - nk) * sizeof(float));
}

/* Queries [i0, i1) for the G heads of kv group g, row r = (i - i0) G + h,
 * against keys [t_begin, t_end) (each row only up to its own position). Row
 * r's accumulator is o[r][head_dim], its running max m[r] and sum l[r]. */
static void attn_rows(const attn_job *j, int64_t g, int64_t i0, int64_t i1, int64_t t_begin,
                      int64_t t_end, float *o, float *m, float *l, float *scratch) {
    const tm_attention_shape *s = j->s;
    const int64_t d = j->dk, dv = j->dv, G = s->n_head / s->n_head_kv, n_rows = (i1 - i0) * G;
    float *kT = scratch, *vf = kT + d * ATTN_KEY_BLOCK,
          *sc = vf + (d > dv ? d : dv) * ATTN_KEY_BLOCK;
    for (int64_t t0 = t_begin; t0 < t_end; t0 += ATTN_KEY_BLOCK) {
        const int64_t nk = t_end - t0 < ATTN_KEY_BLOCK ? t_end - t0 : ATTN_KEY_BLOCK;
        attn_block_load(j, t0, nk, g, kT, vf);
        for (int64_t r0 = 0; r0 < n_rows; r0 += ATTN_ROW_TILE) {
            attn_tile t = {.nr = (int)(n_rows - r0 < ATTN_ROW_TILE ? n_rows - r0 : ATTN_ROW_TILE)};
            for (int u = 0; u < t.nr; u++) {
                const int64_t r = r0 + u, i = i0 + r / G;
                const int64_t n = s->pos0 + i + 1 - t0; /* causal: keys up to pos0 + i */
                /* a window: keys from pos0 + i - window + 1 */
                const int64_t lo = s->window ? s->pos0 + i + 1 - s->window - t0 : 0;
                t.q[u] = j->q + (i * s->n_head + g * G + r % G) * d;
                t.n[u] = n < 0 ? 0 : n < nk ? n : nk;
                t.lo[u] = lo < 0 ? 0 : lo;
                if (t.lo[u] >= t.n[u]) t.n[u] = 0, t.lo[u] = 0; /* the window ends before it */
                t.n_max = t.n[u] > t.n_max ? t.n[u] : t.n_max;
                t.o[u] = o + r * dv, t.m[u] = &m[r], t.l[u] = &l[r];
            }
            if (t.n_max == 0) continue;
#ifdef TM_X86
            if (j->simd == ATTN_AVX512)
                attn_tile_avx512(&t, kT, vf, d, dv, s->scale, sc);
            else if (j->simd)
                attn_tile_avx2(&t, kT, vf, d, dv, s->scale, sc);
            else
#endif
                attn_tile_ref(&t, kT, vf, d, dv, s->scale, sc);
        }
    }
}

/* Scratch of thread ith: the rows' accumulators, maxima and sums, then attn_rows' buffers. */
static float *attn_task_scratch(const attn_job *j, int ith, int64_t n_rows, float **o, float **m,
                                float **l) {
    float *base = j->scratch + ith * j->scratch_per_thread;
    const int64_t d = j->dv, G = j->s->n_head / j->s->n_head_kv;
    const int64_t rows = G > ATTN_TASK_ROWS ? G : ATTN_TASK_ROWS;
    *o = base, *m = base + rows * d, *l = *m + rows;
    for (int64_t r = 0; r < n_rows; r++) (*m)[r] = -INFINITY, (*l)[r] = 0;
    memset(*o, 0, (size_t)(n_rows * d) * sizeof(float));
    return *l + rows;
}

/* The first key query i sees. */
static int64_t attn_first_key(const tm_attention_shape *s, int64_t i) {
    const int64_t lo = s->window ? s->pos0 + i + 1 - s->window : 0;
    return lo > 0 ? lo : 0;
}

/* Prompt batches: (kv group, query block) tasks over every key they see. */
static void attn_batch_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const attn_job *j = ctx;
    const tm_attention_shape *s = j->s;
    const int64_t d = j->dv, G = s->n_head / s->n_head_kv;
    for (int64_t w = begin; w < end; w++) {
        /* the last query blocks see the most keys: hand them out first */
        const int64_t g = w % s->n_head_kv, b = j->n_blocks - 1 - w / s->n_head_kv,
                      i0 = b * j->q_block;
        const int64_t i1 = i0 + j->q_block < s->n_tok ? i0 + j->q_block : s->n_tok;
        float *o, *m, *l;
        float *scratch = attn_task_scratch(j, ith, (i1 - i0) * G, &o, &m, &l);
        attn_rows(j, g, i0, i1, attn_first_key(s, i0), s->pos0 + i1, o, m, l, scratch);
        for (int64_t r = 0; r < (i1 - i0) * G; r++) {
            float *y = j->out + ((i0 + r / G) * s->n_head + g * G + r % G) * d;
            float f = 1.0f, den = l[r];
            if (s->sinks) { /* the sink's exp in the denominator, at the larger max */
                const float sink = s->sinks[g * G + r % G], mx = sink > m[r] ? sink : m[r];
                f = expf(m[r] - mx), den = l[r] * f + expf(sink - mx);
            }
            const float inv = f / den;
            for (int64_t i = 0; i < d; i++) y[i] = o[r * d + i] * inv;
        }
    }
}

/* A head's output from its chunks' records: rescale each to the common max. */
static void attn_merge_head(const attn_job *j, int64_t h) {
    const int64_t d = j->dv;
    const float *recs = j->records + h * j->n_chunks * (d + 2);
    float m = -INFINITY;
    for (int64_t c = 0; c < j->n_chunks; c++) m = recs[c * (d + 2)] > m ? recs[c * (d + 2)] : m;
    if (j->s->sinks && j->s->sinks[h] > m) m = j->s->sinks[h];
    float *o = j->out + h * d;
    double sum = j->s->sinks ? (double)expf(j->s->sinks[h] - m) : 0; /* the sink's share */
    memset(o, 0, (size_t)d * sizeof(float));
    for (int64_t c = 0; c < j->n_chunks; c++) {
        const float *rec = recs + c * (d + 2);
        float f = expf(rec[0] - m);
        sum += (double)f * rec[1];
        cpu_axpy(o, f, rec + 2, d);
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < d; i++) o[i] *= inv;
}

/* Single query, (kv group, key chunk) tasks: each head's max, sum of
 * exponentials and exp-weighted value sum over the chunk go to a record. The
 * task that finishes a group's last chunk merges the group's heads, so a
 * decode step's attention has no barrier inside (one pool step). */
static void attn_split_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const attn_job *j = ctx;
    const tm_attention_shape *s = j->s;
    const int64_t d = j->dv, G = s->n_head / s->n_head_kv, n_kv = s->pos0 + 1;
    for (int64_t w = begin; w < end; w++) {
        const int64_t g = w / j->n_chunks, c = w % j->n_chunks,
                      t0 = attn_first_key(s, 0) + c * ATTN_KV_CHUNK;
        float *o, *m, *l;
        float *scratch = attn_task_scratch(j, ith, G, &o, &m, &l);
        attn_rows(j, g, 0, 1, t0, t0 + ATTN_KV_CHUNK < n_kv ? t0 + ATTN_KV_CHUNK : n_kv, o, m, l,
                  scratch);
        for (int64_t h = 0; h < G; h++) {
            float *rec =
                j->records + ((g * G + h) * j->n_chunks + c) * (d + 2); /* max, sum, acc[d] */
            rec[0] = m[h], rec[1] = l[h];
            memcpy(rec + 2, o + h * d, (size_t)d * sizeof(float));
        }
        if (atomic_fetch_sub_explicit(&j->pending[g], 1, memory_order_acq_rel) == 1)
            for (int64_t h = g * G; h < (g + 1) * G; h++) attn_merge_head(j, h);
    }
}

void cpu_attention(tm_pool *pool, const tm_attention_shape *s, const float *q, const void *k,
                   const void *v, float *out, float *scratch) {
    /* a ring holds the batch's keys in distinct rows (cpu_ops.h) */
    TM_ASSERT(!s->ring || (s->window > 0 && s->window + s->n_tok - 1 <= s->ring));
    attn_job j = {
        .s = s,
        .q = q,
        .k = k,
        .v = v,
        .out = out,
        .scratch = scratch,
        .kv_elem = s->kv_type == TM_TYPE_F16 ? 2 : 4,
        .dk = s->head_dim,
        .dv = attn_dv(s),
    };
    if (s->v_in_k) { /* the value is the key's first dv values */
        TM_ASSERT(j.dv <= j.dk);
        j.v = j.k;
    }
    if (cpu_ops_simd() && j.dk % 8 == 0 && j.dv % 8 == 0)
        j.simd = cpu_level_get() >= TM_CPU_AVX512 && j.dk % 16 == 0 && j.dv % 16 == 0 ? ATTN_AVX512
                                                                                      : ATTN_AVX2;
    const int nth = pool ? cpu_pool_size(pool) : 1;
    const int64_t G = s->n_head / s->n_head_kv;
    j.k_row_bytes = (size_t)(s->n_head_kv * j.dk) * j.kv_elem;
    j.v_row_bytes = s->v_in_k ? j.k_row_bytes : (size_t)(s->n_head_kv * j.dv) * j.kv_elem;
    j.scratch_per_thread = attn_scratch_per_thread(s);
    j.records = scratch + j.scratch_per_thread * nth;
    if (s->n_tok == 1) {
        j.n_chunks = (s->pos0 + 1 - attn_first_key(s, 0) + ATTN_KV_CHUNK - 1) / ATTN_KV_CHUNK;
        j.pending = (atomic_int *)(j.records + s->n_head * j.n_chunks * (j.dv + 2));
        for (int64_t g = 0; g < s->n_head_kv; g++) atomic_init(&j.pending[g], (int)j.n_chunks);
        cpu_pool_for(pool, s->n_head_kv * j.n_chunks, 1, attn_split_task, &j);
    } else {
        j.q_block = G < ATTN_TASK_ROWS ? ATTN_TASK_ROWS / G : 1;
        j.n_blocks = (s->n_tok + j.q_block - 1) / j.q_block;
        cpu_pool_for(pool, s->n_head_kv * j.n_blocks, 1, attn_batch_task, &j);
    }
}
