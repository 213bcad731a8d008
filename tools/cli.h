/* The CLI's subcommands; each lives in tools/cmd_<name>.c and returns the
 * process exit code (0 ok, 1 runtime failure, 2 usage error). */
#ifndef TM_TOOLS_CLI_H
#define TM_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "sample/sample.h"
#include "tier/plan.h"
#include "trace/trace.h"

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
/* -ngl: a layer count, "all", or "auto" (TM_NGL_AUTO). */
int cli_parse_ngl(const char *flag, const char *s, int *out);

/* ---- context and sampling flags of run and serve (cli_gen.c) ---- */
typedef struct cli_gen {
    tm_context_params *cp; /* -c -b -t --kv-type */
    tm_sampler_params *sp; /* -s --temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n */
    bool seed_given;       /* -s was given */
} cli_gen;
extern const char cli_gen_help[];
/* argv[i] may be one of those flags: returns the arguments it took (0: not
 * one; -1: bad value, a message printed naming cmd and the flag). */
int cli_gen_parse(cli_gen *g, const char *cmd, int argc, char **argv, int i);

/* ---- placement flags (cli_place.c) ---- */
typedef struct cli_place {
    int ngl;
    bool ngl_given;
    bool cpu_moe;
    int n_cpu_moe;
    char *overrides; /* every -ot, joined by ',' */
    int64_t cache_mib;
    const char *learn_path;
    int pcie;                /* --moe-pcie (TM_MOE_PCIE_AUTO unless given) */
    int fetch;               /* --moe-fetch (TM_MOE_FETCH_AUTO unless given) */
    int ahead;               /* --moe-ahead (TM_MOE_AHEAD_AUTO unless given) */
    int64_t ram_cache_mib;   /* --ram-cache (0: none, TM_RAM_CACHE_AUTO) */
    const char *plan_path;   /* --moe-cache-plan */
    tm_moe_cache_opts cache; /* --moe-cache-weighting, -curve, -update, -policy, -admit */
    tm_trace_stats learn;    /* the --moe-learn file, once applied */
    tm_plan plan;            /* the --moe-cache-plan file, once applied */
} cli_place;
extern const char cli_place_help[];
/* argv[i] may be a placement flag: returns the arguments it took (0: not one;
 * -1: bad value, a message printed naming cmd and the flag). */
int cli_place_parse(cli_place *p, const char *cmd, int argc, char **argv, int i);
/* Into context parameters, once the model is loaded (the learn file is checked
 * against its shape); an expert flag without -ngl means -ngl auto. 0 or 1. */
int cli_place_apply(cli_place *p, const char *cmd, const tm_model *m, tm_context_params *cp);
void cli_place_free(cli_place *p);
/* --profile: time by part, the CPU lane's thread time, the MoE step by layer
 * class; each since the marks (NULL: since the start), per run. */
void cli_profile_print(const tm_context *ctx, const uint64_t *prof0, const tm_moe_lane_stats *lane0,
                       const tm_tier_stats *tier0, int runs, FILE *out);

/* The SSD tier's counters since s0 (NULL: the start) over wall_s seconds:
 * experts faulted and bytes read per token, hit rate, read rate. Nothing
 * without --ram-cache. */
void cli_store_print(const tm_context *ctx, const tm_store_stats *s0, double wall_s, FILE *out);

#endif
