/* The executor's element-wise ops of Gemma 4 (its scale factors, final logit
 * soft-cap and GELU-gated MLP) and the pick of a step's rows for the output
 * head (a step of several sequences' prompts): each runs where its input is, on the GPU's
 * kernels (src/cuda/ew.cu) when it is there (so a step keeps its activations
 * on the device and can be captured as a graph), else on the CPU. */
#include <math.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "exec/exec_internal.h"

/* The GPU when the context has one and x is there, or when a decode step is being
 * captured (a CPU op would end the capture: the embeddings' scale, on the host's
 * lookup, goes up first); n_rows of x. */
static tm_dev ew_side(const tm_exec *e, const tm_act *x, int64_t n_rows) {
    return e->cur->gpu && (exec_act_on(x, TM_DEV_GPU) || e->capturing) && n_rows <= x->dev_rows
               ? TM_DEV_GPU
               : TM_DEV_CPU;
}

/* Bring acts to side d for an op there. */
static tm_status ew_to(tm_exec *e, tm_dev d, int n, tm_act *const *acts, int64_t n_rows) {
    tm_status st = exec_side(e, d);
    for (int i = 0; i < n && st == TM_OK; i++) st = exec_act_to(e, acts[i], d, n_rows);
    return st;
}

tm_status exec_scale(tm_exec *e, tm_act *x, float s) {
    const tm_dev d = ew_side(e, x, e->n_tok);
    tm_status st = ew_to(e, d, 1, (tm_act *[]){x}, e->n_tok);
    if (st) return st;
    if (d == TM_DEV_GPU) {
        if ((st = cuda_scale(x->dev, s, e->n_tok * x->n, e->cur->stream))) return st;
    } else {
        float *v = x->host;
        for (int64_t i = 0; i < e->n_tok * x->n; i++) v[i] *= s;
    }
    exec_act_wrote(x, d);
    return TM_OK;
}

tm_status exec_softcap(tm_exec *e, tm_act *x, int64_t n_rows, float cap) {
    if (!(cap > 0.0f) || n_rows < 0 || n_rows > x->rows)
        return tm_error_set(TM_ERR_ARG,
                            "exec_softcap: cap %g over %lld rows (want > 0, rows <= %lld)",
                            (double)cap, (long long)n_rows, (long long)x->rows);
    const tm_dev d = ew_side(e, x, n_rows);
    tm_status st = ew_to(e, d, 1, (tm_act *[]){x}, n_rows);
    if (st) return st;
    if (d == TM_DEV_GPU) {
        if ((st = cuda_softcap(x->dev, cap, n_rows * x->n, e->cur->stream))) return st;
    } else {
        float *v = x->host;
        for (int64_t i = 0; i < n_rows * x->n; i++) v[i] = cap * tanhf(v[i] / cap);
    }
    exec_act_wrote(x, d);
    return TM_OK;
}

tm_status exec_rows_pick(tm_exec *e, tm_act *x, const int64_t *rows, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < i || rows[i] >= e->n_tok || (i && rows[i] <= rows[i - 1]))
            return tm_error_set(TM_ERR_ARG,
                                "exec_rows_pick: row %lld is %lld (want increasing, >= %lld, "
                                "< %lld)",
                                (long long)i, (long long)rows[i], (long long)i,
                                (long long)e->n_tok);
    const tm_dev d = ew_side(e, x, e->n_tok);
    tm_status st = ew_to(e, d, 1, (tm_act *[]){x}, e->n_tok);
    const int64_t m = x->n; /* row i's source is past every row before it: in order, in place */
    for (int64_t i = 0; i < n && st == TM_OK; i++) {
        if (rows[i] == i) continue;
        if (d == TM_DEV_GPU)
            st = cuda_copy_rows((float *)x->dev + i * m, m, (const float *)x->dev + rows[i] * m, m,
                                1, m, e->cur->stream);
        else
            memcpy((float *)x->host + i * m, (const float *)x->host + rows[i] * m,
                   (size_t)m * sizeof(float));
    }
    if (st == TM_OK) exec_act_wrote(x, d);
    return st;
}

tm_status exec_geglu(tm_exec *e, tm_act *y, tm_act *g, tm_act *u) {
    if (g->n != u->n || y->n != g->n)
        return tm_error_set(TM_ERR_ARG, "exec_geglu: %lld, %lld and %lld values", (long long)y->n,
                            (long long)g->n, (long long)u->n);
    const tm_dev d = ew_side(e, g, e->n_tok);
    tm_status st = ew_to(e, d, 2, (tm_act *[]){g, u}, e->n_tok);
    if (st) return st;
    if (d == TM_DEV_GPU) {
        float *yd = y == g ? g->dev : y == u ? u->dev : y->dev_own; /* y's own unless an input */
        if ((st = cuda_geglu(yd, g->dev, u->dev, e->n_tok * y->n, e->cur->stream))) return st;
        y->dev = yd;
    } else {
        for (int64_t t = 0; t < e->n_tok; t++)
            cpu_geglu((float *)y->host + t * y->n, (const float *)g->host + t * g->n,
                      (const float *)u->host + t * u->n, y->n);
    }
    exec_act_wrote(y, d);
    return TM_OK;
}
