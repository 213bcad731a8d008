/* The host mock of the CUDA backend (tests/mock/): its ops against
 * straightforward double-precision loops written here (the stream semantics
 * are test_mock_cuda.c).
 *
 * Products sum exactly dequantized weights in double and store float, so
 * they agree with a double loop to float rounding of the result (1e-6 of
 * Σ|w x|). Attention, norms and RoPE run the CPU ops in float: 1e-4 relative
 * to the largest output (f32 cache) and 5e-3 (f16 cache: keys and values
 * rounded to 11 bits, which the double reference does not do). Linear
 * attention's ops (the mock's own double loops) against the CPU engine's float
 * kernels (src/cpu/cpu_ssm.c, the executor's steps): 1e-4 of 1 + |value| after
 * 23 tokens of the recurrence, 1e-5 for the gated norm and SwiGLU. The random
 * inputs come from seed 77, or MOCK_TEST_SEED. */
#include "cpu/cpu_ops.h"
#include "cpu/cpu_ssm.h"
#include "mock/mock_gpu_util.h"

/* ---- products ---- */

/* Independent q8_0: a row of k values, one f16 scale and 32 int8 per block. */
static void q8_0_row(const void *row, float *out, int64_t k) {
    const uint8_t *b = row;
    for (int64_t j = 0; j < k / 32; j++, b += 34) {
        const float d = quant_f16_to_f32((tm_half)(b[0] | b[1] << 8));
        for (int i = 0; i < 32; i++) out[j * 32 + i] = d * (float)(int8_t)b[2 + i];
    }
}

static void ref_row(tm_type t, const void *row, float *out, int64_t k) {
    if (t == TM_TYPE_Q8_0)
        q8_0_row(row, out, k);
    else
        memcpy(out, row, (size_t)k * sizeof(float));
}

/* rows x k random weights of type t, row_bytes apart (pad extra bytes a row). */
static uint8_t *make_weights(tm_type t, int64_t rows, int64_t k, size_t pad, size_t *row_bytes) {
    *row_bytes = quant_row_size(t, k) + pad;
    uint8_t *w = calloc((size_t)rows, *row_bytes);
    float *src = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        fill(src, k, 1);
        assert_int_equal(quant_row_quantize(t, src, w + r * *row_bytes, k), TM_OK);
    }
    free(src);
    return w;
}

static void test_products(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    tm_cuda_blas *blas;
    assert_int_equal(cuda_blas_create(g.dev, &blas), TM_OK);
    const tm_type types[] = {TM_TYPE_Q8_0, TM_TYPE_F32};
    for (size_t ti = 0; ti < 2; ti++) {
        const tm_type t = types[ti];
        const int64_t rows = 37, k = 96, nt = 11;
        size_t rb;
        uint8_t *w = make_weights(t, rows, k, t == TM_TYPE_F32 ? 8 : 2, &rb);
        float x[11 * 96], y[11 * 37], row[96];
        fill(x, nt * k, 1);
        void *wd = upload(&g, w, (size_t)rows * rb);
        float *xd = upload(&g, x, sizeof(x)), *yd = dalloc(&g, sizeof(y));
        void *scratch = dalloc(&g, cuda_gemm_scratch_bytes(rows, k, nt));
        tm_half *hd = dalloc(&g, (size_t)(rows * k) * 2), h[37 * 96];
        for (int pass = 0; pass < 2; pass++) { /* mmvq with 3 tokens, gemm with 11 */
            const int64_t n = pass ? nt : 3;
            assert_int_equal(cuda_fill_bytes(g.dev, yd, 0xff, sizeof(y)), TM_OK);
            if (pass)
                assert_int_equal(cuda_gemm(blas, t, wd, rb, rows, k, xd, n, yd, scratch, g.s),
                                 TM_OK);
            else
                assert_int_equal(cuda_mmvq(t, wd, rb, rows, k, xd, n, yd, g.s), TM_OK);
            download(&g, y, yd, (size_t)(n * rows) * 4);
            for (int64_t r = 0; r < rows; r++) {
                ref_row(t, w + r * rb, row, k);
                for (int64_t tk = 0; tk < n; tk++) {
                    double s = 0, mag = 0;
                    for (int64_t i = 0; i < k; i++)
                        s += (double)row[i] * x[tk * k + i],
                            mag += fabs((double)row[i] * x[tk * k + i]);
                    assert_close(y[tk * rows + r], s, 1e-6 * mag + 1e-30);
                }
            }
        }
        assert_int_equal(cuda_dequantize_f16(t, wd, rb, rows, k, hd, g.s), TM_OK);
        download(&g, h, hd, sizeof(h));
        for (int64_t r = 0; r < rows; r++) {
            ref_row(t, w + r * rb, row, k);
            for (int64_t i = 0; i < k; i++)
                assert_int_equal(h[r * k + i], quant_f32_to_f16(row[i]));
        }
        free(w);
        cuda_pool_reset(g.pool);
    }
    cuda_blas_free(blas);
    gpu_close(&g);
}

/* ---- grouped experts ---- */

enum { ME = 32, MF = 64, MS = 4, MT = 3 }; /* n_embd, n_ff, slots, tokens */

typedef struct moe_case {
    uint8_t *gate, *up, *down; /* MS experts each, expert_stride = rows * row_bytes */
    size_t gate_rb, up_rb, down_rb;
    float x[MT * ME], y0[MT * ME];
} moe_case;

