/* Tokenizer unit tests on small vocabularies written here as GGUF files:
 * merge order (rank, then leftmost), special and control tokens, BOS/EOS,
 * invalid UTF-8, NFC, SentencePiece prefix and byte fallback, scores vs merges,
 * the streaming decoder with characters split over tokens, both merge formats,
 * and the load-time errors for bad vocabularies. The real vocabularies are
 * compared with HF tokenizers in tests/oracle/test_tokenizer_oracle.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

static char g_path[512];

static const char *tmp_path(const char *name) {
    const char *dir = getenv("TM_TEST_TMP");
    snprintf(g_path, sizeof(g_path), "%s/%s", dir ? dir : "/tmp", name);
    return g_path;
}

/* ---- a byte-level vocabulary: the 256 byte tokens, then extra tokens ---- */

typedef struct vocab_spec {
    const char *model, *pre;
    const char **extra; /* texts appended after the byte tokens (byte-level alphabet) */
    const int32_t *extra_type;
    size_t n_extra;
    const char **merges; /* "a b" */
    size_t n_merges;
    bool merges_as_pairs;
    bool no_merges;
    int32_t bos, eos;     /* -1: key absent */
    int add_bos, add_eos; /* -1: key absent */
    bool bad_token_type_len;
    bool drop_byte_token;
} vocab_spec;

static char *byte_text(unsigned b) {
    char *s = malloc(4);
    size_t n = tok_utf8_put(tok_byte_to_cp((uint8_t)b), s);
    s[n] = 0;
    return s;
}

static tm_status write_bpe_vocab(const vocab_spec *v, const char *path) {
    tm_gguf_writer *w;
    tm_status st = gguf_writer_init(&w, 3, 32);
    assert_int_equal(st, TM_OK);
    size_t n = 256 + v->n_extra;
    const char **tok = calloc(n, sizeof(*tok));
    int32_t *type = calloc(n, sizeof(*type));
    for (unsigned b = 0; b < 256; b++) {
        tok[b] = byte_text(b);
        type[b] = TM_TOKEN_TYPE_NORMAL;
    }
    if (v->drop_byte_token) ((char *)tok[0x41])[0] = '?'; /* 'A' token becomes a second '?' */
    for (size_t i = 0; i < v->n_extra; i++) {
        tok[256 + i] = v->extra[i];
        type[256 + i] = v->extra_type ? v->extra_type[i] : TM_TOKEN_TYPE_NORMAL;
    }
    st = gguf_writer_set_str(w, "tokenizer.ggml.model", v->model ? v->model : "gpt2");
    if (!st && v->pre) st = gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre);
    if (!st) st = gguf_writer_set_array(w, "tokenizer.ggml.tokens", TM_GGUF_TYPE_STRING, tok, n);
    if (!st)
        st = gguf_writer_set_array(w, "tokenizer.ggml.token_type", TM_GGUF_TYPE_INT32, type,
                                   v->bad_token_type_len ? n - 1 : n);
    if (!st && !v->no_merges && !v->merges_as_pairs)
        st = gguf_writer_set_array(w, "tokenizer.ggml.merges", TM_GGUF_TYPE_STRING, v->merges,
                                   v->n_merges);
    if (!st && !v->no_merges && v->merges_as_pairs) {
        tm_gguf_value *pairs = calloc(v->n_merges, sizeof(*pairs));
        tm_gguf_str *strs = calloc(2 * v->n_merges, sizeof(*strs));
        for (size_t i = 0; i < v->n_merges; i++) {
            const char *m = v->merges[i], *sp = strchr(m + 1, ' ');
            strs[2 * i] = (tm_gguf_str){m, (uint64_t)(sp - m)};
            strs[2 * i + 1] = (tm_gguf_str){sp + 1, strlen(sp + 1)};
            pairs[i].type = TM_GGUF_TYPE_ARRAY;
            pairs[i].v.arr = (tm_gguf_array){TM_GGUF_TYPE_STRING, 2, &strs[2 * i]};
        }
        tm_gguf_value all = {.type = TM_GGUF_TYPE_ARRAY};
        all.v.arr = (tm_gguf_array){TM_GGUF_TYPE_ARRAY, v->n_merges, pairs};
        st = gguf_writer_set_value(w, "tokenizer.ggml.merges", &all);
        free(pairs);
        free(strs);
    }
    if (!st && v->bos >= 0)
        st = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (!st && v->eos >= 0)
        st = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (!st && v->add_bos >= 0)
        st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    if (!st && v->add_eos >= 0)
        st = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos);
    if (!st) st = gguf_writer_begin(w, path);
    if (!st) st = gguf_writer_finish(w);
    gguf_writer_free(w);
    for (unsigned b = 0; b < 256; b++) free((char *)tok[b]);
    free(tok);
    free(type);
    return st;
}

