/* generate: complete a prompt with libtiermoe (include/tiermoe.h).
 *   cc generate.c $(pkg-config --cflags --libs tiermoe) -o generate
 *   ./generate MODEL.gguf "The capital of France is" [N_TOKENS] [TEMP] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tiermoe.h>

static int fail(const char *what) {
    fprintf(stderr, "generate: %s: %s\n", what, tm_error_message());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [N_TOKENS] [TEMP]\n", argv[0]);
        return 2;
    }
    const int n_predict = argc > 3 ? atoi(argv[3]) : 32;
    tm_model *m = NULL;
    tm_context *c = NULL;
    tm_sampler *s = NULL;
    int32_t ids[4096];
    size_t n = 0;
    if (tm_model_load(argv[1], &m) != TM_OK) return fail("load");
    tm_context_opts o;
    tm_context_opts_init(&o);
    o.n_ctx = 4096;
    tm_sampler_params sp;
    tm_sampler_params_init(&sp);
    sp.temp = argc > 4 ? (float)atof(argv[4]) : 0; /* greedy unless a temperature is given */
    if (tm_context_create(m, &o, &c) != TM_OK) return fail("context");
    if (tm_sampler_create(m, &sp, &s) != TM_OK) return fail("sampler");
    if (tm_tokenize(m, argv[2], strlen(argv[2]), true, false, ids, 4096, &n) != TM_OK)
        return fail("tokenize");
    if (tm_eval(c, 0, ids, (int64_t)n) != TM_OK) return fail("prompt");
    fputs(argv[2], stdout);
    for (int i = 0; i < n_predict; i++) {
        int32_t id;
        bool end;
        const char *piece;
        size_t len;
        if (tm_sample(s, c, 0, &id) != TM_OK || tm_token_is_end(m, id, &end) != TM_OK)
            return fail("sample");
        if (end) break;
        if (tm_token_piece(m, id, &piece, &len) == TM_OK) fwrite(piece, 1, len, stdout);
        fflush(stdout);
        if (tm_eval(c, 0, &id, 1) != TM_OK) return fail("eval");
    }
    putchar('\n');
    tm_sampler_free(s);
    tm_context_free(c);
    tm_model_free(m);
    return 0;
}
