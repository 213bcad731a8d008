/* Emulated AVX-512 and AMX kernels (tests/emu/emu512.h) against the scalar
 * reference products on random weights; built and run by
 * scripts/cpu_emu_check.sh. Prints the worst error per type; fails above
 * 1e-4 of the largest output (float summation order only), the AMX-INT8
 * kernels above test_cpu_gemm's bound (a): their block sums are exact
 * integers, so with n = k/16 partial sums and S = sum_i M_i |xq_i| (M_i the
 * magnitude of weight i's parts) |y - y_ref| <= 2 (n + 24) u S. Every type
 * that has an AMX-INT8 kernel must be reached here (amx_types). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/rng.h"
#include "cpu/cpu_internal.h"
#include "../quant_test_util.h"
cpu_gemm_fn emu_avx512_get(tm_type wtype);
cpu_gemm_fn emu_lowbit_avx512_get(tm_type wtype);
cpu_gemm_fn emu_amx_get(tm_type wtype);
cpu_gemm_fn emu_amxbf_kernel(tm_type wtype);

/* The bf16 kernel's bound: 2^-8 + 2^-18 of sum |w_i| |xq_i| (both rounded to
 * bf16), plus f32 sums; w and xq dequantized here. */
static double bf16_bound(tm_type t, const uint8_t *w, size_t wrb, const uint8_t *xq, size_t xrb,
                         int64_t k, int64_t row, int64_t tok) {
    float *wd = malloc(sizeof(float) * k), *xd = malloc(sizeof(float) * k);
    quant_row_dequantize(t, w + wrb * row, wd, k);
    quant_row_dequantize(TM_TYPE_Q8_K, xq + xrb * tok, xd, k);
    double s = 0;
    for (int64_t i = 0; i < k; i++) s += fabs((double)wd[i] * xd[i]);
    free(wd);
    free(xd);
    return (0x1p-8 + 0x1p-18 + 2.0 * (k + 24) / 16777216.0) * s * 1.01 + 1e-30;
}
/* test_cpu_gemm's bound (a) of every output: 2 (k/16 + 24) u S, into bnd[tok * ldy + row]. */
static void int8_bounds(tm_type t, const uint8_t *w, size_t wrb, const uint8_t *xq, size_t xrb,
                        int64_t k, int64_t r0, int64_t r1, int64_t nt, int64_t ldy, double *bnd) {
    float *m = malloc(sizeof(float) * k * (r1 - r0)), *xd = malloc(sizeof(float) * k * nt);
    for (int64_t row = r0; row < r1; row++)
        if (quant_test_magnitudes(t, w + wrb * row, k, m + (row - r0) * k) != TM_OK) abort();
    for (int64_t j = 0; j < nt; j++)
        if (quant_row_dequantize(cpu_act_type(t), xq + xrb * j, xd + j * k, k) != TM_OK) abort();
    for (int64_t j = 0; j < nt; j++)
        for (int64_t row = r0; row < r1; row++) {
            double s = 0;
            for (int64_t i = 0; i < k; i++)
                s += (double)m[(row - r0) * k + i] * fabs(xd[j * k + i]);
            bnd[j * ldy + row] = 2.0 * ((double)k / 16 + 24) / 16777216.0 * s + 1e-30;
        }
    free(m);
    free(xd);
}

static void fixscales(tm_type t, uint8_t *w, size_t bytes, tm_rng *r) {
    size_t bs = quant_type_traits(t)->type_size;
    for (size_t b = 0; b < bytes / bs; b++) {
        tm_half d = quant_f32_to_f16((0.2f + tm_rng_f32(r)) * 0.01f),
                d2 = quant_f32_to_f16((0.2f + tm_rng_f32(r)) * 0.01f);
        uint8_t *p = w + b * bs;
        if (t == TM_TYPE_Q4_K || t == TM_TYPE_Q5_K) {
            memcpy(p, &d, 2);
            memcpy(p + 2, &d2, 2);
        } else if (t == TM_TYPE_Q8_0 || t == TM_TYPE_Q4_0)
            memcpy(p, &d, 2);
        else if (t == TM_TYPE_Q6_K)
            memcpy(p + bs - 2, &d, 2);
        else if (t == TM_TYPE_MXFP4)
            p[0] = (uint8_t)(118 + tm_rng_u64(r) % 10);
        else if (t == TM_TYPE_Q4_1 || t == TM_TYPE_Q5_1) { /* d, m */
            memcpy(p, &d, 2);
            memcpy(p + 2, &d2, 2);
        } else if (t == TM_TYPE_Q5_0 || t == TM_TYPE_IQ4_NL || t == TM_TYPE_IQ4_XS)
            memcpy(p, &d, 2);
        else if (t == TM_TYPE_Q2_K) { /* d, dmin last */
            memcpy(p + bs - 4, &d, 2);
            memcpy(p + bs - 2, &d2, 2);
        } else if (t == TM_TYPE_Q3_K || t == TM_TYPE_TQ1_0 || t == TM_TYPE_TQ2_0)
            memcpy(p + bs - 2, &d, 2);
        else if (t == TM_TYPE_IQ1_M)
            quant_test_iq1m_set_d((tm_block_iq1_m *)p, d);
        else if (t == TM_TYPE_IQ2_XXS || t == TM_TYPE_IQ2_XS || t == TM_TYPE_IQ2_S ||
                 t == TM_TYPE_IQ3_XXS || t == TM_TYPE_IQ3_S || t == TM_TYPE_IQ1_S)
            memcpy(p, &d, 2); /* the other grid i-quants start with d */
    }
}
/* Tokens of an n-token call that the int8 AMX kernel takes through tiles: the
 * full 16-token tiles, and a zero-padded one for 2+ leftover tokens
 * (amx_pad_min); a single leftover token goes to the AVX-512 kernel. */
