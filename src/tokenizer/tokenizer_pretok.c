/* Pre-tokenizers: the regexes that cut text into pieces before BPE, selected by
 * the tokenizer.ggml.pre name llama.cpp writes. The patterns are the ones in the
 * models' own tokenizer.json files (HF "Split" with behaviour "Isolated", or the
 * GPT-2 ByteLevel regex), run by PCRE2 with PCRE2_UTF|PCRE2_UCP so \p{L}, \p{N},
 * \s and (?i:) follow Unicode as the originals (Oniguruma, fancy-regex) do.
 *
 * A pre-tokenizer with several regexes applies them in sequence: every piece
 * produced by regex k is split again by regex k+1; matches and the gaps between
 * them both become pieces, so the pieces always concatenate to the input. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tokenizer/tokenizer_internal.h"

/* GPT-2 (HF ByteLevel use_regex). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Llama 3 (= cl100k_base in HF form): numbers in groups of up to 3. */
#define RE_LLAMA3                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"                                                               \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen2 / Qwen3: single digits. */
#define RE_QWEN2                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"                                                               \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen3.5 / 3.6: Qwen2's with combining marks inside words and kept out of punctuation. */
#define RE_QWEN35                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "                  \
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"                                                         \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* o200k_base (gpt-4o, gpt-oss): case-aware words, contractions attached. */
#define RE_O200K                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                                               \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                                               \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Tekken (Mistral Nemo and later): o200k's word rule without contractions, single digits. */
#define RE_TEKKEN                                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"   \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek-V3 / R1: three Splits in sequence (its tokenizer.json): numbers in groups of up to
 * 3, runs of CJK ideographs and kana, then words, punctuation and spaces. */
#define RE_DS3_0 "\\p{N}{1,3}"
#define RE_DS3_1 "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
#define RE_DS3_2                                                                                   \
    "[!\"#$%&'()*+,\\-./"                                                                          \
    ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "               \
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
/* Kimi K2 (tiktoken's pat_str of its tokenization_kimi.py): o200k-like words that exclude Han
 * characters, which form runs of their own. The original intersects classes
 * ([\p{Lu}...&&[^\p{Han}]]: Oniguruma, fancy-regex), which PCRE2 10.42 lacks: each such
 * class here is a lookahead and the class, the same set. RE_KIMI_K2_HF is the original, as a
 * tokenizer.json's Split holds it (the importer's name for it). */
#define KIMI_UP  "(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_LOW "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_CTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
#define RE_KIMI_K2                                                                                 \
    "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UP "*" KIMI_LOW "+" KIMI_CTR                         \
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UP "+" KIMI_LOW "*" KIMI_CTR                                    \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define KIMI_UP_HF  "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]"
#define KIMI_LOW_HF "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]"
#define RE_KIMI_K2_HF                                                                              \
    "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UP_HF "*" KIMI_LOW_HF "+" KIMI_CTR                   \
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UP_HF "+" KIMI_LOW_HF "*" KIMI_CTR                              \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* llama.cpp's "default" for BPE vocabularies without a known pre-tokenizer. */
#define RE_DEFAULT_0 "[\\p{P}\\$\\+<=>\\^~\\|]+"
#define RE_DEFAULT_1 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_DEFAULT_2 "\\p{N}+"
#define RE_DEFAULT_3 "[0-9][0-9][0-9]"

typedef struct pretok_family {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    const char *regex[TM_PRETOK_MAX_REGEX];
    bool nfc;
    bool ignore_merges;
    bool no_bos; /* llama.cpp drops the vocabulary's bos token (GLM's: [gMASK]) */
} pretok_family;

