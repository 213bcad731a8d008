/* tok_bench: tokenizer speed on one core.
 * usage: tok_bench MODEL.gguf [--mb N] [--min-mbps X]
 * Builds N MB (default 1) of mixed text deterministically (English prose, code,
 * Chinese, Japanese, Russian, Arabic, emoji, numbers, runs of whitespace, chat
 * markup), tokenizes it in one call three times and prints the best rate.
 * Exits 1 when the rate is below --min-mbps (sanitizer builds report only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static const char *const samples[] = {
    "The quick brown fox jumps over the lazy dog. It's 12:45 and they've already left; we'll "
    "follow. ",
    "In 2023, revenue grew 17.5% to $4,321,000 while costs fell by 3.2 percent year over year.\n",
    "def tokenize(text):\n    for piece in pattern.findall(text):\n        yield bpe(piece)  # "
    "merge by rank\n\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\n",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "東京は日本の首都であり、世界有数の大都市です。カタカナも使います。",
    "Москва — столица России, крупнейший по численности населения город страны. ",
    "اللغة العربية هي إحدى أكثر اللغات انتشاراً في العالم. ",
    "Emoji time 😀🎉👍🏽 and flags 🇫🇷🇩🇪 mixed in. ",
    "    indented     with      many       spaces\t\tand\ttabs\n\n\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "{\"id\": 12345, \"name\": \"Ærøskøbing\", \"tags\": [\"a\", \"b\"], \"score\": 0.875}\n",
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: tok_bench MODEL.gguf [--mb N] [--min-mbps X]\n");
        return 2;
    }
    double mb = 1.0, min_mbps = 0.0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mb"))
            mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--min-mbps"))
            min_mbps = atof(argv[i + 1]);
    }
    tm_tokenizer *t;
    if (tokenizer_load_file(argv[1], &t)) {
        fprintf(stderr, "tok_bench: %s\n", tm_error_message());
        return 1;
    }
    size_t want = (size_t)(mb * 1024 * 1024), n = 0;
    char *text = malloc(want + 256);
    unsigned state = 12345;
    while (n < want) {
        state = state * 1103515245u + 12345u;
        const char *s = samples[(state >> 16) % (sizeof(samples) / sizeof(samples[0]))];
        size_t l = strlen(s);
        memcpy(text + n, s, l);
        n += l;
    }
    tm_tokenize_opts o = {.add_special = false, .parse_special = true};
    double best = 1e30;
    size_t n_tok = 0;
    for (int rep = 0; rep < 3; rep++) {
        tm_tokens ids = {0};
        double t0 = now_s();
        if (tokenizer_encode(t, text, n, &o, &ids)) {
            fprintf(stderr, "tok_bench: %s\n", tm_error_message());
            return 1;
        }
        double dt = now_s() - t0;
        if (dt < best) best = dt;
        n_tok = ids.n;
        tokenizer_tokens_free(&ids);
    }
    double mbps = (double)n / (1024.0 * 1024.0) / best;
#if defined(__SANITIZE_ADDRESS__)
    const int sanitized = 1;
#else
    const int sanitized = 0;
#endif
    printf("tokenize: %.2f MB of mixed text, %zu tokens, %.1f ms, %.1f MB/s (%s, one core)%s\n",
           (double)n / (1024.0 * 1024.0), n_tok, best * 1e3, mbps, tokenizer_pre_name(t),
           sanitized ? " [sanitizer build: not a speed figure]" : "");
    tokenizer_free(t);
    free(text);
    if (!sanitized && mbps < min_mbps) {
        fprintf(stderr, "tok_bench: %.1f MB/s is below the required %.1f MB/s\n", mbps, min_mbps);
        return 1;
    }
    return 0;
}