/* ids 256.. : "he", "ll", "hell", "o", ... */
static const char *k_extra[] = {"he",           "ll",         "hel",     "hell", "hello", "aa",
                                "<|im_start|>", "<|im_end|>", "<think>", "Ġw",   "Ġwo"};
static const int32_t k_types[] = {
    1, 1, 1, 1, 1, 1, TM_TOKEN_TYPE_CONTROL, TM_TOKEN_TYPE_CONTROL, TM_TOKEN_TYPE_USER_DEFINED,
    1, 1};
enum { T_HE = 256, T_LL, T_HEL, T_HELL, T_HELLO, T_AA, T_IM_START, T_IM_END, T_THINK, T_GW, T_GWO };
/* "he l" has a better rank than "h el" would; "hel l" makes "hell"; "ll" exists but ranks after */
static const char *k_merges[] = {"h e", "a a", "he l", "hel l", "l l", "hell o", "Ġ w", "Ġw o"};

static vocab_spec base_spec(void) {
    return (vocab_spec){.pre = "gpt2",
                        .extra = k_extra,
                        .extra_type = k_types,
                        .n_extra = sizeof(k_extra) / sizeof(k_extra[0]),
                        .merges = k_merges,
                        .n_merges = sizeof(k_merges) / sizeof(k_merges[0]),
                        .bos = -1,
                        .eos = -1,
                        .add_bos = -1,
                        .add_eos = -1};
}

static tm_tokenizer *load_spec(const vocab_spec *v, const char *name) {
    const char *p = tmp_path(name);
    assert_int_equal(write_bpe_vocab(v, p), TM_OK);
    tm_tokenizer *t = NULL;
    tm_status st = tokenizer_load_file(p, &t);
    if (st) fprintf(stderr, "load: %s\n", tm_error_message());
    assert_int_equal(st, TM_OK);
    return t;
}

static void expect_ids(const tm_tokenizer *t, const char *text, size_t len, tm_tokenize_opts o,
                       const int32_t *want, size_t n_want) {
    tm_tokens ids = {0};
    assert_int_equal(tokenizer_encode(t, text, len, &o, &ids), TM_OK);
    if (ids.n != n_want || memcmp(ids.ids, want, n_want * sizeof(int32_t))) {
        fprintf(stderr, "for '%.*s' got", (int)len, text);
        for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, "\n");
    }
    assert_int_equal(ids.n, n_want);
    assert_memory_equal(ids.ids, want, n_want * sizeof(int32_t));
    tokenizer_tokens_free(&ids);
}

#define EXPECT(t, s, o, ...)                                                                       \
    do {                                                                                           \
        const int32_t w_[] = {__VA_ARGS__};                                                        \
        expect_ids(t, s, strlen(s), o, w_, sizeof(w_) / sizeof(w_[0]));                            \
    } while (0)

static void test_byte_alphabet(void **state) {
    (void)state;
    int seen[0x200] = {0};
    for (unsigned b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        assert_true(cp < 0x200);
        assert_int_equal(tok_cp_to_byte(cp), (int)b);
        assert_int_equal(seen[cp]++, 0);
    }
    assert_int_equal(tok_byte_to_cp(' '), 0x120);  /* Ġ */
    assert_int_equal(tok_byte_to_cp('\n'), 0x10A); /* Ċ */
    assert_int_equal(tok_byte_to_cp('A'), 'A');
}

