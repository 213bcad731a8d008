/* Sliding-window layers' KV caches as rings (exec_attention_setup: window +
 * n_batch rows a sequence, position p at row p % rows) against full caches
 * (tm_context_params.kv_full: a row a position), on the tiny gpt-oss (mkmodel
 * --preset tiny-gpt-oss: window 16 on layers 0 and 2), under the host mock of
 * the CUDA backend (tests/mock/) and on the CPU.
 *
 * The rings change where keys are stored, never what attention computes (its
 * blocks and sums follow positions on every side), so the logits must be the
 * same bits as with full caches, for:
 *   - one sequence: a prompt of several windows in batches of 5 (a size that
 *     does not divide the window) or 12, then decode steps far past the window
 *     (the ring turns over several times), CPU only, -ngl all (decode graphs),
 *     -ngl 2 (rings on both sides) and --cpu-moe, f16 and f32 caches;
 *   - three sequences at different positions, decoded together in steps of
 *     one row each (serve --parallel: model_decode_rows, graphs per row count);
 *   - prompt prefix reuse (sessions): a prefix cut back by less than a batch
 *     is kept; one cut back further is not (the ring overwrote the keys its
 *     last window needs: the whole prompt is evaluated again, and the full
 *     cache's session is reset to do the same), including after a branch
 *     that went further than the sequence now holds.
 * Also: the rings' sizes, TIERMOE_KV_RING=0, and a window that does not fit
 * the context leaving the layer's cache full.
 *
 * Rings against full caches cannot see a window that is wrong on both; so the
 * one-sequence runs with f32 KV and precise ops are also compared with the
 * independent double-precision forward (tests/ref/ref_forward.h, computed
 * once; every run's decode steps feed the reference's greedy tokens): the
 * logits of every position within TOL_PRECISE (float storage only,
 * tests/oracle/test_forward_ref.py's derivation), relative L2, up to the
 * first position where the reference's routing has a gap below TIE, relative
 * to the RMS of the router logits: twice the tolerance, which bounds the
 * router logits' error too (there the engine may route either way; later
 * positions attend to it, so comparing stops). The f16 runs (8-bit
 * activations) are not: their router logits move by up to ~4% of their RMS,
 * and a gap that small comes within the first positions of 4 layers of 16
 * experts (test_mock_placement's matrix compares that mode, routing included). */
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
#include "greedy_test_util.h"
#include "model/model.h"
#include "model/session.h"
#include "model/synth.h"
#include "ref/ref_forward.h"

#define ALL    (1 << 20)
#define WINDOW 16 /* tiny-gpt-oss's */

