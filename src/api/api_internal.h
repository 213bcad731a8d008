/* What the files of the public API (src/api/api*.c) share: the state the API
 * keeps beside the engine's tm_model and tm_context (on their api pointer),
 * and the argument checks every entry point starts with. */
#ifndef TM_API_INTERNAL_H
#define TM_API_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "tier/plan.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "trace/trace.h"

/* Return TM_ERR_ARG with a message "fn: what" when cond does not hold. */
#define API_ARG(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) return tm_error_set(TM_ERR_ARG, __VA_ARGS__);                                 \
    } while (0)

/* TM_ERR_ARG naming fn when seq is not a sequence of c. */
#define API_SEQ(fn, c, seq)                                                                        \
    API_ARG((seq) >= 0 && (seq) < (c)->n_seq, fn ": seq %d is not in [0, %d)", (int)(seq),         \
            (c)->n_seq)

typedef struct api_model {
    tm_tokenizer *tok;  /* NULL: the file has no vocabulary */
    char no_vocab[256]; /* without one: why it did not load */
    bool vocab_only;    /* tm_model_load_vocab: no weights, the engine's struct is zeroed */
    tm_chat_format chat;
    const char *default_system; /* chatml templates' built-in system prompt (in tok), or NULL */
    char *name;                 /* general.name, or NULL */
    char *path;                 /* the file */
} api_model;

typedef struct api_context {
    tm_trace *tr;         /* expert_stats: the tracer fed by the context's callback */
    tm_trace_stats learn; /* moe_learn, read before the tier was made */
    tm_plan plan;         /* moe_cache_plan, the same */
    int32_t **ids;        /* [n_seq][n_ctx]: each sequence's tokens (the penalty's history) */
    int64_t *n;           /* [n_seq] */
    bool *has_logits;     /* [n_seq] */
    float *logits;        /* [n_seq][n_vocab]: each sequence's last token's, once copied */
    const float **src;    /* [n_seq]: where they are: their row of the context's last step (read
                             in place), or their copy in logits */
    int *rows;            /* [n_batch]: tm_eval_rows' sequences as model_decode_rows takes them */
    int32_t *in_slot;     /* [n_expert]: scratch of the cache functions */
    bool *seen;           /* [n_seq]: scratch of tm_eval_rows */
    uint64_t eval_ns;     /* time spent evaluating (tm_context_profile's read rate) */
} api_context;

/* The API's part of a model, or NULL after a message naming fn. */
const api_model *api_model_of(const tm_model *m, const char *fn);
/* The model's vocabulary, or NULL after a message naming fn (*st: its status). */
const tm_tokenizer *api_model_vocab(const tm_model *m, const char *fn, tm_status *st);
/* The API's part of a context, or NULL after a message naming fn. */
api_context *api_context_of(const tm_context *c, const char *fn);
/* Whether the context has a VRAM expert cache (slots in a layer). */
bool api_context_has_cache(const tm_context *c);

/* TM_ERR_ARG naming fn and the first of t[0..n) that is not a token of c's model. */
tm_status api_tokens_check(const char *fn, const tm_context *c, const int32_t *t, int64_t n);
/* Before a step that evaluates the sequences marked in a->seen (when step is
 * false: none but seq) and writes rows [0, rows) of the context's logits (one
 * sequence's eval: its last token's, row 0; model.h): the logits other
 * sequences still read in place in those rows are copied out. */
void api_logits_keep(tm_context *c, api_context *a, bool step, int32_t seq, int64_t rows);
/* After a step: sequence seq's logits are row row of the context's. */
void api_logits_row(tm_context *c, api_context *a, int32_t seq, int64_t row);

/* The VRAM cache slots of layer l (0: none). */
int32_t api_layer_slots(const tm_context *c, uint32_t l);

/* Copy src[0..n) and a NUL into (buf, cap) under the header's size rule. */
tm_status api_text_out(const char *fn, const char *src, size_t n, char *buf, size_t cap,
                       size_t *len);

#endif
