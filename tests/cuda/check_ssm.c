/* Linear attention's kernels (src/cuda/ssm.cu) and partial RoPE in
 * cuda_attn_prepare against double-precision references written here from
 * cuda.h's contract (not from the CPU engine).
 *
 * check_ssm: cuda_ssm_conv then cuda_delta_rule on its output, over launches
 * of a state of 4 sequences that starts as random values (what a missed reset
 * would read): a prompt of 150 tokens from position 0 (sequence 1); two runs
 * in one launch (sequence 1 going on at 150 for 20 tokens, sequence 2 from
 * the random state at 7); then 4 decode steps of rows of 3 distinct
 * sequences, one starting at position 0 (reset), one a sequence of n_seq
 * (skipped: its outputs stay NaN, no state changes). The row arrays are
 * rewritten in place between launches (a replayed graph's view). Shapes:
 * K 4 (the compiled width), 3 and 2 (the run-time one); k_dim 16 to 256,
 * v_dim 16 to 128 and one not a multiple of 32; value heads grouped and tiled,
 * b/a separate and grouped (HF's order).
 *
 * Tolerances, first-order worst cases with u = 2^-24 (f32 arithmetic, the
 * CUDA expf within 2 ulp, sqrtf and division correctly rounded):
 *   conv: a float sum of K products is within K u Σ|w x|; silu's slope is
 *     at most 1.1 and its evaluation (expf, add, divide) adds 6 u |y|:
 *       tol = 1.1 K u Σ|w x| + 6 u |y|.  The state holds inputs: bit for bit.
 *   delta rule, per value head and column j of S (S_j its k_dim values):
 *     q and k: their sums of squares within k_dim u, the scale (sqrtf, 1/x,
 *       product; q's 1/sqrt(k_dim) too) within (k_dim/2 + 3) u (k) and
 *       (k_dim/2 + 6) u (q), so |δk| <= (k_dim/2 + 3) u (|k| = 1);
 *     the decay e^g: a + dt_bias (u |x|), softplus (slope <= 1, expf, log1pf:
 *       u |x| + 2 u + 2 u sp), times A (u |g|), expf (4 u): relative
 *       ε_g = u (|A| (|x| + 2 + 2 sp) + |g| + 4);
 *     one step S' = e^g S, δ = β (v - k·S'), S_new = S' + k δ adds, in the
 *       2-norm of the column (β within 6 u, δ's rounding 2 u, k·S' a float
 *       dot within k_dim u |S'|, δk moving S_new by |δk| (|δ| + |S'|), the
 *       update's rounding u |S_new| + u |δ|):
 *         loc = (ε_g + (1.5 k_dim + 4) u) |S| + (k_dim/2 + 12) u |δ| + u |S_new|;
 *     an earlier error passes through the exact step, (I - β k kᵀ) e^g with
 *       |k| = 1, β in (0, 1), g <= 0: a contraction, so the column's error
 *       is within E_t = E_{t-1} + loc_t (E = 0 at a reset or a state the
 *       kernel read as stored); every element of the stored state within E;
 *     o_j = q·S_j: |q| = 1/sqrt(k_dim) times E, the float dot and δq:
 *       tol = (E + (1.5 k_dim + 6) u |S_new|) / sqrt(k_dim).
 *   The bounds grow linearly with the run (170 tokens: about 4e-3 of |S|
 *   here), the real errors like its square root; a wrong head, gate, decay or
 *   a state not reset moves outputs by a good part of their size.
 *   Launches of more than TM_CUDA_DELTA_SERIAL_TOK rows (the prompt and the
 *   two runs here) take the chunked form: the same recurrence as sums in
 *   another order plus a unit lower triangular solve of up to 32 rows whose
 *   entries are below 1 (β (k_i·k_j) e^{γ_i-γ_j}); its error is bounded as the
 *   CPU's chunked form's is (tests/test_cpu_ssm.c): 2e-5 of the launch's
 *   largest |output| (and of the largest |S| for the state), added.
 * check_ssm_gates: the gated RMSNorm (the float sum of n squares within n u,
 *   the scale within (n/2 + 4) u, three products and silu 9 u:
 *   (n/2 + 13) u |y|), SwiGLU and the sigmoid gate (silu or sigmoid 6 u, the
 *   product u: 7 u |y|), the gated add (7 u |y'| + u |x'|), unzip bit for bit.
 * check_attn_partial_rope: as check_attention's prepare bound: QK-norm over
 *   the whole head then the rotation of the first n_rot values,
 *   (d + 8) u (|a| + |b|) for a rotated pair, (d + 8) u |y| for a value
 *   passed through; V rows exact. n_rot = head_dim must give the bits of
 *   n_rot = 0 (the default path), and bad n_rot are refused. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ssm_case {
    int32_t n_k, n_v, dk, dv, K;
    bool tiled, grouped; /* value heads tiled; b and a in one grouped array */
} ssm_case;