/* y[token] += weight * down(silu(gate x) * up x), in double */
static void moe_ref(const moe_case *c, int32_t slot, int32_t token, float weight, double *y) {
    double h[MF];
    float row[MF];
    for (int r = 0; r < MF; r++) {
        double gs = 0, us = 0;
        ref_row(TM_TYPE_Q8_0, c->gate + ((size_t)slot * MF + r) * c->gate_rb, row, ME);
        for (int i = 0; i < ME; i++) gs += (double)row[i] * c->x[token * ME + i];
        ref_row(TM_TYPE_Q8_0, c->up + ((size_t)slot * MF + r) * c->up_rb, row, ME);
        for (int i = 0; i < ME; i++) us += (double)row[i] * c->x[token * ME + i];
        h[r] = gs / (1 + exp(-gs)) * us;
    }
    for (int r = 0; r < ME; r++) {
        double s = 0;
        ref_row(TM_TYPE_F32, c->down + ((size_t)slot * ME + r) * c->down_rb, row, MF);
        for (int i = 0; i < MF; i++) s += (double)row[i] * h[i];
        y[token * ME + r] += weight * s;
    }
}

static void test_moe(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    moe_case c;
    c.gate = make_weights(TM_TYPE_Q8_0, MS * MF, ME, 0, &c.gate_rb);
    c.up = make_weights(TM_TYPE_Q8_0, MS * MF, ME, 0, &c.up_rb);
    c.down = make_weights(TM_TYPE_F32, MS * ME, MF, 0, &c.down_rb);
    fill(c.x, MT * ME, 1), fill(c.y0, MT * ME, 1);
    const tm_cuda_moe_params p = {
        ME,
        MF,
        MS,
        {upload(&g, c.gate, MS * MF * c.gate_rb), TM_TYPE_Q8_0, MF * c.gate_rb, c.gate_rb},
        {upload(&g, c.up, MS * MF * c.up_rb), TM_TYPE_Q8_0, MF * c.up_rb, c.up_rb},
        {upload(&g, c.down, MS * ME * c.down_rb), TM_TYPE_F32, ME * c.down_rb, c.down_rb},
        {0},
        false,
        false};
    /* skipped: slot -1 (not cached), slot MS, token MT */
    const tm_cuda_moe_item items_h[] = {{0, 0, 0.5f, 0},  {2, 0, 0.25f, 2}, {-1, 1, 1.0f, -1},
                                        {3, 1, 0.7f, 3},  {1, 2, 0.3f, 1},  {MS, 2, 9.0f, MS},
                                        {1, MT, 1.0f, 1}, {2, 2, -0.4f, 2}};
    const int64_t n_items = sizeof(items_h) / sizeof(items_h[0]);
    double want[MT * ME];
    for (int i = 0; i < MT * ME; i++) want[i] = c.y0[i];
    for (int64_t i = 0; i < n_items; i++) {
        const tm_cuda_moe_item *it = &items_h[i];
        if (it->slot >= 0 && it->slot < MS && it->token >= 0 && it->token < MT)
            moe_ref(&c, it->slot, it->token, it->weight, want);
    }
    double mag = 0;
    for (int i = 0; i < MT * ME; i++) mag = fmax(mag, fabs(want[i]));
    tm_cuda_moe_item *items = upload(&g, items_h, sizeof(items_h));
    float *x = upload(&g, c.x, sizeof(c.x)), *y = upload(&g, c.y0, sizeof(c.y0)), got[MT * ME];
    float *h = dalloc(&g, (size_t)cuda_moe_scratch_floats(&p, n_items) * 4);
    assert_int_equal(cuda_moe_grouped(&p, items, n_items, x, MT, y, h, g.s), TM_OK);
    download(&g, got, y, sizeof(got));
    for (int i = 0; i < MT * ME; i++) assert_close(got[i], want[i], 1e-5 * mag);

    /* the same work, expert-major: slot 0 | 1 | 2 | 3 | -1 (skipped group) */
    const tm_cuda_moe_item sorted_h[] = {{0, 0, 0.5f, 0},  {1, 2, 0.3f, 1},  {1, MT, 1.0f, 1},
                                         {2, 0, 0.25f, 2}, {2, 2, -0.4f, 2}, {3, 1, 0.7f, 3},
                                         {-1, 1, 1.0f, -1}};
    const int32_t slots[] = {0, 1, 2, 3, -1};
    const int64_t starts[] = {0, 1, 3, 5, 6, 7};
    tm_cuda_blas *blas;
    assert_int_equal(cuda_blas_create(g.dev, &blas), TM_OK);
    const tm_cuda_moe_groups gr = {5, slots, starts, upload(&g, sorted_h, sizeof(sorted_h))};
    void *scratch = dalloc(&g, cuda_moe_grouped_gemm_scratch_bytes(&p, 7, 5));
    assert_int_equal(cuda_copy_to_device(g.dev, y, c.y0, sizeof(c.y0)), TM_OK);
    assert_int_equal(cuda_moe_grouped_gemm(blas, &p, &gr, x, MT, y, scratch, g.s), TM_OK);
    download(&g, got, y, sizeof(got));
    for (int i = 0; i < MT * ME; i++) assert_close(got[i], want[i], 1e-5 * mag);
    assert_int_equal(cuda_graph_begin(g.s), TM_OK); /* its host upload cannot be captured */
    assert_int_equal(cuda_moe_grouped_gemm(blas, &p, &gr, x, MT, y, scratch, g.s), TM_ERR_DEVICE);
    tm_cuda_graph *none;
    assert_int_equal(cuda_graph_end(g.s, false, &none), TM_OK);
    cuda_blas_free(blas);
    free(c.gate), free(c.up), free(c.down);
    gpu_close(&g);
}

/* ---- router ---- */

