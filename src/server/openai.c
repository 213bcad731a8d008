/* The OpenAI endpoints (POST /v1/chat/completions, POST /v1/completions, GET
 * /v1/models) and llama-server's POST /tokenize and /detokenize.
 *
 * A handler thread checks the request (every field's type and range; an
 * error names the field), renders the chat with the model's template and
 * tokenizes it exactly as `tiermoe run --chat` / `run -p` do, and queues a
 * job; the worker generates and writes the reply: one JSON object, or
 * server-sent events (`chat.completion.chunk` / `text_completion` chunks, the
 * last with finish_reason; with stream_options.include_usage one more with
 * usage and no choices, as OpenAI sends; then `data: [DONE]`). A "model"
 * other than the loaded model's names is OpenAI's 404 model_not_found. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server_internal.h"

#define ERR_LEN 512

/* ---- request fields: absent or null leaves the default; a wrong type or
 * range writes why into err and returns false ---- */

static bool field_int(const json_t *o, const char *key, long long lo, long long hi, long long *out,
                      char *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    const double d = json_is_real(v) ? json_real_value(v) : 0.5;
    if (d >= -9e18 && d <= 9e18 && d == (double)(long long)d) {
        *out = (long long)d; /* 16.0 is 16 */
    } else if (!json_is_integer(v)) {
        snprintf(err, ERR_LEN, "%s: expected an integer", key);
        return false;
    } else {
        *out = json_integer_value(v);
    }
    if (*out < lo || *out > hi) {
        snprintf(err, ERR_LEN, "%s: %lld is outside [%lld, %lld]", key, *out, lo, hi);
        return false;
    }
    return true;
}

static bool field_num(const json_t *o, const char *key, double lo, double hi, bool hi_open,
                      float *out, char *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        snprintf(err, ERR_LEN, "%s: expected a number", key);
        return false;
    }
    const double d = json_number_value(v);
    const float f = (float)d; /* checked as the sampler sees it: 99.99999999999999 is 100.0f */
    if (!(d >= lo) || d > hi || !(f >= lo) || f > hi || (hi_open && (d >= hi || f >= hi))) {
        snprintf(err, ERR_LEN, "%s: %g is outside [%g, %g%s", key, d, lo, hi, hi_open ? ")" : "]");
        return false;
    }
    *out = f;
    return true;
}

static bool field_bool(const json_t *o, const char *key, bool *out, char *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        snprintf(err, ERR_LEN, "%s: expected true or false", key);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

/* A string without NUL characters (C text), or NULL after writing why. */
static const char *string_value(const json_t *v, const char *what, char *err) {
    if (!json_is_string(v)) {
        snprintf(err, ERR_LEN, "%s: expected a string", what);
        return NULL;
    }
    if (strlen(json_string_value(v)) != json_string_length(v)) {
        snprintf(err, ERR_LEN, "%s: contains a NUL character", what);
        return NULL;
    }
    return json_string_value(v);
}

/* Fields we do not implement are refused when they would change the answer. */
static bool refuse_unsupported(const json_t *o, char *err) {
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(o, penalties[i]);
        if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0)) {
            snprintf(err, ERR_LEN, "%s: not supported (use repeat_penalty)", penalties[i]);
            return false;
        }
    }
    const json_t *v = json_object_get(o, "logprobs");
    if (v && !json_is_null(v) && !json_is_false(v) &&
        !(json_is_integer(v) && !json_integer_value(v))) {
        snprintf(err, ERR_LEN, "logprobs: not supported yet");
        return false;
    }
    v = json_object_get(o, "tools");
    if (v && !json_is_null(v) && !(json_is_array(v) && !json_array_size(v))) {
        snprintf(err, ERR_LEN, "tools: not supported");
        return false;
    }
    v = json_object_get(o, "logit_bias");
    if (v && !json_is_null(v) && !(json_is_object(v) && !json_object_size(v))) {
        snprintf(err, ERR_LEN, "logit_bias: not supported");
        return false;
    }
    v = json_object_get(o, "response_format");
    const json_t *type = json_is_object(v) ? json_object_get(v, "type") : NULL;
    if (v && !json_is_null(v) &&
        !(json_is_string(type) && !strcmp(json_string_value(type), "text"))) {
        snprintf(err, ERR_LEN, "response_format: only {\"type\": \"text\"} is supported");
        return false;
    }
    long long n = 1;
    if (!field_int(o, "n", 1, 1, &n, err)) {
        snprintf(err, ERR_LEN, "n: only 1 choice per request is supported");
        return false;
    }
    return true;
}

