/* CUDA op harness: every kernel of src/cuda against an independent CPU
 * reference on random shapes (odd sizes included), plus a perf mode.
 *
 *   mmvq     vs a double-precision dot of quant_row_dequantize'd rows, every
 *            weight type (check_types: the low-bit ones on raw random blocks)
 *   mmvq_q8x the activation quantizer bit for bit against the host's, and the
 *            q8_0, q4_K and low-bit (TM_CUDA_LBX_TYPES) integer products vs a double
 *            dot with the quantized activations
 *   moe      vs a double-precision loop over the same items (dequantized
 *            experts, SwiGLU, weighted scatter-add)
 *   router   vs moe_router_select (src/moe/router.c)
 *   norm     vs cpu_rmsnorm, RoPE vs cpu_rope_table + cpu_rope_neox_table,
 *            add vs the exact float sum
 *
 * Tolerances come from float32 accumulation (u = 2^-24; activations are not
 * requantised by the kernels): a dot of n products summed in any order is
 * within (n + 2) u Σ|w_i x_i| of the exact value (Higham's γ_n, with 2 u more
 * for the weight itself, whose d*q - m may be fused into an FMA on the GPU).
 * Each output is poisoned with NaN bytes before the launch, so an unwritten
 * element fails (NaN never passes a `<=` test).
 *
 * Without TM_HAVE_CUDA or without a usable GPU the program prints
 * "skipped: no CUDA device (why)" and exits 77, which CTest reports as skipped.
 * TM_CUDA_ONLY=pattern runs the matching tests only. TM_CUDA_BENCH=1 adds the timing
 * of the Qwen3-30B-A3B decode shapes (median of CUDA-event timings, weights
 * rotating through more memory than the L2 holds). */
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
#include "core/status.h"
#include "cpu/cpu_ops.h"
#include "moe/moe.h"
#include "quant/quant.h"

#ifdef TM_HAVE_CUDA
#include "cuda/cuda.h"

#include "cuda/cuda_check.h"

/* ---- mmvq ---- */

typedef struct mmvq_case {
    int64_t rows, k, n_tok;
    size_t pad; /* extra bytes per row */
} mmvq_case;

/* mxfp4 rows of random bytes, so every nibble (-0 included) appears, with
 * one exponent per row: 0, 1, 2 (the subnormal scales), then spread up to 150.
 * The caller scales x by 2^64 so that even e = 0 rows give outputs far above
 * the tolerance's 1e-30 floor, and e = 150 ones stay finite. wd: the rows
 * dequantized. */
static void mxfp4_raw_rows(tm_rng *r, uint8_t *w, float *wd, int64_t rows, int64_t k,
                           size_t row_bytes) {
    for (int64_t i = 0; i < rows; i++) {
        uint8_t *row = w + i * row_bytes;
        const uint8_t e = (uint8_t)(i < 3 ? i : (i * 37) % 151);
        for (int64_t b = 0; b < k / 32; b++) {
            row[17 * b] = e;
            for (int j = 1; j < 17; j++) row[17 * b + j] = (uint8_t)tm_rng_u64(r);
        }
        CHECK(quant_row_dequantize(TM_TYPE_MXFP4, row, wd + i * k, k));
    }
}

/* Runs one case (raw: mxfp4_raw_rows' weights); returns the worst |err| / tol
 * seen (must be <= 1). */
static double mmvq_run_case(tm_rng *r, tm_type type, const mmvq_case *c, bool raw) {
    const int64_t rows = c->rows, k = c->k, nt = c->n_tok;
    const size_t row_bytes = quant_row_size(type, k) + c->pad;
    float *wd;
    uint8_t *w = random_matrix(r, type, rows, k, row_bytes, &wd);
    if (raw) mxfp4_raw_rows(r, w, wd, rows, k, row_bytes);
    float *x = xmalloc((size_t)nt * k * sizeof(float));
    fill_normal(r, x, nt * k, raw ? 0x1p64f : 1.0f);
    float *y = xmalloc((size_t)nt * rows * sizeof(float));

    cuda_pool_reset(g_pool);
    const void *w_d = dev_upload(w, (size_t)rows * row_bytes);
    const float *x_d = dev_upload(x, (size_t)nt * k * sizeof(float));
    float *y_d = dev_alloc((size_t)nt * rows * sizeof(float));
    CHECK(cuda_fill_bytes(g_dev, y_d, 0xff, (size_t)nt * rows * sizeof(float))); /* NaN poison */
    CHECK(cuda_mmvq(type, w_d, row_bytes, rows, k, x_d, nt, y_d, cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, y, y_d, (size_t)nt * rows * sizeof(float)));

    double worst = 0, e2 = 0, r2 = 0;
    for (int64_t t = 0; t < nt; t++) {
        for (int64_t i = 0; i < rows; i++) {
            double ref = 0, mag = 0;
            for (int64_t j = 0; j < k; j++) {
                const double p = (double)wd[i * k + j] * x[t * k + j];
                ref += p;
                mag += fabs(p);
            }
            const double tol = (double)(k + 2) * U32 * mag + 1e-30;
            const double err = fabs((double)y[t * rows + i] - ref);
            if (!(err <= tol))
                fail_msg("mmvq %s rows %lld k %lld n_tok %lld pad %zu: y[%lld][%lld] = %.9g, ref "
                         "%.9g, tol %.3g",
                         quant_type_name(type), (long long)rows, (long long)k, (long long)nt,
                         c->pad, (long long)t, (long long)i, y[t * rows + i], ref, tol);
            worst = fmax(worst, err / tol);
            e2 += err * err;
            r2 += ref * ref;
        }
    }
    /* a random-error bound far under the worst case: catches systematic drift.
     * Only over 64+ outputs: one output can be near zero by chance. */
    if (rows * nt >= 64 && !(sqrt(e2 / r2) < 1e-5))
        fail_msg("mmvq %s rows %lld k %lld n_tok %lld: |err|/|ref| = %.3g over all outputs",
                 quant_type_name(type), (long long)rows, (long long)k, (long long)nt,
                 sqrt(e2 / r2));
    free(w), free(wd), free(x), free(y);
    return worst;
}

