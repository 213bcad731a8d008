/* CPU products and activation quantizers at every kernel level this CPU has
 * (levels it lacks are skipped and named in the output).
 *
 * Activations: every level must produce the same bytes as the scalar
 * quantizer, and each value must be within the rounding bound of its scale:
 *   q8_K: |x - d q| <= d (1/2 + 400u) + u |d q|
 *   q8_0: the same with d = amax/127 before f16 rounding, plus 127 |d - f16(d)|
 * (u = 2^-24; 400u covers x*id and id = 127/amax differing from 1/d).
 *
 * Products, per output, with M_i the magnitude of weight i's parts (for
 * q4_K/q5_K/q2_K |d sc q| + |dmin m|, q4_1/q5_1 |d q| + |m|, from dequantizing
 * copies with dmin (m) or d zeroed; otherwise |w_i|) and S = sum_i M_i max(|x_i|, |xq_i|):
 *  (a) level vs scalar reference, same quantized activations: the integer
 *      block sums are exact, only float scaling and summation order differ,
 *      each computation errs by at most (n + 24) u S with n = k/16 partial
 *      sums (k for float weights), so |y - y_ref| <= 2 (n + 24) u S.
 *  (b) level vs a double-precision dot of the dequantized weights with the
 *      unquantized activations: add the activation error exactly,
 *      |y - y_dbl| <= sum_i |w_i| |x_i - xq_i| + 2 (n + 24) u S
 *      (the second term also covers the dequantizer's own float rounding). */
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
#include "cpu/cpu.h"
#include "quant_test_util.h"

#define U_F32    (1.0 / 16777216.0)
#define SENTINEL 12345.0f

static tm_cpu_level level_list[4];
static int n_levels;

static void levels_init(void) {
    if (n_levels) return;
    for (int l = TM_CPU_SCALAR; l <= TM_CPU_AMX; l++) {
        if (cpu_level_set((tm_cpu_level)l) == TM_OK)
            level_list[n_levels++] = (tm_cpu_level)l;
        else
            printf("# skipping level %s: this CPU lacks it (has: %s)\n",
                   cpu_level_name((tm_cpu_level)l), cpu_features_string());
    }
    cpu_level_set(TM_CPU_SCALAR);
}

/* ---- random inputs ---- */

static void fill_bytes(tm_rng *r, void *p, size_t n) {
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)tm_rng_u64(r);
}

static tm_half rand_scale(tm_rng *r) {
    return quant_f32_to_f16((0.2f + tm_rng_f32(r)) * 0.01f);
}

/* q4_1/q5_1 mins: mostly negative (a block's minimum), sometimes positive. */
static tm_half rand_min(tm_rng *r) {
    return quant_f32_to_f16((tm_rng_f32(r) - 0.8f) * 0.1f);
}

/* Random activations: normal, with a zero block and an outlier now and then. */
static void make_x(tm_rng *r, float *x, int64_t k) {
    for (int64_t i = 0; i < k; i++) x[i] = tm_rng_normal(r);
    if (k >= 64 && tm_rng_f32(r) < 0.5f) memset(x + 32, 0, 32 * sizeof(float));
    if (tm_rng_f32(r) < 0.5f) x[tm_rng_u64(r) % k] *= 50.f;
}

/* A weight matrix of `rows` rows: random bits (every code and scale pattern)
 * with sane scales, or, when `from_floats`, the type's own quantizer applied to
 * normal floats. */
