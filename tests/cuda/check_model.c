/* The whole model on the GPU (-ngl all, and a split -ngl 2) against the CPU
 * engine on the same tokens: a prompt in two batches (the tensor-core path),
 * then decode steps through the KV cache (matrix-vector kernels, the captured
 * graph), logits compared at every step.
 *
 * Reference: the CPU's precise mode (double products of the dequantized
 * weights, f32 KV), independent of every GPU kernel.
 * Tolerance on the relative L2 error of the logits, ||gpu - cpu|| / ||cpu||:
 *   - decode: activations stay f32 and the weights are dequantized exactly,
 *     so what is left is f32 accumulation (sqrt(n) u, n <= 2048: 3e-6) and, with
 *     an f16 KV cache, the rounding of K and V (2^-11 = 4.9e-4 relative per
 *     value, averaging down over a head's dot product). TOL_DECODE = 5e-3
 *     covers a few layers with a 10x margin over 4.9e-4;
 *   - prompt batches round activations and weights to f16 for the tensor
 *     cores: 2 x 2^-11 relative per product input pair, about 1e-3 per stage;
 *     four stages a layer (q/k/v, attention with f16 K/V, output, experts) over
 *     3 layers, added along the residual stream: TOL_PROMPT = 1.5e-2.
 * With -ngl 2 of 3 the last layer runs on the CPU in its normal mode (8-bit
 * activations), so that case takes TOL_QUANT below.
 * Routing must match exactly (top-k ids from the tensor callback) except at a
 * near tie: CPU k-th and (k+1)-th router logits closer than TIE (TIE_QUANT
 * where either side runs the CPU's 8-bit activations). A step with
 * such a tie is reported and its logits are not compared.
 * Greedy generation of 64 tokens from the GPU (decode graph) equals the CPU's.
 * TM_CUDA_MODEL=path adds the same comparison on that model (the 30b-a3b
 * preset on the device machine), first 16 tokens, against the CPU's normal
 * mode (4% tolerance: the 8-bit activation error derived in
 * tests/oracle/test_forward_ref.py). */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/synth.h"

#define TOL_DECODE 5e-3
#define TOL_PROMPT 1.5e-2
#define TOL_QUANT  4e-2
#define TIE        1e-3
#define TIE_QUANT  2e-2 /* 8-bit activations move router logits by up to ~1e-2 */

/* What the tensor callback keeps of one forward call: the top-k ids and the
 * router logits of every layer (the last call only). */
typedef struct route_log {
    int n_layer, k, n_expert;
    int64_t n_tok;
    int32_t *ids;  /* [n_layer][n_tok][k] */
    float *logits; /* [n_layer][n_tok][n_expert] */
} route_log;

static void route_cb(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                     int64_t n, bool is_int) {
    route_log *r = ud;
    if (layer < 0 || n_tok > r->n_tok) return;
    if (!strcmp(name, "topk_ids") && is_int)
        memcpy(r->ids + (int64_t)layer * r->n_tok * r->k, data, (size_t)(n_tok * n) * 4);
    if (!strcmp(name, "router_logits"))
        memcpy(r->logits + (int64_t)layer * r->n_tok * r->n_expert, data, (size_t)(n_tok * n) * 4);
}

static void route_log_init(route_log *r, const tm_model *m, int64_t n_tok) {
    r->n_layer = (int)m->cfg.n_layer, r->k = (int)m->cfg.n_expert_used;
    r->n_expert = (int)m->cfg.n_expert, r->n_tok = n_tok;
    r->ids = xmalloc((size_t)(r->n_layer * n_tok * r->k) * 4);
    r->logits = xmalloc((size_t)(r->n_layer * n_tok * r->n_expert) * 4);
}

