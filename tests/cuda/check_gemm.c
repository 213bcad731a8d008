/* The prompt-path kernels (src/cuda/gemm.cu, moe_gemm.cu, moe_mma.cu)
 * against double-precision CPU references (their dequantization:
 * check_dequant.c).
 *
 *   gemm      cuda_gemm vs a double dot over the f16-rounded weights and x
 *             (f32 weights: over the exact weights and x, as cuda_gemm keeps
 *             them f32 for the router).
 *   moe_gemm  cuda_moe_grouped_gemm vs a double loop over an expert-major work
 *             list (f16 weights and x, h rounded to f16 as the kernel does),
 *             and vs cuda_moe_grouped (decode kernels: f32 x, exact weights)
 *             within the f16 rounding bound: two independent GPU paths.
 *   args      unsupported types, k off the block, a NULL handle, bad lists.
 *
 * Tolerance of a tensor-core dot of n products (f16 x f16 is exact in f32):
 *   |err| <= γT(n) Σ|w x|,  γT(n) = 4 (n + 2) u,  u = 2^-24.
 * (n + 2) u bounds f32 summation in any order (Higham's γ_n, with room for
 * the output conversion), so cuBLAS's split-K and reduction trees are
 * covered; the tensor cores' block FMAs align and truncate (round toward
 * zero: Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021),
 * which doubles u; the last 2x is margin (f32 weights: an FMA per product,
 * the same bound). Over all outputs of a gemm case the relative RMS error
 * must also stay under 2 (k + 2) u: a systematic error (bf16 instead of f16
 * inputs, or TF32 for f32 weights: 2^-9, 2^-11 per product) fails it, while
 * truncation bias (about k u / 12 relative) stays far under it. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UH (1.0 / 2048.0) /* f16 unit roundoff */

static double gamma_tc(int64_t n) {
    return 4.0 * (double)(n + 2) * U32;
}

static float half_round(float f) {
    return quant_f16_to_f32(check_half_bits(f));
}

static void round_f16(float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) v[i] = half_round(v[i]);
}

typedef struct shape {
    int64_t rows, k, n_tok;
    size_t pad; /* extra bytes per weight row */
} shape;

/* ---- dense products ---- */

/* Runs one case; returns the worst |err| / tol (<= 1). */
static double gemm_case(tm_rng *r, tm_cuda_blas *b, tm_type type, const shape *c) {
    const int64_t rows = c->rows, k = c->k, nt = c->n_tok;
    const size_t rb = check_row_stride(type, k, c->pad);
    float *wd;
    uint8_t *w = random_matrix(r, type, rows, k, rb, &wd);
    float *x = xmalloc((size_t)nt * k * 4), *xh = xmalloc((size_t)nt * k * 4);
    float *y = xmalloc((size_t)nt * rows * 4);
    fill_normal(r, x, nt * k, 1.0f);
    memcpy(xh, x, (size_t)nt * k * 4);
    if (type != TM_TYPE_F32) round_f16(wd, rows * k), round_f16(xh, nt * k);

    cuda_pool_reset(g_pool);
    const void *w_d = dev_upload(w, (size_t)rows * rb);
    const float *x_d = dev_upload(x, (size_t)nt * k * 4);
    float *y_d = dev_alloc((size_t)nt * rows * 4);
    const size_t sb = cuda_gemm_scratch_bytes(rows, k, nt);
    assert_true(sb > 0);
    void *scratch = dev_alloc(sb);
    CHECK(cuda_fill_bytes(g_dev, y_d, 0xff, (size_t)nt * rows * 4)); /* NaN poison */
    CHECK(cuda_fill_bytes(g_dev, scratch, 0xff, sb));
    CHECK(cuda_gemm(b, type, w_d, rb, rows, k, x_d, nt, y_d, scratch, cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, y, y_d, (size_t)nt * rows * 4));

    double worst = 0, e2 = 0, r2 = 0;
    for (int64_t t = 0; t < nt; t++)
        for (int64_t i = 0; i < rows; i++) {
            const float *wr = wd + i * k, *xr = xh + t * k;
            double ref = 0, mag = 0;
            for (int64_t j = 0; j < k; j++) {
                const double p = (double)wr[j] * xr[j];
                ref += p;
                mag += fabs(p);
            }
            const double tol = gamma_tc(k) * mag + 1e-30;
            const double err = fabs((double)y[t * rows + i] - ref);
            if (!(err <= tol))
                fail_msg("gemm %s rows %lld k %lld n_tok %lld pad %zu: y[%lld][%lld] = %.9g, ref "
                         "%.9g, tol %.3g",
                         quant_type_name(type), (long long)rows, (long long)k, (long long)nt,
                         c->pad, (long long)t, (long long)i, y[t * rows + i], ref, tol);
            worst = fmax(worst, err / tol);
            e2 += err * err;
            r2 += ref * ref;
        }
    /* systematic drift (see the top comment); over 64+ outputs, as one can be near 0 */
    if (rows * nt >= 64 && !(sqrt(e2 / r2) <= 2.0 * (double)(k + 2) * U32))
        fail_msg("gemm %s rows %lld k %lld n_tok %lld: RMS |err|/|ref| = %.3g > %.3g",
                 quant_type_name(type), (long long)rows, (long long)k, (long long)nt, sqrt(e2 / r2),
                 2.0 * (double)(k + 2) * U32);
    free(w), free(wd), free(x), free(xh), free(y);
    return worst;
}

