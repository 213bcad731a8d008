/* The executor's linear attention (Gated DeltaNet) and the element-wise gates
 * around it: each sequence's conv and delta-rule states and their checkpoints,
 * and the ops on them (exec.h). A layer's states live at its home: the CPU
 * (src/cpu/cpu_ssm.h) or the GPU (src/cuda/ssm.cu, whose kernels read the
 * step's rows from device memory, so a decode step with them is captured as a
 * graph). The element-wise ops run on the GPU when their input is there. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_ssm.h"
#include "cuda/cuda.h"
#include "exec/exec_internal.h"

static size_t ssm_conv_floats(const tm_exec *e) { /* one sequence's */
    return (size_t)(e->ssm_shape.conv_k - 1) * (size_t)e->ssm_channels;
}

static size_t ssm_delta_floats(const tm_exec *e) {
    const tm_ssm_desc *d = &e->ssm_shape;
    return (size_t)(d->n_v_head * d->k_dim * d->v_dim);
}

size_t exec_ssm_seq_bytes(const tm_exec *e) {
    if (!e->ssm_layer) return 0;
    size_t n = 0;
    for (uint32_t l = 0; l < e->n_layer; l++)
        if (e->ssm_layer[l]) n += (ssm_conv_floats(e) + ssm_delta_floats(e)) * sizeof(float);
    return n;
}

tm_status exec_ssm_setup(tm_exec *e, uint32_t n_layer, const bool *ssm, const tm_ssm_desc *shape) {
    if (n_layer != e->n_layer)
        return tm_error_set(TM_ERR_ARG, "exec_ssm_setup: %u layers, attention set up %u", n_layer,
                            e->n_layer);
    if (e->n_gpus > 1) /* its states live at the layer's home: one GPU's so far */
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "linear attention over %d GPUs: not yet (one GPU, or -dev CUDAn)",
                            e->n_gpus);
    const tm_ssm_desc *d = shape;
    if (d->conv_k < 2 || d->conv_k > 16 || d->n_k_head < 1 || d->n_v_head % d->n_k_head ||
        d->k_dim < 1 || d->v_dim < 1)
        return tm_error_set(TM_ERR_ARG,
                            "exec_ssm_setup: conv width %lld (2..16), %lld key heads, %lld value "
                            "heads (a multiple), widths %lld and %lld",
                            (long long)d->conv_k, (long long)d->n_k_head, (long long)d->n_v_head,
                            (long long)d->k_dim, (long long)d->v_dim);
    e->ssm_shape = *shape;
    e->ssm_shape.conv = e->ssm_shape.a = e->ssm_shape.dt_bias = NULL;
    e->ssm_channels = 2 * d->n_k_head * d->k_dim + d->n_v_head * d->v_dim;
    const size_t nl = n_layer ? n_layer : 1, S = (size_t)e->p.n_seq;
    e->ssm_layer = calloc(nl, sizeof(bool));
    e->ssm_dev = calloc(nl, 1);
    e->conv_state = calloc(nl, sizeof(float *)), e->delta_state = calloc(nl, sizeof(float *));
    e->conv_ckpt = calloc(nl, sizeof(float *)), e->delta_ckpt = calloc(nl, sizeof(float *));
    e->ckpt_pos = malloc(S * sizeof(int64_t));
    const int64_t scratch = cpu_delta_scratch_floats(
        &(tm_delta_shape){.k_dim = d->k_dim, .v_dim = d->v_dim}, cpu_pool_size(e->p.pool));
    e->ssm_gates = malloc((size_t)(2 * e->p.n_batch * d->n_v_head) * sizeof(float));
    e->ssm_scratch = malloc((size_t)scratch * sizeof(float));
    if (!e->ssm_layer || !e->ssm_dev || !e->conv_state || !e->delta_state || !e->conv_ckpt ||
        !e->delta_ckpt || !e->ckpt_pos || !e->ssm_gates || !e->ssm_scratch)
        return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
    for (size_t s = 0; s < S; s++) e->ckpt_pos[s] = -1;
    const size_t conv = ssm_conv_floats(e) * S, delta = ssm_delta_floats(e) * S;
    uint32_t n = 0, n_gpu = 0;
    for (uint32_t l = 0; l < n_layer; l++) {
        if (!ssm[l]) continue;
        e->ssm_layer[l] = true, n++;
        const tm_dev side = e->cur->gpu && e->layer_dev[l] == TM_DEV_GPU ? TM_DEV_GPU : TM_DEV_CPU;
        e->ssm_dev[l] = (uint8_t)side;
        float **bufs[4] = {&e->conv_state[l], &e->delta_state[l], &e->conv_ckpt[l],
                           &e->delta_ckpt[l]};
        tm_status st = TM_OK;
        for (int i = 0; i < 4 && st == TM_OK; i++) {
            const size_t bytes = (i % 2 ? delta : conv) * sizeof(float);
            if (side == TM_DEV_GPU) { /* zeroed: a checkpoint copy never reads garbage */
                if ((st = exec_dev_alloc(e, bytes, (void **)bufs[i])) == TM_OK)
                    st = cuda_fill_async(*bufs[i], 0, bytes, e->cur->stream);
            } else if (!(*bufs[i] = calloc(bytes / sizeof(float), sizeof(float)))) {
                st = tm_error_set(TM_ERR_NOMEM,
                                  "out of memory for the linear-attention state of layer %u "
                                  "(%.1f MiB)",
                                  l, 2.0 * (double)(conv + delta) * sizeof(float) / 1048576.0);
            }
        }
        if (st != TM_OK) return st;
        n_gpu += side == TM_DEV_GPU;
    }
    const double mib = (double)exec_ssm_seq_bytes(e) / 1048576.0;
    char seqs[48] = "", where[48];
    if (S > 1) snprintf(seqs, sizeof(seqs), " x %zu sequences", S);
    snprintf(where, sizeof(where), n_gpu == n ? "GPU" : n_gpu ? "%u on the GPU" : "CPU", n_gpu);
    tm_log_info("linear attention state: %u layers, %.2f MiB a sequence%s (f32, %s), as much "
                "again for the prompts' checkpoints",
                n, mib, seqs, where);
    return TM_OK;
}

