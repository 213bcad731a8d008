/* The linear-attention launchers of the host mock (cuda_mock_ops.c says how a
 * launcher and its closure work): the conv, the gated delta rule, the gated
 * RMSNorm, unzip, SwiGLU and the sigmoid gates of cuda.h's ssm.cu section.
 * Plain loops written here from cuda.h's contract, not the CPU engine's
 * kernels (src/cpu/cpu_ssm.c), so a test comparing the two compares two
 * transcriptions. The recurrences keep their state in double within a run
 * and store it as float; the rows (row_pos / row_seq) are read when the
 * closure runs, as the kernels read them. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_args.h"

#include "cuda_mock.h"

static double sigmoid_d(double x) {
    return 1.0 / (1.0 + exp(-x));
}

static double silu_d(double x) {
    return x * sigmoid_d(x);
}

/* The run starting at row t0 (the kernels' rule): [t0, *t1); false for a
 * row that continues the previous row's run. */
static bool run_at(const tm_cuda_ssm_rows *r, int64_t t0, int64_t *t1) {
    const int32_t *pos = r->row_pos, *seq = r->row_seq;
    if (t0 > 0 && seq[t0] == seq[t0 - 1] && pos[t0] == pos[t0 - 1] + 1) return false;
    int64_t t = t0 + 1;
    while (t < r->n_tok && seq[t] == seq[t0] && pos[t] == pos[t - 1] + 1) t++;
    *t1 = t;
    return true;
}

static bool rows_ok(const tm_cuda_ssm_rows *r, char *err, size_t err_size) {
    NEED_DEVICE(r->row_pos, (size_t)r->n_tok * 4, "row_pos");
    NEED_DEVICE(r->row_seq, (size_t)r->n_tok * 4, "row_seq");
    return true;
}

/* ---- the conv ---- */

typedef struct conv_arg {
    tm_cuda_ssm_rows r;
    float *x;
    int64_t C;
    int32_t K;
    const float *w;
    float *state;
} conv_arg;

static bool conv_run(void *arg, char *err, size_t err_size) {
    const conv_arg *a = arg;
    const int64_t C = a->C, K = a->K, n_tok = a->r.n_tok;
    if (!rows_ok(&a->r, err, err_size)) return false;
    NEED_DEVICE(a->x, (size_t)(n_tok * C) * 4, "x");
    NEED_DEVICE(a->w, (size_t)(C * K) * 4, "w");
    NEED_DEVICE(a->state, (size_t)((int64_t)a->r.n_seq * (K - 1) * C) * 4, "the conv state");
    double *win = malloc((size_t)K * sizeof(double)); /* a channel's last K inputs, oldest first */
    if (!win) return mock_fail(err, err_size, "out of host memory");
    for (int64_t t0 = 0, t1; t0 < n_tok; t0++) {
        if (!run_at(&a->r, t0, &t1)) continue;
        const int32_t seq = a->r.row_seq[t0], p0 = a->r.row_pos[t0];
        if (p0 < 0 || seq < 0 || seq >= a->r.n_seq) continue;
        float *st = a->state + (int64_t)seq * (K - 1) * C;
        for (int64_t c = 0; c < C; c++) {
            for (int64_t i = 0; i < K - 1; i++) win[i] = p0 == 0 ? 0.0 : st[i * C + c];
            for (int64_t t = t0; t < t1; t++) {
                win[K - 1] = a->x[t * C + c];
                double s = 0;
                for (int64_t i = 0; i < K; i++) s += (double)a->w[c * K + i] * win[i];
                a->x[t * C + c] = (float)silu_d(s);
                memmove(win, win + 1, (size_t)(K - 1) * sizeof(double));
            }
            for (int64_t i = 0; i < K - 1; i++) st[i * C + c] = (float)win[i];
        }
    }
    free(win);
    return true;
}

tm_status cuda_ssm_conv(const tm_cuda_ssm_rows *rows, float *x, int64_t C, int32_t K,
                        const float *w, float *state, tm_cuda_stream stream) {
    tm_status st = cuda_ssm_conv_args_check(rows, x, C, K, w, state);
    if (st != TM_OK || rows->n_tok == 0) return st;
    const conv_arg a = {*rows, x, C, K, w, state};
    return mock_launch(stream, "cuda_ssm_conv", conv_run, &a, sizeof(a));
}

/* ---- the delta rule ---- */

typedef struct delta_arg {
    tm_cuda_delta_params p;
    tm_cuda_ssm_rows r;
    const float *qkv, *b, *a;
    float *state, *out;
} delta_arg;

/* x / sqrt(sum x^2 + 1e-6) * scale over n values, in double. */
static void l2norm_d(const float *x, double *y, int64_t n, double scale) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const double r = scale / sqrt(ss + 1e-6);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r;
}

