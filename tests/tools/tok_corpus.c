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

/* true when p[0..n) does not end inside a multi-byte character */
static int ends_clean(const char *p, size_t n) {
    size_t i = n, k = 0;
    while (i > 0 && k < 4 && ((uint8_t)p[i - 1] & 0xC0) == 0x80) i--, k++;
    if (i == 0) return k == 0;
    uint8_t c = (uint8_t)p[i - 1];
    int need = c < 0x80 ? 1 : c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
    return (size_t)need <= k + 1 || need == 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: tok_corpus MODEL.gguf CORPUS.bin OUT.txt [--add-special] [--no-parse-special]\n");
        return 2;
    }
    tm_tokenize_opts o = {.add_special = false, .parse_special = true};
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--add-special")) o.add_special = true;
        else if (!strcmp(argv[i], "--no-parse-special")) o.parse_special = false;
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
        tm_detok_stream s;
        tokenizer_stream_init(&s, t, true, false);
        for (size_t i = 0; i <= ids.n; i++) {
            const char *p;
            size_t n;
            if (i < ids.n) tokenizer_stream_push(&s, ids.ids[i], &p, &n);
            else tokenizer_stream_flush(&s, &p, &n);
            if (i < ids.n && !ends_clean(p, n)) {
                fprintf(stderr, "tok_corpus: stream output ends inside a character\n");
                rc = 1;
            }
            put_hex(out, p, n);
        }
        tokenizer_stream_free(&s);
        fputc('\n', out);
        free(dec);
        tokenizer_tokens_free(&ids);
    }
    free(buf);
    fclose(in);
    fclose(out);
    tokenizer_free(t);
    return rc;
}
