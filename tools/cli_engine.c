/* The context flags of cli_gen and cli_place, parsed into the public options,
 * turned into the engine's parameters for the tools that make their contexts
 * on the engine itself (bench, trace, serve): the same conversion as
 * tm_context_create's (src/api/api_opts.h). */
#include <stdio.h>
#include <string.h>

#include "api/api_opts.h"
#include "cli_internal.h"

void cli_files_free(cli_files *f) {
    trace_stats_free(&f->learn);
    plan_free(&f->plan);
    memset(f, 0, sizeof(*f));
}

/* One GPU-list flag's value into o (the parsers name the flag). */
static tm_status cli_place_gpu_parse(const char *flag, const char *v, tm_gpu_opts *o) {
    if (!strcmp(flag, "-dev") || !strcmp(flag, "--device")) return gpus_devices_parse(flag, v, o);
    if (!strcmp(flag, "-sm") || !strcmp(flag, "--split-mode"))
        return gpus_split_mode_parse(flag, v, o);
    if (!strcmp(flag, "-ts") || !strcmp(flag, "--tensor-split"))
        return gpus_split_parse(flag, v, o);
    if (!strcmp(flag, "--moe-cache")) return gpus_cache_parse(flag, v, o);
    return gpus_main_parse(flag, v, o);
}

int cli_place_gpu_check(const char *cmd, const char *flag, const char *v, long long *mib) {
    tm_gpu_opts o = {0};
    if (cli_place_gpu_parse(flag, v, &o) != TM_OK) {
        fprintf(stderr, "tiermoe %s: %s\n", cmd, tm_error_message());
        return -1;
    }
    if (mib) {
        *mib = 0;
        for (int i = 0; i < o.n_cache; i++) *mib += o.cache_mib[i];
    }
    return 0;
}

int cli_place_apply(const cli_place *p, const char *cmd, const tm_model *m, cli_files *f,
                    tm_context_params *cp) {
    cli_files_free(f);
    char fn[64]; /* messages start "tiermoe CMD: " as the CLI's own */
    snprintf(fn, sizeof(fn), "tiermoe %s", cmd);
    if (api_opts_params(fn, p->o, cp) != TM_OK ||
        api_opts_files(fn, m, p->o, &f->learn, &f->plan, cp) != TM_OK) {
        fprintf(stderr, "%s\n", tm_error_message());
        return 1;
    }
    const char *const flags[] = {"-dev", "--split-mode", "--tensor-split", "-mg", "--moe-cache"};
    const char *const vals[] = {p->devices, p->split_mode, p->tensor_split, p->main_gpu,
                                p->cache_each};
    for (int i = 0; i < 5; i++)
        if (vals[i] && cli_place_gpu_parse(flags[i], vals[i], &cp->gpus) != TM_OK) {
            fprintf(stderr, "%s: %s\n", fn, tm_error_message());
            return 1;
        }
    return 0;
}

tm_trace_config cli_trace_config(const cli_trace *t) {
    return (tm_trace_config){
        .stats = t->stats, .names = t->names, .per_layer = t->per_layer, .output = t->output};
}
