/* A sequence on a context and prompt prefix reuse (session.h). */
#include <stdlib.h>
#include <string.h>

#include "model/session.h"

tm_status model_session_init(tm_session *s, tm_context *ctx) {
    tm_status st = model_session_init_seq(s, ctx, 0);
    if (st == TM_OK) model_context_reset(ctx);
    return st;
}

tm_status model_session_init_seq(tm_session *s, tm_context *ctx, int seq) {
    memset(s, 0, sizeof(*s));
    if (seq < 0 || seq >= ctx->n_seq)
        return tm_error_set(TM_ERR_ARG, "session: sequence %d of %d", seq, ctx->n_seq);
    s->ids = malloc((size_t)ctx->n_ctx * sizeof(int32_t));
    if (!s->ids)
        return tm_error_set(TM_ERR_NOMEM, "session: out of memory for %lld token ids",
                            (long long)ctx->n_ctx);
    s->ctx = ctx, s->seq = seq;
    model_seq_rewind(ctx, seq, 0);
    return TM_OK;
}

void model_session_free(tm_session *s) {
    free(s->ids);
    memset(s, 0, sizeof(*s));
}

void model_session_reset(tm_session *s) {
    s->n = 0;
    model_seq_rewind(s->ctx, s->seq, 0);
}

int64_t model_session_shared(const tm_session *s, const int32_t *ids, int64_t n) {
    int64_t keep = 0;
    while (keep < s->n && keep < n - 1 && s->ids[keep] == ids[keep]) keep++;
    return model_seq_keep(s->ctx, s->seq, keep); /* 0 where rings lost the prefix's last keys */
}

tm_status model_session_eval(tm_session *s, const int32_t *ids, int64_t n, int64_t *n_eval) {
    if (n_eval) *n_eval = 0;
    if (n <= 0) return tm_error_set(TM_ERR_ARG, "an empty prompt");
    if (n > s->ctx->n_ctx)
        return tm_error_set(TM_ERR_ARG, "%lld tokens do not fit the context of %lld positions (-c)",
                            (long long)n, (long long)s->ctx->n_ctx);
    const int64_t keep = model_seq_rewind(s->ctx, s->seq, model_session_shared(s, ids, n));
    memcpy(s->ids + keep, ids + keep, (size_t)(n - keep) * sizeof(int32_t));
    s->n = n;
    const tm_status st =
        model_decode_seq(s->ctx, s->seq, ids + keep, n - keep, TM_MOE_PHASE_PROMPT, false);
    if (st != TM_OK) {
        model_session_reset(s);
        return st;
    }
    if (n_eval) *n_eval = n - keep;
    return TM_OK;
}

tm_status model_session_push(tm_session *s, int32_t id) {
    if (s->n >= s->ctx->n_ctx)
        return tm_error_set(TM_ERR_ARG, "the context of %lld positions is full (-c)",
                            (long long)s->ctx->n_ctx);
    s->ids[s->n++] = id;
    const tm_status st = model_decode_seq(s->ctx, s->seq, &id, 1, TM_MOE_PHASE_DECODE, false);
    if (st != TM_OK) model_session_reset(s);
    return st;
}

#define SESSION_ROWS_MAX 512 /* rows of one step held on the stack; more go in steps */

tm_status model_session_push_rows(tm_session *const *ss, const int32_t *ids, int64_t n) {
    if (n < 1) return tm_error_set(TM_ERR_ARG, "a decode step of no rows");
    if (n > SESSION_ROWS_MAX)
        return tm_error_set(TM_ERR_ARG, "a decode step of %lld rows (at most %d)", (long long)n,
                            SESSION_ROWS_MAX);
    tm_context *ctx = ss[0]->ctx;
    int seqs[SESSION_ROWS_MAX];
    for (int64_t i = 0; i < n; i++) {
        if (ss[i]->ctx != ctx)
            return tm_error_set(TM_ERR_ARG, "a decode step over sessions of two contexts");
        if (ss[i]->n >= ctx->n_ctx)
            return tm_error_set(TM_ERR_ARG,
                                "sequence %d: the context of %lld positions is full "
                                "(-c)",
                                ss[i]->seq, (long long)ctx->n_ctx);
        seqs[i] = ss[i]->seq;
    }
    const tm_status st = model_decode_rows(ctx, n, seqs, ids);
    for (int64_t i = 0; i < n; i++) {
        if (st == TM_OK)
            ss[i]->ids[ss[i]->n++] = ids[i];
        else
            model_session_reset(ss[i]);
    }
    return st;
}