static void check_gemm_types(tm_rng *r, tm_cuda_blas *b) {
    /* every rows in {1, 7, 96, 1000}, k in {256, 2048}, n_tok in {1, 9, 64, 300} appears */
    static const shape cases[] = {
        {1, 256, 1, 0},      {7, 2048, 9, 3},    {96, 256, 64, 0}, {1000, 2048, 9, 0},
        {1000, 256, 300, 5}, {96, 2048, 300, 0}, {7, 256, 300, 0}, {1, 2048, 9, 1},
        {1000, 256, 1, 0},   {7, 2048, 64, 2},
    };
    /* float rows with k % 8 != 0: the one-value dequantize path (f16, bf16) */
    static const shape odd[] = {{7, 6, 9, 0}, {96, 12, 300, 2}, {1000, 6, 64, 0}, {1, 12, 1, 0}};
    for (size_t ti = 0; ti < CHECK_N_TYPES; ti++) {
        const tm_type type = check_types[ti];
        double worst = 0;
        int n = 0;
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++, n++)
            worst = fmax(worst, gemm_case(r, b, type, &cases[ci]));
        for (size_t ci = 0; check_is_float(type) && ci < sizeof(odd) / sizeof(odd[0]); ci++, n++)
            worst = fmax(worst, gemm_case(r, b, type, &odd[ci]));
        printf("gemm %-5s: %d cases ok, worst |err|/tol %.3g\n", quant_type_name(type), n, worst);
    }
    /* 64 MiB of f16 weights is 32768 rows of 1024: three chunks, the last 4465 rows */
    static const shape big = {70001, 1024, 9, 0};
    printf("gemm q4_K %lld x %lld (3 weight chunks): ok, |err|/tol %.3g\n", (long long)big.rows,
           (long long)big.k, gemm_case(r, b, TM_TYPE_Q4_K, &big));
}

/* ---- grouped experts ---- */

typedef struct moe_case {
    int64_t E, F, n_tok; /* n_embd, n_ff */
    int32_t n_slots;
    tm_type tg, tu, td;
    bool many; /* 75 generated groups: more f16 weights than one chunk holds (else 9
                  groups, one of 100 distinct tokens: n_tok >= 100) */
    bool oai;  /* gpt-oss's experts: biases of expert ids other than the slots (slot e
                  holds expert 2S - 1 - e), the clamped SwiGLU */
} moe_case;

/* Double dot of a float row with a float vector, and Σ|products|. */
static double dot_f(const float *a, const float *b, int64_t n, double *mag) {
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        const double p = (double)a[i] * b[i];
        s += p;
        m += fabs(p);
    }
    *mag = m;
    return s;
}

