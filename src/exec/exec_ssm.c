/* The executor's linear attention (Gated DeltaNet) and the element-wise gates
 * around it: each sequence's conv and delta-rule states and their checkpoints,
 * and the ops on them (exec.h). They run on the CPU (src/cpu/cpu_ssm.h): the
 * GPU has no such kernels yet, so a GPU layer's recurrent ops bring their
 * inputs to the host (and such a step is not captured as a graph). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_ssm.h"
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
    e->conv_state = calloc(nl, sizeof(float *)), e->delta_state = calloc(nl, sizeof(float *));
    e->conv_ckpt = calloc(nl, sizeof(float *)), e->delta_ckpt = calloc(nl, sizeof(float *));
    e->ckpt_pos = malloc(S * sizeof(int64_t));
    const int64_t scratch = cpu_delta_scratch_floats(
        &(tm_delta_shape){.k_dim = d->k_dim, .v_dim = d->v_dim}, cpu_pool_size(e->p.pool));
    e->ssm_gates = malloc((size_t)(2 * e->p.n_batch * d->n_v_head) * sizeof(float));
    e->ssm_scratch = malloc((size_t)scratch * sizeof(float));
    if (!e->ssm_layer || !e->conv_state || !e->delta_state || !e->conv_ckpt || !e->delta_ckpt ||
        !e->ckpt_pos || !e->ssm_gates || !e->ssm_scratch)
        return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
    for (size_t s = 0; s < S; s++) e->ckpt_pos[s] = -1;
    const size_t conv = ssm_conv_floats(e) * S, delta = ssm_delta_floats(e) * S;
    uint32_t n = 0;
    for (uint32_t l = 0; l < n_layer; l++) {
        if (!ssm[l]) continue;
        e->ssm_layer[l] = true, n++;
        if (!(e->conv_state[l] = calloc(conv, sizeof(float))) ||
            !(e->delta_state[l] = calloc(delta, sizeof(float))) ||
            !(e->conv_ckpt[l] = calloc(conv, sizeof(float))) ||
            !(e->delta_ckpt[l] = calloc(delta, sizeof(float))))
            return tm_error_set(TM_ERR_NOMEM,
                                "out of memory for the linear-attention state of layer %u "
                                "(%.1f MiB)",
                                l, 2.0 * (double)(conv + delta) * sizeof(float) / 1048576.0);
    }
    const double mib = (double)exec_ssm_seq_bytes(e) / 1048576.0;
    char seqs[48] = "";
    if (S > 1) snprintf(seqs, sizeof(seqs), " x %zu sequences", S);
    tm_log_info("linear attention state: %u layers, %.2f MiB a sequence%s (f32, CPU), as much "
                "again for the prompts' checkpoints",
                n, mib, seqs);
    return TM_OK;
}

void exec_ssm_free(tm_exec *e) {
    for (uint32_t l = 0; e->ssm_layer && l < e->n_layer; l++)
        free(e->conv_state[l]), free(e->delta_state[l]), free(e->conv_ckpt[l]),
            free(e->delta_ckpt[l]);
    free(e->ssm_layer), free(e->conv_state), free(e->delta_state), free(e->conv_ckpt);
    free(e->delta_ckpt), free(e->ckpt_pos), free(e->ssm_gates), free(e->ssm_scratch);
    e->ssm_layer = NULL;
}

/* ---- checkpoints ---- */

static void ssm_copy(tm_exec *e, int seq, bool to_ckpt) {
    const size_t nc = ssm_conv_floats(e), nd = ssm_delta_floats(e);
    for (uint32_t l = 0; l < e->n_layer; l++) {
        if (!e->ssm_layer[l]) continue;
        float *cs = e->conv_state[l] + (size_t)seq * nc, *ds = e->delta_state[l] + (size_t)seq * nd;
        float *cc = e->conv_ckpt[l] + (size_t)seq * nc, *dc = e->delta_ckpt[l] + (size_t)seq * nd;
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

/* Bring acts to the host for a CPU op. */
static tm_status ssm_host(tm_exec *e, int n, tm_act *const *acts) {
    tm_status st = exec_side(e, TM_DEV_CPU);
    for (int i = 0; i < n && st == TM_OK; i++)
        if (acts[i]) st = exec_act_to(e, acts[i], TM_DEV_CPU, e->n_tok);
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
    if ((st = ssm_host(e, 1, (tm_act *[]){qkv}))) return st;
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
    if ((st = ssm_host(e, 3, (tm_act *[]){qkv, b, a}))) return st;
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
    if ((st = ssm_host(e, 2, (tm_act *[]){x, z}))) return st;
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
    if ((st = ssm_host(e, 1, (tm_act *[]){src}))) return st;
    const int64_t na = a->n / n_group, nb = b->n / n_group;
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
    if ((st = ssm_host(e, 2, (tm_act *[]){g, u}))) return st;
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
    if ((st = ssm_host(e, 2, (tm_act *[]){y, g}))) return st;
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
    if ((st = ssm_host(e, 3, (tm_act *[]){x, y, s}))) return st;
    for (int64_t t = 0; t < e->n_tok; t++) {
        const float gate = 1.0f / (1.0f + expf(-((const float *)s->host)[t]));
        float *yt = (float *)y->host + t * y->n;
        for (int64_t i = 0; i < y->n; i++) yt[i] *= gate;
        cpu_axpy((float *)x->host + t * x->n, 1.0f, yt, x->n);
    }
    exec_act_wrote(x, TM_DEV_CPU), exec_act_wrote(y, TM_DEV_CPU);
    return TM_OK;
}
