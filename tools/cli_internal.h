/* What the developer tools on the engine's internals (bench, trace, serve,
 * calibrate, inspect, mkmodel, plan, report) share beyond cli.h: the context
 * flags turned into the engine's parameters (cli_engine.c). */
#ifndef TM_TOOLS_CLI_INTERNAL_H
#define TM_TOOLS_CLI_INTERNAL_H

#include "cli.h"
#include "model/model.h"
#include "sample/sample.h"
#include "tier/plan.h"
#include "trace/trace.h"

/* The files --moe-learn and --moe-cache-plan name, read for a context. */
typedef struct cli_files {
    tm_trace_stats learn;
    tm_plan plan;
} cli_files;
void cli_files_free(cli_files *f);

/* The context flags (cli_gen, cli_place: p->o) into cp for model m, the
 * files read into f (replacing what it held). 0, or 1 after a message naming
 * cmd and the flag. */
int cli_place_apply(const cli_place *p, const char *cmd, const tm_model *m, cli_files *f,
                    tm_context_params *cp);

/* The tracer's switches as the tracer takes them. */
tm_trace_config cli_trace_config(const cli_trace *t);

#endif