static void test_mmvq(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0xc0da);
    /* every rows in {1, 7, 33, 4096}, k in {256, 768, 2048, 2816}, n_tok in {1, 3, 8} appears */
    static const mmvq_case cases[] = {
        {1, 256, 1, 0},     {7, 768, 3, 0},   {33, 2048, 8, 0}, {4096, 2816, 1, 0},
        {4096, 2048, 8, 0}, {33, 2816, 3, 0}, {7, 256, 8, 0},   {1, 2816, 8, 0},
        {4096, 768, 3, 0},  {33, 768, 1, 4},  {7, 2048, 3, 12}, {33, 256, 8, 2},
    };
    for (size_t ti = 0; ti < CHECK_N_TYPES; ti++) {
        const tm_type type = check_types[ti];
        double worst = 0;
        size_t n_run = 0;
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++, n_run++) {
            mmvq_case c = cases[ci];
            if (type == TM_TYPE_F32 && c.pad % 4) c.pad = 4; /* f32 rows stay 4-byte aligned */
            if ((type == TM_TYPE_F16 || type == TM_TYPE_BF16) && c.pad % 2) c.pad = 2;
            worst = fmax(worst, mmvq_run_case(&r, type, &c, false));
        }
        if (type == TM_TYPE_F32 || type == TM_TYPE_F16 || type == TM_TYPE_BF16) {
            /* k not a multiple of 8: the one-value-per-lane path */
            static const mmvq_case odd[] = {{5, 100, 3, 0}, {3, 36, 8, 0}, {33, 1, 1, 0}};
            for (size_t ci = 0; ci < sizeof(odd) / sizeof(odd[0]); ci++, n_run++)
                worst = fmax(worst, mmvq_run_case(&r, type, &odd[ci], false));
        }
        if (quant_type_traits((uint32_t)type)->block_size == 32 && check_lowbit_type(type)) {
            /* q4_1 q5_0 q5_1 iq4_nl: k of 3 and 5 blocks, rows at every offset mod 4 */
            static const mmvq_case b32[] = {{5, 96, 3, 1}, {9, 160, 8, 2}, {33, 32, 1, 3}};
            for (size_t ci = 0; ci < sizeof(b32) / sizeof(b32[0]); ci++, n_run++)
                worst = fmax(worst, mmvq_run_case(&r, type, &b32[ci], false));
        }
        if (type == TM_TYPE_MXFP4) {
            /* gpt-oss's k = 2880 (90 blocks: a partial last step of 16), k not a
             * multiple of 256, one block, odd row pads (17-byte blocks at every
             * offset mod 4), 1..8 tokens, and the raw rows of every nibble and
             * exponent */
            static const mmvq_case mx[] = {
                {33, 2880, 1, 0}, {7, 2880, 8, 1},  {2880, 2880, 2, 0}, {64, 576, 2, 3},
                {5, 704, 5, 0},   {3, 32, 1, 0},    {9, 96, 7, 2},      {40, 544, 4, 1},
                {6, 160, 6, 3},   {67, 2880, 1, 0}, {67, 704, 3, 1},
            };
            const size_t n_mx = sizeof(mx) / sizeof(mx[0]);
            for (size_t ci = 0; ci < n_mx; ci++, n_run++) /* the last two raw */
                worst = fmax(worst, mmvq_run_case(&r, type, &mx[ci], ci + 2 >= n_mx));
        }
        printf("mmvq %-7s: %zu cases ok, worst |err|/tol %.3g\n", quant_type_name(type), n_run,
               worst);
    }
    /* the launcher refuses what it cannot do, with a message */
    assert_int_equal(
        cuda_mmvq(TM_TYPE_Q4_K, NULL, 144, 1, 200, NULL, 1, NULL, cuda_device_stream(g_dev)),
        TM_ERR_ARG);
    assert_int_equal(
        cuda_mmvq(TM_TYPE_NVFP4, NULL, 36, 1, 64, NULL, 1, NULL, cuda_device_stream(g_dev)),
        TM_ERR_UNSUPPORTED);
}

/* ---- q8_0 with 8-bit activations ---- */

/* The quantizer bit for bit against the host's; the product against a double
 * dot of the dequantized weights and activations. Each block's integer sum is
 * exact, so the error is float32's: nb = k/32 scaled sums (two roundings each)
 * added in any order, within (nb + 2) u Σ_b |d_w d_x Σ w q|, bounded by
 * (nb + 2) u Σ |w x̂|. Rows 4-byte aligned, k a multiple of 64. */
/* |m_h| of value j of a low-bit row (lbx_unit.cuh's offsets: 0 but for the types with
 * a min), for the tolerance below. */
static double lbx_min_abs(tm_type type, const uint8_t *row, int64_t j) {
    switch (type) {
    case TM_TYPE_Q2_K: { /* dmin times the scale byte's high nibble */
        const uint8_t *b = row + 84 * (j / 256);
        return fabs(quant_f16_to_f32((uint16_t)(b[82] | b[83] << 8))) * (b[j % 256 / 16] >> 4);
    }
    case TM_TYPE_Q4_1:
    case TM_TYPE_Q5_1: { /* the block's m */
        const uint8_t *b = row + (type == TM_TYPE_Q4_1 ? 20 : 24) * (j / 32);
        return fabs(quant_f16_to_f32((uint16_t)(b[2] | b[3] << 8)));
    }
    default:
        return 0.0;
    }
}

static double mmvq_q8x_case(tm_rng *r, tm_type type, const mmvq_case *c) {
    const int64_t rows = c->rows, k = c->k, nt = c->n_tok, nb = k / 32;
    const size_t row_bytes = quant_row_size(type, k) + c->pad;
    const bool lbx = cuda_lbx_type(type);
    assert_true(type == TM_TYPE_Q8_0 || type == TM_TYPE_Q4_K || lbx);
    float *wd;
    uint8_t *w = random_matrix(r, type, rows, k, row_bytes, &wd);
    float *x = xmalloc((size_t)nt * k * sizeof(float));
    fill_normal(r, x, nt * k, 1.0f);
    for (int64_t i = 0; i < 32 && i < nt * k; i++) x[i] = 0.0f; /* a block of zeros: d = 0 */
    for (int64_t i = 64; i < 96 && i < nt * k; i++) x[i] *= 1e-3f;
    const size_t qbytes = cuda_q8x_bytes(k, nt);
    int8_t *q = xmalloc((size_t)(nt * k)), *qg = xmalloc(qbytes);
    float *d = xmalloc((size_t)(nt * nb) * sizeof(float));
    quant_ref_quantize_q8x(x, nt * k, q, d);
    float *y = xmalloc((size_t)nt * rows * sizeof(float));

    cuda_pool_reset(g_pool);
    const void *w_d = dev_upload(w, (size_t)rows * row_bytes);
    const float *x_d = dev_upload(x, (size_t)nt * k * sizeof(float));
    void *q_d = dev_alloc(qbytes);
    float *y_d = dev_alloc((size_t)nt * rows * sizeof(float));
    CHECK(cuda_fill_bytes(g_dev, y_d, 0xff, (size_t)nt * rows * sizeof(float))); /* NaN poison */
    CHECK(cuda_q8x_quantize(x_d, k, nt, q_d, cuda_device_stream(g_dev)));
    CHECK(cuda_mmvq_q8x(type, w_d, row_bytes, rows, k, q_d, nt, y_d, cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, qg, q_d, qbytes));
    CHECK(cuda_copy_to_host(g_dev, y, y_d, (size_t)nt * rows * sizeof(float)));
    if (memcmp(qg, q, (size_t)(nt * k)) || memcmp(qg + nt * k, d, (size_t)(nt * nb) * 4))
        fail_msg("q8x quantize k %lld n_tok %lld: bytes differ from the host's", (long long)k,
                 (long long)nt);

    double worst = 0;
    for (int64_t t = 0; t < nt; t++)
        for (int64_t i = 0; i < rows; i++) {
            double ref = 0, mag = 0, mag_lbx = 0;
            for (int64_t j = 0; j < k; j++) {
                const double xj = (double)d[t * nb + j / 32] * q[t * k + j];
                const double p = (double)wd[i * k + j] * xj;
                ref += p;
                mag += fabs(p);
                if (lbx)
                    mag_lbx += (fabs(wd[i * k + j]) + 2 * lbx_min_abs(type, w + i * row_bytes, j)) *
                               fabs(xj);
            }
            /* q4_K: a sub-block's d sc Σ q x_q - dmin m Σ x_q cancels as the dequantized
               weights do, so the f32 path's (k + 2) u bound.
               Low-bit (mmvq_lbx.cuh): per unit the integer sums are exact; d_0 S_0, d_1 S_1,
               the two m_h X_h terms and the scale by d_x round 5 times, each within u of a
               partial sum bounded by M_unit = Σ (|d_h q| + |m_h|) |x̂|; a lane adds its
               units in sequence, the warp (5 levels) and the k split (2 levels) add the
               lanes: nb + 7 more roundings at most; the reference's weights carry one
               rounding of d_h q - m_h. So |err| <= (nb + 13) u M with M = Σ M_unit <=
               Σ (|w| + 2 |m_h|) |x̂| (|d_h q| <= |w| + |m_h|). */
            const double tol = (lbx ? (double)(nb + 13) * U32 * mag_lbx
                                    : (double)(type == TM_TYPE_Q4_K ? k + 2 : nb + 2) * U32 * mag) +
                               1e-30;
            const double err = fabs((double)y[t * rows + i] - ref);
            if (!(err <= tol))
                fail_msg("mmvq_q8x %s rows %lld k %lld n_tok %lld pad %zu: y[%lld][%lld] = %.9g, "
                         "ref %.9g, tol %.3g",
                         quant_type_name(type), (long long)rows, (long long)k, (long long)nt,
                         c->pad, (long long)t, (long long)i, y[t * rows + i], ref, tol);
            worst = fmax(worst, err / tol);
        }
    free(w), free(wd), free(x), free(q), free(qg), free(d), free(y);
    return worst;
}