#define RING_CHECK(call, what)                                                                     \
    do {                                                                                           \
        tm_status st_ = (call);                                                                    \
        if (st_ != TM_OK) fail_msg("%s: %s: %s", what, #call, tm_error_message());                 \
    } while (0)

#define TOL_PRECISE 1e-5
#define TIE         2e-5 /* twice TOL_PRECISE (router-logit gaps relative to their RMS) */
#define N_PROMPT    72
#define N_DECODE    40

static char model_path[512];
static int32_t toks[256];

/* The reference of the one-sequence runs: toks[0..N_PROMPT), then its greedy tokens. */
static double *ref_logits;                  /* [N_PROMPT + N_DECODE][n_vocab] */
static double ref_gap[N_PROMPT + N_DECODE]; /* routing gap of each position */
static int32_t ref_greedy[N_DECODE];

static void ref_make(void) {
    ref_model *m;
    ref_seq *s;
    if (ref_model_load(model_path, &m) != TM_OK || ref_seq_create(m, N_PROMPT + N_DECODE, &s))
        fail_msg("reference: %s", tm_error_message());
    const int64_t V = m->n_vocab;
    ref_logits = malloc((size_t)((N_PROMPT + N_DECODE) * V) * sizeof(double));
    if (!ref_logits) fail_msg("out of memory");
    for (int p = 0; p < N_PROMPT + N_DECODE; p++) {
        const int32_t id = p < N_PROMPT ? toks[p] : ref_greedy[p - N_PROMPT];
        if (ref_seq_step(s, id) != TM_OK) fail_msg("reference: %s", tm_error_message());
        const ref_step_out *o = ref_seq_out(s);
        memcpy(ref_logits + p * V, o->logits, (size_t)V * sizeof(double));
        ref_gap[p] = ref_step_route_gap(m, o);
        if (p + 1 >= N_PROMPT && p + 1 < N_PROMPT + N_DECODE) {
            int64_t b = 0;
            for (int64_t v = 1; v < V; v++)
                if (o->logits[v] > o->logits[b]) b = v;
            ref_greedy[p + 1 - N_PROMPT] = (int32_t)b;
        }
    }
    ref_seq_free(s);
    ref_model_free(m);
}

/* Rows [0, n) of c's logits, positions at.., against the reference up to the first near
 * tie (*upto: positions compared so far); the worst error into *worst. */
static void ref_compare(const tm_context *c, int64_t n, int64_t at, double tol, double tie,
                        int64_t *upto, double *worst, const char *what) {
    const int64_t V = c->model->cfg.n_vocab;
    for (int64_t r = 0; r < n; r++) {
        const int64_t p = at + r;
        if (p != *upto || ref_gap[p] < tie) return; /* past the first near tie */
        double e = 0, sum = 0;
        for (int64_t v = 0; v < V; v++) {
            const double want = ref_logits[p * V + v], d = c->logits[r * V + v] - want;
            e += d * d, sum += want * want;
        }
        const double err = sqrt(e / sum);
        if (!(err <= tol))
            fail_msg("%s, position %lld: logits %.3g from the f64 reference (tolerance %g)", what,
                     (long long)p, err, tol);
        *worst = err > *worst ? err : *worst;
        *upto = p + 1;
    }
}

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TM_TEST_TMP");
    snprintf(model_path, sizeof(model_path), "%s/mock_kv_ring.gguf", tmp ? tmp : "/tmp");
    tm_synth_config sc;
    if (synth_config_preset(&sc, "tiny-gpt-oss") != TM_OK) return -1;
    sc.n_threads = 2, sc.seed = 5;
    if (synth_model_write(&sc, model_path) != TM_OK) return -1;
    tm_rng r;
    tm_rng_seed(&r, 99);
    for (int i = 0; i < 256; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % 1024);
    ref_make();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(model_path);
    free(ref_logits);
    return 0;
}

typedef struct ring_case {
    const char *name;
    int ngl;
    bool cpu_moe;
} ring_case;

static const ring_case ring_cases[] = {
    {"CPU only", 0, false},
    {"-ngl all", ALL, false},
    {"-ngl 2", 2, false},
    {"--cpu-moe", ALL, true},
};

static tm_context_params ring_params(const ring_case *c, int64_t n_ctx, int n_seq, int64_t n_batch,
                                     bool precise, bool full) {
    return (tm_context_params){.n_ctx = n_ctx,
                               .n_seq = n_seq,
                               .n_batch = n_batch,
                               .n_threads = 2,
                               .kv_type = precise ? TM_TYPE_F32 : TM_TYPE_F16,
                               .precise = precise,
                               .n_gpu_layers = c->ngl,
                               .cpu_moe = c->cpu_moe,
                               /* the CPU lane alone: the two contexts live together, and only
                                  the first could pin the experts for the GPU's lanes */
                               .moe_pcie = c->cpu_moe ? TM_MOE_PCIE_OFF : 0,
                               .moe_fetch = c->cpu_moe ? TM_MOE_FETCH_OFF : 0,
                               .moe_ahead = c->cpu_moe ? TM_MOE_AHEAD_OFF : 0,
                               .kv_full = full};
}

