/* libFuzzer target for the tokenizer: the outside input it parses.
 *
 * First byte even: the rest is a HuggingFace tokenizer.json. It is imported
 *   (tokenizer_import_hf) into GGUF keys; when the import succeeds the keys are
 *   written to a GGUF in /dev/shm and loaded back with tokenizer_load_gguf (which
 *   may still refuse, e.g. merges naming missing tokens); when that loads too,
 *   a fixed text is encoded and decoded.
 * First byte odd: the rest is text (any bytes, invalid UTF-8 included), encoded
 *   with each vocabulary in TM_FUZZ_VOCAB (':'-separated GGUF paths, e.g. the
 *   Qwen3 GGUF of the oracle test) or, without it, with a small built-in
 *   byte-level vocabulary. Checked (abort() otherwise): decode(encode(x)) == x
 *   (for NFC vocabularies: encoding is idempotent on its own output), every id is
 *   in range, and the streaming decoder prints exactly decode().
 * Build: CC=clang cmake -S . -B build-fuzz -G Ninja -DTM_FUZZ=ON && cmake --build build-fuzz
 * --target tokenizer_fuzz Run:   TM_FUZZ_VOCAB=qwen3.gguf:mistral.gguf
 * build-fuzz/fuzz/tokenizer_fuzz -max_len=8192 WORKDIR fuzz/corpus/tokenizer (GGUFs e.g. from
 * tok_vocab_gguf; without TM_FUZZ_VOCAB a built-in vocabulary is used) */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_VOCABS 8
static tm_tokenizer *g_vocab[MAX_VOCABS];
static int g_n_vocab;
static char g_gguf_path[64];

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "tokenizer_fuzz: invariant broken: %s\n", what);
        abort();
    }
}

/* The built-in vocabulary: 256 byte tokens, a few merges and special tokens. */
static tm_tokenizer *builtin_vocab(void) {
    const char *extra[] = {"he", "ll",           "hel",        "hell",   "hello",
                           "aa", "<|im_start|>", "<|im_end|>", "<think>"};
    const int32_t extra_type[] = {1, 1, 1, 1, 1, 1, 3, 3, 4};
    const char *merges[] = {"h e", "a a", "he l", "hel l", "l l", "hell o"};
    const char *tok[256 + 9];
    int32_t type[256 + 9];
    char bytes[256][4];
    for (unsigned b = 0; b < 256; b++) {
        size_t n = tok_utf8_put(tok_byte_to_cp((uint8_t)b), bytes[b]);
        bytes[b][n] = 0;
        tok[b] = bytes[b];
        type[b] = 1;
    }
    for (int i = 0; i < 9; i++) tok[256 + i] = extra[i], type[256 + i] = extra_type[i];
    tm_gguf_writer *w;
    tm_tokenizer *t = NULL;
    if (gguf_writer_init(&w, 3, 32)) abort();
    if (gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") ||
        gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe") ||
        gguf_writer_set_array(w, "tokenizer.ggml.tokens", TM_GGUF_TYPE_STRING, tok, 265) ||
        gguf_writer_set_array(w, "tokenizer.ggml.token_type", TM_GGUF_TYPE_INT32, type, 265) ||
        gguf_writer_set_array(w, "tokenizer.ggml.merges", TM_GGUF_TYPE_STRING, merges, 6) ||
        gguf_writer_begin(w, g_gguf_path) || gguf_writer_finish(w) ||
        tokenizer_load_file(g_gguf_path, &t)) {
        fprintf(stderr, "tokenizer_fuzz: built-in vocabulary: %s\n", tm_error_message());
        abort();
    }
    gguf_writer_free(w);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_gguf_path, sizeof(g_gguf_path), "/dev/shm/tm_tokfuzz_%d.gguf", (int)getpid());
    const char *env = getenv("TM_FUZZ_VOCAB");
    if (env && *env) {
        char *list = strdup(env);
        for (char *s = strtok(list, ":"); s && g_n_vocab < MAX_VOCABS; s = strtok(NULL, ":")) {
            if (tokenizer_load_file(s, &g_vocab[g_n_vocab])) {
                fprintf(stderr, "tokenizer_fuzz: %s\n", tm_error_message());
                abort();
            }
            g_n_vocab++;
        }
        free(list);
    }
    if (g_n_vocab == 0) g_vocab[g_n_vocab++] = builtin_vocab();
    return 0;
}