static void test_mmvq_q8x(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0x8bad);
    /* k: one step, steps with a partial last one (2816 = 5.5 steps), the model's widths */
    static const mmvq_case cases[] = {
        {1, 64, 1, 0},      {7, 768, 3, 0},     {33, 2048, 8, 0}, {4096, 2816, 1, 0},
        {5120, 2048, 1, 0}, {2048, 4096, 2, 4}, {33, 2816, 5, 8}, {1000, 512, 8, 0},
    };
    double worst = 0;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
        worst = fmax(worst, mmvq_q8x_case(&r, TM_TYPE_Q8_0, &cases[ci]));
    printf("mmvq_q8x q8_0: %zu cases ok, quantizer bit-exact, worst |err|/tol %.3g\n",
           sizeof(cases) / sizeof(cases[0]), worst);
    /* q4_K (the grouped experts' 8-bit path): whole blocks, rows 16-byte aligned */
    static const mmvq_case q4k[] = {
        {1, 256, 1, 0},      {7, 768, 3, 0},    {33, 2048, 8, 0},  {4096, 2816, 1, 0},
        {2048, 4096, 2, 16}, {33, 2816, 5, 16}, {1000, 512, 8, 0}, {64, 768, 4, 32},
    };
    worst = 0;
    for (size_t ci = 0; ci < sizeof(q4k) / sizeof(q4k[0]); ci++)
        worst = fmax(worst, mmvq_q8x_case(&r, TM_TYPE_Q4_K, &q4k[ci]));
    printf("mmvq_q8x q4_K: %zu cases ok, worst |err|/tol %.3g\n", sizeof(q4k) / sizeof(q4k[0]),
           worst);
    /* the low-bit types: whole blocks, rows at every alignment their blocks allow (pad 2:
       odd rows 2 mod 4 where the block size is 2 mod 4), k with a partial last step of 32
       units, every k split (4096 and 8192 rows: 2 and 1 warps a row group), 1 to 8 tokens */
    for (size_t ti = 0; ti < CHECK_N_TYPES; ti++) {
        const tm_type type = check_types[ti];
        if (!cuda_lbx_type(type)) continue;
        const tm_type_traits *tr = quant_type_traits((uint32_t)type);
        const size_t pad = tr->type_size % 4 ? 2 : 4;
        const mmvq_case c256[] = {
            {1, 256, 1, 0},    {7, 768, 2, pad},   {33, 2816, 5, 0},    {1000, 2048, 8, pad},
            {64, 512, 1, pad}, {4096, 1024, 2, 0}, {8192, 256, 1, pad}, {5, 3072, 8, 0},
        };
        const mmvq_case c32[] = {
            {1, 32, 1, 0},     {7, 96, 2, pad},    {33, 1056, 5, 0},   {1000, 2048, 8, pad},
            {64, 160, 1, pad}, {4096, 1024, 2, 0}, {8192, 64, 1, pad}, {5, 1120, 8, 0},
        };
        const mmvq_case *cs = tr->block_size == 256 ? c256 : c32;
        worst = 0;
        for (size_t ci = 0; ci < sizeof(c256) / sizeof(c256[0]); ci++)
            worst = fmax(worst, mmvq_q8x_case(&r, type, &cs[ci]));
        printf("mmvq_q8x %-7s: %zu cases ok, worst |err|/tol %.3g\n", quant_type_name(type),
               sizeof(c256) / sizeof(c256[0]), worst);
        assert_false(cuda_mmvq_q8x_ok(type, 4 * tr->type_size, 3 * tr->block_size / 2)); /* part */
        assert_true(cuda_mmvq_q8x_ok(type, 2 * pad, tr->block_size));
        assert_int_equal(cuda_mmvq_q8x_ok(type, 2, tr->block_size), tr->type_size % 4 != 0);
    }
    /* what the integer kernel cannot read is refused */
    assert_false(cuda_mmvq_q8x_ok(TM_TYPE_Q8_0, 34 * 3, 96)); /* odd number of blocks */
    assert_false(cuda_mmvq_q8x_ok(TM_TYPE_Q8_0, 2, 64));      /* rows 2-byte aligned */
    assert_true(cuda_mmvq_q8x_ok(TM_TYPE_Q4_K, 144, 256));    /* whole q4_K blocks, 16-aligned */
    assert_false(cuda_mmvq_q8x_ok(TM_TYPE_Q4_K, 152, 256));   /* rows 8-byte aligned */
    assert_false(cuda_mmvq_q8x_ok(TM_TYPE_Q4_K, 144, 128));   /* half a block */
    assert_int_equal(
        cuda_mmvq_q8x(TM_TYPE_Q4_K, NULL, 152, 1, 256, NULL, 1, NULL, cuda_device_stream(g_dev)),
        TM_ERR_ARG); /* rows 8-byte aligned */
    assert_int_equal(
        cuda_mmvq_q8x(TM_TYPE_Q8_0, NULL, 102, 1, 96, NULL, 1, NULL, cuda_device_stream(g_dev)),
        TM_ERR_ARG);
    assert_int_equal(cuda_q8x_quantize(NULL, 48, 1, NULL, cuda_device_stream(g_dev)), TM_ERR_ARG);
}

/* ---- grouped experts ---- */

typedef struct moe_case {
    int64_t n_embd, n_ff, n_tok;
    int32_t n_slots, k;
    tm_type tg, tu, td;
    bool oai; /* gpt-oss's experts: biases of expert ids other than the slots, clamped SwiGLU */
    bool q8x; /* 8-bit activations (q4_K experts): against a reference with x and h quantized */
} moe_case;

/* Double-precision reference for one matrix row · vector, and Σ|products|. */
static double dot_d(const float *w, const double *x, int64_t n, double *mag) {
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += w[i] * x[i];
        m += fabs(w[i] * x[i]);
    }
    *mag = m;
    return s;
}