/* max_tokens, the sampling fields, stop, ignore_eos. */
static bool parse_generation(tm_server *s, const json_t *o, srv_gen_params *g, char *err) {
    g->sp = s->p.sampling;
    g->sp.seed = s->p.seed_given ? s->p.sampling.seed
                                 : (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull +
                                       atomic_fetch_add(&s->seed_counter, 1);
    long long v = s->default_tokens;
    static const char *const max_keys[] = {"max_tokens", "max_completion_tokens", "n_predict"};
    for (int i = 0; i < 3; i++)
        if (!field_int(o, max_keys[i], 1, 0x7fffffffffffffffll, &v, err)) return false;
    if (v > s->max_tokens) {
        snprintf(err, ERR_LEN,
                 "max_tokens: %lld is above this server's limit of %lld (--max-tokens)", v,
                 (long long)s->max_tokens);
        return false;
    }
    g->max_tokens = v;
    if (!field_num(o, "temperature", 0, 100, true, &g->sp.temp, err)) return false;
    if (!field_num(o, "top_p", 0, 1, false, &g->sp.top_p, err)) return false;
    if (g->sp.top_p == 0) g->sp.top_p = 1e-9f; /* 0: only the most likely token */
    if (!field_num(o, "min_p", 0, 1, false, &g->sp.min_p, err)) return false;
    if (!field_num(o, "repeat_penalty", 1e-3, 100, false, &g->sp.repeat_penalty, err)) return false;
    long long k = g->sp.top_k, last = g->sp.repeat_last_n, seed = 0;
    if (!field_int(o, "top_k", 0, 1 << 24, &k, err)) return false;
    if (!field_int(o, "repeat_last_n", 0, 1 << 24, &last, err)) return false;
    const json_t *sv = json_object_get(o, "seed");
    if (sv && !json_is_null(sv)) {
        if (!field_int(o, "seed", -0x7fffffffffffffffll - 1, 0x7fffffffffffffffll, &seed, err))
            return false;
        g->sp.seed = (uint64_t)seed;
    }
    g->sp.top_k = (int32_t)k, g->sp.repeat_last_n = (int32_t)last;
    if (!field_bool(o, "ignore_eos", &g->ignore_eos, err)) return false;
    bool cache_prompt = true;
    if (!field_bool(o, "cache_prompt", &cache_prompt, err)) return false;
    g->fresh = !cache_prompt;
    const json_t *stop = json_object_get(o, "stop");
    if (stop && !json_is_null(stop)) {
        const bool one = json_is_string(stop);
        if (!one && !json_is_array(stop)) {
            snprintf(err, ERR_LEN, "stop: expected a string or an array of strings");
            return false;
        }
        const size_t n = one ? 1 : json_array_size(stop);
        if (n > SRV_MAX_STOP) {
            snprintf(err, ERR_LEN, "stop: %zu strings, at most %d", n, SRV_MAX_STOP);
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            char what[32];
            snprintf(what, sizeof(what), one ? "stop" : "stop[%zu]", i);
            const char *t = string_value(one ? stop : json_array_get(stop, i), what, err);
            if (!t) return false;
            if (!*t || strlen(t) > SRV_MAX_STOP_LEN) {
                snprintf(err, ERR_LEN, "%s: expected 1 to %d bytes", what, SRV_MAX_STOP_LEN);
                return false;
            }
            if (!(g->stop[g->n_stop++] = strdup(t))) {
                snprintf(err, ERR_LEN, "out of memory");
                return false;
            }
        }
    }
    return true;
}

/* The ids of text[0..len) into a malloc'd *ids (*n of them; may be NULL when 0).
 * Room for a token a byte and the specials first: tokenized once, in the main. */
static tm_status srv_tokenize(const tm_server *s, const char *text, size_t len, bool add_special,
                              bool parse_special, int32_t **ids, size_t *n) {
    size_t cap = len + 4;
    for (int pass = 0; pass < 2; pass++) {
        int32_t *buf = malloc(cap * sizeof(int32_t));
        if (!buf) return srv_error_set(TM_ERR_NOMEM, "out of memory for %zu token ids", cap);
        const tm_status st = tm_tokenize(s->m, text, len, add_special, parse_special, buf, cap, n);
        if (st == TM_OK) {
            *ids = buf;
            return TM_OK;
        }
        free(buf);
        if (st != TM_ERR_ARG || *n <= cap) return srv_error_api(st);
        cap = *n; /* more tokens than bytes (a vocabulary's added prefix): the size it said */
    }
    return srv_error_set(TM_ERR_ARG, "the tokenizer asked for more room twice");
}

/* Tokenize text as `tiermoe run` does (BOS when the model wants one, special
 * tokens written in the text parsed) and check its length. */
static bool prompt_tokens(tm_server *s, const char *text, size_t len, srv_gen_params *g,
                          char *err) {
    size_t n = 0;
    if (srv_tokenize(s, text, len, true, true, &g->prompt, &n) != TM_OK) {
        snprintf(err, ERR_LEN, "%s", server_error_message());
        return false;
    }
    g->n_prompt = (int64_t)n;
    return true;
}

static bool prompt_check(tm_server *s, const srv_gen_params *g, char *err) {
    if (!g->n_prompt) {
        snprintf(err, ERR_LEN, "the prompt is empty");
        return false;
    }
    if (g->n_prompt > s->max_prompt) {
        snprintf(err, ERR_LEN,
                 "the prompt has %" PRId64 " tokens; this server takes at most %" PRId64
                 " (--max-prompt, and the context of %" PRId64 " positions, -c)",
                 g->n_prompt, s->max_prompt, s->n_ctx);
        return false;
    }
    return true;
}

/* ---- the job ---- */

typedef enum oai_kind { OAI_CHAT, OAI_COMPLETION } oai_kind;

typedef struct oai_job {
    tm_server *s;
    srv_job *job;
    oai_kind kind;
    bool stream;
    bool include_usage; /* stream_options.include_usage: a last chunk with usage */
    char id[48];
    int64_t created;
    srv_gen_params g;
} oai_job;

static void oai_job_release(void *data) {
    oai_job *o = data;
    srv_gen_params_free(&o->g);
    free(o);
}

/* The fields every reply and chunk starts with. */
static json_t *reply_head(const oai_job *o, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", o->id, "object", object, "created",
                     (json_int_t)o->created, "model", o->s->model_name, "system_fingerprint",
                     "tiermoe-" TM_SERVER_VERSION);
}