static const ssm_case k_ssm_cases[] = {
    {2, 4, 16, 16, 4, false, true},   {2, 4, 16, 16, 4, true, false},
    {1, 2, 128, 128, 4, false, true}, {1, 2, 128, 128, 4, true, false},
    {2, 4, 16, 128, 3, false, false}, {1, 2, 128, 16, 4, true, true},
    {1, 2, 32, 40, 2, false, true},   {2, 2, 64, 64, 4, false, false},
    {1, 2, 256, 32, 4, true, true},
};

#define SSM_NSEQ 4
#define SSM_MAXT 170 /* rows of the largest launch */

typedef struct ssm_rows {
    int n;
    int32_t pos[SSM_MAXT], seq[SSM_MAXT];
} ssm_rows;

/* The case's launches (see the top comment). */
static int ssm_launches(ssm_rows *L) {
    int n = 0;
    L[n].n = 150;
    for (int t = 0; t < 150; t++) L[n].seq[t] = 1, L[n].pos[t] = t;
    n++;
    L[n].n = 25;
    for (int t = 0; t < 20; t++) L[n].seq[t] = 1, L[n].pos[t] = 150 + t;
    for (int t = 20; t < 25; t++) L[n].seq[t] = 2, L[n].pos[t] = 7 + t - 20;
    n++;
    for (int s = 0; s < 4; s++, n++) {
        ssm_rows *r = &L[n];
        r->n = 3;
        r->seq[0] = s == 3 ? 3 : 2, r->pos[0] = s == 3 ? 0 : 12 + s;
        r->seq[1] = 1, r->pos[1] = 170 + s;
        r->seq[2] = 0, r->pos[2] = s;
        if (s == 1) r->seq[3] = SSM_NSEQ, r->pos[3] = 5, r->n = 4; /* skipped */
    }
    return n;
}

/* The reference's run from row t0 (rows of a sequence at consecutive positions). */
static int ref_run_end(const ssm_rows *r, int t0) {
    int t = t0 + 1;
    while (t < r->n && r->seq[t] == r->seq[t0] && r->pos[t] == r->pos[t - 1] + 1) t++;
    return t;
}

typedef struct ssm_ref {
    const ssm_case *c;
    int64_t C, hs; /* channels; one head's state */
    float *conv;   /* [n_seq][K-1][C]: inputs, exact */
    double *S, *E; /* [n_seq][n_v][dk][dv]; error bounds [n_seq][n_v][dv] */
    float *w, *A, *dt;
    double worst_conv, worst_out, worst_state;
} ssm_ref;

static double ref_silu(double x) {
    return x / (1 + exp(-x));
}

/* The conv of launch r on x (in place, float results of the reference kept in
 * y; tol per value). */
static void ref_conv(ssm_ref *R, const ssm_rows *r, const float *x, double *y, double *tol) {
    const int64_t C = R->C, K = R->c->K;
    for (int t0 = 0; t0 < r->n;) {
        const int t1 = ref_run_end(r, t0), seq = r->seq[t0];
        if (seq >= SSM_NSEQ) {
            for (int t = t0; t < t1; t++)
                for (int64_t c = 0; c < C; c++) y[t * C + c] = x[t * C + c], tol[t * C + c] = 0;
            t0 = t1;
            continue;
        }
        float *st = R->conv + seq * (K - 1) * C;
        if (r->pos[t0] == 0) memset(st, 0, (size_t)((K - 1) * C) * sizeof(float));
        for (int64_t c = 0; c < C; c++) {
            float win[16];
            for (int64_t i = 0; i < K - 1; i++) win[i] = st[i * C + c];
            for (int t = t0; t < t1; t++) {
                win[K - 1] = x[t * C + c];
                double s = 0, sa = 0;
                for (int64_t i = 0; i < K; i++) {
                    s += (double)R->w[c * K + i] * win[i];
                    sa += fabs((double)R->w[c * K + i] * win[i]);
                }
                y[t * C + c] = ref_silu(s);
                tol[t * C + c] = 1.1 * K * U32 * sa + 6 * U32 * fabs(y[t * C + c]) + 1e-30;
                memmove(win, win + 1, (size_t)(K - 1) * sizeof(float));
            }
            for (int64_t i = 0; i < K - 1; i++) st[i * C + c] = win[i];
        }
        t0 = t1;
    }
}

static double norm2(const double *x, int64_t n, int64_t stride) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i * stride] * x[i * stride];
    return sqrt(s);
}

/* The delta rule of launch r on qkv (the device's conv output): outputs and
 * their tolerances [n][n_v dv]; R->S and R->E advance. b, a: [n][n_v]. */
