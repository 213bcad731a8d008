/* tiermoe tokenize / detokenize: debug the tokenizer a GGUF file carries.
 *   tiermoe tokenize -m FILE [--ids] [--no-bos] [--no-parse-special] TEXT | -f TEXTFILE
 *   tiermoe detokenize -m FILE [--no-special] IDS...   (ids separated by spaces or commas)
 * tokenize prints one token a line (id, then the bytes it stands for, escaped),
 * or with --ids the ids alone on one line; detokenize prints the text. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tokenizer/tokenizer.h"

static void put_escaped(FILE *out, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n')
            fputs("\\n", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c == '\r')
            fputs("\\r", out);
        else if (c == '\\')
            fputs("\\\\", out);
        else if (c == '\'')
            fputs("\\'", out);
        else if (c < 0x20 || c == 0x7F)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out); /* UTF-8 bytes as they are (a split character shows as the terminal shows
                              it) */
    }
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, r;
    do {
        if (n + 65536 > cap) {
            cap = cap ? 2 * cap : 65536 * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                if (f != stdin) fclose(f);
                return NULL;
            }
            buf = nb;
        }
        r = fread(buf + n, 1, 65536, f);
        n += r;
    } while (r == 65536);
    if (f != stdin) fclose(f);
    *len = n;
    return buf;
}

static int load(const char *model, tm_tokenizer **t) {
    if (!model) {
        fprintf(stderr, "tiermoe: -m FILE is required (a GGUF file with tokenizer.ggml.* keys)\n");
        return 2;
    }
    if (tokenizer_load_file(model, t)) {
        fprintf(stderr, "tiermoe: %s\n", tm_error_message());
        return 1;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text = NULL;
    bool ids_only = false;
    tm_tokenize_opts o = {.add_special = true, .parse_special = true};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "-f") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(argv[i], "--ids"))
            ids_only = true;
        else if (!strcmp(argv[i], "--no-bos"))
            o.add_special = false;
        else if (!strcmp(argv[i], "--no-parse-special"))
            o.parse_special = false;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: tiermoe tokenize -m FILE [--ids] [--no-bos] [--no-parse-special] TEXT | "
                   "-f TEXTFILE\n"
                   "  --ids               print only the ids, on one line\n"
                   "  --no-bos            do not add BOS/EOS even if the vocabulary asks for them\n"
                   "  --no-parse-special  treat <|im_start|> etc. in TEXT as plain text\n");
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "tiermoe tokenize: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        } else if (!text)
            text = argv[i];
        else {
            fprintf(stderr,
                    "tiermoe tokenize: one TEXT argument expected (quote it), got also '%s'\n",
                    argv[i]);
            return 2;
        }
    }
    if (!text == !file) {
        fprintf(stderr, "tiermoe tokenize: give TEXT or -f TEXTFILE (see --help)\n");
        return 2;
    }
    size_t len = text ? strlen(text) : 0;
    char *buf = NULL;
    if (file && !(buf = read_all(file, &len))) {
        fprintf(stderr, "tiermoe tokenize: cannot read %s: %s\n", file, strerror(errno));
        return 1;
    }
    tm_tokenizer *t;
    int rc = load(model, &t);
    if (rc) {
        free(buf);
        return rc;
    }
    tm_tokens ids = {0};
    if (tokenizer_encode(t, buf ? buf : text, len, &o, &ids)) {
        fprintf(stderr, "tiermoe: %s\n", tm_error_message());
        rc = 1;
    } else if (ids_only) {
        for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
        printf("\n");
    } else {
        for (size_t i = 0; i < ids.n; i++) {
            size_t n;
            const char *p = tokenizer_token_bytes(t, ids.ids[i], true, &n);
            printf("%8d  '", ids.ids[i]);
            put_escaped(stdout, p, n);
            tm_token_type ty = tokenizer_token_type(t, ids.ids[i]);
            printf("'%s\n", ty == TM_TOKEN_TYPE_CONTROL        ? "  (control)"
                            : ty == TM_TOKEN_TYPE_BYTE         ? "  (byte)"
                            : ty == TM_TOKEN_TYPE_USER_DEFINED ? "  (user-defined)"
                                                               : "");
        }
        printf("%zu tokens, %zu bytes, tokenizer %s/%s\n", ids.n, len, tokenizer_model_name(t),
               tokenizer_pre_name(t));
    }
    tokenizer_tokens_free(&ids);
    tokenizer_free(t);
    free(buf);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    bool render_special = true;
    tm_tokens ids = {0};
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--no-special"))
            render_special = false;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: tiermoe detokenize -m FILE [--no-special] IDS...\n"
                   "  IDS          token ids, separated by spaces or commas (\"[1, 2, 3]\" works "
                   "too)\n"
                   "  --no-special leave control tokens (<|im_end|> ...) out of the text\n");
            tokenizer_tokens_free(&ids);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1] && (argv[i][1] < '0' || argv[i][1] > '9')) {
            fprintf(stderr, "tiermoe detokenize: unknown option '%s' (see --help)\n", argv[i]);
            rc = 2;
        } else {
            /* split on spaces, commas and brackets */
            char *s = argv[i];
            while (*s && !rc) {
                while (*s == ' ' || *s == ',' || *s == '[' || *s == ']' || *s == '\t' || *s == '\n')
                    s++;
                if (!*s) break;
                char *end;
                errno = 0;
                long v = strtol(s, &end, 10);
                if (end == s || errno || v < 0 || v > INT32_MAX ||
                    (*end && *end != ' ' && *end != ',' && *end != ']' && *end != '\t' &&
                     *end != '\n')) {
                    fprintf(stderr,
                            "tiermoe detokenize: '%s' is not a token id (expected integers >= 0)\n",
                            s);
                    rc = 2;
                    break;
                }
                if (tokenizer_tokens_push(&ids, (int32_t)v)) rc = 1;
                s = end;
            }
        }
    }
    tm_tokenizer *t = NULL;
    if (!rc && ids.n == 0) {
        fprintf(stderr, "tiermoe detokenize: no ids given (see --help)\n");
        rc = 2;
    }
    if (!rc) rc = load(model, &t);
    for (size_t i = 0; !rc && i < ids.n; i++)
        if ((uint32_t)ids.ids[i] >= tokenizer_n_tokens(t)) {
            fprintf(stderr,
                    "tiermoe detokenize: id %d is out of range (the vocabulary has %u tokens)\n",
                    ids.ids[i], tokenizer_n_tokens(t));
            rc = 1;
        }
    if (!rc) {
        char *text;
        size_t len;
        if (tokenizer_decode(t, ids.ids, ids.n, render_special, &text, &len)) {
            fprintf(stderr, "tiermoe: %s\n", tm_error_message());
            rc = 1;
        } else {
            fwrite(text, 1, len, stdout);
            fputc('\n', stdout);
            free(text);
        }
    }
    tokenizer_free(t);
    tokenizer_tokens_free(&ids);
    return rc;
}
