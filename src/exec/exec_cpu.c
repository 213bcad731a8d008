/* The executor's CPU side: its ops on the thread pool, with the CPU kernels
 * of src/cpu (quantized-activation products, or double products from
 * dequantized weights in the precise mode). Per-token work of a batch (norms,
 * QK-norm + RoPE + KV store) is spread over the pool; a single token runs on
 * the calling thread (not worth a wake-up). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "exec/exec_internal.h"

tm_status exec_cpu_finalize(tm_exec *e) {
    const tm_attn_desc *a = &e->attn_shape;
    bool any = false;
    for (uint32_t l = 0; l < e->n_layer; l++) any |= e->layer_dev[l] == TM_DEV_CPU;
    if (!any) return TM_OK;
    const tm_attention_shape as = {.n_tok = e->p.n_batch,
                                   .n_head = a->n_head,
                                   .n_head_kv = a->n_head_kv,
                                   .head_dim = a->head_dim,
                                   .v_dim = a->latent ? a->v_dim : 0,
                                   .v_in_k = a->latent,
                                   .kv_type = e->p.kv_type};
    const int64_t n = cpu_attention_scratch_floats(&as, e->n_ctx_seq, cpu_pool_size(e->p.pool));
    const size_t rope = (size_t)(e->p.n_batch * (a->head_dim / 2)) * sizeof(float);
    if (!(e->cpu_attn = malloc((size_t)n * sizeof(float))) || !(e->rope_cos = malloc(rope)) ||
        !(e->rope_sin = malloc(rope)))
        return tm_error_set(TM_ERR_NOMEM, "out of memory for attention scratch (%lld floats)",
                            (long long)n);
    return TM_OK;
}

void exec_cpu_free(tm_exec *e) {
    free(e->cpu_act), free(e->cpu_attn), free(e->rope_cos), free(e->rope_sin);
    e->cpu_act = NULL, e->cpu_attn = e->rope_cos = e->rope_sin = NULL;
}

/* Scratch of at least `bytes` for quantized activations. */
static tm_status cpu_scratch(tm_exec *e, size_t bytes) {
    if (bytes <= e->cpu_act_bytes) return TM_OK;
    void *p = realloc(e->cpu_act, bytes);
    if (!p) return tm_error_set(TM_ERR_NOMEM, "out of memory for %zu bytes of activations", bytes);
    e->cpu_act = p, e->cpu_act_bytes = bytes;
    return TM_OK;
}

/* ---- per-row work ---- */

typedef struct cpu_rows_job {
    float *x, *h;
    const float *a, *w;
    int64_t n;
    float eps;
} cpu_rows_job;

static void cpu_rmsnorm_task(void *ud, int64_t begin, int64_t end, int ith) {
    const cpu_rows_job *j = ud;
    for (int64_t t = begin; t < end; t++) {
        if (j->a) cpu_axpy(j->x + t * j->n, 1.0f, j->a + t * j->n, j->n);
        cpu_rmsnorm(j->h + t * j->n, j->x + t * j->n, j->w, j->n, j->eps);
    }
    (void)ith;
}

static void cpu_rows_run(tm_exec *e, int64_t rows, tm_pool_range_fn fn, void *job) {
    if (rows == 1)
        fn(job, 0, 1, 0);
    else
        cpu_pool_for(e->p.pool, rows, 1, fn, job);
}

static tm_status cpu_rmsnorm_op(tm_exec *e, float *y, const float *x, const float *w, int64_t rows,
                                int64_t n, float eps) {
    cpu_rows_job j = {(float *)x, y, NULL, w, n, eps};
    cpu_rows_run(e, rows, cpu_rmsnorm_task, &j);
    return TM_OK;
}

static tm_status cpu_add_rmsnorm_op(tm_exec *e, float *x, const float *a, float *h, const float *w,
                                    int64_t rows, int64_t n, float eps) {
    cpu_rows_job j = {x, h, a, w, n, eps};
    cpu_rows_run(e, rows, cpu_rmsnorm_task, &j);
    return TM_OK;
}

/* ---- products ---- */

static tm_status cpu_matmul_op(tm_exec *e, const exec_matrix *m, const float *x, int64_t rows,
                               float *y) {
    if (e->p.precise)
        return cpu_matmul_precise(e->p.pool, m->type, m->k, m->rows, m->data, m->row_bytes, x, rows,
                                  y);
    tm_status st = cpu_scratch(e, (size_t)rows * cpu_act_row_size(m->type, m->k));
    if (st == TM_OK)
        cpu_matmul(e->p.pool, m->type, m->k, m->rows, m->data, m->row_bytes, x, rows, y,
                   e->cpu_act);
    return st;
}