static void ref_delta(ssm_ref *R, const ssm_rows *r, const float *qkv, const float *b,
                      const float *a, double *o, double *tol) {
    const ssm_case *c = R->c;
    const int64_t dk = c->dk, dv = c->dv, Hk = c->n_k, Hv = c->n_v, C = R->C, per = Hv / Hk;
    double q[256], k[256], Sb[256];
    for (int t0 = 0; t0 < r->n;) {
        const int t1 = ref_run_end(r, t0), seq = r->seq[t0];
        if (seq >= SSM_NSEQ) {
            t0 = t1;
            continue;
        }
        for (int64_t h = 0; h < Hv; h++) {
            double *S = R->S + (seq * Hv + h) * R->hs, *E = R->E + (seq * Hv + h) * dv;
            if (r->pos[t0] == 0) memset(S, 0, (size_t)R->hs * sizeof(double));
            const int64_t kh = c->tiled ? h % Hk : h / per;
            for (int t = t0; t < t1; t++) {
                const float *qi = qkv + t * C + kh * dk, *ki = qkv + t * C + (Hk + kh) * dk;
                double sq = 0, sk = 0;
                for (int64_t i = 0; i < dk; i++)
                    sq += (double)qi[i] * qi[i], sk += ki[i] * (double)ki[i];
                for (int64_t i = 0; i < dk; i++)
                    q[i] = qi[i] / sqrt(sq + 1e-6) / sqrt((double)dk),
                    k[i] = ki[i] / sqrt(sk + 1e-6);
                const double beta = 1 / (1 + exp(-(double)b[t * Hv + h]));
                const double x = (double)a[t * Hv + h] + R->dt[h];
                const double sp = x > 20 ? x : log1p(exp(x)), g = R->A[h] * sp;
                const double decay = exp(g);
                const double eg = U32 * (fabs(R->A[h]) * (fabs(x) + 2 + 2 * sp) + fabs(g) + 4);
                for (int64_t j = 0; j < dv; j++) {
                    for (int64_t i = 0; i < dk; i++) Sb[i] = S[i * dv + j];
                    const double sn0 = norm2(Sb, dk, 1);
                    double kv = 0;
                    for (int64_t i = 0; i < dk; i++) kv += k[i] * (S[i * dv + j] *= decay);
                    const double d = beta * ((double)qkv[t * C + 2 * Hk * dk + h * dv + j] - kv);
                    double out = 0;
                    for (int64_t i = 0; i < dk; i++) out += q[i] * (S[i * dv + j] += k[i] * d);
                    const double sn = norm2(S + j, dk, dv);
                    E[j] += (eg + (1.5 * dk + 4) * U32) * sn0 + (dk / 2.0 + 12) * U32 * fabs(d) +
                            U32 * sn;
                    o[(t * Hv + h) * dv + j] = out;
                    tol[(t * Hv + h) * dv + j] =
                        (E[j] + (1.5 * dk + 6) * U32 * sn) / sqrt((double)dk) + 1e-30;
                }
            }
        }
        t0 = t1;
    }
}

static bool is_poison(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u == 0xffffffffu;
}

