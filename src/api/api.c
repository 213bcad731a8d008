/* The public C API (include/tiermoe.h): a thin layer over the model, tokenizer,
 * chat, sampler, tracer and tier modules, doing what tools/cmd_run.c and
 * src/server do with them. The public tm_model and tm_context are the engine's
 * own structs; what the API keeps beside them (the vocabulary, each sequence's
 * tokens and last logits, the tracer, the plan and learn files the tier was
 * made from) hangs off their api pointer. Every entry point checks its
 * arguments first, so a bad one is TM_ERR_ARG with a message naming it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "model/model.h"
#include "sample/sample.h"
#include "tier/plan.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "trace/trace.h"

#define TM_STR_(x) #x
#define TM_STR(x)  TM_STR_(x)

/* Return TM_ERR_ARG with a message "fn: what" when cond does not hold. */
#define API_ARG(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) return tm_error_set(TM_ERR_ARG, __VA_ARGS__);                                 \
    } while (0)

typedef struct api_model {
    tm_tokenizer *tok; /* NULL: the file has no vocabulary */
    tm_chat_format chat;
    const char *default_system; /* chatml templates' built-in system prompt (in tok), or NULL */
} api_model;

typedef struct api_context {
    tm_trace *tr;         /* expert_stats: the tracer fed by the context's callback */
    tm_trace_stats learn; /* moe_learn, read before the tier was made */
    tm_plan plan;         /* moe_cache_plan, the same */
    int32_t **ids;        /* [n_seq][n_ctx]: each sequence's tokens (the penalty's history) */
    int64_t *n;           /* [n_seq] */
    bool *has_logits;     /* [n_seq] */
    float *logits;        /* [n_seq][n_vocab]: each sequence's last token's */
    int *rows;            /* [n_batch]: tm_eval_rows' sequences as model_decode_rows takes them */
    int32_t *in_slot;     /* [n_expert]: scratch of the cache functions */
    bool *seen;           /* [n_seq]: scratch of tm_eval_rows */
} api_context;

const char *tm_version(void) {
    return TM_STR(TIERMOE_VERSION_MAJOR) "." TM_STR(TIERMOE_VERSION_MINOR) "." TM_STR(
        TIERMOE_VERSION_PATCH);
}

/* ---- models ---- */

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
    if (tokenizer_load_gguf(m->file, &a->tok) != TM_OK) {
        a->tok = NULL; /* a model without a vocabulary still evaluates ids */
        tm_error_clear();
    }
    a->chat = a->tok ? chat_format_detect(tokenizer_chat_template(a->tok), &a->default_system)
                     : TM_CHAT_UNKNOWN;
    m->api = a;
    *out = m;
    return TM_OK;
}

void tm_model_free(tm_model *m) {
    if (!m) return;
    api_model *a = m->api;
    if (a && a->tok) tokenizer_free(a->tok);
    free(a);
    m->api = NULL;
    model_free(m);
}

/* The API's part of a model, or NULL after a message naming fn. */
static const api_model *model_api(const tm_model *m, const char *fn) {
    if (!m || !m->api) {
        tm_error_set(TM_ERR_ARG, "%s: model is NULL (or not loaded by tm_model_load)", fn);
        return NULL;
    }
    return m->api;
}

tm_status tm_model_describe(const tm_model *m, tm_model_info *out) {
    const api_model *a = model_api(m, "tm_model_describe");
    if (!a) return TM_ERR_ARG;
    API_ARG(out, "tm_model_describe: out must not be NULL");
    const tm_model_config *cfg = &m->cfg;
    *out = (tm_model_info){.arch = m->arch->name,
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
                               a->chat == TM_CHAT_UNKNOWN ? NULL : chat_format_name(a->chat)};
    return TM_OK;
}

/* ---- text ---- */

/* The model's vocabulary, or NULL after a message naming fn. */
static const tm_tokenizer *model_vocab(const tm_model *m, const char *fn, tm_status *st) {
    const api_model *a = model_api(m, fn);
    *st = TM_ERR_ARG;
    if (!a) return NULL;
    *st = TM_ERR_UNSUPPORTED;
    if (!a->tok) tm_error_set(TM_ERR_UNSUPPORTED, "%s: the model has no vocabulary", fn);
    return a->tok;
}