/* Number of (layer, token) routings that differ; fails on one that is not a near tie. */
static int route_compare(const route_log *cpu, const route_log *gpu, int64_t n_tok, double tie,
                         const char *what) {
    int ties = 0;
    float *sorted = xmalloc((size_t)cpu->n_expert * 4);
    for (int l = 0; l < cpu->n_layer; l++)
        for (int64_t t = 0; t < n_tok; t++) {
            const int32_t *a = cpu->ids + ((int64_t)l * cpu->n_tok + t) * cpu->k;
            const int32_t *b = gpu->ids + ((int64_t)l * gpu->n_tok + t) * gpu->k;
            bool same = true;
            for (int j = 0; j < cpu->k; j++) {
                bool found = false;
                for (int i = 0; i < cpu->k; i++) found |= a[j] == b[i];
                same &= found;
            }
            if (same) continue;
            const float *lg = cpu->logits + ((int64_t)l * cpu->n_tok + t) * cpu->n_expert;
            memcpy(sorted, lg, (size_t)cpu->n_expert * 4);
            for (int i = 0; i <= cpu->k && i < cpu->n_expert; i++) /* partial selection sort */
                for (int j = i + 1; j < cpu->n_expert; j++)
                    if (sorted[j] > sorted[i]) {
                        const float x = sorted[i];
                        sorted[i] = sorted[j], sorted[j] = x;
                    }
            const double gap = sorted[cpu->k - 1] - sorted[cpu->k];
            if (!(gap < tie))
                fail_msg("%s: layer %d token %lld routed differently on the GPU, CPU margin %.3g",
                         what, l, (long long)t, gap);
            printf("  %s: near tie at layer %d token %lld (margin %.2g): routing differs\n", what,
                   l, (long long)t, gap);
            ties++;
        }
    free(sorted);
    return ties;
}

static double rel_l2(const float *a, const float *ref, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        e += d * d, r += (double)ref[i] * ref[i];
    }
    return sqrt(e / (r + 1e-300));
}

typedef struct model_run {
    tm_context *ctx;
    route_log route;
} model_run;

static void model_run_open(model_run *r, tm_model *m, int ngl, bool precise, tm_type kv,
                           int64_t n_batch, int n_threads) {
    route_log_init(&r->route, m, n_batch);
    tm_context_params cp = {.n_ctx = 256,
                            .n_batch = n_batch,
                            .n_threads = n_threads,
                            .kv_type = kv,
                            .precise = precise,
                            .n_gpu_layers = ngl,
                            .cb = route_cb,
                            .cb_ud = &r->route};
    CHECK(model_context_create(m, &cp, &r->ctx));
}

static void model_run_close(model_run *r) {
    model_context_free(r->ctx);
    free(r->route.ids), free(r->route.logits);
}

/* A prompt of n_prompt tokens in batches, then n_decode single steps; logits
 * compared after each call. */