static void roundtrip(const tm_tokenizer *t, const uint8_t *text, size_t len, int depth) {
    tm_tokenize_opts o = {.add_special = false, .parse_special = true};
    tm_tokens ids = {0};
    check(tokenizer_encode(t, (const char *)text, len, &o, &ids) == TM_OK, "encode succeeds");
    for (size_t i = 0; i < ids.n; i++)
        check(ids.ids[i] >= 0 && (uint32_t)ids.ids[i] < tokenizer_n_tokens(t), "id in range");
    char *dec;
    size_t dn;
    check(tokenizer_decode(t, ids.ids, ids.n, true, &dec, &dn) == TM_OK, "decode succeeds");
    tm_detok_stream s;
    tokenizer_stream_init(&s, t, true, false);
    char *acc = malloc(dn + 1);
    size_t an = 0;
    for (size_t i = 0; i <= ids.n; i++) {
        const char *p;
        size_t n;
        if (i < ids.n)
            check(tokenizer_stream_push(&s, ids.ids[i], &p, &n) == TM_OK, "stream push");
        else
            check(tokenizer_stream_flush(&s, &p, &n) == TM_OK, "stream flush");
        check(an + n <= dn, "stream no longer than decode");
        memcpy(acc + an, p, n);
        an += n;
    }
    check(an == dn && !memcmp(acc, dec, dn), "stream == decode");
    tokenizer_stream_free(&s);
    free(acc);
    bool special = false;
    for (size_t i = 0; i < ids.n; i++) {
        tm_token_type ty = tokenizer_token_type(t, ids.ids[i]);
        special |=
            ty == TM_TOKEN_TYPE_CONTROL || ty == TM_TOKEN_TYPE_USER_DEFINED ||
            ty == TM_TOKEN_TYPE_UNKNOWN ||
            ids.ids[i] ==
                tokenizer_specials(t).unk; /* SPM without byte tokens: <unk> loses the text */
    }
    if (t->normalize_nfc) {
        /* NFC changes the text: what must hold is that the decoded text encodes to itself */
        if (depth == 0)
            roundtrip(t, (const uint8_t *)dec, dn, 1);
        else
            check(dn == len && !memcmp(dec, text, len), "NFC text: decode(encode(y)) == y");
    } else if (t->kind == TM_TOKENIZER_BPE) {
        check(dn == len && !memcmp(dec, text, len), "decode(encode(x)) == x");
    } else if (!special) {
        /* SPM: a U+2581 in the text is the space symbol and comes back as ' ' (as in
         * SentencePiece and HF); around special tokens a U+2581 is added: no identity there */
        uint8_t *want = malloc(len + 1);
        size_t wn = 0;
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && !memcmp(text + i, "\xe2\x96\x81", 3)) {
                want[wn++] = ' ';
                i += 3;
            } else {
                want[wn++] = text[i++];
            }
        }
        check(dn == wn && !memcmp(dec, want, wn),
              "SPM: decode(encode(x)) == x with U+2581 as space");
        free(want);
    }
    free(dec);
    tokenizer_tokens_free(&ids);
}

static void fuzz_import(const uint8_t *data, size_t size) {
    char json_path[64];
    snprintf(json_path, sizeof(json_path), "/dev/shm/tm_tokfuzz_%d.json", (int)getpid());
    FILE *f = fopen(json_path, "wb");
    if (!f) abort();
    fwrite(data, 1, size, f);
    fclose(f);
    tm_gguf_writer *w;
    if (gguf_writer_init(&w, 3, 32)) abort();
    uint32_t n = 0;
    if (tokenizer_import_hf_ex(json_path, w, NULL, &n) == TM_OK &&
        gguf_writer_begin(w, g_gguf_path) == TM_OK && gguf_writer_finish(w) == TM_OK) {
        tm_tokenizer *t = NULL;
        if (tokenizer_load_file(g_gguf_path, &t) == TM_OK) {
            check(tokenizer_n_tokens(t) == n, "loaded token count == imported");
            static const char text[] =
                "Hello world's caf\xc3\xa9 12345 \xe6\x97\xa5\n\n<|im_start|>user \xff";
            roundtrip(t, (const uint8_t *)text, sizeof(text) - 1, 0);
            tokenizer_free(t);
        }
    }
    gguf_writer_free(w);
    unlink(json_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if ((data[0] & 1) == 0) {
        fuzz_import(data + 1, size - 1);
        return 0;
    }
    /* a private copy of exactly the text's size, so ASan sees any over-read */
    uint8_t *text = malloc(size - 1 ? size - 1 : 1);
    memcpy(text, data + 1, size - 1);
    for (int v = 0; v < g_n_vocab; v++) roundtrip(g_vocab[v], text, size - 1, 0);
    free(text);
    return 0;
}