static void moe_run_case(tm_rng *r, const moe_case *c) {
    const int64_t E = c->n_embd, F = c->n_ff, NT = c->n_tok, S = c->n_slots;
    float *gd, *ud, *dd;
    const size_t gb = quant_row_size(c->tg, E), ub = quant_row_size(c->tu, E),
                 db = quant_row_size(c->td, F);
    uint8_t *g = random_matrix(r, c->tg, S * F, E, gb, &gd);
    uint8_t *u = random_matrix(r, c->tu, S * F, E, ub, &ud);
    uint8_t *d = random_matrix(r, c->td, S * E, F, db, &dd);
    float *x = xmalloc((size_t)NT * E * sizeof(float)),
          *y0 = xmalloc((size_t)NT * E * sizeof(float));
    float *y = xmalloc((size_t)NT * E * sizeof(float));
    fill_normal(r, x, NT * E, 1.0f);
    fill_normal(r, y0, NT * E, 1.0f); /* y is accumulated into, not overwritten */
    /* gpt-oss: biases for 2S experts, slot e holding expert 2S - 1 - e; biases of a
       size that makes the clamps bite now and then */
    const int64_t NX = c->oai ? 2 * S : 0;
    check_oai_biases bias = {0};
    if (c->oai) bias = check_oai_biases_make(r, NX, F, E);

    /* items: k distinct experts per token, expert-major like a prompt worklist
     * when n_tok > 1, plus one item with an out-of-range slot that must be skipped */
    const int64_t n_items = NT * c->k + 1;
    tm_cuda_moe_item *items = xmalloc((size_t)n_items * sizeof(*items));
    int64_t n = 0;
    for (int64_t t = 0; t < NT; t++) {
        int32_t chosen[64];
        for (int32_t j = 0; j < c->k; j++) {
            int32_t e, dup;
            do {
                e = (int32_t)(tm_rng_u64(r) % (uint64_t)S);
                dup = 0;
                for (int32_t q = 0; q < j; q++) dup |= chosen[q] == e;
            } while (dup);
            chosen[j] = e;
            items[n].slot = e, items[n].token = (int32_t)t, items[n].weight = tm_rng_f32(r);
            items[n].expert = c->oai ? (int32_t)(2 * S - 1 - e) : e;
            n++;
        }
    }
    items[n].slot = (int32_t)S, items[n].token = 0, items[n].weight = 1.0f, items[n].expert = 0;
    n++;

    cuda_pool_reset(g_pool);
    tm_cuda_moe_params p;
    memset(&p, 0, sizeof(p));
    p.n_embd = E, p.n_ff = F, p.n_slots = (int32_t)S;
    p.gate.data = dev_upload(g, (size_t)S * F * gb), p.gate.type = c->tg, p.gate.row_bytes = gb;
    p.gate.expert_stride = F * gb;
    p.up.data = dev_upload(u, (size_t)S * F * ub), p.up.type = c->tu, p.up.row_bytes = ub;
    p.up.expert_stride = F * ub;
    p.down.data = dev_upload(d, (size_t)S * E * db), p.down.type = c->td, p.down.row_bytes = db;
    p.down.expert_stride = E * db;
    if (c->oai) p.ext = check_oai_ext(&bias, F, E);
    p.q8x = c->q8x;
    const tm_cuda_moe_item *items_d = dev_upload(items, (size_t)n_items * sizeof(*items));
    const float *x_d = dev_upload(x, (size_t)NT * E * sizeof(float));
    float *y_d = dev_upload(y0, (size_t)NT * E * sizeof(float));
    float *h_d = dev_alloc((size_t)cuda_moe_scratch_floats(&p, n_items) * sizeof(float));
    CHECK(cuda_fill_bytes(g_dev, h_d, 0xff,
                          (size_t)cuda_moe_scratch_floats(&p, n_items) * sizeof(float)));
    CHECK(cuda_moe_grouped(&p, items_d, n_items, x_d, NT, y_d, h_d, cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, y, y_d, (size_t)NT * E * sizeof(float)));

    /* reference with a first-order error bound per output (see the top comment):
     * gate/up dots within γ_E Σ|.|, h's error carried through down, down's own
     * γ_F, and one rounding per atomic add into y. */
    double *ref = xmalloc((size_t)NT * E * sizeof(double)),
           *tol = xmalloc((size_t)NT * E * sizeof(double));
    double *xd = xmalloc((size_t)E * sizeof(double)), *h = xmalloc((size_t)F * sizeof(double));
    double *dh = xmalloc((size_t)F * sizeof(double));
    /* q8x: the activations as the GPU quantizes them (bit for bit), h quantized from
       the reference's own (rounded to float as the GPU's is); each where its kernel takes
       8-bit activations (gate/up: gate and up of one type it reads; down: its type) */
    const bool qgu = cuda_moe_q8x_gate_up(&p, n_items, NT), qd = cuda_moe_q8x_down(&p, n_items, NT);
    int8_t *xq = xmalloc((size_t)(NT * E + F)), *hq = xq + NT * E;
    float *xs = xmalloc((size_t)(NT * E + F) / 32 * sizeof(float)), *hs = xs + NT * E / 32;
    float *hf = xmalloc((size_t)F * sizeof(float));
    if (qgu) quant_ref_quantize_q8x(x, NT * E, xq, xs);
    for (int64_t i = 0; i < NT * E; i++) ref[i] = y0[i], tol[i] = U32 * fabs(y0[i]);
    const double gE = (double)(E + 2) * U32, gF = (double)(F + 2) * U32;
    for (int64_t it = 0; it < n_items - 1; it++) {
        const int64_t e = items[it].slot, t = items[it].token, id = items[it].expert;
        const double wt = items[it].weight;
        for (int64_t j = 0; j < E; j++)
            xd[j] = qgu ? (double)xs[(t * E + j) / 32] * xq[t * E + j] : x[t * E + j];
        for (int64_t f = 0; f < F; f++) {
            double mg, mu;
            double gv = dot_d(gd + (e * F + f) * E, xd, E, &mg);
            double uv = dot_d(ud + (e * F + f) * E, xd, E, &mu);
            if (c->oai) {
                /* the bias add rounds once more: inside γ_E Σ|.| with Σ|.| grown by |b| */
                gv += bias.gate[id * F + f], uv += bias.up[id * F + f];
                mg += fabs(bias.gate[id * F + f]), mu += fabs(bias.up[id * F + f]);
                double dg, du;
                h[f] = check_swiglu_oai(gv, uv, &dg, &du);
                dh[f] = gE * (dg * mg + du * mu) + 6 * U32 * fabs(h[f]);
            } else {
                const double sg = gv / (1.0 + exp(-gv));
                h[f] = sg * uv;
                /* |d silu/dg| <= 1.1, |silu(g)| <= |g| */
                dh[f] = gE * (1.1 * mg * fabs(uv) + fabs(gv) * mu) + 4 * U32 * fabs(h[f]);
            }
        }
        if (qd) {
            for (int64_t f = 0; f < F; f++) hf[f] = (float)h[f];
            quant_ref_quantize_q8x(hf, F, hq, hs);
            for (int64_t f = 0; f < F; f++) h[f] = (double)hs[f / 32] * hq[f];
        }
        for (int64_t o = 0; o < E; o++) {
            double mag, carried = 0;
            const float *dr = dd + (e * E + o) * F;
            double out = dot_d(dr, h, F, &mag);
            if (c->oai) out += bias.down[id * E + o], mag += fabs(bias.down[id * E + o]);
            for (int64_t f = 0; f < F; f++) carried += fabs(dr[f]) * dh[f];
            ref[t * E + o] += wt * out;
            tol[t * E + o] +=
                fabs(wt) * (gF * mag + carried) + U32 * (fabs(ref[t * E + o]) + fabs(wt * out));
        }
    }
    double worst = 0;
    if (c->q8x) { /* float rounding, and an h value the rounding moved across a quantization
                     step now and then: the sums against the reference's, in L2 */
        double e2 = 0, r2 = 0;
        for (int64_t i = 0; i < NT * E; i++)
            e2 += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]),
                r2 += (ref[i] - y0[i]) * (ref[i] - y0[i]);
        worst = sqrt(e2 / r2) / 1e-3;
        if (!(worst <= 1))
            fail_msg("moe %s/%s/%s q8x embd %lld ff %lld tok %lld: |err|/|sum| = %.3g (want "
                     "< 1e-3)",
                     quant_type_name(c->tg), quant_type_name(c->tu), quant_type_name(c->td),
                     (long long)E, (long long)F, (long long)NT, sqrt(e2 / r2));
    }
    for (int64_t i = 0; i < NT * E && !c->q8x; i++) {
        const double err = fabs((double)y[i] - ref[i]),
                     lim = 2 * tol[i] + 1e-30; /* 2x: first-order bound */
        worst = fmax(worst, err / lim);
        if (!(err <= lim))
            fail_msg("moe %s/%s/%s embd %lld ff %lld tok %lld: y[%lld] = %.9g, ref %.9g, tol %.3g",
                     quant_type_name(c->tg), quant_type_name(c->tu), quant_type_name(c->td),
                     (long long)E, (long long)F, (long long)NT, (long long)i, y[i], ref[i], lim);
    }
    printf("moe %s/%s/%s n_embd %lld n_ff %lld%s%s: %lld tokens x %d experts ok, worst "
           "|err|/tol %.3g\n",
           quant_type_name(c->tg), quant_type_name(c->tu), quant_type_name(c->td), (long long)E,
           (long long)F, c->oai ? " (biases, clamped SwiGLU)" : "",
           c->q8x ? " (8-bit activations)" : "", (long long)NT, c->k, worst);
    free(g), free(u), free(d), free(gd), free(ud), free(dd), free(x), free(y0), free(y),
        free(items);
    check_oai_biases_free(&bias);
    free(ref), free(tol), free(xd), free(h), free(dh), free(xq), free(xs), free(hf);
}