static bool delta_run(void *arg, char *err, size_t err_size) {
    const delta_arg *a = arg;
    const tm_cuda_delta_params *p = &a->p;
    const int64_t Hk = p->n_k_head, Hv = p->n_v_head, dk = p->k_dim, dv = p->v_dim;
    const int64_t C = 2 * Hk * dk + Hv * dv, r = Hv / Hk, n_tok = a->r.n_tok;
    const int64_t nba = p->ba_grouped ? 2 * Hv : Hv, hs = dk * dv; /* one head's state */
    if (!rows_ok(&a->r, err, err_size)) return false;
    NEED_DEVICE(a->qkv, (size_t)(n_tok * C) * 4, "qkv");
    NEED_DEVICE(a->b, (size_t)(n_tok * nba) * 4, "b");
    if (!p->ba_grouped) NEED_DEVICE(a->a, (size_t)(n_tok * nba) * 4, "a");
    NEED_DEVICE(p->A, (size_t)Hv * 4, "A");
    NEED_DEVICE(p->dt_bias, (size_t)Hv * 4, "dt_bias");
    NEED_DEVICE(a->state, (size_t)((int64_t)a->r.n_seq * Hv * hs) * 4, "the delta-rule state");
    NEED_DEVICE(a->out, (size_t)(n_tok * Hv * dv) * 4, "out");
    double *S = malloc((size_t)(hs + 2 * dk + dv) * sizeof(double));
    if (!S) return mock_fail(err, err_size, "out of host memory");
    double *q = S + hs, *k = q + dk, *kv = k + dk;
    for (int64_t t0 = 0, t1; t0 < n_tok; t0++) {
        if (!run_at(&a->r, t0, &t1)) continue;
        const int32_t seq = a->r.row_seq[t0], p0 = a->r.row_pos[t0];
        if (p0 < 0 || seq < 0 || seq >= a->r.n_seq) continue;
        for (int64_t h = 0; h < Hv; h++) {
            const int64_t kh = p->v_tiled ? h % Hk : h / r;
            float *Sf = a->state + ((int64_t)seq * Hv + h) * hs;
            for (int64_t i = 0; i < hs; i++) S[i] = p0 == 0 ? 0.0 : Sf[i];
            const int64_t ib = p->ba_grouped ? (h / r) * 2 * r + h % r : h;
            const int64_t ia = p->ba_grouped ? ib + r : h;
            const float *av = p->ba_grouped ? a->b : a->a;
            for (int64_t t = t0; t < t1; t++) {
                const float *row = a->qkv + t * C;
                l2norm_d(row + kh * dk, q, dk, 1.0 / sqrt((double)dk));
                l2norm_d(row + (Hk + kh) * dk, k, dk, 1.0);
                const float *v = row + 2 * Hk * dk + h * dv;
                const double beta = sigmoid_d(a->b[t * nba + ib]);
                const double x = (double)av[t * nba + ia] + p->dt_bias[h];
                const double decay = exp(p->A[h] * (x > 20 ? x : log1p(exp(x))));
                for (int64_t j = 0; j < dv; j++) kv[j] = 0;
                for (int64_t i = 0; i < dk; i++)
                    for (int64_t j = 0; j < dv; j++) kv[j] += k[i] * (S[i * dv + j] *= decay);
                float *o = a->out + (t * Hv + h) * dv;
                for (int64_t j = 0; j < dv; j++) {
                    const double d = beta * (v[j] - kv[j]);
                    double s = 0;
                    for (int64_t i = 0; i < dk; i++) s += q[i] * (S[i * dv + j] += k[i] * d);
                    o[j] = (float)s;
                }
            }
            for (int64_t i = 0; i < hs; i++) Sf[i] = (float)S[i];
        }
    }
    free(S);
    return true;
}

tm_status cuda_delta_rule(const tm_cuda_delta_params *p, const tm_cuda_ssm_rows *rows,
                          const float *qkv, const float *b, const float *a, float *state,
                          float *out, tm_cuda_stream stream) {
    tm_status st = cuda_delta_rule_args_check(p, rows, qkv, b, a, state, out);
    if (st != TM_OK || rows->n_tok == 0) return st;
    const delta_arg arg = {*p, *rows, qkv, b, a, state, out};
    return mock_launch(stream, "cuda_delta_rule", delta_run, &arg, sizeof(arg));
}

/* ---- the gated RMSNorm and the element-wise ops ---- */

typedef struct ew_arg {
    float *x, *y;
    const float *z, *w;
    int64_t n_rows, n_per_row, n, n_group, na, nb;
    float eps;
} ew_arg;

static bool gated_run(void *arg, char *err, size_t err_size) {
    const ew_arg *a = arg;
    const int64_t total = a->n_rows * a->n_per_row, n = a->n;
    NEED_DEVICE(a->x, (size_t)total * 4, "x");
    NEED_DEVICE(a->z, (size_t)total * 4, "z");
    NEED_DEVICE(a->w, (size_t)n * 4, "w");
    for (int64_t g = 0; g < total / n; g++) {
        float *x = a->x + g * n;
        const float *z = a->z + g * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double r = 1.0 / sqrt(ss / (double)n + a->eps);
        for (int64_t i = 0; i < n; i++) x[i] = (float)(x[i] * r * a->w[i] * silu_d(z[i]));
    }
    return true;
}

