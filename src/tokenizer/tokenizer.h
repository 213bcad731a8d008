/* Tokenizers loaded from the tokenizer.ggml.* keys of a GGUF file.
 *
 * Two families, both "merge the best-ranked adjacent pair until none is left":
 *   TM_TOKENIZER_BPE  byte-level BPE (tokenizer.ggml.model "gpt2"): GPT-2, Qwen2/3,
 *                     Llama 3, gpt-oss (o200k). Text is cut by the pre-tokenizer
 *                     regexes named by tokenizer.ggml.pre (PCRE2, Unicode properties),
 *                     each piece's bytes are mapped to GPT-2's byte alphabet and merged
 *                     by the rank of tokenizer.ggml.merges.
 *   TM_TOKENIZER_SPM  SentencePiece-style BPE with byte fallback (model "llama"):
 *                     Llama 1/2, Mistral, Mixtral. Spaces become U+2581, a U+2581 is
 *                     prepended (at the start and after every special token, as
 *                     llama.cpp does), pairs merge by tokenizer.ggml.merges when the file
 *                     has them, else by tokenizer.ggml.scores; characters missing from
 *                     the vocabulary become <0xXX> byte tokens.
 *
 * Special tokens (token_type CONTROL, and USER_DEFINED) are matched in the text
 * before pre-tokenization, leftmost-longest. CONTROL tokens only when parse_special
 * is set (text from a user should not be able to inject <|im_start|>); USER_DEFINED
 * tokens always, as llama.cpp and HF tokenizers do.
 *
 * Invalid UTF-8 in the input (each byte of a maximal invalid subsequence) is
 * encoded as its own byte token: byte-level BPE treats such a byte as a hard
 * boundary (no pre-token or merge crosses it); SPM treats it like a character
 * missing from the vocabulary (byte fallback). Decoding gives the bytes back, so
 * tokenizer_decode(tokenizer_encode(s)) == s for any byte string (after NFC, for
 * vocabularies whose normalizer is NFC: Qwen2/3; for SPM, a U+2581 in the text
 * comes back as a space, and a U+2581 follows every special token).
 *
 * A loaded tm_tokenizer is immutable: encode/decode may run from many threads. */
#ifndef TM_TOKENIZER_TOKENIZER_H
#define TM_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "gguf/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tm_tokenizer_kind {
    TM_TOKENIZER_BPE = 0, /* "gpt2" */
    TM_TOKENIZER_SPM = 1, /* "llama" */
} tm_tokenizer_kind;

/* tm_token_type (tokenizer.ggml.token_type's values) is the public API's (include/tiermoe.h). */

typedef struct tm_tokenizer tm_tokenizer;

/* A growable list of token ids. Zero-initialise; free with tokenizer_tokens_free. */
typedef struct tm_tokens {
    int32_t *ids;
    size_t n;
    size_t cap;
} tm_tokens;

/* Well-known token ids; -1 where the vocabulary has none. */
typedef struct tm_tokenizer_specials {
    int32_t bos, eos, eot, eom, unk, pad, sep, nl;
} tm_tokenizer_specials;

/* ---- loading ---- */

/* Build a tokenizer from f's tokenizer.ggml.* keys. Everything is checked here
 * (unknown model or pre-tokenizer name, missing or inconsistent merges, ids out
 * of range, a byte-level vocabulary lacking one of the 256 byte tokens), so
 * encoding never fails on a tokenizer that loaded. The tokenizer copies what it
 * needs: f may be closed afterwards. */
tm_status tokenizer_load_gguf(const tm_gguf_file *f, tm_tokenizer **out);
/* Convenience: open path, load, close. */
tm_status tokenizer_load_file(const char *path, tm_tokenizer **out);
void tokenizer_free(tm_tokenizer *t);

/* ---- queries ---- */
tm_tokenizer_kind tokenizer_kind(const tm_tokenizer *t);
uint32_t tokenizer_n_tokens(const tm_tokenizer *t);
const char *tokenizer_model_name(const tm_tokenizer *t); /* "gpt2" or "llama" */
const char *tokenizer_pre_name(const tm_tokenizer *t);   /* as in the file, or "default" */
tm_tokenizer_specials tokenizer_specials(const tm_tokenizer *t);
bool tokenizer_add_bos(const tm_tokenizer *t);
bool tokenizer_add_eos(const tm_tokenizer *t);
/* tokenizer.chat_template, or NULL. */
const char *tokenizer_chat_template(const tm_tokenizer *t);
tm_token_type tokenizer_token_type(const tm_tokenizer *t, int32_t id);
/* The token's text as stored in the vocabulary (byte-level alphabet for BPE,
 * U+2581 for spaces in SPM); NUL-terminated; NULL for an id out of range. */
const char *tokenizer_token_text(const tm_tokenizer *t, int32_t id);
/* Exact lookup of a token by its stored text; -1 if absent. */
int32_t tokenizer_token_find(const tm_tokenizer *t, const char *text, size_t len);
/* True for tokens that end a generated turn: eos, eot, eom, and CONTROL tokens
 * named <|im_end|>, <|endoftext|>, <|eot_id|>, <|eom_id|>, <|return|>, <|call|>,
 * </s>. The engine stops generating on these. */