static void test_moe_grouped(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0xe4e4);
    static const moe_case cases[] = {
        /* the decode shape of Qwen3-30B-A3B: 1 token x 8 experts, 2048 x 768 */
        {2048, 768, 1, 16, 8, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q6_K, false, false},
        /* a small prompt, expert-major items, mixed types */
        {512, 96, 5, 12, 4, TM_TYPE_Q8_0, TM_TYPE_Q4_0, TM_TYPE_Q8_0, false, false},
        {256, 64, 3, 6, 2, TM_TYPE_MXFP4, TM_TYPE_MXFP4, TM_TYPE_F16, false, false},
        /* gpt-oss's experts (mxfp4, n_embd = n_ff = 2880) scaled down: 18 and 22
         * blocks, rows 2 mod 4 bytes long; decode (1 token x 4 experts) and a few
         * tokens; then mxfp4 gate beside a q8_0 up (the generic gate/up kernel) */
        {576, 704, 1, 8, 4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, false, false},
        {704, 576, 3, 6, 2, TM_TYPE_MXFP4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, false, false},
        {96, 160, 2, 4, 2, TM_TYPE_MXFP4, TM_TYPE_Q8_0, TM_TYPE_MXFP4, false, false},
        {256, 256, 2, 4, 4, TM_TYPE_Q5_K, TM_TYPE_BF16, TM_TYPE_F32, false, false},
        /* gpt-oss: MXFP4 experts with biases and the clamped SwiGLU, decode and a prompt;
           and the fast path's types with the same epilogues */
        {576, 576, 1, 8, 4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, true, false},
        {576, 320, 6, 8, 4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, true, false},
        {512, 256, 2, 6, 3, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q8_0, true, false},
        /* decode of 8 sequences: items sharing a slot are computed by one block
           (runs of up to 4 tokens; 8 tokens x 7 of 12 slots: runs of 4 and the rest) */
        {1024, 512, 8, 12, 7, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q4_K, false, false},
        {576, 576, 8, 6, 4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, true, false},
        {512, 256, 5, 9, 3, TM_TYPE_Q8_0, TM_TYPE_Q8_0, TM_TYPE_F16, false, false},
        /* 8-bit activations: decode of one token and of 8 sequences, and the epilogues */
        {2048, 768, 1, 16, 8, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q4_K, false, true},
        {1024, 512, 8, 12, 7, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q4_K, false, true},
        {512, 256, 2, 6, 3, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q4_K, true, true},
        /* the low-bit types (generic kernels, dequant_lowbit.cuh): a dynamic mix's
           experts at decode, then every type in mixed triples, the epilogues too */
        {512, 256, 1, 8, 4, TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XXS, TM_TYPE_Q2_K, false, false},
        {256, 512, 3, 6, 2, TM_TYPE_IQ1_M, TM_TYPE_IQ1_S, TM_TYPE_IQ3_XXS, false, false},
        {256, 256, 2, 4, 2, TM_TYPE_Q3_K, TM_TYPE_IQ4_XS, TM_TYPE_Q4_1, false, false},
        {512, 256, 2, 4, 2, TM_TYPE_IQ2_XS, TM_TYPE_IQ2_S, TM_TYPE_IQ3_S, false, false},
        {256, 256, 2, 4, 2, TM_TYPE_TQ1_0, TM_TYPE_TQ2_0, TM_TYPE_Q5_0, false, false},
        {96, 160, 2, 4, 2, TM_TYPE_Q5_1, TM_TYPE_IQ4_NL, TM_TYPE_Q4_1, false, false},
        {256, 512, 1, 6, 3, TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XXS, TM_TYPE_IQ1_M, true, false},
        /* the low-bit types with 8-bit activations: decode of one token and of 8
           sequences, the epilogues; mixed layers: gate/up and down of different types,
           an up unlike gate (gate/up on f32, down 8-bit), a down without an 8-bit path */
        {512, 256, 1, 8, 4, TM_TYPE_Q2_K, TM_TYPE_Q2_K, TM_TYPE_Q3_K, false, true},
        {768, 512, 8, 12, 7, TM_TYPE_IQ4_XS, TM_TYPE_IQ4_XS, TM_TYPE_Q2_K, false, true},
        {512, 256, 2, 6, 3, TM_TYPE_Q3_K, TM_TYPE_Q3_K, TM_TYPE_IQ4_XS, true, true},
        {256, 256, 2, 4, 2, TM_TYPE_Q3_K, TM_TYPE_IQ4_XS, TM_TYPE_Q3_K, false, true},
        {256, 512, 3, 6, 2, TM_TYPE_Q2_K, TM_TYPE_Q2_K, TM_TYPE_Q6_K, false, true},
        {512, 256, 1, 8, 4, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q2_K, false, true},
        /* the grid i-quants with 8-bit activations (lbx_unit_iq.cuh): a dynamic mix's
           experts at decode, every type, 8 sequences, the epilogues */
        {512, 256, 1, 8, 4, TM_TYPE_IQ1_M, TM_TYPE_IQ1_M, TM_TYPE_IQ2_XXS, false, true},
        {768, 512, 8, 12, 7, TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XXS, TM_TYPE_IQ3_XXS, false, true},
        {512, 256, 2, 6, 3, TM_TYPE_IQ2_XS, TM_TYPE_IQ2_XS, TM_TYPE_IQ3_S, true, true},
        {256, 512, 3, 6, 2, TM_TYPE_IQ2_S, TM_TYPE_IQ2_S, TM_TYPE_IQ1_S, false, true},
        {256, 256, 2, 4, 2, TM_TYPE_IQ3_S, TM_TYPE_IQ1_S, TM_TYPE_IQ2_S, false, true},
        {512, 256, 1, 8, 4, TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XXS, TM_TYPE_IQ3_S, false, true},
        {256, 512, 3, 6, 2, TM_TYPE_IQ1_M, TM_TYPE_IQ1_M, TM_TYPE_IQ2_S, false, true},
        {256, 256, 2, 4, 2, TM_TYPE_IQ2_XS, TM_TYPE_IQ2_XS, TM_TYPE_IQ1_S, false, true},
        {512, 256, 2, 6, 3, TM_TYPE_IQ3_XXS, TM_TYPE_IQ3_XXS, TM_TYPE_TQ1_0, true, true},
        {96, 160, 2, 4, 2, TM_TYPE_Q5_1, TM_TYPE_Q5_1, TM_TYPE_Q4_1, false, true},
        {256, 256, 2, 4, 2, TM_TYPE_TQ2_0, TM_TYPE_TQ2_0, TM_TYPE_Q5_0, false, true},
        {160, 96, 1, 4, 2, TM_TYPE_IQ4_NL, TM_TYPE_IQ4_NL, TM_TYPE_IQ4_NL, false, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) moe_run_case(&r, &cases[i]);
}