static void test_utf8_valid_len(void **state) {
    (void)state;
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"a", 1), 1);
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"\xc3\xa9", 2), 2);
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"\xe6\x97\xa5", 3), 3);
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"\xf0\x9f\x98\x80", 4), 4);
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"\xc0\xaf", 2), 0);     /* overlong */
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"\xed\xa0\x80", 3), 0); /* surrogate */
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"\xf4\x90\x80\x80", 4),
                     0);                                                     /* > U+10FFFF */
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"\xe6\x97", 2), 0); /* truncated */
    assert_int_equal(tok_utf8_valid_len((const uint8_t *)"\x80", 1), 0);
}

static void test_bpe_merge_order(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    tm_tokenizer *t = load_spec(&v, "tok_bpe.gguf");
    tm_tokenize_opts o = {.parse_special = true};
    EXPECT(t, "hello", o, T_HELLO);
    EXPECT(t, "hell", o, T_HELL);
    EXPECT(t, "ll", o, T_LL);
    EXPECT(t, "aaa", o, T_AA, 'a'); /* equal ranks: leftmost first */
    EXPECT(t, "aaaa", o, T_AA, T_AA);
    EXPECT(t, "hello wo", o, T_HELLO, T_GWO);
    EXPECT(t, "lhe", o, 'l', T_HE); /* gpt2 regex keeps "lhe" one piece */
    /* the pre-tokenizer splits: a merge never crosses a piece boundary */
    EXPECT(t, "he'll", o, T_HE, '\'', T_LL); /* pieces "he" "'ll": no "hell" */
    tokenizer_free(t);
}

static void test_merge_formats_agree(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    v.merges_as_pairs = true;
    tm_tokenizer *t = load_spec(&v, "tok_pairs.gguf");
    tm_tokenize_opts o = {.parse_special = true};
    EXPECT(t, "hello hello aaa", o, T_HELLO, ' ', T_HELLO, ' ', T_AA, 'a');
    /* ' ' is byte 0x20 = token id 0x20; check it is a byte token */
    tokenizer_free(t);
}

static void test_special_tokens(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    tm_tokenizer *t = load_spec(&v, "tok_special.gguf");
    tm_tokenize_opts parse = {.parse_special = true}, plain = {.parse_special = false};
    EXPECT(t, "<|im_start|>hello<|im_end|>", parse, T_IM_START, T_HELLO, T_IM_END);
    /* control tokens stay text without parse_special; user-defined ones always match */
    tm_tokens ids = {0};
    assert_int_equal(tokenizer_encode(t, "<|im_start|>", 12, &plain, &ids), TM_OK);
    assert_true(ids.n > 1);
    for (size_t i = 0; i < ids.n; i++) assert_int_not_equal(ids.ids[i], T_IM_START);
    tokenizer_tokens_free(&ids);
    EXPECT(t, "<think>hello", plain, T_THINK, T_HELLO);
    /* the regex never sees across a special token: "he" + special + "llo" */
    EXPECT(t, "he<think>llo", parse, T_HE, T_THINK, T_LL, 'o');
    assert_true(tokenizer_is_end_of_generation(t, T_IM_END));
    assert_false(tokenizer_is_end_of_generation(t, T_HELLO));
    tokenizer_free(t);
}

static void test_bos_eos(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    v.bos = T_IM_START;
    v.eos = T_IM_END;
    v.add_bos = 1;
    v.add_eos = 1;
    tm_tokenizer *t = load_spec(&v, "tok_bos.gguf");
    tm_tokenize_opts with = {.add_special = true, .parse_special = true},
                     without = {.parse_special = true};
    EXPECT(t, "hello", with, T_IM_START, T_HELLO, T_IM_END);
    EXPECT(t, "hello", without, T_HELLO);
    assert_int_equal(tokenizer_specials(t).bos, T_IM_START);
    tokenizer_free(t);
}