static void test_router(void **state) {
    (void)state;
    enum { E = 16, K = 4, T = 3 };
    gpu g = gpu_open(0);
    float logits[T * E];
    fill(logits, T * E, 2);
    logits[1 * E + 3] = logits[1 * E + 9] = 9.0f; /* a tie: the lower id first */
    int32_t map[E];
    for (int e = 0; e < E; e++) map[e] = e % 3 == 0 ? -1 : 100 + e;
    float *ld = upload(&g, logits, sizeof(logits));
    int32_t *mapd = upload(&g, map, sizeof(map));
    int32_t *ids = dalloc(&g, T * K * 4), ids_h[T * K];
    float *wd = dalloc(&g, T * K * 4), w_h[T * K];
    tm_cuda_moe_item *items = dalloc(&g, T * K * sizeof(tm_cuda_moe_item)), items_h[T * K];
    tm_cuda_moe_item *mitems = dalloc(&g, T * K * sizeof(tm_cuda_moe_item)), mitems_h[T * K];
    for (int gating = 0; gating < 2; gating++) {
        /* softmax: a slot map and the PCIe lane's list (2 cold slots a token) */
        const tm_cuda_router_params p = {.gating = gating ? TM_CUDA_GATING_SIGMOID
                                                          : TM_CUDA_GATING_SOFTMAX,
                                         .n_expert = E,
                                         .n_used = K,
                                         .norm_topk = gating ? 0 : 1,
                                         .scale = 2.5f,
                                         .slot_map = gating ? NULL : mapd,
                                         .mapped = gating ? NULL : mitems,
                                         .n_mapped = 2};
        assert_int_equal(cuda_router_select(&p, ld, T, ids, wd, items, g.s), TM_OK);
        download(&g, ids_h, ids, sizeof(ids_h));
        download(&g, w_h, wd, sizeof(w_h));
        download(&g, items_h, items, sizeof(items_h));
        download(&g, mitems_h, mitems, sizeof(mitems_h));
        for (int t = 0; t < T; t++) {
            double sc[E], m = -INFINITY, sum = 0, wsum = 0;
            for (int e = 0; e < E; e++) m = fmax(m, logits[t * E + e]);
            for (int e = 0; e < E; e++) {
                sc[e] = gating ? 1 / (1 + exp(-(double)logits[t * E + e]))
                               : exp((double)logits[t * E + e] - m);
                sum += sc[e];
            }
            if (!gating)
                for (int e = 0; e < E; e++) sc[e] /= sum;
            int want[K];
            bool taken[E] = {false};
            for (int j = 0; j < K; j++) { /* the best left, ties to the lower id */
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!taken[e] && (best < 0 || sc[e] > sc[best])) best = e;
                taken[best] = true, want[j] = best, wsum += sc[best];
            }
            if (t == 1 && !gating) assert_true(want[0] == 3 && want[1] == 9);
            int n_cold = 0;
            for (int j = 0; j < K; j++) {
                const double ww = (gating ? sc[want[j]] : sc[want[j]] / wsum) * 2.5;
                assert_int_equal(ids_h[t * K + j], want[j]);
                assert_close(w_h[t * K + j], ww, 1e-5 * ww);
                const tm_cuda_moe_item *it = &items_h[t * K + j];
                assert_int_equal(it->slot, gating ? want[j] : map[want[j]]);
                assert_int_equal(it->token, t);
                assert_int_equal(it->expert, want[j]);
                assert_true(it->weight == w_h[t * K + j]);
                if (gating) continue;
                const bool pcie = map[want[j]] < 0 && n_cold++ < 2; /* its id, else -1 */
                assert_int_equal(mitems_h[t * K + j].slot, pcie ? want[j] : -1);
                assert_int_equal(mitems_h[t * K + j].expert, want[j]);
                assert_true(mitems_h[t * K + j].weight == w_h[t * K + j]);
            }
        }
    }
    gpu_close(&g);
}

/* ---- norms, rope, attention ---- */

enum { NH = 4, NKV = 2, HD = 16, NCTX = 32, PROMPT = 5, STEPS = 4 };

static void ref_norm_rope(const float *src, const float *w, int64_t pos, double *out) {
    double ss = 0;
    for (int i = 0; i < HD; i++) ss += (double)src[i] * src[i];
    const double r = 1 / sqrt(ss / HD + 1e-6);
    double v[HD];
    for (int i = 0; i < HD; i++) v[i] = w ? src[i] * r * w[i] : src[i];
    for (int i = 0; i < HD / 2; i++) {
        const double th = (double)pos * pow(1e4, -2.0 * i / HD);
        out[i] = v[i] * cos(th) - v[i + HD / 2] * sin(th);
        out[i + HD / 2] = v[i] * sin(th) + v[i + HD / 2] * cos(th);
    }
}