/* ---- router ---- */

/* Expert e's selection score (its score plus the selection bias). */
static double router_score(tm_moe_gating g, const float *l, int64_t E, int32_t e,
                           const float *bias) {
    const double b = bias ? bias[e] : 0.0;
    if (g == TM_MOE_GATING_SIGMOID) return 1.0 / (1.0 + exp(-(double)l[e])) + b;
    if (g == TM_MOE_GATING_SOFTMAX_TOPK) return l[e] + b;
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < E; i++) m = fmax(m, l[i]);
    for (int64_t i = 0; i < E; i++) s += exp((double)l[i] - m);
    return exp((double)l[e] - m) / s + b;
}

static void test_router(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0x7007);
    static const int32_t E_list[] = {8, 60, 128, 257, 512};
    static const int32_t K_list[] = {1, 2, 8, 32};
    static const int64_t T_list[] = {1, 7, 33};
    int n_cases = 0, n_near_ties = 0;
    for (size_t ei = 0; ei < 5; ei++)
        for (size_t ki = 0; ki < 4; ki++)
            for (int gating = 0; gating < 3; gating++) {
                const int32_t E = E_list[ei], K = K_list[ki];
                const int64_t T = T_list[(ei + ki + (size_t)gating) % 3];
                if (K > E) continue;
                /* every other case a selection bias, and where the experts split in 4 groups
                 * with room for k in 2 of them, those (DeepSeek-V3's and GLM-4.5's routing) */
                float *bias = NULL;
                const bool grouped = E % 4 == 0 && K <= E / 2 && (ei + (size_t)gating) % 2 == 0;
                if ((ei + ki) % 2 == 0 || grouped) {
                    bias = xmalloc((size_t)E * sizeof(float));
                    fill_normal(&r, bias, E, 0.1f);
                }
                const tm_moe_router_params cp = {.gating = (tm_moe_gating)gating,
                                                 .n_expert = (uint32_t)E,
                                                 .n_used = (uint32_t)K,
                                                 .norm_topk = (gating + (int)ki) % 2 == 0,
                                                 .scale = ki == 3 ? 2.5f : 1.0f,
                                                 .n_group = grouped ? 4 : 0,
                                                 .n_group_used = grouped ? 2 : 0,
                                                 .sel_bias = bias};
                /* every other case maps ids through a slot table (a VRAM cache: some
                 * experts at shuffled slots, the rest -1) */
                int32_t *map = NULL, *map_d = NULL;
                if ((ki + (size_t)gating) % 2) {
                    map = xmalloc((size_t)E * sizeof(int32_t));
                    for (int32_t e = 0; e < E; e++)
                        map[e] = tm_rng_u64(&r) % 3 ? (int32_t)(tm_rng_u64(&r) % 1000) : -1;
                }
                tm_cuda_router_params gp = {.gating = (tm_cuda_gating)gating,
                                            .n_expert = E,
                                            .n_used = K,
                                            .norm_topk = cp.norm_topk,
                                            .scale = cp.scale,
                                            .n_group = (int32_t)cp.n_group,
                                            .n_group_used = (int32_t)cp.n_group_used};
                float *l = xmalloc((size_t)T * E * sizeof(float));
                fill_normal(&r, l, T * E, 2.0f);
                /* exact ties: both sides must prefer the lower id */
                for (int64_t t = 0; t < T; t++)
                    l[t * E + E - 1] = l[t * E + E / 2] = l[t * E] = 4.0f;
                int32_t *ids = xmalloc((size_t)T * K * sizeof(int32_t)),
                        *gids = xmalloc((size_t)T * K * sizeof(int32_t));
                float *w = xmalloc((size_t)T * K * sizeof(float)),
                      *gw = xmalloc((size_t)T * K * sizeof(float));
                moe_router_select(NULL, &cp, l, T, ids, w);

                cuda_pool_reset(g_pool);
                const float *l_d = dev_upload(l, (size_t)T * E * sizeof(float));
                if (bias) gp.sel_bias = dev_upload(bias, (size_t)E * sizeof(float));
                int32_t *ids_d = dev_alloc((size_t)T * K * sizeof(int32_t));
                float *w_d = dev_alloc((size_t)T * K * sizeof(float));
                CHECK(cuda_fill_bytes(g_dev, ids_d, 0xff, (size_t)T * K * sizeof(int32_t)));
                CHECK(cuda_fill_bytes(g_dev, w_d, 0xff, (size_t)T * K * sizeof(float)));
                tm_cuda_moe_item *it_d = dev_alloc((size_t)T * K * sizeof(tm_cuda_moe_item));
                tm_cuda_moe_item *its = xmalloc((size_t)T * K * sizeof(tm_cuda_moe_item));
                tm_cuda_moe_item *mits = xmalloc((size_t)T * K * sizeof(tm_cuda_moe_item));
                tm_cuda_moe_item *fits = xmalloc((size_t)T * K * sizeof(tm_cuda_moe_item));
                /* and, every other mapped case, a fetch buffer holding some cold experts */
                int32_t *fmap = NULL;
                if (map && ei % 2 == 0) {
                    fmap = xmalloc((size_t)E * sizeof(int32_t));
                    for (int32_t e = 0; e < E; e++)
                        fmap[e] =
                            map[e] < 0 && tm_rng_u64(&r) % 2 ? (int32_t)(tm_rng_u64(&r) % 16) : -1;
                    gp.fetch_map = dev_upload(fmap, (size_t)E * sizeof(int32_t));
                    gp.fetched = dev_alloc((size_t)T * K * sizeof(tm_cuda_moe_item));
                }
                if (map) { /* and the PCIe lane's list: the first n_mapped cold slots a token */
                    gp.slot_map = map_d = dev_upload(map, (size_t)E * sizeof(int32_t));
                    gp.mapped = dev_alloc((size_t)T * K * sizeof(tm_cuda_moe_item));
                    gp.n_mapped = (int32_t)((ei + ki) % 4) + (gating == 2 ? K : 0);
                    gp.mapped_share_q8 = gating == 2 ? 85 : 0; /* or a third of the cold */
                }
                CHECK(cuda_router_select(&gp, l_d, T, ids_d, w_d, it_d, cuda_device_stream(g_dev)));
                CHECK(cuda_device_sync(g_dev));
                CHECK(cuda_copy_to_host(g_dev, gids, ids_d, (size_t)T * K * sizeof(int32_t)));
                CHECK(cuda_copy_to_host(g_dev, gw, w_d, (size_t)T * K * sizeof(float)));
                CHECK(cuda_copy_to_host(g_dev, its, it_d, (size_t)T * K * sizeof(*its)));
                if (map)
                    CHECK(cuda_copy_to_host(g_dev, mits, gp.mapped, (size_t)T * K * sizeof(*mits)));
                if (fmap)
                    CHECK(
                        cuda_copy_to_host(g_dev, fits, gp.fetched, (size_t)T * K * sizeof(*fits)));
                    /* cold: neither in a slot nor in the fetch buffer */
#define ROUTER_COLD(e) (map[e] < 0 && !(fmap && fmap[e] >= 0))
                for (int64_t i = 0; fmap && i < T * K; i++) {
                    const int32_t want = map[gids[i]] < 0 ? fmap[gids[i]] : -1;
                    if (fits[i].slot != want || fits[i].token != i / K || fits[i].weight != gw[i] ||
                        fits[i].expert != gids[i])
                        fail_msg("router fetched item %lld: {%d, %d, %g, %d}, want {%d, %lld, "
                                 "%g, %d}",
                                 (long long)i, fits[i].slot, fits[i].token, fits[i].weight,
                                 fits[i].expert, want, (long long)(i / K), gw[i], gids[i]);
                }
                for (int64_t t = 0; map && t < T; t++) {
                    int32_t cold = 0, n_cold = 0;
                    for (int32_t j = 0; j < K; j++) n_cold += ROUTER_COLD(gids[t * K + j]);
                    /* the token's count (test_calib checks it against every count) */
                    const int32_t limit =
                        tm_cuda_mapped_count(n_cold, gp.n_mapped, gp.mapped_share_q8);
                    for (int32_t j = 0; j < K; j++) {
                        const int64_t i = t * K + j;
                        const bool is_cold = ROUTER_COLD(gids[i]);
                        const int32_t want = is_cold && cold++ < limit ? gids[i] : -1;
                        if (mits[i].slot != want || mits[i].token != t || mits[i].weight != gw[i] ||
                            mits[i].expert != gids[i])
                            fail_msg("router mapped item %lld (n_mapped %d): {%d, %d, %g, %d}, "
                                     "want {%d, %lld, %g, %d}",
                                     (long long)i, gp.n_mapped, mits[i].slot, mits[i].token,
                                     mits[i].weight, mits[i].expert, want, (long long)t, gw[i],
                                     gids[i]);
                    }
                }
                for (int64_t i = 0; i < T * K; i++) { /* the work items restate the top-k */
                    const int32_t slot = map ? map[gids[i]] : gids[i];
                    if (its[i].slot != slot || its[i].token != i / K || its[i].weight != gw[i] ||
                        its[i].expert != gids[i])
                        fail_msg("router item %lld: {%d, %d, %g, %d}, want {%d, %lld, %g, %d}",
                                 (long long)i, its[i].slot, its[i].token, its[i].weight,
                                 its[i].expert, slot, (long long)(i / K), gw[i], gids[i]);
                }
#undef ROUTER_COLD
                (void)map_d;
                free(its), free(mits), free(fits), free(map), free(fmap);
                for (int64_t t = 0; t < T; t++) {
                    int tie = 0;
                    for (int32_t j = 0; j < K && !tie; j++) {
                        const int32_t a = ids[t * K + j], b = gids[t * K + j];
                        assert_true(b >= 0 && b < E);
                        if (a != b) {
                            /* a near tie may swap; the order after it is then not comparable */
                            const double sa = router_score(cp.gating, l + t * E, E, a, bias);
                            const double sb = router_score(cp.gating, l + t * E, E, b, bias);
                            if (!(fabs(sa - sb) <= 1e-5 * fabs(sa) + 1e-12))
                                fail_msg("router E %d k %d gating %d token %lld pos %d: cpu id %d "
                                         "(%.9g), gpu id %d (%.9g)",
                                         E, K, gating, (long long)t, j, a, sa, b, sb);
                            tie = 1, n_near_ties++;
                            break;
                        }
                        /* expf on the GPU is within 2 ulp; sums in float: 1e-5 relative */
                        const double wa = w[t * K + j], wb = gw[t * K + j];
                        if (!(fabs(wa - wb) <= 1e-5 * fabs(wa) + 1e-7))
                            fail_msg("router E %d k %d gating %d token %lld pos %d: cpu w %.9g gpu "
                                     "w %.9g",
                                     E, K, gating, (long long)t, j, wa, wb);
                    }
                }
                n_cases++;
                free(l), free(ids), free(gids), free(w), free(gw), free(bias);
            }
    printf("router: %d cases ok (%d near ties)\n", n_cases, n_near_ties);
}