/* A context with rings and one with full caches, the same otherwise. */
static void ring_pair(tm_model *m, const tm_context_params *p, tm_context **ring, tm_context **full,
                      const char *what) {
    tm_context_params fp = *p;
    fp.kv_full = true;
    RING_CHECK(model_context_create(m, p, ring), what);
    RING_CHECK(model_context_create(m, &fp, full), what);
    const int64_t rows = WINDOW + p->n_batch; /* the window before a step, and the step */
    for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
        const int64_t want = l % 2 == 0 ? rows : 0;
        if (exec_kv_ring((*ring)->exec, l) != want || exec_kv_ring((*full)->exec, l) != 0)
            fail_msg("%s: layer %u: rings of %lld and %lld rows, want %lld and none", what, l,
                     (long long)exec_kv_ring((*ring)->exec, l),
                     (long long)exec_kv_ring((*full)->exec, l), (long long)want);
    }
}

static void same_logits(const tm_context *ring, const tm_context *full, int64_t rows,
                        const char *what, int64_t at) {
    const size_t bytes = (size_t)(rows * ring->model->cfg.n_vocab) * sizeof(float);
    if (memcmp(ring->logits, full->logits, bytes)) {
        int64_t i = 0;
        while (ring->logits[i] == full->logits[i]) i++;
        fail_msg("%s, at %lld: logit %lld is %.9g with rings, %.9g with full caches", what,
                 (long long)at, (long long)i, ring->logits[i], full->logits[i]);
    }
}

/* One sequence: a prompt of 72 tokens (4.5 windows) in batches, then 40 decode
 * steps of the reference's greedy tokens (the ring of 21 or 28 rows turns over 4
 * to 5 times); against full caches and the f64 reference. */
static void test_one_sequence(void **state) {
    (void)state;
    tm_model *m;
    RING_CHECK(model_load(model_path, &m), model_path);
    const int64_t n_prompt = N_PROMPT, n_decode = N_DECODE;
    for (size_t ci = 0; ci < sizeof(ring_cases) / sizeof(ring_cases[0]); ci++) {
        for (int b = 0; b < 2; b++) {
            const ring_case *c = &ring_cases[ci];
            const int64_t n_batch = b ? 12 : 5;
            const bool precise = b; /* f32 caches with the precise mode, f16 without */
            char what[160];
            snprintf(what, sizeof(what), "%s, batches of %lld, %s KV", c->name, (long long)n_batch,
                     precise ? "f32" : "f16");
            const tm_context_params p = ring_params(c, 256, 1, n_batch, precise, false);
            tm_context *ring, *full;
            ring_pair(m, &p, &ring, &full, what);
            int64_t upto = 0;
            double worst = 0;
            for (int64_t i = 0; i < n_prompt; i += n_batch) {
                const int64_t n = n_prompt - i < n_batch ? n_prompt - i : n_batch;
                RING_CHECK(model_decode(ring, toks + i, n, TM_MOE_PHASE_PROMPT, true), what);
                RING_CHECK(model_decode(full, toks + i, n, TM_MOE_PHASE_PROMPT, true), what);
                same_logits(ring, full, n, what, i);
                if (precise) ref_compare(ring, n, i, TOL_PRECISE, TIE, &upto, &worst, what);
            }
            for (int64_t i = 0; i < n_decode; i++) {
                const int32_t id = ref_greedy[i];
                RING_CHECK(model_decode(ring, &id, 1, TM_MOE_PHASE_DECODE, false), what);
                RING_CHECK(model_decode(full, &id, 1, TM_MOE_PHASE_DECODE, false), what);
                same_logits(ring, full, 1, what, n_prompt + i);
                if (precise)
                    ref_compare(ring, 1, n_prompt + i, TOL_PRECISE, TIE, &upto, &worst, what);
            }
            if (precise && upto < 2 * WINDOW)
                fail_msg("%s: only %lld positions before the reference's first near tie", what,
                         (long long)upto);
            printf("    %s: %lld prompt tokens and %lld decode steps, the same bits (%s)", what,
                   (long long)n_prompt, (long long)n_decode,
                   exec_graph_ready(ring->exec) ? "decode graph" : "eager");
            if (precise)
                printf("; positions [0, %lld) within %.2g of the f64 reference (tolerance %g)",
                       (long long)upto, worst, TOL_PRECISE);
            printf("\n");
            model_context_free(ring), model_context_free(full);
        }
    }
    model_free(m);
}

