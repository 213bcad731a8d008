/* A context on one GPU of two (MOCK_GPUS=2): the GPU list's contexts run where they
 * were placed, from whichever thread decodes.
 *
 * - -dev CUDA1 gives the same logits and greedy tokens as -dev CUDA0 (the same mock
 *   arithmetic; the matrix compares CUDA0 with the double reference), with its pools
 *   on the second device.
 * - Decoding on another thread than the one that made the context (serve's slots, an
 *   API user's threads): the mock, as CUDA, launches only on the thread's current
 *   device, so this passes only if each step selects its device.
 * - -dev CUDA0,CUDA1 -ts 1,0 opens both and runs on the first (the device opened last is
 *   current: the executor selects its own before allocating).
 * - Spans over both GPUs (-ts 1,1) with the experts on the GPUs: the same logits and
 *   greedy tokens as on one GPU (the executor's state a GPU, the residual crossing by a
 *   peer copy), the decode steps replaying one graph over both GPUs (the second GPU's
 *   stream joined to the first's capture, each node replayed on its own GPU); with
 *   experts in RAM (--cpu-moe) the same as --cpu-moe on one GPU (the CPU lane for both
 *   GPUs' layers); --moe-cache 1,1: each GPU caches its own layers' experts.
 * - Copies ahead over both GPUs (test_ahead_two): each GPU's own, into a buffer and into
 *   its cached layers' slots, counted on both GPUs' layers, logits and greedy tokens as
 *   one GPU's. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "greedy_test_util.h"
#include "model/model.h"
#include "model/model_profile.h"
#include "model/synth.h"

#define N_PROMPT 6
#define N_GEN    64

static char model_path[512], model4_path[512]; /* the tiny preset; with 4 layers */

typedef struct run {
    tm_context *c;
    int32_t toks[N_GEN];
    float *logits; /* the prompt's last row */
    tm_status st;
    char err[512]; /* the message of a failure (tm_error_message is a thread's own) */
} run;

static void *decode(void *p) {
    run *r = p;
    const int32_t prompt[N_PROMPT] = {5, 77, 301, 12, 90, 44};
    const int64_t nv = r->c->model->cfg.n_vocab;
    r->st = model_decode(r->c, prompt, N_PROMPT, TM_MOE_PHASE_PROMPT, false);
    if (r->st != TM_OK) {
        snprintf(r->err, sizeof(r->err), "%s", tm_error_message());
        return NULL;
    }
    r->logits = malloc((size_t)nv * sizeof(float));
    memcpy(r->logits, r->c->logits, (size_t)nv * sizeof(float));
    for (int i = 0; i < N_GEN && r->st == TM_OK; i++) {
        r->toks[i] = test_argmax(r->c->logits, nv);
        r->st = model_decode(r->c, &r->toks[i], 1, TM_MOE_PHASE_DECODE, false);
    }
    if (r->st != TM_OK) snprintf(r->err, sizeof(r->err), "%s", tm_error_message());
    return NULL;
}

static bool cpu_moe, profile; /* the runs below: --cpu-moe, --profile */

static tm_context_params params(const char *dev, const char *split) {
    /* --cpu-moe: on one GPU too the CPU lane alone (the GPUs' lanes for experts in RAM
       compute on the mock's arithmetic, so with them the runs would part at a near tie) */
    tm_context_params p = {.n_ctx = 128,
                           .n_batch = 8,
                           .n_threads = 2,
                           .n_gpu_layers = 99,
                           .cpu_moe = cpu_moe,
                           .moe_pcie = cpu_moe ? TM_MOE_PCIE_OFF : 0,
                           .moe_fetch = cpu_moe ? TM_MOE_FETCH_OFF : 0,
                           .moe_ahead = cpu_moe ? TM_MOE_AHEAD_OFF : 0,
                           .profile = profile};
    if (dev && gpus_devices_parse("-dev", dev, &p.gpus) != TM_OK)
        fail_msg("%s", tm_error_message());
    if (split && gpus_split_parse("-ts", split, &p.gpus) != TM_OK)
        fail_msg("%s", tm_error_message());
    return p;
}

/* Make a context for dev / split and decode on this thread or another. */
static void run_on(tm_model *m, const char *dev, const char *split, bool thread, run *r) {
    memset(r, 0, sizeof(*r));
    const tm_context_params p = params(dev, split);
    if (model_context_create(m, &p, &r->c) != TM_OK)
        fail_msg("-dev %s: %s", dev, tm_error_message());
    if (thread) {
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, decode, r), 0);
        pthread_join(t, NULL);
    } else {
        decode(r);
    }
    if (r->st != TM_OK) fail_msg("-dev %s%s: %s", dev, thread ? " (a thread)" : "", r->err);
}