static void test_norm_rope_add(void **state) {
    (void)state;
    enum { R = 3, N = 48 };
    gpu g = gpu_open(0);
    float x[R * N], a[R * N], w[N], got[R * N], h[R * N];
    fill(x, R * N, 2), fill(a, R * N, 1), fill(w, N, 1);
    float *xd = upload(&g, x, sizeof(x)), *ad = upload(&g, a, sizeof(a));
    float *wd = upload(&g, w, sizeof(w)), *hd = dalloc(&g, sizeof(h));
    assert_int_equal(cuda_add_rmsnorm(xd, ad, hd, wd, R, N, 1e-6f, g.s), TM_OK);
    download(&g, got, xd, sizeof(got));
    download(&g, h, hd, sizeof(h));
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < N; i++)
            ss += ((double)x[r * N + i] + a[r * N + i]) * (x[r * N + i] + a[r * N + i]);
        const double s = 1 / sqrt(ss / N + 1e-6);
        for (int i = 0; i < N; i++) {
            const double v = (double)x[r * N + i] + a[r * N + i];
            assert_close(got[r * N + i], v, 1e-6 * fabs(v));
            assert_close(h[r * N + i], v * s * w[i], 1e-5 * fabs(v * s * w[i]) + 1e-7);
        }
    }
    assert_int_equal(cuda_rmsnorm(hd, xd, NULL, R, N, 1e-6f, g.s), TM_OK); /* no gain */
    assert_int_equal(cuda_add(xd, xd, ad, R * N, g.s), TM_OK);
    download(&g, h, hd, sizeof(h));
    download(&g, x, xd, sizeof(x));
    for (int i = 0; i < R * N; i++) assert_close(x[i], (double)got[i] + a[i], 1e-6 * fabs(x[i]));
    { /* a bias over the rows */
        float y[R * N];
        assert_int_equal(cuda_add_bias(xd, wd, R, N, g.s), TM_OK);
        download(&g, y, xd, sizeof(y));
        for (int i = 0; i < R * N; i++) assert_true(y[i] == x[i] + w[i % N]);
        assert_int_equal(cuda_add_bias(xd, wd, R, 0, g.s), TM_ERR_ARG);
    }
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < N; i++) ss += (double)got[r * N + i] * got[r * N + i];
        for (int i = 0; i < N; i++)
            assert_close(h[r * N + i], got[r * N + i] / sqrt(ss / N + 1e-6), 1e-5);
    }

    float q[2 * NH * HD], q0[2 * NH * HD];
    const int32_t pos[2] = {7, 30000};
    fill(q0, 2 * NH * HD, 1);
    float *qd = upload(&g, q0, sizeof(q0));
    int32_t *posd = upload(&g, pos, sizeof(pos));
    assert_int_equal(cuda_rope_neox(qd, posd, 2, NH, HD, 1e4f, g.s), TM_OK);
    download(&g, q, qd, sizeof(q));
    for (int t = 0; t < 2; t++)
        for (int hh = 0; hh < NH; hh++) {
            double want[HD];
            ref_norm_rope(q0 + (t * NH + hh) * HD, NULL, pos[t], want);
            for (int i = 0; i < HD; i++) assert_close(q[(t * NH + hh) * HD + i], want[i], 1e-5);
        }
    gpu_close(&g);
}

typedef struct attn_ref {
    double k[NCTX][NKV * HD], v[NCTX][NKV * HD]; /* roped keys, values */
} attn_ref;

/* q/k/v for n tokens from pos0: checks q after prepare, the cache rows, and the output. */
static void attn_check_step(gpu *g, const tm_cuda_attn_params *p, attn_ref *ref, int64_t pos0,
                            int64_t n, const float *q, const float *k, const float *v,
                            const float *qn, const float *kn, float *qd, void *kc, void *vc,
                            float *outd) {
    const bool f16 = p->kv_type == TM_TYPE_F16;
    const double ktol = f16 ? 2e-3 : 1e-5, otol = f16 ? 5e-3 : 1e-4;
    float qgot[PROMPT * NH * HD], out[PROMPT * NH * HD];
    double qw[PROMPT][NH * HD], want[NH * HD];
    download(g, qgot, qd, (size_t)(n * NH * HD) * 4);
    download(g, out, outd, (size_t)(n * NH * HD) * 4);
    for (int64_t t = 0; t < n; t++) {
        const int64_t pos = pos0 + t;
        for (int h = 0; h < NH; h++) ref_norm_rope(q + (t * NH + h) * HD, qn, pos, qw[t] + h * HD);
        for (int h = 0; h < NKV; h++)
            ref_norm_rope(k + (t * NKV + h) * HD, kn, pos, ref->k[pos] + h * HD);
        for (int i = 0; i < NKV * HD; i++) ref->v[pos][i] = v[t * NKV * HD + i];
        for (int i = 0; i < NH * HD; i++) assert_close(qgot[t * NH * HD + i], qw[t][i], 1e-5);
        uint16_t row16[NKV * HD];
        float row[NKV * HD];
        for (int which = 0; which < 2; which++) {
            const void *cache = which ? vc : kc;
            const size_t off = (size_t)pos * NKV * HD * (f16 ? 2 : 4);
            if (f16) {
                download(g, row16, (const char *)cache + off, sizeof(row16));
                for (int i = 0; i < NKV * HD; i++) row[i] = quant_f16_to_f32(row16[i]);
            } else {
                download(g, row, (const char *)cache + off, sizeof(row));
            }
            const double *w = which ? ref->v[pos] : ref->k[pos];
            for (int i = 0; i < NKV * HD; i++)
                assert_close(row[i], w[i], ktol * (fabs(w[i]) + 1.0));
        }
    }
    for (int64_t t = 0; t < n; t++) {
        const int64_t pos = pos0 + t;
        double mag = 0;
        for (int h = 0; h < NH; h++) {
            const int kv = h / (NH / NKV);
            double s[NCTX], m = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= pos; j++) {
                s[j] = 0;
                for (int i = 0; i < HD; i++) s[j] += qw[t][h * HD + i] * ref->k[j][kv * HD + i];
                s[j] *= p->scale, m = fmax(m, s[j]);
            }
            for (int64_t j = 0; j <= pos; j++) sum += s[j] = exp(s[j] - m);
            for (int i = 0; i < HD; i++) {
                double o = 0;
                for (int64_t j = 0; j <= pos; j++) o += s[j] / sum * ref->v[j][kv * HD + i];
                want[h * HD + i] = o, mag = fmax(mag, fabs(o));
            }
        }
        for (int i = 0; i < NH * HD; i++) assert_close(out[t * NH * HD + i], want[i], otol * mag);
    }
}