/* ---- RMSNorm, RoPE, add ---- */

static void test_norm_rope_add(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0x2020);
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    /* n: odd (scalar path), float4 rows kept in registers (128, 2048, 8192), a
     * multiple of 4 too long for registers (12288) */
    static const int64_t rows_l[] = {1, 3, 17}, n_l[] = {7, 128, 2048, 4097, 8192, 12288};
    for (int ri = 0; ri < 3; ri++)
        for (int ni = 0; ni < 6; ni++)
            /* 0: gain, out of place; 1: no gain, in place; 2: x += a, then the norm */
            for (int variant = 0; variant < 3; variant++) {
                const int64_t R = rows_l[ri], N = n_l[ni];
                float *x = xmalloc((size_t)R * N * 4), *wt = xmalloc((size_t)N * 4),
                      *y = xmalloc((size_t)R * N * 4), *a = xmalloc((size_t)R * N * 4);
                float *ref = xmalloc((size_t)R * N * 4);
                fill_normal(&r, x, R * N, 3.0f);
                fill_normal(&r, a, R * N, 3.0f);
                fill_normal(&r, wt, N, 1.0f);
                cuda_pool_reset(g_pool);
                float *x_d = dev_upload(x, (size_t)R * N * 4), *w_d = dev_upload(wt, (size_t)N * 4);
                float *a_d = dev_upload(a, (size_t)R * N * 4);
                if (variant == 2)
                    for (int64_t i = 0; i < R * N; i++) x[i] += a[i];
                for (int64_t i = 0; i < R; i++)
                    cpu_rmsnorm(ref + i * N, x + i * N, variant == 1 ? NULL : wt, N, 1e-6f);
                float *y_d = variant == 1 ? x_d : dev_alloc((size_t)R * N * 4);
                if (variant != 1) CHECK(cuda_fill_bytes(g_dev, y_d, 0xff, (size_t)R * N * 4));
                if (variant == 2)
                    CHECK(cuda_add_rmsnorm(x_d, a_d, y_d, w_d, R, N, 1e-6f, s));
                else
                    CHECK(cuda_rmsnorm(y_d, x_d, variant ? NULL : w_d, R, N, 1e-6f, s));
                CHECK(cuda_device_sync(g_dev));
                CHECK(cuda_copy_to_host(g_dev, y, y_d, (size_t)R * N * 4));
                /* both sides sum N squares in float: the scale is within (N + 8) u */
                for (int64_t i = 0; i < R * N; i++)
                    if (!(fabs(y[i] - ref[i]) <= (double)(N + 8) * U32 * fabs(ref[i]) + 1e-30))
                        fail_msg("rmsnorm %lld x %lld variant %d: y[%lld] = %.9g, cpu %.9g",
                                 (long long)R, (long long)N, variant, (long long)i, y[i], ref[i]);
                if (variant == 2) { /* the residual itself: one float add, exact match */
                    CHECK(cuda_copy_to_host(g_dev, y, x_d, (size_t)R * N * 4));
                    for (int64_t i = 0; i < R * N; i++)
                        if (y[i] != x[i])
                            fail_msg("add_rmsnorm %lld x %lld: x[%lld] = %.9g, want %.9g",
                                     (long long)R, (long long)N, (long long)i, y[i], x[i]);
                }
                free(x), free(wt), free(y), free(a), free(ref);
            }
    static const int64_t heads_l[] = {1, 4, 32}, hd_l[] = {2, 64, 128};
    for (int hi = 0; hi < 3; hi++)
        for (int di = 0; di < 3; di++) {
            const int64_t T = 1 + (hi + di) % 5, H = heads_l[hi], D = hd_l[di];
            int32_t *pos = xmalloc((size_t)T * 4);
            for (int64_t t = 0; t < T; t++) pos[t] = t == 0 ? 0 : (int32_t)(tm_rng_u64(&r) % 40000);
            float *x = xmalloc((size_t)T * H * D * 4), *y = xmalloc((size_t)T * H * D * 4);
            float *ref = xmalloc((size_t)T * H * D * 4), *ct = xmalloc((size_t)D * 2),
                  *st = xmalloc((size_t)D * 2);
            fill_normal(&r, x, T * H * D, 1.0f);
            memcpy(ref, x, (size_t)T * H * D * 4);
            for (int64_t t = 0; t < T; t++) {
                cpu_rope_table(ct, st, D, pos[t], 1000000.0f);
                for (int64_t h = 0; h < H; h++)
                    cpu_rope_neox_table(ref + (t * H + h) * D, D, ct, st);
            }
            cuda_pool_reset(g_pool);
            float *x_d = dev_upload(x, (size_t)T * H * D * 4);
            const int32_t *pos_d = dev_upload(pos, (size_t)T * 4);
            CHECK(cuda_rope_neox(x_d, pos_d, T, H, D, 1000000.0f, s));
            CHECK(cuda_device_sync(g_dev));
            CHECK(cuda_copy_to_host(g_dev, y, x_d, (size_t)T * H * D * 4));
            for (int64_t t = 0; t < T; t++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < D; i++) {
                        const int64_t b = (t * H + h) * D, j = i < D / 2 ? i + D / 2 : i - D / 2;
                        /* cos/sin to float agree within 1 ulp, plus an FMA in the rotation */
                        const double lim = 6 * U32 * (fabs(x[b + i]) + fabs(x[b + j])) + 1e-30;
                        if (!(fabs(y[b + i] - ref[b + i]) <= lim))
                            fail_msg("rope T %lld H %lld D %lld pos %d: x[%lld] = %.9g, cpu %.9g",
                                     (long long)T, (long long)H, (long long)D, pos[t],
                                     (long long)(b + i), y[b + i], ref[b + i]);
                    }
            free(pos), free(x), free(y), free(ref), free(ct), free(st);
        }
    {
        const int64_t N = 100003; /* odd, several grid-stride rounds' worth */
        float *a = xmalloc(N * 4), *b = xmalloc(N * 4), *y = xmalloc(N * 4);
        fill_normal(&r, a, N, 1.0f);
        fill_normal(&r, b, N, 1.0f);
        cuda_pool_reset(g_pool);
        float *a_d = dev_upload(a, N * 4), *b_d = dev_upload(b, N * 4);
        CHECK(cuda_add(a_d, a_d, b_d, N, s)); /* in place: the residual */
        CHECK(cuda_device_sync(g_dev));
        CHECK(cuda_copy_to_host(g_dev, y, a_d, N * 4));
        for (int64_t i = 0; i < N; i++) assert_true(y[i] == a[i] + b[i]);
        /* a bias over rows (gpt-oss's q/k/v/o and router biases): one float add each */
        const int64_t R = 37, B = N / R;
        CHECK(cuda_copy_to_device(g_dev, a_d, a, (size_t)(R * B) * 4));
        CHECK(cuda_add_bias(a_d, b_d, R, B, s));
        CHECK(cuda_device_sync(g_dev));
        CHECK(cuda_copy_to_host(g_dev, y, a_d, (size_t)(R * B) * 4));
        for (int64_t i = 0; i < R * B; i++) assert_true(y[i] == a[i] + b[i % B]);
        free(a), free(b), free(y);
    }
    printf("rmsnorm, rope, add, bias ok\n");
}

