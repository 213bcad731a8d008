/* Loading a tokenizer from the tokenizer.ggml.* keys llama.cpp's converter writes:
 *
 *   tokenizer.ggml.model        string  "gpt2" (byte-level BPE) | "llama" (SentencePiece) |
 *                                       "gemma4" (SentencePiece pieces ranked by merges)
 *   tokenizer.ggml.pre          string  pre-tokenizer name (BPE), e.g. "qwen2", "llama-bpe"
 *   tokenizer.ggml.tokens       [string] token texts, index = id
 *   tokenizer.ggml.token_type   [int32]  tm_token_type per token (default NORMAL)
 *   tokenizer.ggml.scores       [float32] SentencePiece scores (SPM without merges)
 *   tokenizer.ggml.merges       [string] "left right" by rank (or [[left, right]])
 *   tokenizer.ggml.{bos,eos,eot,eom,unknown,padding,seperator}_token_id  uint32
 *   tokenizer.ggml.add_bos_token / add_eos_token / add_space_prefix      bool
 *   tokenizer.chat_template     string
 *
 * Everything is validated here, so encoding cannot fail on bad data later. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tokenizer/tokenizer_internal.h"

#define KEY(k) "tokenizer.ggml." k

static char *dup_str(tm_gguf_str s) {
    char *p = malloc(s.len + 1);
    if (!p) return NULL;
    if (s.len) memcpy(p, s.data, s.len);
    p[s.len] = 0;
    return p;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c *= 2;
    return (uint32_t)c;
}

void tokenizer_free(tm_tokenizer *t) {
    if (!t) return;
    free(t->model_name);
    free(t->pre_name);
    free(t->chat_template);
    free(t->text_blob);
    free(t->text_off);
    free(t->text_len);
    free(t->bytes_blob);
    free(t->bytes_off);
    free(t->bytes_len);
    free(t->type);
    free(t->score);
    free(t->vocab.slots);
    free(t->pairs.slots);
    free(t->specials);
    pretok_free(&t->pretok);
    free(t);
}

/* ---- tokens, types, scores ---- */

static tm_status load_tokens(tm_tokenizer *t, const tm_gguf_file *f) {
    const tm_gguf_array *a;
    if (gguf_file_get_array(f, KEY("tokens"), &a))
        return tm_error_set(TM_ERR_FORMAT, "%s: tokenizer.ggml.tokens: missing or not an array",
                            f->path);
    if (a->elem_type != TM_GGUF_TYPE_STRING || a->n == 0 || a->n > INT32_MAX)
        return tm_error_set(
            TM_ERR_FORMAT,
            "%s: tokenizer.ggml.tokens: expected a non-empty array of strings, got %" PRIu64 " %s",
            f->path, a->n, gguf_value_type_name(a->elem_type));
    t->n_tokens = (uint32_t)a->n;
    uint64_t total = 0;
    for (uint64_t i = 0; i < a->n; i++) total += gguf_array_get_str(a, i).len + 1;
    if (total > UINT32_MAX)
        return tm_error_set(
            TM_ERR_FORMAT, "%s: tokenizer.ggml.tokens: %" PRIu64 " bytes of token text is too much",
            f->path, total);
    t->text_blob = malloc(total);
    t->text_off = malloc(a->n * sizeof(uint32_t));
    t->text_len = malloc(a->n * sizeof(uint32_t));
    t->type = malloc(a->n);
    if (!t->text_blob || !t->text_off || !t->text_len || !t->type)
        return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory for %" PRIu64 " tokens", a->n);
    uint32_t off = 0;
    for (uint64_t i = 0; i < a->n; i++) {
        tm_gguf_str s = gguf_array_get_str(a, i);
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s.len;
        if (s.len) memcpy(t->text_blob + off, s.data, s.len);
        t->text_blob[off + s.len] = 0;
        off += (uint32_t)s.len + 1;
        t->type[i] = TM_TOKEN_TYPE_NORMAL;
    }

    const tm_gguf_kv *kv = gguf_file_find_kv(f, KEY("token_type"));
    if (kv) {
        const tm_gguf_array *ty = &kv->value.v.arr;
        if (kv->value.type != TM_GGUF_TYPE_ARRAY || ty->n != a->n ||
            gguf_value_type_size(ty->elem_type) == 0 || ty->elem_type == TM_GGUF_TYPE_FLOAT32 ||
            gguf_value_type_size(ty->elem_type) > 4)
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: tokenizer.ggml.token_type: expected %" PRIu64
                                " integers (one per token)",
                                f->path, a->n);
        for (uint64_t i = 0; i < a->n; i++) {
            int32_t v = gguf_array_get_i32(ty, i);
            if (v < TM_TOKEN_TYPE_UNDEFINED || v > TM_TOKEN_TYPE_BYTE)
                return tm_error_set(
                    TM_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%" PRIu64 "] = %d: expected 0..6",
                    f->path, i, v);
            t->type[i] = (uint8_t)(v == TM_TOKEN_TYPE_UNDEFINED ? TM_TOKEN_TYPE_NORMAL : v);
        }
    }

    kv = gguf_file_find_kv(f, KEY("scores"));
    if (kv) {
        const tm_gguf_array *sc = &kv->value.v.arr;
        if (kv->value.type != TM_GGUF_TYPE_ARRAY || sc->n != a->n ||
            sc->elem_type != TM_GGUF_TYPE_FLOAT32)
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: tokenizer.ggml.scores: expected %" PRIu64
                                " float32 (one per token)",
                                f->path, a->n);
        t->score = malloc(a->n * sizeof(float));
        if (!t->score) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory for scores");
        for (uint64_t i = 0; i < a->n; i++) t->score[i] = gguf_array_get_f32(sc, i);
    }
    return TM_OK;
}

