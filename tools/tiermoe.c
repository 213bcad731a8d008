/* tiermoe: run Mixture-of-Experts models from GGUF across VRAM, RAM and SSD.
 * This file only dispatches to the subcommands in tools/cmd_*.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} cli_command;

static const cli_command commands[] = {
    {"run", cmd_run, "generate text or token ids from a prompt"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with the perf and hot-cache endpoints"},
    {"bench", cmd_bench, "measure prompt and generation speed (llama-bench style)"},
    {"trace", cmd_trace,
     "learn pass: trace expert usage over prompts into a learn file (or merge them)"},
    {"report", cmd_report,
     "show a learn file: top experts, skew, working set; SVG heatmap, CSV; replay cache policies"},
    {"plan", cmd_plan, "plan the VRAM expert cache from learn files and a budget"},
    {"inspect", cmd_inspect,
     "show a GGUF file: architecture, hyper-parameters, tensors, expert bytes"},
    {"calibrate", cmd_calibrate,
     "measure this machine's costs for the tier's lane decisions and save the profile"},
    {"mkmodel", cmd_mkmodel, "write a synthetic random-weight MoE model (qwen3moe)"},
    {"tokenize", cmd_tokenize, "show the token ids of a text with a GGUF file's tokenizer"},
    {"detokenize", cmd_detokenize, "show the text of token ids with a GGUF file's tokenizer"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: tiermoe COMMAND [options]   (tiermoe COMMAND --help for its options)\n\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int cli_parse_i64(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tiermoe: %s: expected an integer in [%lld, %lld], got '%s'\n", flag, lo,
                hi, s);
        return 2;
    }
    *out = v;
    return 0;
}

int cli_parse_f64(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "tiermoe: %s: expected a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return 2;
    }
    *out = v;
    return 0;
}

int cli_parse_ngl(const char *flag, const char *s, int *out) {
    if (!strcmp(s, "auto")) {
        *out = TM_AUTO;
        return 0;
    }
    if (!strcmp(s, "all")) {
        *out = 1 << 20;
        return 0;
    }
    long long v;
    if (cli_parse_i64(flag, s, 0, 1 << 20, &v)) {
        fprintf(stderr, "tiermoe: %s: or 'auto' (as many layers as fit) or 'all'\n", flag);
        return 2;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tiermoe: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