static json_t *usage_json(const srv_gen_out *r) {
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)r->n_prompt,
                     "completion_tokens", (json_int_t)r->n_gen, "total_tokens",
                     (json_int_t)(r->n_prompt + r->n_gen));
}

/* llama-server's timings: what was evaluated (cache_n: prompt tokens reused). */
static json_t *timings_json(const srv_gen_out *r) {
    return json_pack("{s:I, s:I, s:f, s:f, s:I, s:f, s:f}", "cache_n",
                     (json_int_t)(r->n_prompt - r->n_eval), "prompt_n", (json_int_t)r->n_eval,
                     "prompt_ms", r->prompt_ms, "prompt_per_second",
                     r->prompt_ms > 0 ? 1e3 * r->n_eval / r->prompt_ms : 0.0, "predicted_n",
                     (json_int_t)r->n_gen, "predicted_ms", r->gen_ms, "predicted_per_second",
                     r->gen_ms > 0 ? 1e3 * r->n_gen / r->gen_ms : 0.0);
}

/* One choice: a message / delta (chat) or text (completion). */
static json_t *choice_json(const oai_job *o, const char *text, size_t len, const char *finish,
                           bool first_delta) {
    json_t *c = json_pack("{s:i, s:n}", "index", 0, "logprobs");
    if (!c) return NULL;
    json_t *t = text ? json_stringn(text, len) : NULL;
    if (o->kind == OAI_COMPLETION) {
        json_object_set_new(c, "text", t ? t : json_string(""));
    } else {
        json_t *m = json_object();
        if (!o->stream || first_delta) json_object_set_new(m, "role", json_string("assistant"));
        if (t) json_object_set_new(m, "content", t);
        json_object_set_new(c, o->stream ? "delta" : "message", m);
    }
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    return c;
}

static void sse_send(srv_job *j, json_t *chunk) {
    char *text = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
    json_decref(chunk);
    if (!text) return;
    srv_job_emit(j, "data: ", 6);
    srv_job_emit(j, text, strlen(text));
    srv_job_emit(j, "\n\n", 2);
    free(text);
}