/* Three sequences at different positions, decoded in steps of a row each. */
static void test_sequences(void **state) {
    (void)state;
    tm_model *m;
    RING_CHECK(model_load(model_path, &m), model_path);
    const int64_t V = m->cfg.n_vocab;
    static const int64_t n_prompt[3] = {40, 23, 61};
    for (size_t ci = 0; ci < 3; ci++) { /* CPU only, -ngl all, -ngl 2 */
        const ring_case *c = &ring_cases[ci];
        char what[160];
        snprintf(what, sizeof(what), "%s, 3 sequences", c->name);
        const tm_context_params p = ring_params(c, 3 * 128, 3, 7, false, false);
        tm_context *ring, *full;
        ring_pair(m, &p, &ring, &full, what);
        for (int s = 0; s < 3; s++) {
            const int32_t *t = toks + 50 * s;
            RING_CHECK(model_decode_seq(ring, s, t, n_prompt[s], TM_MOE_PHASE_PROMPT, false), what);
            RING_CHECK(model_decode_seq(full, s, t, n_prompt[s], TM_MOE_PHASE_PROMPT, false), what);
            same_logits(ring, full, 1, what, n_prompt[s]);
        }
        int32_t next[3] = {1, 2, 3};
        for (int i = 0; i < 50; i++) {
            /* every sequence, in an order that changes, and now and then two of them */
            int seqs[3] = {(i + 2) % 3, i % 3, (i + 1) % 3};
            const int64_t n = i % 7 == 3 ? 2 : 3;
            int32_t ids[3];
            for (int r = 0; r < n; r++) ids[r] = next[seqs[r]];
            RING_CHECK(model_decode_rows(ring, n, seqs, ids), what);
            RING_CHECK(model_decode_rows(full, n, seqs, ids), what);
            same_logits(ring, full, n, what, i);
            for (int r = 0; r < n; r++) next[seqs[r]] = test_argmax(ring->logits + r * V, V);
        }
        printf("    %s: 50 decode steps of 2-3 rows, the same bits (%s)\n", what,
               exec_graph_ready_rows(ring->exec, 3) ? "decode graphs" : "eager");
        model_context_free(ring), model_context_free(full);
    }
    model_free(m);
}

/* Evaluate ids on both sessions: the ring one keeps want_keep tokens; the
 * full cache's is reset first where the ring's could not keep its prefix, so
 * both evaluate the same tokens in the same batches. Then 3 decode steps. */
static void session_step(tm_session *ring, tm_session *full, const int32_t *ids, int64_t n,
                         int64_t want_keep, const char *what) {
    const int64_t keep = model_session_shared(ring, ids, n),
                  keep_full = model_session_shared(full, ids, n);
    if (keep != want_keep)
        fail_msg("%s: the ring's session keeps %lld of %lld tokens, want %lld", what,
                 (long long)keep, (long long)n, (long long)want_keep);
    if (keep < keep_full) model_session_reset(full);
    int64_t n_eval = 0, n_eval_full = 0;
    RING_CHECK(model_session_eval(ring, ids, n, &n_eval), what);
    RING_CHECK(model_session_eval(full, ids, n, &n_eval_full), what);
    if (n_eval != n - keep || n_eval_full != n_eval)
        fail_msg("%s: %lld and %lld tokens evaluated, want %lld", what, (long long)n_eval,
                 (long long)n_eval_full, (long long)(n - keep));
    same_logits(ring->ctx, full->ctx, 1, what, n);
    for (int i = 0; i < 3; i++) {
        const int32_t id = test_argmax(ring->ctx->logits, ring->ctx->model->cfg.n_vocab);
        RING_CHECK(model_session_push(ring, id), what);
        RING_CHECK(model_session_push(full, id), what);
        same_logits(ring->ctx, full->ctx, 1, what, n + i);
    }
}