static void run_free(run *r) {
    model_context_free(r->c);
    free(r->logits);
}

static void same(const run *a, const run *b, int64_t nv, const char *what) {
    for (int64_t i = 0; i < nv; i++)
        if (a->logits[i] != b->logits[i])
            fail_msg("%s: logit %lld is %g, %g on CUDA0", what, (long long)i, (double)b->logits[i],
                     (double)a->logits[i]);
    for (int i = 0; i < N_GEN; i++)
        if (a->toks[i] != b->toks[i])
            fail_msg("%s: token %d is %d, %d on CUDA0", what, i, b->toks[i], a->toks[i]);
}

/* The peer copies into each GPU (exec_peer_stats) against the placement: a copy a step
 * for each span boundary into the GPU (the GPU sequence of the layers and the output
 * head changes), of the step's rows x n_embd floats (the residual), counted in graph
 * replays as in eager steps. Profiled (MOCK_GPU_LATENCY_US: each closure but event
 * records sleeps that long first): each copy takes at least that long, and so does
 * each GPU's hot lane a layer step; --profile's line for the GPU says it. */
static void peer_check(const run *r, const tm_model *m, long latency_us) {
    const tm_placement *pl = &r->c->placement;
    uint64_t steps, rows;
    exec_step_counts(r->c->exec, &steps, &rows);
    assert_int_equal(steps, 1 + N_GEN), assert_int_equal(rows, N_PROMPT + N_GEN);
    int into[2] = {0, 0}, prev = pl->layer_gpu[0];
    for (uint32_t l = 1; l <= pl->n_layer; l++) {
        const int g = l < pl->n_layer ? pl->layer_gpu[l] : pl->output_gpu_index;
        if (g != prev) into[g]++;
        prev = g;
    }
    assert_int_equal(into[0] + into[1], 1); /* -ts 1,1: layers 0-1 on GPU 0, the rest on 1 */
    int n_gpu = 0;
    const tm_tier_stats *gs = tier_stats_gpu(r->c->tier, &n_gpu);
    assert_int_equal(n_gpu, 2);
    for (int g = 0; g < 2; g++) {
        const tm_exec_peer_stats p = exec_peer_stats(r->c->exec, g);
        assert_int_equal(p.copies, (uint64_t)into[g] * steps);
        assert_int_equal(p.bytes, (uint64_t)into[g] * rows * m->cfg.n_embd * sizeof(float));
        if (!latency_us) {
            assert_int_equal(p.ns, 0);
            continue;
        }
        if (p.ns < p.copies * (uint64_t)latency_us * 1000)
            fail_msg("GPU %d: %llu peer copies timed %llu ns", g, (unsigned long long)p.copies,
                     (unsigned long long)p.ns);
        if (gs[g].hot_ns < gs[g].calls * (uint64_t)latency_us * 1000)
            fail_msg("GPU %d: %llu layer steps, hot lane timed %llu ns", g,
                     (unsigned long long)gs[g].calls, (unsigned long long)gs[g].hot_ns);
    }
    if (!latency_us) return;
    char *text = NULL, want[128];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    model_profile_print(r->c, NULL, NULL, NULL, 1, f);
    fclose(f);
    const int g = into[0] ? 0 : 1;
    snprintf(want, sizeof(want), "peer copies: 1.00 a step, %.2f KB a token", m->cfg.n_embd * 4e-3);
    const char *line = strstr(text, g ? "  GPU 1 (" : "  GPU 0 (");
    if (!line || !strstr(line, want) || strchr(line, '\n') < strstr(line, want))
        fail_msg("no '%s' in GPU %d's profile line:\n%s", want, g, text);
    free(text);
}

