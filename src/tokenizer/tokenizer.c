/* The tokenizer's front door: queries, encoding (special tokens and invalid
 * UTF-8 first, then the family's encoder on the text between them), decoding
 * and the streaming decoder that never ends its output inside a character. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

/* ---- queries ---- */

tm_tokenizer_kind tokenizer_kind(const tm_tokenizer *t) {
    return t->kind;
}
uint32_t tokenizer_n_tokens(const tm_tokenizer *t) {
    return t->n_tokens;
}
const char *tokenizer_model_name(const tm_tokenizer *t) {
    return t->model_name;
}
const char *tokenizer_pre_name(const tm_tokenizer *t) {
    return t->pre_name;
}
tm_tokenizer_specials tokenizer_specials(const tm_tokenizer *t) {
    return t->sp;
}
bool tokenizer_add_bos(const tm_tokenizer *t) {
    return t->add_bos;
}
bool tokenizer_add_eos(const tm_tokenizer *t) {
    return t->add_eos;
}
const char *tokenizer_chat_template(const tm_tokenizer *t) {
    return t->chat_template;
}

tm_token_type tokenizer_token_type(const tm_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_tokens) return TM_TOKEN_TYPE_UNDEFINED;
    return (tm_token_type)t->type[id];
}

const char *tokenizer_token_text(const tm_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_tokens) return NULL;
    return t->text_blob + t->text_off[id];
}

int32_t tokenizer_token_find(const tm_tokenizer *t, const char *text, size_t len) {
    return tok_vocab_find(t, text, len);
}

bool tokenizer_is_end_of_generation(const tm_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_tokens) return false;
    if (id == t->sp.eos || id == t->sp.eot || id == t->sp.eom) return true;
    if (t->type[id] != TM_TOKEN_TYPE_CONTROL) return false;
    static const char *const names[] = {"<|im_end|>", "<|endoftext|>",   "<|eot_id|>",
                                        "<|eom_id|>", "<|return|>",      "<|call|>",
                                        "</s>",       "<|end_of_text|>", "<turn|>"};
    const char *s = t->text_blob + t->text_off[id];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(s, names[i])) return true;
    return false;
}

/* ---- token lists ---- */

tm_status tokenizer_tokens_push(tm_tokens *v, int32_t id) {
    if (v->n == v->cap) {
        size_t c = v->cap ? 2 * v->cap : 64;
        int32_t *p = realloc(v->ids, c * sizeof(*p));
        if (!p) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory for %zu tokens", c);
        v->ids = p;
        v->cap = c;
    }
    v->ids[v->n++] = id;
    return TM_OK;
}

void tokenizer_tokens_free(tm_tokens *v) {
    free(v->ids);
    *v = (tm_tokens){0};
}

/* ---- encoding ---- */

/* The special token that starts at s[0..n), longest first, or NULL. */
static const tm_special_entry *special_at(const tm_tokenizer *t, const uint8_t *s, size_t n,
                                          bool parse_special) {
    uint32_t b = s[0];
    for (uint32_t k = t->special_first[b]; k < t->special_first[b + 1]; k++) {
        const tm_special_entry *e = &t->specials[k];
        if (e->len <= n && (parse_special || !e->control) && !memcmp(e->text, s, e->len)) return e;
    }
    return NULL;
}

static tm_status encode_run(const tm_tokenizer *t, tm_pretok_scratch *sc, const char *text,
                            size_t len, tm_tokens *out) {
    if (len == 0) return TM_OK;
    if (t->kind == TM_TOKENIZER_SPM) return spm_encode_text(t, text, len, t->add_space_prefix, out);
    return bpe_encode_text(t, sc, text, len, out);
}

tm_status tokenizer_encode(const tm_tokenizer *t, const char *text, size_t len,
                           const tm_tokenize_opts *opts, tm_tokens *out) {
    tm_tokenize_opts o = opts ? *opts : (tm_tokenize_opts){0};
    tm_status st = TM_OK;
    tm_pretok_scratch *sc = NULL;
    if (o.add_special && t->add_bos && (st = tokenizer_tokens_push(out, t->sp.bos))) return st;
    if (t->kind == TM_TOKENIZER_BPE && (st = pretok_scratch_init(&t->pretok, &sc))) return st;

    const uint8_t *s = (const uint8_t *)text;
    size_t run = 0, i = 0;
    while (i < len && st == TM_OK) {
        size_t cl = tok_utf8_valid_len(s + i, len - i);
        if (cl == 0) {
            if (t->kind == TM_TOKENIZER_BPE) {
                /* an invalid byte is a hard boundary and its own byte token */
                st = encode_run(t, sc, text + run, i - run, out);
                if (st == TM_OK) st = tokenizer_tokens_push(out, t->byte_token[s[i]]);
                run = i + 1;
            }
            i++;
            continue;
        }
        const tm_special_entry *e =
            t->n_specials ? special_at(t, s + i, len - i, o.parse_special) : NULL;
        if (e) {
            st = encode_run(t, sc, text + run, i - run, out);
            if (st == TM_OK) st = tokenizer_tokens_push(out, e->id);
            i += e->len;
            run = i;
            continue;
        }
        i += cl;
    }
    if (st == TM_OK) st = encode_run(t, sc, text + run, len - run, out);
    if (st == TM_OK && o.add_special && t->add_eos) st = tokenizer_tokens_push(out, t->sp.eos);
    pretok_scratch_free(sc);
    return st;
}

/* ---- decoding ---- */

