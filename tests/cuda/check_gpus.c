/* Spans of layers over two real GPUs (skipped with fewer): what the host mock's
 * test_mock_gpus and the matrix's matrix_gpus group check, on the real kernels, peer
 * copies and streams.
 *
 * 1. The placement matrix's spans (-dev CUDA0,CUDA1 -ts 1,1 and 1,3) on the tiny model and
 *    the 4-layer, 32-expert one against the double-precision reference forward.
 * 2. -dev CUDA1 alone and spans -ts 1,1 against -dev CUDA0 on the tiny model: the prompt's
 *    last logits and 64 greedy tokens. Each GPU runs the same kernels on the same inputs
 *    (the peer copy moves bytes), but not bit for bit: the expert kernels add a token's k
 *    experts with atomicAdd (moe_grouped.cu), in an order that changes from run to run
 *    (one float rounding a layer, ~1e-6 of the logits, seen on the H200 pair). An op that
 *    read an activation before the peer copy (or the other GPU's work) it waits on had
 *    finished reads stale or unset rows: errors of the logits' own size. So the logits
 *    must agree within TOL_SAME (relative L2, 10x what the order gives over a few layers)
 *    and the greedy tokens exactly, except from a step whose top two logits of the
 *    CUDA0 run lie within TIE of each other, where the runs may part (reported). The
 *    spans run five times in a row: a missing event wait shows up on some of them.
 * 3. With TM_CUDA_MODEL=path (the 30b-a3b preset): spans -ts 1,1 against one GPU after a
 *    12-token prompt, twice: precise (f32 activations: the atomicAdd order alone, over 48
 *    layers, so TOL_SAME_BIG = 1e-4) and normal (8-bit activations: one rounding that moves
 *    an activation across a q8 step changes that value by 1/127 of its block's largest,
 *    and 48 layers carry it on; seen 6.7e-4 on the H200 pair, so TOL_SAME_Q8 = 1e-2, a
 *    quarter of the CPU-vs-GPU bound of check_model): 64 greedy tokens as above each time.
 * The decode steps of spans replay one graph over both GPUs (the tiny model's rounds
 * check exec_graph_ready); CUDA0's run decodes with its own graph. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timing.h"
#include "exec/exec.h"
#include "matrix/placement_matrix.h"
#include "model/model.h"
#include "tier/gpus.h"

#define N_GEN        64
#define TOL_SAME     1e-5 /* relative L2 of the prompt's logits */
#define TOL_SAME_BIG 1e-4
#define TOL_SAME_Q8  1e-2
#define TIE          1e-3 /* top-two gap, relative to the logits' RMS */

static const pm_tolerance gpus_tol = {1.5e-2, 5e-3, 4e-2, 3e-2, 0.2}; /* as check_model's */

typedef struct gpus_run {
    int32_t toks[N_GEN];
    double gap[N_GEN]; /* each step's top-two gap over the logits' RMS */
    float *logits;     /* the prompt's last row */
    double ms;         /* the whole run, prompt and decode */
} gpus_run;

/* The greedy token; *gap: its lead over the runner-up, over the logits' RMS. */
static int32_t gpus_argmax(const float *x, int64_t n, double *gap) {
    int32_t b = 0;
    double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
        if (x[i] > x[b]) b = (int32_t)i;
    }
    double second = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    *gap = ((double)x[b] - second) / (sqrt(ss / (double)n) + 1e-30);
    return b;
}

static void gpus_run_one(tm_model *m, const char *dev, const char *split, bool precise,
                         const int32_t *prompt, int n_prompt, gpus_run *r) {
    tm_context_params p = {
        .n_ctx = 256, .n_batch = 16, .n_threads = 4, .n_gpu_layers = 1 << 20, .precise = precise};
    if (gpus_devices_parse("-dev", dev, &p.gpus) != TM_OK ||
        (split && gpus_split_parse("-ts", split, &p.gpus) != TM_OK))
        fail_msg("%s", tm_error_message());
    tm_context *c;
    if (model_context_create(m, &p, &c) != TM_OK)
        fail_msg("-dev %s -ts %s: %s", dev, split ? split : "-", tm_error_message());
    if (split) assert_int_equal(exec_gpu_count(c->exec), 2);
    const int64_t nv = m->cfg.n_vocab;
    const double t0 = tm_time_s();
    CHECK(model_decode(c, prompt, n_prompt, TM_MOE_PHASE_PROMPT, false));
    r->logits = xmalloc((size_t)nv * sizeof(float));
    memcpy(r->logits, c->logits, (size_t)nv * sizeof(float));
    for (int i = 0; i < N_GEN; i++) {
        r->toks[i] = gpus_argmax(c->logits, nv, &r->gap[i]);
        CHECK(model_decode(c, &r->toks[i], 1, TM_MOE_PHASE_DECODE, false));
    }
    if (!exec_graph_ready(c->exec)) fail_msg("-dev %s: decode steps without a graph", dev);
    r->ms = (tm_time_s() - t0) * 1e3;
    model_context_free(c);
}