static void moe_case_run(tm_rng *r, tm_cuda_blas *b, const moe_case *c) {
    const int64_t E = c->E, F = c->F, NT = c->n_tok;
    const int32_t S = c->n_slots;
    /* groups: sizes 0, 1, 15, 16, 17, 100; slot S and -1 are skipped; slot 5 twice */
    int32_t slots[80];
    int64_t starts[81], n_groups = 9;
    {
        const int32_t sl[9] = {3, 5, 0, S - 1, 7, S, 9, 5, -1};
        const int64_t sz[9] = {0, 1, 15, 16, 17, 5, 100, 17, 2};
        if (c->many) n_groups = 75;
        starts[0] = 0;
        for (int64_t g = 0; g < n_groups; g++) {
            slots[g] = c->many ? (int32_t)(g % S) : sl[g];
            /* sorted by padded size: 70 groups of P = 16, then 5 of P = 32 */
            const int64_t size = c->many ? (g % 15 == 0 ? 17 + g / 15 : 1 + g % 3) : sz[g];
            starts[g + 1] = starts[g] + size;
        }
    }
    const int64_t n_items = starts[n_groups];
    tm_cuda_moe_item *items = xmalloc((size_t)n_items * sizeof(*items));
    int32_t *perm = xmalloc((size_t)NT * 4);
    for (int64_t t = 0; t < NT; t++) perm[t] = (int32_t)t;
    for (int64_t g = 0; g < n_groups; g++) /* distinct tokens in a group, as routing gives */
        for (int64_t i = starts[g]; i < starts[g + 1]; i++) {
            const int64_t j = i - starts[g], q = j + (int64_t)(tm_rng_u64(r) % (uint64_t)(NT - j));
            const int32_t tmp = perm[j];
            perm[j] = perm[q], perm[q] = tmp;
            items[i] = (tm_cuda_moe_item){slots[g], perm[j], tm_rng_f32(r),
                                          c->oai ? 2 * S - 1 - slots[g] : slots[g]};
        }
    if (!c->many) items[starts[5] - 1].token = (int32_t)NT; /* out of range in group 4: skipped */

    float *gd, *ud, *dd;
    const size_t gb = quant_row_size(c->tg, E), ub = quant_row_size(c->tu, E),
                 db = quant_row_size(c->td, F);
    uint8_t *gw = random_matrix(r, c->tg, S * F, E, gb, &gd);
    uint8_t *uw = random_matrix(r, c->tu, S * F, E, ub, &ud);
    uint8_t *dw = random_matrix(r, c->td, S * E, F, db, &dd);
    float *x = xmalloc((size_t)NT * E * 4), *y0 = xmalloc((size_t)NT * E * 4);
    float *y = xmalloc((size_t)NT * E * 4), *y2 = xmalloc((size_t)NT * E * 4);
    fill_normal(r, x, NT * E, 1.0f);
    fill_normal(r, y0, NT * E, 1.0f);  /* the ops add to y */
    const int64_t NX = 2 * (int64_t)S; /* the biases' experts */
    check_oai_biases bias = check_oai_biases_make(r, NX, F, E);

    cuda_pool_reset(g_pool);
    tm_cuda_moe_params p = {E, F, S, {0}, {0}, {0}, {0}, false, false};
    if (c->oai) p.ext = check_oai_ext(&bias, F, E);
    p.gate = (tm_cuda_moe_matrix){dev_upload(gw, (size_t)S * F * gb), c->tg, F * gb, gb};
    p.up = (tm_cuda_moe_matrix){dev_upload(uw, (size_t)S * F * ub), c->tu, F * ub, ub};
    p.down = (tm_cuda_moe_matrix){dev_upload(dw, (size_t)S * E * db), c->td, E * db, db};
    const tm_cuda_moe_item *items_d = dev_upload(items, (size_t)n_items * sizeof(*items));
    const float *x_d = dev_upload(x, (size_t)NT * E * 4);
    float *y_d = dev_upload(y0, (size_t)NT * E * 4), *y2_d = dev_upload(y0, (size_t)NT * E * 4);
    const size_t sb = cuda_moe_grouped_gemm_scratch_bytes(&p, n_items, (int32_t)n_groups);
    const size_t hb = (size_t)cuda_moe_scratch_floats(&p, n_items) * 4;
    assert_true(sb > 0);
    void *scratch = dev_alloc(sb);
    float *h_d = dev_alloc(hb);
    CHECK(cuda_fill_bytes(g_dev, scratch, 0xff, sb)); /* NaN poison */
    const tm_cuda_moe_groups grp = {(int32_t)n_groups, slots, starts, items_d};
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    CHECK(cuda_moe_grouped_gemm(b, &p, &grp, x_d, NT, y_d, scratch, s));
    CHECK(cuda_moe_grouped(&p, items_d, n_items, x_d, NT, y2_d, h_d, s));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, y, y_d, (size_t)NT * E * 4));
    CHECK(cuda_copy_to_host(g_dev, y2, y2_d, (size_t)NT * E * 4));

    /* Reference on the f16 inputs, first-order error bounds per output:
     *  tol  (grouped gemm vs ref): gate/up within γT(E) Σ|.|; the GPU's f32 h
     *       within δ = 2 (1.1 |u| Δg + |silu g| Δu) + 8 u |h| of h (|silu'| <=
     *       1.1; expf, 1 + e, /, * in f32), so its f16 rounding differs from
     *       ours only when [h - δ, h + δ] straddles a rounding boundary, and
     *       then by at most eh = f16(h + δ) - f16(h - δ); down within γT(F)
     *       Σ|.| plus Σ|d| eh; one f32 rounding per product and atomic add.
     *  tolx (decode path vs ref): its f32 dots and exact weights and x differ
     *       from ours by the f16 roundings, 2.1 uh Σ|w x| for gate/up and
     *       1.1 uh Σ|d h| for down (uh = 2^-11), plus its f32 accumulation
     *       and our h rounding |f16(h) - h|.
     * Worst-case propagation makes tol loose (Δg can span several f16 ulps of h,
     * and eh then counts every possible flip), so the relative RMS error over all
     * outputs, against the items' sum ref - y0, must also stay under 2^-12 (half
     * an f16 rounding): a rounding coarser than f16 anywhere (bf16 x or weights:
     * ~1e-3) fails it; f32 accumulation and rare h flips give about 1e-5 (2e-5
     * for the 2048 x 768 case) in a host emulation of the kernels' math. The
     * two GPU paths differ by the f16 roundings of x, weights and h (each
     * uniform within uh, about 1.4 uh in RMS together; 1.05 uh emulated): their
     * relative RMS difference must stay under 4 uh. */
    double *ref = xmalloc((size_t)NT * E * 8), *tol = xmalloc((size_t)NT * E * 8);
    double *tolx = xmalloc((size_t)NT * E * 8), *absy = xmalloc((size_t)NT * E * 8);
    float *xh = xmalloc((size_t)NT * E * 4), *h16 = xmalloc((size_t)F * 4);
    double *eh = xmalloc((size_t)F * 8), *ehx = xmalloc((size_t)F * 8);
    int64_t *cnt = xmalloc((size_t)NT * 8);
    round_f16(gd, S * F * E), round_f16(ud, S * F * E), round_f16(dd, S * E * F);
    memcpy(xh, x, (size_t)NT * E * 4);
    round_f16(xh, NT * E);
    for (int64_t i = 0; i < NT * E; i++)
        ref[i] = y0[i], tol[i] = tolx[i] = 0, absy[i] = fabs(y0[i]);
    memset(cnt, 0, (size_t)NT * 8);
    int64_t n_valid = 0;
    for (int64_t it = 0; it < n_items; it++) {
        const int64_t e = items[it].slot, t = items[it].token, id = items[it].expert;
        const double wt = items[it].weight;
        if (e < 0 || e >= S || t < 0 || t >= NT) continue;
        n_valid++, cnt[t]++;
        for (int64_t f = 0; f < F; f++) {
            double mg, mu;
            double g = dot_f(gd + (e * F + f) * E, xh + t * E, E, &mg);
            double u = dot_f(ud + (e * F + f) * E, xh + t * E, E, &mu);
            /* h = a(g, u): its value, |dh/dg| <= dg and |dh/du| <= du */
            double hd, dg, du;
            if (c->oai) {
                /* the bias add rounds once more: Σ|.| grows by |b| */
                g += bias.gate[id * F + f], u += bias.up[id * F + f];
                mg += fabs(bias.gate[id * F + f]), mu += fabs(bias.up[id * F + f]);
                hd = check_swiglu_oai(g, u, &dg, &du);
            } else {
                const double sg = g / (1.0 + exp(-g));
                hd = sg * u, dg = 1.1 * fabs(u), du = fabs(sg);
            }
            const double dl = 2 * (dg * gamma_tc(E) * mg + du * gamma_tc(E) * mu) +
                              (c->oai ? 10 : 8) * U32 * fabs(hd);
            h16[f] = half_round((float)hd);
            eh[f] = half_round((float)(hd + dl)) - half_round((float)(hd - dl));
            const double cx = 2.1 * UH + (double)(E + 2) * U32;
            ehx[f] = dg * cx * mg + du * cx * mu + (c->oai ? 10 : 8) * U32 * fabs(hd) +
                     fabs(h16[f] - hd);
        }
        for (int64_t o = 0; o < E; o++) {
            const float *dr = dd + (e * E + o) * F;
            double mo, car = 0, carx = 0;
            double out = dot_f(dr, h16, F, &mo);
            if (c->oai) out += bias.down[id * E + o], mo += fabs(bias.down[id * E + o]);
            for (int64_t f = 0; f < F; f++)
                car += fabs(dr[f]) * eh[f], carx += fabs(dr[f]) * ehx[f];
            const int64_t i = t * E + o;
            ref[i] += wt * out;
            absy[i] += fabs(wt * out);
            tol[i] += fabs(wt) * (gamma_tc(F) * mo + car);
            tolx[i] += fabs(wt) * (carx + (1.1 * UH + (double)(F + 2) * U32) * mo);
        }
    }
    double worst = 0, worstx = 0, e2 = 0, r2 = 0, x2 = 0;
    for (int64_t i = 0; i < NT * E; i++) {
        const double adds = (double)(cnt[i / E] + 1) * U32 * absy[i];
        const double lim = 2 * (tol[i] + adds) + 1e-30; /* 2x: first-order bounds */
        const double limx = 2 * (tol[i] + tolx[i] + 2 * adds) + 1e-30;
        const double err = fabs((double)y[i] - ref[i]), errx = fabs((double)y[i] - y2[i]);
        if (!(err <= lim) || !(errx <= limx))
            fail_msg("moe_gemm %s/%s/%s embd %lld ff %lld: y[%lld][%lld] = %.9g, ref %.9g (tol "
                     "%.3g), cuda_moe_grouped %.9g (tol %.3g)",
                     quant_type_name(c->tg), quant_type_name(c->tu), quant_type_name(c->td),
                     (long long)E, (long long)F, (long long)(i / E), (long long)(i % E), y[i],
                     ref[i], lim, y2[i], limx);
        worst = fmax(worst, err / lim), worstx = fmax(worstx, errx / limx);
        e2 += err * err, x2 += errx * errx, r2 += (ref[i] - y0[i]) * (ref[i] - y0[i]);
    }
    /* systematic drift: see tol above */
    if (!(sqrt(e2 / r2) <= 0x1p-12))
        fail_msg("moe_gemm %s/%s/%s embd %lld ff %lld: RMS |err| / RMS |ref - y0| = %.3g > 2^-12",
                 quant_type_name(c->tg), quant_type_name(c->tu), quant_type_name(c->td),
                 (long long)E, (long long)F, sqrt(e2 / r2));
    if (!(sqrt(x2 / r2) <= 4 * UH))
        fail_msg("moe_gemm %s/%s/%s embd %lld ff %lld: RMS |gemm - cuda_moe_grouped| / RMS |ref - "
                 "y0| = %.3g > 4 uh",
                 quant_type_name(c->tg), quant_type_name(c->tu), quant_type_name(c->td),
                 (long long)E, (long long)F, sqrt(x2 / r2));
    printf("moe_gemm %s/%s/%s n_embd %lld n_ff %lld%s: %lld groups, %lld items (%lld skipped) "
           "ok, worst |err|/tol %.3g, RMS %.2g; vs cuda_moe_grouped %.3g, RMS %.2g\n",
           quant_type_name(c->tg), quant_type_name(c->tu), quant_type_name(c->td), (long long)E,
           (long long)F, c->oai ? " (biases, clamped SwiGLU)" : "", (long long)n_groups,
           (long long)n_items, (long long)(n_items - n_valid), worst, sqrt(e2 / r2), worstx,
           sqrt(x2 / r2));
    free(items), free(perm), free(gw), free(uw), free(dw), free(gd), free(ud), free(dd);
    check_oai_biases_free(&bias);
    free(x), free(y0), free(y), free(y2), free(ref), free(tol), free(tolx), free(absy);
    free(xh), free(h16), free(eh), free(ehx), free(cnt);
}

