/* The context and sampling flags run and serve share (llama.cpp's names:
 * -c -b -t --kv-type, -s --temp --top-k --top-p --min-p --repeat-penalty
 * --repeat-last-n). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

const char cli_gen_help[] =
    "  -c, --ctx-size N       context size (default: min(4096, trained))\n"
    "  -b, --batch-size N     prompt tokens per forward chunk (default 512; with experts\n"
    "                         in RAM behind a GPU up to 4096, as VRAM allows)\n"
    "  -t, --threads N        CPU threads (default: physical cores)\n"
    "  --kv-type f16|f32      KV cache type (default f16)\n"
    "  -s, --seed N           sampling seed (default 0)\n"
    "  --temp F               temperature, 0 = greedy (default 0.8)\n"
    "  --top-k N --top-p F --min-p F --repeat-penalty F --repeat-last-n N\n";

int cli_gen_parse(cli_gen *g, const char *cmd, int argc, char **argv, int i) {
    static const char *const flags[] = {
        "-c",        "--ctx-size", "-b",      "--batch-size",     "-t",
        "--threads", "--kv-type",  "-s",      "--seed",           "--temp",
        "--top-k",   "--top-p",    "--min-p", "--repeat-penalty", "--repeat-last-n"};
    const char *a = argv[i];
    size_t k = 0;
    while (k < sizeof(flags) / sizeof(flags[0]) && strcmp(a, flags[k])) k++;
    if (k == sizeof(flags) / sizeof(flags[0])) return 0;
    if (i + 1 >= argc) {
        fprintf(stderr, "tiermoe %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[i + 1];
    long long n;
    double d;
    tm_context_opts *o = g->o;
    tm_sampler_params *sp = g->sp;
    if (!strcmp(a, "--kv-type")) {
        if (!strcmp(v, "f16"))
            o->kv_f32 = false;
        else if (!strcmp(v, "f32"))
            o->kv_f32 = true;
        else {
            fprintf(stderr, "tiermoe %s: --kv-type: expected f16 or f32, got '%s'\n", cmd, v);
            return -1;
        }
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if (cli_parse_i64(a, v, 1, 1 << 24, &n)) return -1;
        o->n_ctx = n;
    } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
        if (cli_parse_i64(a, v, 1, 1 << 16, &n)) return -1;
        o->n_batch = n;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (cli_parse_i64(a, v, 1, 1024, &n)) return -1;
        o->n_threads = (int32_t)n;
    } else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
        if (cli_parse_i64(a, v, 0, 0x7fffffffffffffffll, &n)) return -1;
        sp->seed = (uint64_t)n, g->seed_given = true;
    } else if (!strcmp(a, "--temp")) {
        if (cli_parse_f64(a, v, 0, 100, &d)) return -1;
        sp->temp = (float)d;
    } else if (!strcmp(a, "--top-k")) {
        if (cli_parse_i64(a, v, 0, 1 << 24, &n)) return -1;
        sp->top_k = (int32_t)n;
    } else if (!strcmp(a, "--top-p")) {
        if (cli_parse_f64(a, v, 1e-9, 1, &d)) return -1;
        sp->top_p = (float)d;
    } else if (!strcmp(a, "--min-p")) {
        if (cli_parse_f64(a, v, 0, 1, &d)) return -1;
        sp->min_p = (float)d;
    } else if (!strcmp(a, "--repeat-penalty")) {
        if (cli_parse_f64(a, v, 1e-3, 100, &d)) return -1;
        sp->repeat_penalty = (float)d;
    } else {
        if (cli_parse_i64(a, v, 0, 1 << 24, &n)) return -1;
        sp->repeat_last_n = (int32_t)n;
    }
    return 2;
}