/* One pool job for products of one input (the executor takes the precise
 * mode's products one by one). */
static tm_status cpu_matmul_n_op(tm_exec *e, int n, const exec_matrix *ms, const float *x,
                                 int64_t rows, float *const *ys) {
    tm_matmul_desc d[CPU_MATMUL_MAX];
    for (int i = 0; i < n; i++)
        d[i] = (tm_matmul_desc){ms[i].type, ms[i].rows, ms[i].data, ms[i].row_bytes, ys[i]};
    tm_status st = cpu_scratch(e, cpu_matmul_multi_scratch_bytes(n, d, ms[0].k, rows));
    if (st == TM_OK) cpu_matmul_multi(e->p.pool, n, d, ms[0].k, x, rows, e->cpu_act);
    return st;
}

/* ---- attention ---- */

typedef struct cpu_qk_job {
    tm_exec *e;
    const exec_attn *a;
    float *q, *k;
    const float *v;
} cpu_qk_job;

/* Latent attention, per token: the key's latent normed, the RoPE parts of the
 * query heads and the key turned (the last n_rot values of each), the key row
 * into the cache. */
static void cpu_qk_latent_task(void *ud, int64_t begin, int64_t end, int ith) {
    const cpu_qk_job *j = ud;
    const tm_attn_desc *d = j->a->d;
    const tm_exec *e = j->e;
    const int64_t D = d->head_dim, L = d->v_dim, R = d->n_rot;
    void (*rope)(float *, int64_t, const float *, const float *) =
        d->rope_interleaved ? cpu_rope_interleaved_table : cpu_rope_neox_table;
    const size_t kv_row = (size_t)D * (e->p.kv_type == TM_TYPE_F16 ? 2 : 4);
    for (int64_t t = begin; t < end; t++) {
        const float *cs = e->rope_cos + t * (D / 2), *sn = e->rope_sin + t * (D / 2);
        for (int64_t h = 0; h < d->n_head; h++) rope(j->q + (t * d->n_head + h) * D + L, R, cs, sn);
        float *krow = j->k + t * D;
        if (j->a->k_norm) cpu_rmsnorm(krow, krow, j->a->k_norm, L, d->rms_eps);
        rope(krow + L, R, cs, sn);
        const int64_t p = e->row_pos[t], seq_rows = j->a->seq_rows;
        const int64_t row = e->row_seq[t] * seq_rows + (j->a->ring ? p % seq_rows : p);
        cpu_store_kv((uint8_t *)j->a->k_cache + (size_t)row * kv_row, krow, e->p.kv_type, D);
    }
    (void)ith;
}

/* V row of token t into the cache row `row`: v's, or (v_is_k) k's before its norm and
 * RoPE; per head rmsnorm'ed without a gain when v_norm. */
static void cpu_store_v(const cpu_qk_job *j, int64_t t, int64_t row) {
    const tm_attn_desc *d = j->a->d;
    const tm_exec *e = j->e;
    const int64_t D = d->head_dim, KV = d->n_head_kv * D;
    const size_t elt = e->p.kv_type == TM_TYPE_F16 ? 2 : 4;
    const float *v = d->v_is_k ? j->k + t * KV : j->v + t * KV;
    uint8_t *dst = (uint8_t *)j->a->v_cache + (size_t)(row * KV) * elt;
    if (!d->v_norm) {
        cpu_store_kv(dst, v, e->p.kv_type, KV);
        return;
    }
    float vn[EXEC_MAX_HEAD_DIM]; /* exec_attention checked D */
    for (int64_t h = 0; h < d->n_head_kv; h++) {
        cpu_rmsnorm(vn, v + h * D, NULL, D, d->rms_eps);
        cpu_store_kv(dst + (size_t)(h * D) * elt, vn, e->p.kv_type, D);
    }
}