static void check_moe_gemm(tm_rng *r, tm_cuda_blas *b) {
    static const moe_case cases[] = {
        {512, 256, 128, 16, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q6_K, false, false},
        /* float rows; down's k = 36 takes the one-value dequantize path */
        {200, 36, 128, 16, TM_TYPE_F16, TM_TYPE_BF16, TM_TYPE_F32, false, false},
        /* Qwen3-30B-A3B experts: 9 MiB of f16 each, 28 a chunk, 75 groups */
        {2048, 768, 64, 16, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q6_K, true, false},
        /* q4_K only (the 30b-a3b preset's experts): the fused path for all three */
        {2048, 768, 128, 16, TM_TYPE_Q4_K, TM_TYPE_Q4_K, TM_TYPE_Q4_K, false, false},
        /* gpt-oss: MXFP4 experts (rows of 18 blocks) with biases and the clamped
           SwiGLU; float rows with the same */
        {576, 320, 128, 16, TM_TYPE_MXFP4, TM_TYPE_MXFP4, TM_TYPE_MXFP4, false, true},
        {200, 36, 128, 16, TM_TYPE_F16, TM_TYPE_BF16, TM_TYPE_F32, false, true},
        /* the low-bit types (fused path; 110-byte q3_K/iq3_s blocks staged in 4-byte
           windows): a dynamic mix's experts, then every type in mixed triples */
        {512, 256, 128, 16, TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XXS, TM_TYPE_Q2_K, false, false},
        {256, 512, 128, 16, TM_TYPE_IQ1_M, TM_TYPE_IQ1_S, TM_TYPE_IQ3_XXS, false, false},
        {512, 256, 128, 16, TM_TYPE_Q3_K, TM_TYPE_IQ4_XS, TM_TYPE_IQ3_S, false, false},
        {256, 256, 128, 16, TM_TYPE_IQ2_XS, TM_TYPE_IQ2_S, TM_TYPE_TQ1_0, false, false},
        {256, 256, 128, 16, TM_TYPE_TQ2_0, TM_TYPE_Q5_0, TM_TYPE_Q4_1, false, true},
        {96, 160, 128, 16, TM_TYPE_Q5_1, TM_TYPE_IQ4_NL, TM_TYPE_Q4_1, false, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) moe_case_run(r, b, &cases[i]);
    /* the dequantize path with the low-bit types */
    setenv("TIERMOE_MOE_GEMM", "dequant", 1);
    printf("TIERMOE_MOE_GEMM=dequant:\n");
    moe_case_run(r, b, &cases[6]), moe_case_run(r, b, &cases[8]);
    unsetenv("TIERMOE_MOE_GEMM");
    /* the default's own choice of the dequantize path (groups of 16 rows or more on average:
       the 9-group cases' 19; the 75 groups' 3 stay fused), sized by the same rule */
    setenv("TIERMOE_MOE_GEMM_ROWS", "16", 1);
    printf("TIERMOE_MOE_GEMM_ROWS=16:\n");
    moe_case_run(r, b, &cases[0]), moe_case_run(r, b, &cases[2]), moe_case_run(r, b, &cases[8]);
    unsetenv("TIERMOE_MOE_GEMM_ROWS");
    /* MXFP4, and groups of TM_MOE_GEMM_DEQUANT_ROWS rows or more, take the dequantize path
       by default: the fused path for every case too */
    setenv("TIERMOE_MOE_GEMM", "fused", 1);
    printf("TIERMOE_MOE_GEMM=fused:\n");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) moe_case_run(r, b, &cases[i]);
    unsetenv("TIERMOE_MOE_GEMM");
}