static tm_status build_vocab_map(tm_tokenizer *t) {
    uint32_t cap = pow2_at_least(2 * (uint64_t)t->n_tokens);
    t->vocab.mask = cap - 1;
    t->vocab.slots = malloc(cap * sizeof(int32_t));
    if (!t->vocab.slots)
        return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory for the vocabulary map");
    memset(t->vocab.slots, 0xff, cap * sizeof(int32_t));
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        const char *s = t->text_blob + t->text_off[id];
        uint32_t i = (uint32_t)tok_hash_bytes(s, t->text_len[id]) & t->vocab.mask;
        bool dup = false;
        while (t->vocab.slots[i] >= 0) {
            int32_t o = t->vocab.slots[i];
            if (t->text_len[o] == t->text_len[id] &&
                !memcmp(t->text_blob + t->text_off[o], s, t->text_len[id])) {
                dup = true; /* the first of duplicate texts wins */
                break;
            }
            i = (i + 1) & t->vocab.mask;
        }
        if (!dup) t->vocab.slots[i] = (int32_t)id;
    }
    return TM_OK;
}

/* ---- merges ---- */

static tm_status pairs_alloc(tm_tokenizer *t, uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    t->pairs.mask = cap - 1;
    t->pairs.slots = malloc(cap * sizeof(tm_pair_entry));
    if (!t->pairs.slots)
        return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory for %" PRIu64 " merges", n);
    for (uint64_t i = 0; i < cap; i++) t->pairs.slots[i] = (tm_pair_entry){UINT64_MAX, 0, -1};
    return TM_OK;
}

static void pairs_insert(tm_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t key = tok_pair_key(a, b);
    uint64_t h = key;
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    for (uint64_t i = h & t->pairs.mask;; i = (i + 1) & t->pairs.mask) {
        tm_pair_entry *e = &t->pairs.slots[i];
        if (e->key == key) {
            if (rank < e->rank) { /* duplicate merge: the best rank wins, as in llama.cpp */
                e->rank = rank;
                e->merged = merged;
            }
            return;
        }
        if (e->key == UINT64_MAX) {
            *e = (tm_pair_entry){key, rank, merged};
            return;
        }
    }
}

