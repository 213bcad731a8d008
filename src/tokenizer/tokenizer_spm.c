/* SentencePiece-style BPE with byte fallback (Llama 1/2, Mistral, Mixtral).
 *
 * A run of text (between special tokens) is normalised the way those models'
 * tokenizer.json ("legacy" form) and llama.cpp do it: U+2581 is prepended when
 * the run starts the text or follows a special token, and every ' ' becomes
 * U+2581. The whole run is one word: each UTF-8 character that is a token is a
 * symbol; a character that is not, and every invalid byte, becomes its <0xXX>
 * byte tokens (or <unk> when the vocabulary has no byte tokens), which never
 * merge. Then the shared merge loop runs with the pair ranks the loader built
 * (from tokenizer.ggml.merges, or from scores: higher score first), word by
 * word when the vocabulary allows it (see spm_word_split). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

#define SPM_SPACE "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */

static tm_status push_fallback(const tm_tokenizer *t, const uint8_t *b, size_t n, int32_t *sym,
                               size_t *m) {
    for (size_t k = 0; k < n; k++) {
        int32_t id = t->byte_token[b[k]];
        if (id < 0) {
            /* no byte tokens: one <unk> for the whole character, like fuse_unk */
            sym[(*m)++] = t->sp.unk;
            return TM_OK;
        }
        sym[(*m)++] = id;
    }
    return TM_OK;
}

tm_status spm_encode_text(const tm_tokenizer *t, const char *text, size_t len, bool prefix,
                          tm_tokens *out) {
    /* at most one symbol per input byte, plus the prefix; a space may become 3 byte tokens */
    size_t cap = 3 * len + 3;
    int32_t *sym = malloc(cap * sizeof(*sym));
    if (!sym) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory for %zu symbols", cap);
    size_t m = 0;
    const uint8_t *s = (const uint8_t *)text;
    if (prefix) {
        if (t->spm_space >= 0)
            sym[m++] = t->spm_space;
        else
            push_fallback(t, (const uint8_t *)SPM_SPACE, 3, sym, &m);
    }
    for (size_t i = 0; i < len;) {
        size_t cl = tok_utf8_valid_len(s + i, len - i);
        if (cl == 0) { /* invalid byte: byte fallback */
            push_fallback(t, s + i, 1, sym, &m);
            i++;
            continue;
        }
        int32_t id = s[i] == ' ' ? t->spm_space : tok_vocab_find(t, (const char *)s + i, cl);
        if (id >= 0 &&
            (t->type[id] == TM_TOKEN_TYPE_NORMAL || t->type[id] == TM_TOKEN_TYPE_USER_DEFINED))
            sym[m++] = id;
        else if (s[i] == ' ') /* a vocabulary without U+2581: its bytes */
            push_fallback(t, (const uint8_t *)SPM_SPACE, 3, sym, &m);
        else
            push_fallback(t, s + i, cl, sym, &m);
        i += cl;
    }
    tm_status st = TM_OK;
    if (t->spm_word_split) {
        /* merge word by word: a word starts at a U+2581 that follows another symbol */
        size_t w = 0, start = 0;
        for (size_t k = 1; k <= m && st == TM_OK; k++) {
            if (k < m && !(sym[k] == t->spm_space && sym[k - 1] != t->spm_space)) continue;
            size_t len_w = k - start;
            st = tok_merge(t, sym + start, &len_w);
            memmove(sym + w, sym + start, len_w * sizeof(*sym));
            w += len_w;
            start = k;
        }
        m = w;
    } else {
        st = tok_merge(t, sym, &m);
    }
    for (size_t k = 0; st == TM_OK && k < m; k++) st = tokenizer_tokens_push(out, sym[k]);
    free(sym);
    return st;
}