tm_status tm_tokenize(const tm_model *m, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_ids) {
    tm_status st;
    const tm_tokenizer *tok = model_vocab(m, "tm_tokenize", &st);
    if (!tok) return st;
    API_ARG(text || !len, "tm_tokenize: text is NULL with len %zu", len);
    API_ARG(ids || !cap, "tm_tokenize: ids is NULL with cap %zu", cap);
    API_ARG(n_ids, "tm_tokenize: n_ids must not be NULL");
    tm_tokens v = {0};
    const tm_tokenize_opts o = {.add_special = add_special, .parse_special = parse_special};
    if ((st = tokenizer_encode(tok, text ? text : "", len, &o, &v)) != TM_OK) {
        tokenizer_tokens_free(&v);
        return st;
    }
    *n_ids = v.n;
    if (v.n > cap)
        st = tm_error_set(TM_ERR_ARG, "tm_tokenize: ids has room for %zu, the text has %zu tokens",
                          cap, v.n);
    else if (v.n)
        memcpy(ids, v.ids, v.n * sizeof(int32_t));
    tokenizer_tokens_free(&v);
    return st;
}

/* Copy src[0..n) and a NUL into (buf, cap) under the header's size rule. */
static tm_status text_out(const char *fn, const char *src, size_t n, char *buf, size_t cap,
                          size_t *len) {
    *len = n;
    if (n + 1 > cap)
        return tm_error_set(TM_ERR_ARG, "%s: text has room for %zu bytes, %zu needed (with NUL)",
                            fn, cap, n + 1);
    memcpy(buf, src, n);
    buf[n] = '\0';
    return TM_OK;
}

tm_status tm_detokenize(const tm_model *m, const int32_t *ids, size_t n, bool render_special,
                        char *text, size_t cap, size_t *len) {
    tm_status st;
    const tm_tokenizer *tok = model_vocab(m, "tm_detokenize", &st);
    if (!tok) return st;
    API_ARG(ids || !n, "tm_detokenize: ids is NULL with n %zu", n);
    API_ARG(text || !cap, "tm_detokenize: text is NULL with cap %zu", cap);
    API_ARG(len, "tm_detokenize: len must not be NULL");
    const uint32_t V = tokenizer_n_tokens(tok);
    for (size_t i = 0; i < n; i++)
        API_ARG(ids[i] >= 0 && (uint32_t)ids[i] < V,
                "tm_detokenize: ids[%zu] is %d, not in [0, %u)", i, ids[i], V);
    char *s = NULL;
    size_t s_len = 0;
    if ((st = tokenizer_decode(tok, ids, n, render_special, &s, &s_len)) != TM_OK) return st;
    st = text_out("tm_detokenize", s, s_len, text, cap, len);
    free(s);
    return st;
}

tm_status tm_token_piece(const tm_model *m, int32_t id, const char **bytes, size_t *len) {
    tm_status st;
    const tm_tokenizer *tok = model_vocab(m, "tm_token_piece", &st);
    if (!tok) return st;
    API_ARG(bytes && len, "tm_token_piece: bytes and len must not be NULL");
    const uint32_t V = tokenizer_n_tokens(tok);
    API_ARG(id >= 0 && (uint32_t)id < V, "tm_token_piece: id %d is not in [0, %u)", id, V);
    *bytes = tokenizer_token_bytes(tok, id, false, len);
    return TM_OK;
}

tm_status tm_token_is_end(const tm_model *m, int32_t id, bool *is_end) {
    tm_status st;
    const tm_tokenizer *tok = model_vocab(m, "tm_token_is_end", &st);
    if (!tok) return st;
    API_ARG(is_end, "tm_token_is_end: is_end must not be NULL");
    const uint32_t V = tokenizer_n_tokens(tok);
    API_ARG(id >= 0 && (uint32_t)id < V, "tm_token_is_end: id %d is not in [0, %u)", id, V);
    *is_end = tokenizer_is_end_of_generation(tok, id);
    return TM_OK;
}

