/* The public C API (include/tiermoe.h): a thin layer over the model, tokenizer,
 * chat, sampler, tracer and tier modules, doing what tools/cmd_run.c and
 * src/server do with them. The public tm_model and tm_context are the engine's
 * own structs; what the API keeps beside them (the vocabulary, each sequence's
 * tokens and last logits, the tracer, the plan and learn files the tier was
 * made from) hangs off their api pointer (api_internal.h). Every entry point
 * checks its arguments first, so a bad one is TM_ERR_ARG with a message naming
 * it. This file: models, contexts, evaluation and sampling; api_text.c the
 * text, api_opts.c the context options, api_experts.c the expert counts, the
 * VRAM cache and the profile. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "api/api_opts.h"
#include "core/timing.h"
#include "gguf/gguf.h"
#include "sample/sample.h"

#define TM_STR_(x) #x
#define TM_STR(x)  TM_STR_(x)

const char *tm_version(void) {
    return TM_STR(TIERMOE_VERSION_MAJOR) "." TM_STR(TIERMOE_VERSION_MINOR) "." TM_STR(
        TIERMOE_VERSION_PATCH);
}

/* ---- models ---- */

/* The vocabulary and its chat template into a (tok NULL: none, and why). */
static void model_api_vocab(api_model *a, tm_tokenizer *tok) {
    a->tok = tok;
    if (!tok) snprintf(a->no_vocab, sizeof(a->no_vocab), "%s", tm_error_message());
    a->chat = tok ? chat_format_detect(tokenizer_chat_template(tok), &a->default_system)
                  : TM_CHAT_UNKNOWN;
}

/* Free m and its API part a. */
static void tm_model_free_api(tm_model *m, api_model *a) {
    if (a && a->tok) tokenizer_free(a->tok);
    if (a) free(a->name), free(a->path);
    free(a);
    m->api = NULL;
    model_free(m);
}

tm_status tm_model_load(const char *path, tm_model **out) {
    API_ARG(path && out, "tm_model_load: path and out must not be NULL");
    api_model *a = calloc(1, sizeof(*a));
    if (!a) return tm_error_set(TM_ERR_NOMEM, "tm_model_load: out of memory");
    tm_model *m = NULL;
    const tm_status st = model_load(path, &m);
    if (st != TM_OK) {
        free(a);
        return st;
    }
    tm_tokenizer *tok = NULL;
    if (tokenizer_load_gguf(m->file, &tok) != TM_OK) tok = NULL;
    model_api_vocab(a, tok); /* a model without a vocabulary still evaluates ids */
    tm_error_clear();
    tm_gguf_str gn;
    if (gguf_file_get_str(m->file, "general.name", &gn) == TM_OK)
        a->name = strndup(gn.data, (size_t)gn.len); /* NULL out of memory: no name */
    a->path = strdup(path);
    if (!a->path) {
        tm_model_free_api(m, a);
        return tm_error_set(TM_ERR_NOMEM, "tm_model_load: out of memory");
    }
    m->api = a;
    *out = m;
    return TM_OK;
}

tm_status tm_model_load_vocab(const char *path, tm_model **out) {
    API_ARG(path && out, "tm_model_load_vocab: path and out must not be NULL");
    api_model *a = calloc(1, sizeof(*a));
    tm_model *m = calloc(1, sizeof(*m)); /* no file, no architecture, no weights */
    tm_tokenizer *tok = NULL;
    tm_status st = a && m ? tokenizer_load_file(path, &tok)
                          : tm_error_set(TM_ERR_NOMEM, "tm_model_load_vocab: out of memory");
    if (st != TM_OK) {
        free(a), free(m);
        return st;
    }
    model_api_vocab(a, tok);
    a->vocab_only = true;
    if (!(a->path = strdup(path))) {
        tokenizer_free(tok);
        free(a), free(m);
        return tm_error_set(TM_ERR_NOMEM, "tm_model_load_vocab: out of memory");
    }
    m->cfg.n_vocab = tokenizer_n_tokens(tok);
    m->api = a;
    *out = m;
    return TM_OK;
}

void tm_model_free(tm_model *m) {
    if (m) tm_model_free_api(m, m->api);
}

