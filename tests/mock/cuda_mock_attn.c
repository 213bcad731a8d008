/* The attention launchers of the host mock (cuda_mock_ops.c says how a
 * launcher and its closure work): QK-norm, RoPE (of the first n_rot values of
 * a head when n_rot is set), the value norm (in double) and the KV store, then causal
 * grouped-query attention on the CPU's reference code (cpu_attention), for one
 * sequence or rows of several (row_pos / row_seq), with a window and sinks,
 * over a row a position or a ring (seq_rows, ring). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "cuda/attention_check.h"

#include "cuda_mock.h"

/* ---- attention ---- */

/* Rows of one sequence (the kernels' seq_rows: 0 is n_ctx). */
static int64_t attn_seq_rows(const tm_cuda_attn_params *p) {
    return p->seq_rows ? p->seq_rows : p->n_ctx;
}

typedef struct attn_arg {
    tm_cuda_attn_params p;
    float *q;
    const float *k, *v, *q_norm, *k_norm;
    const int32_t *pos0;
    int64_t n_tok, n_kv_max;
    void *k_cache, *v_cache;
    float *out;
} attn_arg;

/* The values RoPE rotates: the first n_rot of a head (0: all). */
static int64_t attn_n_rot(const tm_cuda_attn_params *p) {
    return p->n_rot ? p->n_rot : p->head_dim;
}

/* RMSNorm (when w) of one head in place, then RoPE of its first n_rot values. */
static void norm_rope_head(float *x, const float *w, const tm_cuda_attn_params *p,
                           const float *cs) {
    const int64_t nr = attn_n_rot(p);
    if (w) cpu_rmsnorm(x, x, w, p->head_dim, p->rms_eps);
    if (!p->rope_interleaved) {
        cpu_rope_neox_table(x, nr, cs, cs + nr / 2);
        return;
    }
    for (int64_t i = 0; i < nr / 2; i++) { /* adjacent pairs (cuda.h), written out here */
        const double a = x[2 * i], b = x[2 * i + 1], c = cs[i], s = cs[nr / 2 + i];
        x[2 * i] = (float)(a * c - b * s), x[2 * i + 1] = (float)(a * s + b * c);
    }
}

/* Token t's position and the first cache row of its sequence (the kernels'
 * rule: row_pos / row_seq when given, else *pos0 + t and 0); false when the
 * arrays are not device memory. */
static bool attn_row(const attn_arg *a, int64_t t, int64_t *pos, int64_t *kv0, char *err,
                     size_t err_size) {
    if (a->p.row_pos) {
        NEED_DEVICE(a->p.row_pos, (size_t)a->n_tok * 4, "row_pos");
        NEED_DEVICE(a->p.row_seq, (size_t)a->n_tok * 4, "row_seq");
        *pos = a->p.row_pos[t], *kv0 = (int64_t)a->p.row_seq[t] * attn_seq_rows(&a->p);
        return true;
    }
    NEED_DEVICE(a->pos0, 4, "pos0");
    *pos = *a->pos0 + t, *kv0 = 0;
    return true;
}

