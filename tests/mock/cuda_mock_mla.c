/* The latent-attention launchers of the host mock (cuda_mock_ops.c says how a
 * launcher and its closure work), written from cuda.h's contract in double,
 * not with the CPU engine's code: the RoPE parts of q and the key turned
 * (angles in double, as the contract says), the latent RMS-normed, the row
 * stored; then per (token, head) the softmax over the sequence's keys up to
 * the token's position and the weighted sum of their latents. And the strided
 * row copy of the per-head products. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "cuda/mla_check.h"

#include "cuda_mock.h"

typedef struct mla_arg {
    tm_cuda_attn_params p;
    float *q, *kv;
    const float *kv_norm;
    const int32_t *pos0;
    int64_t n_tok;
    void *k_cache;
    float *out;
} mla_arg;

/* Token t's position and its sequence's first cache row; false (err written) when it is
 * outside its sequence's rows or the cache, or the arrays are not device memory. */
static bool mla_row(const mla_arg *a, int64_t t, int64_t *pos, int64_t *row0, char *err,
                    size_t err_size) {
    const tm_cuda_attn_params *p = &a->p;
    const int64_t seq_rows = p->seq_rows ? p->seq_rows : p->n_ctx;
    if (p->row_pos) {
        NEED_DEVICE(p->row_pos, (size_t)a->n_tok * 4, "row_pos");
        NEED_DEVICE(p->row_seq, (size_t)a->n_tok * 4, "row_seq");
        *pos = p->row_pos[t], *row0 = (int64_t)p->row_seq[t] * seq_rows;
    } else {
        NEED_DEVICE(a->pos0, 4, "pos0");
        *pos = *a->pos0 + t, *row0 = 0;
    }
    if (*pos < 0 || *pos >= seq_rows || *row0 < 0 || *row0 + *pos >= p->n_ctx)
        return mock_fail(err, err_size,
                         "token %lld: position %lld of the sequence at row %lld is outside its "
                         "%lld rows or the cache's %lld",
                         (long long)t, (long long)*pos, (long long)*row0, (long long)seq_rows,
                         (long long)p->n_ctx);
    return true;
}

/* RoPE pair i of n_rot values x at pos: (2i, 2i + 1) or NeoX (i, i + n_rot / 2). */
static void mla_rope(const tm_cuda_attn_params *p, float *x, int64_t pos) {
    for (int i = 0; i < p->n_rot / 2; i++) {
        const double th = p->rope_freq ? (double)pos * p->rope_freq[i]
                                       : (double)pos * pow(p->rope_base, -2.0 * i / p->n_rot);
        const double ms = p->rope_freq && p->rope_mscale ? p->rope_mscale : 1.0;
        const int e0 = p->rope_interleaved ? 2 * i : i,
                  e1 = p->rope_interleaved ? 2 * i + 1 : i + p->n_rot / 2;
        const double a = x[e0], b = x[e1], c = cos(th) * ms, s = sin(th) * ms;
        x[e0] = (float)(a * c - b * s), x[e1] = (float)(a * s + b * c);
    }
}

static bool mla_prepare_run(void *arg, char *err, size_t err_size) {
    const mla_arg *a = arg;
    const tm_cuda_attn_params *p = &a->p;
    const int64_t D = p->head_dim, L = p->v_dim;
    const size_t esz = p->kv_type == TM_TYPE_F16 ? 2 : 4;
    NEED_DEVICE(a->q, (size_t)(a->n_tok * p->n_head * D) * 4, "q");
    NEED_DEVICE(a->kv, (size_t)(a->n_tok * D) * 4, "kv");
    if (a->kv_norm) NEED_DEVICE(a->kv_norm, (size_t)L * 4, "kv_norm");
    if (p->rope_freq) NEED_DEVICE(p->rope_freq, (size_t)(p->n_rot / 2) * 4, "rope_freq");
    for (int64_t t = 0; t < a->n_tok; t++) {
        int64_t pos, row0;
        if (!mla_row(a, t, &pos, &row0, err, err_size)) return false;
        NEED_DEVICE((char *)a->k_cache + (size_t)((row0 + pos) * D) * esz, (size_t)D * esz,
                    "the cache row");
        for (int h = 0; h < p->n_head; h++) mla_rope(p, a->q + (t * p->n_head + h) * D + L, pos);
        float *row = a->kv + t * D;
        if (a->kv_norm) {
            double ss = 0;
            for (int64_t i = 0; i < L; i++) ss += (double)row[i] * row[i];
            const double r = 1.0 / sqrt(ss / (double)L + p->rms_eps);
            for (int64_t i = 0; i < L; i++) row[i] = (float)(row[i] * r * a->kv_norm[i]);
        }
        mla_rope(p, row + L, pos);
        cpu_store_kv((char *)a->k_cache + (size_t)((row0 + pos) * D) * esz, row, p->kv_type, D);
    }
    return true;
}