static void test_one_of_two(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(model_path, &m), TM_OK);
    const int64_t nv = m->cfg.n_vocab;
    run r0, r1, rt, rs;
    run_on(m, "CUDA0", NULL, false, &r0);
    assert_int_equal(cuda_device_info(exec_gpu(r0.c->exec))->index, 0);
    run_on(m, "CUDA1", NULL, false, &r1);
    assert_int_equal(cuda_device_info(exec_gpu(r1.c->exec))->index, 1);
    same(&r0, &r1, nv, "-dev CUDA1");
    /* CUDA0's pools gone with its context, CUDA1's still held */
    size_t f0, f1, t0;
    run_free(&r0);
    assert_int_equal(cuda_device_memory(exec_gpu(r1.c->exec), &f1, NULL), TM_OK);
    run_on(m, "CUDA1", NULL, true, &rt);
    same(&r1, &rt, nv, "-dev CUDA1 decoded on another thread");
    run_free(&rt);
    run_on(m, "CUDA0,CUDA1", "1,0", false, &rs);
    assert_int_equal(cuda_device_info(exec_gpu(rs.c->exec))->index, 0);
    assert_int_equal(cuda_device_memory(exec_gpu(rs.c->exec), &f0, &t0), TM_OK);
    assert_true(f0 < t0); /* its pools on CUDA0 */
    same(&r1, &rs, nv, "-dev CUDA0,CUDA1 -ts 1,0");
    run_free(&rs);
    assert_true(f1 < ((size_t)4096 << 20));
    run_free(&r1);

    /* spans over both with every layer's experts on the GPUs: runs, as on one GPU */
    run r0b, rsp;
    run_on(m, "CUDA0", NULL, false, &r0b);
    run_on(m, "CUDA0,CUDA1", "1,1", false, &rsp);
    assert_int_equal(exec_gpu_count(rsp.c->exec), 2);
    assert_int_equal(rsp.c->placement.n_gpu_used, 2);
    assert_true(exec_graph_ready(rsp.c->exec)); /* one graph over both GPUs' spans */
    same(&r0b, &rsp, nv, "-dev CUDA0,CUDA1 -ts 1,1 (spans)");
    peer_check(&rsp, m, 0);
    run_free(&r0b), run_free(&rsp);
    /* profiled: eager steps, each GPU's lanes and peer copies timed with its own events */
    profile = true;
    setenv("MOCK_GPU_LATENCY_US", "100", 1);
    run_on(m, "CUDA0,CUDA1", "1,1", false, &rsp);
    unsetenv("MOCK_GPU_LATENCY_US");
    profile = false;
    assert_false(exec_graph_ready(rsp.c->exec));
    peer_check(&rsp, m, 100);
    run_free(&rsp);

    /* spans with experts in RAM (--cpu-moe): the CPU lane takes both GPUs' layers' experts
       (one mailbox, each GPU's router counts and slot maps), as on one GPU, decode steps
       replaying one graph with the hand-offs in it */
    cpu_moe = true;
    run c0, c2;
    run_on(m, "CUDA0", NULL, false, &c0);
    run_on(m, "CUDA0,CUDA1", "1,1", false, &c2);
    assert_int_equal(exec_gpu_count(c2.c->exec), 2);
    assert_true(exec_graph_ready(c2.c->exec));
    same(&c0, &c2, nv, "--cpu-moe -dev CUDA0,CUDA1 -ts 1,1 (spans, experts in RAM)");
    run_free(&c0), run_free(&c2);

    /* each GPU's VRAM cache of its own layers' experts (--moe-cache A,B): both GPUs' cached
       layers compute routed slots on their GPU, and the logits stay as one GPU's within the
       8-bit activations' difference between the CPU lane and the GPU (TOL_QUANT's) */
    {
        run k2;
        tm_context_params p = params("CUDA0,CUDA1", "1,1");
        if (gpus_cache_parse("--moe-cache", "1,1", &p.gpus) != TM_OK)
            fail_msg("%s", tm_error_message());
        memset(&k2, 0, sizeof(k2));
        if (model_context_create(m, &p, &k2.c) != TM_OK) fail_msg("%s", tm_error_message());
        decode(&k2);
        if (k2.st != TM_OK) fail_msg("--moe-cache 1,1 (spans): %s", k2.err);
        const tm_tier_stats *ts = tier_stats(k2.c->tier);
        assert_int_equal(ts[TM_TIER_CACHED].layers, 3);
        assert_true(ts[TM_TIER_CACHED].hot_slots > 0 && ts[TM_TIER_CACHED].cold_slots > 0);
        int per_gpu[2] = {0, 0};
        for (uint32_t l = 0; l < 3; l++)
            per_gpu[k2.c->placement.layer_gpu[l]] += tier_cache_slots(k2.c->tier, l) > 0;
        assert_int_equal(per_gpu[0], 2), assert_int_equal(per_gpu[1], 1);
        /* --profile's per-GPU counts: each GPU's layers, and together the classes' slots */
        int n_gpu = 0;
        const tm_tier_stats *gs = tier_stats_gpu(k2.c->tier, &n_gpu);
        assert_int_equal(n_gpu, 2);
        assert_int_equal(gs[0].layers, 2), assert_int_equal(gs[1].layers, 1);
        assert_true(gs[0].hot_slots > 0 && gs[1].hot_slots > 0);
        assert_true(gs[0].hot_slots + gs[1].hot_slots == ts[TM_TIER_CACHED].hot_slots);
        assert_true(gs[0].cold_slots + gs[1].cold_slots == ts[TM_TIER_CACHED].cold_slots);
        run_free(&k2);
    }

    cpu_moe = false;
    model_free(m);
}

/* Relative L2 distance of a's logits from b's. */
static double rel_l2(const float *a, const float *b, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        e += d * d, s += (double)b[i] * b[i];
    }
    return sqrt(e / (s + 1e-300));
}