static bool attn_prepare_run(void *arg, char *err, size_t err_size) {
    const attn_arg *a = arg;
    const tm_cuda_attn_params *p = &a->p;
    const int64_t d = p->head_dim, qw = p->n_head * d, kvw = p->n_head_kv * d;
    const size_t esz = p->kv_type == TM_TYPE_F16 ? 2 : 4;
    const int64_t seq_rows = attn_seq_rows(p);
    int64_t rows_end = 0; /* cache rows written: [.., rows_end) */
    for (int64_t t = 0; t < a->n_tok; t++) {
        int64_t pos = 0, kv0 = 0;
        if (!attn_row(a, t, &pos, &kv0, err, err_size)) return false;
        const int64_t row = kv0 + (p->ring && pos >= 0 ? pos % seq_rows : pos);
        if (pos < 0 || kv0 < 0 || (!p->ring && pos >= seq_rows) || row >= p->n_ctx)
            return mock_fail(err, err_size,
                             "token %lld: position %lld of the sequence at row %lld is outside "
                             "its %lld rows%s or the cache's %lld",
                             (long long)t, (long long)pos, (long long)kv0, (long long)seq_rows,
                             p->ring ? " (a ring)" : "", (long long)p->n_ctx);
        if (row + 1 > rows_end) rows_end = row + 1;
    }
    NEED_DEVICE(a->q, (size_t)(a->n_tok * qw) * 4, "q");
    NEED_DEVICE(a->k, (size_t)(a->n_tok * kvw) * 4, "k");
    NEED_DEVICE(a->v, (size_t)(a->n_tok * kvw) * 4, "v");
    if (a->q_norm) NEED_DEVICE(a->q_norm, (size_t)d * 4, "q_norm");
    if (a->k_norm) NEED_DEVICE(a->k_norm, (size_t)d * 4, "k_norm");
    if (p->rope_freq) NEED_DEVICE(p->rope_freq, (size_t)(d / 2) * 4, "rope_freq");
    const size_t cache_bytes = (size_t)(rows_end * kvw) * esz;
    NEED_DEVICE(a->k_cache, cache_bytes, "the k cache");
    NEED_DEVICE(a->v_cache, cache_bytes, "the v cache");
    float *cs = malloc((size_t)(d + kvw) * sizeof(float)), *krow = cs + d;
    if (!cs) return mock_fail(err, err_size, "out of host memory");
    for (int64_t t = 0; t < a->n_tok; t++) {
        int64_t pos = 0, kv0 = 0;
        attn_row(a, t, &pos, &kv0, err, err_size); /* checked above */
        if (p->rope_freq) /* the whole head: n_rot is head_dim with a table */
            cpu_rope_table_freq(cs, cs + d / 2, d, pos, p->rope_freq,
                                p->rope_mscale ? p->rope_mscale : 1.0f);
        else
            cpu_rope_table(cs, cs + attn_n_rot(p) / 2, attn_n_rot(p), pos, p->rope_base);
        for (int64_t h = 0; h < p->n_head; h++)
            norm_rope_head(a->q + t * qw + h * d, a->q_norm, p, cs);
        memcpy(krow, a->k + t * kvw, (size_t)kvw * sizeof(float)); /* k is not written */
        for (int64_t h = 0; h < p->n_head_kv; h++) norm_rope_head(krow + h * d, a->k_norm, p, cs);
        const int64_t row = kv0 + (p->ring ? pos % seq_rows : pos);
        cpu_store_kv((char *)a->k_cache + (size_t)(row * kvw) * esz, krow, p->kv_type, kvw);
        const float *vrow = a->v + t * kvw;
        if (p->v_norm) { /* each head over its mean square, in double (cuda.h's v_norm) */
            for (int64_t h = 0; h < p->n_head_kv; h++) {
                double ss = 0.0;
                for (int64_t i = 0; i < d; i++) ss += (double)vrow[h * d + i] * vrow[h * d + i];
                const double r = 1.0 / sqrt(ss / (double)d + (double)p->rms_eps);
                for (int64_t i = 0; i < d; i++) krow[h * d + i] = (float)(vrow[h * d + i] * r);
            }
            vrow = krow; /* k's row is stored already */
        }
        cpu_store_kv((char *)a->v_cache + (size_t)(row * kvw) * esz, vrow, p->kv_type, kvw);
    }
    free(cs);
    return true;
}

tm_status cuda_attn_prepare(const tm_cuda_attn_params *p, float *q, const float *k, const float *v,
                            const float *q_norm, const float *k_norm, const int32_t *pos0,
                            int64_t n_tok, void *k_cache, void *v_cache, tm_cuda_stream stream) {
    tm_status st = cuda_attn_shape_check("cuda_attn_prepare", p, n_tok);
    if (st != TM_OK) return st;
    if (n_tok == 0) return TM_OK;
    if ((st = cuda_attn_prepare_check(p, q, k, v, pos0, k_cache, v_cache)) != TM_OK) return st;
    const attn_arg a = {*p, q, k, v, q_norm, k_norm, pos0, n_tok, 0, k_cache, v_cache, NULL};
    return mock_launch(stream, "cuda_attn_prepare", attn_prepare_run, &a, sizeof(a));
}

/* Rows of several sequences: each token alone, at its position, over its sequence's rows. */
static bool attention_rows_run(const attn_arg *a, char *err, size_t err_size) {
    const tm_cuda_attn_params *p = &a->p;
    const int64_t qw = (int64_t)p->n_head * p->head_dim, kvw = (int64_t)p->n_head_kv * p->head_dim;
    const size_t esz = p->kv_type == TM_TYPE_F16 ? 2 : 4;
    NEED_DEVICE(a->q, (size_t)(a->n_tok * qw) * 4, "q");
    NEED_DEVICE(a->out, (size_t)(a->n_tok * qw) * 4, "out");
    if (p->sinks) NEED_DEVICE(p->sinks, (size_t)p->n_head * 4, "sinks");
    const int64_t seq_rows = attn_seq_rows(p);
    tm_attention_shape s = {.n_tok = 1,
                            .n_head = p->n_head,
                            .n_head_kv = p->n_head_kv,
                            .head_dim = p->head_dim,
                            .scale = p->scale,
                            .kv_type = p->kv_type,
                            .window = p->window,
                            .sinks = p->sinks,
                            .ring = p->ring ? seq_rows : 0};
    float *scratch = malloc((size_t)cpu_attention_scratch_floats(&s, p->n_ctx, 1) * sizeof(float));
    if (!scratch) return mock_fail(err, err_size, "out of host memory");
    for (int64_t t = 0; t < a->n_tok; t++) {
        int64_t pos = 0, kv0 = 0;
        if (!attn_row(a, t, &pos, &kv0, err, err_size)) return free(scratch), false;
        /* the rows its keys may be in: up to its position's, or all of a ring's */
        const int64_t n_rows = p->ring ? seq_rows : pos + 1;
        if (pos < 0 || kv0 < 0 || pos + 1 > a->n_kv_max || (!p->ring && pos >= seq_rows) ||
            kv0 + n_rows > p->n_ctx) {
            free(scratch);
            return mock_fail(err, err_size,
                             "token %lld: position %lld of the sequence at row %lld past n_kv_max "
                             "%lld given at launch, its %lld rows or the cache's %lld",
                             (long long)t, (long long)pos, (long long)kv0, (long long)a->n_kv_max,
                             (long long)seq_rows, (long long)p->n_ctx);
        }
        const char *k = (const char *)a->k_cache + (size_t)(kv0 * kvw) * esz;
        const char *v = (const char *)a->v_cache + (size_t)(kv0 * kvw) * esz;
        if (!mock_device_range(k, (size_t)(n_rows * kvw) * esz) ||
            !mock_device_range(v, (size_t)(n_rows * kvw) * esz)) {
            free(scratch);
            return mock_fail(err, err_size, "illegal address: token %lld's cache rows",
                             (long long)t);
        }
        s.pos0 = pos;
        cpu_attention(NULL, &s, a->q + t * qw, k, v, a->out + t * qw, scratch);
    }
    free(scratch);
    return true;
}

