/* Private to src/tokenizer: the loaded tokenizer's tables and the pieces that
 * tokenizer_load.c, tokenizer_bpe.c, tokenizer_spm.c and tokenizer_pretok.c share. */
#ifndef TM_TOKENIZER_INTERNAL_H
#define TM_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Open-addressing hash from byte strings (in a blob) to token ids. */
typedef struct tm_str_map {
    uint32_t mask;  /* capacity - 1 (power of two) */
    int32_t *slots; /* token id, or -1 for empty */
} tm_str_map;

/* Open-addressing hash from a pair of ids to (rank, merged id). */
typedef struct tm_pair_entry {
    uint64_t key; /* (uint64_t)left << 32 | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t merged;
} tm_pair_entry;

typedef struct tm_pair_map {
    uint64_t mask;
    tm_pair_entry *slots;
} tm_pair_map;

/* A compiled pre-tokenizer: regexes applied in sequence, each splitting every
 * piece into matches and the gaps between them ("Isolated" in HF terms). */
#define TM_PRETOK_MAX_REGEX 4
typedef struct tm_pretok {
    int n_regex;
    void *code[TM_PRETOK_MAX_REGEX]; /* pcre2_code_8 * */
} tm_pretok;

/* A special token for matching in text. */
typedef struct tm_special_entry {
    int32_t id;
    uint32_t len;
    const char *text;
    bool control;
} tm_special_entry;

struct tm_tokenizer {
    tm_tokenizer_kind kind;
    char *model_name;
    char *pre_name;
    char *chat_template;
    uint32_t n_tokens;

    /* token texts as stored, NUL-terminated, in one blob */
    char *text_blob;
    uint32_t *text_off;
    uint32_t *text_len;
    /* decoded bytes of each token */
    char *bytes_blob;
    uint32_t *bytes_off;
    uint32_t *bytes_len;

    uint8_t *type; /* tm_token_type */
    float *score;  /* may be NULL */

    tm_str_map vocab;  /* text -> id */
    tm_pair_map pairs; /* (left, right) -> rank, merged */

    int32_t byte_token[256]; /* BPE: token of each byte's alphabet char; SPM: <0xXX> or -1 */
    bool ignore_merges;      /* llama3: a piece that is a whole token is not merged */
    bool no_bos;             /* glm4: the family has no bos token (whatever bos_token_id says) */
    bool normalize_nfc;      /* qwen2 */
    bool add_space_prefix;   /* SPM */
    bool spm_gemma4;         /* SPM written as tokenizer.ggml.model "gemma4": the merges rank
                                the pairs (its scores are placeholders), no family default
                                for the special ids or the space prefix */
    bool add_bos, add_eos;
    tm_tokenizer_specials sp;
    int32_t spm_space;   /* SPM: id of U+2581 alone, or -1 */
    bool spm_word_split; /* SPM: no token has U+2581 after another character, so
                            merging word by word (cut before each U+2581 that
                            follows a non-U+2581) gives the same result, faster */

    tm_pretok pretok;

    /* special tokens to match in text, bucketed by first byte, longest first */
    tm_special_entry *specials;
    uint32_t n_specials;
    uint32_t special_first[257]; /* bucket b is specials[special_first[b] .. special_first[b+1]) */
};

/* ---- hashing ---- */
uint64_t tok_hash_bytes(const void *p, size_t n);
int32_t tok_vocab_find(const tm_tokenizer *t, const char *s, size_t n);
static inline uint64_t tok_pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}
const tm_pair_entry *tok_pair_find(const tm_pair_map *m, int32_t a, int32_t b);

/* ---- pre-tokenizer (tokenizer_pretok.c) ---- */
/* Compile the regexes for a tokenizer.ggml.pre name; TM_ERR_UNSUPPORTED naming
 * the name and listing the known ones if it is not known. Sets *nfc when the
 * family's HF normalizer is NFC, *ignore_merges for Llama 3's BPE option and
 * *no_bos where llama.cpp drops the bos token (glm4). */
tm_status pretok_init(tm_pretok *p, const char *pre_name, bool *nfc, bool *ignore_merges,
                      bool *no_bos);
void pretok_free(tm_pretok *p);
/* Split valid UTF-8 text[0..len) into pieces: calls emit(ctx, piece, n) in order.
 * The pieces concatenate to the input. Returns non-OK only if emit does. */
typedef tm_status (*pretok_emit_fn)(void *ctx, const char *piece, size_t n);
/* Per-call matching state (PCRE2 match data, JIT stack): one per encode call, so
 * a tokenizer can be shared by threads. */
typedef struct tm_pretok_scratch tm_pretok_scratch;
tm_status pretok_scratch_init(const tm_pretok *p, tm_pretok_scratch **out);
void pretok_scratch_free(tm_pretok_scratch *sc);
tm_status pretok_split(const tm_pretok *p, tm_pretok_scratch *sc, const char *text, size_t len,
                       pretok_emit_fn emit, void *ctx);
/* Names accepted by pretok_init, comma-separated (for error messages and docs). */
const char *pretok_known_names(void);
/* The pre name (as llama.cpp's converter writes it) for the n Split regexes of a
 * tokenizer.json's pre-tokenizer, in order (exact strings), or NULL. */
const char *pretok_name_for_regexes(const char *const *re, int n);

/* ---- the merge loop shared by BPE and SPM (tokenizer_bpe.c) ---- */
/* ids[0..*n) are the initial symbols; merged in place by pair rank, lowest rank
 * first, leftmost on ties. */
tm_status tok_merge(const tm_tokenizer *t, int32_t *ids, size_t *n);

/* ---- per-family encoders ---- */
/* Byte-level BPE of one run of valid UTF-8 with no special tokens in it. */
tm_status bpe_encode_text(const tm_tokenizer *t, tm_pretok_scratch *sc, const char *text,
                          size_t len, tm_tokens *out);
/* SPM of one run of raw text (may contain invalid UTF-8); prefix: prepend U+2581. */
tm_status spm_encode_text(const tm_tokenizer *t, const char *text, size_t len, bool prefix,
                          tm_tokens *out);

/* ---- UTF-8 ---- */
/* Length of the valid UTF-8 character at s[0..n), or 0 if the bytes there are
 * not a valid character (maximal-subpart rule: the caller treats one byte as
 * invalid and moves on). */
size_t tok_utf8_valid_len(const uint8_t *s, size_t n);
/* Expected length from a lead byte (1..4), 0 for a continuation or invalid byte. */
int tok_utf8_lead_len(uint8_t c);

/* GPT-2's byte alphabet: byte b <-> a code point (printable bytes map to
 * themselves, the others to U+0100 + k). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);             /* -1 if cp is not in the alphabet */
size_t tok_utf8_put(uint32_t cp, char *out); /* returns 1..4 */

#endif