/* GLM's vocabulary (pre glm4): Llama 3's pieces and ignore_merges, but its bos_token_id
 * ([gMASK] in the converter's files) is no bos token: none is added, as llama.cpp drops
 * it, where llama-bpe adds one by default. */
static void test_glm4_no_bos(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    v.bos = T_IM_START;
    v.pre = "llama-bpe";
    tm_tokenizer *l3 = load_spec(&v, "tok_l3.gguf");
    v.pre = "glm4";
    tm_tokenizer *glm = load_spec(&v, "tok_glm4.gguf");
    tm_tokenize_opts with = {.add_special = true, .parse_special = true};
    EXPECT(l3, "hello", with, T_IM_START, T_HELLO);
    EXPECT(glm, "hello", with, T_HELLO);
    assert_int_equal(tokenizer_specials(glm).bos, -1);
    static const char *const texts[] = {"hello aa", "he'll  hello\n\n12345 <think>x", "wo w"};
    for (size_t i = 0; i < 3; i++) { /* the same pieces and merges otherwise */
        tm_tokens a = {0}, b = {0};
        tm_tokenize_opts o = {.parse_special = true};
        assert_int_equal(tokenizer_encode(l3, texts[i], strlen(texts[i]), &o, &a), TM_OK);
        assert_int_equal(tokenizer_encode(glm, texts[i], strlen(texts[i]), &o, &b), TM_OK);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.ids, b.ids, a.n * sizeof(int32_t));
        tokenizer_tokens_free(&a), tokenizer_tokens_free(&b);
    }
    tokenizer_free(l3), tokenizer_free(glm);
}

static void test_invalid_utf8_roundtrip(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    tm_tokenizer *t = load_spec(&v, "tok_invalid.gguf");
    tm_tokenize_opts o = {.parse_special = true};
    /* an invalid byte is a boundary: "he" \xff "llo" cannot become "hello" */
    const char s[] = "he\xffllo \xe6\x97 wo\x80";
    tm_tokens ids = {0};
    assert_int_equal(tokenizer_encode(t, s, sizeof(s) - 1, &o, &ids), TM_OK);
    assert_int_equal(ids.ids[0], T_HE);
    assert_int_equal(ids.ids[1], tokenizer_token_find(t, "\xc3\xbf", 2)); /* ÿ = byte 0xFF */
    char *dec;
    size_t n;
    assert_int_equal(tokenizer_decode(t, ids.ids, ids.n, true, &dec, &n), TM_OK);
    assert_int_equal(n, sizeof(s) - 1);
    assert_memory_equal(dec, s, n);
    free(dec);
    tokenizer_tokens_free(&ids);
    tokenizer_free(t);
}

static void test_stream_split_characters(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    tm_tokenizer *t = load_spec(&v, "tok_stream.gguf");
    /* token id b is byte b here, and "日" is 3 byte tokens (no merges): nothing
     * may print until the third */
    const int32_t ids[] = {'h', 0xE6, 0x97, 0xA5, 0xE6, 0x97, 'x', 0xF0, 0x9F};
    tm_detok_stream s;
    tokenizer_stream_init(&s, t, true, false);
    const char *p;
    size_t n;
    char acc[64];
    size_t m = 0;
    const size_t want_len[] = {1, 0, 0, 3, 0, 0, 3, 0, 0};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        assert_int_equal(tokenizer_stream_push(&s, ids[i], &p, &n), TM_OK);
        assert_int_equal(n, want_len[i]);
        memcpy(acc + m, p, n);
        m += n;
    }
    assert_int_equal(tokenizer_stream_flush(&s, &p, &n), TM_OK);
    memcpy(acc + m, p, n);
    m += n;
    /* "h" "日" then "\xe6\x97" released raw when 'x' proves it invalid, "x", and a held "\xf0\x9f"
     * at the end */
    assert_int_equal(m, 1 + 3 + 2 + 1 + 2);
    assert_memory_equal(acc, "h\xe6\x97\xa5\xe6\x97x\xf0\x9f", m);
    tokenizer_stream_free(&s);

    /* replace_invalid: the same ids print valid UTF-8 only, one U+FFFD per maximal subpart
     * (Unicode 3.9: b"\xe6\x97x\xf0\x9f".decode(errors="replace") == "\ufffdx\ufffd") */
    tokenizer_stream_init(&s, t, true, true);
    m = 0;
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        assert_int_equal(tokenizer_stream_push(&s, ids[i], &p, &n), TM_OK);
        memcpy(acc + m, p, n);
        m += n;
    }
    assert_int_equal(tokenizer_stream_flush(&s, &p, &n), TM_OK);
    memcpy(acc + m, p, n);
    m += n;
    const char want[] = "h\xe6\x97\xa5\xef\xbf\xbdx\xef\xbf\xbd";
    assert_int_equal(m, sizeof(want) - 1);
    assert_memory_equal(acc, want, m);
    tokenizer_stream_free(&s);
    tokenizer_free(t);
}