tm_status tm_chat_apply(const tm_model *m, const char *format, const tm_chat_message *msgs,
                        size_t n_msgs, bool add_generation_prompt, char *text, size_t cap,
                        size_t *len) {
    const api_model *a = model_api(m, "tm_chat_apply");
    if (!a) return TM_ERR_ARG;
    API_ARG(msgs || !n_msgs, "tm_chat_apply: msgs is NULL with n_msgs %zu", n_msgs);
    API_ARG(text || !cap, "tm_chat_apply: text is NULL with cap %zu", cap);
    API_ARG(len, "tm_chat_apply: len must not be NULL");
    for (size_t i = 0; i < n_msgs; i++)
        API_ARG(msgs[i].role && msgs[i].content,
                "tm_chat_apply: msgs[%zu]: role and content must not be NULL", i);
    tm_chat_format f = a->chat;
    if (format && chat_format_from_name(format, &f) != TM_OK)
        return tm_error_wrap(TM_ERR_ARG, "tm_chat_apply: format");
    if (f == TM_CHAT_UNKNOWN)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_chat_apply: the model's chat template is not one of chatml, qwen3, "
                            "llama3, mistral, harmony: name one in format");
    const tm_chat_opts o = {.add_generation_prompt = add_generation_prompt,
                            .default_system = f == a->chat ? a->default_system : NULL};
    char *s = NULL;
    size_t s_len = 0;
    tm_status st = chat_render(f, msgs, n_msgs, &o, &s, &s_len);
    if (st == TM_OK) st = text_out("tm_chat_apply", s, s_len, text, cap, len);
    free(s);
    return st;
}

/* ---- contexts ---- */

void tm_context_opts_init(tm_context_opts *o) {
    if (!o) return;
    *o = (tm_context_opts){.moe_pcie = TM_AUTO, .moe_fetch = TM_AUTO, .moe_ahead = TM_AUTO};
}

/* A --moe-pcie / --moe-ahead count: TM_AUTO, TM_OFF or 0..max (0: off, as the flags). */
static tm_status opts_count(const char *field, int32_t v, int32_t max, int auto_v, int off_v,
                            int *out) {
    API_ARG(v == TM_AUTO || v == TM_OFF || (v >= 0 && v <= max),
            "tm_context_create: %s %d: expected TM_AUTO, TM_OFF or 0..%d", field, v, max);
    *out = v == TM_AUTO ? auto_v : v == TM_OFF || v == 0 ? off_v : v;
    return TM_OK;
}

/* The public options into the engine's context parameters (files read into a). */
static tm_status opts_to_params(const tm_model *m, const tm_context_opts *o, api_context *a,
                                tm_context_params *p) {
    API_ARG(o->n_ctx >= 0 && o->n_seq >= 0 && o->n_batch >= 0 && o->n_threads >= 0,
            "tm_context_create: n_ctx, n_seq, n_batch and n_threads must not be negative");
    API_ARG(o->n_gpu_layers >= TM_AUTO,
            "tm_context_create: n_gpu_layers %d: expected a layer count or TM_AUTO",
            o->n_gpu_layers);
    API_ARG(o->n_cpu_moe >= 0, "tm_context_create: n_cpu_moe %d is negative", o->n_cpu_moe);
    API_ARG(o->moe_cache_mib >= 0 || o->moe_cache_mib == TM_AUTO,
            "tm_context_create: moe_cache_mib %lld: expected MiB or TM_AUTO",
            (long long)o->moe_cache_mib);
    API_ARG(o->ram_cache_mib >= 0 || o->ram_cache_mib == TM_AUTO,
            "tm_context_create: ram_cache_mib %lld: expected MiB or TM_AUTO",
            (long long)o->ram_cache_mib);
    *p = (tm_context_params){
        .n_ctx = o->n_ctx,
        .n_seq = o->n_seq,
        .n_batch = o->n_batch,
        .n_threads = o->n_threads,
        .kv_type = o->kv_f32 ? TM_TYPE_F32 : TM_TYPE_F16,
        .n_gpu_layers = o->n_gpu_layers == TM_AUTO ? TM_NGL_AUTO : o->n_gpu_layers,
        .cpu_moe = o->cpu_moe,
        .n_cpu_moe = o->n_cpu_moe,
        .override_tensor = o->override_tensor,
        .moe_cache_mib = o->moe_cache_mib == TM_AUTO ? TM_MOE_CACHE_AUTO : o->moe_cache_mib,
        .ram_cache_mib = o->ram_cache_mib == TM_AUTO ? TM_RAM_CACHE_AUTO : o->ram_cache_mib};
    tm_status st;
    if ((st = opts_count("moe_pcie", o->moe_pcie, TM_CUDA_ROUTER_MAX_USED, TM_MOE_PCIE_AUTO,
                         TM_MOE_PCIE_OFF, &p->moe_pcie)) ||
        (st = opts_count("moe_ahead", o->moe_ahead, TM_CUDA_FETCH_AHEAD_MAX, TM_MOE_AHEAD_AUTO,
                         TM_MOE_AHEAD_OFF, &p->moe_ahead)))
        return st;
    switch (o->moe_fetch) {
    case TM_AUTO:
        p->moe_fetch = TM_MOE_FETCH_AUTO;
        break;
    case TM_OFF:
        p->moe_fetch = TM_MOE_FETCH_OFF;
        break;
    case TM_FETCH_COPY:
        p->moe_fetch = TM_MOE_FETCH_COPY;
        break;
    case TM_FETCH_PCIE:
        p->moe_fetch = TM_MOE_FETCH_PCIE;
        break;
    default:
        return tm_error_set(TM_ERR_ARG,
                            "tm_context_create: moe_fetch %d: expected TM_AUTO, TM_OFF, "
                            "TM_FETCH_COPY or TM_FETCH_PCIE",
                            o->moe_fetch);
    }
    if (o->override_tensor &&
        (st = placement_overrides_check("override_tensor", o->override_tensor)) != TM_OK)
        return tm_error_wrap(st, "tm_context_create");
    tm_trace_shape shape;
    model_trace_shape(m, &shape);
    if (o->moe_learn) {
        if ((st = trace_stats_read_json(o->moe_learn, &shape, &a->learn)) != TM_OK)
            return tm_error_wrap(st, "tm_context_create: moe_learn");
        p->moe_cache.learn = &a->learn;
    }
    if (o->moe_cache_plan) {
        if ((st = plan_read_json(o->moe_cache_plan, &shape, &a->plan)) != TM_OK)
            return tm_error_wrap(st, "tm_context_create: moe_cache_plan");
        p->moe_cache.plan = &a->plan;
    }
    if (o->expert_stats) {
        const tm_trace_config tc = {.stats = true};
        if ((st = model_trace_create(&tc, m, &a->tr)) != TM_OK) return st;
        trace_attach(a->tr, &p->cb, &p->cb_ud);
    }
    return TM_OK;
}