static bool attention_run(void *arg, char *err, size_t err_size) {
    const attn_arg *a = arg;
    const tm_cuda_attn_params *p = &a->p;
    const int64_t qw = (int64_t)p->n_head * p->head_dim, kvw = (int64_t)p->n_head_kv * p->head_dim;
    if (p->row_pos) return attention_rows_run(a, err, err_size);
    NEED_DEVICE(a->pos0, 4, "pos0");
    const int64_t pos0 = *a->pos0;
    if (pos0 < 0 || pos0 + a->n_tok > a->n_kv_max)
        return mock_fail(err, err_size, "positions %lld..%lld past n_kv_max %lld given at launch",
                         (long long)pos0, (long long)(pos0 + a->n_tok - 1), (long long)a->n_kv_max);
    const int64_t seq_rows = attn_seq_rows(p);
    if (!p->ring && pos0 + a->n_tok > seq_rows)
        return mock_fail(err, err_size, "positions %lld..%lld past the sequence's %lld rows",
                         (long long)pos0, (long long)(pos0 + a->n_tok - 1), (long long)seq_rows);
    const int64_t n_rows = p->ring ? seq_rows : pos0 + a->n_tok; /* rows its keys may be in */
    const size_t cache_bytes = (size_t)(n_rows * kvw) * (p->kv_type == TM_TYPE_F16 ? 2 : 4);
    NEED_DEVICE(a->q, (size_t)(a->n_tok * qw) * 4, "q");
    NEED_DEVICE(a->out, (size_t)(a->n_tok * qw) * 4, "out");
    NEED_DEVICE(a->k_cache, cache_bytes, "the k cache");
    NEED_DEVICE(a->v_cache, cache_bytes, "the v cache");
    if (p->sinks) NEED_DEVICE(p->sinks, (size_t)p->n_head * 4, "sinks");
    const tm_attention_shape s = {.n_tok = a->n_tok,
                                  .pos0 = pos0,
                                  .n_head = p->n_head,
                                  .n_head_kv = p->n_head_kv,
                                  .head_dim = p->head_dim,
                                  .scale = p->scale,
                                  .kv_type = p->kv_type,
                                  .window = p->window,
                                  .sinks = p->sinks,
                                  .ring = p->ring ? seq_rows : 0};
    const int64_t n_kv = pos0 + a->n_tok; /* the decode split's records cover these keys */
    float *scratch = malloc((size_t)cpu_attention_scratch_floats(&s, n_kv, 1) * sizeof(float));
    if (!scratch) return mock_fail(err, err_size, "out of host memory");
    cpu_attention(NULL, &s, a->q, a->k_cache, a->v_cache, a->out, scratch);
    free(scratch);
    return true;
}

int64_t cuda_attention_scratch_floats(const tm_cuda_attn_params *p, int64_t n_tok,
                                      int64_t n_kv_max) {
    if (cuda_attn_shape_check("cuda_attention_scratch_floats", p, n_tok) || n_tok < 1 ||
        n_kv_max < 1)
        return 0;
    return n_tok * p->n_head * (p->head_dim + 2); /* one split's records; the mock uses none */
}

tm_status cuda_attention(const tm_cuda_attn_params *p, const float *q, const void *k_cache,
                         const void *v_cache, const int32_t *pos0, int64_t n_tok, int64_t n_kv_max,
                         float *out, float *scratch, tm_cuda_stream stream) {
    tm_status st = cuda_attn_shape_check("cuda_attention", p, n_tok);
    if (st != TM_OK) return st;
    if (n_tok == 0) return TM_OK;
    if ((st = cuda_attention_check(p, n_tok, n_kv_max, q, k_cache, v_cache, pos0, out)) != TM_OK)
        return st;
    const attn_arg a = {*p,
                        (float *)q,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        pos0,
                        n_tok,
                        n_kv_max,
                        (void *)k_cache,
                        (void *)v_cache,
                        out};
    return mock_launch(stream, "cuda_attention", attention_run, &a, sizeof(a));
}