static void test_attention(void **state) {
    (void)state;
    for (int kvt = 0; kvt < 2; kvt++) {
        gpu g = gpu_open(0);
        const tm_cuda_attn_params p = {.n_head = NH,
                                       .n_head_kv = NKV,
                                       .head_dim = HD,
                                       .n_ctx = NCTX,
                                       .kv_type = kvt ? TM_TYPE_F16 : TM_TYPE_F32,
                                       .scale = 0.25f,
                                       .rms_eps = 1e-6f,
                                       .rope_base = 1e4f};
        const size_t esz = kvt ? 2 : 4, qb = PROMPT * NH * HD * 4, kb = PROMPT * NKV * HD * 4;
        attn_ref *ref = calloc(1, sizeof(*ref));
        float q[PROMPT * NH * HD], k[PROMPT * NKV * HD], v[PROMPT * NKV * HD], qn[HD], kn[HD];
        fill(qn, HD, 1), fill(kn, HD, 1);
        float *qd = dalloc(&g, qb), *kd = dalloc(&g, kb), *vd = dalloc(&g, kb);
        float *outd = dalloc(&g, qb), *qnd = upload(&g, qn, sizeof(qn)),
              *knd = upload(&g, kn, sizeof(kn));
        void *kc = dalloc(&g, NCTX * NKV * HD * esz), *vc = dalloc(&g, NCTX * NKV * HD * esz);
        const int32_t zero = 0;
        int32_t *pos0 = upload(&g, &zero, 4);
        float *scratch =
            dalloc(&g, (size_t)cuda_attention_scratch_floats(&p, PROMPT, PROMPT) * 4 + 4);

        /* the prompt: 5 tokens from position 0 */
        fill(q, PROMPT * NH * HD, 1), fill(k, PROMPT * NKV * HD, 1), fill(v, PROMPT * NKV * HD, 1);
        assert_int_equal(cuda_copy_to_device(g.dev, qd, q, qb), TM_OK);
        assert_int_equal(cuda_copy_to_device(g.dev, kd, k, kb), TM_OK);
        assert_int_equal(cuda_copy_to_device(g.dev, vd, v, kb), TM_OK);
        assert_int_equal(cuda_attn_prepare(&p, qd, kd, vd, qnd, knd, pos0, PROMPT, kc, vc, g.s),
                         TM_OK);
        assert_int_equal(cuda_attention(&p, qd, kc, vc, pos0, PROMPT, PROMPT, outd, scratch, g.s),
                         TM_OK);
        attn_check_step(&g, &p, ref, 0, PROMPT, q, k, v, qn, kn, qd, kc, vc, outd);

        /* decode: one captured step, replayed at the position read from pos0 */
        tm_cuda_graph *step;
        assert_int_equal(cuda_graph_begin(g.s), TM_OK);
        assert_int_equal(cuda_attn_prepare(&p, qd, kd, vd, NULL, knd, pos0, 1, kc, vc, g.s), TM_OK);
        assert_int_equal(cuda_attention(&p, qd, kc, vc, pos0, 1, NCTX, outd, scratch, g.s), TM_OK);
        assert_int_equal(cuda_graph_end(g.s, true, &step), TM_OK);
        for (int32_t s = 0; s < STEPS; s++) {
            const int32_t pos = PROMPT + s;
            fill(q, NH * HD, 1), fill(k, NKV * HD, 1), fill(v, NKV * HD, 1);
            assert_int_equal(cuda_copy_async(qd, q, NH * HD * 4, g.s), TM_OK);
            assert_int_equal(cuda_copy_async(kd, k, NKV * HD * 4, g.s), TM_OK);
            assert_int_equal(cuda_copy_async(vd, v, NKV * HD * 4, g.s), TM_OK);
            assert_int_equal(cuda_copy_async(pos0, &pos, 4, g.s), TM_OK);
            assert_int_equal(cuda_graph_launch(step, g.s), TM_OK);
            assert_int_equal(cuda_stream_sync(g.s), TM_OK);
            attn_check_step(&g, &p, ref, pos, 1, q, k, v, NULL, kn, qd, kc, vc, outd);
        }
        /* a position the launch did not allow for is a fault, not a silent wrong answer */
        const int32_t far = NCTX;
        assert_int_equal(cuda_copy_to_device(g.dev, pos0, &far, 4), TM_OK);
        assert_int_equal(cuda_graph_launch(step, g.s), TM_OK);
        assert_int_equal(cuda_stream_sync(g.s), TM_ERR_DEVICE);
        assert_non_null(strstr(tm_error_message(), "cuda_attn_prepare"));
        cuda_graph_free(step);
        free(ref);
        gpu_close(&g);
    }
}

/* Partial RoPE (n_rot 8 of 16): the norm over the head, the first 8 values rotated
 * as pairs (i, i + 4) at pos 1e4^(-2i/8), the rest passed through. */