static const pretok_family families[] = {
    {"default", {RE_DEFAULT_0, RE_DEFAULT_1, RE_DEFAULT_2, RE_DEFAULT_3}, false, false, false},
    {"gpt2|gpt-2|mpt|olmo|jais", {RE_GPT2}, false, false, false},
    {"llama3|llama-v3|llama-bpe", {RE_LLAMA3}, false, true, false},
    {"dbrx|smaug-bpe", {RE_LLAMA3}, false, false, false},
    {"chatglm-bpe", {RE_LLAMA3}, false, false, true},
    {"glm4|glm5", {RE_LLAMA3}, false, true, true}, /* GLM-4.5 and later */
    {"qwen2", {RE_QWEN2}, true, false, false},
    {"qwen35", {RE_QWEN35}, true, false, false},
    {"stablelm2", {RE_QWEN2}, false, false, false},
    {"gpt-4o|o200k", {RE_O200K}, false, false, false},
    {"tekken", {RE_TEKKEN}, false, true, false},
    {"deepseek-v3", {RE_DS3_0, RE_DS3_1, RE_DS3_2}, false, false, false},
    {"kimi-k2", {RE_KIMI_K2}, false, false, false},
};

static bool name_in_list(const char *name, const char *list) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !memcmp(p, name, n)) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

const char *pretok_known_names(void) {
    return "default, gpt2, gpt-2, mpt, olmo, jais, llama3, llama-v3, llama-bpe, dbrx, smaug-bpe, "
           "chatglm-bpe, glm4, glm5, qwen2, qwen35, stablelm2, gpt-4o, o200k, tekken, deepseek-v3, "
           "kimi-k2";
}

tm_status pretok_init(tm_pretok *p, const char *pre_name, bool *nfc, bool *ignore_merges,
                      bool *no_bos) {
    memset(p, 0, sizeof(*p));
    const pretok_family *fam = NULL;
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
        if (name_in_list(pre_name, families[i].names)) fam = &families[i];
    if (!fam)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tokenizer.ggml.pre: unknown pre-tokenizer '%s' (known: %s)", pre_name,
                            pretok_known_names());
    for (int k = 0; k < TM_PRETOK_MAX_REGEX && fam->regex[k]; k++) {
        int err;
        PCRE2_SIZE off;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)fam->regex[k], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            pretok_free(p);
            return tm_error_set(TM_ERR_UNSUPPORTED,
                                "pre-tokenizer '%s': PCRE2 cannot compile regex %d at %zu: %s",
                                pre_name, k, (size_t)off, (const char *)msg);
        }
        /* JIT is an optimisation: without it (no JIT on this CPU) matching still works. */
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        p->code[p->n_regex++] = re;
    }
    *nfc = fam->nfc;
    *ignore_merges = fam->ignore_merges;
    *no_bos = fam->no_bos;
    return TM_OK;
}

void pretok_free(tm_pretok *p) {
    for (int k = 0; k < p->n_regex; k++) pcre2_code_free((pcre2_code *)p->code[k]);
    memset(p, 0, sizeof(*p));
}

struct tm_pretok_scratch {
    pcre2_match_data *md[TM_PRETOK_MAX_REGEX];
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
};

typedef struct split_state {
    const tm_pretok *p;
    pcre2_match_data **md;
    pcre2_match_context *mctx;
    pretok_emit_fn emit;
    void *ctx;
} split_state;

tm_status pretok_scratch_init(const tm_pretok *p, tm_pretok_scratch **out) {
    *out = NULL;
    tm_pretok_scratch *sc = calloc(1, sizeof(*sc));
    if (!sc) return tm_error_set(TM_ERR_NOMEM, "pre-tokenizer: out of memory");
    sc->mctx = pcre2_match_context_create(NULL);
    sc->jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    bool ok = sc->mctx && sc->jit_stack;
    if (ok) pcre2_jit_stack_assign(sc->mctx, NULL, sc->jit_stack);
    for (int k = 0; ok && k < p->n_regex; k++) {
        sc->md[k] = pcre2_match_data_create_from_pattern((pcre2_code *)p->code[k], NULL);
        ok = sc->md[k] != NULL;
    }
    if (!ok) {
        pretok_scratch_free(sc);
        return tm_error_set(TM_ERR_NOMEM, "pre-tokenizer: out of memory for PCRE2 match data");
    }
    *out = sc;
    return TM_OK;
}