/* b against a (-dev CUDA0): logits within TOL_SAME, greedy tokens the same up to a tie. */
static void gpus_same(const gpus_run *a, const gpus_run *b, int64_t nv, double tol,
                      const char *what) {
    double dd = 0, aa = 0, worst = 0;
    int64_t differ = 0;
    for (int64_t i = 0; i < nv; i++) {
        const double d = (double)a->logits[i] - b->logits[i];
        dd += d * d, aa += (double)a->logits[i] * a->logits[i];
        differ += d != 0, worst = fabs(d) > worst ? fabs(d) : worst;
    }
    const double rel = sqrt(dd / (aa + 1e-300));
    if (!(rel <= tol))
        fail_msg("%s: prompt logits %.3g from CUDA0's (relative L2, tol %.0e; %lld of %lld "
                 "differ, by up to %g)",
                 what, rel, tol, (long long)differ, (long long)nv, worst);
    int same = 0;
    while (same < N_GEN && a->toks[same] == b->toks[same]) same++;
    if (same < N_GEN && a->gap[same] >= TIE)
        fail_msg("%s: greedy token %d is %d, %d on CUDA0 (its lead there %.3g of the RMS: no "
                 "tie)",
                 what, same, b->toks[same], a->toks[same], a->gap[same]);
    printf("  %s: prompt logits %.2g from CUDA0's (%lld of %lld differ, by up to %.2g); ", what,
           rel, (long long)differ, (long long)nv, worst);
    if (same < N_GEN)
        printf("greedy tokens as CUDA0's up to step %d, a near tie (lead %.2g)", same,
               a->gap[same]);
    else
        printf("%d greedy tokens as CUDA0's", N_GEN);
    printf(" (%.0f ms, CUDA0 %.0f ms)\n", b->ms, a->ms);
}

static void gpus_compare(const char *path, bool precise, double tol, const int32_t *prompt,
                         int n_prompt, bool cuda1, int rounds) {
    tm_model *m;
    CHECK(model_load(path, &m));
    const int64_t nv = m->cfg.n_vocab;
    printf("  %s, %s:\n", path, precise ? "precise" : "normal");
    gpus_run r0, r;
    gpus_run_one(m, "CUDA0", NULL, precise, prompt, n_prompt, &r0);
    if (cuda1) {
        gpus_run_one(m, "CUDA1", NULL, precise, prompt, n_prompt, &r);
        gpus_same(&r0, &r, nv, tol, "-dev CUDA1");
        free(r.logits);
    }
    for (int i = 0; i < rounds; i++) {
        gpus_run_one(m, "CUDA0,CUDA1", "1,1", precise, prompt, n_prompt, &r);
        char what[128];
        snprintf(what, sizeof(what), "-dev CUDA0,CUDA1 -ts 1,1, round %d", i + 1);
        gpus_same(&r0, &r, nv, tol, what);
        free(r.logits);
    }
    free(r0.logits);
    model_free(m);
}

void check_gpus(void **state) {
    (void)state;
    NEED_DEVICE();
    int n = 0;
    CHECK(cuda_device_count(&n));
    if (n < 2) {
        printf("skipped: %d CUDA device (spans need two)\n", n);
        skip();
    }
    char tiny[512], wide[512];
    pm_model_write(tiny, sizeof(tiny), "cuda_gpus_tiny.gguf", 3, 16, TM_TYPE_Q8_0);
    pm_model_write(wide, sizeof(wide), "cuda_gpus_4x32.gguf", 4, 32, TM_TYPE_Q4_K);
    placement_matrix_run_gpus(tiny, &gpus_tol);
    placement_matrix_run_gpus(wide, &gpus_tol);
    const int32_t prompt[12] = {5, 77, 301, 12, 90, 44, 7, 19, 250, 3, 61, 128};
    gpus_compare(tiny, false, TOL_SAME, prompt, 12, true, 5);
    remove(tiny), remove(wide);
    const char *big = getenv("TM_CUDA_MODEL");
    if (!big) return;
    gpus_compare(big, true, TOL_SAME_BIG, prompt, 12, false, 2);
    gpus_compare(big, false, TOL_SAME_Q8, prompt, 12, false, 2);
}

#endif /* TM_HAVE_CUDA */