const api_model *api_model_of(const tm_model *m, const char *fn) {
    if (!m || !m->api) {
        tm_error_set(TM_ERR_ARG, "%s: model is NULL (or not loaded by tm_model_load)", fn);
        return NULL;
    }
    return m->api;
}

/* The API's part of a model with weights, or NULL after a message naming fn. */
static const api_model *model_weights(const tm_model *m, const char *fn, tm_status *st) {
    const api_model *a = api_model_of(m, fn);
    *st = TM_ERR_ARG;
    if (a && a->vocab_only) {
        *st =
            tm_error_set(TM_ERR_UNSUPPORTED,
                         "%s: the model was loaded by tm_model_load_vocab: it has no weights", fn);
        return NULL;
    }
    return a;
}

tm_status tm_model_describe(const tm_model *m, tm_model_info *out) {
    const api_model *a = api_model_of(m, "tm_model_describe");
    if (!a) return TM_ERR_ARG;
    API_ARG(out, "tm_model_describe: out must not be NULL");
    const tm_model_config *cfg = &m->cfg;
    *out = (tm_model_info){.arch = m->arch ? m->arch->name : NULL,
                           .n_layer = cfg->n_layer,
                           .n_embd = cfg->n_embd,
                           .n_vocab = cfg->n_vocab,
                           .n_ctx_train = cfg->n_ctx_train,
                           .n_expert = cfg->n_expert,
                           .n_expert_used = cfg->n_expert_used,
                           .n_params = m->n_params,
                           .weight_bytes = m->weight_bytes,
                           .has_vocab = a->tok != NULL,
                           .chat_format =
                               a->chat == TM_CHAT_UNKNOWN ? NULL : chat_format_name(a->chat),
                           .name = a->name,
                           .path = a->path};
    return TM_OK;
}

/* ---- contexts ---- */

static void api_context_free(api_context *a, int n_seq) {
    if (!a) return;
    trace_free(a->tr);
    trace_stats_free(&a->learn);
    plan_free(&a->plan);
    for (int s = 0; a->ids && s < n_seq; s++) free(a->ids[s]);
    free(a->ids), free(a->n), free(a->has_logits), free(a->logits), free(a->src), free(a->rows);
    free(a->in_slot), free(a->seen);
    free(a);
}

/* The per-sequence arrays of a made context. */
static tm_status api_context_alloc(api_context *a, const tm_context *c) {
    const size_t S = (size_t)c->n_seq, V = c->model->cfg.n_vocab;
    a->ids = calloc(S, sizeof(*a->ids));
    a->n = calloc(S, sizeof(*a->n));
    a->has_logits = calloc(S, sizeof(*a->has_logits));
    a->seen = calloc(S, sizeof(*a->seen));
    a->logits = calloc(S * V, sizeof(float));
    a->src = calloc(S, sizeof(*a->src));
    a->rows = calloc((size_t)c->params.n_batch, sizeof(int));
    a->in_slot = calloc(c->model->cfg.n_expert + 1, sizeof(int32_t));
    bool ok =
        a->ids && a->n && a->has_logits && a->seen && a->logits && a->src && a->rows && a->in_slot;
    for (size_t s = 0; ok && s < S; s++) ok = (a->ids[s] = malloc(c->n_ctx * sizeof(int32_t)));
    return ok ? TM_OK : tm_error_set(TM_ERR_NOMEM, "tm_context_create: out of memory");
}

/* The engine's parameters of o, the files it names read into a, and the
 * tracer of expert_stats. */
static tm_status context_params(const tm_model *m, const tm_context_opts *o, api_context *a,
                                tm_context_params *p) {
    tm_status st = api_opts_params("tm_context_create", o, p);
    if (st == TM_OK) st = api_opts_files("tm_context_create", m, o, &a->learn, &a->plan, p);
    if (st != TM_OK || !(o->expert_stats || o->expert_trace_names)) return st;
    const tm_trace_config tc = {.stats = true, .names = o->expert_trace_names};
    if ((st = model_trace_create(&tc, m, &a->tr)) != TM_OK) return st;
    trace_attach(a->tr, &p->cb, &p->cb_ud);
    return TM_OK;
}