tm_status cuda_rmsnorm_gated(float *x, const float *z, const float *w, int64_t n_rows,
                             int64_t n_per_row, int64_t n, float eps, tm_cuda_stream stream) {
    tm_status st = cuda_rmsnorm_gated_args_check(x, z, w, n_rows, n_per_row, n);
    if (st != TM_OK || n_rows == 0) return st;
    const ew_arg a = {
        .x = x, .z = z, .w = w, .n_rows = n_rows, .n_per_row = n_per_row, .n = n, .eps = eps};
    return mock_launch(stream, "cuda_rmsnorm_gated", gated_run, &a, sizeof(a));
}

static bool unzip_run(void *arg, char *err, size_t err_size) {
    const ew_arg *a = arg; /* z: src, x: a, y: b */
    const int64_t na = a->na, nb = a->nb, G = a->n_group, T = a->n_rows;
    NEED_DEVICE(a->z, (size_t)(T * G * (na + nb)) * 4, "src");
    NEED_DEVICE(a->x, (size_t)(T * G * na) * 4, "a");
    NEED_DEVICE(a->y, (size_t)(T * G * nb) * 4, "b");
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < G; g++) {
            const float *s = a->z + (t * G + g) * (na + nb);
            for (int64_t i = 0; i < na; i++) a->x[(t * G + g) * na + i] = s[i];
            for (int64_t i = 0; i < nb; i++) a->y[(t * G + g) * nb + i] = s[na + i];
        }
    return true;
}

tm_status cuda_unzip(const float *src, float *a, float *b, int64_t n_tok, int64_t n_group,
                     int64_t na, int64_t nb, tm_cuda_stream stream) {
    tm_status st = cuda_unzip_args_check(src, a, b, n_tok, n_group, na, nb);
    if (st != TM_OK || n_tok == 0) return st;
    const ew_arg arg = {
        .x = a, .y = b, .z = src, .n_rows = n_tok, .n_group = n_group, .na = na, .nb = nb};
    return mock_launch(stream, "cuda_unzip", unzip_run, &arg, sizeof(arg));
}

static bool swiglu_run(void *arg, char *err, size_t err_size) {
    const ew_arg *a = arg; /* y = silu(z) w */
    NEED_DEVICE(a->y, (size_t)a->n * 4, "y");
    NEED_DEVICE(a->z, (size_t)a->n * 4, "g");
    NEED_DEVICE(a->w, (size_t)a->n * 4, "u");
    for (int64_t i = 0; i < a->n; i++) a->y[i] = (float)(silu_d(a->z[i]) * a->w[i]);
    return true;
}

tm_status cuda_swiglu(float *y, const float *g, const float *u, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_gate_args_check("cuda_swiglu", n);
    if (st != TM_OK || n == 0) return st;
    const ew_arg a = {.y = y, .z = g, .w = u, .n = n};
    return mock_launch(stream, "cuda_swiglu", swiglu_run, &a, sizeof(a));
}

static bool gate_mul_run(void *arg, char *err, size_t err_size) {
    const ew_arg *a = arg; /* y *= sigmoid(z) */
    NEED_DEVICE(a->y, (size_t)a->n * 4, "y");
    NEED_DEVICE(a->z, (size_t)a->n * 4, "g");
    for (int64_t i = 0; i < a->n; i++) a->y[i] = (float)(a->y[i] * sigmoid_d(a->z[i]));
    return true;
}

tm_status cuda_gate_mul(float *y, const float *g, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_gate_args_check("cuda_gate_mul", n);
    if (st != TM_OK || n == 0) return st;
    const ew_arg a = {.y = y, .z = g, .n = n};
    return mock_launch(stream, "cuda_gate_mul", gate_mul_run, &a, sizeof(a));
}

static bool gate_add_run(void *arg, char *err, size_t err_size) {
    const ew_arg *a = arg; /* y[t] *= sigmoid(z[t]); x[t] += y[t] */
    const int64_t n = a->n;
    NEED_DEVICE(a->x, (size_t)(a->n_rows * n) * 4, "x");
    NEED_DEVICE(a->y, (size_t)(a->n_rows * n) * 4, "y");
    NEED_DEVICE(a->z, (size_t)a->n_rows * 4, "s");
    for (int64_t t = 0; t < a->n_rows; t++) {
        const double gate = sigmoid_d(a->z[t]);
        for (int64_t i = 0; i < n; i++) {
            const float v = (float)(a->y[t * n + i] * gate);
            a->y[t * n + i] = v;
            a->x[t * n + i] += v;
        }
    }
    return true;
}

tm_status cuda_gate_add(float *x, float *y, const float *s, int64_t n_rows, int64_t n,
                        tm_cuda_stream stream) {
    tm_status st = cuda_gate_add_args_check(n_rows, n);
    if (st != TM_OK || n_rows == 0) return st;
    const ew_arg a = {.x = x, .y = y, .z = s, .n_rows = n_rows, .n = n};
    return mock_launch(stream, "cuda_gate_add", gate_add_run, &a, sizeof(a));
}
