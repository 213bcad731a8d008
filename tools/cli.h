/* The CLI's subcommands; each lives in tools/cmd_<name>.c and returns the
 * process exit code (0 ok, 1 runtime failure, 2 usage error).
 *
 * This header and the files that include only it (tiermoe.c, cmd_run.c,
 * cmd_tokenize.c, cmd_serve.c, cli_gen.c, cli_place.c, cli_text.c, cli_trace.c) use the
 * public API alone (include/tiermoe.h; cmd_serve.c also the server's server.h, itself on
 * the API): CMake compiles them without src/ on the include path. The developer tools on the engine's internals include cli_internal.h. */
#ifndef TM_TOOLS_CLI_H
#define TM_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tiermoe.h"

int cmd_inspect(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
/* tiermoe report --replay LOG ... (report_replay.c) */
int report_replay(int argc, char **argv);

/* Shared flag parsing: strict numbers with a clear message naming the flag. */
int cli_parse_i64(const char *flag, const char *s, long long lo, long long hi, long long *out);
int cli_parse_f64(const char *flag, const char *s, double lo, double hi, double *out);
/* -ngl: a layer count, "all", or "auto" (TM_AUTO). */
int cli_parse_ngl(const char *flag, const char *s, int *out);

/* The ids of text[0..len) (tm_tokenize's flags) into *ids, grown with realloc
 * (free it), *n of them: the API's status (TM_ERR_NOMEM here without a
 * message). */
tm_status cli_tokenize(const tm_model *m, const char *text, size_t len, bool add_special,
                       bool parse_special, int32_t **ids, size_t *n);

/* ---- context and sampling flags of run and serve (cli_gen.c) ---- */
typedef struct cli_gen {
    tm_context_opts *o;    /* -c -b -t --kv-type */
    tm_sampler_params *sp; /* -s --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n */
    bool seed_given;       /* -s was given */
} cli_gen;
extern const char cli_gen_help[];
/* argv[i] may be one of those flags: returns the arguments it took (0: not
 * one; -1: bad value, a message printed naming cmd and the flag). */
int cli_gen_parse(cli_gen *g, const char *cmd, int argc, char **argv, int i);

/* ---- placement flags (cli_place.c) ---- */
typedef struct cli_place {
    tm_context_opts *o; /* where the flags' values go */
    int ngl;            /* -ngl (o->n_gpu_layers is set from it by cli_place_finish) */
    bool ngl_given;
    char *overrides; /* every -ot, joined by ',' (o->override_tensor points here until
                        cli_place_free) */
} cli_place;
extern const char cli_place_help[];
/* argv[i] may be a placement flag: returns the arguments it took (0: not one;
 * -1: bad value, a message printed naming cmd and the flag). */
int cli_place_parse(cli_place *p, const char *cmd, int argc, char **argv, int i);
/* After the flags: an expert flag without -ngl means -ngl auto; --moe-learn
 * without a cache is said to be of no use. */
void cli_place_finish(cli_place *p, const char *cmd);
void cli_place_free(cli_place *p);

/* ---- the expert tracer's switches (cli_trace.c) ---- */
typedef struct cli_trace {
    bool stats;         /* --expert-trace-stats: count, print a summary at the end */
    bool names;         /* --expert-trace-names: a line per routed slot */
    bool per_layer;     /* --expert-trace-per-layer: the per-layer table at the end */
    const char *output; /* --expert-trace-output FILE: the learn/perf JSON (".csv": CSV) */
} cli_trace;
extern const char cli_trace_help[];
/* Read TIERMOE_EXPERT_TRACE_STATS / _NAMES / _PER_LAYER (0/1/true/false/on/off/
 * yes/no) and _OUTPUT (a path); flags parsed afterwards override them. 0, or 2
 * after a message naming cmd and the variable. */
int cli_trace_from_env(cli_trace *t, const char *cmd);
/* argv[i] may be a trace switch: returns the arguments it took (0: not one;
 * -1: FILE missing, a message printed). */
int cli_trace_parse(cli_trace *t, int argc, char **argv, int i);
/* Whether any switch asks for the tracer (an output file implies the counts). */
bool cli_trace_enabled(const cli_trace *t);

#endif