static void test_nfc_for_qwen2(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    v.pre = "qwen2";
    tm_tokenizer *t = load_spec(&v, "tok_nfc.gguf");
    tm_tokenize_opts o = {.parse_special = true};
    tm_tokens a = {0}, b = {0};
    assert_int_equal(tokenizer_encode(t, "caf\xc3\xa9", 5, &o, &a), TM_OK);  /* é composed */
    assert_int_equal(tokenizer_encode(t, "cafe\xcc\x81", 6, &o, &b), TM_OK); /* e + U+0301 */
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, a.n * sizeof(int32_t));
    tokenizer_tokens_free(&a);
    tokenizer_tokens_free(&b);
    tokenizer_free(t);
    /* gpt2 does not normalise */
    v.pre = "gpt2";
    t = load_spec(&v, "tok_nonfc.gguf");
    assert_int_equal(tokenizer_encode(t, "caf\xc3\xa9", 5, &o, &a), TM_OK);
    assert_int_equal(tokenizer_encode(t, "cafe\xcc\x81", 6, &o, &b), TM_OK);
    assert_int_not_equal(a.n, b.n);
    tokenizer_tokens_free(&a);
    tokenizer_tokens_free(&b);
    tokenizer_free(t);
}

static void expect_load_error(const vocab_spec *v, const char *name, tm_status want,
                              const char *needle) {
    const char *p = tmp_path(name);
    assert_int_equal(write_bpe_vocab(v, p), TM_OK);
    tm_tokenizer *t = NULL;
    tm_status st = tokenizer_load_file(p, &t);
    if (st != want || !strstr(tm_error_message(), needle))
        fprintf(stderr, "status %d, message: %s (wanted '%s')\n", st, tm_error_message(), needle);
    assert_int_equal(st, want);
    assert_null(t);
    assert_non_null(strstr(tm_error_message(), needle));
}