/* Per token: QK-norm and RoPE of its heads, K and V rows into the cache. */
static void cpu_qk_task(void *ud, int64_t begin, int64_t end, int ith) {
    const cpu_qk_job *j = ud;
    const tm_attn_desc *d = j->a->d;
    const tm_exec *e = j->e;
    const int64_t D = d->head_dim, Q = d->n_head * D, KV = d->n_head_kv * D;
    const int64_t R = d->n_rot ? d->n_rot : D; /* the rotated values of a head */
    void (*rope)(float *, int64_t, const float *, const float *) =
        d->rope_interleaved ? cpu_rope_interleaved_table : cpu_rope_neox_table;
    const size_t kv_row = (size_t)KV * (e->p.kv_type == TM_TYPE_F16 ? 2 : 4);
    for (int64_t t = begin; t < end; t++) {
        const int64_t p = e->row_pos[t], seq_rows = j->a->seq_rows; /* its sequence's rows */
        const int64_t row = e->row_seq[t] * seq_rows + (j->a->ring ? p % seq_rows : p);
        cpu_store_v(j, t, row); /* first: v_is_k's value is k before its norm and RoPE */
        const float *cs = e->rope_cos + t * (D / 2), *sn = e->rope_sin + t * (D / 2);
        for (int64_t h = 0; h < d->n_head; h++) {
            float *q = j->q + t * Q + h * D;
            if (j->a->q_norm) cpu_rmsnorm(q, q, j->a->q_norm, D, d->rms_eps);
            rope(q, R, cs, sn);
        }
        float *krow = j->k + t * KV; /* consumed: normed and rotated in place */
        for (int64_t h = 0; h < d->n_head_kv; h++) {
            float *k = krow + h * D;
            if (j->a->k_norm) cpu_rmsnorm(k, k, j->a->k_norm, D, d->rms_eps);
            rope(k, R, cs, sn);
        }
        cpu_store_kv((uint8_t *)j->a->k_cache + (size_t)row * kv_row, krow, e->p.kv_type, KV);
    }
    (void)ith;
}

static tm_status cpu_attention_op(tm_exec *e, const exec_attn *a, float *q, float *k,
                                  const float *v, float *out, int64_t rows) {
    const tm_attn_desc *d = a->d;
    const int64_t D = d->head_dim;
    if (!e->cpu_attn)
        return tm_error_set(TM_ERR_ARG, "CPU attention without scratch (exec_finalize not run?)");
    /* RoPE angles of the step's positions, shared by every layer and head of the same RoPE */
    const tm_attn_desc *ro = &e->rope_of;
    if (e->rope_seq != e->seq || ro->rope_base != d->rope_base || ro->head_dim != D ||
        ro->n_rot != d->n_rot || ro->rope_freq != d->rope_freq ||
        ro->rope_mscale != d->rope_mscale || ro->latent != d->latent) {
        for (int64_t t = 0; t < rows; t++)
            if (d->rope_freq) /* a scaled RoPE: the whole head, or a latent's RoPE part */
                cpu_rope_table_freq(e->rope_cos + t * (D / 2), e->rope_sin + t * (D / 2),
                                    d->latent ? d->n_rot : D, e->row_pos[t], d->rope_freq,
                                    d->rope_mscale ? d->rope_mscale : 1.0f);
            else
                cpu_rope_table(e->rope_cos + t * (D / 2), e->rope_sin + t * (D / 2),
                               d->n_rot ? d->n_rot : D, e->row_pos[t], d->rope_base);
        e->rope_seq = e->seq;
        e->rope_of = *d;
    }
    cpu_qk_job j = {e, a, q, k, v};
    cpu_rows_run(e, rows, d->latent ? cpu_qk_latent_task : cpu_qk_task, &j);
    /* each run of one sequence's consecutive rows over that sequence's cache rows
     * (a decode step of several sequences: one run a row, as each would alone) */
    const int64_t Q = d->n_head * D, O = d->n_head * (d->latent ? d->v_dim : D);
    const size_t kv_row = (size_t)(d->n_head_kv * D) * (e->p.kv_type == TM_TYPE_F16 ? 2 : 4);
    for (int64_t t0 = 0, t1; t0 < rows; t0 = t1) {
        for (t1 = t0 + 1; t1 < rows && e->row_seq[t1] == e->row_seq[t0] &&
                          e->row_pos[t1] == e->row_pos[t0] + (t1 - t0);
             t1++) {
        }
        const tm_attention_shape as = {.n_tok = t1 - t0,
                                       .pos0 = e->row_pos[t0],
                                       .n_head = d->n_head,
                                       .n_head_kv = d->n_head_kv,
                                       .head_dim = D,
                                       .v_dim = d->latent ? d->v_dim : 0,
                                       .v_in_k = d->latent,
                                       .scale = d->scale,
                                       .kv_type = e->p.kv_type,
                                       .window = d->window,
                                       .sinks = a->sinks,
                                       .ring = a->ring ? a->seq_rows : 0};
        const size_t base = (size_t)(e->row_seq[t0] * a->seq_rows) * kv_row;
        cpu_attention(e->p.pool, &as, q + t0 * Q, (const uint8_t *)a->k_cache + base,
                      d->latent ? NULL : (const uint8_t *)a->v_cache + base, out + t0 * O,
                      e->cpu_attn);
    }
    return TM_OK;
}

