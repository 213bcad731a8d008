/* Several sequences decoded together (serve --parallel): see placement_matrix.h.
 *
 * Five greedy requests on four sequences of one context, of different prompt
 * lengths, starting at different steps and ending at different ones; the
 * last one reuses sequence 1 after its first request, its prompt sharing
 * that request's prompt and reply, so only the rest is evaluated. Each
 * request's prompt is evaluated as a step of its own (the session API, as
 * the server does); then every running request decodes in one step of one
 * row each (model_session_push_rows). Each request is also run alone, from
 * scratch, on a context of one sequence: its tokens must be the same and
 * the logits of every step within the tolerance. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "greedy_test_util.h"
#include "model/session.h"
#include "placement_matrix.h"

#define PP_CHECK(call, what)                                                                       \
    do {                                                                                           \
        tm_status st_ = (call);                                                                    \
        if (st_ != TM_OK) fail_msg("%s: %s: %s", what, #call, tm_error_message());                 \
    } while (0)

#define PP_SEQ 4
#define PP_REQ 5
#define PP_GEN 12 /* the most tokens a request generates */

typedef struct pp_req {
    int seq, start, after; /* its sequence; the first step it may start; a request before it (-1) */
    int n_prompt, n_gen;
    int32_t prompt[48];
    int32_t got[PP_GEN], want[PP_GEN];
    float *want_logits; /* [n_gen][n_vocab]: alone */
    int gen;            /* tokens sampled */
    bool started, done;
} pp_req;

/* The request alone, on a session of its own from scratch: its greedy tokens
 * and the logits each was taken from. */
static void pp_alone(tm_session *ref, pp_req *q, const char *what) {
    const int64_t V = ref->ctx->model->cfg.n_vocab;
    model_session_reset(ref);
    PP_CHECK(model_session_eval(ref, q->prompt, q->n_prompt, NULL), what);
    for (int i = 0; i < q->n_gen; i++) {
        memcpy(q->want_logits + i * V, ref->ctx->logits, (size_t)V * sizeof(float));
        q->want[i] = test_argmax(ref->ctx->logits, V);
        if (i + 1 < q->n_gen) PP_CHECK(model_session_push(ref, q->want[i]), what);
    }
}

/* Take request q's next token from logits; false when it is done. */
static bool pp_sample(pp_req *q, const float *logits, int64_t V, double tol, double *worst,
                      const char *what) {
    const double err = pm_rel_l2(logits, q->want_logits + q->gen * V, V);
    if (err > tol)
        fail_msg("%s: sequence %d, token %d: logits %.3g from alone's (tolerance %.3g)", what,
                 q->seq, q->gen, err, tol);
    if (err > *worst) *worst = err;
    q->got[q->gen] = test_argmax(logits, V);
    if (q->got[q->gen] != q->want[q->gen])
        fail_msg("%s: sequence %d, token %d is %d, alone %d", what, q->seq, q->gen, q->got[q->gen],
                 q->want[q->gen]);
    q->gen++;
    q->done = q->gen == q->n_gen;
    return !q->done;
}

