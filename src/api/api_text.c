/* The public API's text functions (include/tiermoe.h, "text"): tokenize,
 * detokenize (whole or streamed), the vocabulary and its tokens, and chat
 * templates, over the model's tokenizer (src/tokenizer). */
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"

const tm_tokenizer *api_model_vocab(const tm_model *m, const char *fn, tm_status *st) {
    const api_model *a = api_model_of(m, fn);
    *st = TM_ERR_ARG;
    if (!a) return NULL;
    *st = TM_ERR_UNSUPPORTED;
    if (!a->tok)
        tm_error_set(TM_ERR_UNSUPPORTED, "%s: the model has no vocabulary (%s)", fn, a->no_vocab);
    return a->tok;
}

tm_status api_text_out(const char *fn, const char *src, size_t n, char *buf, size_t cap,
                       size_t *len) {
    *len = n;
    if (n + 1 > cap)
        return tm_error_set(TM_ERR_ARG, "%s: text has room for %zu bytes, %zu needed (with NUL)",
                            fn, cap, n + 1);
    memcpy(buf, src, n);
    buf[n] = '\0';
    return TM_OK;
}

tm_status tm_tokenize(const tm_model *m, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_ids) {
    tm_status st;
    const tm_tokenizer *tok = api_model_vocab(m, "tm_tokenize", &st);
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

/* Check that id names a token of tok. */
static tm_status token_check(const char *fn, const tm_tokenizer *tok, int32_t id) {
    const uint32_t V = tokenizer_n_tokens(tok);
    API_ARG(id >= 0 && (uint32_t)id < V, "%s: id %d is not in [0, %u)", fn, id, V);
    return TM_OK;
}

tm_status tm_detokenize(const tm_model *m, const int32_t *ids, size_t n, bool render_special,
                        char *text, size_t cap, size_t *len) {
    tm_status st;
    const tm_tokenizer *tok = api_model_vocab(m, "tm_detokenize", &st);
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
    st = api_text_out("tm_detokenize", s, s_len, text, cap, len);
    free(s);
    return st;
}

/* m's vocabulary for fn when its output arguments are there (out, named
 * outs) and id names a token; else NULL after a message, *st its status. */
static const tm_tokenizer *token_args(const tm_model *m, const char *fn, int32_t id, bool out,
                                      const char *outs, tm_status *st) {
    const tm_tokenizer *tok = api_model_vocab(m, fn, st);
    if (!tok) return NULL;
    if (!out)
        *st = tm_error_set(TM_ERR_ARG, "%s: %s must not be NULL", fn, outs);
    else
        *st = token_check(fn, tok, id);
    return *st == TM_OK ? tok : NULL;
}

tm_status tm_token_piece(const tm_model *m, int32_t id, const char **bytes, size_t *len) {
    tm_status st;
    const tm_tokenizer *tok =
        token_args(m, "tm_token_piece", id, bytes && len, "bytes and len", &st);
    if (tok) *bytes = tokenizer_token_bytes(tok, id, false, len);
    return st;
}

tm_status tm_token_is_end(const tm_model *m, int32_t id, bool *is_end) {
    tm_status st;
    const tm_tokenizer *tok = token_args(m, "tm_token_is_end", id, is_end, "is_end", &st);
    if (tok) *is_end = tokenizer_is_end_of_generation(tok, id);
    return st;
}

tm_status tm_token_describe(const tm_model *m, int32_t id, tm_token_info *out) {
    tm_status st;
    const tm_tokenizer *tok = token_args(m, "tm_token_describe", id, out, "out", &st);
    if (!tok) return st;
    out->type = tokenizer_token_type(tok, id);
    out->text = tokenizer_token_bytes(tok, id, true, &out->len);
    return TM_OK;
}

tm_status tm_vocab_describe(const tm_model *m, tm_vocab_info *out) {
    tm_status st;
    const tm_tokenizer *tok = api_model_vocab(m, "tm_vocab_describe", &st);
    if (!tok) return st;
    API_ARG(out, "tm_vocab_describe: out must not be NULL");
    *out = (tm_vocab_info){.n_tokens = tokenizer_n_tokens(tok),
                           .model = tokenizer_model_name(tok),
                           .pre = tokenizer_pre_name(tok)};
    return TM_OK;
}

/* ---- streaming ---- */

struct tm_detokenizer {
    tm_detok_stream s;
};

tm_status tm_detokenizer_create(const tm_model *m, bool render_special, bool replace_invalid,
                                tm_detokenizer **out) {
    tm_status st;
    const tm_tokenizer *tok = api_model_vocab(m, "tm_detokenizer_create", &st);
    if (!tok) return st;
    API_ARG(out, "tm_detokenizer_create: out must not be NULL");
    tm_detokenizer *d = calloc(1, sizeof(*d));
    if (!d) return tm_error_set(TM_ERR_NOMEM, "tm_detokenizer_create: out of memory");
    tokenizer_stream_init(&d->s, tok, render_special, replace_invalid);
    *out = d;
    return TM_OK;
}

tm_status tm_detokenizer_push(tm_detokenizer *d, int32_t id, const char **text, size_t *len) {
    API_ARG(d && text && len, "tm_detokenizer_push: detokenizer, text and len must not be NULL");
    const tm_status st = token_check("tm_detokenizer_push", d->s.tok, id);
    return st != TM_OK ? st : tokenizer_stream_push(&d->s, id, text, len);
}

tm_status tm_detokenizer_flush(tm_detokenizer *d, const char **text, size_t *len) {
    API_ARG(d && text && len, "tm_detokenizer_flush: detokenizer, text and len must not be NULL");
    return tokenizer_stream_flush(&d->s, text, len);
}

void tm_detokenizer_free(tm_detokenizer *d) {
    if (!d) return;
    tokenizer_stream_free(&d->s);
    free(d);
}

/* ---- chat ---- */

/* The format a chat function renders with: format's (NULL: the model's). */
static tm_status chat_format_of(const char *fn, const api_model *a, const char *format,
                                tm_chat_format *f) {
    *f = a->chat;
    if (format && chat_format_from_name(format, f) != TM_OK)
        return tm_error_wrap(TM_ERR_ARG, "%s: format", fn);
    if (*f == TM_CHAT_UNKNOWN)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "%s: the model's chat template is not one of chatml, qwen3, llama3, "
                            "mistral, harmony: name one in format",
                            fn);
    return TM_OK;
}