/* The copies ahead over both GPUs (4 layers: GPU 0 layers 0-1, GPU 1 layers 2-3), the
 * CPU lane beside them alone (--moe-pcie off --moe-fetch off), precise: into a buffer
 * (--moe-ahead 2) and into each GPU's cached layers' slots (--moe-cache 1,1, auto). Each
 * GPU's second layer gets copies from its first (layers 1 and 3), decoding as one graph
 * over both GPUs, the lane's stream of each GPU forked from and joined to its compute
 * stream; the logits as one GPU's (where layer 2 gets copies too: the mock's GPU
 * arithmetic against the CPU lane's, both in double) and the same greedy tokens. */
static void test_ahead_two(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(model4_path, &m), TM_OK);
    const int64_t nv = m->cfg.n_vocab;
    const char *cache[] = {NULL, "1,1"};
    for (int ci = 0; ci < 2; ci++) {
        run one, two;
        for (int g = 0; g < 2; g++) {
            run *r = g ? &two : &one;
            tm_context_params p = params(g ? "CUDA0,CUDA1" : "CUDA0", g ? "1,1" : NULL);
            p.cpu_moe = true, p.precise = true;
            p.moe_pcie = TM_MOE_PCIE_OFF, p.moe_fetch = TM_MOE_FETCH_OFF;
            p.moe_ahead = cache[ci] ? TM_MOE_AHEAD_AUTO : 2;
            if (cache[ci] && !g) p.moe_cache_mib = 2; /* the two GPUs' budgets on one */
            if (cache[ci] && g && gpus_cache_parse("--moe-cache", cache[ci], &p.gpus) != TM_OK)
                fail_msg("%s", tm_error_message());
            memset(r, 0, sizeof(*r));
            if (model_context_create(m, &p, &r->c) != TM_OK)
                fail_msg("copies ahead%s: %s", g ? " (spans)" : "", tm_error_message());
            decode(r);
            if (r->st != TM_OK) fail_msg("copies ahead%s: %s", g ? " (spans)" : "", r->err);
            if (!g) { /* its pinned file pages: another context cannot pin them again */
                model_context_free(one.c);
                one.c = NULL;
            }
        }
        const char *what = cache[ci] ? "--cpu-moe --moe-cache 1,1 (copies ahead into the slots)"
                                     : "--cpu-moe --moe-ahead 2";
        assert_int_equal(exec_gpu_count(two.c->exec), 2);
        assert_true(exec_graph_ready(two.c->exec));
        int n_gpu = 0;
        const tm_tier_stats *gs = tier_stats_gpu(two.c->tier, &n_gpu);
        assert_int_equal(n_gpu, 2);
        for (int g = 0; g < 2; g++)
            if (!gs[g].ahead_experts || !gs[g].ahead_slots)
                fail_msg("%s: GPU %d: %llu experts copied ahead, %llu slots computed from them",
                         what, g, (unsigned long long)gs[g].ahead_experts,
                         (unsigned long long)gs[g].ahead_slots);
        const tm_tier_stats *ts = tier_stats(two.c->tier);
        const int cls = cache[ci] ? TM_TIER_CACHED : TM_TIER_RAM;
        assert_int_equal(gs[0].ahead_experts + gs[1].ahead_experts, ts[cls].ahead_experts);
        if (cache[ci]) assert_int_equal(ts[TM_TIER_CACHED].layers, 4);
        const double d = rel_l2(two.logits, one.logits, nv);
        if (!(d < 1e-5)) fail_msg("%s: the prompt's logits %g from one GPU's", what, d);
        for (int i = 0; i < N_GEN; i++)
            if (one.toks[i] != two.toks[i])
                fail_msg("%s: token %d is %d, %d on one GPU", what, i, two.toks[i], one.toks[i]);
        run_free(&one), run_free(&two);
    }
    model_free(m);
}

int main(void) {
    const char *tmp = getenv("TM_TEST_TMP");
    snprintf(model_path, sizeof(model_path), "%s/mock_gpus.gguf", tmp ? tmp : ".");
    tm_synth_config sc;
    if (synth_config_preset(&sc, "tiny") != TM_OK || synth_model_write(&sc, model_path) != TM_OK) {
        fprintf(stderr, "mkmodel: %s\n", tm_error_message());
        return 1;
    }
    snprintf(model4_path, sizeof(model4_path), "%s/mock_gpus4.gguf", tmp ? tmp : ".");
    sc.n_layer = 4;
    if (synth_model_write(&sc, model4_path) != TM_OK) {
        fprintf(stderr, "mkmodel: %s\n", tm_error_message());
        return 1;
    }
    setenv("MOCK_GPUS", "2", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_one_of_two),
                                       cmocka_unit_test(test_ahead_two)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    remove(model_path), remove(model4_path);
    return rc;
}