static void ssm_case_run(tm_rng *rng, const ssm_case *c) {
    cuda_pool_reset(g_pool);
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    const int64_t Hv = c->n_v, dv = c->dv, K = c->K;
    const int64_t C = 2 * (int64_t)c->n_k * c->dk + Hv * dv, hs = (int64_t)c->dk * dv;
    const int64_t n_conv = SSM_NSEQ * (K - 1) * C, n_state = SSM_NSEQ * Hv * hs;
    ssm_ref R = {.c = c, .C = C, .hs = hs};
    R.conv = xmalloc((size_t)n_conv * 4), R.S = xmalloc((size_t)n_state * 8);
    R.E = xmalloc((size_t)(SSM_NSEQ * Hv * dv) * 8);
    R.w = xmalloc((size_t)(C * K) * 4), R.A = xmalloc((size_t)Hv * 4);
    R.dt = xmalloc((size_t)Hv * 4);
    float *state = xmalloc((size_t)n_state * 4), *got_state = xmalloc((size_t)n_state * 4);
    float *got_conv = xmalloc((size_t)n_conv * 4);
    fill_normal(rng, R.conv, n_conv, 1.0f); /* what a missed reset would read */
    fill_normal(rng, state, n_state, 0.5f);
    for (int64_t i = 0; i < n_state; i++) R.S[i] = state[i];
    fill_normal(rng, R.w, C * K, 0.6f);
    fill_normal(rng, R.dt, Hv, 1.0f);
    for (int64_t h = 0; h < Hv; h++) R.A[h] = -expf(-1.0f + 0.5f * (float)tm_rng_normal(rng));

    float *conv_d = dev_upload(R.conv, (size_t)n_conv * 4);
    float *state_d = dev_upload(state, (size_t)n_state * 4);
    const float *w_d = dev_upload(R.w, (size_t)(C * K) * 4);
    const tm_cuda_delta_params p = {c->n_k,
                                    c->n_v,
                                    c->dk,
                                    c->dv,
                                    c->tiled,
                                    c->grouped,
                                    dev_upload(R.A, (size_t)Hv * 4),
                                    dev_upload(R.dt, (size_t)Hv * 4)};
    float *x_d = dev_alloc((size_t)(SSM_MAXT * C) * 4),
          *out_d = dev_alloc((size_t)(SSM_MAXT * Hv * dv) * 4);
    float *b_d = dev_alloc((size_t)(SSM_MAXT * 2 * Hv) * 4),
          *a_d = dev_alloc((size_t)(SSM_MAXT * Hv) * 4);
    int32_t *pos_d = dev_alloc(SSM_MAXT * 4), *seq_d = dev_alloc(SSM_MAXT * 4);
    float *x = xmalloc((size_t)(SSM_MAXT * C) * 4), *xc = xmalloc((size_t)(SSM_MAXT * C) * 4);
    float *b = xmalloc((size_t)(SSM_MAXT * Hv) * 4), *a = xmalloc((size_t)(SSM_MAXT * Hv) * 4);
    float *ba = xmalloc((size_t)(SSM_MAXT * 2 * Hv) * 4);
    float *out = xmalloc((size_t)(SSM_MAXT * Hv * dv) * 4);
    double *y = xmalloc((size_t)(SSM_MAXT * C) * 8), *tol = xmalloc((size_t)(SSM_MAXT * C) * 8);
    double *o = xmalloc((size_t)(SSM_MAXT * Hv * dv) * 8);
    double *otol = xmalloc((size_t)(SSM_MAXT * Hv * dv) * 8);

    ssm_rows L[8];
    const int n_launch = ssm_launches(L);
    for (int l = 0; l < n_launch; l++) {
        const ssm_rows *r = &L[l];
        const int n = r->n;
        const tm_cuda_ssm_rows rows = {pos_d, seq_d, n, SSM_NSEQ};
        /* the launch starts from the states as stored: exact, so a sequence it
         * does not run must come back bit for bit */
        memset(R.E, 0, (size_t)(SSM_NSEQ * Hv * dv) * 8);
        fill_normal(rng, x, n * C, 1.0f);
        fill_normal(rng, b, n * Hv, 1.5f);
        fill_normal(rng, a, n * Hv, 1.0f);
        const int64_t per = Hv / c->n_k;
        for (int t = 0; t < n; t++) /* HF's order: per key head its value heads' b, then a */
            for (int64_t h = 0; h < Hv; h++) {
                ba[t * 2 * Hv + (h / per) * 2 * per + h % per] = b[t * Hv + h];
                ba[t * 2 * Hv + (h / per) * 2 * per + per + h % per] = a[t * Hv + h];
            }
        CHECK(cuda_copy_to_device(g_dev, x_d, x, (size_t)(n * C) * 4));
        CHECK(cuda_copy_to_device(g_dev, pos_d, r->pos, (size_t)n * 4));
        CHECK(cuda_copy_to_device(g_dev, seq_d, r->seq, (size_t)n * 4));
        if (c->grouped) {
            CHECK(cuda_copy_to_device(g_dev, b_d, ba, (size_t)(n * 2 * Hv) * 4));
        } else {
            CHECK(cuda_copy_to_device(g_dev, b_d, b, (size_t)(n * Hv) * 4));
            CHECK(cuda_copy_to_device(g_dev, a_d, a, (size_t)(n * Hv) * 4));
        }
        CHECK(cuda_fill_bytes(g_dev, out_d, 0xff, (size_t)(n * Hv * dv) * 4));
        CHECK(cuda_ssm_conv(&rows, x_d, C, c->K, w_d, conv_d, s));
        CHECK(cuda_delta_rule(&p, &rows, x_d, b_d, c->grouped ? NULL : a_d, state_d, out_d, s));
        CHECK(cuda_device_sync(g_dev));
        CHECK(cuda_copy_to_host(g_dev, xc, x_d, (size_t)(n * C) * 4));
        CHECK(cuda_copy_to_host(g_dev, out, out_d, (size_t)(n * Hv * dv) * 4));
        CHECK(cuda_copy_to_host(g_dev, got_conv, conv_d, (size_t)n_conv * 4));
        CHECK(cuda_copy_to_host(g_dev, got_state, state_d, (size_t)n_state * 4));

        ref_conv(&R, r, x, y, tol);
        for (int64_t i = 0; i < n * C; i++) {
            const double err = fabs(xc[i] - y[i]);
            if (!(err <= tol[i]))
                fail_msg("ssm_conv K %d C %lld launch %d: x[%lld][%lld] = %.9g, ref %.9g, tol %.3g",
                         c->K, (long long)C, l, (long long)(i / C), (long long)(i % C), xc[i], y[i],
                         tol[i]);
            if (tol[i] > 0) R.worst_conv = fmax(R.worst_conv, err / tol[i]);
        }
        if (memcmp(got_conv, R.conv, (size_t)n_conv * 4))
            for (int64_t i = 0; i < n_conv; i++)
                if (memcmp(&got_conv[i], &R.conv[i], 4))
                    fail_msg("ssm_conv launch %d: state of sequence %lld [%lld][%lld] = %.9g, "
                             "want %.9g",
                             l, (long long)(i / ((K - 1) * C)), (long long)(i / C % (K - 1)),
                             (long long)(i % C), got_conv[i], R.conv[i]);

        ref_delta(&R, r, xc, b, a, o, otol);
        /* the chunked form's term (top comment) */
        double o_max = 0, s_max = 0;
        const bool chunked = n > TM_CUDA_DELTA_SERIAL_TOK;
        for (int64_t e = 0; chunked && e < (int64_t)n * Hv * dv; e++)
            if (r->seq[e / (Hv * dv)] < SSM_NSEQ) o_max = fmax(o_max, fabs(o[e]));
        for (int64_t i = 0; chunked && i < n_state; i++) s_max = fmax(s_max, fabs(R.S[i]));
        for (int64_t e = 0; chunked && e < (int64_t)n * Hv * dv; e++) otol[e] += 2e-5 * o_max;
        for (int t = 0; t < n; t++)
            for (int64_t i = 0; i < Hv * dv; i++) {
                const int64_t e = t * Hv * dv + i;
                if (r->seq[t] >= SSM_NSEQ) {
                    if (!is_poison(out[e]))
                        fail_msg("delta_rule: skipped row %d written: out[%lld] = %.9g", t,
                                 (long long)i, out[e]);
                    continue;
                }
                const double err = fabs(out[e] - o[e]);
                if (!(err <= otol[e]))
                    fail_msg("delta_rule k_dim %d v_dim %d %s%s launch %d: out[%d][%lld] = %.9g, "
                             "ref %.9g, tol %.3g (seq %d pos %d)",
                             c->dk, c->dv, c->tiled ? "tiled" : "grouped",
                             c->grouped ? " ba_grouped" : "", l, t, (long long)i, out[e], o[e],
                             otol[e], r->seq[t], r->pos[t]);
                R.worst_out = fmax(R.worst_out, err / otol[e]);
            }
        for (int64_t i = 0; i < n_state; i++) {
            const int64_t col = i / hs * dv + i % dv; /* (seq, head) and column j */
            const double err = fabs(got_state[i] - R.S[i]),
                         lim = R.E[col] + (R.E[col] > 0 ? 2e-5 * s_max : 0) + 1e-30;
            if (!(err <= lim))
                fail_msg("delta_rule launch %d: state of sequence %lld head %lld [%lld][%lld] = "
                         "%.9g, ref %.9g, tol %.3g",
                         l, (long long)(i / (Hv * hs)), (long long)(i / hs % Hv),
                         (long long)(i % hs / dv), (long long)(i % dv), got_state[i], R.S[i], lim);
            if (R.E[col] > 0) R.worst_state = fmax(R.worst_state, err / lim);
        }
        /* the state the next launch reads is the device's: what the kernel stored */
        for (int64_t i = 0; i < n_state; i++) R.S[i] = got_state[i];
    }
    printf("ssm k_dim %3d v_dim %3d n_k %d n_v %d K %d %s%s: worst err/tol conv %.3f, out %.3f, "
           "state %.3f\n",
           c->dk, c->dv, c->n_k, c->n_v, c->K, c->tiled ? "tiled  " : "grouped",
           c->grouped ? " ba_grouped" : "", R.worst_conv, R.worst_out, R.worst_state);
    free(R.conv), free(R.S), free(R.E), free(R.w), free(R.A), free(R.dt), free(state);
    free(got_state), free(got_conv), free(x), free(xc), free(b), free(a), free(ba), free(out);
    free(y), free(tol), free(o), free(otol);
}