static tm_status merge_error(const tm_gguf_file *f, uint64_t i, const char *what, const char *l,
                             size_t ll, const char *r, size_t rl) {
    return tm_error_set(TM_ERR_FORMAT, "%s: tokenizer.ggml.merges[%" PRIu64 "] '%.*s' '%.*s': %s",
                        f->path, i, (int)(ll > 64 ? 64 : ll), l, (int)(rl > 64 ? 64 : rl), r, what);
}

static tm_status load_merges(tm_tokenizer *t, const tm_gguf_file *f, const tm_gguf_kv *kv) {
    const tm_gguf_array *a = &kv->value.v.arr;
    bool strings = a->elem_type == TM_GGUF_TYPE_STRING;
    if (kv->value.type != TM_GGUF_TYPE_ARRAY || (!strings && a->elem_type != TM_GGUF_TYPE_ARRAY) ||
        a->n > UINT32_MAX)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: tokenizer.ggml.merges: expected an array of \"left right\" "
                            "strings or of [left, right] pairs",
                            f->path);
    tm_status st = pairs_alloc(t, a->n);
    if (st) return st;
    char *buf = NULL;
    size_t buf_cap = 0;
    for (uint64_t i = 0; i < a->n; i++) {
        const char *l, *r;
        size_t ll, rl;
        if (strings) {
            tm_gguf_str s = gguf_array_get_str(a, i);
            /* split at the first space after the first byte (a left part may not be empty) */
            const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
            if (!sp) {
                free(buf);
                return tm_error_set(TM_ERR_FORMAT,
                                    "%s: tokenizer.ggml.merges[%" PRIu64
                                    "] '%.*s': expected \"left right\"",
                                    f->path, i, (int)(s.len > 64 ? 64 : s.len), s.data);
            }
            l = s.data;
            ll = (size_t)(sp - s.data);
            r = sp + 1;
            rl = s.len - ll - 1;
        } else {
            const tm_gguf_value *v = &((const tm_gguf_value *)a->data)[i];
            if (v->type != TM_GGUF_TYPE_ARRAY || v->v.arr.elem_type != TM_GGUF_TYPE_STRING ||
                v->v.arr.n != 2) {
                free(buf);
                return tm_error_set(TM_ERR_FORMAT,
                                    "%s: tokenizer.ggml.merges[%" PRIu64
                                    "]: expected a pair of strings",
                                    f->path, i);
            }
            tm_gguf_str ls = gguf_array_get_str(&v->v.arr, 0),
                        rs = gguf_array_get_str(&v->v.arr, 1);
            l = ls.data;
            ll = ls.len;
            r = rs.data;
            rl = rs.len;
        }
        int32_t li = tok_vocab_find(t, l, ll), ri = tok_vocab_find(t, r, rl);
        if (li < 0 || ri < 0) {
            free(buf);
            return merge_error(f, i,
                               li < 0 ? "left part is not a token" : "right part is not a token", l,
                               ll, r, rl);
        }
        if (ll + rl > buf_cap) {
            buf_cap = 2 * (ll + rl) + 64;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                free(buf);
                return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory");
            }
            buf = nb;
        }
        memcpy(buf, l, ll);
        memcpy(buf + ll, r, rl);
        int32_t mi = tok_vocab_find(t, buf, ll + rl);
        if (mi < 0) {
            free(buf);
            return merge_error(f, i, "their concatenation is not a token", l, ll, r, rl);
        }
        pairs_insert(t, li, ri, (uint32_t)i, mi);
    }
    free(buf);
    return TM_OK;
}

/* SentencePiece files converted from tokenizer.model carry scores, not merges:
 * any two pieces whose concatenation is a piece may merge, the higher the
 * merged piece's score the earlier. Enumerate every split of every piece. */
typedef struct score_rank {
    float score;
    int32_t id;
} score_rank;