static json_t *chunk_json(const oai_job *o, const char *text, size_t len, const char *finish,
                          bool first) {
    json_t *c = reply_head(o, o->kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    if (c)
        json_object_set_new(c, "choices",
                            json_pack("[o]", choice_json(o, text, len, finish, first)));
    if (c && o->include_usage) json_object_set_new(c, "usage", json_null()); /* as OpenAI */
    return c;
}

static void on_delta(void *ud, const char *text, size_t len) {
    oai_job *o = ud;
    sse_send(o->job, chunk_json(o, text, len, NULL, false));
}

static json_t *error_reply(unsigned status, const char *type, const char *msg) {
    return json_pack("{s:{s:i, s:s, s:s}}", "error", "code", (int)status, "message", msg, "type",
                     type);
}

static void oai_run(tm_server *s, srv_job *j) {
    oai_job *o = j->data;
    o->created = (int64_t)time(NULL);
    if (o->stream && o->kind == OAI_CHAT) sse_send(j, chunk_json(o, "", 0, NULL, true));
    srv_gen_out r;
    const tm_status st = srv_generate(s, &o->g, j, o->stream ? on_delta : NULL, o, &r);
    json_t *reply = NULL;
    unsigned status = 200;
    if (st != TM_OK || !r.finish) {
        const bool stopping = atomic_load(&s->stopping);
        status = st != TM_OK ? 500 : stopping ? 503 : 499;
        reply = st != TM_OK ? error_reply(500, "server_error", server_error_message())
                            : error_reply(status, "unavailable_error",
                                          stopping ? "the server is shutting down"
                                                   : "cancelled: the client left");
        if (st != TM_OK)
            fprintf(stderr, "tiermoe serve: generation failed: %s\n", server_error_message());
        if (o->stream) sse_send(j, reply), reply = NULL;
    } else if (o->stream) {
        json_t *last = chunk_json(o, NULL, 0, r.finish, false);
        if (last) json_object_set_new(last, "timings", timings_json(&r));
        sse_send(j, last);
        if (o->include_usage) { /* its own chunk, choices empty */
            json_t *u = chunk_json(o, NULL, 0, NULL, false);
            if (u) {
                json_object_set_new(u, "choices", json_array());
                json_object_set_new(u, "usage", usage_json(&r));
            }
            sse_send(j, u);
        }
        srv_job_emit(j, "data: [DONE]\n\n", 14);
    } else {
        reply = reply_head(o, o->kind == OAI_CHAT ? "chat.completion" : "text_completion");
        if (reply) {
            json_object_set_new(reply, "choices",
                                json_pack("[o]", choice_json(o, r.text, r.len, r.finish, true)));
            json_object_set_new(reply, "usage", usage_json(&r));
            json_object_set_new(reply, "timings", timings_json(&r));
        }
    }
    srv_gen_out_free(&r);
    srv_job_finish(j, status, reply);
}

/* Queue the job made from a checked request. */
static enum MHD_Result submit(srv_req *r, oai_job *o) {
    tm_server *s = r->s;
    o->s = s;
    snprintf(o->id, sizeof(o->id), "%s-%016" PRIx64, o->kind == OAI_CHAT ? "chatcmpl" : "cmpl",
             (uint64_t)atomic_fetch_add(&s->next_id, 1) ^ ((uint64_t)time(NULL) << 24));
    srv_job *j = srv_job_new(oai_run, oai_job_release, o);
    if (!j) {
        oai_job_release(o);
        return srv_reply_error(r, 500, "out of memory");
    }
    j->generation = true;
    j->prompt = o->g.prompt, j->n_prompt = o->g.n_prompt;
    o->job = j;
    return srv_reply_job(r, j, o->stream);
}

/* The parts every generation request shares; false after replying. */
static oai_job *parse_common(srv_req *r, json_t *body, oai_kind kind, enum MHD_Result *res,
                             char *err) {
    oai_job *o = calloc(1, sizeof(*o));
    if (!o) {
        *res = srv_reply_error(r, 500, "out of memory");
        return NULL;
    }
    o->kind = kind;
    const json_t *model = json_object_get(body, "model"),
                 *so = json_object_get(body, "stream_options");
    if (model && !json_is_string(model) && !json_is_null(model)) {
        snprintf(err, ERR_LEN, "model: expected a string");
    } else if (json_is_string(model) &&
               (strlen(json_string_value(model)) != json_string_length(model) ||
                !srv_model_known(r->s, json_string_value(model)))) {
        char msg[ERR_LEN + 256]; /* the name is cut, the id fits (sizeof model_name) */
        snprintf(msg, sizeof(msg),
                 "The model `%.200s` does not exist: this server serves `%.255s` (GET /v1/models; "
                 "--alias adds names)",
                 json_string_value(model), r->s->model_name);
        oai_job_release(o);
        *res =
            srv_reply_error_code(r, 404, "invalid_request_error", "model_not_found", "model", msg);
        return NULL;
    } else if (so && !json_is_object(so) && !json_is_null(so)) {
        snprintf(err, ERR_LEN, "stream_options: expected an object");
    } else if ((!json_is_object(so) || field_bool(so, "include_usage", &o->include_usage, err)) &&
               refuse_unsupported(body, err) && field_bool(body, "stream", &o->stream, err) &&
               parse_generation(r->s, body, &o->g, err)) {
        return o;
    }
    oai_job_release(o);
    *res = srv_reply_error(r, 400, "%s", err);
    return NULL;
}

/* ---- POST /v1/chat/completions ---- */

/* A message's content: a string, or an array of {"type":"text","text":...} parts (joined). */
static char *message_content(const json_t *c, size_t i, char *err) {
    char what[64];
    snprintf(what, sizeof(what), "messages[%zu].content", i);
    if (!c || json_is_null(c)) return strdup("");
    if (json_is_string(c)) {
        const char *t = string_value(c, what, err);
        return t ? strdup(t) : NULL;
    }
    if (!json_is_array(c)) {
        snprintf(err, ERR_LEN, "%s: expected a string or an array of text parts", what);
        return NULL;
    }
    size_t len = 0;
    char *out = calloc(1, 1);
    for (size_t k = 0; out && k < json_array_size(c); k++) {
        const json_t *part = json_array_get(c, k), *type = json_object_get(part, "type");
        char pw[96];
        snprintf(pw, sizeof(pw), "%s[%zu].text", what, k);
        if (!json_is_string(type) || strcmp(json_string_value(type), "text")) {
            snprintf(err, ERR_LEN, "%s[%zu]: only parts of type \"text\" are supported", what, k);
            free(out);
            return NULL;
        }
        const char *t = string_value(json_object_get(part, "text"), pw, err);
        char *grown = t ? realloc(out, len + strlen(t) + 1) : NULL;
        if (!grown) {
            free(out);
            return NULL;
        }
        out = grown;
        memcpy(out + len, t, strlen(t) + 1);
        len += strlen(t);
    }
    return out;
}

static bool chat_prompt(tm_server *s, const json_t *body, srv_gen_params *g, char *err) {
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs)) {
        snprintf(err, ERR_LEN, "messages: expected a non-empty array");
        return false;
    }
    const size_t n = json_array_size(msgs);
    tm_chat_message *m = calloc(n, sizeof(*m));
    if (!m) {
        snprintf(err, ERR_LEN, "out of memory");
        return false;
    }
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        const json_t *msg = json_array_get(msgs, i), *role = json_object_get(msg, "role");
        const char *rs = json_is_string(role) ? json_string_value(role) : "";
        if (!json_is_object(msg)) {
            snprintf(err, ERR_LEN, "messages[%zu]: expected an object", i);
            ok = false;
        } else if (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") &&
                   strcmp(rs, "assistant")) {
            snprintf(err, ERR_LEN,
                     "messages[%zu].role: expected system, developer, user or assistant", i);
            ok = false;
        } else {
            /* developer is OpenAI's newer name for system; harmony has both */
            m[i].role = !strcmp(rs, "developer") && !s->chat_harmony ? "system" : rs;
            ok = (m[i].content = message_content(json_object_get(msg, "content"), i, err)) != NULL;
        }
    }
    bool thinking = true;
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (ok && kw && !json_is_null(kw) && !json_is_object(kw)) {
        snprintf(err, ERR_LEN, "chat_template_kwargs: expected an object");
        ok = false;
    }
    if (ok && kw) ok = field_bool(kw, "enable_thinking", &thinking, err);
    char *text = NULL;
    size_t len = 0;
    if (ok) { /* the format by its name, or the model's own (with its default system prompt) */
        const tm_chat_params cp = {.add_generation_prompt = true, .disable_thinking = !thinking};
        const char *f = s->p.chat_template;
        tm_status st = tm_chat_render(s->m, f, m, n, &cp, NULL, 0, &len);
        if (st == TM_ERR_ARG && !(text = malloc(len + 1)))
            st = srv_error_set(TM_ERR_NOMEM, "out of memory");
        else if (st == TM_ERR_ARG)
            st = tm_chat_render(s->m, f, m, n, &cp, text, len + 1, &len);
        if (st != TM_OK) {
            snprintf(err, ERR_LEN, "%s", text ? tm_error_message() : server_error_message());
            ok = false;
        }
    }
    if (ok) ok = prompt_tokens(s, text, len, g, err);
    free(text);
    for (size_t i = 0; i < n; i++) free((char *)m[i].content);
    free(m);
    return ok;
}

