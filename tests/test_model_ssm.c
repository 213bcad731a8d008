/* Linear attention's per-sequence state, on the converter-written tiny
 * qwen3next and qwen35moe of tests/data (whose forward test_qwen3next_hf
 * checks against HF): properties that must hold whatever the arithmetic.
 * - 4 sequences in one context, prompts of different lengths and decode
 *   steps of all 4 rows at once, give each sequence's logits as it alone in a
 *   context of its own (the states are per sequence; a row's result does not
 *   depend on its neighbours).
 * - The rewind rule (exec_ssm_keep): cutting a sequence back keeps all of it,
 *   its prompt's checkpoint, or nothing; a continuation from the checkpoint
 *   gives the logits of evaluating everything from scratch.
 * - A sequence reset by a step at position 0 forgets its old state.
 * Tolerances: the same tokens through the same kernels in different batches:
 * products with quantized activations are per row, attention and the delta
 * rule per sequence, so rows agree bit for bit except where a prompt is
 * split into other batches (the chunked delta rule's sums in another order):
 * relative 1e-5 of the logits' norm there (float32 sums over <= 64 tokens). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model.h"

static const char *const archs[] = {"hf_qwen3next", "hf_qwen35moe"};

static char *data_path(const char *rel) {
    static char buf[1024];
    const char *d = getenv("TM_TEST_DATA");
    snprintf(buf, sizeof(buf), "%s/%s", d ? d : "tests/data", rel);
    return buf;
}

static tm_model *arch_load(size_t ai) {
    char rel[64];
    snprintf(rel, sizeof(rel), "%s/tiny-f16.gguf", archs[ai]);
    tm_model *m;
    if (model_load(data_path(rel), &m) != TM_OK) fail_msg("%s", tm_error_message());
    return m;
}

static tm_context *ctx_new(tm_model *m, int n_seq, int64_t n_batch) {
    tm_context_params p = {
        .n_ctx = 256 * n_seq, .n_seq = n_seq, .n_batch = n_batch, .n_threads = 2};
    tm_context *c;
    if (model_context_create(m, &p, &c) != TM_OK) fail_msg("context: %s", tm_error_message());
    return c;
}

static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++)
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d / (r > 0 ? r : 1));
}

#define N_SEQ  4
#define N_STEP 5

static void test_parallel_as_alone(void **state) {
    (void)state;
    for (size_t ai = 0; ai < 2; ai++) {
        tm_model *m = arch_load(ai);
        const int64_t V = m->cfg.n_vocab;
        int32_t toks[N_SEQ][80];
        const int64_t n_prompt[N_SEQ] = {70, 3, 1, 33};
        for (int s = 0; s < N_SEQ; s++)
            for (int t = 0; t < 80; t++) toks[s][t] = (int32_t)((s * 37 + t * 11 + 5) % V);
        /* alone: each sequence in its own context */
        float *alone = malloc(sizeof(float) * (size_t)(N_SEQ * N_STEP * V));
        for (int s = 0; s < N_SEQ; s++) {
            tm_context *c = ctx_new(m, 1, 64);
            assert_int_equal(model_decode(c, toks[s], n_prompt[s], TM_MOE_PHASE_PROMPT, false),
                             TM_OK);
            for (int k = 0; k < N_STEP; k++) {
                assert_int_equal(
                    model_decode(c, &toks[s][n_prompt[s] + k], 1, TM_MOE_PHASE_DECODE, false),
                    TM_OK);
                memcpy(alone + (size_t)((s * N_STEP + k) * V), c->logits,
                       sizeof(float) * (size_t)V);
            }
            model_context_free(c);
        }
        /* together: the prompts one by one, then decode steps of 4 rows */
        tm_context *c = ctx_new(m, N_SEQ, 64);
        for (int s = N_SEQ - 1; s >= 0; s--)
            assert_int_equal(
                model_decode_seq(c, s, toks[s], n_prompt[s], TM_MOE_PHASE_PROMPT, false), TM_OK);
        for (int k = 0; k < N_STEP; k++) {
            const int seqs[N_SEQ] = {2, 0, 3, 1};
            int32_t row_tok[N_SEQ];
            for (int i = 0; i < N_SEQ; i++) row_tok[i] = toks[seqs[i]][n_prompt[seqs[i]] + k];
            assert_int_equal(model_decode_rows(c, N_SEQ, seqs, row_tok), TM_OK);
            for (int i = 0; i < N_SEQ; i++) {
                const double e =
                    rel_diff(c->logits + i * V, alone + (size_t)((seqs[i] * N_STEP + k) * V), V);
                if (!(e <= 1e-5))
                    fail_msg("%s: sequence %d step %d: rel diff %.3g from alone", archs[ai],
                             seqs[i], k, e);
            }
        }
        model_context_free(c);
        free(alone);
        model_free(m);
    }
}