static int cmp_score(const void *pa, const void *pb) {
    const score_rank *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static tm_status merges_from_scores(tm_tokenizer *t, const tm_gguf_file *f) {
    if (!t->score)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: SentencePiece vocabulary has neither tokenizer.ggml.merges nor "
                            "tokenizer.ggml.scores",
                            f->path);
    score_rank *sr = malloc(t->n_tokens * sizeof(*sr));
    if (!sr) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory");
    uint32_t n = 0;
    uint64_t n_pairs = 0;
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        if (t->type[id] != TM_TOKEN_TYPE_NORMAL || t->text_len[id] < 2) continue;
        sr[n++] = (score_rank){t->score[id], (int32_t)id};
        n_pairs += t->text_len[id];
    }
    qsort(sr, n, sizeof(*sr), cmp_score);
    tm_status st = pairs_alloc(t, n_pairs);
    for (uint32_t r = 0; st == TM_OK && r < n; r++) {
        int32_t id = sr[r].id;
        const uint8_t *s = (const uint8_t *)t->text_blob + t->text_off[id];
        uint32_t len = t->text_len[id];
        for (uint32_t k = 1; k < len; k++) {
            if ((s[k] & 0xC0) == 0x80) continue; /* split only between characters */
            int32_t a = tok_vocab_find(t, (const char *)s, k),
                    b = tok_vocab_find(t, (const char *)s + k, len - k);
            if (a >= 0 && b >= 0 && t->type[a] == TM_TOKEN_TYPE_NORMAL &&
                t->type[b] == TM_TOKEN_TYPE_NORMAL)
                pairs_insert(t, a, b, r, id);
        }
    }
    free(sr);
    return st;
}

/* ---- decoded bytes of each token ---- */

static tm_status build_token_bytes(tm_tokenizer *t) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < t->n_tokens; i++) total += t->text_len[i];
    t->bytes_blob = malloc(total + 1);
    t->bytes_off = malloc(t->n_tokens * sizeof(uint32_t));
    t->bytes_len = malloc(t->n_tokens * sizeof(uint32_t));
    if (!t->bytes_blob || !t->bytes_off || !t->bytes_len)
        return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory for token bytes");
    uint32_t off = 0;
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        const uint8_t *s = (const uint8_t *)t->text_blob + t->text_off[id];
        uint32_t n = t->text_len[id];
        uint8_t *o = (uint8_t *)t->bytes_blob + off;
        uint32_t m = 0;
        uint8_t ty = t->type[id];
        if (ty == TM_TOKEN_TYPE_CONTROL || ty == TM_TOKEN_TYPE_USER_DEFINED ||
            ty == TM_TOKEN_TYPE_UNKNOWN) {
            memcpy(o, s, n); /* added tokens decode to their text */
            m = n;
        } else if (t->kind == TM_TOKENIZER_SPM && ty == TM_TOKEN_TYPE_BYTE && n == 6 &&
                   !memcmp(s, "<0x", 3) && s[5] == '>') {
            o[0] = (uint8_t)strtoul((const char *)s + 3, NULL, 16);
            m = 1;
        } else if (t->kind == TM_TOKENIZER_SPM) {
            for (uint32_t i = 0; i < n;) {
                if (i + 3 <= n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
                    o[m++] = ' ';
                    i += 3;
                } else {
                    o[m++] = s[i++];
                }
            }
        } else { /* byte-level: alphabet characters back to bytes; anything else stays as it is */
            for (uint32_t i = 0; i < n;) {
                size_t cl = tok_utf8_valid_len(s + i, n - i);
                int b = -1;
                if (cl == 2)
                    b = tok_cp_to_byte(((uint32_t)(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F));
                else if (cl == 1)
                    b = tok_cp_to_byte(s[i]);
                if (b >= 0) {
                    o[m++] = (uint8_t)b;
                    i += (uint32_t)cl;
                } else {
                    size_t k = cl ? cl : 1;
                    memcpy(o + m, s + i, k);
                    m += (uint32_t)k;
                    i += (uint32_t)k;
                }
            }
        }
        t->bytes_off[id] = off;
        t->bytes_len[id] = m;
        off += m;
    }
    return TM_OK;
}

