/* Expert usage tracer, perf counters and learn/perf files.
 *
 * What it records, per layer (tm_trace_layer): forward calls, tokens, routed
 * slots (expert_hits_total = tokens * n_expert_used), per-expert selection
 * counts, hot/cold served counts (0 until the GPU lanes exist: today every
 * slot runs on the CPU lane and no hot/cold split is made), timings, the
 * working set (distinct experts over a sliding window of the last W tokens;
 * sampled once per token once W tokens of a sequence were seen) and
 * token-to-token reuse (experts of token t also used by token t-1) and
 * window reuse (experts of token t used by any of the previous
 * TM_TRACE_REUSE_WINDOW tokens, counted once a sequence has that many).
 *
 * How it is fed: trace_attach() installs trace_tensor_cb as the context's
 * named-intermediate callback (chaining any callback already set).
 * The tracer sits below the model and the tier and knows neither: the caller
 * hands in the shape, the routing label and (trace_set_resident) who is in
 * VRAM; model_trace_create (model.h) does it for a loaded model. Per layer
 * the forward emits, in this order, "attn_out", "router_logits", "topk_ids",
 * "topk_weights", "ffn_out"; the tracer counts "topk_ids" (int32 [n_tok][k])
 * and takes timestamps at attn_out / topk_ids / ffn_out:
 *   routing_time_ns  attn_out -> topk_ids  (ffn norm, router product, top-k, worklist)
 *   experts_time_ns  topk_ids -> ffn_out   (expert lane and the residual add)
 *   merge_time_ns, wait_time_ns            0 until hot/cold lanes run in parallel
 * With tracing off the context's callback stays NULL: the engine's cost is the
 * NULL check it already makes. One tracer serves one thread at a time.
 *
 * Files: tm_trace_stats is what a learn/perf JSON file holds
 * (docs/trace-format.md); trace_stats_from_json is the one parser for learn
 * files, GET /moe-layer-perf payloads, the planner and the updater. */
#ifndef TM_TRACE_TRACE_H
#define TM_TRACE_TRACE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_TRACE_FORMAT         "tiermoe-moe-layer-perf"
#define TM_TRACE_VERSION        1
#define TM_TRACE_WINDOW_DEFAULT 32
#define TM_TRACE_MAX_EXPERT     4096
#define TM_TRACE_MAX_LAYER      4096
#define TM_TRACE_MAX_USED       64
#define TM_TRACE_REUSE_WINDOW   8 /* W' of the window reuse */

typedef struct tm_trace_shape {
    char arch[32];
    uint32_t n_layer, n_expert, n_expert_used;
} tm_trace_shape;

typedef struct tm_trace_layer {
    uint64_t calls, tokens;
    uint64_t expert_hits_total, hot_slots_total, cold_slots_total;
    uint64_t routing_ns, experts_ns, merge_ns, wait_ns;
    uint64_t ws_sum, ws_samples, ws_max; /* working set: sum/count of samples, largest */
    uint64_t reuse_shared, reuse_pairs;  /* experts shared with the previous token; token pairs */
    uint64_t reuse_win_shared, reuse_win_tokens;    /* experts one of the previous reuse_window
                                                    tokens used; tokens that had that many */
    uint64_t *experts, *hot_experts, *cold_experts; /* [n_expert] each */
} tm_trace_layer;

typedef struct tm_trace_stats {
    tm_trace_shape shape;
    uint32_t window;        /* W of the working set */
    uint32_t reuse_window;  /* W' of reuse_win_* (0: read from a file that has none) */
    char routing[96];       /* synthetic routing of the model (synth_routing_label), "" if none */
    uint64_t tokens;        /* tokens through the model (layer 0's tokens) */
    tm_trace_layer *layers; /* [n_layer] */
} tm_trace_stats;

/* Zeroed counters for a shape; window 0 means TM_TRACE_WINDOW_DEFAULT. */
tm_status trace_stats_init(tm_trace_stats *s, const tm_trace_shape *shape, uint32_t window);
void trace_stats_free(tm_trace_stats *s);
/* true when every field and count is equal. */
bool trace_stats_equal(const tm_trace_stats *a, const tm_trace_stats *b);

/* ---- files (trace_file.c) ---- */

/* The JSON object of docs/trace-format.md (new reference), or NULL out of memory. */
json_t *trace_stats_to_json(const tm_trace_stats *s);
/* Parse and validate a JSON object; `origin` (a file name or "request body")
 * is named in errors with the offending field ("layers[3].experts[7]").
 * expect (may be NULL) is the loaded model's shape: a different layer,
 * expert or expert-used count is an error. */
tm_status trace_stats_from_json(const json_t *root, const char *origin,
                                const tm_trace_shape *expect, tm_trace_stats *out);
/* Write JSON atomically (path.tmp, then rename). */
tm_status trace_stats_write_json(const tm_trace_stats *s, const char *path);
tm_status trace_stats_read_json(const char *path, const tm_trace_shape *expect,
                                tm_trace_stats *out);
