/* The public context options (tm_context_opts, include/tiermoe.h) into the
 * engine's context parameters: what tm_context_create does with them, for the
 * tools that make contexts on the engine itself (bench, trace, serve) from the
 * same flags as `tiermoe run` (tools/cli_place.c). */
#ifndef TM_API_OPTS_H
#define TM_API_OPTS_H

#include "model/model.h"
#include "tier/plan.h"
#include "trace/trace.h"

/* Check o (tm_context_opts_check) and set p's sizes, placement, cache and
 * profile from it: every field of p but the callback and the files. Errors
 * name fn, the field and its flag. */
tm_status api_opts_params(const char *fn, const tm_context_opts *o, tm_context_params *p);
/* Read o's moe_learn and moe_cache_plan files for model m into learn and plan
 * (left empty without them; the caller frees them after the context) and
 * point p's cache options at them. Errors name fn, the field and its flag. */
tm_status api_opts_files(const char *fn, const tm_model *m, const tm_context_opts *o,
                         tm_trace_stats *learn, tm_plan *plan, tm_context_params *p);

#endif
