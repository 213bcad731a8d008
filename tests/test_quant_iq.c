/* The grid i-quant quantizers (src/quant/quant_iq_*.c) without the gguf package:
 *
 * - the branch-and-bound grid search (quant_iq_search.h) against brute force
 *   over every point of every grid, read here from quant_grids.h's bytes, on
 *   random costs of the form the quantizers build ((a - s level)^2, flips
 *   4 a s level): the same least cost, with and without one flipped sign;
 * - every quantizer on rows of zeros gives blocks that decode to zeros (their
 *   f16 scale is 0), and on rows with NaN, infinities and huge values stays
 *   within the sanitizers (ASAN/UBSAN build) and writes a finite scale.
 *
 * tests/oracle/test_iq_quantize_oracle.py checks the blocks themselves
 * through the gguf package's dequantizers. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "quant/quant.h"
#include "quant/quant_grids.h"
#include "quant/quant_iq_search.h"

typedef struct grid_case {
    iq_grid_id id;
    int size, dims, levels;
    float level[8];
} grid_case;

static const grid_case g_cases[] = {
    {IQ_GRID_2XXS, 256, 8, 3, {8, 25, 43}},
    {IQ_GRID_2XS, 512, 8, 3, {8, 25, 43}},
    {IQ_GRID_2S, 1024, 8, 3, {8, 25, 43}},
    {IQ_GRID_3XXS, 256, 4, 8, {4, 12, 20, 28, 36, 44, 52, 62}},
    {IQ_GRID_3S, 512, 4, 8, {1, 3, 5, 7, 9, 11, 13, 15}},
    {IQ_GRID_1S, 2048, 8, 3, {-1, 0, 1}},
};

/* Coordinate k of point i: byte k of the entry (little-endian, quant_grids.h). */
static int point_byte(iq_grid_id id, int i, int k) {
    const void *tables[] = {quant_grid_iq2_xxs, quant_grid_iq2_xs, quant_grid_iq2_s,
                            quant_grid_iq3_xxs, quant_grid_iq3_s,  quant_grid_iq1_s};
    const size_t width = id == IQ_GRID_3XXS || id == IQ_GRID_3S ? 4 : 8;
    uint8_t b;
    memcpy(&b, (const uint8_t *)tables[id] + (size_t)i * width + (size_t)k, 1);
    return id == IQ_GRID_1S ? (int8_t)b : b;
}

static int level_of(const grid_case *gc, int byte) {
    for (int l = 0; l < gc->levels; l++)
        if ((float)byte == gc->level[l]) return l;
    fail_msg("grid byte %d is not a level of grid %d", byte, (int)gc->id);
    return 0;
}

/* Brute force: least cost over the grid, plain and with the cheapest single flip. */
static void brute(const grid_case *gc, const double *c, const double *f, double best[2]) {
    best[0] = best[1] = INFINITY;
    for (int i = 0; i < gc->size; i++) {
        double e = 0, fl = INFINITY;
        for (int k = 0; k < gc->dims; k++) {
            const int l = level_of(gc, point_byte(gc->id, i, k));
            e += c[k * gc->levels + l];
            fl = fmin(fl, f[k * gc->levels + l]);
        }
        best[0] = fmin(best[0], e);
        best[1] = fmin(best[1], e + fl);
    }
}

/* The cost of grid point `index` as brute force prices it. */
static double point_cost(const grid_case *gc, const double *c, const double *f, int index,
                         int flip) {
    double e = 0, fl = INFINITY;
    for (int k = 0; k < gc->dims; k++) {
        const int l = level_of(gc, point_byte(gc->id, index, k));
        e += c[k * gc->levels + l];
        fl = fmin(fl, f[k * gc->levels + l]);
    }
    return flip ? e + fl : e;
}

