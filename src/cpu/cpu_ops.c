/* CPU element-wise and attention ops (see cpu_ops.h). */
#include "cpu/cpu_ops.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define TM_X86 1
#endif

void cpu_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    /* Four partial sums: deterministic, and fast without -ffast-math. */
    float s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += x[i + j] * x[i + j];
    for (; i < n; i++) s[0] += x[i] * x[i];
    const float scale = 1.0f / sqrtf((s[0] + s[1] + s[2] + s[3]) / (float)n + eps);
    if (w)
        for (i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
    else
        for (i = 0; i < n; i++) y[i] = x[i] * scale;
}

void cpu_rope_table(float *cos_out, float *sin_out, int64_t head_dim, int64_t pos, float base) {
    for (int64_t i = 0; i < head_dim / 2; i++) {
        /* Angles in double: at positions in the tens of thousands, float
         * angles lose the low bits that the rotation depends on. */
        double theta = (double)pos * pow((double)base, -2.0 * (double)i / (double)head_dim);
        cos_out[i] = (float)cos(theta);
        sin_out[i] = (float)sin(theta);
    }
}

void cpu_rope_neox_table(float *x, int64_t head_dim, const float *cos_t, const float *sin_t) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos_t[i] - b * sin_t[i];
        x[i + half] = a * sin_t[i] + b * cos_t[i];
    }
}

void cpu_softmax(float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i] = expf(x[i] - m);
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void cpu_swiglu(float *h, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void cpu_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void cpu_topk(const float *x, int64_t n, int64_t k, int32_t *idx) {
    /* Insertion into a sorted list of k: k is small (<= 32) next to n. */
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (m == k && !(x[i] > x[idx[k - 1]])) continue;
        int64_t j = m < k ? m++ : k - 1;
        while (j > 0 && x[idx[j - 1]] < x[i]) idx[j] = idx[j - 1], j--;
        idx[j] = (int32_t)i;
    }
}

/* ---- KV rows ---- */

#ifdef TM_X86
__attribute__((target("avx2,fma,f16c"))) static float
dot_f32_f16_avx2(const float *q, const tm_half *k, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
        __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i + 8)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), k0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), k1, acc1);
    }
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r += q[i] * quant_f16_to_f32(k[i]);
    return r;
}

__attribute__((target("avx2,fma"))) static float dot_f32_avx2(const float *q, const float *k,
                                                              int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), acc1);
    }
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r += q[i] * k[i];
    return r;
}

__attribute__((target("avx2,fma,f16c"))) static void axpy_f16_avx2(float *y, float a,
                                                                   const tm_half *v, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, x, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] += a * quant_f16_to_f32(v[i]);
}

__attribute__((target("avx2,f16c"))) static void load_f16_avx2(float *dst, const tm_half *src,
                                                               int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = quant_f16_to_f32(src[i]);
}

__attribute__((target("avx2,f16c"))) static void store_f16_avx2(tm_half *dst, const float *src,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = quant_f32_to_f16(src[i]);
}
#endif

static int use_f16c(void) {
#ifdef TM_X86
    const tm_cpu_features *f = cpu_features();
    return f->avx2 && f->fma && f->f16c && cpu_level_get() >= TM_CPU_AVX2;
#else
    return 0;
#endif
}