/* ---- special tokens for matching in text ---- */

static int cmp_special(const void *pa, const void *pb) {
    const tm_special_entry *a = pa, *b = pb;
    uint8_t ca = (uint8_t)a->text[0], cb = (uint8_t)b->text[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
    return (a->id > b->id) - (a->id < b->id);
}

static tm_status build_specials(tm_tokenizer *t) {
    uint32_t n = 0;
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        uint8_t ty = t->type[id];
        if ((ty == TM_TOKEN_TYPE_CONTROL || ty == TM_TOKEN_TYPE_USER_DEFINED ||
             ty == TM_TOKEN_TYPE_UNKNOWN) &&
            t->text_len[id] > 0)
            n++;
    }
    t->specials = malloc((n ? n : 1) * sizeof(*t->specials));
    if (!t->specials) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory");
    n = 0;
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        uint8_t ty = t->type[id];
        if ((ty == TM_TOKEN_TYPE_CONTROL || ty == TM_TOKEN_TYPE_USER_DEFINED ||
             ty == TM_TOKEN_TYPE_UNKNOWN) &&
            t->text_len[id] > 0)
            t->specials[n++] =
                (tm_special_entry){(int32_t)id, t->text_len[id], t->text_blob + t->text_off[id],
                                   ty != TM_TOKEN_TYPE_USER_DEFINED};
    }
    qsort(t->specials, n, sizeof(*t->specials), cmp_special);
    t->n_specials = n;
    uint32_t k = 0;
    for (unsigned b = 0; b <= 256; b++) {
        while (k < n && (uint8_t)t->specials[k].text[0] < b) k++;
        t->special_first[b] = b == 256 ? n : k;
    }
    return TM_OK;
}

/* ---- special ids and flags ---- */

static tm_status get_id(const tm_gguf_file *f, const char *key, uint32_t n_tokens, int32_t *out) {
    const tm_gguf_kv *kv = gguf_file_find_kv(f, key);
    if (!kv) return TM_OK;
    uint32_t v;
    if (gguf_file_get_u32(f, key, &v))
        return tm_error_set(TM_ERR_FORMAT, "%s: %s: expected an unsigned integer token id", f->path,
                            key);
    if (v >= n_tokens)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: %s = %u: not a token id (the vocabulary has %u tokens)", f->path,
                            key, v, n_tokens);
    *out = (int32_t)v;
    return TM_OK;
}

static tm_status get_flag(const tm_gguf_file *f, const char *key, bool *out) {
    if (!gguf_file_find_kv(f, key)) return TM_OK;
    if (gguf_file_get_bool(f, key, out))
        return tm_error_set(TM_ERR_FORMAT, "%s: %s: expected a bool", f->path, key);
    return TM_OK;
}