/* ---- bad arguments: refused before any launch ---- */

static void check_args(tm_cuda_blas *b) {
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    cuda_pool_reset(g_pool);
    char *buf = dev_alloc(1 << 20);
    float *fb = (float *)buf;
    assert_int_equal(cuda_dequantize_f16(TM_TYPE_NVFP4, buf, 36, 1, 64, buf, s),
                     TM_ERR_UNSUPPORTED);
    assert_non_null(strstr(tm_error_message(), "nvfp4"));
    assert_int_equal(cuda_dequantize_f16(TM_TYPE_Q4_K, buf, 144, 1, 200, buf, s), TM_ERR_ARG);
    assert_int_equal(cuda_dequantize_f16(TM_TYPE_Q8_0, buf, 34, 0, 32, buf, s), TM_ERR_ARG);
    assert_int_equal(cuda_dequantize_f16(TM_TYPE_Q8_0, buf, 33, 1, 32, buf, s), TM_ERR_ARG);
    assert_int_equal(cuda_dequantize_f16(TM_TYPE_F32, buf + 2, 16, 1, 4, buf, s), TM_ERR_ARG);
    assert_int_equal(cuda_gemm(NULL, TM_TYPE_Q8_0, buf, 34, 1, 32, fb, 1, fb, buf, s), TM_ERR_ARG);
    assert_int_equal(cuda_gemm(b, TM_TYPE_NVFP4, buf, 36, 1, 64, fb, 1, fb, buf, s),
                     TM_ERR_UNSUPPORTED);
    assert_int_equal(cuda_gemm(b, TM_TYPE_Q6_K, buf, 210, 1, 100, fb, 1, fb, buf, s), TM_ERR_ARG);
    assert_int_equal(cuda_gemm(b, TM_TYPE_Q8_0, buf, 34, 1, 32, (float *)(buf + 2), 1, fb, buf, s),
                     TM_ERR_ARG);
    const tm_cuda_moe_matrix q8 = {buf, TM_TYPE_Q8_0, 32 * 68, 68};
    tm_cuda_moe_params p = {64, 32, 2, q8, q8, {buf, TM_TYPE_Q8_0, 64 * 34, 34}, {0}, false, false};
    const int32_t slots[2] = {0, 1};
    int64_t starts[3] = {0, 1, 2};
    const tm_cuda_moe_groups g = {2, slots, starts, (const tm_cuda_moe_item *)buf};
    assert_int_equal(cuda_moe_grouped_gemm(NULL, &p, &g, fb, 1, fb, buf, s), TM_ERR_ARG);
    p.gate.type = TM_TYPE_NVFP4;
    assert_int_equal(cuda_moe_grouped_gemm(b, &p, &g, fb, 1, fb, buf, s), TM_ERR_UNSUPPORTED);
    p.gate.type = TM_TYPE_Q8_0, p.down.type = TM_TYPE_Q4_K; /* down's k = n_ff = 32 */
    assert_int_equal(cuda_moe_grouped_gemm(b, &p, &g, fb, 1, fb, buf, s), TM_ERR_ARG);
    p.down.type = TM_TYPE_Q8_0, p.up.expert_stride = 68; /* < 32 rows */
    assert_int_equal(cuda_moe_grouped_gemm(b, &p, &g, fb, 1, fb, buf, s), TM_ERR_ARG);
    p.up.expert_stride = 32 * 68, starts[1] = 3; /* starts decrease */
    assert_int_equal(cuda_moe_grouped_gemm(b, &p, &g, fb, 1, fb, buf, s), TM_ERR_ARG);
    /* nothing to do (an empty group and a skipped slot): y untouched */
    const int32_t none[2] = {1, 2};
    starts[1] = 0, starts[2] = 1;
    const tm_cuda_moe_groups g0 = {2, none, starts, (const tm_cuda_moe_item *)buf};
    const float y0[4] = {1, 2, 3, 4};
    float y[4], *y_d = dev_upload(y0, sizeof(y0));
    CHECK(cuda_moe_grouped_gemm(b, &p, &g0, fb, 1, y_d, buf, s));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, y, y_d, sizeof(y)));
    assert_memory_equal(y, y0, sizeof(y));
    printf("gemm args: refused as expected\n");
}

void check_gemm(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0x6e33);
    tm_cuda_blas *b = NULL;
    CHECK(cuda_blas_create(g_dev, &b));
    check_gemm_types(&r, b);
    check_moe_gemm(&r, b);
    check_args(b);
    cuda_blas_free(b);
}

#endif /* TM_HAVE_CUDA */