tm_status cuda_mla_prepare(const tm_cuda_attn_params *p, float *q, float *kv, const float *kv_norm,
                           const int32_t *pos0, int64_t n_tok, void *k_cache,
                           tm_cuda_stream stream) {
    tm_status st = cuda_mla_check("cuda_mla_prepare", p, n_tok, q, kv, pos0, k_cache);
    if (st != TM_OK || n_tok == 0) return st;
    const mla_arg a = {*p, q, kv, kv_norm, pos0, n_tok, k_cache, NULL};
    return mock_launch(stream, "cuda_mla_prepare", mla_prepare_run, &a, sizeof(a));
}

static bool mla_attention_run(void *arg, char *err, size_t err_size) {
    const mla_arg *a = arg;
    const tm_cuda_attn_params *p = &a->p;
    const int64_t D = p->head_dim, L = p->v_dim;
    const size_t esz = p->kv_type == TM_TYPE_F16 ? 2 : 4;
    NEED_DEVICE(a->q, (size_t)(a->n_tok * p->n_head * D) * 4, "q");
    NEED_DEVICE(a->out, (size_t)(a->n_tok * p->n_head * L) * 4, "out");
    double *acc = malloc(sizeof(double) * (size_t)L);
    float *key = malloc(sizeof(float) * (size_t)D);
    if (!acc || !key) return free(acc), free(key), mock_fail(err, err_size, "out of host memory");
    bool ok = true;
    for (int64_t t = 0; t < a->n_tok && ok; t++) {
        int64_t pos, row0;
        if (!(ok = mla_row(a, t, &pos, &row0, err, err_size))) break;
        const char *rows = (const char *)a->k_cache + (size_t)(row0 * D) * esz;
        if (!(ok = mock_device_range(rows, (size_t)((pos + 1) * D) * esz))) {
            mock_fail(err, err_size, "illegal address: token %lld's cache rows", (long long)t);
            break;
        }
        for (int h = 0; h < p->n_head; h++) {
            const float *qh = a->q + (t * p->n_head + h) * D;
            double mx = -INFINITY, z = 0;
            for (int64_t j = 0; j <= pos; j++) { /* the largest score */
                cpu_load_kv(key, rows + (size_t)(j * D) * esz, p->kv_type, D);
                double s = 0;
                for (int64_t i = 0; i < D; i++) s += (double)qh[i] * key[i];
                mx = fmax(mx, s * p->scale);
            }
            memset(acc, 0, sizeof(double) * (size_t)L);
            for (int64_t j = 0; j <= pos; j++) {
                cpu_load_kv(key, rows + (size_t)(j * D) * esz, p->kv_type, D);
                double s = 0;
                for (int64_t i = 0; i < D; i++) s += (double)qh[i] * key[i];
                const double e = exp(s * p->scale - mx);
                z += e;
                for (int64_t i = 0; i < L; i++) acc[i] += e * key[i];
            }
            for (int64_t i = 0; i < L; i++)
                a->out[(t * p->n_head + h) * L + i] = (float)(acc[i] / z);
        }
    }
    free(acc), free(key);
    return ok;
}

int64_t cuda_mla_scratch_floats(const tm_cuda_attn_params *p, int64_t n_tok) {
    (void)p, (void)n_tok;
    return 0; /* the mock's one f64 path needs none */
}

tm_status cuda_mla_attention(const tm_cuda_attn_params *p, const float *q, const void *k_cache,
                             const int32_t *pos0, int64_t n_tok, float *out, float *scratch,
                             tm_cuda_stream stream) {
    (void)scratch;
    tm_status st = cuda_mla_check("cuda_mla_attention", p, n_tok, q, out, pos0, k_cache);
    if (st != TM_OK || n_tok == 0) return st;
    const mla_arg a = {*p, (float *)q, NULL, NULL, pos0, n_tok, (void *)k_cache, out};
    return mock_launch(stream, "cuda_mla_attention", mla_attention_run, &a, sizeof(a));
}

typedef struct copy_arg {
    float *dst;
    const float *src;
    int64_t dst_ld, src_ld, rows, n;
} copy_arg;

static bool copy_rows_run(void *arg, char *err, size_t err_size) {
    const copy_arg *a = arg;
    NEED_DEVICE(a->dst, (size_t)((a->rows - 1) * a->dst_ld + a->n) * 4, "dst");
    NEED_DEVICE(a->src, (size_t)((a->rows - 1) * a->src_ld + a->n) * 4, "src");
    for (int64_t r = 0; r < a->rows; r++)
        memmove(a->dst + r * a->dst_ld, a->src + r * a->src_ld, (size_t)a->n * sizeof(float));
    return true;
}

tm_status cuda_copy_rows(float *dst, int64_t dst_ld, const float *src, int64_t src_ld, int64_t rows,
                         int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_copy_rows_check(dst, dst_ld, src, src_ld, rows, n);
    if (st != TM_OK || !rows || !n) return st;
    const copy_arg a = {dst, src, dst_ld, src_ld, rows, n};
    return mock_launch(stream, "cuda_copy_rows", copy_rows_run, &a, sizeof(a));
}