static void api_context_free(api_context *a, int n_seq) {
    if (!a) return;
    trace_free(a->tr);
    trace_stats_free(&a->learn);
    plan_free(&a->plan);
    for (int s = 0; a->ids && s < n_seq; s++) free(a->ids[s]);
    free(a->ids), free(a->n), free(a->has_logits), free(a->logits), free(a->rows);
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
    a->rows = calloc((size_t)c->params.n_batch, sizeof(int));
    a->in_slot = calloc(c->model->cfg.n_expert + 1, sizeof(int32_t));
    bool ok = a->ids && a->n && a->has_logits && a->seen && a->logits && a->rows && a->in_slot;
    for (size_t s = 0; ok && s < S; s++) ok = (a->ids[s] = malloc(c->n_ctx * sizeof(int32_t)));
    return ok ? TM_OK : tm_error_set(TM_ERR_NOMEM, "tm_context_create: out of memory");
}

tm_status tm_context_create(tm_model *m, const tm_context_opts *o, tm_context **out) {
    if (!model_api(m, "tm_context_create")) return TM_ERR_ARG;
    API_ARG(o && out, "tm_context_create: opts and out must not be NULL");
    api_context *a = calloc(1, sizeof(*a));
    if (!a) return tm_error_set(TM_ERR_NOMEM, "tm_context_create: out of memory");
    tm_context_params p;
    tm_context *c = NULL;
    tm_status st = opts_to_params(m, o, a, &p);
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

/* The API's part of a context, or NULL after a message naming fn. */
static api_context *context_api(const tm_context *c, const char *fn) {
    if (!c || !c->api) {
        tm_error_set(TM_ERR_ARG, "%s: context is NULL (or not made by tm_context_create)", fn);
        return NULL;
    }
    return c->api;
}

static bool context_has_cache(const tm_context *c) {
    for (uint32_t l = 0; c->tier && l < c->model->cfg.n_layer; l++)
        if (tier_cache_slots(c->tier, l) > 0) return true;
    return false;
}

tm_status tm_context_describe(const tm_context *c, tm_context_info *out) {
    if (!context_api(c, "tm_context_describe")) return TM_ERR_ARG;
    API_ARG(out, "tm_context_describe: out must not be NULL");
    *out = (tm_context_info){.n_ctx = c->n_ctx,
                             .n_seq = c->n_seq,
                             .n_batch = c->params.n_batch,
                             .n_gpu_layers = c->n_gpu_layers,
                             .cache = context_has_cache(c)};
    return TM_OK;
}

/* ---- evaluation ---- */

#define API_SEQ(fn, c, seq)                                                                        \
    API_ARG((seq) >= 0 && (seq) < (c)->n_seq, fn ": seq %d is not in [0, %d)", (int)(seq),         \
            (c)->n_seq)

static tm_status tokens_check(const char *fn, const tm_context *c, const int32_t *t, int64_t n) {
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
    api_context *a = context_api(c, "tm_eval");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_eval", c, seq);
    API_ARG(tokens && n >= 1, "tm_eval: expected tokens and n >= 1 (n is %lld)", (long long)n);
    API_ARG(n <= c->n_ctx - a->n[seq],
            "tm_eval: sequence %d holds %lld of %lld positions, %lld more do not fit", seq,
            (long long)a->n[seq], (long long)c->n_ctx, (long long)n);
    tm_status st = tokens_check("tm_eval", c, tokens, n);
    if (st != TM_OK) return st;
    st = model_decode_seq(c, seq, tokens, n, n == 1 ? TM_MOE_PHASE_DECODE : TM_MOE_PHASE_PROMPT,
                          false);
    if (st != TM_OK) {
        seq_clear(c, a, seq);
        return st;
    }
    const size_t V = c->model->cfg.n_vocab;
    memcpy(a->ids[seq] + a->n[seq], tokens, (size_t)n * sizeof(int32_t));
    a->n[seq] += n;
    memcpy(a->logits + (size_t)seq * V, c->logits, V * sizeof(float));
    a->has_logits[seq] = true;
    return TM_OK;
}

tm_status tm_eval_rows(tm_context *c, int64_t n, const int32_t *seqs, const int32_t *tokens) {
    api_context *a = context_api(c, "tm_eval_rows");
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
    tm_status st = tokens_check("tm_eval_rows", c, tokens, n);
    if (st != TM_OK) return st;
    if ((st = model_decode_rows(c, n, a->rows, tokens)) != TM_OK) {
        for (int64_t i = 0; i < n; i++) seq_clear(c, a, a->rows[i]);
        return st;
    }
    const size_t V = c->model->cfg.n_vocab;
    for (int64_t i = 0; i < n; i++) {
        const int s = a->rows[i];
        a->ids[s][a->n[s]++] = tokens[i];
        memcpy(a->logits + (size_t)s * V, c->logits + (size_t)i * V, V * sizeof(float));
        a->has_logits[s] = true;
    }
    return TM_OK;
}

tm_status tm_logits(const tm_context *c, int32_t seq, const float **logits) {
    const api_context *a = context_api(c, "tm_logits");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_logits", c, seq);
    API_ARG(logits, "tm_logits: logits must not be NULL");
    API_ARG(a->has_logits[seq],
            "tm_logits: sequence %d has no logits (nothing evaluated since it was empty or "
            "rewound)",
            seq);
    *logits = a->logits + (size_t)seq * c->model->cfg.n_vocab;
    return TM_OK;
}

tm_status tm_seq_length(const tm_context *c, int32_t seq, int64_t *n) {
    const api_context *a = context_api(c, "tm_seq_length");
    if (!a) return TM_ERR_ARG;
    API_SEQ("tm_seq_length", c, seq);
    API_ARG(n, "tm_seq_length: n must not be NULL");
    *n = a->n[seq];
    return TM_OK;
}

tm_status tm_seq_rewind(tm_context *c, int32_t seq, int64_t n_keep, int64_t *n_kept) {
    api_context *a = context_api(c, "tm_seq_rewind");
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
    if (!model_api(m, "tm_sampler_create")) return TM_ERR_ARG;
    API_ARG(p && out, "tm_sampler_create: params and out must not be NULL");
    tm_sampler *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "tm_sampler_create: out of memory");
    const tm_status st = sampler_init(s, p, (int32_t)m->cfg.n_vocab);
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

tm_status tm_sample(tm_sampler *s, const tm_context *c, int32_t seq, int32_t *token) {
    API_ARG(s, "tm_sample: sampler must not be NULL");
    const api_context *a = context_api(c, "tm_sample");
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

/* ---- experts ---- */

#define API_LAYER(fn, c, layer)                                                                    \
    API_ARG((layer) < (c)->model->cfg.n_layer, fn ": layer %u is not in [0, %u)", (layer),         \
            (c)->model->cfg.n_layer)

tm_status tm_expert_counts(const tm_context *c, uint32_t layer, uint64_t *counts, size_t cap) {
    const api_context *a = context_api(c, "tm_expert_counts");
    if (!a) return TM_ERR_ARG;
    API_LAYER("tm_expert_counts", c, layer);
    const uint32_t E = c->model->cfg.n_expert;
    API_ARG(counts && cap >= E, "tm_expert_counts: counts needs room for %u (cap is %zu)", E, cap);
    if (!a->tr)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_expert_counts: the context was made without expert_stats");
    memcpy(counts, trace_get_stats(a->tr)->layers[layer].experts, E * sizeof(uint64_t));
    return TM_OK;
}

tm_status tm_expert_counts_reset(tm_context *c) {
    const api_context *a = context_api(c, "tm_expert_counts_reset");
    if (!a) return TM_ERR_ARG;
    if (!a->tr)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_expert_counts_reset: the context was made without expert_stats");
    trace_reset(a->tr);
    return TM_OK;
}

/* Each slot's expert (-1: empty) of layer l into in_slot[0..slots). */
static void slots_read(const tm_context *c, uint32_t l, int32_t *in_slot, int32_t slots) {
    for (int32_t k = 0; k < slots; k++) in_slot[k] = -1;
    for (uint32_t e = 0; e < c->model->cfg.n_expert; e++) {
        const int32_t k = tier_slot_of(c->tier, l, (int32_t)e);
        if (k >= 0 && k < slots) in_slot[k] = (int32_t)e;
    }
}

static int32_t layer_slots(const tm_context *c, uint32_t l) {
    return c->tier ? tier_cache_slots(c->tier, l) : 0;
}

tm_status tm_cache_experts(const tm_context *c, uint32_t layer, int32_t *experts, size_t cap,
                           size_t *n_slots) {
    const api_context *a = context_api(c, "tm_cache_experts");
    if (!a) return TM_ERR_ARG;
    API_LAYER("tm_cache_experts", c, layer);
    API_ARG(experts || !cap, "tm_cache_experts: experts is NULL with cap %zu", cap);
    API_ARG(n_slots, "tm_cache_experts: n_slots must not be NULL");
    const int32_t slots = layer_slots(c, layer);
    *n_slots = slots > 0 ? (size_t)slots : 0;
    API_ARG(*n_slots <= cap, "tm_cache_experts: experts has room for %zu, layer %u has %zu slots",
            cap, layer, *n_slots);
    if (slots > 0) slots_read(c, layer, experts, slots);
    return TM_OK;
}

tm_status tm_cache_apply(tm_context *c, const char *plan_json, size_t len, int32_t *n_changed) {
    api_context *a = context_api(c, "tm_cache_apply");
    if (!a) return TM_ERR_ARG;
    API_ARG(plan_json, "tm_cache_apply: plan_json must not be NULL");
    tm_trace_shape shape;
    model_trace_shape(c->model, &shape);
    tm_plan plan;
    tm_status st = plan_parse_json(plan_json, len, "tm_cache_apply: plan", &shape, &plan);
    if (st != TM_OK) return st;
    if (!context_has_cache(c)) {
        plan_free(&plan);
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_cache_apply: the context has no VRAM expert cache (it needs a GPU, "
                            "experts in RAM: cpu_moe or n_cpu_moe, and moe_cache_mib or "
                            "moe_cache_plan)");
    }
    const uint32_t L = c->model->cfg.n_layer;
    int64_t total = 0;
    for (uint32_t l = 0; l < L; l++) total += layer_slots(c, l) > 0 ? layer_slots(c, l) : 0;
    tm_plan_change *ch = malloc(((size_t)total + 1) * sizeof(*ch));
    if (!ch) {
        plan_free(&plan);
        return tm_error_set(TM_ERR_NOMEM, "tm_cache_apply: out of memory");
    }
    int32_t n_ch = 0, done = 0;
    for (uint32_t l = 0; l < L; l++) {
        const int32_t slots = layer_slots(c, l);
        if (slots <= 0) continue; /* a plan's layer without slots is left as it is */
        slots_read(c, l, a->in_slot, slots);
        plan_cache_diff(&plan, l, a->in_slot, slots, ch, &n_ch);
    }
    for (; done < n_ch && st == TM_OK; done++)
        st = tier_cache_set(c->tier, ch[done].layer, ch[done].slot, ch[done].after);
    if (st != TM_OK) { /* undo, newest first: each old expert back to its slot */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", tm_error_message());
        for (int32_t i = done - 1; i >= 0; i--)
            if (ch[i].before >= 0) tier_cache_set(c->tier, ch[i].layer, ch[i].slot, ch[i].before);
        tm_error_set(st, "tm_cache_apply: %s (the previous experts were put back)", msg);
    }
    if (st == TM_OK && n_changed) *n_changed = n_ch;
    free(ch);
    plan_free(&plan);
    return st;
}