/* JSON pieces other file formats of the same model share (plan files):
 * - the top level is an object with this "format" string and "version";
 * - "model": {"arch", "n_layer", "n_expert", "n_expert_used"} in range and,
 *   when expect is given, equal to it;
 * - a non-negative integer field (where: the path before key, "layers[3].");
 * - a file loaded (duplicate keys refused), errors naming path, line and column.
 * Errors name origin and the field. */
tm_status trace_json_check_format(const json_t *root, const char *origin, const char *format,
                                  int version);
tm_status trace_shape_from_json(const json_t *root, const char *origin,
                                const tm_trace_shape *expect, tm_trace_shape *out);
tm_status trace_json_u64(const json_t *o, const char *key, const char *origin, const char *where,
                         uint64_t *out);
tm_status trace_json_load(const char *path, json_t **out);
/* CSV: header "layer,expert,hits,hot,cold,share", one row per layer and expert. */
tm_status trace_stats_write_csv(const tm_trace_stats *s, const char *path);
/* The CSV for a path ending in ".csv", else the JSON. */
tm_status trace_stats_write(const tm_trace_stats *s, const char *path);
/* dst += src (counts and timings summed, working-set max the larger); the
 * shapes and windows must match. src_name is named in errors. */
tm_status trace_stats_merge(tm_trace_stats *dst, const tm_trace_stats *src, const char *src_name);

/* ---- skew numbers for reports (trace_file.c) ---- */
typedef struct tm_trace_skew {
    double entropy;    /* -sum p log p / log n_expert, p = share of the layer's hits; 1 = uniform */
    double top1;       /* share of hits of the most used expert */
    double top[3];     /* share of hits covered by the top 10%, 25%, 50% of experts */
    uint32_t n_top[3]; /* how many experts that is: ceil(frac * n_expert) */
    uint32_t n_used;   /* experts with at least one hit */
} tm_trace_skew;
void trace_layer_skew(const tm_trace_stats *s, uint32_t layer, tm_trace_skew *out);

/* ---- switches (the CLI reads them: tools/cli_trace.c) ---- */
typedef struct tm_trace_config {
    bool stats;              /* count (--expert-trace-stats) */
    bool names;              /* a log line per routed slot naming the expert's tensors */
    bool per_layer;          /* print the per-layer table at the end (not only the summary) */
    const char *output;      /* write the learn/perf JSON here at the end (".csv": CSV) */
    uint32_t window;         /* working-set window (0: default) */
    const char *routing_log; /* write every call's top-k ids here (trace_log.h); NULL: none */
    FILE *log;               /* where names and summaries go (NULL: stderr) */
} tm_trace_config;

/* ---- the live tracer (trace.c) ---- */
typedef struct tm_trace tm_trace;

/* A tracer of a model of this shape; routing (may be NULL: "") is the label
 * of its synthetic routing, kept in the stats. */
tm_status trace_create(const tm_trace_config *cfg, const tm_trace_shape *shape, const char *routing,
                       tm_trace **out);
void trace_free(tm_trace *t);
/* A named-intermediate callback: the same type as tm_tensor_cb (exec/exec.h). */
typedef void (*tm_trace_tensor_fn)(void *ud, const char *name, int layer, const void *data,
                                   int64_t n_tok, int64_t n, bool is_int);
/* Make the tracer see a context's intermediates: *cb and *cb_ud are the
 * context parameters' (&p.cb, &p.cb_ud); call before model_context_create.
 * Any callback already there is still called. */
void trace_attach(tm_trace *t, tm_trace_tensor_fn *cb, void **cb_ud);
/* The callback trace_attach installs (ud = the tracer). */
void trace_tensor_cb(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                     int64_t n, bool is_int);
/* Whether expert `expert` of `layer` is served from VRAM right now (the hot
 * lane: a layer on the GPU, or a slot of the VRAM cache). With one set, each
 * routed slot counts as hot or cold (hot_experts / cold_experts and the
 * layers' hot_slots_total / cold_slots_total); without, neither. */
typedef bool (*tm_trace_resident_fn)(void *ud, uint32_t layer, int32_t expert);
void trace_set_resident(tm_trace *t, tm_trace_resident_fn fn, void *ud);
/* A new sequence starts (context reset): working set and reuse forget the past. */
void trace_sequence_begin(tm_trace *t);
/* Count one forward call of `layer` routing n_tok tokens to ids [n_tok][n_expert_used]. */
void trace_record(tm_trace *t, uint32_t layer, const int32_t *ids, int64_t n_tok);
const tm_trace_stats *trace_get_stats(const tm_trace *t);
/* Zero the counters (GET/POST /moe-layer-perf "reset"); the current
 * sequence's working-set and reuse windows go on. */
void trace_reset(tm_trace *t);
/* Print the summary (and per-layer table when asked) to the log and write
 * the output file when one was given. */
tm_status trace_finish(tm_trace *t);
/* The summary / per-layer table of any stats. */
void trace_stats_print(const tm_trace_stats *s, bool per_layer, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
