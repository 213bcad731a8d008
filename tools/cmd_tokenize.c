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

/* The vocabulary of model (tm_model_load_vocab: a file of only a vocabulary
 * works too); 0, or the exit code after a message. */
static int load(const char *model, tm_model **m) {
    if (!model) {
        fprintf(stderr, "tiermoe: -m FILE is required (a GGUF file with tokenizer.ggml.* keys)\n");
        return 2;
    }
    if (tm_model_load_vocab(model, m) != TM_OK) {
        fprintf(stderr, "tiermoe: %s\n", tm_error_message());
        return 1;
    }
    return 0;
}

static const char *type_note(tm_token_type ty) {
    return ty == TM_TOKEN_TYPE_CONTROL        ? "  (control)"
           : ty == TM_TOKEN_TYPE_BYTE         ? "  (byte)"
           : ty == TM_TOKEN_TYPE_USER_DEFINED ? "  (user-defined)"
                                              : "";
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *text = NULL;
    bool ids_only = false, add_special = true, parse_special = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "-f") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(argv[i], "--ids"))
            ids_only = true;
        else if (!strcmp(argv[i], "--no-bos"))
            add_special = false;
        else if (!strcmp(argv[i], "--no-parse-special"))
            parse_special = false;
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
    tm_model *m = NULL;
    int rc = load(model, &m);
    if (rc) {
        free(buf);
        return rc;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tm_vocab_info vi;
    tm_status st = cli_tokenize(m, buf ? buf : text, len, add_special, parse_special, &ids, &n_ids);
    if (st == TM_OK) st = tm_vocab_describe(m, &vi);
    if (st != TM_OK) {
        fprintf(stderr, "tiermoe: %s\n", st == TM_ERR_NOMEM ? "out of memory" : tm_error_message());
        rc = 1;
    } else if (ids_only) {
        for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    } else {
        for (size_t i = 0; i < n_ids; i++) {
            tm_token_info ti = {0};
            tm_token_describe(m, ids[i], &ti); /* an id the tokenizer gave: in range */
            printf("%8d  '", ids[i]);
            put_escaped(stdout, ti.text, ti.len);
            printf("'%s\n", type_note(ti.type));
        }
        printf("%zu tokens, %zu bytes, tokenizer %s/%s\n", n_ids, len, vi.model, vi.pre);
    }
    free(ids);
    tm_model_free(m);
    free(buf);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    bool render_special = true;
    int32_t *ids = NULL;
    size_t n_ids = 0, cap = 0;
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
            free(ids);
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
                if (n_ids == cap) {
                    int32_t *grown = realloc(ids, (cap = cap ? 2 * cap : 64) * sizeof(int32_t));
                    if (!grown) {
                        rc = 1;
                        break;
                    }
                    ids = grown;
                }
                ids[n_ids++] = (int32_t)v;
                s = end;
            }
        }
    }
    tm_model *m = NULL;
    tm_vocab_info vi = {0};
    if (!rc && n_ids == 0) {
        fprintf(stderr, "tiermoe detokenize: no ids given (see --help)\n");
        rc = 2;
    }
    if (!rc) rc = load(model, &m);
    if (!rc && tm_vocab_describe(m, &vi) != TM_OK) {
        fprintf(stderr, "tiermoe: %s\n", tm_error_message());
        rc = 1;
    }
    for (size_t i = 0; !rc && i < n_ids; i++)
        if ((uint32_t)ids[i] >= vi.n_tokens) {
            fprintf(stderr,
                    "tiermoe detokenize: id %d is out of range (the vocabulary has %u tokens)\n",
                    ids[i], vi.n_tokens);
            rc = 1;
        }
    size_t len = 0;
    char *text = NULL;
    if (!rc) {
        /* the size first (a capacity of 0 asks for it: TM_ERR_ARG), then the text */
        tm_status st = tm_detokenize(m, ids, n_ids, render_special, NULL, 0, &len);
        if (st == TM_ERR_ARG && (text = malloc(len + 1)))
            st = tm_detokenize(m, ids, n_ids, render_special, text, len + 1, &len);
        if (st != TM_OK) {
            fprintf(stderr, "tiermoe: %s\n", text ? tm_error_message() : "out of memory");
            rc = 1;
        } else {
            fwrite(text, 1, len, stdout);
            fputc('\n', stdout);
        }
    }
    free(text);
    tm_model_free(m);
    free(ids);
    return rc;
}