static void test_prefix_reuse(void **state) {
    (void)state;
    tm_model *m;
    RING_CHECK(model_load(model_path, &m), model_path);
    for (size_t ci = 0; ci < 2; ci++) { /* CPU only, -ngl all */
        const ring_case *c = &ring_cases[ci];
        char what[160];
        snprintf(what, sizeof(what), "%s, prefix reuse", c->name);
        const int64_t B = 12, R = WINDOW + B;
        const tm_context_params p = ring_params(c, 256, 1, B, false, false);
        tm_context *ring_ctx, *full_ctx;
        ring_pair(m, &p, &ring_ctx, &full_ctx, what);
        tm_session ring, full;
        RING_CHECK(model_session_init(&ring, ring_ctx), what);
        RING_CHECK(model_session_init(&full, full_ctx), what);
        int32_t ids[128];
        memcpy(ids, toks, 80 * sizeof(int32_t));
        session_step(&ring, &full, ids, 80, 0, what); /* 83 positions held */
        /* 13 positions cut: the last window of the 70 kept is still there (83 <= 70 + 1 -
         * WINDOW + R) */
        ids[70] = 1, ids[71] = 2, ids[72] = 3;
        session_step(&ring, &full, ids, 73, 70, what); /* 76 held, 83 written */
        /* 16 cut back from 76, but 83 were written since the sequence was empty: position
         * 60's window starts at 45, whose row position 73 took */
        ids[60] = 4;
        if (83 <= 60 + 1 - WINDOW + R) fail_msg("%s: the case needs a ring overwritten", what);
        session_step(&ring, &full, ids, 61, 0, what); /* from scratch: 64 held and written */
        ids[61] = 5;                                  /* 3 cut, nothing written past them: kept */
        session_step(&ring, &full, ids, 62, 61, what);
        printf("    %s: kept 70 and 61 tokens, evaluated again where the ring lost them\n", what);
        model_session_free(&ring), model_session_free(&full);
        model_context_free(ring_ctx), model_context_free(full_ctx);
    }
    model_free(m);
}

static void test_ring_sizes(void **state) {
    (void)state;
    tm_model *m;
    RING_CHECK(model_load(model_path, &m), model_path);
    /* TIERMOE_KV_RING=0: full caches, read at context creation */
    tm_context_params p = ring_params(&ring_cases[0], 256, 1, 8, false, false);
    setenv("TIERMOE_KV_RING", "0", 1);
    tm_context *c;
    RING_CHECK(model_context_create(m, &p, &c), "TIERMOE_KV_RING=0");
    unsetenv("TIERMOE_KV_RING");
    assert_int_equal(exec_kv_ring(c->exec, 0), 0);
    model_context_free(c);
    RING_CHECK(model_context_create(m, &p, &c), "rings");
    assert_int_equal(exec_kv_ring(c->exec, 0), WINDOW + 8);
    assert_int_equal(exec_kv_ring(c->exec, 2), WINDOW + 8);
    assert_int_equal(exec_kv_ring(c->exec, 1), 0);
    model_context_free(c);
    /* a ring would be no smaller than a sequence's positions (16 + 8 >= 24 a sequence):
     * full rows, not an error */
    p = ring_params(&ring_cases[1], 48, 2, 8, false, false);
    RING_CHECK(model_context_create(m, &p, &c), "window past the context");
    assert_int_equal(exec_kv_ring(c->exec, 0), 0);
    const int32_t t[3] = {1, 2, 3};
    RING_CHECK(model_decode_seq(c, 1, t, 3, TM_MOE_PHASE_PROMPT, false), "no ring");
    model_context_free(c);
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_sizes),
        cmocka_unit_test(test_one_sequence),
        cmocka_unit_test(test_sequences),
        cmocka_unit_test(test_prefix_reuse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