static void compare_runs(tm_model *m, const int32_t *toks, int64_t n_prompt, int64_t n_decode,
                         model_run *cpu, model_run *gpu, double tol_prompt, double tol_decode,
                         double tie, const char *what) {
    const int64_t V = m->cfg.n_vocab, B = cpu->ctx->params.n_batch;
    double worst_p = 0, worst_d = 0;
    int ties = 0;
    for (int64_t i = 0; i < n_prompt + n_decode;) {
        const int64_t n = i < n_prompt ? (n_prompt - i < B ? n_prompt - i : B) : 1;
        const tm_moe_phase ph = i < n_prompt ? TM_MOE_PHASE_PROMPT : TM_MOE_PHASE_DECODE;
        CHECK(model_decode(cpu->ctx, toks + i, n, ph, false));
        CHECK(model_decode(gpu->ctx, toks + i, n, ph, false));
        const int t = route_compare(&cpu->route, &gpu->route, n, tie, what);
        ties += t;
        const double err = rel_l2(gpu->ctx->logits, cpu->ctx->logits, V);
        const double tol = n > TM_CUDA_MMVQ_MAX_TOK ? tol_prompt : tol_decode;
        if (!t && !(err <= tol))
            fail_msg("%s: logits after tokens [%lld, %lld): relative error %.3g > %.3g", what,
                     (long long)i, (long long)(i + n), err, tol);
        if (!t && n > TM_CUDA_MMVQ_MAX_TOK) worst_p = fmax(worst_p, err);
        if (!t && n <= TM_CUDA_MMVQ_MAX_TOK) worst_d = fmax(worst_d, err);
        i += n;
    }
    printf("%s: worst logits error prompt %.3g (tol %.3g), decode %.3g (tol %.3g), %d near ties\n",
           what, worst_p, tol_prompt, worst_d, tol_decode, ties);
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

static void greedy(tm_context *ctx, int32_t first, int n, int32_t *out) {
    int32_t id = first;
    for (int i = 0; i < n; i++) {
        CHECK(model_decode(ctx, &id, 1, TM_MOE_PHASE_DECODE, false));
        out[i] = id = argmax(ctx->logits, ctx->model->cfg.n_vocab);
    }
}

void check_model(void **state) {
    (void)state;
    NEED_DEVICE();
    /* the model holds its own device: give the harness's memory back meanwhile */
    char path[512];
    const char *tmp = getenv("TM_TEST_TMP");
    snprintf(path, sizeof(path), "%s/cuda_tiny.gguf", tmp ? tmp : "/tmp");
    tm_synth_config sc;
    CHECK(synth_config_preset(&sc, "tiny"));
    sc.n_layer = 3, sc.n_threads = 2, sc.seed = 11;
    CHECK(synth_model_write(&sc, path));
    tm_model *m;
    CHECK(model_load(path, &m));
    tm_rng r;
    tm_rng_seed(&r, 7);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % m->cfg.n_vocab);

    static const struct {
        int ngl;
        tm_type kv;
        const char *what;
    } cases[] = {{1 << 20, TM_TYPE_F32, "ngl all, f32 KV"},
                 {1 << 20, TM_TYPE_F16, "ngl all, f16 KV"},
                 {2, TM_TYPE_F16, "ngl 2 of 3, f16 KV"}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        model_run cpu, gpu;
        model_run_open(&cpu, m, 0, true, TM_TYPE_F32, 24, 2);
        model_run_open(&gpu, m, cases[c].ngl, false, cases[c].kv, 24, 2);
        assert_int_equal(gpu.ctx->n_gpu_layers, cases[c].ngl > 3 ? 3 : cases[c].ngl);
        /* 40 prompt tokens: batches of 24 (tensor cores) and 16, then 16 decode steps */
        /* a split run's CPU layers use the normal mode (8-bit activations) */
        const bool split = cases[c].ngl < 3;
        compare_runs(m, toks, 40, 16, &cpu, &gpu, split ? TOL_QUANT : TOL_PROMPT,
                     split ? TOL_QUANT : TOL_DECODE, split ? TIE_QUANT : TIE, cases[c].what);
        model_run_close(&cpu), model_run_close(&gpu);
    }

    /* greedy: 64 tokens from the decode graph (no callback) against the CPU */
    tm_context *cpu, *gpu;
    tm_context_params cp = {
        .n_ctx = 128, .n_batch = 16, .n_threads = 2, .precise = true, .kv_type = TM_TYPE_F32};
    CHECK(model_context_create(m, &cp, &cpu));
    cp.precise = false, cp.n_gpu_layers = 1 << 20;
    CHECK(model_context_create(m, &cp, &gpu));
    int32_t a[64], b[64];
    greedy(cpu, toks[0], 64, a);
    greedy(gpu, toks[0], 64, b);
    for (int i = 0; i < 64; i++)
        if (a[i] != b[i]) fail_msg("greedy token %d: CPU %d, GPU %d", i, a[i], b[i]);
    printf("greedy: 64 tokens identical\n");
    model_context_free(cpu), model_context_free(gpu);
    model_free(m);
    remove(path);

    const char *big = getenv("TM_CUDA_MODEL");
    if (!big) return;
    CHECK(model_load(big, &m));
    for (int i = 0; i < 16; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % m->cfg.n_vocab);
    model_run c1, g1;
    model_run_open(&c1, m, 0, false, TM_TYPE_F16, 16, 0);
    model_run_open(&g1, m, 1 << 20, false, TM_TYPE_F16, 16, 0);
    /* 12 prompt tokens (one tensor-core batch), then 4 decode steps */
    compare_runs(m, toks, 12, 4, &c1, &g1, TOL_QUANT, TOL_QUANT, TIE_QUANT, big);
    model_run_close(&c1), model_run_close(&g1);
    model_free(m);
}

#endif /* TM_HAVE_CUDA */