bool tokenizer_is_end_of_generation(const tm_tokenizer *t, int32_t id);

/* ---- encoding ---- */

typedef struct tm_tokenize_opts {
    bool add_special;   /* prepend BOS / append EOS when the vocabulary asks for it */
    bool parse_special; /* match CONTROL tokens written in the text (chat templates) */
} tm_tokenize_opts;

/* Append the ids of text[0..len) to out (out is not cleared, so a caller can
 * build a prompt from parts). Fails only on allocation failure. */
tm_status tokenizer_encode(const tm_tokenizer *t, const char *text, size_t len,
                           const tm_tokenize_opts *opts, tm_tokens *out);
tm_status tokenizer_tokens_push(tm_tokens *v, int32_t id);
void tokenizer_tokens_free(tm_tokens *v);

/* ---- decoding ---- */

/* The bytes one token stands for (SPM's U+2581 already turned into a space, byte
 * tokens into their byte). CONTROL tokens give their text when render_special is
 * set and nothing otherwise. Returns a pointer into the tokenizer and its length
 * in *len (not NUL-terminated; may be zero). Ids out of range give length 0. */
const char *tokenizer_token_bytes(const tm_tokenizer *t, int32_t id, bool render_special,
                                  size_t *len);

/* Whole-sequence decode into a malloc'd NUL-terminated string (*out, *out_len;
 * the text may contain NULs or invalid UTF-8 if the ids spell them). For SPM the
 * space prepended at the start is removed, as the HF decoder does. */
tm_status tokenizer_decode(const tm_tokenizer *t, const int32_t *ids, size_t n, bool render_special,
                           char **out, size_t *out_len);

/* Streaming decoder: feed ids one at a time as they are generated; what comes
 * back never ends inside a UTF-8 character. An incomplete character's first
 * bytes are held until the rest arrives; bytes that can never become a valid
 * character are released as they are (or, with replace_invalid, for JSON/SSE
 * output that must be valid UTF-8, one U+FFFD per maximal subpart, as Python's
 * errors="replace" and browsers decode). Without replace_invalid the
 * concatenation of everything returned, flush included, equals tokenizer_decode
 * of the same ids. */
typedef struct tm_detok_stream {
    const tm_tokenizer *tok;
    bool render_special;
    bool replace_invalid;
    bool at_start;      /* SPM: strip the prepended space of the first piece */
    uint8_t pending[4]; /* start of an incomplete UTF-8 character */
    size_t n_pending;
    char *buf; /* output of the last call, owned by the stream */
    size_t buf_cap;
} tm_detok_stream;

void tokenizer_stream_init(tm_detok_stream *s, const tm_tokenizer *t, bool render_special,
                           bool replace_invalid);
/* Returns the text that can be printed now (*text points into the stream,
 * valid until the next call; *len may be 0). */
tm_status tokenizer_stream_push(tm_detok_stream *s, int32_t id, const char **text, size_t *len);
/* End of stream: release held bytes (as U+FFFD with replace_invalid). */
tm_status tokenizer_stream_flush(tm_detok_stream *s, const char **text, size_t *len);
void tokenizer_stream_free(tm_detok_stream *s);

/* ---- import from HuggingFace ---- */

typedef struct tm_tokenizer_import_opts {
    /* Pad the token list to this many entries with "[PAD<i>]" tokens of type
     * UNUSED, as llama.cpp's converter does up to config.json's vocab_size
     * (0 = no padding). Must be >= the tokenizer's own size. */
    uint32_t pad_to_n_vocab;
    /* Also write tokenizer.ggml.merges for SPM-style vocabularies (default on;
     * off writes only scores, like llama.cpp's tokenizer.model path). */
    bool spm_skip_merges;
} tm_tokenizer_import_opts;

/* Read a HuggingFace tokenizer.json (and tokenizer_config.json beside it, if
 * present, for the chat template, bos/eos and add_bos/add_eos) and set the
 * tokenizer.ggml.* keys on w exactly as llama.cpp's convert_hf_to_gguf.py
 * writes them: model, pre, tokens, token_type, merges, scores (SPM), the special
 * token ids, add_bos_token/add_eos_token, chat_template. Supported: byte-level
 * BPE with a known pre-tokenizer regex (gpt2, qwen2, llama-bpe, gpt-4o, tekken),
 * and BPE with byte_fallback (SentencePiece style). Anything else: a clear error
 * naming the file and field. *n_tokens_out (may be NULL) receives the number of
 * tokens written (the embedding needs at least that many rows). */
tm_status tokenizer_import_hf(const char *tokenizer_json_path, tm_gguf_writer *w);
tm_status tokenizer_import_hf_ex(const char *tokenizer_json_path, tm_gguf_writer *w,
                                 const tm_tokenizer_import_opts *opts, uint32_t *n_tokens_out);

#ifdef __cplusplus
}
#endif
#endif