static void test_search_vs_brute_force(void **state) {
    (void)state;
    tm_rng rng;
    tm_rng_seed(&rng, 33);
    for (size_t t = 0; t < sizeof(g_cases) / sizeof(g_cases[0]); t++) {
        const grid_case *gc = &g_cases[t];
        const iq_grid *g = quant_iq_grid_get(gc->id);
        assert_int_equal(g->size, gc->size);
        assert_int_equal(g->dims, gc->dims);
        for (int trial = 0; trial < 400; trial++) {
            const int L = gc->levels;
            const float s = gc->level[L - 1] > 1 ? 1.0f / gc->level[L - 1] : 0.6f;
            float c[8 * 8], f[8 * 8];
            double cd[8 * 8], fd[8 * 8];
            for (int k = 0; k < gc->dims; k++) {
                /* |x| for the signed grids, signed x with a delta for the ternary one */
                const float x =
                    gc->id == IQ_GRID_1S ? tm_rng_normal(&rng) : fabsf(tm_rng_normal(&rng)) * 0.6f;
                const float delta = gc->id == IQ_GRID_1S ? (trial & 1 ? 0.125f : -0.125f) : 0;
                for (int l = 0; l < L; l++) {
                    const float q = s * (gc->level[l] + delta), e = x - q;
                    c[k * L + l] = e * e;
                    f[k * L + l] = gc->id == IQ_GRID_1S ? 0.0f : 4.0f * x * q;
                    cd[k * L + l] = c[k * L + l];
                    fd[k * L + l] = f[k * L + l];
                }
            }
            double want[2];
            brute(gc, cd, fd, want);
            const int modes[3] = {IQ_WANT_PLAIN, IQ_WANT_FLIP, IQ_WANT_BOTH};
            for (int m = 0; m < (gc->id == IQ_GRID_1S ? 1 : 3); m++) {
                iq_search_result r;
                quant_iq_grid_search(g, c, m ? f : NULL, modes[m], FLT_MAX, &r);
                if (m == 0) { /* a bound at the least cost finds nothing; just above, the same */
                    iq_search_result rb;
                    const float lo = (float)want[0] * 0.9999f,
                                hi = (float)want[0] * 1.0001f + 1e-6f;
                    quant_iq_grid_search(g, c, NULL, IQ_WANT_PLAIN, lo, &rb);
                    assert_true(rb.cost[0] == lo && rb.index[0] == 0);
                    quant_iq_grid_search(g, c, NULL, IQ_WANT_PLAIN, hi, &rb);
                    assert_true(rb.cost[0] < hi && rb.index[0] == r.index[0]);
                }
                for (int w = 0; w < 2; w++) {
                    if (!(modes[m] & (1 << w))) continue;
                    const double got = point_cost(gc, cd, fd, r.index[w], w);
                    const double tol = 1e-5 * (want[w] + 1e-3);
                    if (got > want[w] + tol || fabs(r.cost[w] - got) > tol)
                        fail_msg("grid %d trial %d mode %d %s: point %d costs %.9g (reported "
                                 "%.9g), brute force %.9g",
                                 (int)gc->id, trial, modes[m], w ? "flip" : "plain", r.index[w],
                                 got, (double)r.cost[w], want[w]);
                }
            }
        }
    }
}

static const tm_type g_iq_types[] = {TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XS, TM_TYPE_IQ2_S,
                                     TM_TYPE_IQ3_XXS, TM_TYPE_IQ3_S,  TM_TYPE_IQ1_S,
                                     TM_TYPE_IQ1_M};

/* The block's f16 scale (iq1_m keeps it in the top nibbles of its scales). */
static float block_d(tm_type t, const uint8_t *b) {
    if (t == TM_TYPE_IQ1_M) {
        uint16_t sc[4];
        memcpy(sc, b + 48, 8);
        return quant_f16_to_f32((tm_half)((sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) |
                                          ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000)));
    }
    tm_half h;
    memcpy(&h, b, 2);
    return quant_f16_to_f32(h);
}

static void test_zero_and_wild_rows(void **state) {
    (void)state;
    float x[2 * TM_QK_K];
    uint8_t q[2 * 110];
    tm_rng rng;
    tm_rng_seed(&rng, 5);
    for (size_t t = 0; t < sizeof(g_iq_types) / sizeof(g_iq_types[0]); t++) {
        const tm_type type = g_iq_types[t];
        const size_t bs = quant_type_traits(type)->type_size;
        memset(x, 0, sizeof(x));
        memset(q, 0xa5, sizeof(q));
        assert_int_equal(quant_row_quantize(type, x, q, 2 * TM_QK_K), TM_OK);
        assert_true(block_d(type, q) == 0.0f && block_d(type, q + bs) == 0.0f);
        for (int i = 0; i < 2 * TM_QK_K; i++) x[i] = tm_rng_normal(&rng);
        x[1] = NAN;
        x[7] = INFINITY;
        x[300] = -INFINITY;
        x[301] = 3e38f;
        x[302] = -3e38f;
        assert_int_equal(quant_row_quantize(type, x, q, 2 * TM_QK_K), TM_OK);
        assert_true(isfinite(block_d(type, q)) && isfinite(block_d(type, q + bs)));
        assert_true(block_d(type, q) > 0);
        assert_int_equal(quant_row_quantize(type, x, q, 100), TM_ERR_ARG);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_search_vs_brute_force),
        cmocka_unit_test(test_zero_and_wild_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