float cpu_dot_f32_kv(const float *q, const void *k, tm_type kv_type, int64_t n) {
#ifdef TM_X86
    if (kv_type == TM_TYPE_F32 && use_f16c()) return dot_f32_avx2(q, k, n);
#endif
    if (kv_type == TM_TYPE_F32) {
        const float *kf = k;
        float s[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) s[j] += q[i + j] * kf[i + j];
        for (; i < n; i++) s[0] += q[i] * kf[i];
        return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
#ifdef TM_X86
    if (use_f16c()) return dot_f32_f16_avx2(q, k, n);
#endif
    const tm_half *kh = k;
    float r = 0;
    for (int64_t i = 0; i < n; i++) r += q[i] * quant_f16_to_f32(kh[i]);
    return r;
}

void cpu_axpy_kv(float *y, float a, const void *v, tm_type kv_type, int64_t n) {
    if (kv_type == TM_TYPE_F32) {
        cpu_axpy(y, a, v, n);
        return;
    }
#ifdef TM_X86
    if (use_f16c()) {
        axpy_f16_avx2(y, a, v, n);
        return;
    }
#endif
    const tm_half *vh = v;
    for (int64_t i = 0; i < n; i++) y[i] += a * quant_f16_to_f32(vh[i]);
}

void cpu_load_kv(float *dst, const void *src, tm_type kv_type, int64_t n) {
    if (kv_type == TM_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#ifdef TM_X86
    if (use_f16c()) {
        load_f16_avx2(dst, src, n);
        return;
    }
#endif
    const tm_half *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(h[i]);
}

void cpu_store_kv(void *dst, const float *src, tm_type kv_type, int64_t n) {
    if (kv_type == TM_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#ifdef TM_X86
    if (use_f16c()) {
        store_f16_avx2(dst, src, n);
        return;
    }
#endif
    tm_half *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = quant_f32_to_f16(src[i]);
}

/* ---- attention ---- */

#define ATTN_KEY_BLOCK 64             /* keys per block of the blocked attention */
#define ATTN_KV_CHUNK  ATTN_KEY_BLOCK /* keys per task when one query is split over threads */
#define ATTN_TASK_ROWS 128 /* (query, head) rows per blocked task, at least one query's heads */

typedef struct attn_job {
    const tm_attention_shape *s;
    const float *q;
    const uint8_t *k, *v;
    float *out;
    float *scratch;
    int64_t scratch_per_thread;
    float *records; /* split decode: per (head, chunk) max, sum, acc[head_dim] */
    size_t kv_row_bytes, kv_elem;
    int64_t n_chunks;          /* decode split: key chunks per head */
    int64_t q_block, n_blocks; /* blocked: queries per task, query blocks */
    bool simd;
} attn_job;

/* Per-thread scratch: a K block (transposed), a V block, a score row, and
 * per task row an accumulator, a max and a sum. */
static int64_t attn_scratch_per_thread(const tm_attention_shape *s) {
    const int64_t G = s->n_head / s->n_head_kv, rows = G > ATTN_TASK_ROWS ? G : ATTN_TASK_ROWS;
    return 2 * s->head_dim * ATTN_KEY_BLOCK + ATTN_KEY_BLOCK + rows * (s->head_dim + 2);
}

int64_t cpu_attention_scratch_floats(const tm_attention_shape *s, int64_t n_ctx, int n_threads) {
    /* per thread, plus for the split: per (head, chunk) a max, a sum and an accumulator */
    int64_t chunks = (n_ctx + ATTN_KV_CHUNK - 1) / ATTN_KV_CHUNK;
    return attn_scratch_per_thread(s) * (n_threads > 0 ? n_threads : 1) +
           s->n_head * chunks * (s->head_dim + 2);
}

/* Blocked attention kernels, for one (query, head) row against one key block:
 *   scores:  s[j] = scale · q · k_j            for j < ATTN_KEY_BLOCK (kT is [d][ATTN_KEY_BLOCK])
 *   update:  online softmax over the first n keys (the rest of s is ignored):
 *            m' = max(m, max s), o = o·exp(m - m') + Σ exp(s_j - m') v_j, l likewise */
static void attn_scores_ref(const float *q, const float *kT, int64_t d, float scale, float *s) {
    for (int j = 0; j < ATTN_KEY_BLOCK; j++) s[j] = 0;
    for (int64_t i = 0; i < d; i++)
        for (int j = 0; j < ATTN_KEY_BLOCK; j++) s[j] += q[i] * kT[i * ATTN_KEY_BLOCK + j];
    for (int j = 0; j < ATTN_KEY_BLOCK; j++) s[j] *= scale;
}

static void attn_update_ref(float *o, float *m, float *l, float *s, int64_t n, const float *v,
                            int64_t d) {
    float mb = *m;
    for (int64_t j = 0; j < n; j++) mb = s[j] > mb ? s[j] : mb;
    const float alpha = expf(*m - mb); /* 0 on the first block: m = -inf */
    float sum = 0;
    for (int64_t j = 0; j < n; j++) sum += s[j] = expf(s[j] - mb);
    *m = mb, *l = *l * alpha + sum;
    for (int64_t i = 0; i < d; i++) o[i] *= alpha;
    for (int64_t j = 0; j < n; j++) cpu_axpy(o, s[j], v + j * d, d);
}

#ifdef TM_X86
/* exp for x <= 0 (Cephes' polynomial, about 1 ulp); 0 below -87. */
__attribute__((target("avx2,fma"))) static inline __m256 exp_neg_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_GE_OQ); /* also clears -inf and NaN */
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), zero_mask);
}

