/* The expert tracer's switches of run, bench and serve, from the environment
 * (TIERMOE_EXPERT_TRACE_*) and from flags (--expert-trace-*); flags given
 * after the environment is read override it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

const char cli_trace_help[] =
    "  --expert-trace-stats        count expert selections per layer, print a summary at the end\n"
    "  --expert-trace-names        log every routed slot with its expert's tensors\n"
    "  --expert-trace-per-layer    print the per-layer table at the end\n"
    "  --expert-trace-output FILE  write the learn/perf JSON (FILE.csv: CSV) at the end\n"
    "  (or TIERMOE_EXPERT_TRACE_STATS / _NAMES / _PER_LAYER =1, "
    "TIERMOE_EXPERT_TRACE_OUTPUT=FILE)\n";

/* A boolean variable (unset or empty: *out unchanged); 0, or 2 after a message. */
static int env_bool(const char *cmd, const char *name, bool *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "on") || !strcasecmp(v, "yes"))
        *out = true;
    else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "off") ||
             !strcasecmp(v, "no"))
        *out = false;
    else {
        fprintf(stderr, "tiermoe %s: %s=%s: expected 1 or 0 (true/false, on/off)\n", cmd, name, v);
        return 2;
    }
    return 0;
}

int cli_trace_from_env(cli_trace *t, const char *cmd) {
    if (env_bool(cmd, "TIERMOE_EXPERT_TRACE_STATS", &t->stats) ||
        env_bool(cmd, "TIERMOE_EXPERT_TRACE_NAMES", &t->names) ||
        env_bool(cmd, "TIERMOE_EXPERT_TRACE_PER_LAYER", &t->per_layer))
        return 2;
    const char *o = getenv("TIERMOE_EXPERT_TRACE_OUTPUT");
    if (o && *o) t->output = o;
    return 0;
}

int cli_trace_parse(cli_trace *t, int argc, char **argv, int i) {
    const char *a = argv[i];
    if (strncmp(a, "--expert-trace-", 15)) return 0;
    a += 15;
    if (!strcmp(a, "stats")) return t->stats = true, 1;
    if (!strcmp(a, "names")) return t->names = true, 1;
    if (!strcmp(a, "per-layer")) return t->per_layer = true, 1;
    if (!strcmp(a, "output")) {
        if (i + 1 >= argc || !argv[i + 1][0]) {
            fprintf(stderr, "tiermoe: --expert-trace-output needs a FILE\n");
            return -1;
        }
        t->output = argv[i + 1];
        return 2;
    }
    return 0;
}

bool cli_trace_enabled(const cli_trace *t) {
    return t->stats || t->names || t->per_layer || t->output;
}