void exec_ssm_free(tm_exec *e) {
    for (uint32_t l = 0; e->ssm_layer && l < e->n_layer; l++)
        if (e->ssm_dev[l] == TM_DEV_CPU) /* the GPU's are the context's pools' */
            free(e->conv_state[l]), free(e->delta_state[l]), free(e->conv_ckpt[l]),
                free(e->delta_ckpt[l]);
    free(e->ssm_layer), free(e->ssm_dev), free(e->conv_state), free(e->delta_state),
        free(e->conv_ckpt);
    free(e->delta_ckpt), free(e->ckpt_pos), free(e->ssm_gates), free(e->ssm_scratch);
    e->ssm_layer = NULL;
}

/* ---- checkpoints ---- */

/* Copy sequence seq's states to its checkpoint or back: a memcpy, or on the
 * GPU a copy queued on the stream (ordered before the next step's kernels). */
static void ssm_copy(tm_exec *e, int seq, bool to_ckpt) {
    const size_t nc = ssm_conv_floats(e), nd = ssm_delta_floats(e);
    for (uint32_t l = 0; l < e->n_layer; l++) {
        if (!e->ssm_layer[l]) continue;
        float *cs = e->conv_state[l] + (size_t)seq * nc, *ds = e->delta_state[l] + (size_t)seq * nd;
        float *cc = e->conv_ckpt[l] + (size_t)seq * nc, *dc = e->delta_ckpt[l] + (size_t)seq * nd;
        if (e->ssm_dev[l] == TM_DEV_GPU) {
            tm_status st = cuda_copy_async(to_ckpt ? cc : cs, to_ckpt ? cs : cc, nc * sizeof(float),
                                           e->cur->stream);
            if (st == TM_OK)
                st = cuda_copy_async(to_ckpt ? dc : ds, to_ckpt ? ds : dc, nd * sizeof(float),
                                     e->cur->stream);
            if (st != TM_OK) /* the next step's checks see the device's error again */
                tm_log_warn("linear attention: a checkpoint copy failed: %s", tm_error_message());
            continue;
        }
        memcpy(to_ckpt ? cc : cs, to_ckpt ? cs : cc, nc * sizeof(float));
        memcpy(to_ckpt ? dc : ds, to_ckpt ? ds : dc, nd * sizeof(float));
    }
}

