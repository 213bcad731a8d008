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
    return 0;
}

tm_trace_config cli_trace_config(const cli_trace *t) {
    return (tm_trace_config){
        .stats = t->stats, .names = t->names, .per_layer = t->per_layer, .output = t->output};
}