static void test_load_errors(void **state) {
    (void)state;
    vocab_spec v = base_spec();
    v.no_merges = true;
    expect_load_error(&v, "bad_nomerges.gguf", TM_ERR_FORMAT, "tokenizer.ggml.merges: missing");
    v = base_spec();
    v.pre = "no-such-pre";
    expect_load_error(&v, "bad_pre.gguf", TM_ERR_UNSUPPORTED,
                      "unknown pre-tokenizer 'no-such-pre'");
    v = base_spec();
    v.model = "wordpiece";
    expect_load_error(&v, "bad_model.gguf", TM_ERR_UNSUPPORTED, "tokenizer.ggml.model 'wordpiece'");
    v = base_spec(); /* Gemma 4's scores are placeholders: its merges must be there */
    v.model = "gemma4";
    v.no_merges = true;
    expect_load_error(&v, "bad_gemma4.gguf", TM_ERR_FORMAT,
                      "tokenizer.ggml.merges: missing; a gemma4 vocabulary needs its merges");
    v = base_spec();
    const char *bad_merges[] = {"h e", "x zz"};
    v.merges = bad_merges;
    v.n_merges = 2;
    expect_load_error(&v, "bad_merge.gguf", TM_ERR_FORMAT,
                      "tokenizer.ggml.merges[1] 'x' 'zz': right part is not a token");
    const char *nospace[] = {"he"};
    v.merges = nospace;
    v.n_merges = 1;
    expect_load_error(&v, "bad_merge2.gguf", TM_ERR_FORMAT,
                      "tokenizer.ggml.merges[0] 'he': expected \"left right\"");
    const char *nocat[] = {"o h"};
    v.merges = nocat;
    expect_load_error(&v, "bad_merge3.gguf", TM_ERR_FORMAT, "their concatenation is not a token");
    v = base_spec();
    v.bad_token_type_len = true;
    expect_load_error(&v, "bad_types.gguf", TM_ERR_FORMAT, "tokenizer.ggml.token_type");
    v = base_spec();
    v.bos = 100000;
    expect_load_error(&v, "bad_bos.gguf", TM_ERR_FORMAT, "bos_token_id = 100000");
    v = base_spec();
    v.drop_byte_token = true;
    expect_load_error(&v, "bad_byte.gguf", TM_ERR_FORMAT, "no token for byte 0x41");
    v = base_spec();
    v.add_eos = 1;
    expect_load_error(&v, "bad_addeos.gguf", TM_ERR_FORMAT,
                      "add_eos_token is set but there is no eos_token_id");
}

/* ---- SentencePiece ---- */

static tm_status write_spm(bool with_merges, bool drop_byte, const char *name) {
    /* 0 <unk> 1 <s> 2 </s> 3..258 <0xXX> 259 ▁ 260 a 261 b 262 ▁a 263 ab 264 ▁ab 265 c */
    const char *tok[266];
    char bytes[256][8];
    float score[266];
    int32_t type[266];
    tok[0] = "<unk>", type[0] = TM_TOKEN_TYPE_UNKNOWN;
    tok[1] = "<s>", type[1] = TM_TOKEN_TYPE_CONTROL;
    tok[2] = "</s>", type[2] = TM_TOKEN_TYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof(bytes[b]), drop_byte && b == 0x41 ? "<0x41!" : "<0x%02X>", b);
        tok[3 + b] = bytes[b];
        type[3 + b] = TM_TOKEN_TYPE_BYTE;
    }
    const char *rest[] = {"\xe2\x96\x81",
                          "a",
                          "b",
                          "\xe2\x96\x81"
                          "a",
                          "ab",
                          "\xe2\x96\x81"
                          "ab",
                          "c"};
    const float rest_score[] = {-1, -2, -3, -10, -20, -30, -4};
    for (int i = 0; i < 7; i++) {
        tok[259 + i] = rest[i];
        type[259 + i] = TM_TOKEN_TYPE_NORMAL;
    }
    for (int i = 0; i < 266; i++) score[i] = i >= 259 ? rest_score[i - 259] : 0.0f;
    /* merges in score order of the merged piece: ▁a (-10), ab (-20), ▁ab (-30) */
    const char *merges[] = {"\xe2\x96\x81 a", "a b",
                            ("\xe2\x96\x81"
                             "a b"), /* one string: the split stops \x81 from eating the 'a' */
                            "\xe2\x96\x81 ab"};
    tm_gguf_writer *w;
    assert_int_equal(gguf_writer_init(&w, 3, 32), TM_OK);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"), TM_OK);
    assert_int_equal(
        gguf_writer_set_array(w, "tokenizer.ggml.tokens", TM_GGUF_TYPE_STRING, tok, 266), TM_OK);
    assert_int_equal(
        gguf_writer_set_array(w, "tokenizer.ggml.scores", TM_GGUF_TYPE_FLOAT32, score, 266), TM_OK);
    assert_int_equal(
        gguf_writer_set_array(w, "tokenizer.ggml.token_type", TM_GGUF_TYPE_INT32, type, 266),
        TM_OK);
    if (with_merges)
        assert_int_equal(
            gguf_writer_set_array(w, "tokenizer.ggml.merges", TM_GGUF_TYPE_STRING, merges, 4),
            TM_OK);
    const char *p = tmp_path(name);
    assert_int_equal(gguf_writer_begin(w, p), TM_OK);
    assert_int_equal(gguf_writer_finish(w), TM_OK);
    gguf_writer_free(w);
    tm_tokenizer *t = NULL;
    tm_status st = tokenizer_load_file(p, &t);
    tokenizer_free(t);
    return st;
}

