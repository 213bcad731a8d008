/* The public API's prompt prefix reuse (include/tiermoe.h, "evaluation"):
 * what a sequence would keep of a prompt, making it hold exactly a prompt,
 * and its tokens. The rule is the engine's session's (model/session.h): the
 * shared prefix, never the prompt's last token, none where the state cannot
 * go back; the API's own record of a sequence's tokens is the session's. */
#include "api/api_internal.h"
#include "core/timing.h"
#include "model/session.h"

/* The engine's session over sequence seq's tokens as the API holds them. */
static tm_session seq_session(tm_context *c, const api_context *a, int32_t seq) {
    return (tm_session){.ctx = c, .seq = seq, .ids = a->ids[seq], .n = a->n[seq]};
}

tm_status tm_seq_shared(const tm_context *c, int32_t seq, const int32_t *tokens, int64_t n,
                        int64_t *n_keep) {
    const api_context *a = api_context_of(c, "tm_seq_shared");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_seq_shared", c, seq);
    API_ARG(tokens && n >= 1, "tm_seq_shared: expected tokens and n >= 1 (n is %lld)",
            (long long)n);
    API_ARG(n_keep, "tm_seq_shared: n_keep must not be NULL");
    /* the session only reads the context here */
    const tm_session ss = seq_session((tm_context *)c, a, seq);
    *n_keep = model_session_shared(&ss, tokens, n);
    return TM_OK;
}

tm_status tm_seq_prompt(tm_context *c, int32_t seq, const int32_t *tokens, int64_t n,
                        int64_t *n_eval) {
    api_context *a = api_context_of(c, "tm_seq_prompt");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_seq_prompt", c, seq);
    API_ARG(tokens && n >= 1, "tm_seq_prompt: expected tokens and n >= 1 (n is %lld)",
            (long long)n);
    API_ARG(n <= c->n_ctx, "tm_seq_prompt: %lld tokens do not fit sequence %d's %lld positions",
            (long long)n, seq, (long long)c->n_ctx);
    tm_status st = api_tokens_check("tm_seq_prompt", c, tokens, n);
    if (st != TM_OK) return st;
    tm_session ss = seq_session(c, a, seq);
    if (a->tr && model_session_shared(&ss, tokens, n) == 0) trace_sequence_begin(a->tr);
    api_logits_keep(c, a, false, seq, 1);
    int64_t evaluated = 0;
    const uint64_t t0 = tm_time_ns();
    st = model_session_eval(&ss, tokens, n, &evaluated);
    a->eval_ns += tm_time_ns() - t0;
    a->n[seq] = ss.n; /* 0 after a failed step: the session forgot the sequence */
    a->has_logits[seq] = false;
    if (st != TM_OK) return st;
    api_logits_row(c, a, seq, 0);
    if (n_eval) *n_eval = evaluated;
    return TM_OK;
}

tm_status tm_seq_tokens(const tm_context *c, int32_t seq, const int32_t **tokens, int64_t *n) {
    const api_context *a = api_context_of(c, "tm_seq_tokens");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_seq_tokens", c, seq);
    API_ARG(tokens && n, "tm_seq_tokens: tokens and n must not be NULL");
    *tokens = a->ids[seq], *n = a->n[seq];
    return TM_OK;
}