static void test_partial_rope(void **state) {
    (void)state;
    enum { NR = 8, NT = 2 };
    gpu g = gpu_open(0);
    const tm_cuda_attn_params p = {.n_head = NH,
                                   .n_head_kv = NKV,
                                   .head_dim = HD,
                                   .n_ctx = NCTX,
                                   .kv_type = TM_TYPE_F32,
                                   .scale = 0.25f,
                                   .rms_eps = 1e-6f,
                                   .rope_base = 1e4f,
                                   .n_rot = NR};
    float q[NT * NH * HD], k[NT * NKV * HD], qn[HD], kn[HD], got[NT * NH * HD], kc[NKV * HD];
    fill(q, NT * NH * HD, 1), fill(k, NT * NKV * HD, 1), fill(qn, HD, 1), fill(kn, HD, 1);
    const int32_t pos0 = 7;
    float *qd = upload(&g, q, sizeof(q)), *kcache = dalloc(&g, NCTX * NKV * HD * 4);
    float *vcache = dalloc(&g, NCTX * NKV * HD * 4);
    assert_int_equal(cuda_attn_prepare(&p, qd, upload(&g, k, sizeof(k)), upload(&g, k, sizeof(k)),
                                       upload(&g, qn, sizeof(qn)), upload(&g, kn, sizeof(kn)),
                                       upload(&g, &pos0, 4), NT, kcache, vcache, g.s),
                     TM_OK);
    download(&g, got, qd, sizeof(got));
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < NH + NKV; h++) {
            const float *src = h < NH ? q + (t * NH + h) * HD : k + (t * NKV + h - NH) * HD;
            const float *w = h < NH ? qn : kn;
            if (h == NH) download(&g, kc, kcache + (pos0 + t) * NKV * HD, sizeof(kc));
            const float *y = h < NH ? got + (t * NH + h) * HD : kc + (h - NH) * HD;
            double ss = 0, v[HD];
            for (int i = 0; i < HD; i++) ss += (double)src[i] * src[i];
            for (int i = 0; i < HD; i++) v[i] = src[i] / sqrt(ss / HD + 1e-6) * w[i];
            for (int i = 0; i < HD; i++) {
                const int j = i % (NR / 2);
                const double th = (pos0 + t) * pow(1e4, -2.0 * j / NR);
                const double want = i >= NR      ? v[i]
                                    : i < NR / 2 ? v[i] * cos(th) - v[i + NR / 2] * sin(th)
                                                 : v[i - NR / 2] * sin(th) + v[i] * cos(th);
                assert_close(y[i], want, 1e-5 * (1 + fabs(want)));
            }
        }
    tm_cuda_attn_params bad = p;
    bad.n_rot = 5;
    assert_int_equal(cuda_attn_prepare(&bad, qd, qd, qd, NULL, NULL, &pos0, 1, kcache, vcache, g.s),
                     TM_ERR_ARG);
    gpu_close(&g);
}

/* Interleaved RoPE (llama.cpp's normal kind): QK-norm over the head, then the pairs
 * (2i, 2i + 1) at pos 1e4^(-2i/d); a partial one is refused. */
static void test_interleaved_rope(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    const tm_cuda_attn_params p = {.n_head = NH,
                                   .n_head_kv = NKV,
                                   .head_dim = HD,
                                   .n_ctx = NCTX,
                                   .kv_type = TM_TYPE_F32,
                                   .scale = 0.25f,
                                   .rms_eps = 1e-6f,
                                   .rope_base = 1e4f,
                                   .rope_interleaved = true};
    float q[NH * HD], k[NKV * HD], qn[HD], got[NH * HD], kc[NKV * HD];
    fill(q, NH * HD, 1), fill(k, NKV * HD, 1), fill(qn, HD, 1);
    const int32_t pos0 = 11;
    float *qd = upload(&g, q, sizeof(q)), *kcache = dalloc(&g, NCTX * NKV * HD * 4);
    float *vcache = dalloc(&g, NCTX * NKV * HD * 4), *kd = upload(&g, k, sizeof(k));
    const int32_t *posd = upload(&g, &pos0, 4);
    assert_int_equal(cuda_attn_prepare(&p, qd, kd, kd, upload(&g, qn, sizeof(qn)), NULL, posd, 1,
                                       kcache, vcache, g.s),
                     TM_OK);
    download(&g, got, qd, sizeof(got));
    download(&g, kc, kcache + pos0 * NKV * HD, sizeof(kc));
    for (int h = 0; h < NH + NKV; h++) {
        const float *src = h < NH ? q + h * HD : k + (h - NH) * HD;
        const float *y = h < NH ? got + h * HD : kc + (h - NH) * HD;
        double ss = 0, v[HD];
        for (int i = 0; i < HD; i++) ss += (double)src[i] * src[i];
        for (int i = 0; i < HD; i++) v[i] = h < NH ? src[i] / sqrt(ss / HD + 1e-6) * qn[i] : src[i];
        for (int i = 0; i < HD; i++) {
            const double th = pos0 * pow(1e4, -2.0 * (i / 2) / HD);
            const double want =
                i % 2 ? v[i - 1] * sin(th) + v[i] * cos(th) : v[i] * cos(th) - v[i + 1] * sin(th);
            assert_close(y[i], want, 1e-5 * (1 + fabs(want)));
        }
    }
    tm_cuda_attn_params bad = p;
    bad.n_rot = HD / 2;
    assert_int_equal(cuda_attn_prepare(&bad, qd, kd, kd, NULL, NULL, posd, 1, kcache, vcache, g.s),
                     TM_ERR_ARG);
    tm_error_clear();
    gpu_close(&g);
}

/* ---- linear attention (cuda_mock_ssm.c) against the CPU engine's kernels ---- */

enum { SK = 2, SV = 4, SDK = 16, SDV = 8, SKW = 4, SC = 2 * SK * SDK + SV * SDV, SSEQ = 3 };
enum { SPROMPT = 20, SSTEPS = 3, SMAXT = SPROMPT };

typedef struct ssm_cpu {
    float conv[SSEQ][(SKW - 1) * SC], delta[SSEQ][SV * SDK * SDV];
    float w[SC * SKW], A[SV], dt[SV];
} ssm_cpu;

/* The executor's steps on the CPU (exec_ssm.c): conv per run, q/k l2-normalised
 * and q scaled, the gates from the grouped b/a row, then cpu_delta_rule per run. */