static tm_tokenizer *load_spm(bool with_merges, const char *name) {
    assert_int_equal(write_spm(with_merges, false, name), TM_OK);
    tm_tokenizer *t;
    assert_int_equal(tokenizer_load_file(tmp_path(name), &t), TM_OK);
    return t;
}

static void test_spm(void **state) {
    (void)state;
    for (int with_merges = 0; with_merges < 2; with_merges++) {
        tm_tokenizer *t =
            load_spm(with_merges, with_merges ? "spm_merges.gguf" : "spm_scores.gguf");
        assert_int_equal(tokenizer_kind(t), TM_TOKENIZER_SPM);
        tm_tokenize_opts o = {.add_special = true, .parse_special = true};
        /* BOS by default; "▁" prepended; "▁a"+"b" -> "▁ab" */
        EXPECT(t, "ab", o, 1, 264);
        /* spaces become ▁; "é" is not a token: its two bytes */
        EXPECT(t, "ab a\xc3\xa9", o, 1, 264, 262, 3 + 0xC3, 3 + 0xA9);
        /* after a special token the next run gets its ▁ again */
        EXPECT(t, "a</s>b", o, 1, 262, 2, 259, 261);
        /* an invalid byte is byte fallback inside the word */
        EXPECT(t,
               "a\xff"
               "c",
               o, 1, 262, 3 + 0xFF, 265);
        tm_tokens ids = {0};
        assert_int_equal(tokenizer_encode(t, " ab c", 5, &o, &ids), TM_OK);
        char *dec;
        size_t n;
        assert_int_equal(tokenizer_decode(t, ids.ids, ids.n, false, &dec, &n), TM_OK);
        assert_string_equal(dec, " ab c"); /* BOS not rendered, the prepended space removed */
        free(dec);
        tokenizer_tokens_free(&ids);
        tokenizer_free(t);
    }
}

static void test_spm_partial_bytes(void **state) {
    (void)state;
    assert_int_equal(write_spm(true, true, "spm_bad_bytes.gguf"), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "255 of the 256 byte tokens"));
}

static void test_chat_reply_content(void **state) {
    (void)state;
    const char r[] = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<"
                     "|message|>Hi!<|return|>";
    size_t a, n;
    chat_reply_content(TM_CHAT_HARMONY, r, sizeof(r) - 1, &a, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(r + a, "Hi!", 3);
    const char q[] = "<think>\nx\n</think>\n\nAnswer<|im_end|>";
    chat_reply_content(TM_CHAT_QWEN3, q, sizeof(q) - 1, &a, &n);
    assert_int_equal(a, 0);
    assert_int_equal(n, sizeof(q) - 1 - strlen("<|im_end|>"));
    assert_int_equal(chat_format_detect(NULL, NULL), TM_CHAT_UNKNOWN);
    tm_chat_format f;
    assert_int_equal(chat_format_from_name("qwen3", &f), TM_OK);
    assert_int_equal(f, TM_CHAT_QWEN3);
    assert_int_equal(chat_format_from_name("vicuna", &f), TM_ERR_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_alphabet),
        cmocka_unit_test(test_utf8_valid_len),
        cmocka_unit_test(test_bpe_merge_order),
        cmocka_unit_test(test_merge_formats_agree),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_bos_eos),
        cmocka_unit_test(test_glm4_no_bos),
        cmocka_unit_test(test_invalid_utf8_roundtrip),
        cmocka_unit_test(test_stream_split_characters),
        cmocka_unit_test(test_nfc_for_qwen2),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_spm),
        cmocka_unit_test(test_spm_partial_bytes),
        cmocka_unit_test(test_chat_reply_content),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