void exec_ssm_checkpoint(tm_exec *e, int seq, int64_t pos) {
    if (!e->ssm_layer || seq < 0 || seq >= e->p.n_seq) return;
    ssm_copy(e, seq, true);
    e->ckpt_pos[seq] = pos;
}

int64_t exec_ssm_keep(const tm_exec *e, int seq, int64_t n_past, int64_t n_keep) {
    if (!e->ssm_layer || n_keep >= n_past) return n_keep < n_past ? n_keep : n_past;
    const int64_t c = e->ckpt_pos[seq];
    return c >= 0 && c <= n_keep && c <= n_past ? c : 0;
}

void exec_ssm_rewind(tm_exec *e, int seq, int64_t n_past, int64_t keep) {
    if (!e->ssm_layer || seq < 0 || seq >= e->p.n_seq) return;
    if (keep < e->ckpt_pos[seq]) e->ckpt_pos[seq] = -1; /* it stood for positions now gone */
    if (keep > 0 && keep < n_past && keep == e->ckpt_pos[seq]) ssm_copy(e, seq, false);
}

/* ---- ops ---- */

/* The step's rows as the GPU's recurrent kernels read them. */
static tm_cuda_ssm_rows ssm_rows(const tm_exec *e) {
    return (tm_cuda_ssm_rows){exec_row_pos_dev(e), exec_row_seq_dev(e), e->n_tok,
                              (int32_t)e->p.n_seq};
}

static tm_status ssm_not_on_gpu(const tm_weight *w, uint32_t layer) {
    return tm_error_set(TM_ERR_UNSUPPORTED,
                        "layer %u's linear attention is on the GPU but '%.*s' is not (-ot): "
                        "place the layer's tensors together",
                        layer, (int)w->name_len, w->name);
}

/* Where an element-wise op on x runs: the GPU when x is there (its producer ran
 * there), else the CPU. */
static tm_dev ssm_ew_side(const tm_exec *e, const tm_act *x) {
    return e->cur->gpu && exec_act_on(x, TM_DEV_GPU) ? TM_DEV_GPU : TM_DEV_CPU;
}

/* Bring acts to side d for an op there. */
static tm_status ssm_to(tm_exec *e, tm_dev d, int n, tm_act *const *acts) {
    tm_status st = exec_side(e, d);
    for (int i = 0; i < n && st == TM_OK; i++)
        if (acts[i]) st = exec_act_to(e, acts[i], d, e->n_tok);
    return st;
}

static tm_status ssm_layer_check(const tm_exec *e, uint32_t layer, const tm_ssm_desc *d,
                                 const char *op) {
    if (!e->ssm_layer || layer >= e->n_layer || !e->ssm_layer[layer])
        return tm_error_set(TM_ERR_ARG, "%s: layer %u has no linear-attention state", op, layer);
    const tm_ssm_desc *s = &e->ssm_shape;
    if (d->conv_k != s->conv_k || d->n_k_head != s->n_k_head || d->n_v_head != s->n_v_head ||
        d->k_dim != s->k_dim || d->v_dim != s->v_dim)
        return tm_error_set(TM_ERR_ARG, "%s: layer %u's shape differs from exec_ssm_setup's", op,
                            layer);
    return TM_OK;
}

