/* A sequence on a context: the tokens whose keys and values its cache holds.
 *
 * A new prompt that shares a prefix with those tokens evaluates only the rest
 * (the context is rewound to the shared prefix, never past the prompt's last
 * token, whose logits the next sample needs). `tiermoe run --chat` reuses the
 * conversation so far this way; `tiermoe serve` reuses the previous request's.
 * One thread at a time. */
#ifndef TM_MODEL_SESSION_H
#define TM_MODEL_SESSION_H

#include <stdint.h>

#include "core/status.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tm_session {
    tm_context *ctx;
    int seq;      /* the context's sequence (its KV range) */
    int32_t *ids; /* [ctx->n_ctx] the tokens in the cache, in order */
    int64_t n;
} tm_session;

/* An empty sequence on ctx (the context is reset). */
tm_status model_session_init(tm_session *s, tm_context *ctx);
/* An empty session on sequence seq of ctx (the others are left as they are). */
tm_status model_session_init_seq(tm_session *s, tm_context *ctx, int seq);
void model_session_free(tm_session *s);

/* Make the cache hold exactly ids[0..n) (0 < n <= n_ctx): keep the longest
 * prefix shared with what it holds, evaluate the rest as a prompt. *n_eval
 * (may be NULL) gets the tokens evaluated. A prompt longer than the context is
 * TM_ERR_ARG naming both sizes; after a failed step the sequence is empty. */
tm_status model_session_eval(tm_session *s, const int32_t *ids, int64_t n, int64_t *n_eval);

/* How many leading tokens of ids[0..n) model_session_eval would keep (the
 * shared prefix, or 0 when sliding layers' ring caches no longer hold its
 * last window: model_seq_keep). */
int64_t model_session_shared(const tm_session *s, const int32_t *ids, int64_t n);

/* Append one token and evaluate it (a decode step). TM_ERR_ARG when the
 * context is full; after a failed step the sequence is empty. */
tm_status model_session_push(tm_session *s, int32_t id);

/* Append ids[i] to sessions ss[i] (n distinct sequences of one context) in
 * one decode step; row i's logits end in ctx->logits + i * n_vocab. When a
 * session is full nothing is evaluated (TM_ERR_ARG); after a failed step
 * every one of them is empty. */
tm_status model_session_push_rows(tm_session *const *ss, const int32_t *ids, int64_t n);

/* Forget the sequence (the next eval starts from position 0). */
void model_session_reset(tm_session *s);

#ifdef __cplusplus
}
#endif
#endif