__attribute__((target("avx2,fma"))) static void attn_scores_avx2(const float *q, const float *kT,
                                                                 int64_t d, float scale, float *s) {
    __m256 acc[ATTN_KEY_BLOCK / 8];
    for (int v = 0; v < ATTN_KEY_BLOCK / 8; v++) acc[v] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i++) {
        const __m256 b = _mm256_broadcast_ss(q + i);
        for (int v = 0; v < ATTN_KEY_BLOCK / 8; v++)
            acc[v] = _mm256_fmadd_ps(b, _mm256_loadu_ps(kT + i * ATTN_KEY_BLOCK + 8 * v), acc[v]);
    }
    for (int v = 0; v < ATTN_KEY_BLOCK / 8; v++)
        _mm256_storeu_ps(s + 8 * v, _mm256_mul_ps(acc[v], _mm256_set1_ps(scale)));
}

/* o[0, 8 nv) = o · alpha + Σ_j p_j v_j[0, 8 nv); nv is a constant after inlining. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
attn_pv_avx2(float *o, float alpha, const float *p, int64_t n, const float *v, int64_t d, int nv) {
    __m256 acc[8];
    const __m256 a = _mm256_set1_ps(alpha);
    for (int u = 0; u < nv; u++) acc[u] = _mm256_mul_ps(_mm256_loadu_ps(o + 8 * u), a);
    for (int64_t j = 0; j < n; j++) {
        const __m256 b = _mm256_broadcast_ss(p + j);
        for (int u = 0; u < nv; u++)
            acc[u] = _mm256_fmadd_ps(b, _mm256_loadu_ps(v + j * d + 8 * u), acc[u]);
    }
    for (int u = 0; u < nv; u++) _mm256_storeu_ps(o + 8 * u, acc[u]);
}

/* head_dim a multiple of 8 */
__attribute__((target("avx2,fma"))) static void
attn_update_avx2(float *o, float *m, float *l, float *s, int64_t n, const float *v, int64_t d) {
    for (int64_t j = n; j < ATTN_KEY_BLOCK; j++) s[j] = -INFINITY;
    __m256 mx = _mm256_set1_ps(*m);
    for (int u = 0; u < ATTN_KEY_BLOCK / 8; u++) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + 8 * u));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float mb = _mm_cvtss_f32(m4);
    const float alpha = expf(*m - mb); /* 0 on the first block: m = -inf */
    __m256 sum = _mm256_setzero_ps();
    const __m256 vmb = _mm256_set1_ps(mb);
    for (int u = 0; u < ATTN_KEY_BLOCK / 8; u++) {
        __m256 e = exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * u), vmb));
        _mm256_storeu_ps(s + 8 * u, e);
        sum = _mm256_add_ps(sum, e);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    s4 = _mm_hadd_ps(s4, s4);
    s4 = _mm_hadd_ps(s4, s4);
    *m = mb, *l = *l * alpha + _mm_cvtss_f32(s4);
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) attn_pv_avx2(o + i, alpha, s, n, v + i, d, 8);
    for (; i < d; i += 8) attn_pv_avx2(o + i, alpha, s, n, v + i, d, 1);
}
#endif

/* Queries [i0, i1) for the G heads of kv group g, row r = (i - i0) G + h,
 * against keys [t_begin, t_end) (each row only up to its own position), in
 * blocks of ATTN_KEY_BLOCK: each K/V block is converted to f32 once and used
 * by every row (flash-attention style). Row r's accumulator o[r][head_dim],
 * running max m[r] and sum l[r] are updated by an online softmax. A row's
 * result depends only on its query position and the key range, not on the
 * other rows of the task. */
