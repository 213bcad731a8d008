/* The tracer's switches from the environment (TIERMOE_EXPERT_TRACE_*) and
 * from command-line flags (--expert-trace-*); flags given after the
 * environment is read override it. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "trace/trace.h"

const char trace_config_help[] =
    "  --expert-trace-stats        count expert selections per layer, print a summary at the end\n"
    "  --expert-trace-names        log every routed slot with its expert's tensors\n"
    "  --expert-trace-per-layer    print the per-layer table at the end\n"
    "  --expert-trace-output FILE  write the learn/perf JSON (FILE.csv: CSV) at the end\n"
    "  (or TIERMOE_EXPERT_TRACE_STATS / _NAMES / _PER_LAYER =1, "
    "TIERMOE_EXPERT_TRACE_OUTPUT=FILE)\n";

static tm_status env_bool(const char *name, bool *out) {
    const char *v = getenv(name);
    if (!v || !*v) return TM_OK;
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "on") || !strcasecmp(v, "yes"))
        *out = true;
    else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "off") ||
             !strcasecmp(v, "no"))
        *out = false;
    else
        return tm_error_set(TM_ERR_ARG, "%s=%s: expected 1 or 0 (true/false, on/off)", name, v);
    return TM_OK;
}

tm_status trace_config_from_env(tm_trace_config *c) {
    tm_status st;
    if ((st = env_bool("TIERMOE_EXPERT_TRACE_STATS", &c->stats)) ||
        (st = env_bool("TIERMOE_EXPERT_TRACE_NAMES", &c->names)) ||
        (st = env_bool("TIERMOE_EXPERT_TRACE_PER_LAYER", &c->per_layer)))
        return st;
    const char *o = getenv("TIERMOE_EXPERT_TRACE_OUTPUT");
    if (o && *o) c->output = o;
    return TM_OK;
}

int trace_config_parse_arg(tm_trace_config *c, int argc, char **argv, int i) {
    const char *a = argv[i];
    if (strncmp(a, "--expert-trace-", 15)) return 0;
    a += 15;
    if (!strcmp(a, "stats")) return c->stats = true, 1;
    if (!strcmp(a, "names")) return c->names = true, 1;
    if (!strcmp(a, "per-layer")) return c->per_layer = true, 1;
    if (!strcmp(a, "output")) {
        if (i + 1 >= argc || !argv[i + 1][0]) {
            fprintf(stderr, "tiermoe: --expert-trace-output needs a FILE\n");
            return -1;
        }
        c->output = argv[i + 1];
        return 2;
    }
    return 0;
}

bool trace_config_enabled(const tm_trace_config *c) {
    return c->stats || c->names || c->per_layer || c->output;
}