enum MHD_Result srv_handle_chat(srv_req *r) {
    enum MHD_Result res;
    if (!srv_ready(r, &res)) return res;
    if (!r->s->chat)
        return srv_reply_error(r, 501,
                               "this model's chat template is not one tiermoe knows; start the "
                               "server with --chat-template chatml|qwen3|llama3|mistral|harmony, "
                               "or use /v1/completions");
    json_t *body = srv_body_object(r, &res);
    if (!body) return res;
    char err[ERR_LEN];
    oai_job *o = parse_common(r, body, OAI_CHAT, &res, err);
    if (o && !(chat_prompt(r->s, body, &o->g, err) && prompt_check(r->s, &o->g, err))) {
        oai_job_release(o), o = NULL;
        res = srv_reply_error(r, 400, "%s", err);
    }
    json_decref(body);
    return o ? submit(r, o) : res;
}

/* ---- POST /v1/completions ---- */

static bool completion_prompt(tm_server *s, const json_t *body, srv_gen_params *g, char *err) {
    const json_t *p = json_object_get(body, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* ["text"] */
    if (json_is_string(p)) {
        const char *t = string_value(p, "prompt", err);
        return t && prompt_tokens(s, t, strlen(t), g, err);
    }
    const size_t n = json_is_array(p) ? json_array_size(p) : 0;
    bool ids = n > 0;
    for (size_t i = 0; i < n; i++) ids &= json_is_integer(json_array_get(p, i));
    if (!ids) {
        snprintf(err, ERR_LEN, "prompt: expected a string, [string] or an array of token ids");
        return false;
    }
    if (!(g->prompt = malloc(n * sizeof(int32_t)))) {
        snprintf(err, ERR_LEN, "out of memory");
        return false;
    }
    const uint32_t n_vocab = s->info.n_vocab;
    for (size_t i = 0; i < n; i++) {
        const json_int_t id = json_integer_value(json_array_get(p, i));
        if (id < 0 || id >= (json_int_t)n_vocab) {
            snprintf(err, ERR_LEN, "prompt[%zu]: token id %lld outside [0, %u)", i, (long long)id,
                     n_vocab);
            return false;
        }
        g->prompt[g->n_prompt++] = (int32_t)id;
    }
    return true;
}

enum MHD_Result srv_handle_completions(srv_req *r) {
    enum MHD_Result res;
    if (!srv_ready(r, &res)) return res;
    json_t *body = srv_body_object(r, &res);
    if (!body) return res;
    char err[ERR_LEN];
    bool echo = false;
    oai_job *o = parse_common(r, body, OAI_COMPLETION, &res, err);
    bool ok = o && field_bool(body, "echo", &echo, err);
    if (ok && echo) snprintf(err, ERR_LEN, "echo: not supported"), ok = false;
    if (ok) ok = completion_prompt(r->s, body, &o->g, err) && prompt_check(r->s, &o->g, err);
    if (o && !ok) {
        oai_job_release(o), o = NULL;
        res = srv_reply_error(r, 400, "%s", err);
    }
    json_decref(body);
    return o ? submit(r, o) : res;
}

/* ---- GET /v1/models ---- */

enum MHD_Result srv_handle_models(srv_req *r) {
    enum MHD_Result res;
    if (!srv_ready(r, &res)) return res;
    const tm_server *s = r->s;
    const tm_model_info *c = &s->info;
    json_t *aliases = json_array(); /* the other names a request's "model" may give */
    for (int i = 1; aliases && i < s->n_names; i++)
        json_array_append_new(aliases, json_string(s->names[i]));
    return srv_reply_json(
        r, 200,
        json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:o, s:{s:s, s:I, s:I, s:I, s:i, s:i, s:i}}]}",
                  "object", "list", "data", "id", s->model_name, "object", "model", "created",
                  (json_int_t)s->created, "owned_by", "tiermoe", "aliases", aliases, "meta", "arch",
                  c->arch, "n_params", (json_int_t)c->n_params, "size", (json_int_t)c->weight_bytes,
                  "n_ctx", (json_int_t)s->n_ctx, "n_vocab", (int)c->n_vocab, "n_expert",
                  (int)c->n_expert, "n_expert_used", (int)c->n_expert_used));
}

