/* The executor's element-wise ops that have no GPU kernel yet (Gemma 4's scale
 * factors, final logit soft-cap and GELU-gated MLP): they run on the CPU, and an
 * input on the GPU comes to the host first (a step with one cannot be captured as
 * a graph: it runs eagerly). */
#include <math.h>

#include "cpu/cpu_ops.h"
#include "exec/exec_internal.h"

/* Bring acts to the host for an op there. */
static tm_status ew_to_host(tm_exec *e, int n, tm_act *const *acts) {
    tm_status st = TM_OK;
    for (int i = 0; i < n && st == TM_OK; i++) st = exec_act_to(e, acts[i], TM_DEV_CPU, e->n_tok);
    return st;
}

tm_status exec_scale(tm_exec *e, tm_act *x, float s) {
    tm_status st = ew_to_host(e, 1, (tm_act *[]){x});
    if (st) return st;
    float *v = x->host;
    for (int64_t i = 0; i < e->n_tok * x->n; i++) v[i] *= s;
    exec_act_wrote(x, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_softcap(tm_exec *e, tm_act *x, int64_t n_rows, float cap) {
    if (!(cap > 0.0f) || n_rows < 0 || n_rows > x->rows)
        return tm_error_set(TM_ERR_ARG,
                            "exec_softcap: cap %g over %lld rows (want > 0, rows <= %lld)",
                            (double)cap, (long long)n_rows, (long long)x->rows);
    tm_status st = exec_act_to(e, x, TM_DEV_CPU, n_rows);
    if (st) return st;
    float *v = x->host;
    for (int64_t i = 0; i < n_rows * x->n; i++) v[i] = cap * tanhf(v[i] / cap);
    exec_act_wrote(x, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_geglu(tm_exec *e, tm_act *y, tm_act *g, tm_act *u) {
    if (g->n != u->n || y->n != g->n)
        return tm_error_set(TM_ERR_ARG, "exec_geglu: %lld, %lld and %lld values", (long long)y->n,
                            (long long)g->n, (long long)u->n);
    tm_status st = ew_to_host(e, 2, (tm_act *[]){g, u});
    if (st) return st;
    for (int64_t t = 0; t < e->n_tok; t++)
        cpu_geglu((float *)y->host + t * y->n, (const float *)g->host + t * g->n,
                  (const float *)u->host + t * u->n, y->n);
    exec_act_wrote(y, TM_DEV_CPU);
    return TM_OK;
}