void check_ssm(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng rng;
    tm_rng_seed(&rng, 31);
    for (size_t i = 0; i < sizeof(k_ssm_cases) / sizeof(k_ssm_cases[0]); i++)
        ssm_case_run(&rng, &k_ssm_cases[i]);
    /* the contract's refusals */
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    float *f = dev_alloc(4096);
    int32_t *ip = dev_alloc(64);
    const tm_cuda_ssm_rows rows = {ip, ip, 1, 1};
    const tm_cuda_delta_params p = {1, 2, 48, 16, false, false, f, f};
    if (cuda_delta_rule(&p, &rows, f, f, f, f, f, s) != TM_ERR_ARG) fail_msg("k_dim 48 accepted");
    if (cuda_ssm_conv(&rows, f, 8, 17, f, f, s) != TM_ERR_ARG) fail_msg("conv width 17 accepted");
    tm_error_clear();
}

/* ---- the gates ---- */

static void expect_close(const char *op, int64_t i, float got, double want, double tol) {
    if (!(fabs(got - want) <= tol))
        fail_msg("%s: [%lld] = %.9g, ref %.9g, tol %.3g", op, (long long)i, got, want, tol);
}

static void gated_case(tm_rng *rng, int64_t n_rows, int64_t n_per_row, int64_t n) {
    const int64_t tot = n_rows * n_per_row;
    float *x = xmalloc((size_t)tot * 4), *z = xmalloc((size_t)tot * 4), *w = xmalloc((size_t)n * 4);
    float *got = xmalloc((size_t)tot * 4);
    fill_normal(rng, x, tot, 2.0f), fill_normal(rng, z, tot, 2.0f), fill_normal(rng, w, n, 1.0f);
    float *x_d = dev_upload(x, (size_t)tot * 4);
    CHECK(cuda_rmsnorm_gated(x_d, dev_upload(z, (size_t)tot * 4), dev_upload(w, (size_t)n * 4),
                             n_rows, n_per_row, n, 1e-6f, cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, got, x_d, (size_t)tot * 4));
    for (int64_t g = 0; g < tot / n; g++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[g * n + i] * x[g * n + i];
        const double r = 1 / sqrt(ss / n + 1e-6);
        for (int64_t i = 0; i < n; i++) {
            const int64_t e = g * n + i;
            const double y = x[e] * r * w[i] * ref_silu(z[e]);
            expect_close("rmsnorm_gated", e, got[e], y, (n / 2.0 + 13) * U32 * fabs(y) + 1e-30);
        }
    }
    free(x), free(z), free(w), free(got);
}