tm_status tm_context_create(tm_model *m, const tm_context_opts *o, tm_context **out) {
    tm_status st;
    if (!model_weights(m, "tm_context_create", &st)) return st;
    API_ARG(o && out, "tm_context_create: opts and out must not be NULL");
    api_context *a = calloc(1, sizeof(*a));
    if (!a) return tm_error_set(TM_ERR_NOMEM, "tm_context_create: out of memory");
    tm_context_params p;
    tm_context *c = NULL;
    st = context_params(m, o, a, &p);
    if (st == TM_OK) st = model_context_create(m, &p, &c);
    if (st == TM_OK) st = api_context_alloc(a, c);
    if (st != TM_OK) {
        api_context_free(a, c ? c->n_seq : 0);
        model_context_free(c);
        return st;
    }
    if (a->tr) trace_set_resident(a->tr, tier_expert_resident, c->tier);
    c->api = a;
    *out = c;
    return TM_OK;
}

void tm_context_free(tm_context *c) {
    if (!c) return;
    api_context_free(c->api, c->n_seq);
    c->api = NULL;
    model_context_free(c);
}

api_context *api_context_of(const tm_context *c, const char *fn) {
    if (!c || !c->api) {
        tm_error_set(TM_ERR_ARG, "%s: context is NULL (or not made by tm_context_create)", fn);
        return NULL;
    }
    return c->api;
}

tm_status tm_context_describe(const tm_context *c, tm_context_info *out) {
    if (!api_context_of(c, "tm_context_describe")) return TM_ERR_ARG;
    API_ARG(out, "tm_context_describe: out must not be NULL");
    *out = (tm_context_info){.n_ctx = c->n_ctx,
                             .n_seq = c->n_seq,
                             .n_batch = c->params.n_batch,
                             .n_gpu_layers = c->n_gpu_layers,
                             .cache = api_context_has_cache(c)};
    return TM_OK;
}

/* ---- evaluation ---- */

tm_status api_tokens_check(const char *fn, const tm_context *c, const int32_t *t, int64_t n) {
    const uint32_t V = c->model->cfg.n_vocab;
    for (int64_t i = 0; i < n; i++)
        API_ARG(t[i] >= 0 && (uint32_t)t[i] < V, "%s: tokens[%lld] is %d, not in [0, %u)", fn,
                (long long)i, t[i], V);
    return TM_OK;
}

/* After a failed step: the sequence is empty, as the engine leaves it unusable. */
static void seq_clear(tm_context *c, api_context *a, int seq) {
    model_seq_rewind(c, seq, 0);
    a->n[seq] = 0, a->has_logits[seq] = false;
}

tm_status tm_eval(tm_context *c, int32_t seq, const int32_t *tokens, int64_t n) {
    api_context *a = api_context_of(c, "tm_eval");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_eval", c, seq);
    API_ARG(tokens && n >= 1, "tm_eval: expected tokens and n >= 1 (n is %lld)", (long long)n);
    API_ARG(n <= c->n_ctx - a->n[seq],
            "tm_eval: sequence %d holds %lld of %lld positions, %lld more do not fit", seq,
            (long long)a->n[seq], (long long)c->n_ctx, (long long)n);
    tm_status st = api_tokens_check("tm_eval", c, tokens, n);
    if (st != TM_OK) return st;
    api_logits_keep(c, a, false, seq, 1);
    const uint64_t t0 = tm_time_ns();
    st = model_decode_seq(c, seq, tokens, n, n == 1 ? TM_MOE_PHASE_DECODE : TM_MOE_PHASE_PROMPT,
                          false);
    a->eval_ns += tm_time_ns() - t0;
    if (st != TM_OK) {
        seq_clear(c, a, seq);
        return st;
    }
    memcpy(a->ids[seq] + a->n[seq], tokens, (size_t)n * sizeof(int32_t));
    a->n[seq] += n;
    api_logits_row(c, a, seq, 0);
    return TM_OK;
}