static void ssm_cpu_step(ssm_cpu *c, const int32_t *pos, const int32_t *seq, int n, float *x,
                         const float *ba, float *out) {
    const int64_t r = SV / SK;
    float g[SMAXT * SV], beta[SMAXT * SV];
    float *scratch = malloc(
        (size_t)cpu_delta_scratch_floats(&(tm_delta_shape){.k_dim = SDK, .v_dim = SDV}, 1) * 4);
    for (int t0 = 0, t1; t0 < n; t0 = t1) {
        for (t1 = t0 + 1; t1 < n && seq[t1] == seq[t0] && pos[t1] == pos[t1 - 1] + 1;) t1++;
        if (pos[t0] == 0) memset(c->conv[seq[t0]], 0, sizeof(c->conv[0]));
        cpu_ssm_conv(NULL, x + t0 * SC, t1 - t0, SC, SKW, c->w, c->conv[seq[t0]]);
    }
    for (int t = 0; t < n; t++) {
        float *row = x + t * SC;
        for (int h = 0; h < 2 * SK; h++) cpu_l2norm(row + h * SDK, SDK, 1e-6f);
        for (int i = 0; i < SK * SDK; i++) row[i] *= 1.0f / sqrtf((float)SDK);
        for (int h = 0; h < SV; h++) {
            const int64_t ib = (h / r) * 2 * r + h % r, ia = ib + r;
            const float xa = ba[t * 2 * SV + ia] + c->dt[h];
            beta[t * SV + h] = 1.0f / (1.0f + expf(-ba[t * 2 * SV + ib]));
            g[t * SV + h] = c->A[h] * (xa > 20.0f ? xa : log1pf(expf(xa)));
        }
    }
    for (int t0 = 0, t1; t0 < n; t0 = t1) {
        for (t1 = t0 + 1; t1 < n && seq[t1] == seq[t0] && pos[t1] == pos[t1 - 1] + 1;) t1++;
        if (pos[t0] == 0) memset(c->delta[seq[t0]], 0, sizeof(c->delta[0]));
        const tm_delta_shape sh = {.n_tok = t1 - t0,
                                   .n_k_head = SK,
                                   .n_v_head = SV,
                                   .k_dim = SDK,
                                   .v_dim = SDV,
                                   .qk_stride = SC,
                                   .k_off = SK * SDK,
                                   .v_stride = SC};
        cpu_delta_rule(NULL, &sh, x + t0 * SC, x + t0 * SC + 2 * SK * SDK, g + t0 * SV,
                       beta + t0 * SV, c->delta[seq[t0]], out + t0 * SV * SDV, t1 - t0 > 1,
                       scratch);
    }
    free(scratch);
}

static void expect_near(const float *got, const float *want, int64_t n, double tol,
                        const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
            fail_msg("%s[%lld] = %.9g, cpu %.9g", what, (long long)i, got[i], want[i]);
}