void check_ssm_gates(void **state) {
    (void)state;
    NEED_DEVICE();
    cuda_pool_reset(g_pool);
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    tm_rng rng;
    tm_rng_seed(&rng, 32);
    gated_case(&rng, 3, 4 * 128, 128); /* Qwen3-Next: v_dim groups of a row of value heads */
    gated_case(&rng, 5, 48, 16);
    gated_case(&rng, 2, 37, 37); /* a group a row, not a warp multiple */

    enum { N = 1000, T = 5, G = 3, NA = 7, NB = 2, R = 7, NR = 300 };
    float *g = xmalloc(N * 4), *u = xmalloc(N * 4), *got = xmalloc(N * 4);
    fill_normal(&rng, g, N, 3.0f), fill_normal(&rng, u, N, 1.0f);
    float *g_d = dev_upload(g, N * 4), *u_d = dev_upload(u, N * 4);
    CHECK(cuda_swiglu(g_d, g_d, u_d, N, s)); /* y aliases g */
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, got, g_d, N * 4));
    for (int i = 0; i < N; i++) {
        const double y = ref_silu(g[i]) * u[i];
        expect_close("swiglu", i, got[i], y, 7 * U32 * fabs(y) + 1e-30);
    }
    CHECK(cuda_copy_to_device(g_dev, g_d, g, N * 4));
    CHECK(cuda_gate_mul(u_d, g_d, N, s));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, got, u_d, N * 4));
    for (int i = 0; i < N; i++) {
        const double y = u[i] / (1 + exp(-(double)g[i]));
        expect_close("gate_mul", i, got[i], y, 7 * U32 * fabs(y) + 1e-30);
    }

    float *x = xmalloc(R * NR * 4), *y = xmalloc(R * NR * 4), *sg = xmalloc(R * 4);
    float *gx = xmalloc(R * NR * 4), *gy = xmalloc(R * NR * 4);
    fill_normal(&rng, x, R * NR, 1.0f), fill_normal(&rng, y, R * NR, 1.0f);
    fill_normal(&rng, sg, R, 3.0f);
    float *x_d = dev_upload(x, R * NR * 4), *y_d = dev_upload(y, R * NR * 4);
    CHECK(cuda_gate_add(x_d, y_d, dev_upload(sg, R * 4), R, NR, s));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, gx, x_d, R * NR * 4));
    CHECK(cuda_copy_to_host(g_dev, gy, y_d, R * NR * 4));
    for (int i = 0; i < R * NR; i++) {
        const double yy = y[i] / (1 + exp(-(double)sg[i / NR])), xx = x[i] + yy;
        expect_close("gate_add y", i, gy[i], yy, 7 * U32 * fabs(yy) + 1e-30);
        expect_close("gate_add x", i, gx[i], xx, 7 * U32 * fabs(yy) + U32 * fabs(xx) + 1e-30);
    }

    float src[T * G * (NA + NB)], ga[T * G * NA], gb[T * G * NB];
    fill_normal(&rng, src, T * G * (NA + NB), 1.0f);
    float *a_d = dev_alloc(sizeof(ga)), *b_d = dev_alloc(sizeof(gb));
    CHECK(cuda_unzip(dev_upload(src, sizeof(src)), a_d, b_d, T, G, NA, NB, s));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, ga, a_d, sizeof(ga)));
    CHECK(cuda_copy_to_host(g_dev, gb, b_d, sizeof(gb)));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < G; j++)
            for (int i = 0; i < NA + NB; i++) {
                const float want = src[(t * G + j) * (NA + NB) + i];
                const float have =
                    i < NA ? ga[(t * G + j) * NA + i] : gb[(t * G + j) * NB + i - NA];
                if (memcmp(&want, &have, 4))
                    fail_msg("unzip: row %d group %d value %d = %.9g, want %.9g", t, j, i, have,
                             want);
            }
    free(g), free(u), free(got), free(x), free(y), free(sg), free(gx), free(gy);
}

/* ---- partial RoPE in cuda_attn_prepare ---- */

typedef struct prot_case {
    int32_t n_head, n_head_kv, d, n_rot;
    tm_type kv;
    bool rows;  /* row_pos / row_seq, else *pos0 */
    bool inter; /* interleaved pairs (2i, 2i + 1): llama.cpp's normal RoPE, the whole head */
} prot_case;

