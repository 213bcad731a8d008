/* tok_corpus: tokenize every string of a corpus with a GGUF's tokenizer, for
 * the oracle test to compare with HF tokenizers.
 * usage: tok_corpus MODEL.gguf CORPUS.bin OUT.txt [--add-special] [--no-parse-special]
 * CORPUS.bin: records of u32 little-endian length + bytes.
 * OUT.txt: one line per record: "id id id<TAB>hex(decode(ids))<TAB>hex(stream)"
 * where stream is what the streaming decoder printed (with its own check that no
 * output ends inside a UTF-8 character). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static void put_hex(FILE *f, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) fprintf(f, "%02x", (uint8_t)p[i]);
}

/* If p[0..n) ends with the first bytes of a character that lacks its last
 * bytes, the offset of its lead byte in p, else -1. */
static long incomplete_tail(const char *p, size_t n) {
    size_t i = n;
    while (i > 0 && n - i < 3 && ((uint8_t)p[i - 1] & 0xC0) == 0x80) i--;
    if (i == 0) return -1;
    const uint8_t *s = (const uint8_t *)p + i - 1;
    size_t have = n - i + 1;
    int need = s[0] >= 0xC2 && s[0] <= 0xDF   ? 2
               : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
               : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4
                                              : 1;
    if (need == 1 || (size_t)need <= have) return -1;
    return (long)(i - 1);
}

/* a valid UTF-8 character starts at s[0..n) */
static int valid_char_at(const uint8_t *s, size_t n) {
    int need = s[0] < 0x80                    ? 1
               : s[0] >= 0xC2 && s[0] <= 0xDF ? 2
               : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
               : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4
                                              : 0;
    if (need == 0 || (size_t)need > n) return 0;
    if (need == 1) return 1;
    uint8_t lo = 0x80, hi = 0xBF;
    if (s[0] == 0xE0)
        lo = 0xA0;
    else if (s[0] == 0xED)
        hi = 0x9F;
    else if (s[0] == 0xF0)
        lo = 0x90;
    else if (s[0] == 0xF4)
        hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int k = 2; k < need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: tok_corpus MODEL.gguf CORPUS.bin OUT.txt [--add-special] "
                        "[--no-parse-special]\n");
        return 2;
    }
    tm_tokenize_opts o = {.add_special = false, .parse_special = true};
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--add-special"))
            o.add_special = true;
        else if (!strcmp(argv[i], "--no-parse-special"))
            o.parse_special = false;
    }
    tm_tokenizer *t;
    if (tokenizer_load_file(argv[1], &t)) {
        fprintf(stderr, "tok_corpus: %s\n", tm_error_message());
        return 1;
    }
    FILE *in = fopen(argv[2], "rb"), *out = fopen(argv[3], "w");
    if (!in || !out) {
        fprintf(stderr, "tok_corpus: cannot open %s or %s\n", argv[2], argv[3]);
        return 1;
    }
    int rc = 0;
    uint32_t len;
    char *buf = NULL;
    size_t rec = 0;
    while (fread(&len, 4, 1, in) == 1) {
        buf = realloc(buf, len + 1);
        if (!buf || fread(buf, 1, len, in) != len) {
            fprintf(stderr, "tok_corpus: truncated corpus\n");
            rc = 1;
            break;
        }
        tm_tokens ids = {0};
        if (tokenizer_encode(t, buf, len, &o, &ids)) {
            fprintf(stderr, "tok_corpus: %s\n", tm_error_message());
            rc = 1;
            break;
        }
        char *dec;
        size_t dec_len;
        tokenizer_decode(t, ids.ids, ids.n, true, &dec, &dec_len);
        for (size_t i = 0; i < ids.n; i++) fprintf(out, i ? " %d" : "%d", ids.ids[i]);
        fputc('\t', out);
        put_hex(out, dec, dec_len);
        fputc('\t', out);
        /* The stream may end an output with a lead byte only when that byte turns
         * out to be invalid in the whole text (it was released because what came
         * next could not continue it). */
        tm_detok_stream s;
        tokenizer_stream_init(&s, t, true, false);
        char *acc = malloc(dec_len + 1);
        size_t acc_n = 0;
        for (size_t i = 0; i <= ids.n; i++) {
            const char *p;
            size_t n;
            if (i < ids.n)
                tokenizer_stream_push(&s, ids.ids[i], &p, &n);
            else
                tokenizer_stream_flush(&s, &p, &n);
            if (acc_n + n > dec_len) {
                fprintf(stderr, "tok_corpus: record %zu: stream longer than decode\n", rec);
                rc = 1;
                break;
            }
            memcpy(acc + acc_n, p, n);
            long tail = i < ids.n ? incomplete_tail(p, n) : -1;
            acc_n += n;
            if (tail >= 0 && valid_char_at((const uint8_t *)dec + (acc_n - n + (size_t)tail),
                                           dec_len - (acc_n - n + (size_t)tail))) {
                fprintf(stderr,
                        "tok_corpus: record %zu: stream output after token %zu ends inside a "
                        "character\n",
                        rec, i);
                rc = 1;
            }
        }
        put_hex(out, acc, acc_n);
        free(acc);
        tokenizer_stream_free(&s);
        fputc('\n', out);
        free(dec);
        tokenizer_tokens_free(&ids);
        rec++;
    }
    free(buf);
    fclose(in);
    fclose(out);
    tokenizer_free(t);
    return rc;
}