static tm_status load_specials_and_flags(tm_tokenizer *t, const tm_gguf_file *f) {
    tm_tokenizer_specials *sp = &t->sp;
    *sp = (tm_tokenizer_specials){-1, -1, -1, -1, -1, -1, -1, -1};
    if (t->kind == TM_TOKENIZER_SPM && !t->spm_gemma4) { /* llama.cpp's "llama" defaults */
        if (t->n_tokens > 2) {
            sp->unk = 0;
            sp->bos = 1;
            sp->eos = 2;
        }
        t->add_bos = true;
        t->add_space_prefix = true;
    } else if (t->ignore_merges && !t->no_bos) { /* Llama 3 family adds <|begin_of_text|> */
        t->add_bos = true;
    }
    tm_status st;
    if ((st = get_id(f, KEY("bos_token_id"), t->n_tokens, &sp->bos)) ||
        (st = get_id(f, KEY("eos_token_id"), t->n_tokens, &sp->eos)) ||
        (st = get_id(f, KEY("eot_token_id"), t->n_tokens, &sp->eot)) ||
        (st = get_id(f, KEY("eom_token_id"), t->n_tokens, &sp->eom)) ||
        (st = get_id(f, KEY("unknown_token_id"), t->n_tokens, &sp->unk)) ||
        (st = get_id(f, KEY("padding_token_id"), t->n_tokens, &sp->pad)) ||
        (st = get_id(f, KEY("seperator_token_id"), t->n_tokens, &sp->sep)) ||
        (st = get_flag(f, KEY("add_bos_token"), &t->add_bos)) ||
        (st = get_flag(f, KEY("add_eos_token"), &t->add_eos)) ||
        (st = get_flag(f, KEY("add_space_prefix"), &t->add_space_prefix)))
        return st;
    /* GLM's converter names [gMASK] the bos token; llama.cpp drops it (its chat template
       writes [gMASK] itself): no bos, none added */
    if (t->no_bos) sp->bos = -1, t->add_bos = false;
    /* a family default without a bos token to add is no request */
    if (t->add_bos && sp->bos < 0 && !gguf_file_find_kv(f, KEY("add_bos_token")))
        t->add_bos = false;
    if (t->add_bos && sp->bos < 0)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: tokenizer.ggml.add_bos_token is set but there is no bos_token_id",
                            f->path);
    if (t->add_eos && sp->eos < 0)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: tokenizer.ggml.add_eos_token is set but there is no eos_token_id",
                            f->path);
    if (t->kind == TM_TOKENIZER_SPM) {
        sp->nl = tok_vocab_find(t, "<0x0A>", 6);
    } else {
        char nl[4];
        size_t n = tok_utf8_put(tok_byte_to_cp('\n'), nl);
        sp->nl = tok_vocab_find(t, nl, n);
    }
    return TM_OK;
}

/* ---- the loader ---- */