static void test_ssm(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    ssm_cpu *c = calloc(1, sizeof(*c));
    fill(&c->conv[0][0], (int64_t)sizeof(c->conv) / 4, 1),
        fill(&c->delta[0][0], (int64_t)sizeof(c->delta) / 4, 0.5f);
    fill(c->w, SC * SKW, 0.6f), fill(c->dt, SV, 1);
    for (int h = 0; h < SV; h++) c->A[h] = -expf(-1.0f + 0.5f * tm_rng_normal(&rng));
    float *conv_d = upload(&g, c->conv, sizeof(c->conv)),
          *delta_d = upload(&g, c->delta, sizeof(c->delta));
    const tm_cuda_delta_params p = {SK,
                                    SV,
                                    SDK,
                                    SDV,
                                    false,
                                    true,
                                    upload(&g, c->A, sizeof(c->A)),
                                    upload(&g, c->dt, sizeof(c->dt))};
    const float *w_d = upload(&g, c->w, sizeof(c->w));
    float *x_d = dalloc(&g, SMAXT * SC * 4), *ba_d = dalloc(&g, SMAXT * 2 * SV * 4);
    float *out_d = dalloc(&g, SMAXT * SV * SDV * 4);
    int32_t *pos_d = dalloc(&g, SMAXT * 4), *seq_d = dalloc(&g, SMAXT * 4);
    float x[SMAXT * SC], ba[SMAXT * 2 * SV], out[SMAXT * SV * SDV], want[SMAXT * SV * SDV];
    float got_delta[SSEQ * SV * SDK * SDV];
    int32_t pos[SMAXT], seq[SMAXT];

    /* the prompt of sequence 1, launched directly */
    for (int t = 0; t < SPROMPT; t++) pos[t] = t, seq[t] = 1;
    fill(x, SPROMPT * SC, 1), fill(ba, SPROMPT * 2 * SV, 1);
    assert_int_equal(cuda_copy_to_device(g.dev, x_d, x, SPROMPT * SC * 4), TM_OK);
    assert_int_equal(cuda_copy_to_device(g.dev, ba_d, ba, sizeof(ba)), TM_OK);
    assert_int_equal(cuda_copy_to_device(g.dev, pos_d, pos, sizeof(pos)), TM_OK);
    assert_int_equal(cuda_copy_to_device(g.dev, seq_d, seq, sizeof(seq)), TM_OK);
    tm_cuda_ssm_rows rows = {pos_d, seq_d, SPROMPT, SSEQ};
    assert_int_equal(cuda_ssm_conv(&rows, x_d, SC, SKW, w_d, conv_d, g.s), TM_OK);
    assert_int_equal(cuda_delta_rule(&p, &rows, x_d, ba_d, ba_d, delta_d, out_d, g.s), TM_OK);
    download(&g, out, out_d, SPROMPT * SV * SDV * 4);
    ssm_cpu_step(c, pos, seq, SPROMPT, x, ba, want);
    expect_near(out, want, SPROMPT * SV * SDV, 1e-4, "prompt out");

    /* decode: one captured step of 3 rows, replayed at positions and sequences read
     * from the row arrays (sequence 0 from position 0, 2 from the state as it was) */
    rows.n_tok = 3;
    tm_cuda_graph *step;
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_ssm_conv(&rows, x_d, SC, SKW, w_d, conv_d, g.s), TM_OK);
    assert_int_equal(cuda_delta_rule(&p, &rows, x_d, ba_d, NULL, delta_d, out_d, g.s), TM_OK);
    assert_int_equal(cuda_graph_end(g.s, true, &step), TM_OK);
    for (int s = 0; s < SSTEPS; s++) {
        pos[0] = SPROMPT + s, seq[0] = 1, pos[1] = s, seq[1] = 0, pos[2] = 3 + s, seq[2] = 2;
        fill(x, 3 * SC, 1), fill(ba, 3 * 2 * SV, 1);
        assert_int_equal(cuda_copy_async(x_d, x, 3 * SC * 4, g.s), TM_OK);
        assert_int_equal(cuda_copy_async(ba_d, ba, 3 * 2 * SV * 4, g.s), TM_OK);
        assert_int_equal(cuda_copy_async(pos_d, pos, 3 * 4, g.s), TM_OK);
        assert_int_equal(cuda_copy_async(seq_d, seq, 3 * 4, g.s), TM_OK);
        assert_int_equal(cuda_graph_launch(step, g.s), TM_OK);
        assert_int_equal(cuda_stream_sync(g.s), TM_OK);
        download(&g, out, out_d, 3 * SV * SDV * 4);
        ssm_cpu_step(c, pos, seq, 3, x, ba, want);
        expect_near(out, want, 3 * SV * SDV, 1e-4, "decode out");
    }
    download(&g, got_delta, delta_d, sizeof(got_delta));
    expect_near(got_delta, &c->delta[0][0], SSEQ * SV * SDK * SDV, 1e-4, "delta state");
    /* a sequence the state does not hold is skipped, not a fault */
    seq[0] = SSEQ;
    assert_int_equal(cuda_copy_to_device(g.dev, seq_d, seq, 4), TM_OK);
    assert_int_equal(cuda_graph_launch(step, g.s), TM_OK);
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    cuda_graph_free(step);

    /* the gates: gated RMSNorm and SwiGLU against the CPU's, the rest by hand */
    enum { GR = 3, GN = 8, GW = 4 * GN };
    float gx[GR * GW], gz[GR * GW], gw[GN], gy[GR * GW], gref[GR * GW];
    fill(gx, GR * GW, 2), fill(gz, GR * GW, 2), fill(gw, GN, 1);
    float *gx_d = upload(&g, gx, sizeof(gx)), *gz_d = upload(&g, gz, sizeof(gz));
    assert_int_equal(
        cuda_rmsnorm_gated(gx_d, gz_d, upload(&g, gw, sizeof(gw)), GR, GW, GN, 1e-6f, g.s), TM_OK);
    download(&g, gy, gx_d, sizeof(gy));
    cpu_rmsnorm_gated(gref, gx, gz, gw, GR * GW / GN, GN, 1e-6f);
    expect_near(gy, gref, GR * GW, 1e-5, "rmsnorm_gated");
    assert_int_equal(cuda_copy_to_device(g.dev, gx_d, gx, sizeof(gx)), TM_OK);
    assert_int_equal(cuda_swiglu(gx_d, gx_d, gz_d, GR * GW, g.s), TM_OK);
    download(&g, gy, gx_d, sizeof(gy));
    cpu_swiglu(gref, gx, gz, GR * GW);
    expect_near(gy, gref, GR * GW, 1e-5, "swiglu");
    assert_int_equal(cuda_copy_to_device(g.dev, gx_d, gx, sizeof(gx)), TM_OK);
    assert_int_equal(cuda_gate_mul(gx_d, gz_d, GR * GW, g.s), TM_OK);
    download(&g, gy, gx_d, sizeof(gy));
    for (int i = 0; i < GR * GW; i++)
        assert_close(gy[i], gx[i] / (1 + exp(-(double)gz[i])), 1e-6 * (1 + fabs(gx[i])));
    float gs[GR], xo[GR * GW];
    fill(gs, GR, 2);
    float *y_d = upload(&g, gx, sizeof(gx)), *xa_d = upload(&g, gz, sizeof(gz));
    assert_int_equal(cuda_gate_add(xa_d, y_d, upload(&g, gs, sizeof(gs)), GR, GW, g.s), TM_OK);
    download(&g, gy, y_d, sizeof(gy));
    download(&g, xo, xa_d, sizeof(xo));
    for (int i = 0; i < GR * GW; i++) {
        const double yy = gx[i] / (1 + exp(-(double)gs[i / GW]));
        assert_close(gy[i], yy, 1e-6 * (1 + fabs(yy)));
        assert_close(xo[i], gz[i] + yy, 1e-6 * (1 + fabs(gz[i] + yy)));
    }
    float ua[GR * 3 * 2], ub[GR * 3 * 6]; /* 3 groups of [2 | 6] a row */
    float *ua_d = dalloc(&g, sizeof(ua)), *ub_d = dalloc(&g, sizeof(ub));
    assert_int_equal(cuda_copy_to_device(g.dev, gx_d, gx, sizeof(gx)), TM_OK);
    assert_int_equal(cuda_unzip(gx_d, ua_d, ub_d, GR, 3, 2, 6, g.s), TM_OK);
    download(&g, ua, ua_d, sizeof(ua));
    download(&g, ub, ub_d, sizeof(ub));
    for (int t = 0; t < GR; t++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 8; i++)
                assert_true((i < 2 ? ua[(t * 3 + j) * 2 + i] : ub[(t * 3 + j) * 6 + i - 2]) ==
                            gx[t * 24 + j * 8 + i]);
    free(c);
    gpu_close(&g);
}

int main(void) {
    mock_rng_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_products),     cmocka_unit_test(test_moe),
        cmocka_unit_test(test_router),       cmocka_unit_test(test_norm_rope_add),
        cmocka_unit_test(test_attention),    cmocka_unit_test(test_ssm),
        cmocka_unit_test(test_partial_rope), cmocka_unit_test(test_interleaved_rope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