static void *make_w(tm_rng *r, tm_type t, int64_t rows, int64_t k, int from_floats) {
    size_t rb = quant_row_size(t, k);
    uint8_t *w = malloc(rb * (size_t)rows);
    assert_non_null(w);
    if (from_floats || t == TM_TYPE_F32 || t == TM_TYPE_F16 || t == TM_TYPE_BF16) {
        float *f = malloc(sizeof(float) * (size_t)k);
        for (int64_t row = 0; row < rows; row++) {
            for (int64_t i = 0; i < k; i++) f[i] = tm_rng_normal(r) * 0.05f;
            assert_int_equal(quant_row_quantize(t, f, w + rb * (size_t)row, k), TM_OK);
        }
        free(f);
        return w;
    }
    fill_bytes(r, w, rb * (size_t)rows);
    int64_t nb = (int64_t)(rb * (size_t)rows) / (int64_t)quant_type_traits(t)->type_size;
    for (int64_t b = 0; b < nb; b++) {
        switch (t) {
        case TM_TYPE_Q4_K:
            ((tm_block_q4_k *)w)[b].d = rand_scale(r);
            ((tm_block_q4_k *)w)[b].dmin = rand_scale(r);
            break;
        case TM_TYPE_Q5_K:
            ((tm_block_q5_k *)w)[b].d = rand_scale(r);
            ((tm_block_q5_k *)w)[b].dmin = rand_scale(r);
            break;
        case TM_TYPE_Q6_K:
            ((tm_block_q6_k *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_Q8_0:
            ((tm_block_q8_0 *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_Q4_0:
            ((tm_block_q4_0 *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_MXFP4:
            ((tm_block_mxfp4 *)w)[b].e = (uint8_t)(118 + tm_rng_u64(r) % 10);
            break;
        case TM_TYPE_Q4_1:
            ((tm_block_q4_1 *)w)[b].d = rand_scale(r);
            ((tm_block_q4_1 *)w)[b].m = rand_min(r);
            break;
        case TM_TYPE_Q5_0:
            ((tm_block_q5_0 *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_Q5_1:
            ((tm_block_q5_1 *)w)[b].d = rand_scale(r);
            ((tm_block_q5_1 *)w)[b].m = rand_min(r);
            break;
        case TM_TYPE_IQ4_NL:
            ((tm_block_iq4_nl *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_Q2_K:
            ((tm_block_q2_k *)w)[b].d = rand_scale(r);
            ((tm_block_q2_k *)w)[b].dmin = rand_scale(r);
            break;
        case TM_TYPE_Q3_K:
            ((tm_block_q3_k *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_IQ4_XS:
            ((tm_block_iq4_xs *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_TQ1_0: /* every byte decodes (to 5 trits of byte * 3^p) */
            ((tm_block_tq1_0 *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_TQ2_0: /* code 3 (value 2) too: the format does not forbid it */
            ((tm_block_tq2_0 *)w)[b].d = rand_scale(r);
            break;
        case TM_TYPE_IQ2_XXS: /* the grid i-quants but iq1_m start with d */
        case TM_TYPE_IQ2_XS:
        case TM_TYPE_IQ2_S:
        case TM_TYPE_IQ3_XXS:
        case TM_TYPE_IQ3_S:
        case TM_TYPE_IQ1_S: {
            tm_half d = rand_scale(r);
            memcpy(w + (size_t)b * quant_type_traits(t)->type_size, &d, 2);
            break;
        }
        case TM_TYPE_IQ1_M:
            quant_test_iq1m_set_d(&((tm_block_iq1_m *)w)[b], rand_scale(r));
            break;
        default:
            fail_msg("no random layout for %s", quant_type_name(t));
        }
    }
    return w;
}

/* Magnitudes M_i of row `w` (see the top comment). */
static void magnitudes(tm_type t, const void *w, int64_t k, float *m) {
    assert_int_equal(quant_test_magnitudes(t, w, k, m), TM_OK);
}

/* ---- activations ---- */

static void check_act(tm_type at, const float *x, const void *xq, int64_t k) {
    float *deq = malloc(sizeof(float) * (size_t)k);
    assert_int_equal(quant_row_dequantize(at, xq, deq, k), TM_OK);
    int64_t bs = at == TM_TYPE_Q8_K ? 256 : 32;
    for (int64_t b = 0; b < k / bs; b++) {
        float amax = 0;
        for (int64_t i = b * bs; i < (b + 1) * bs; i++) amax = fmaxf(amax, fabsf(x[i]));
        double d = amax / 127.f, extra = 0;
        if (at == TM_TYPE_Q8_0) {
            extra = 127 * fabs(d - quant_f16_to_f32(((const tm_block_q8_0 *)xq)[b].d));
        } else {
            const tm_block_q8_k *y = xq;
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += y[b].qs[16 * j + i];
                assert_int_equal(s, y[b].bsums[j]);
            }
        }
        for (int64_t i = b * bs; i < (b + 1) * bs; i++) {
            double lim = d * (0.5 + 400 * U_F32) + U_F32 * fabs(deq[i]) + extra;
            if (fabs((double)x[i] - deq[i]) > lim)
                fail_msg("%s act value %lld: x %g xq %g, bound %g", quant_type_name(at),
                         (long long)i, x[i], deq[i], lim);
        }
    }
    free(deq);
}

static void test_act(void **state) {
    (void)state;
    levels_init();
    tm_rng r;
    tm_rng_seed(&r, 7);
    const tm_type wtypes[] = {TM_TYPE_Q4_K, TM_TYPE_Q8_0};
    const int64_t ks[] = {256, 512, 2048, 2816};
    for (size_t ti = 0; ti < 2; ti++) {
        tm_type at = cpu_act_type(wtypes[ti]);
        for (size_t ki = 0; ki < 4; ki++) {
            int64_t k = ks[ki];
            float *x = malloc(sizeof(float) * (size_t)k);
            make_x(&r, x, k);
            size_t n = cpu_act_row_size(wtypes[ti], k);
            uint8_t *ref = malloc(n), *got = malloc(n);
            cpu_level_set(TM_CPU_SCALAR);
            cpu_act_quantize(wtypes[ti], x, ref, k);
            check_act(at, x, ref, k);
            for (int l = 1; l < n_levels; l++) {
                cpu_level_set(level_list[l]);
                memset(got, 0xAA, n);
                cpu_act_quantize(wtypes[ti], x, got, k);
                if (memcmp(ref, got, n))
                    fail_msg("%s activations at level %s differ from scalar (k=%lld)",
                             quant_type_name(at), cpu_level_name(level_list[l]), (long long)k);
            }
            free(x);
            free(ref);
            free(got);
        }
    }
    cpu_level_set(TM_CPU_SCALAR);
}

/* ---- products ---- */

typedef struct gemm_case {
    int64_t k, rows, r0, r1, n_tok;
    int from_floats;
} gemm_case;

static double worst_a, worst_b; /* largest error / bound seen, printed per type */
static double worst_bf16;       /* ... of the bf16 kernel, |y-ref| / (its own part of the bound) */

static void run_case(tm_rng *r, tm_type t, const gemm_case *c) {
    int64_t k = c->k, ldy = c->rows + 3;
    size_t wrb = quant_row_size(t, k), xrb = cpu_act_row_size(t, k);
    void *w = make_w(r, t, c->rows, k, c->from_floats);
    float *x = malloc(sizeof(float) * (size_t)(k * c->n_tok));
    uint8_t *xq = malloc(xrb * (size_t)c->n_tok);
    float *xdq = malloc(sizeof(float) * (size_t)(k * c->n_tok));
    float *wd = malloc(sizeof(float) * (size_t)k), *m = malloc(sizeof(float) * (size_t)k);
    float *yref = malloc(sizeof(float) * (size_t)(ldy * c->n_tok));
    float *y = malloc(sizeof(float) * (size_t)(ldy * c->n_tok));
    double *bound_a = malloc(sizeof(double) * (size_t)(ldy * c->n_tok));
    double *bound_b = malloc(sizeof(double) * (size_t)(ldy * c->n_tok));
    double *ydbl = malloc(sizeof(double) * (size_t)(ldy * c->n_tok));
    double *sum_s = malloc(sizeof(double) * (size_t)(ldy * c->n_tok));

    cpu_level_set(TM_CPU_SCALAR);
    for (int64_t tk = 0; tk < c->n_tok; tk++) {
        make_x(r, x + tk * k, k);
        cpu_act_quantize(t, x + tk * k, xq + xrb * (size_t)tk, k);
        assert_int_equal(
            quant_row_dequantize(cpu_act_type(t), xq + xrb * (size_t)tk, xdq + tk * k, k), TM_OK);
    }
    double n_terms =
        (t == TM_TYPE_F32 || t == TM_TYPE_F16 || t == TM_TYPE_BF16) ? (double)k : (double)k / 16;
    for (int64_t row = c->r0; row < c->r1; row++) {
        const void *wr = (const char *)w + wrb * (size_t)row;
        assert_int_equal(quant_row_dequantize(t, wr, wd, k), TM_OK);
        magnitudes(t, wr, k, m);
        for (int64_t tk = 0; tk < c->n_tok; tk++) {
            const float *xt = x + tk * k, *xqt = xdq + tk * k;
            double dot = 0, s = 0, qerr = 0;
            for (int64_t i = 0; i < k; i++) {
                dot += (double)wd[i] * xt[i];
                s += (double)m[i] * fmax(fabs(xt[i]), fabs(xqt[i]));
                qerr += fabs((double)wd[i]) * fabs((double)xt[i] - xqt[i]);
            }
            int64_t o = tk * ldy + row;
            ydbl[o] = dot;
            sum_s[o] = s;
            bound_a[o] = 2 * (n_terms + 24) * U_F32 * s + 1e-30;
            bound_b[o] = qerr + bound_a[o];
        }
    }
    for (int64_t i = 0; i < ldy * c->n_tok; i++) yref[i] = SENTINEL;
    cpu_gemm(t, k, w, wrb, c->r0, c->r1, xq, xrb, c->n_tok, yref, ldy);

    for (int l = 0; l < n_levels; l++) {
        cpu_level_set(level_list[l]);
        /* a bf16 kernel rounds each product by up to rel |w x| and sums up to k terms in f32 */
        const double rel = cpu_gemm_error_rel(t, c->n_tok), rel_sum = rel ? 2.0 * k * U_F32 : 0;
        for (int64_t i = 0; i < ldy * c->n_tok; i++) y[i] = SENTINEL;
        cpu_gemm(t, k, w, wrb, c->r0, c->r1, xq, xrb, c->n_tok, y, ldy);
        for (int64_t tk = 0; tk < c->n_tok; tk++) {
            for (int64_t row = 0; row < ldy; row++) {
                int64_t o = tk * ldy + row;
                int inside = row >= c->r0 && row < c->r1;
                if (!inside) {
                    if (y[o] != SENTINEL)
                        fail_msg("%s level %s wrote outside rows [%lld,%lld): row %lld tok %lld",
                                 quant_type_name(t), cpu_level_name(level_list[l]),
                                 (long long)c->r0, (long long)c->r1, (long long)row, (long long)tk);
                    continue;
                }
                double ea = fabs((double)y[o] - yref[o]), eb = fabs((double)y[o] - ydbl[o]);
                const double ba = bound_a[o] + (rel + rel_sum) * sum_s[o],
                             bb = bound_b[o] + (rel + rel_sum) * sum_s[o];
                if (!(ea <= ba) || !(eb <= bb))
                    fail_msg(
                        "%s level %s k=%lld rows=%lld [%lld,%lld) n_tok=%lld%s: row %lld tok %lld: "
                        "y %.9g ref %.9g dbl %.9g; |y-ref| %.3g (bound %.3g), |y-dbl| %.3g (bound "
                        "%.3g)",
                        quant_type_name(t), cpu_level_name(level_list[l]), (long long)k,
                        (long long)c->rows, (long long)c->r0, (long long)c->r1, (long long)c->n_tok,
                        c->from_floats ? " (quantized floats)" : "", (long long)row, (long long)tk,
                        y[o], yref[o], ydbl[o], ea, ba, eb, bb);
                worst_a = fmax(worst_a, ea / ba);
                worst_b = fmax(worst_b, eb / bb);
                if (rel) worst_bf16 = fmax(worst_bf16, ea / (rel * sum_s[o]));
            }
        }
    }
    cpu_level_set(TM_CPU_SCALAR);
    free(w);
    free(x);
    free(xq);
    free(xdq);
    free(wd);
    free(m);
    free(yref);
    free(y);
    free(bound_a);
    free(bound_b);
    free(ydbl);
    free(sum_s);
}

static void run_type(tm_type t) {
    levels_init();
    tm_rng r;
    tm_rng_seed(&r, 1000 + (uint64_t)t);
    int64_t bs = quant_type_traits(t)->block_size;
    static const int64_t ks_k[] = {256, 512, 768, 2048, 2816};
    /* blocks mod 4 of 1, 2, 3 and 0: the decode kernels' leftover blocks */
    static const int64_t ks_32[] = {32, 64, 96, 256, 512, 768, 2048, 2880};
    static const int64_t ks_f[] = {1, 17, 96, 256, 768, 2816};
    const int64_t *ks = bs == 256 ? ks_k : bs == 32 ? ks_32 : ks_f;
    size_t nk = bs == 256 ? 5 : bs == 32 ? 8 : 6;
    /* 21 and 70: the AMX kernel pads 5 and 6 leftover tokens to a tile; 33: one goes to AVX-512 */
    static const int64_t toks[] = {1, 3, 7, 16, 21, 33};
    worst_a = worst_b = worst_bf16 = 0;
    int n_cases = 0;
    for (size_t ki = 0; ki < nk; ki++) {
        for (size_t ti = 0; ti < 6; ti++) {
            int64_t k = ks[ki], nt = toks[ti];
            /* keep the scalar double reference cheap: fewer rows for big shapes */
            int64_t rows = k * nt > 20000 ? 21 : 37;
            gemm_case c = {k, rows, (int64_t)(tm_rng_u64(&r) % 6), rows, nt, 0};
            if (ti & 1) c.r1 = rows - (int64_t)(tm_rng_u64(&r) % 4);
            run_case(&r, t, &c);
            n_cases++;
        }
        gemm_case q = {ks[ki], 19, 2, 19, 5, 1}; /* realistic blocks from the quantizer */
        if (quant_type_traits(t)->quantize || bs == 1) run_case(&r, t, &q), n_cases++;
    }
    /* many rows: several row chunks and AMX passes of 64 rows, a partial last one */
    gemm_case big = {bs == 1 ? 96 : 512, 150, 5, 147, 33, 0};
    run_case(&r, t, &big);
    n_cases++;
    printf("# %-6s %2d cases x %d levels: worst |y-ref|/bound %.3f, |y-dbl|/bound %.3f%s\n",
           quant_type_name(t), n_cases, n_levels, worst_a, worst_b,
           quant_type_traits(t)->quantize || bs == 1 ? "" : " (no quantizer: random blocks only)");
    if (worst_bf16 > 0)
        printf("# %-5s AMX-BF16 kernel: worst |y-ref| / (2^-8 |w||x| sum) %.4f\n",
               quant_type_name(t), worst_bf16);
}

static void test_q4_k(void **s) {
    (void)s;
    run_type(TM_TYPE_Q4_K);
}
static void test_q5_k(void **s) {
    (void)s;
    run_type(TM_TYPE_Q5_K);
}
static void test_q6_k(void **s) {
    (void)s;
    run_type(TM_TYPE_Q6_K);
}
static void test_q8_0(void **s) {
    (void)s;
    run_type(TM_TYPE_Q8_0);
}
static void test_q4_0(void **s) {
    (void)s;
    run_type(TM_TYPE_Q4_0);
}
static void test_mxfp4(void **s) {
    (void)s;
    run_type(TM_TYPE_MXFP4);
}
static void test_f16(void **s) {
    (void)s;
    run_type(TM_TYPE_F16);
}
/* the low-bit types (cpu_gemm_ref_lowbit.c, cpu_gemm_lowbit_*.c) */
#define LOWBIT_TEST(name, type)                                                                    \
    static void test_##name(void **s) {                                                            \
        (void)s;                                                                                   \
        run_type(type);                                                                            \
    }
LOWBIT_TEST(q4_1, TM_TYPE_Q4_1)
LOWBIT_TEST(q5_0, TM_TYPE_Q5_0)
LOWBIT_TEST(q5_1, TM_TYPE_Q5_1)
LOWBIT_TEST(iq4_nl, TM_TYPE_IQ4_NL)
LOWBIT_TEST(q2_k, TM_TYPE_Q2_K)
LOWBIT_TEST(q3_k, TM_TYPE_Q3_K)
LOWBIT_TEST(iq4_xs, TM_TYPE_IQ4_XS)
LOWBIT_TEST(tq1_0, TM_TYPE_TQ1_0)
LOWBIT_TEST(tq2_0, TM_TYPE_TQ2_0)
#undef LOWBIT_TEST
static void test_bf16(void **s) {
    (void)s;
    run_type(TM_TYPE_BF16);
}
static void test_f32(void **s) {
    (void)s;
    run_type(TM_TYPE_F32);
}
static void test_iq2_xxs(void **s) {
    (void)s;
    run_type(TM_TYPE_IQ2_XXS);
}
static void test_iq2_xs(void **s) {
    (void)s;
    run_type(TM_TYPE_IQ2_XS);
}
static void test_iq2_s(void **s) {
    (void)s;
    run_type(TM_TYPE_IQ2_S);
}
static void test_iq3_xxs(void **s) {
    (void)s;
    run_type(TM_TYPE_IQ3_XXS);
}
static void test_iq3_s(void **s) {
    (void)s;
    run_type(TM_TYPE_IQ3_S);
}
static void test_iq1_s(void **s) {
    (void)s;
    run_type(TM_TYPE_IQ1_S);
}
static void test_iq1_m(void **s) {
    (void)s;
    run_type(TM_TYPE_IQ1_M);
}

/* cpu_matmul over a pool equals the single-threaded product bit for bit
 * (same kernel, rows split only), and quantizes x itself. */
static void test_matmul_pool(void **s) {
    (void)s;
    levels_init();
    cpu_level_set(level_list[n_levels - 1]);
    tm_rng r;
    tm_rng_seed(&r, 99);
    const tm_type types[] = {TM_TYPE_Q4_K, TM_TYPE_Q8_0, TM_TYPE_F16};
    tm_pool *pool;
    assert_int_equal(cpu_pool_create(3, &pool), TM_OK);
    for (size_t ti = 0; ti < 3; ti++) {
        tm_type t = types[ti];
        int64_t k = 512, rows = 203, nt = 5;
        void *w = make_w(&r, t, rows, k, 0);
        float *x = malloc(sizeof(float) * (size_t)(k * nt));
        for (int64_t i = 0; i < k * nt; i++) x[i] = tm_rng_normal(&r);
        size_t xrb = cpu_act_row_size(t, k);
        void *scratch = malloc(xrb * (size_t)nt);
        float *y = malloc(sizeof(float) * (size_t)(rows * nt)),
              *y1 = malloc(sizeof(float) * (size_t)(rows * nt));
        cpu_matmul(pool, t, k, rows, w, quant_row_size(t, k), x, nt, y, scratch);
        for (int64_t tk = 0; tk < nt; tk++)
            cpu_act_quantize(t, x + tk * k, (char *)scratch + xrb * (size_t)tk, k);
        cpu_gemm(t, k, w, quant_row_size(t, k), 0, rows, scratch, xrb, nt, y1, rows);
        assert_memory_equal(y, y1, sizeof(float) * (size_t)(rows * nt));
        free(w);
        free(x);
        free(scratch);
        free(y);
        free(y1);
    }
    cpu_pool_free(pool);
    cpu_level_set(TM_CPU_SCALAR);
}

/* cpu_matmul_multi equals separate cpu_matmul calls bit for bit: mixed
 * weight types (three activation types: q8_K, q8_0, f32, two matrices sharing
 * one), odd row counts whose sum crosses the 1024 rows where the router's
 * token split stops, 1, 3 and 70 tokens, at every level and 1 or 3 threads.
 * Also against cpu_gemm on one thread, so a matrix's chunking never shows. */
static void test_matmul_multi(void **s) {
    (void)s;
    levels_init();
    tm_rng r;
    tm_rng_seed(&r, 123);
    const tm_type types[] = {TM_TYPE_Q4_K, TM_TYPE_Q8_0, TM_TYPE_F16, TM_TYPE_Q6_K, TM_TYPE_Q4_0};
    const int64_t rows[] = {203, 517, 33, 301, 17};
    const int n_mats = 5;
    const int64_t k = 512, max_tok = 70;
    void *w[5];
    float *y[5], *y1[5];
    tm_matmul_desc mats[5];
    for (int i = 0; i < n_mats; i++) {
        w[i] = make_w(&r, types[i], rows[i], k, 0);
        y[i] = malloc(sizeof(float) * (size_t)(rows[i] * max_tok));
        y1[i] = malloc(sizeof(float) * (size_t)(rows[i] * max_tok));
        mats[i] = (tm_matmul_desc){types[i], rows[i], w[i], quant_row_size(types[i], k), y[i]};
    }
    float *x = malloc(sizeof(float) * (size_t)(k * max_tok));
    for (int64_t i = 0; i < k * max_tok; i++) x[i] = tm_rng_normal(&r);
    /* q8_K (q4_K, q6_K), q8_0 (q8_0, q4_0) and f32 (f16) copies of x */
    size_t want =
        (size_t)max_tok * (cpu_act_row_size(TM_TYPE_Q4_K, k) + cpu_act_row_size(TM_TYPE_Q8_0, k) +
                           cpu_act_row_size(TM_TYPE_F16, k));
    assert_int_equal(cpu_matmul_multi_scratch_bytes(n_mats, mats, k, max_tok), want);
    void *scratch = malloc(want);
    const int64_t toks[] = {1, 3, 70};
    for (int l = 0; l < n_levels; l++) {
        cpu_level_set(level_list[l]);
        for (int nth = 1; nth <= 3; nth += 2) {
            tm_pool *pool;
            assert_int_equal(cpu_pool_create(nth, &pool), TM_OK);
            for (int ti = 0; ti < 3; ti++) {
                const int64_t nt = toks[ti];
                for (int i = 0; i < n_mats; i++)
                    for (int64_t j = 0; j < rows[i] * nt; j++) y[i][j] = SENTINEL;
                cpu_matmul_multi(pool, n_mats, mats, k, x, nt, scratch);
                for (int i = 0; i < n_mats; i++) {
                    cpu_matmul(pool, types[i], k, rows[i], w[i], mats[i].w_row_bytes, x, nt, y1[i],
                               scratch);
                    if (memcmp(y[i], y1[i], sizeof(float) * (size_t)(rows[i] * nt)))
                        fail_msg("level %s, %d threads, %lld tokens: matrix %d (%s) differs from "
                                 "cpu_matmul",
                                 cpu_level_name(level_list[l]), nth, (long long)nt, i,
                                 quant_type_name(types[i]));
                    size_t xrb = cpu_act_row_size(types[i], k);
                    for (int64_t t = 0; t < nt; t++)
                        cpu_act_quantize(types[i], x + t * k, (char *)scratch + xrb * (size_t)t, k);
                    cpu_gemm(types[i], k, w[i], mats[i].w_row_bytes, 0, rows[i], scratch, xrb, nt,
                             y1[i], rows[i]);
                    if (memcmp(y[i], y1[i], sizeof(float) * (size_t)(rows[i] * nt)))
                        fail_msg("level %s, %d threads, %lld tokens: matrix %d (%s) differs from "
                                 "one cpu_gemm",
                                 cpu_level_name(level_list[l]), nth, (long long)nt, i,
                                 quant_type_name(types[i]));
                }
            }
            cpu_pool_free(pool);
        }
    }
    for (int i = 0; i < n_mats; i++) free(w[i]), free(y[i]), free(y1[i]);
    free(x);
    free(scratch);
    cpu_level_set(TM_CPU_SCALAR);
}

/* Batch invariance: a token's outputs must not depend on the other tokens of
 * its call, so a prompt, a decode step and a continuation over a reused prefix
 * compute the same row the same way. Against a call with all 29 tokens (a
 * prompt): 1 token (a decode step), 3 (a short continuation: tokens 26..28),
 * 16 and 13 (29 split at the AMX threshold). Bit for bit wherever both calls
 * take the same kernel: always at scalar and avx2; at avx512 but for one token
 * (q4_K, q5_K and mxfp4 have decode kernels of their own, with another float
 * summation order); at amx where both calls have 16+ tokens or the type has no
 * AMX kernel. Otherwise within float summation order (1e-5 of the largest
 * output; measured: 4.4e-7 at avx512, AMX-INT8 in tests/emu 4.2e-7, the
 * AMX-BF16 kernel 2.4e-3, which has its own bound in run_case). */
static int same_kernel(tm_cpu_level level, tm_type t, int64_t n) {
    if (level <= TM_CPU_AVX2) return 1;
    if (n == 1) return 0;
    /* every type with 8-bit activations but q6_K has an AMX-INT8 kernel */
    const int amx_type =
        t != TM_TYPE_Q6_K && t != TM_TYPE_F32 && t != TM_TYPE_F16 && t != TM_TYPE_BF16;
    return level < TM_CPU_AMX || !amx_type || n >= 16;
}

static void test_batch_invariance(void **s) {
    (void)s;
    levels_init();
    tm_rng r;
    tm_rng_seed(&r, 77);
    const tm_type types[] = {
        TM_TYPE_Q4_K,   TM_TYPE_Q5_K,    TM_TYPE_Q6_K,   TM_TYPE_Q8_0,    TM_TYPE_Q4_0,
        TM_TYPE_MXFP4,  TM_TYPE_F16,     TM_TYPE_BF16,   TM_TYPE_F32,     TM_TYPE_Q4_1,
        TM_TYPE_Q5_0,   TM_TYPE_Q5_1,    TM_TYPE_IQ4_NL, TM_TYPE_Q2_K,    TM_TYPE_Q3_K,
        TM_TYPE_IQ4_XS, TM_TYPE_TQ1_0,   TM_TYPE_TQ2_0,  TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XS,
        TM_TYPE_IQ2_S,  TM_TYPE_IQ3_XXS, TM_TYPE_IQ3_S,  TM_TYPE_IQ1_S,   TM_TYPE_IQ1_M};
    const int64_t k = 512, rows = 43, nt = 29;
    const int64_t splits[][2] = {{0, 1}, {5, 1}, {28, 1}, {26, 3}, {0, 3}, {0, 16}, {16, 13}};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        const tm_type t = types[ti];
        const size_t wrb = quant_row_size(t, k), xrb = cpu_act_row_size(t, k);
        void *w = make_w(&r, t, rows, k, 0);
        float *x = malloc(sizeof(float) * (size_t)(k * nt));
        uint8_t *xq = malloc(xrb * (size_t)nt);
        float *yall = malloc(sizeof(float) * (size_t)(rows * nt)),
              *ypart = malloc(sizeof(float) * (size_t)(rows * nt));
        for (int64_t tk = 0; tk < nt; tk++) {
            make_x(&r, x + tk * k, k);
            cpu_act_quantize(t, x + tk * k, xq + xrb * (size_t)tk, k);
        }
        for (int l = 0; l < n_levels; l++) {
            const tm_cpu_level level = level_list[l];
            cpu_level_set(level);
            cpu_gemm(t, k, w, wrb, 0, rows, xq, xrb, nt, yall, rows);
            double ymax = 0, worst = 0;
            for (int64_t i = 0; i < rows * nt; i++) ymax = fmax(ymax, fabs(yall[i]));
            for (size_t si = 0; si < sizeof splits / sizeof *splits; si++) {
                const int64_t t0 = splits[si][0], n = splits[si][1];
                const int exact = same_kernel(level, t, n);
                /* the AMX-BF16 kernel has its own bound (run_case) */
                if (!exact && cpu_gemm_error_rel(t, nt) + cpu_gemm_error_rel(t, n) > 0) continue;
                cpu_gemm(t, k, w, wrb, 0, rows, xq + xrb * (size_t)t0, xrb, n, ypart + t0 * rows,
                         rows);
                for (int64_t i = t0 * rows; i < (t0 + n) * rows; i++) {
                    const double e = fabs((double)ypart[i] - yall[i]);
                    worst = fmax(worst, e / ymax);
                    if (exact ? ypart[i] != yall[i] : !(e <= 1e-5 * ymax))
                        fail_msg("%s level %s: token %lld row %lld in a call of %lld tokens: %.9g, "
                                 "in one of %lld: %.9g (%s)",
                                 quant_type_name(t), cpu_level_name(level), (long long)(i / rows),
                                 (long long)(i % rows), (long long)n, (long long)nt, ypart[i],
                                 yall[i],
                                 exact ? "same kernel: must be equal"
                                       : "must be within 1e-5 of the largest output");
                }
            }
            if (worst > 0)
                printf("# %-5s %-6s: calls of another kernel differ from the 29-token one by %.2g "
                       "of the "
                       "largest output\n",
                       quant_type_name(t), cpu_level_name(level), worst);
        }
        free(w);
        free(x);
        free(xq);
        free(yall);
        free(ypart);
    }
    cpu_level_set(TM_CPU_SCALAR);
}

static void test_levels(void **s) {
    (void)s;
    levels_init();
    printf("# cpu: %s; physical cores %d; levels tested:", cpu_features_string(),
           cpu_physical_cores());
    for (int l = 0; l < n_levels; l++) printf(" %s", cpu_level_name(level_list[l]));
    printf("\n");
    assert_int_equal(cpu_level_set((tm_cpu_level)7), TM_ERR_ARG);
    const tm_type all[] = {
        TM_TYPE_Q4_K,   TM_TYPE_Q5_K,    TM_TYPE_Q6_K,   TM_TYPE_Q8_0,    TM_TYPE_Q4_0,
        TM_TYPE_MXFP4,  TM_TYPE_F16,     TM_TYPE_BF16,   TM_TYPE_F32,     TM_TYPE_Q4_1,
        TM_TYPE_Q5_0,   TM_TYPE_Q5_1,    TM_TYPE_IQ4_NL, TM_TYPE_Q2_K,    TM_TYPE_Q3_K,
        TM_TYPE_IQ4_XS, TM_TYPE_TQ1_0,   TM_TYPE_TQ2_0,  TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XS,
        TM_TYPE_IQ2_S,  TM_TYPE_IQ3_XXS, TM_TYPE_IQ3_S,  TM_TYPE_IQ1_S,   TM_TYPE_IQ1_M};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) assert_true(cpu_gemm_supports(all[i]));
    assert_false(cpu_gemm_supports(TM_TYPE_Q8_1)); /* activations only, never weights */
    assert_true(cpu_physical_cores() >= 1);
}

int main(void) {
    /* the copy test_cpu_gemm_amxint8 checks the int8 AMX kernel for K-quants */
    const char *bf16 = getenv("TIERMOE_AMX_BF16");
    if (bf16 && !strcmp(bf16, "0") && !(cpu_features()->amx_bf16 && cpu_features()->avx512bf16)) {
        printf("skipped: TIERMOE_AMX_BF16=0 changes nothing on a CPU without AMX-BF16 (has: %s)\n",
               cpu_features_string());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels),      cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_act),         cmocka_unit_test(test_q4_k),
        cmocka_unit_test(test_q5_k),        cmocka_unit_test(test_q6_k),
        cmocka_unit_test(test_q8_0),        cmocka_unit_test(test_q4_0),
        cmocka_unit_test(test_mxfp4),       cmocka_unit_test(test_f16),
        cmocka_unit_test(test_bf16),        cmocka_unit_test(test_f32),
        cmocka_unit_test(test_q4_1),        cmocka_unit_test(test_q5_0),
        cmocka_unit_test(test_q5_1),        cmocka_unit_test(test_iq4_nl),
        cmocka_unit_test(test_q2_k),        cmocka_unit_test(test_q3_k),
        cmocka_unit_test(test_iq4_xs),      cmocka_unit_test(test_tq1_0),
        cmocka_unit_test(test_tq2_0),       cmocka_unit_test(test_iq2_xxs),
        cmocka_unit_test(test_iq2_xs),      cmocka_unit_test(test_iq2_s),
        cmocka_unit_test(test_iq3_xxs),     cmocka_unit_test(test_iq3_s),
        cmocka_unit_test(test_iq1_s),       cmocka_unit_test(test_iq1_m),
        cmocka_unit_test(test_matmul_pool), cmocka_unit_test(test_matmul_multi),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