void pm_parallel_run(tm_model *m, const tm_context_params *p, const int32_t *toks, double tol,
                     const char *what) {
    const int64_t V = m->cfg.n_vocab;
    tm_context_params pp = *p, p1 = *p;
    pp.n_seq = PP_SEQ;
    p1.n_seq = 1, p1.n_ctx = p->n_ctx / PP_SEQ; /* a sequence's share of the context */
    tm_context *ctx, *ref_ctx;
    PP_CHECK(model_context_create(m, &pp, &ctx), what);
    PP_CHECK(model_context_create(m, &p1, &ref_ctx), what);
    tm_session ss[PP_SEQ], ref;
    for (int i = 0; i < PP_SEQ; i++) PP_CHECK(model_session_init_seq(&ss[i], ctx, i), what);
    PP_CHECK(model_session_init(&ref, ref_ctx), what);

    /* seq, start, after, prompt length, tokens */
    pp_req rq[PP_REQ] = {
        {.seq = 0, .start = 0, .after = -1, .n_prompt = 7, .n_gen = 12},
        {.seq = 1, .start = 0, .after = -1, .n_prompt = 3, .n_gen = 5},
        {.seq = 2, .start = 2, .after = -1, .n_prompt = 11, .n_gen = 9},
        {.seq = 3, .start = 4, .after = -1, .n_prompt = 1, .n_gen = 8},
        /* sequence 1 again: request 1's prompt and reply, then 3 new tokens */
        {.seq = 1, .start = 7, .after = 1, .n_prompt = 0, .n_gen = 6},
    };
    for (int i = 0; i < PP_REQ; i++) {
        rq[i].want_logits = malloc((size_t)(PP_GEN * V) * sizeof(float));
        if (!rq[i].want_logits) fail_msg("out of memory");
        for (int t = 0; t < rq[i].n_prompt; t++) rq[i].prompt[t] = toks[(7 * i + 3 * t) % 64];
    }
    double worst = 0;
    int n_done = 0, max_rows = 0;
    for (int step = 0; n_done < PP_REQ; step++) {
        if (step > 100) fail_msg("%s: the requests never ended", what);
        for (int i = 0; i < PP_REQ; i++) { /* requests starting now: their prompts */
            pp_req *q = &rq[i];
            if (q->started || step < q->start || (q->after >= 0 && !rq[q->after].done)) continue;
            if (q->after >= 0) { /* the earlier request's prompt and reply, then new tokens */
                const pp_req *a = &rq[q->after];
                memcpy(q->prompt, a->prompt, (size_t)a->n_prompt * 4);
                memcpy(q->prompt + a->n_prompt, a->got, (size_t)a->n_gen * 4);
                q->n_prompt = a->n_prompt + a->n_gen;
                for (int t = 0; t < 3; t++) q->prompt[q->n_prompt++] = toks[40 + t];
            }
            pp_alone(&ref, q, what);
            int64_t n_eval = 0;
            PP_CHECK(model_session_eval(&ss[q->seq], q->prompt, q->n_prompt, &n_eval), what);
            /* reuse: the session held the prompt and the reply but its last token */
            const int64_t want_eval = q->after >= 0 ? 4 : q->n_prompt;
            if (n_eval != want_eval)
                fail_msg("%s: request %d evaluated %lld prompt tokens, want %lld", what, i,
                         (long long)n_eval, (long long)want_eval);
            q->started = true;
            if (!pp_sample(q, ctx->logits, V, tol, &worst, what)) n_done++;
        }
        tm_session *rows[PP_SEQ];
        int32_t ids[PP_SEQ];
        int idx[PP_SEQ], n = 0;
        for (int i = 0; i < PP_REQ; i++)
            if (rq[i].started && !rq[i].done) {
                rows[n] = &ss[rq[i].seq], ids[n] = rq[i].got[rq[i].gen - 1], idx[n++] = i;
            }
        if (!n) continue;
        PP_CHECK(model_session_push_rows(rows, ids, n), what);
        for (int r = 0; r < n; r++)
            if (!pp_sample(&rq[idx[r]], ctx->logits + r * V, V, tol, &worst, what)) n_done++;
        if (n > max_rows) max_rows = n;
    }
    if (max_rows < PP_SEQ) fail_msg("%s: at most %d rows a step, want %d", what, max_rows, PP_SEQ);
    printf("    %s: %d requests on %d sequences (up to %d rows a step, %s) as alone, "
           "logits within %.2g\n",
           what, PP_REQ, PP_SEQ, max_rows,
           exec_graph_ready_rows(ctx->exec, PP_SEQ) ? "decode graphs" : "eager", worst);
    /* bad rows are refused before anything runs: a sequence twice, one out of range */
    const int dup[2] = {2, 2}, out[1] = {PP_SEQ};
    const int32_t two[2] = {1, 2};
    if (model_decode_rows(ctx, 2, dup, two) != TM_ERR_ARG || !strstr(tm_error_message(), "both") ||
        model_decode_rows(ctx, 1, out, two) != TM_ERR_ARG || !strstr(tm_error_message(), "of 4"))
        fail_msg("%s: bad rows not refused (%s)", what, tm_error_message());
    for (int i = 0; i < PP_REQ; i++) free(rq[i].want_logits);
    for (int i = 0; i < PP_SEQ; i++) model_session_free(&ss[i]);
    model_session_free(&ref);
    model_context_free(ctx), model_context_free(ref_ctx);
}
