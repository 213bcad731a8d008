/* Spans of layers over two real GPUs (skipped with fewer): what the host mock's
 * test_mock_gpus and the matrix's matrix_gpus group check, on the real kernels, peer
 * copies and streams.
 *
 * 1. The placement matrix's spans (-dev CUDA0,CUDA1 -ts 1,1 and 1,3) on the tiny model and
 *    the 4-layer, 32-expert one against the double-precision reference forward.
 * 2. -dev CUDA1 alone and spans -ts 1,1 against -dev CUDA0 on the tiny model, precise and normal: the logits of
 *    the prompt's last row and of each of 64 greedy decode steps. Each GPU runs the same
 *    kernels on the same inputs (the peer copy moves bytes), but not bit for bit: the expert
 *    kernels add a token's k experts with atomicAdd (moe_grouped.cu), in an order that
 *    changes from run to run (one float rounding a layer; 1e-6 of the tiny model's logits,
 *    4e-5 of the 30b file's in the precise mode, seen on the H200 pair), and greedy runs
 *    part where two logits are that close (the 30b file's at step 23 of one run, a lead of
 *    2.7e-3 of the RMS after 22 steps of such differences). An op that read an activation
 *    before the peer copy (or the other GPU's work) it waits on had finished reads stale or
 *    unset rows: errors of the logits' own size. So every step's logits, up to and with the
 *    first where the greedy tokens part, must agree within a tolerance far above the order's
 *    and far below a stale read's (relative L2: the precise mode TOL_TINY 1e-4 and the 30b
 *    file's TOL_BIG 1e-2; the normal mode with 8-bit activations, where one rounding moves a
 *    value across a q8 step, TOL_Q8 5e-2: the tiny model's spans were 1.4e-3 from CUDA0's at
 *    one step of 320 on the H200 pair, 2.6e-7 elsewhere); tokens after they part are not
 *    compared (reported).
 *    The spans run five times in a row: a missing event wait shows up on some of them.
 * 3. With TM_CUDA_MODEL=path (the 30b-a3b preset): spans -ts 1,1 against one GPU after a
 *    12-token prompt, twice in each mode (as above).
 * The decode steps of spans replay one graph over both GPUs (each run checks
 * exec_graph_ready); CUDA0's run decodes with its own graph. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timing.h"
#include "exec/exec.h"
#include "greedy_test_util.h"
#include "matrix/placement_matrix.h"
#include "model/model.h"
#include "tier/gpus.h"

#define N_GEN    64
#define TOL_TINY 1e-4 /* relative L2 of a step's logits */
#define TOL_BIG  1e-2
#define TOL_Q8   5e-2

static const pm_tolerance gpus_tol = {PM_GPU_TOL_PROMPT,    PM_GPU_TOL_DECODE,
                                      PM_GPU_TOL_QUANT,     PM_GPU_REF_TIE,
                                      PM_GPU_REF_TIE_QUANT, 0}; /* check_model's */

typedef struct gpus_run {
    int32_t toks[N_GEN];
    float *logits; /* [N_GEN + 1][n_vocab]: the prompt's last row, then each decode step's */
    double ms;     /* the whole run, prompt and decode */
} gpus_run;

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
    r->logits = xmalloc((size_t)((N_GEN + 1) * nv) * sizeof(float));
    const double t0 = tm_time_s();
    CHECK(model_decode(c, prompt, n_prompt, TM_MOE_PHASE_PROMPT, false));
    for (int i = 0; i < N_GEN; i++) {
        memcpy(r->logits + i * nv, c->logits, (size_t)nv * sizeof(float));
        r->toks[i] = test_argmax(c->logits, nv);
        CHECK(model_decode(c, &r->toks[i], 1, TM_MOE_PHASE_DECODE, false));
    }
    memcpy(r->logits + N_GEN * nv, c->logits, (size_t)nv * sizeof(float));
    if (!exec_graph_ready(c->exec)) fail_msg("-dev %s: decode steps without a graph", dev);
    r->ms = (tm_time_s() - t0) * 1e3;
    model_context_free(c);
}

/* b against a (-dev CUDA0): each step's logits within tol up to and with the step where
 * the greedy tokens part. */
static void gpus_same(const gpus_run *a, const gpus_run *b, int64_t nv, double tol,
                      const char *what) {
    int same = 0;
    while (same < N_GEN && a->toks[same] == b->toks[same]) same++;
    double worst = 0;
    int at = 0;
    for (int i = 0; i <= same && i <= N_GEN; i++) { /* row i: the logits before token i */
        const float *x = a->logits + i * nv, *y = b->logits + i * nv;
        double dd = 0, aa = 0;
        for (int64_t j = 0; j < nv; j++) {
            const double d = (double)x[j] - y[j];
            dd += d * d, aa += (double)x[j] * x[j];
        }
        const double rel = sqrt(dd / (aa + 1e-300));
        if (!(rel <= tol))
            fail_msg("%s: the logits of %s %d are %.3g from CUDA0's (relative L2, tol %.0e)", what,
                     i ? "decode step" : "the prompt", i, rel, tol);
        if (rel > worst) worst = rel, at = i;
    }
    printf("  %s: logits within %.2g of CUDA0's (worst at step %d), ", what, worst, at);
    if (same < N_GEN)
        printf("greedy tokens as CUDA0's up to step %d, where the two runs' logits part at a "
               "near tie",
               same);
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
    gpus_compare(tiny, true, TOL_TINY, prompt, 12, true, 5);
    gpus_compare(tiny, false, TOL_Q8, prompt, 12, true, 5);
    remove(tiny), remove(wide);
    const char *big = getenv("TM_CUDA_MODEL");
    if (!big) return;
    gpus_compare(big, true, TOL_BIG, prompt, 12, false, 2);
    gpus_compare(big, false, TOL_Q8, prompt, 12, false, 2);
}

#endif /* TM_HAVE_CUDA */