static void cpu_bias_task(void *ud, int64_t begin, int64_t end, int ith) {
    const cpu_rows_job *j = ud;
    for (int64_t t = begin; t < end; t++) cpu_axpy(j->x + t * j->n, 1.0f, j->w, j->n);
    (void)ith;
}

static tm_status cpu_add_bias_op(tm_exec *e, float *y, const float *b, int64_t rows, int64_t n) {
    cpu_rows_job j = {y, NULL, NULL, b, n, 0.0f};
    cpu_rows_run(e, rows, cpu_bias_task, &j);
    return TM_OK;
}

/* ---- per-head products (exec_matmul_heads) ---- */

typedef struct cpu_heads_job {
    const tm_weight *w;
    const float *x;
    float *y;
    int64_t xn, yn, n_head, n_tok;
    uint8_t *xq; /* [n_tok][n_head] quantized rows of `in` values */
    size_t xq_row;
} cpu_heads_job;

static void cpu_heads_quantize_task(void *ud, int64_t begin, int64_t end, int ith) {
    const cpu_heads_job *j = ud;
    const int64_t in = j->w->ne[0];
    for (int64_t i = begin; i < end; i++) { /* i = t n_head + h */
        const int64_t t = i / j->n_head, h = i % j->n_head;
        cpu_act_quantize(j->w->type, j->x + t * j->xn + h * (j->xn / j->n_head),
                         j->xq + (size_t)i * j->xq_row, in);
    }
    (void)ith;
}

static void cpu_heads_gemm_task(void *ud, int64_t begin, int64_t end, int ith) {
    const cpu_heads_job *j = ud;
    const int64_t in = j->w->ne[0], out = j->w->ne[1];
    for (int64_t h = begin; h < end; h++) /* head h's rows of every token, in place in y */
        cpu_gemm(j->w->type, in, j->w->data + (size_t)(h * out) * j->w->row_bytes, j->w->row_bytes,
                 0, out, j->xq + (size_t)h * j->xq_row, j->xq_row * j->n_head, j->n_tok,
                 j->y + h * (j->yn / j->n_head), j->yn);
    (void)ith;
}

tm_status exec_cpu_matmul_heads(tm_exec *e, const tm_weight *w, const float *x, int64_t xn,
                                float *y, int64_t yn, int64_t n_pass) {
    const int64_t H = w->ne[2], in = w->ne[0], out = w->ne[1], T = e->n_tok, xs = xn / H,
                  ys = yn / H;
    tm_status st = TM_OK;
    if (e->p.precise) { /* head by head in double: the rows gathered, the results scattered */
        float *xg = malloc(sizeof(float) * (size_t)(T * in)),
              *yg = malloc(sizeof(float) * (size_t)(T * out));
        if (!xg || !yg) st = tm_error_set(TM_ERR_NOMEM, "out of memory for per-head products");
        for (int64_t h = 0; h < H && st == TM_OK; h++) {
            for (int64_t t = 0; t < T; t++)
                memcpy(xg + t * in, x + t * xn + h * xs, sizeof(float) * (size_t)in);
            st = cpu_matmul_precise(e->p.pool, w->type, in, out,
                                    w->data + (size_t)(h * out) * w->row_bytes, w->row_bytes, xg, T,
                                    yg);
            for (int64_t t = 0; t < T && st == TM_OK; t++)
                memcpy(y + t * yn + h * ys, yg + t * out, sizeof(float) * (size_t)out);
        }
        free(xg), free(yg);
    } else {
        const size_t xq_row = cpu_act_row_size(w->type, in);
        if ((st = cpu_scratch(e, (size_t)(T * H) * xq_row))) return st;
        cpu_heads_job j = {w, x, y, xn, yn, H, T, e->cpu_act, xq_row};
        const tm_pool_step steps[2] = {{cpu_heads_quantize_task, T * H, 1},
                                       {cpu_heads_gemm_task, H, 1}};
        cpu_pool_for_steps(e->p.pool, 2, steps, &j);
    }
    for (int64_t t = 0; t < T && st == TM_OK && n_pass; t++) /* the carried values */
        for (int64_t h = 0; h < H; h++)
            memcpy(y + t * yn + h * ys + out, x + t * xn + h * xs + in,
                   sizeof(float) * (size_t)n_pass);
    return st;
}

const exec_ops exec_cpu_ops = {
    .rmsnorm = cpu_rmsnorm_op,
    .add_rmsnorm = cpu_add_rmsnorm_op,
    .matmul = cpu_matmul_op,
    .matmul_n = cpu_matmul_n_op,
    .attention = cpu_attention_op,
    .add_bias = cpu_add_bias_op,
};