tm_status tm_chat_format_check(const char *format) {
    API_ARG(format, "tm_chat_format_check: format must not be NULL");
    tm_chat_format f;
    return chat_format_from_name(format, &f); /* its message names format and the known ones */
}

/* tm_chat_apply and tm_chat_render (fn: which). */
static tm_status chat_apply(const char *fn, const tm_model *m, const char *format,
                            const tm_chat_message *msgs, size_t n_msgs, const tm_chat_params *p,
                            char *text, size_t cap, size_t *len) {
    const api_model *a = api_model_of(m, fn);
    if (!a) return TM_ERR_ARG;
    API_ARG(msgs || !n_msgs, "%s: msgs is NULL with n_msgs %zu", fn, n_msgs);
    API_ARG(text || !cap, "%s: text is NULL with cap %zu", fn, cap);
    API_ARG(len, "%s: len must not be NULL", fn);
    API_ARG(p, "%s: params must not be NULL", fn);
    for (size_t i = 0; i < n_msgs; i++)
        API_ARG(msgs[i].role && msgs[i].content, "%s: msgs[%zu]: role and content must not be NULL",
                fn, i);
    tm_chat_format f;
    tm_status st = chat_format_of(fn, a, format, &f);
    if (st != TM_OK) return st;
    const tm_chat_opts o = {.add_generation_prompt = p->add_generation_prompt,
                            .disable_thinking = p->disable_thinking,
                            .default_system = f == a->chat ? a->default_system : NULL};
    char *s = NULL;
    size_t s_len = 0;
    st = chat_render(f, msgs, n_msgs, &o, &s, &s_len);
    if (st == TM_OK) st = api_text_out(fn, s, s_len, text, cap, len);
    free(s);
    return st;
}

tm_status tm_chat_apply(const tm_model *m, const char *format, const tm_chat_message *msgs,
                        size_t n_msgs, bool add_generation_prompt, char *text, size_t cap,
                        size_t *len) {
    const tm_chat_params p = {.add_generation_prompt = add_generation_prompt};
    return chat_apply("tm_chat_apply", m, format, msgs, n_msgs, &p, text, cap, len);
}

tm_status tm_chat_render(const tm_model *m, const char *format, const tm_chat_message *msgs,
                         size_t n_msgs, const tm_chat_params *p, char *text, size_t cap,
                         size_t *len) {
    return chat_apply("tm_chat_render", m, format, msgs, n_msgs, p, text, cap, len);
}

tm_status tm_chat_reply(const tm_model *m, const char *format, const char *reply, size_t len,
                        size_t *start, size_t *n) {
    const api_model *a = api_model_of(m, "tm_chat_reply");
    if (!a) return TM_ERR_ARG;
    API_ARG(reply || !len, "tm_chat_reply: reply is NULL with len %zu", len);
    API_ARG(start && n, "tm_chat_reply: start and n must not be NULL");
    tm_chat_format f;
    const tm_status st = chat_format_of("tm_chat_reply", a, format, &f);
    if (st != TM_OK) return st;
    chat_reply_content(f, reply ? reply : "", len, start, n);
    return TM_OK;
}