const char *tokenizer_token_bytes(const tm_tokenizer *t, int32_t id, bool render_special,
                                  size_t *len) {
    if (id < 0 || (uint32_t)id >= t->n_tokens) {
        *len = 0;
        return "";
    }
    uint8_t ty = t->type[id];
    if (!render_special && (ty == TM_TOKEN_TYPE_CONTROL || ty == TM_TOKEN_TYPE_UNKNOWN)) {
        *len = 0;
        return "";
    }
    *len = t->bytes_len[id];
    return t->bytes_blob + t->bytes_off[id];
}

tm_status tokenizer_decode(const tm_tokenizer *t, const int32_t *ids, size_t n, bool render_special,
                           char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    size_t total = 0, len;
    for (size_t i = 0; i < n; i++) {
        tokenizer_token_bytes(t, ids[i], render_special, &len);
        total += len;
    }
    char *buf = malloc(total + 1);
    if (!buf) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory decoding %zu tokens", n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = tokenizer_token_bytes(t, ids[i], render_special, &len);
        memcpy(buf + m, p, len);
        m += len;
    }
    /* SPM: the space the encoder prepended (HF's Strip decoder, one leading space) */
    if (t->kind == TM_TOKENIZER_SPM && t->add_space_prefix && m > 0 && buf[0] == ' ') {
        memmove(buf, buf + 1, m - 1);
        m--;
    }
    buf[m] = 0;
    *out = buf;
    *out_len = m;
    return TM_OK;
}

/* ---- streaming ---- */

void tokenizer_stream_init(tm_detok_stream *s, const tm_tokenizer *t, bool render_special,
                           bool replace_invalid) {
    memset(s, 0, sizeof(*s));
    s->tok = t;
    s->render_special = render_special;
    s->replace_invalid = replace_invalid;
    s->at_start = true;
}

void tokenizer_stream_free(tm_detok_stream *s) {
    free(s->buf);
    s->buf = NULL;
    s->buf_cap = 0;
}

/* s[0..n) is the start of a valid character that needs more bytes. */
static bool utf8_incomplete_prefix(const uint8_t *s, size_t n) {
    int need = tok_utf8_lead_len(s[0]);
    if (need <= 1 || (size_t)need <= n) return false;
    if (n >= 2) {
        uint8_t lo = 0x80, hi = 0xBF;
        if (s[0] == 0xE0)
            lo = 0xA0;
        else if (s[0] == 0xED)
            hi = 0x9F;
        else if (s[0] == 0xF0)
            lo = 0x90;
        else if (s[0] == 0xF4)
            hi = 0x8F;
        if (s[1] < lo || s[1] > hi) return false;
    }
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return false;
    return true;
}

static tm_status stream_reserve(tm_detok_stream *s, size_t need) {
    if (need <= s->buf_cap) return TM_OK;
    size_t c = s->buf_cap ? s->buf_cap : 64;
    while (c < need) c *= 2;
    char *p = realloc(s->buf, c);
    if (!p) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory in the stream decoder");
    s->buf = p;
    s->buf_cap = c;
    return TM_OK;
}

/* Move complete characters of in[0..n) to the output, keep an incomplete tail. */
static tm_status stream_emit(tm_detok_stream *s, const uint8_t *in, size_t n, bool final,
                             size_t *m) {
    /* worst case every byte becomes U+FFFD (3 bytes) */
    tm_status st = stream_reserve(s, 3 * n + 1);
    if (st) return st;
    uint8_t *o = (uint8_t *)s->buf;
    size_t i = 0;
    while (i < n) {
        size_t cl = tok_utf8_valid_len(in + i, n - i);
        if (cl) {
            memcpy(o + *m, in + i, cl);
            *m += cl;
            i += cl;
            continue;
        }
        if (!final && utf8_incomplete_prefix(in + i, n - i)) {
            memcpy(s->pending, in + i, n - i);
            s->n_pending = n - i;
            return TM_OK;
        }
        if (s->replace_invalid) {
            /* one U+FFFD for each maximal subpart (the longest start of a valid character, or
             * one byte): Unicode 3.9's practice, as Python, browsers and Rust decode */
            size_t k = 1;
            while (k < n - i && utf8_incomplete_prefix(in + i, k + 1)) k++;
            memcpy(o + *m, "\xef\xbf\xbd", 3);
            *m += 3;
            i += k;
        } else {
            o[(*m)++] = in[i++];
        }
    }
    return TM_OK;
}

tm_status tokenizer_stream_push(tm_detok_stream *s, int32_t id, const char **text, size_t *len) {
    size_t n;
    const char *p = tokenizer_token_bytes(s->tok, id, s->render_special, &n);
    if (s->at_start && n > 0) {
        s->at_start = false;
        if (s->tok->kind == TM_TOKENIZER_SPM && s->tok->add_space_prefix && p[0] == ' ') {
            p++;
            n--;
        }
    }
    size_t total = s->n_pending + n;
    uint8_t small[64];
    uint8_t *joined = total <= sizeof(small) ? small : malloc(total);
    if (!joined)
        return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory in the stream decoder");
    memcpy(joined, s->pending, s->n_pending);
    if (n) memcpy(joined + s->n_pending, p, n);
    s->n_pending = 0;
    size_t m = 0;
    tm_status st = stream_emit(s, joined, total, false, &m);
    if (joined != small) free(joined);
    *text = s->buf ? s->buf : "";
    *len = m;
    return st;
}

tm_status tokenizer_stream_flush(tm_detok_stream *s, const char **text, size_t *len) {
    uint8_t held[4];
    size_t n = s->n_pending;
    memcpy(held, s->pending, n);
    s->n_pending = 0;
    size_t m = 0;
    tm_status st = stream_emit(s, held, n, true, &m);
    *text = s->buf ? s->buf : "";
    *len = m;
    return st;
}