tm_status tm_eval_rows(tm_context *c, int64_t n, const int32_t *seqs, const int32_t *tokens) {
    api_context *a = api_context_of(c, "tm_eval_rows");
    if (!a) return TM_ERR_ARG;
    API_ARG(seqs && tokens, "tm_eval_rows: seqs and tokens must not be NULL");
    API_ARG(n >= 1 && n <= c->params.n_batch, "tm_eval_rows: n %lld is not in [1, %lld]",
            (long long)n, (long long)c->params.n_batch);
    memset(a->seen, 0, (size_t)c->n_seq * sizeof(bool));
    for (int64_t i = 0; i < n; i++) {
        const int32_t s = seqs[i];
        API_ARG(s >= 0 && s < c->n_seq, "tm_eval_rows: seqs[%lld] is %d, not in [0, %d)",
                (long long)i, s, c->n_seq);
        API_ARG(!a->seen[s], "tm_eval_rows: seqs[%lld]: sequence %d is in the step twice",
                (long long)i, s);
        API_ARG(a->n[s] < c->n_ctx, "tm_eval_rows: sequence %d is full (%lld positions)", s,
                (long long)c->n_ctx);
        a->seen[s] = true;
        a->rows[i] = s;
    }
    tm_status st = api_tokens_check("tm_eval_rows", c, tokens, n);
    if (st != TM_OK) return st;
    api_logits_keep(c, a, true, 0, n);
    const uint64_t t0 = tm_time_ns();
    st = model_decode_rows(c, n, a->rows, tokens);
    a->eval_ns += tm_time_ns() - t0;
    if (st != TM_OK) {
        for (int64_t i = 0; i < n; i++) seq_clear(c, a, a->rows[i]);
        return st;
    }
    for (int64_t i = 0; i < n; i++) {
        const int s = a->rows[i];
        a->ids[s][a->n[s]++] = tokens[i];
        api_logits_row(c, a, s, i);
    }
    return TM_OK;
}

tm_status tm_eval_batch(tm_context *c, int64_t n, const int32_t *seqs, const int32_t *tokens) {
    api_context *a = api_context_of(c, "tm_eval_batch");
    if (!a) return TM_ERR_ARG;
    API_ARG(seqs && tokens, "tm_eval_batch: seqs and tokens must not be NULL");
    API_ARG(n >= 1 && n <= c->params.n_batch, "tm_eval_batch: n %lld is not in [1, %lld]",
            (long long)n, (long long)c->params.n_batch);
    memset(a->seen, 0, (size_t)c->n_seq * sizeof(bool));
    bool begins = false; /* a sequence starts from empty: the counts' new sequence */
    for (int64_t i = 0, t0 = 0; i < n; i++) {
        const int32_t s = seqs[i];
        API_ARG(s >= 0 && s < c->n_seq, "tm_eval_batch: seqs[%lld] is %d, not in [0, %d)",
                (long long)i, s, c->n_seq);
        if (!i || s != seqs[i - 1]) {
            API_ARG(!a->seen[s],
                    "tm_eval_batch: seqs[%lld]: sequence %d's rows are not consecutive (one run "
                    "a sequence)",
                    (long long)i, s);
            t0 = i;
            begins |= a->n[s] == 0;
        }
        API_ARG(a->n[s] + (i - t0) < c->n_ctx,
                "tm_eval_batch: sequence %d holds %lld of %lld positions, %lld more do not fit", s,
                (long long)a->n[s], (long long)c->n_ctx, (long long)(i - t0 + 1));
        a->seen[s] = true;
        a->rows[i] = s;
    }
    tm_status st = api_tokens_check("tm_eval_batch", c, tokens, n);
    if (st != TM_OK) return st;
    if (a->tr && begins) trace_sequence_begin(a->tr);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += !i || seqs[i] != seqs[i - 1];
    api_logits_keep(c, a, true, 0, k);
    const uint64_t t0 = tm_time_ns();
    st = model_decode_batch(c, n, a->rows, tokens, &k);
    a->eval_ns += tm_time_ns() - t0;
    if (st != TM_OK) {
        for (int64_t i = 0; i < n; i++) seq_clear(c, a, a->rows[i]);
        return st;
    }
    for (int64_t i = 0, r = 0; i < n; i++) {
        const int s = a->rows[i];
        a->ids[s][a->n[s]++] = tokens[i];
        if (i + 1 == n || seqs[i + 1] != s) api_logits_row(c, a, s, r++);
    }
    return TM_OK;
}