void pretok_scratch_free(tm_pretok_scratch *sc) {
    if (!sc) return;
    for (int k = 0; k < TM_PRETOK_MAX_REGEX; k++) pcre2_match_data_free(sc->md[k]);
    pcre2_jit_stack_free(sc->jit_stack);
    pcre2_match_context_free(sc->mctx);
    free(sc);
}

/* Match regex k at or after `start`. Returns 1 with [*ms, *me) on a match, 0 on
 * none. The JIT stack can run out on huge inputs; the interpreter then retries,
 * and if even that gives up the rest of the text stays one piece. */
static int match_at(split_state *s, int k, const char *text, size_t len, size_t start, size_t *ms,
                    size_t *me) {
    pcre2_code *re = (pcre2_code *)s->p->code[k];
    int rc = pcre2_match(re, (PCRE2_SPTR)text, len, start, PCRE2_NO_UTF_CHECK, s->md[k], s->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)text, len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         s->md[k], s->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        tm_log_warn("pre-tokenizer: PCRE2 error %d on a %zu-byte piece; keeping it whole", rc,
                    len - start);
        return 0;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md[k]);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

static tm_status split_level(split_state *s, int k, const char *text, size_t len) {
    if (len == 0) return TM_OK;
    if (k == s->p->n_regex) return s->emit(s->ctx, text, len);
    size_t pos = 0;
    while (pos < len) {
        size_t ms, me;
        if (!match_at(s, k, text, len, pos, &ms, &me)) break;
        if (me == ms) { /* an empty match: no pattern here has one, but never loop on it */
            size_t step = tok_utf8_valid_len((const uint8_t *)text + me, len - me);
            me = ms + (step ? step : 1);
            if (me > len) me = len;
        }
        tm_status st = split_level(s, k + 1, text + pos, ms - pos); /* the gap */
        if (st) return st;
        st = split_level(s, k + 1, text + ms, me - ms); /* the match */
        if (st) return st;
        pos = me;
    }
    return split_level(s, k + 1, text + pos, len - pos);
}

tm_status pretok_split(const tm_pretok *p, tm_pretok_scratch *sc, const char *text, size_t len,
                       pretok_emit_fn emit, void *ctx) {
    if (p->n_regex == 0) return len ? emit(ctx, text, len) : TM_OK;
    split_state s = {.p = p, .md = sc->md, .mctx = sc->mctx, .emit = emit, .ctx = ctx};
    return split_level(&s, 0, text, len);
}

/* The tokenizer.ggml.pre name llama.cpp's converter writes for a tokenizer.json
 * whose pre-tokenizer's Split regexes are re[0..n) (the exact strings in the file). */
const char *pretok_name_for_regexes(const char *const *re, int n) {
    static const struct {
        const char *re[TM_PRETOK_MAX_REGEX], *name;
    } known[] = {
        {{RE_QWEN2}, "qwen2"},
        {{RE_QWEN35}, "qwen35"},
        {{RE_LLAMA3}, "llama-bpe"},
        {{RE_O200K}, "gpt-4o"},
        {{RE_TEKKEN}, "tekken"},
        {{RE_GPT2}, "gpt2"},
        {{RE_DS3_0, RE_DS3_1, RE_DS3_2}, "deepseek-v3"},
        {{RE_KIMI_K2_HF}, "kimi-k2"}, /* run as RE_KIMI_K2 */
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        int k = 0;
        while (k < n && k < TM_PRETOK_MAX_REGEX && known[i].re[k] && !strcmp(re[k], known[i].re[k]))
            k++;
        if (k == n && (k == TM_PRETOK_MAX_REGEX || !known[i].re[k])) return known[i].name;
    }
    return NULL;
}
