/* A sequence on a context and prompt prefix reuse (session.h). */
#include <stdlib.h>
#include <string.h>

#include "model/session.h"

tm_status model_session_init(tm_session *s, tm_context *ctx) {
    memset(s, 0, sizeof(*s));
    s->ids = malloc((size_t)ctx->n_ctx * sizeof(int32_t));
    if (!s->ids)
        return tm_error_set(TM_ERR_NOMEM, "session: out of memory for %lld token ids",
                            (long long)ctx->n_ctx);
    s->ctx = ctx;
    model_context_reset(ctx);
    return TM_OK;
}

void model_session_free(tm_session *s) {
    free(s->ids);
    memset(s, 0, sizeof(*s));
}

void model_session_reset(tm_session *s) {
    s->n = 0;
    model_context_reset(s->ctx);
}

int64_t model_session_shared(const tm_session *s, const int32_t *ids, int64_t n) {
    int64_t keep = 0;
    while (keep < s->n && keep < n - 1 && s->ids[keep] == ids[keep]) keep++;
    return keep;
}

tm_status model_session_eval(tm_session *s, const int32_t *ids, int64_t n, int64_t *n_eval) {
    if (n_eval) *n_eval = 0;
    if (n <= 0) return tm_error_set(TM_ERR_ARG, "an empty prompt");
    if (n > s->ctx->n_ctx)
        return tm_error_set(TM_ERR_ARG, "%lld tokens do not fit the context of %lld positions (-c)",
                            (long long)n, (long long)s->ctx->n_ctx);
    const int64_t keep = model_session_shared(s, ids, n);
    model_context_rewind(s->ctx, keep);
    memcpy(s->ids + keep, ids + keep, (size_t)(n - keep) * sizeof(int32_t));
    s->n = n;
    const tm_status st = model_decode(s->ctx, ids + keep, n - keep, TM_MOE_PHASE_PROMPT, false);
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
    const tm_status st = model_decode(s->ctx, &id, 1, TM_MOE_PHASE_DECODE, false);
    if (st != TM_OK) model_session_reset(s);
    return st;
}