/* ---- POST /tokenize, /detokenize ---- */

/* A token's bytes: a string when valid UTF-8, else the byte values. */
static json_t *piece_json(const char *p, size_t n) {
    json_t *s = json_stringn(p, n);
    if (s) return s;
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

enum MHD_Result srv_handle_tokenize(srv_req *r) {
    enum MHD_Result res;
    if (!srv_ready(r, &res)) return res;
    json_t *body = srv_body_object(r, &res);
    if (!body) return res;
    char err[ERR_LEN];
    bool add_special = false, parse_special = true, pieces = false;
    const char *text = NULL;
    if (field_bool(body, "add_special", &add_special, err) &&
        field_bool(body, "parse_special", &parse_special, err) &&
        field_bool(body, "with_pieces", &pieces, err))
        text = string_value(json_object_get(body, "content"), "content", err);
    if (!text) {
        json_decref(body);
        return srv_reply_error(r, 400, "%s", err);
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tm_status st = srv_tokenize(r->s, text, strlen(text), add_special, parse_special, &ids, &n_ids);
    json_decref(body);
    if (st != TM_OK) return srv_reply_error(r, 500, "%s", server_error_message());
    json_t *list = json_array();
    for (size_t i = 0; list && i < n_ids && st == TM_OK; i++) {
        tm_token_info ti = {0}; /* its bytes, a control token's text included */
        st = tm_token_describe(r->s->m, ids[i], &ti);
        json_array_append_new(list, pieces ? json_pack("{s:i, s:o}", "id", ids[i], "piece",
                                                       piece_json(ti.text, ti.len))
                                           : json_integer(ids[i]));
    }
    free(ids);
    if (st != TM_OK) {
        json_decref(list);
        return srv_reply_error(r, 500, "%s", tm_error_message());
    }
    return srv_reply_json(r, 200, json_pack("{s:o}", "tokens", list));
}

enum MHD_Result srv_handle_detokenize(srv_req *r) {
    enum MHD_Result res;
    if (!srv_ready(r, &res)) return res;
    json_t *body = srv_body_object(r, &res);
    if (!body) return res;
    const json_t *list = json_object_get(body, "tokens");
    const uint32_t n_vocab = r->s->n_tokens;
    if (!json_is_array(list)) {
        json_decref(body);
        return srv_reply_error(r, 400, "tokens: expected an array of token ids");
    }
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *v = json_array_get(list, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= (json_int_t)n_vocab) {
            json_decref(body);
            return srv_reply_error(r, 400, "tokens[%zu]: expected a token id in [0, %u)", i,
                                   n_vocab);
        }
    }
    /* the streaming decoder makes invalid bytes U+FFFD: JSON carries only UTF-8 */
    tm_detokenizer *ds = NULL;
    char *text = tm_detokenizer_create(r->s->m, false, true, &ds) == TM_OK ? calloc(1, 1) : NULL;
    size_t len = 0;
    for (size_t i = 0; text && i <= json_array_size(list); i++) {
        const char *p;
        size_t n;
        const tm_status st =
            i < json_array_size(list)
                ? tm_detokenizer_push(ds, (int32_t)json_integer_value(json_array_get(list, i)), &p,
                                      &n)
                : tm_detokenizer_flush(ds, &p, &n);
        char *grown = st == TM_OK ? realloc(text, len + n + 1) : NULL;
        if (!grown) {
            free(text), text = NULL;
            break;
        }
        text = grown;
        memcpy(text + len, p, n);
        len += n;
    }
    tm_detokenizer_free(ds);
    json_decref(body);
    if (!text) return srv_reply_error(r, 500, "out of memory");
    json_t *reply = json_pack("{s:s%}", "content", text, len);
    free(text);
    return srv_reply_json(r, 200, reply);
}