#include "test_cuda_bench.h"

#endif /* TM_HAVE_CUDA */

/* Exit code 77 tells CTest the test was skipped (no GPU here: CI compiles the CUDA code
 * but cannot run it). */
#define TEST_SKIPPED 77

int main(void) {
#ifdef TM_HAVE_CUDA
    tm_cuda_device *probe;
    if (cuda_device_open(0, &probe) != TM_OK) {
        printf("skipped: no CUDA device (%s)\n", tm_error_message());
        return TEST_SKIPPED;
    }
    cuda_device_close(probe);
    /* TM_CUDA_ONLY=pattern runs only the matching tests (compute-sanitizer runs) */
    const char *only = getenv("TM_CUDA_ONLY");
    if (only && *only) cmocka_set_test_filter(only);
    /* one line per op; the per-op checks live in tests/cuda/check_*.c */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mmvq),
        cmocka_unit_test(test_mmvq_q8x),
        cmocka_unit_test(test_moe_grouped),
        cmocka_unit_test(test_router),
        cmocka_unit_test(check_fetch_ahead),
        cmocka_unit_test(test_norm_rope_add),
        cmocka_unit_test(check_model),
        cmocka_unit_test(check_gemm),
        cmocka_unit_test(check_attention),
        cmocka_unit_test(check_attention_rows),
        cmocka_unit_test(check_dequant),
        cmocka_unit_test(check_lbx),
        cmocka_unit_test(check_ssm),
        cmocka_unit_test(check_ssm_gates),
        cmocka_unit_test(check_attn_partial_rope),
        cmocka_unit_test(check_mla),
        cmocka_unit_test(check_gpus),
    };
    int failed = _cmocka_run_group_tests("test_cuda_ops", tests, sizeof(tests) / sizeof(tests[0]),
                                         cuda_check_setup, cuda_check_teardown);
    /* the perf mode runs only when asked for */
    const char *bench = getenv("TM_CUDA_BENCH");
    if (bench && strcmp(bench, "0") != 0) {
        const struct CMUnitTest perf[] = {cmocka_unit_test(test_bench)};
        failed |= _cmocka_run_group_tests("test_cuda_bench", perf, 1, cuda_check_setup,
                                          cuda_check_teardown);
    }
    return failed;
#else
    printf("skipped: no CUDA device (built without CUDA)\n");
    return TEST_SKIPPED;
#endif
}
