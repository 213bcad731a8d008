/* Linear attention's CPU kernels (src/cpu/cpu_ssm.h) against a naive
 * double-precision transcription of the equations written here: the causal
 * convolution with its state carried over calls, the delta rule token by
 * token and in chunks of matrix products (one chunk, a partial last chunk,
 * several chunks, grouped and tiled value heads, more value heads than key
 * heads), a prompt split into calls whose state carries over, and the gated
 * RMSNorm; with 1 and 3 threads, at every CPU level the machine has (the
 * delta rule has a function per level; TIERMOE_CPU_LEVEL picks it too).
 *
 * Tolerances: float32 arithmetic. The recurrence sums d_k products a step
 * over up to 200 steps of a contracting state (|e^g| < 1, β ≤ 1, unit keys):
 * a few hundred roundings of values of order 1, so 2e-5 of the largest output
 * (or state) value; the chunked form solves a unit lower triangular system of
 * up to 64 rows whose entries are below 1 in size (β (k_i·k_j) e^{γ_i-γ_j}):
 * the same bound holds (measured ~3e-6). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "cpu/cpu_ssm.h"

static tm_rng rng;

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * tm_rng_normal(&rng);
}

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

static void test_conv(void **state) {
    (void)state;
    tm_pool *pool;
    assert_int_equal(cpu_pool_create(3, &pool), TM_OK);
    enum { T = 23, C = 100, K = 4 };
    float x[T * C], w[C * K], st[(K - 1) * C], y[T * C];
    fill(x, T * C, 1), fill(w, C * K, 0.5f), fill(st, (K - 1) * C, 1);
    double ref[T * C];
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) {
            double acc = 0;
            for (int64_t j = 0; j < K; j++) {
                const int64_t p = t - (K - 1) + j; /* < 0: the state's row K-1+p */
                acc += (double)w[c * K + j] * (p >= 0 ? x[p * C + c] : st[(K - 1 + p) * C + c]);
            }
            ref[t * C + c] = acc / (1 + exp(-acc));
        }
    /* in two calls of 5 and 18 rows: the state carries the first call's inputs */
    memcpy(y, x, sizeof(x));
    cpu_ssm_conv(pool, y, 5, C, K, w, st);
    cpu_ssm_conv(pool, y + 5 * C, T - 5, C, K, w, st);
    for (int64_t i = 0; i < T * C; i++)
        assert_true(fabs(y[i] - ref[i]) <= 1e-5 * (1 + fabs(ref[i])));
    for (int64_t i = 0; i < K - 1; i++) /* the state: the last K-1 inputs */
        for (int64_t c = 0; c < C; c++) assert_true(st[i * C + c] == x[(T - (K - 1) + i) * C + c]);
    cpu_pool_free(pool);
}

/* The recurrence in double for every head; q already scaled, q and k normed. */
static void delta_ref(const tm_delta_shape *s, const float *qk, const float *v, const float *g,
                      const float *beta, double *S, double *out) {
    const int64_t dk = s->k_dim, dv = s->v_dim, r = s->n_v_head / s->n_k_head;
    double kv[256];
    for (int64_t h = 0; h < s->n_v_head; h++) {
        const int64_t kh = s->v_tiled ? h % s->n_k_head : h / r;
        double *Sh = S + h * dk * dv;
        for (int64_t t = 0; t < s->n_tok; t++) {
            const float *q = qk + t * s->qk_stride + kh * dk, *k = q + s->k_off;
            const float *vt = v + t * s->v_stride + h * dv;
            const double e = exp((double)g[t * s->n_v_head + h]), b = beta[t * s->n_v_head + h];
            for (int64_t i = 0; i < dk * dv; i++) Sh[i] *= e;
            for (int64_t j = 0; j < dv; j++) {
                double a = 0;
                for (int64_t i = 0; i < dk; i++) a += Sh[i * dv + j] * k[i];
                kv[j] = b * (vt[j] - a);
            }
            for (int64_t i = 0; i < dk; i++)
                for (int64_t j = 0; j < dv; j++) Sh[i * dv + j] += (double)k[i] * kv[j];
            for (int64_t j = 0; j < dv; j++) {
                double a = 0;
                for (int64_t i = 0; i < dk; i++) a += Sh[i * dv + j] * q[i];
                out[t * s->n_v_head * dv + h * dv + j] = a;
            }
        }
    }
}