static const prot_case k_prot_cases[] = {
    {4, 2, 32, 8, TM_TYPE_F32, false, false}, {2, 1, 256, 64, TM_TYPE_F32, true, false},
    {4, 2, 32, 8, TM_TYPE_F16, true, false},  {2, 2, 256, 64, TM_TYPE_F16, false, false},
    {4, 2, 32, 32, TM_TYPE_F32, false, true}, {2, 1, 128, 128, TM_TYPE_F16, true, true},
};

/* One head after prepare: the norm over all d values, the first n_rot rotated (NeoX pairs,
 * or adjacent ones when inter). */
static void ref_partial(const float *x, const float *w, int32_t d, int32_t nr, bool inter,
                        double base, double eps, int64_t pos, double *y, double *tol) {
    double ss = 0;
    for (int32_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    const double sc = 1 / sqrt(ss / d + eps);
    for (int32_t i = 0; i < d; i++) y[i] = x[i] * sc * w[i];
    for (int32_t i = nr; i < d; i++) tol[i] = (d + 8) * U32 * fabs(y[i]) + 1e-30;
    for (int32_t i = 0; i < nr / 2; i++) {
        const int32_t i0 = inter ? 2 * i : i, i1 = inter ? 2 * i + 1 : i + nr / 2;
        const double a = y[i0], b = y[i1], th = (double)pos * pow(base, -2.0 * i / nr);
        y[i0] = a * cos(th) - b * sin(th), y[i1] = a * sin(th) + b * cos(th);
        tol[i0] = tol[i1] = (d + 8) * U32 * (fabs(a) + fabs(b)) + 1e-30;
    }
}

static void prot_case_run(tm_rng *rng, const prot_case *c) {
    cuda_pool_reset(g_pool);
    enum { NT = 3, NCTX = 64 };
    const int32_t d = c->d, H = c->n_head, Hk = c->n_head_kv;
    const int64_t nq = NT * H * d, kvw = (int64_t)Hk * d, nk = NT * kvw;
    const size_t esz = c->kv == TM_TYPE_F16 ? 2 : 4, cb = (size_t)(2 * NCTX * kvw) * esz;
    const int32_t pos[NT] = {5, 1000, 30000}, seq[NT] = {0, 1, 0}, pos0 = 40;
    tm_cuda_attn_params p = {.n_head = H,
                             .n_head_kv = Hk,
                             .head_dim = d,
                             .n_ctx = 2 * NCTX,
                             .seq_rows = NCTX,
                             .kv_type = c->kv,
                             .scale = 1,
                             .rms_eps = 1e-6f,
                             .rope_base = 1e4f,
                             .n_rot = c->n_rot,
                             .rope_interleaved = c->inter};
    float *q = xmalloc((size_t)nq * 4), *k = xmalloc((size_t)nk * 4), *v = xmalloc((size_t)nk * 4);
    float *qn = xmalloc((size_t)d * 4), *kn = xmalloc((size_t)d * 4), *qo = xmalloc((size_t)nq * 4);
    float *qo2 = xmalloc((size_t)nq * 4);
    uint8_t *kc = xmalloc(cb), *vc = xmalloc(cb);
    double *y = xmalloc((size_t)d * 8), *tol = xmalloc((size_t)d * 8);
    fill_normal(rng, q, nq, 1.5f), fill_normal(rng, k, nk, 1.5f), fill_normal(rng, v, nk, 1.0f);
    fill_normal(rng, qn, d, 1.0f), fill_normal(rng, kn, d, 1.0f);
    float *q_d = dev_upload(q, (size_t)nq * 4);
    const float *k_d = dev_upload(k, (size_t)nk * 4), *v_d = dev_upload(v, (size_t)nk * 4);
    const float *qn_d = dev_upload(qn, (size_t)d * 4), *kn_d = dev_upload(kn, (size_t)d * 4);
    uint8_t *kc_d = dev_alloc(cb), *vc_d = dev_alloc(cb);
    int32_t *pos0_d = dev_upload(&pos0, 4);
    if (c->rows) p.row_pos = dev_upload(pos, sizeof(pos)), p.row_seq = dev_upload(seq, sizeof(seq));
    CHECK(cuda_fill_bytes(g_dev, kc_d, 0xff, cb));
    CHECK(cuda_fill_bytes(g_dev, vc_d, 0xff, cb));
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    CHECK(cuda_attn_prepare(&p, q_d, k_d, v_d, qn_d, kn_d, pos0_d, NT, kc_d, vc_d, s));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, qo, q_d, (size_t)nq * 4));
    CHECK(cuda_copy_to_host(g_dev, kc, kc_d, cb));
    CHECK(cuda_copy_to_host(g_dev, vc, vc_d, cb));
    double worst = 0;
    for (int t = 0; t < NT; t++) {
        const int64_t at = c->rows ? pos[t] : pos0 + t;
        const int64_t row = c->rows ? (int64_t)seq[t] * NCTX + pos[t] : pos0 + t;
        const bool stored = !c->rows || pos[t] < NCTX; /* past its sequence's rows: not stored */
        for (int32_t h = 0; h < H; h++) {
            ref_partial(q + ((int64_t)t * H + h) * d, qn, d, c->n_rot, c->inter, 1e4, 1e-6, at, y,
                        tol);
            for (int32_t i = 0; i < d; i++) {
                const float got = qo[((int64_t)t * H + h) * d + i];
                if (!(fabs(got - y[i]) <= tol[i]))
                    fail_msg("partial rope d %d n_rot %d pos %lld: q[%d][%d][%d] = %.9g, ref %.9g, "
                             "tol %.3g",
                             d, c->n_rot, (long long)at, t, h, i, got, y[i], tol[i]);
                worst = fmax(worst, fabs(got - y[i]) / tol[i]);
            }
        }
        if (!stored) continue;
        for (int32_t h = 0; h < Hk; h++) {
            ref_partial(k + t * kvw + (int64_t)h * d, kn, d, c->n_rot, c->inter, 1e4, 1e-6, at, y,
                        tol);
            for (int32_t i = 0; i < d; i++) {
                const int64_t e = row * kvw + (int64_t)h * d + i;
                float got;
                if (esz == 2) {
                    tm_half hv;
                    memcpy(&hv, kc + e * 2, 2);
                    got = quant_f16_to_f32(hv);
                } else {
                    memcpy(&got, kc + e * 4, 4);
                }
                const double lim =
                    tol[i] + (esz == 2 ? 0x1p-11 * (fabs(y[i]) + tol[i]) + 0x1p-25 : 0);
                if (!(fabs(got - y[i]) <= lim))
                    fail_msg("partial rope d %d n_rot %d: k cache row %lld head %d [%d] = %.9g, "
                             "ref %.9g, tol %.3g",
                             d, c->n_rot, (long long)row, h, i, got, y[i], lim);
            }
        }
        for (int64_t i = 0; i < kvw; i++) {
            const float want = v[t * kvw + i];
            const bool same =
                esz == 2 ? !memcmp(vc + (row * kvw + i) * 2, &(tm_half){quant_f32_to_f16(want)}, 2)
                         : !memcmp(vc + (row * kvw + i) * 4, &want, 4);
            if (!same)
                fail_msg("partial rope: v cache row %lld [%lld] differs", (long long)row,
                         (long long)i);
        }
    }
    /* n_rot = head_dim is the default path: the bits of n_rot = 0 */
    float *q2_d = dev_upload(q, (size_t)nq * 4);
    p.n_rot = d;
    CHECK(cuda_copy_to_device(g_dev, q_d, q, (size_t)nq * 4));
    CHECK(cuda_attn_prepare(&p, q_d, k_d, v_d, qn_d, kn_d, pos0_d, NT, kc_d, vc_d, s));
    p.n_rot = 0;
    CHECK(cuda_attn_prepare(&p, q2_d, k_d, v_d, qn_d, kn_d, pos0_d, NT, kc_d, vc_d, s));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, qo, q_d, (size_t)nq * 4));
    CHECK(cuda_copy_to_host(g_dev, qo2, q2_d, (size_t)nq * 4));
    if (memcmp(qo, qo2, (size_t)nq * 4)) fail_msg("n_rot = head_dim differs from n_rot = 0");
    printf("partial rope d %3d n_rot %2d %s %s%s: worst q err/tol %.3f\n", d, c->n_rot,
           c->kv == TM_TYPE_F16 ? "f16" : "f32", c->rows ? "rows" : "pos0",
           c->inter ? " interleaved" : "", worst);
    /* refused: odd, past the head, with a frequency table */
    const int32_t bad[] = {7, d + 2, -2};
    for (int i = 0; i < 3; i++) {
        p.n_rot = bad[i];
        if (cuda_attn_prepare(&p, q_d, k_d, v_d, qn_d, kn_d, pos0_d, NT, kc_d, vc_d, s) !=
            TM_ERR_ARG)
            fail_msg("n_rot %d of head_dim %d accepted", bad[i], d);
    }
    /* a frequency table, or interleaved pairs, over part of the head */
    p.n_rot = c->inter ? d / 2 : c->n_rot, p.rope_freq = c->inter ? NULL : qn_d;
    if (cuda_attn_prepare(&p, q_d, k_d, v_d, qn_d, kn_d, pos0_d, NT, kc_d, vc_d, s) != TM_ERR_ARG)
        fail_msg("n_rot %d with %s accepted", p.n_rot,
                 c->inter ? "interleaved pairs" : "rope_freq");
    tm_error_clear();
    free(q), free(k), free(v), free(qn), free(kn), free(qo), free(qo2), free(kc), free(vc);
    free(y), free(tol);
}

void check_attn_partial_rope(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng rng;
    tm_rng_seed(&rng, 33);
    for (size_t i = 0; i < sizeof(k_prot_cases) / sizeof(k_prot_cases[0]); i++)
        prot_case_run(&rng, &k_prot_cases[i]);
}

#endif /* TM_HAVE_CUDA */