static void attn_rows(const attn_job *j, int64_t g, int64_t i0, int64_t i1, int64_t t_begin,
                      int64_t t_end, float *o, float *m, float *l, float *scratch) {
    const tm_attention_shape *s = j->s;
    const int64_t d = s->head_dim, G = s->n_head / s->n_head_kv, n_rows = (i1 - i0) * G;
    float *kT = scratch, *vf = kT + d * ATTN_KEY_BLOCK, *sc = vf + d * ATTN_KEY_BLOCK;
    const size_t off = (size_t)g * d * j->kv_elem;
#ifdef TM_X86
    void (*scores)(const float *, const float *, int64_t, float, float *) =
        j->simd ? attn_scores_avx2 : attn_scores_ref;
    void (*update)(float *, float *, float *, float *, int64_t, const float *, int64_t) =
        j->simd ? attn_update_avx2 : attn_update_ref;
#else
    void (*scores)(const float *, const float *, int64_t, float, float *) = attn_scores_ref;
    void (*update)(float *, float *, float *, float *, int64_t, const float *, int64_t) =
        attn_update_ref;
#endif
    for (int64_t t0 = t_begin; t0 < t_end; t0 += ATTN_KEY_BLOCK) {
        const int64_t nk = t_end - t0 < ATTN_KEY_BLOCK ? t_end - t0 : ATTN_KEY_BLOCK;
        for (int64_t t = 0; t < nk; t++) {
            float *row = vf + t * d; /* K row through the V buffer, then transposed */
            cpu_load_kv(row, j->k + (t0 + t) * j->kv_row_bytes + off, s->kv_type, d);
            for (int64_t i = 0; i < d; i++) kT[i * ATTN_KEY_BLOCK + t] = row[i];
        }
        for (int64_t t = nk; t < ATTN_KEY_BLOCK; t++)
            for (int64_t i = 0; i < d; i++) kT[i * ATTN_KEY_BLOCK + t] = 0;
        for (int64_t t = 0; t < nk; t++)
            cpu_load_kv(vf + t * d, j->v + (t0 + t) * j->kv_row_bytes + off, s->kv_type, d);
        for (int64_t r = 0; r < n_rows; r++) {
            const int64_t i = i0 + r / G,
                          n = s->pos0 + i + 1 - t0; /* causal: keys up to pos0 + i */
            if (n <= 0) continue;
            scores(j->q + (i * s->n_head + g * G + r % G) * d, kT, d, s->scale, sc);
            update(o + r * d, &m[r], &l[r], sc, n < nk ? n : nk, vf, d);
        }
    }
}

/* Scratch of thread ith: the rows' accumulators, maxima and sums, then attn_rows' buffers. */
static float *attn_task_scratch(const attn_job *j, int ith, int64_t n_rows, float **o, float **m,
                                float **l) {
    float *base = j->scratch + ith * j->scratch_per_thread;
    const int64_t d = j->s->head_dim, G = j->s->n_head / j->s->n_head_kv;
    const int64_t rows = G > ATTN_TASK_ROWS ? G : ATTN_TASK_ROWS;
    *o = base, *m = base + rows * d, *l = *m + rows;
    for (int64_t r = 0; r < n_rows; r++) (*m)[r] = -INFINITY, (*l)[r] = 0;
    memset(*o, 0, (size_t)(n_rows * d) * sizeof(float));
    return *l + rows;
}

/* Prompt batches: (kv group, query block) tasks over every key they see. */
static void attn_batch_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const attn_job *j = ctx;
    const tm_attention_shape *s = j->s;
    const int64_t d = s->head_dim, G = s->n_head / s->n_head_kv;
    for (int64_t w = begin; w < end; w++) {
        /* the last query blocks see the most keys: hand them out first */
        const int64_t g = w % s->n_head_kv, b = j->n_blocks - 1 - w / s->n_head_kv,
                      i0 = b * j->q_block;
        const int64_t i1 = i0 + j->q_block < s->n_tok ? i0 + j->q_block : s->n_tok;
        float *o, *m, *l;
        float *scratch = attn_task_scratch(j, ith, (i1 - i0) * G, &o, &m, &l);
        attn_rows(j, g, i0, i1, 0, s->pos0 + i1, o, m, l, scratch);
        for (int64_t r = 0; r < (i1 - i0) * G; r++) {
            float *y = j->out + ((i0 + r / G) * s->n_head + g * G + r % G) * d;
            const float inv = 1.0f / l[r];
            for (int64_t i = 0; i < d; i++) y[i] = o[r * d + i] * inv;
        }
    }
}