/* The step's rows [t0, t1) of one sequence at consecutive positions, from *t. */
static bool ssm_run_next(const tm_exec *e, int64_t *t, int64_t *t0, int64_t *t1) {
    if (*t >= e->n_tok) return false;
    *t0 = *t;
    int64_t u = *t0 + 1;
    while (u < e->n_tok && e->row_seq[u] == e->row_seq[*t0] &&
           e->row_pos[u] == e->row_pos[*t0] + (u - *t0))
        u++;
    *t1 = *t = u;
    return true;
}

tm_status exec_ssm_conv(tm_exec *e, uint32_t layer, const tm_ssm_desc *d, tm_act *qkv) {
    tm_status st;
    if ((st = ssm_layer_check(e, layer, d, "exec_ssm_conv"))) return st;
    const int64_t C = e->ssm_channels, K = d->conv_k;
    if (qkv->n != C || d->conv->type != TM_TYPE_F32 || d->conv->ne[0] != K || d->conv->ne[1] != C)
        return tm_error_set(TM_ERR_ARG,
                            "exec_ssm_conv: %lld channels and a %s conv [%lld, %lld], "
                            "expected %lld and f32 [%lld, %lld]",
                            (long long)qkv->n, quant_type_name(d->conv->type),
                            (long long)d->conv->ne[0], (long long)d->conv->ne[1], (long long)C,
                            (long long)K, (long long)C);
    if (e->ssm_dev[layer] == TM_DEV_GPU) {
        const float *w = exec_vector(e, d->conv, TM_DEV_GPU);
        if (!w) return ssm_not_on_gpu(d->conv, layer);
        const tm_cuda_ssm_rows rows = ssm_rows(e);
        if ((st = ssm_to(e, TM_DEV_GPU, 1, (tm_act *[]){qkv})) ||
            (st = cuda_ssm_conv(&rows, qkv->dev, C, (int32_t)K, w, e->conv_state[layer],
                                e->cur->stream)))
            return st;
        exec_act_wrote(qkv, TM_DEV_GPU);
        return TM_OK;
    }
    if ((st = ssm_to(e, TM_DEV_CPU, 1, (tm_act *[]){qkv}))) return st;
    const size_t nc = ssm_conv_floats(e);
    float *x = qkv->host;
    for (int64_t t = 0, t0, t1; ssm_run_next(e, &t, &t0, &t1);) {
        float *state = e->conv_state[layer] + (size_t)e->row_seq[t0] * nc;
        if (e->row_pos[t0] == 0) memset(state, 0, nc * sizeof(float)); /* a new sequence */
        cpu_ssm_conv(e->p.pool, x + t0 * C, t1 - t0, C, K, (const float *)d->conv->data, state);
    }
    exec_act_wrote(qkv, TM_DEV_CPU);
    return TM_OK;
}

static inline float ssm_softplus(float x) { /* torch's, threshold 20 */
    return x > 20.0f ? x : log1pf(expf(x));
}