void api_logits_keep(tm_context *c, api_context *a, bool step, int32_t seq, int64_t rows) {
    const size_t V = c->model->cfg.n_vocab;
    for (int32_t s = 0; s < c->n_seq; s++) {
        float *own = a->logits + (size_t)s * V;
        if (!a->has_logits[s] || a->src[s] == own || (step ? a->seen[s] : s == seq)) continue;
        if (a->src[s] >= c->logits + (size_t)rows * V) continue; /* a row the step leaves */
        memcpy(own, a->src[s], V * sizeof(float));
        a->src[s] = own;
    }
}

void api_logits_row(tm_context *c, api_context *a, int32_t seq, int64_t row) {
    a->src[seq] = c->logits + (size_t)row * c->model->cfg.n_vocab;
    a->has_logits[seq] = true;
}

tm_status tm_logits(const tm_context *c, int32_t seq, const float **logits) {
    const api_context *a = api_context_of(c, "tm_logits");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_logits", c, seq);
    API_ARG(logits, "tm_logits: logits must not be NULL");
    API_ARG(a->has_logits[seq],
            "tm_logits: sequence %d has no logits (nothing evaluated since it was empty or "
            "rewound)",
            seq);
    *logits = a->src[seq];
    return TM_OK;
}

tm_status tm_seq_length(const tm_context *c, int32_t seq, int64_t *n) {
    const api_context *a = api_context_of(c, "tm_seq_length");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_seq_length", c, seq);
    API_ARG(n, "tm_seq_length: n must not be NULL");
    *n = a->n[seq];
    return TM_OK;
}

tm_status tm_seq_rewind(tm_context *c, int32_t seq, int64_t n_keep, int64_t *n_kept) {
    api_context *a = api_context_of(c, "tm_seq_rewind");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_seq_rewind", c, seq);
    API_ARG(n_keep >= 0, "tm_seq_rewind: n_keep %lld is negative", (long long)n_keep);
    a->n[seq] = model_seq_rewind(c, seq, n_keep);
    a->has_logits[seq] = false;
    if (n_kept) *n_kept = a->n[seq];
    return TM_OK;
}

/* ---- sampling ---- */

void tm_sampler_params_init(tm_sampler_params *p) {
    if (p) sample_params_default(p);
}

tm_status tm_sampler_create(const tm_model *m, const tm_sampler_params *p, tm_sampler **out) {
    tm_status st;
    if (!model_weights(m, "tm_sampler_create", &st)) return st;
    API_ARG(p && out, "tm_sampler_create: params and out must not be NULL");
    tm_sampler *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "tm_sampler_create: out of memory");
    st = sampler_init(s, p, (int32_t)m->cfg.n_vocab);
    if (st != TM_OK) {
        free(s);
        return tm_error_wrap(st, "tm_sampler_create");
    }
    *out = s;
    return TM_OK;
}

void tm_sampler_free(tm_sampler *s) {
    if (!s) return;
    sampler_free(s);
    free(s);
}

tm_status tm_sampler_sample(tm_sampler *s, const float *logits, const int32_t *history,
                            size_t n_history, int32_t *token) {
    API_ARG(s, "tm_sampler_sample: sampler must not be NULL");
    API_ARG(logits && token, "tm_sampler_sample: logits and token must not be NULL");
    API_ARG(history || !n_history, "tm_sampler_sample: history is NULL with n_history %zu",
            n_history);
    *token = sampler_sample(s, logits, history, (int64_t)n_history);
    return TM_OK;
}

tm_status tm_sample(tm_sampler *s, const tm_context *c, int32_t seq, int32_t *token) {
    API_ARG(s, "tm_sample: sampler must not be NULL");
    const api_context *a = api_context_of(c, "tm_sample");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_sample", c, seq);
    API_ARG(token, "tm_sample: token must not be NULL");
    API_ARG(s->n_vocab == (int32_t)c->model->cfg.n_vocab,
            "tm_sample: the sampler is for %d tokens, the context's model has %u", s->n_vocab,
            c->model->cfg.n_vocab);
    const float *logits;
    const tm_status st = tm_logits(c, seq, &logits);
    if (st != TM_OK) return tm_error_wrap(st, "tm_sample");
    *token = sampler_sample(s, logits, a->ids[seq], a->n[seq]);
    return TM_OK;
}