/* Single query, (kv group, key chunk) tasks: each head's max, sum of
 * exponentials and exp-weighted value sum over the chunk go to a record;
 * attn_merge_task combines a head's records. */
static void attn_split_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const attn_job *j = ctx;
    const tm_attention_shape *s = j->s;
    const int64_t d = s->head_dim, G = s->n_head / s->n_head_kv, n_kv = s->pos0 + 1;
    for (int64_t w = begin; w < end; w++) {
        const int64_t g = w / j->n_chunks, c = w % j->n_chunks, t0 = c * ATTN_KV_CHUNK;
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
    }
}

static void attn_merge_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const attn_job *j = ctx;
    const int64_t d = j->s->head_dim;
    for (int64_t h = begin; h < end; h++) {
        const float *recs = j->records + h * j->n_chunks * (d + 2);
        float m = -INFINITY;
        for (int64_t c = 0; c < j->n_chunks; c++) m = recs[c * (d + 2)] > m ? recs[c * (d + 2)] : m;
        float *o = j->out + h * d;
        double sum = 0;
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
    (void)ith;
}

void cpu_attention(tm_pool *pool, const tm_attention_shape *s, const float *q, const void *k,
                   const void *v, float *out, float *scratch) {
    attn_job j = {
        .s = s,
        .q = q,
        .k = k,
        .v = v,
        .out = out,
        .scratch = scratch,
        .kv_elem = s->kv_type == TM_TYPE_F16 ? 2 : 4,
        .simd = use_f16c() && s->head_dim % 8 == 0,
    };
    const int nth = pool ? cpu_pool_size(pool) : 1;
    const int64_t G = s->n_head / s->n_head_kv;
    j.kv_row_bytes = (size_t)(s->n_head_kv * s->head_dim) * j.kv_elem;
    j.scratch_per_thread = attn_scratch_per_thread(s);
    j.records = scratch + j.scratch_per_thread * nth;
    if (s->n_tok == 1) {
        j.n_chunks = (s->pos0 + 1 + ATTN_KV_CHUNK - 1) / ATTN_KV_CHUNK;
        const tm_pool_step steps[] = {
            {attn_split_task, s->n_head_kv * j.n_chunks, 1},
            {attn_merge_task, s->n_head, 1},
        };
        cpu_pool_for_steps(pool, 2, steps, &j);
    } else {
        j.q_block = G < ATTN_TASK_ROWS ? ATTN_TASK_ROWS / G : 1;
        j.n_blocks = (s->n_tok + j.q_block - 1) / j.q_block;
        cpu_pool_for(pool, s->n_head_kv * j.n_blocks, 1, attn_batch_task, &j);
    }
}

/* ---- precise products ---- */

typedef struct precise_job {
    tm_type wtype;
    int64_t k, rows, n_tok;
    const uint8_t *w;
    size_t w_row_bytes;
    const float *x;
    float *y;
    float *rowbuf; /* one dequantized row per thread */
} precise_job;

static void precise_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const precise_job *j = ctx;
    float *row = j->rowbuf + ith * j->k;
    for (int64_t r = begin; r < end; r++) {
        quant_row_dequantize(j->wtype, j->w + r * j->w_row_bytes, row, j->k);
        for (int64_t t = 0; t < j->n_tok; t++) {
            const float *x = j->x + t * j->k;
            double acc = 0;
            for (int64_t i = 0; i < j->k; i++) acc += (double)row[i] * x[i];
            j->y[t * j->rows + r] = (float)acc;
        }
    }
}

tm_status cpu_matmul_precise(tm_pool *pool, tm_type wtype, int64_t k, int64_t rows, const void *w,
                             size_t w_row_bytes, const float *x, int64_t n_tok, float *y) {
    const int nth = pool ? cpu_pool_size(pool) : 1;
    precise_job j = {
        wtype, k, rows, n_tok, w, w_row_bytes, x, y, malloc((size_t)(nth * k) * sizeof(float))};
    if (!j.rowbuf) return tm_error_set(TM_ERR_NOMEM, "precise matmul: out of memory");
    tm_status st = quant_row_dequantize(wtype, w, j.rowbuf, k); /* checks type and k once */
    if (st == TM_OK) cpu_pool_for(pool, rows, 16, precise_task, &j);
    free(j.rowbuf);
    return st;
}