tm_status exec_delta_rule(tm_exec *e, uint32_t layer, const tm_ssm_desc *d, tm_act *qkv, tm_act *b,
                          tm_act *a, bool ba_grouped, tm_act *out) {
    tm_status st;
    if ((st = ssm_layer_check(e, layer, d, "exec_delta_rule"))) return st;
    const int64_t C = e->ssm_channels, Hk = d->n_k_head, Hv = d->n_v_head, dk = d->k_dim,
                  dv = d->v_dim, r = Hv / Hk;
    const int64_t nba = ba_grouped ? 2 * Hv : Hv;
    if (qkv->n != C || out->n != Hv * dv || b->n != nba || a->n != nba || (ba_grouped && a != b))
        return tm_error_set(TM_ERR_ARG,
                            "exec_delta_rule: acts of %lld, %lld, %lld and %lld "
                            "values, expected %lld, %lld and %lld",
                            (long long)qkv->n, (long long)b->n, (long long)a->n, (long long)out->n,
                            (long long)C, (long long)nba, (long long)(Hv * dv));
    const tm_weight *const vw[2] = {d->a, d->dt_bias};
    for (int i = 0; i < 2; i++)
        if (vw[i]->type != TM_TYPE_F32 || vw[i]->ne[0] != Hv)
            return tm_error_set(TM_ERR_ARG,
                                "exec_delta_rule: '%.*s' is %s of %lld, expected f32 "
                                "of %lld",
                                (int)vw[i]->name_len, vw[i]->name, quant_type_name(vw[i]->type),
                                (long long)vw[i]->ne[0], (long long)Hv);
    if (e->ssm_dev[layer] == TM_DEV_GPU) {
        const tm_cuda_delta_params p = {.n_k_head = (int32_t)Hk,
                                        .n_v_head = (int32_t)Hv,
                                        .k_dim = (int32_t)dk,
                                        .v_dim = (int32_t)dv,
                                        .v_tiled = d->v_tiled,
                                        .ba_grouped = ba_grouped,
                                        .A = exec_vector(e, d->a, TM_DEV_GPU),
                                        .dt_bias = exec_vector(e, d->dt_bias, TM_DEV_GPU)};
        if (!p.A || !p.dt_bias) return ssm_not_on_gpu(p.A ? d->dt_bias : d->a, layer);
        const tm_cuda_ssm_rows rows = ssm_rows(e);
        if ((st = ssm_to(e, TM_DEV_GPU, 3, (tm_act *[]){qkv, b, a})) ||
            (st = cuda_delta_rule(&p, &rows, qkv->dev, b->dev, ba_grouped ? NULL : a->dev,
                                  e->delta_state[layer], out->dev, e->cur->stream)))
            return st;
        exec_act_wrote(out, TM_DEV_GPU);
        return TM_OK;
    }
    if ((st = ssm_to(e, TM_DEV_CPU, 3, (tm_act *[]){qkv, b, a}))) return st;
    const float *A = (const float *)d->a->data, *dt = (const float *)d->dt_bias->data;
    float *x = qkv->host, *g = e->ssm_gates, *beta = e->ssm_gates + e->p.n_batch * Hv;
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int64_t t = 0; t < e->n_tok; t++) {
        float *row = x + t * C;
        for (int64_t h = 0; h < 2 * Hk; h++) cpu_l2norm(row + h * dk, dk, 1e-6f);
        for (int64_t i = 0; i < Hk * dk; i++) row[i] *= qscale;
        const float *bt = (const float *)b->host + t * nba, *at = (const float *)a->host + t * nba;
        for (int64_t h = 0; h < Hv; h++) {
            /* grouped: key head h / r holds its r value heads' b, then their a */
            const int64_t ib = ba_grouped ? (h / r) * 2 * r + h % r : h,
                          ia = ba_grouped ? ib + r : h;
            beta[t * Hv + h] = 1.0f / (1.0f + expf(-bt[ib]));
            g[t * Hv + h] = A[h] * ssm_softplus(at[ia] + dt[h]);
        }
    }
    const size_t nd = ssm_delta_floats(e);
    for (int64_t t = 0, t0, t1; ssm_run_next(e, &t, &t0, &t1);) {
        float *state = e->delta_state[layer] + (size_t)e->row_seq[t0] * nd;
        if (e->row_pos[t0] == 0) memset(state, 0, nd * sizeof(float));
        const tm_delta_shape s = {.n_tok = t1 - t0,
                                  .n_k_head = Hk,
                                  .n_v_head = Hv,
                                  .k_dim = dk,
                                  .v_dim = dv,
                                  .qk_stride = C,
                                  .k_off = Hk * dk,
                                  .v_stride = C,
                                  .v_tiled = d->v_tiled};
        cpu_delta_rule(e->p.pool, &s, x + t0 * C, x + t0 * C + 2 * Hk * dk, g + t0 * Hv,
                       beta + t0 * Hv, state, (float *)out->host + t0 * Hv * dv, t1 - t0 > 1,
                       e->ssm_scratch);
    }
    exec_act_wrote(out, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_rmsnorm_gated(tm_exec *e, tm_act *x, tm_act *z, const tm_weight *w, float eps) {
    const int64_t n = w->ne[0];
    if (w->type != TM_TYPE_F32 || n < 1 || x->n % n || z->n != x->n)
        return tm_error_set(TM_ERR_ARG,
                            "exec_rmsnorm_gated: '%.*s' is %s of %lld, acts of %lld "
                            "and %lld values (want f32, a divisor, equal)",
                            (int)w->name_len, w->name, quant_type_name(w->type), (long long)n,
                            (long long)x->n, (long long)z->n);
    tm_status st;
    const float *wd = exec_vector(e, w, TM_DEV_GPU);
    if (exec_weight_home(e, w) == TM_DEV_GPU && wd) {
        if ((st = ssm_to(e, TM_DEV_GPU, 2, (tm_act *[]){x, z})) ||
            (st = cuda_rmsnorm_gated(x->dev, z->dev, wd, e->n_tok, x->n, n, eps, e->cur->stream)))
            return st;
        exec_act_wrote(x, TM_DEV_GPU);
        return TM_OK;
    }
    if ((st = ssm_to(e, TM_DEV_CPU, 2, (tm_act *[]){x, z}))) return st;
    for (int64_t t = 0; t < e->n_tok; t++)
        cpu_rmsnorm_gated((float *)x->host + t * x->n, (const float *)x->host + t * x->n,
                          (const float *)z->host + t * x->n, (const float *)w->data, x->n / n, n,
                          eps);
    exec_act_wrote(x, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_unzip(tm_exec *e, tm_act *src, int64_t n_group, tm_act *a, tm_act *b) {
    if (n_group < 1 || a->n % n_group || b->n % n_group || src->n != a->n + b->n)
        return tm_error_set(TM_ERR_ARG,
                            "exec_unzip: %lld values into %lld and %lld in %lld "
                            "groups",
                            (long long)src->n, (long long)a->n, (long long)b->n,
                            (long long)n_group);
    tm_status st;
    const int64_t na = a->n / n_group, nb = b->n / n_group;
    if (ssm_ew_side(e, src) == TM_DEV_GPU) {
        if ((st = exec_side(e, TM_DEV_GPU)) ||
            (st = cuda_unzip(src->dev, a->dev_own, b->dev_own, e->n_tok, n_group, na, nb,
                             e->cur->stream)))
            return st;
        a->dev = a->dev_own, b->dev = b->dev_own;
        exec_act_wrote(a, TM_DEV_GPU), exec_act_wrote(b, TM_DEV_GPU);
        return TM_OK;
    }
    if ((st = ssm_to(e, TM_DEV_CPU, 1, (tm_act *[]){src}))) return st;
    for (int64_t t = 0; t < e->n_tok; t++)
        for (int64_t g = 0; g < n_group; g++) {
            const float *s = (const float *)src->host + t * src->n + g * (na + nb);
            memcpy((float *)a->host + t * a->n + g * na, s, (size_t)na * sizeof(float));
            memcpy((float *)b->host + t * b->n + g * nb, s + na, (size_t)nb * sizeof(float));
        }
    exec_act_wrote(a, TM_DEV_CPU), exec_act_wrote(b, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_swiglu(tm_exec *e, tm_act *y, tm_act *g, tm_act *u) {
    if (g->n != u->n || y->n != g->n)
        return tm_error_set(TM_ERR_ARG, "exec_swiglu: %lld, %lld and %lld values", (long long)y->n,
                            (long long)g->n, (long long)u->n);
    tm_status st;
    if (ssm_ew_side(e, g) == TM_DEV_GPU) {
        if ((st = ssm_to(e, TM_DEV_GPU, 2, (tm_act *[]){g, u}))) return st;
        float *yd = y == g ? g->dev : y->dev_own; /* y's own buffer unless it is g */
        if ((st = cuda_swiglu(yd, g->dev, u->dev, e->n_tok * y->n, e->cur->stream))) return st;
        y->dev = yd;
        exec_act_wrote(y, TM_DEV_GPU);
        return TM_OK;
    }
    if ((st = ssm_to(e, TM_DEV_CPU, 2, (tm_act *[]){g, u}))) return st;
    for (int64_t t = 0; t < e->n_tok; t++)
        cpu_swiglu((float *)y->host + t * y->n, (const float *)g->host + t * g->n,
                   (const float *)u->host + t * u->n, y->n);
    exec_act_wrote(y, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_gate_mul(tm_exec *e, tm_act *y, tm_act *g) {
    if (y->n != g->n)
        return tm_error_set(TM_ERR_ARG, "exec_gate_mul: %lld and %lld values", (long long)y->n,
                            (long long)g->n);
    tm_status st;
    if (ssm_ew_side(e, y) == TM_DEV_GPU) {
        if ((st = ssm_to(e, TM_DEV_GPU, 2, (tm_act *[]){y, g})) ||
            (st = cuda_gate_mul(y->dev, g->dev, e->n_tok * y->n, e->cur->stream)))
            return st;
        exec_act_wrote(y, TM_DEV_GPU);
        return TM_OK;
    }
    if ((st = ssm_to(e, TM_DEV_CPU, 2, (tm_act *[]){y, g}))) return st;
    float *yv = y->host;
    const float *gv = g->host;
    for (int64_t i = 0; i < e->n_tok * y->n; i++) yv[i] *= 1.0f / (1.0f + expf(-gv[i]));
    exec_act_wrote(y, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_gate_add(tm_exec *e, tm_act *x, tm_act *y, tm_act *s) {
    if (x->n != y->n || s->n != 1)
        return tm_error_set(TM_ERR_ARG, "exec_gate_add: %lld and %lld values, a gate of %lld",
                            (long long)x->n, (long long)y->n, (long long)s->n);
    tm_status st;
    if (ssm_ew_side(e, y) == TM_DEV_GPU) {
        if ((st = ssm_to(e, TM_DEV_GPU, 3, (tm_act *[]){x, y, s})) ||
            (st = cuda_gate_add(x->dev, y->dev, s->dev, e->n_tok, x->n, e->cur->stream)))
            return st;
        exec_act_wrote(x, TM_DEV_GPU), exec_act_wrote(y, TM_DEV_GPU);
        return TM_OK;
    }
    if ((st = ssm_to(e, TM_DEV_CPU, 3, (tm_act *[]){x, y, s}))) return st;
    for (int64_t t = 0; t < e->n_tok; t++) {
        const float gate = 1.0f / (1.0f + expf(-((const float *)s->host)[t]));
        float *yt = (float *)y->host + t * y->n;
        for (int64_t i = 0; i < y->n; i++) yt[i] *= gate;
        cpu_axpy((float *)x->host + t * x->n, 1.0f, yt, x->n);
    }
    exec_act_wrote(x, TM_DEV_CPU), exec_act_wrote(y, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_add(tm_exec *e, tm_act *x, tm_act *y) {
    if (x->n != y->n)
        return tm_error_set(TM_ERR_ARG, "exec_add: %lld and %lld values", (long long)x->n,
                            (long long)y->n);
    tm_status st;
    if (ssm_ew_side(e, y) == TM_DEV_GPU) {
        if ((st = ssm_to(e, TM_DEV_GPU, 2, (tm_act *[]){x, y})) ||
            (st = cuda_add(x->dev, x->dev, y->dev, e->n_tok * x->n, e->cur->stream)))
            return st;
        exec_act_wrote(x, TM_DEV_GPU);
        return TM_OK;
    }
    if ((st = ssm_to(e, TM_DEV_CPU, 2, (tm_act *[]){x, y}))) return st;
    cpu_axpy(x->host, 1.0f, y->host, e->n_tok * x->n);
    exec_act_wrote(x, TM_DEV_CPU);
    return TM_OK;
}