static void check_delta(tm_pool *pool, int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv,
                        bool tiled, int64_t split) {
    const int64_t C = 2 * Hk * dk + Hv * dv + 3; /* rows wider than q, k, v: strides */
    float *x = malloc(sizeof(float) * (size_t)(T * C)),
          *g = malloc(sizeof(float) * (size_t)(T * Hv));
    float *beta = malloc(sizeof(float) * (size_t)(T * Hv));
    const size_t ns = (size_t)(Hv * dk * dv);
    float *S0 = malloc(sizeof(float) * ns), *S = malloc(sizeof(float) * ns);
    float *out = malloc(sizeof(float) * (size_t)(T * Hv * dv));
    double *Sr = malloc(sizeof(double) * ns), *ref = malloc(sizeof(double) * (size_t)(T * Hv * dv));
    fill(x, T * C, 1), fill(S0, (int64_t)ns, 0.3f);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < 2 * Hk; h++) { /* unit q and k, q / sqrt(dk) */
            float *p = x + t * C + h * dk;
            double ss = 0;
            for (int64_t i = 0; i < dk; i++) ss += (double)p[i] * p[i];
            for (int64_t i = 0; i < dk; i++)
                p[i] = (float)(p[i] / sqrt(ss) / (h < Hk ? sqrt((double)dk) : 1));
        }
        for (int64_t h = 0; h < Hv; h++) {
            g[t * Hv + h] = -0.01f - 1.2f * tm_rng_f32(&rng); /* e^g in 0.3 .. 0.99 */
            beta[t * Hv + h] = 0.2f + 0.6f * tm_rng_f32(&rng);
        }
    }
    const tm_delta_shape full = {T, Hk, Hv, dk, dv, C, Hk * dk, C, tiled};
    for (size_t i = 0; i < ns; i++) Sr[i] = S0[i];
    delta_ref(&full, x, x + 2 * Hk * dk, g, beta, Sr, ref);
    const double tol_o = 2e-5 * max_abs(ref, T * Hv * dv), tol_s = 2e-5 * max_abs(Sr, (int64_t)ns);
    float *scratch = malloc(sizeof(float) * (size_t)cpu_delta_scratch_floats(&full, 3));
    for (int chunked = 0; chunked < 2; chunked++) {
        memcpy(S, S0, sizeof(float) * ns);
        for (int64_t t0 = 0; t0 < T; t0 += split) { /* calls of `split` tokens */
            tm_delta_shape s = full;
            s.n_tok = T - t0 < split ? T - t0 : split;
            cpu_delta_rule(pool, &s, x + t0 * C, x + t0 * C + 2 * Hk * dk, g + t0 * Hv,
                           beta + t0 * Hv, S, out + t0 * Hv * dv, chunked, scratch);
        }
        double eo = 0, es = 0;
        for (int64_t i = 0; i < T * Hv * dv; i++) eo = fmax(eo, fabs(out[i] - ref[i]));
        for (size_t i = 0; i < ns; i++) es = fmax(es, fabs(S[i] - Sr[i]));
        if (eo > tol_o || es > tol_s)
            fail_msg("delta rule level %s T=%lld Hk=%lld Hv=%lld dk=%lld dv=%lld %s split %lld %s: "
                     "output "
                     "error %.3g (tol %.3g), state %.3g (tol %.3g)",
                     cpu_level_name(cpu_level_get()), (long long)T, (long long)Hk, (long long)Hv,
                     (long long)dk, (long long)dv, tiled ? "tiled" : "grouped", (long long)split,
                     chunked ? "chunked" : "serial", eo, tol_o, es, tol_s);
    }
    free(x), free(g), free(beta), free(S0), free(S), free(out), free(Sr), free(ref), free(scratch);
}

static void test_delta_rule(void **state) {
    (void)state;
    const tm_cpu_level best = cpu_level_get();
    for (int lv = TM_CPU_SCALAR; lv <= (int)best; lv++) /* every level this machine has */
        for (int nt = 1; nt <= 3; nt += 2) {
            if (cpu_level_set((tm_cpu_level)lv) != TM_OK) continue;
            tm_pool *pool;
            assert_int_equal(cpu_pool_create(nt, &pool), TM_OK);
            check_delta(pool, 1, 1, 1, 8, 8, false, 1);
            check_delta(pool, 40, 2, 4, 16, 16, false, 40);   /* one partial chunk */
            check_delta(pool, 40, 2, 4, 16, 16, true, 40);    /* tiled value heads */
            check_delta(pool, 200, 2, 6, 32, 24, false, 200); /* 4 chunks, the last partial */
            check_delta(pool, 200, 3, 6, 16, 32, true, 7);    /* calls of 7 tokens */
            check_delta(pool, 130, 1, 2, 64, 64, false, 64);  /* whole chunks, calls of 64 */
            check_delta(pool, 150, 2, 4, 16, 16, true, 1);    /* token by token */
            check_delta(pool, 70, 2, 4, 128, 128, false, 70); /* the real models' head widths */
            cpu_pool_free(pool);
        }
    cpu_level_set(best);
}

static void test_rmsnorm_gated(void **state) {
    (void)state;
    enum { G = 5, N = 48 };
    float x[G * N], z[G * N], w[N], y[G * N];
    fill(x, G * N, 2), fill(z, G * N, 1.5f), fill(w, N, 1);
    cpu_rmsnorm_gated(y, x, z, w, G, N, 1e-6f);
    for (int g = 0; g < G; g++) {
        double ss = 0;
        for (int i = 0; i < N; i++) ss += (double)x[g * N + i] * x[g * N + i];
        const double r = 1 / sqrt(ss / N + 1e-6);
        for (int i = 0; i < N; i++) {
            const double zz = z[g * N + i];
            const double want = x[g * N + i] * r * w[i] * zz / (1 + exp(-zz));
            assert_true(fabs(y[g * N + i] - want) <= 1e-5 * (1 + fabs(want)));
        }
    }
    cpu_rmsnorm_gated(x, x, z, w, G, N, 1e-6f); /* in place */
    assert_memory_equal(x, y, sizeof(y));
}

int main(void) {
    tm_rng_seed(&rng, 31);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_delta_rule),
        cmocka_unit_test(test_rmsnorm_gated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