static void test_checkpoint_rewind(void **state) {
    (void)state;
    for (size_t ai = 0; ai < 2; ai++) {
        tm_model *m = arch_load(ai);
        const int64_t V = m->cfg.n_vocab;
        int32_t toks[120], other[20];
        for (int t = 0; t < 120; t++) toks[t] = (int32_t)((t * 29 + 3) % V);
        for (int t = 0; t < 20; t++) other[t] = (int32_t)((t * 13 + 100) % V);
        const int64_t P = 50, G = 6; /* prompt, then generated tokens */

        /* scratch: the prompt, then the continuation as a second prompt */
        tm_context *ref = ctx_new(m, 1, 64);
        assert_int_equal(model_decode(ref, toks, P, TM_MOE_PHASE_PROMPT, false), TM_OK);
        assert_int_equal(model_decode(ref, other, 20, TM_MOE_PHASE_PROMPT, false), TM_OK);
        float *want = malloc(sizeof(float) * (size_t)V);
        memcpy(want, ref->logits, sizeof(float) * (size_t)V);

        tm_context *c = ctx_new(m, 1, 64);
        assert_int_equal(model_decode(c, toks, P, TM_MOE_PHASE_PROMPT, false), TM_OK);
        for (int64_t k = 0; k < G; k++)
            assert_int_equal(model_decode(c, &toks[P + k], 1, TM_MOE_PHASE_DECODE, false), TM_OK);
        /* all of it, more than it holds: kept; inside the generated part: back to the
         * prompt's checkpoint; before the checkpoint: nothing */
        assert_int_equal(model_seq_keep(c, 0, P + G), P + G);
        assert_int_equal(model_seq_keep(c, 0, 1000), P + G);
        assert_int_equal(model_seq_keep(c, 0, P + 3), P);
        assert_int_equal(model_seq_keep(c, 0, P), P);
        assert_int_equal(model_seq_keep(c, 0, P - 1), 0);
        assert_int_equal(model_context_rewind(c, P + 3), P);
        assert_int_equal(model_decode(c, other, 20, TM_MOE_PHASE_PROMPT, false), TM_OK);
        double e = rel_diff(c->logits, want, V);
        if (!(e <= 1e-5))
            fail_msg("%s: continuation from the checkpoint: rel diff %.3g", archs[ai], e);
        /* the second prompt's end is the checkpoint now; the first is gone */
        assert_int_equal(model_seq_keep(c, 0, P + 10), 0);
        assert_int_equal(model_seq_keep(c, 0, P + 20), P + 20);

        /* cut to nothing, then the same prompt: a fresh state (position 0 clears it) */
        assert_int_equal(model_context_rewind(c, 10), 0);
        assert_int_equal(model_decode(c, toks, P, TM_MOE_PHASE_PROMPT, false), TM_OK);
        assert_int_equal(model_decode(c, other, 20, TM_MOE_PHASE_PROMPT, false), TM_OK);
        e = rel_diff(c->logits, want, V);
        if (!(e <= 1e-5)) fail_msg("%s: after a reset: rel diff %.3g", archs[ai], e);
        model_context_reset(c);
        assert_int_equal(model_seq_keep(c, 0, 10), 0);

        free(want);
        model_context_free(c);
        model_context_free(ref);
        model_free(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_as_alone),
        cmocka_unit_test(test_checkpoint_rewind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