static tm_status load(tm_tokenizer *t, const tm_gguf_file *f) {
    tm_gguf_str s;
    if (gguf_file_get_str(f, KEY("model"), &s))
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: tokenizer.ggml.model: missing (the file has no tokenizer)",
                            f->path);
    if (!(t->model_name = dup_str(s)))
        return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory");
    if (!strcmp(t->model_name, "gpt2"))
        t->kind = TM_TOKENIZER_BPE;
    else if (!strcmp(t->model_name, "llama"))
        t->kind = TM_TOKENIZER_SPM;
    else if (!strcmp(t->model_name, "gemma4")) /* Gemma 4: SentencePiece pieces, BPE merges */
        t->kind = TM_TOKENIZER_SPM, t->spm_gemma4 = true;
    else
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "%s: tokenizer.ggml.model '%.64s': unsupported (known: gpt2 = "
                            "byte-level BPE, llama = SentencePiece, gemma4 = SentencePiece "
                            "pieces with merges)",
                            f->path, t->model_name);

    const tm_gguf_kv *pre = gguf_file_find_kv(f, KEY("pre"));
    if (pre && pre->value.type != TM_GGUF_TYPE_STRING)
        return tm_error_set(TM_ERR_FORMAT, "%s: tokenizer.ggml.pre: expected a string", f->path);
    t->pre_name = pre ? dup_str(pre->value.v.str) : strdup("default");
    if (!t->pre_name) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory");
    if (t->kind == TM_TOKENIZER_BPE) {
        if (!pre)
            tm_log_warn("%s: tokenizer.ggml.pre missing; using llama.cpp's 'default' pre-tokenizer",
                        f->path);
        tm_status st =
            pretok_init(&t->pretok, t->pre_name, &t->normalize_nfc, &t->ignore_merges, &t->no_bos);
        if (st) return tm_error_wrap(st, "%s: ", f->path);
    }

    tm_status st;
    if ((st = load_tokens(t, f)) || (st = build_vocab_map(t))) return st;

    const tm_gguf_kv *merges = gguf_file_find_kv(f, KEY("merges"));
    if (t->kind == TM_TOKENIZER_BPE) {
        if (!merges)
            return tm_error_set(
                TM_ERR_FORMAT,
                "%s: tokenizer.ggml.merges: missing; a byte-level BPE vocabulary needs its merges",
                f->path);
        if ((st = load_merges(t, f, merges))) return st;
        for (unsigned b = 0; b < 256; b++) {
            char c[4];
            size_t n = tok_utf8_put(tok_byte_to_cp((uint8_t)b), c);
            t->byte_token[b] = tok_vocab_find(t, c, n);
            if (t->byte_token[b] < 0)
                return tm_error_set(TM_ERR_FORMAT,
                                    "%s: tokenizer.ggml.tokens: no token for byte 0x%02X ('%.*s'); "
                                    "not a byte-level vocabulary",
                                    f->path, b, (int)n, c);
        }
    } else {
        if (t->spm_gemma4 && !merges)
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: tokenizer.ggml.merges: missing; a gemma4 vocabulary needs "
                                "its merges (its scores do not rank them)",
                                f->path);
        if ((st = merges ? load_merges(t, f, merges) : merges_from_scores(t, f))) return st;
        unsigned n_bytes = 0;
        for (unsigned b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof(name), "<0x%02X>", b);
            t->byte_token[b] = tok_vocab_find(t, name, 6);
            n_bytes += t->byte_token[b] >= 0;
        }
        /* byte fallback needs every byte, or none (then <unk> stands in) */
        if (n_bytes != 0 && n_bytes != 256)
            return tm_error_set(
                TM_ERR_FORMAT,
                "%s: tokenizer.ggml.tokens: %u of the 256 byte tokens <0x00>..<0xFF>; "
                "byte fallback needs all of them",
                f->path, n_bytes);
        t->spm_space = tok_vocab_find(t, "\xe2\x96\x81", 3);
        t->spm_word_split = t->spm_space >= 0;
        for (uint32_t id = 0; id < t->n_tokens && t->spm_word_split; id++) {
            const char *tx = t->text_blob + t->text_off[id];
            uint32_t n = t->text_len[id], i = 0;
            while (i + 3 <= n && !memcmp(tx + i, "\xe2\x96\x81", 3))
                i += 3; /* leading run of U+2581 */
            for (; i + 3 <= n; i++)
                if (!memcmp(tx + i, "\xe2\x96\x81", 3)) {
                    t->spm_word_split = false;
                    break;
                }
        }
    }

    if ((st = build_token_bytes(t)) || (st = build_specials(t)) ||
        (st = load_specials_and_flags(t, f)))
        return st;
    if (t->kind == TM_TOKENIZER_SPM && t->byte_token[0x41] < 0 && t->sp.unk < 0)
        return tm_error_set(
            TM_ERR_FORMAT,
            "%s: SentencePiece vocabulary has neither <0xXX> byte tokens nor an unknown token",
            f->path);

    const tm_gguf_kv *tmpl = gguf_file_find_kv(f, "tokenizer.chat_template");
    if (tmpl) {
        if (tmpl->value.type != TM_GGUF_TYPE_STRING)
            return tm_error_set(TM_ERR_FORMAT, "%s: tokenizer.chat_template: expected a string",
                                f->path);
        if (!(t->chat_template = dup_str(tmpl->value.v.str)))
            return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory");
    }
    return TM_OK;
}

tm_status tokenizer_load_gguf(const tm_gguf_file *f, tm_tokenizer **out) {
    *out = NULL;
    tm_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory");
    t->spm_space = -1;
    tm_status st = load(t, f);
    if (st) {
        tokenizer_free(t);
        return st;
    }
    *out = t;
    return TM_OK;
}

tm_status tokenizer_load_file(const char *path, tm_tokenizer **out) {
    *out = NULL;
    tm_gguf_file *f;
    tm_status st = gguf_file_open(path, &f);
    if (st) return st;
    st = tokenizer_load_gguf(f, out);
    gguf_file_close(f);
    return st;
}