static int64_t amx_tokens(int64_t n) {
    return n % 16 >= 2 ? (n + 15) / 16 * 16 : n / 16 * 16;
}

int main(void) {
    tm_rng r;
    tm_rng_seed(&r, 3);
    /* then the low-bit types (cpu_gemm_lowbit_avx512.c and cpu_gemm_iq_avx512.c, reached
     * through emu_avx512_get) */
    tm_type types[] = {TM_TYPE_Q4_K,   TM_TYPE_Q5_K,   TM_TYPE_Q6_K,    TM_TYPE_Q8_0,
                       TM_TYPE_Q4_0,   TM_TYPE_MXFP4,  TM_TYPE_Q4_1,    TM_TYPE_Q5_0,
                       TM_TYPE_Q5_1,   TM_TYPE_IQ4_NL, TM_TYPE_Q2_K,    TM_TYPE_Q3_K,
                       TM_TYPE_IQ4_XS, TM_TYPE_TQ1_0,  TM_TYPE_TQ2_0,   TM_TYPE_IQ2_XXS,
                       TM_TYPE_IQ2_XS, TM_TYPE_IQ2_S,  TM_TYPE_IQ3_XXS, TM_TYPE_IQ3_S,
                       TM_TYPE_IQ1_S,  TM_TYPE_IQ1_M};
    const int n_types = (int)(sizeof types / sizeof *types);
    int64_t ks[] = {32, 96, 256, 768, 2816};
    int64_t toks[] = {1, 3, 7, 16, 33, 50, 150}; /* 150: two token blocks of the bf16 kernel */
    int bad = 0;
    /* the types with an AMX-INT8 kernel: a getter that loses one fails here */
    const tm_type amx_types[] = {TM_TYPE_Q4_K,   TM_TYPE_Q5_K,    TM_TYPE_Q8_0,    TM_TYPE_Q4_0,
                                 TM_TYPE_MXFP4,  TM_TYPE_Q4_1,    TM_TYPE_Q5_0,    TM_TYPE_Q5_1,
                                 TM_TYPE_IQ4_NL, TM_TYPE_Q2_K,    TM_TYPE_Q3_K,    TM_TYPE_IQ4_XS,
                                 TM_TYPE_TQ1_0,  TM_TYPE_TQ2_0,   TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XS,
                                 TM_TYPE_IQ2_S,  TM_TYPE_IQ3_XXS, TM_TYPE_IQ3_S,   TM_TYPE_IQ1_S,
                                 TM_TYPE_IQ1_M};
    for (size_t i = 0; i < sizeof amx_types / sizeof *amx_types; i++)
        if (!emu_amx_get(amx_types[i])) {
            printf("FAIL %s: no AMX-INT8 kernel\n", quant_type_name(amx_types[i]));
            bad++;
        }
    double worst_int8 = 0;
    for (int ti = 0; ti < n_types; ti++)
        for (int ki = 0; ki < 5; ki++)
            for (int nti = 0; nti < 7; nti++) {
                tm_type t = types[ti];
                int64_t k = ks[ki], nt = toks[nti];
                if (quant_type_traits(t)->block_size == 256 && k % 256) continue;
                int64_t rows = 37 + 64 * (nti % 2), r0 = 3, r1 = rows - 2, ldy = rows + 2;
                size_t wrb = quant_row_size(t, k), xrb = cpu_act_row_size(t, k);
                uint8_t *w = malloc(wrb * rows);
                for (size_t i = 0; i < wrb * rows; i++) w[i] = (uint8_t)tm_rng_u64(&r);
                fixscales(t, w, wrb * rows, &r);
                float *x = malloc(sizeof(float) * k * nt);
                for (int64_t i = 0; i < k * nt; i++) x[i] = tm_rng_normal(&r);
                uint8_t *xq = malloc(xrb * nt);
                for (int64_t j = 0; j < nt; j++)
                    (cpu_act_type(t) == TM_TYPE_Q8_K ? cpu_act_ref_q8_k : cpu_act_ref_q8_0)(
                        x + j * k, xq + j * xrb, k);
                float *y0 = calloc(ldy * nt, 4), *y1 = calloc(ldy * nt, 4),
                      *y2 = calloc(ldy * nt, 4);
                cpu_gemm_ref_get(t)(k, w, wrb, r0, r1, xq, xrb, nt, y0, ldy);
                cpu_gemm_fn f = emu_avx512_get(t);
                f(k, w, wrb, r0, r1, xq, xrb, nt, y1, ldy);
                cpu_gemm_fn g = emu_amx_get(t);
                if (g) g(k, w, wrb, r0, r1, xq, xrb, nt, y2, ldy);
                double m1 = 0, m2 = 0, ymax = 0, m2b = 0;
                int fail2 = 0;
                for (int64_t i = 0; i < ldy * nt; i++) {
                    ymax = fmax(ymax, fabs(y0[i]));
                    m1 = fmax(m1, fabs(y1[i] - y0[i]));
                    if (g) m2 = fmax(m2, fabs(y2[i] - y0[i]));
                }
                if (g) { /* every output of the AMX-INT8 kernel within its bound */
                    double *bnd = malloc(sizeof(double) * ldy * nt);
                    int8_bounds(t, w, wrb, xq, xrb, k, r0, r1, nt, ldy, bnd);
                    for (int64_t j = 0; j < nt; j++)
                        for (int64_t row = r0; row < r1; row++) {
                            const double e = fabs((double)y2[j * ldy + row] - y0[j * ldy + row]);
                            m2b = fmax(m2b, e / bnd[j * ldy + row]);
                            fail2 |= !(e <= bnd[j * ldy + row]);
                        }
                    free(bnd);
                }
                worst_int8 = fmax(worst_int8, m2b);
                /* the AMX kernels are batch-invariant: a token's outputs are the same bits
                 * in a call without the first 5 tokens (other tiles, full or zero-padded),
                 * wherever both calls take it through AMX (not a single leftover token) */
                if (g && nt > 5) {
                    float *y4 = calloc(ldy * nt, 4);
                    g(k, w, wrb, r0, r1, xq + 5 * xrb, xrb, nt - 5, y4 + 5 * ldy, ldy);
                    for (int64_t j = 5; j < nt; j++) {
                        if (j >= amx_tokens(nt) || j - 5 >= amx_tokens(nt - 5)) continue;
                        for (int64_t row = r0; row < r1; row++)
                            if (y4[j * ldy + row] != y2[j * ldy + row]) {
                                printf("FAIL %s k=%lld: amx token %lld row %lld: %.9g in a call "
                                       "of %lld tokens, %.9g in one of %lld\n",
                                       quant_type_name(t), (long long)k, (long long)j,
                                       (long long)row, y2[j * ldy + row], (long long)nt,
                                       y4[j * ldy + row], (long long)nt - 5);
                                bad++;
                                row = r1, j = nt;
                            }
                    }
                    free(y4);
                }
                /* the bf16 kernel, every row of every token within its own bound */
                cpu_gemm_fn hb = emu_amxbf_kernel(t);
                double m3 = -1;
                int fail3 = 0;
                if (hb && nt >= 16) {
                    float *y3 = calloc(ldy * nt, 4);
                    hb(k, w, wrb, r0, r1, xq, xrb, nt, y3, ldy);
                    m3 = 0;
                    for (int64_t j = 0; j < nt; j++)
                        for (int64_t row = 0; row < ldy; row++) {
                            double e = fabs(y3[j * ldy + row] - y0[j * ldy + row]);
                            double bnd = row >= r0 && row < r1
                                             ? bf16_bound(t, w, wrb, xq, xrb, k, row, j)
                                             : 0;
                            m3 = fmax(m3, e / fmax(bnd, 1e-30));
                            fail3 |= !(e <= bnd);
                        }
                    free(y3);
                }
                int fail = m1 > 1e-4 * ymax || m2 > 1e-4 * ymax || fail2 || fail3;
                if (fail || (ki == 4 && nti == 5) || m3 >= 0)
                    printf("%s %-5s k=%lld nt=%lld: ymax %.4g avx512 err %.3g amx err %.3g"
                           " (err/bound %.3g) amx-bf16 err/bound %.3g\n",
                           fail ? "FAIL" : "ok  ", quant_type_name(t), (long long)k, (long long)nt,
                           ymax, m1, g ? m2 : -1.0, g ? m2b : -1.0, m3);
                bad += fail;
                free(w);
                free(x);
                free(xq);
                free(y0);
                free(y1);
                free(y2);
            }
    printf("AMX-INT8 worst err/bound %.3g\n%d failures\n", worst_int8, bad);
    return bad != 0;
}
