/* The hot-cache planner and plan files (docs/plan-format.md).
 *
 * Input: a learn/perf file's observations (tm_trace_stats: per layer and
 * expert the selection counts, per layer the timings, wait and cold slots),
 * a VRAM budget in bytes, the bytes of one expert of each layer, which
 * layers may be cached (a layer whose experts are all in VRAM already is
 * not), and a weighting mode with a layer curve c. Output: per layer the
 * experts to copy into VRAM slots, best first.
 *
 * Every candidate (layer l, expert e) gets a score
 *     score(l, e) = P_l^c * v(l, e) / bytes_l
 * where v is the expert's share of the layer's routed slots (balanced: the
 * rank value 1 / (1 + rank of e in its layer)) and P_l the layer's priority
 * from the mode (normalised to mean 1 over the cacheable layers):
 *   flat             P = 1: one ranking of every layer's experts by share,
 *                    so the best experts of all layers interleave (most
 *                    expected hits for the bytes)
 *   pressure         P = what a cold slot of the layer costs: wait per cold
 *                    slot when the file has a hot/cold split, else expert
 *                    time per routed slot
 *   smooth_pressure  P = sqrt(pressure / median, clamped to [1/4, 4]):
 *                    outlier layers damped
 *   time             P = the layer's MoE time (routing + experts + merge + wait)
 *   balanced         P = 1, v by rank: the r-th best expert of every layer
 *                    before the (r+1)-th of any (an even spread)
 * Experts with no hits come after every expert with hits (by P_l^c / bytes_l,
 * then the lower id, then the lower layer: a plan from no data holds the
 * lowest ids of every layer). The candidates are
 * packed greedily, best score first, skipping any that no longer fits the
 * budget; a layer holds each expert at most once (so at most n_expert).
 * Ties: the higher share, then the lower layer, then the lower expert id. */
#ifndef TM_TIER_PLAN_H
#define TM_TIER_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "core/status.h"
#include "trace/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_PLAN_FORMAT        "tiermoe-moe-plan"
#define TM_PLAN_VERSION       1
#define TM_PLAN_CURVE_DEFAULT 1.0
#define TM_PLAN_CURVE_MAX     8.0

typedef enum tm_plan_weighting {
    TM_PLAN_FLAT,
    TM_PLAN_PRESSURE,
    TM_PLAN_SMOOTH_PRESSURE,
    TM_PLAN_TIME,
    TM_PLAN_BALANCED,
    TM_PLAN_WEIGHTING_COUNT
} tm_plan_weighting;

typedef struct tm_plan_params {
    tm_plan_weighting mode;
    double layer_curve;           /* c >= 0: exponent on the layer priority (0: flat's) */
    uint64_t budget_bytes;        /* VRAM for cached experts */
    const uint64_t *expert_bytes; /* [n_layer] bytes of one expert (gate+up+down) of each layer */
    const bool *cacheable;        /* [n_layer] layers that may get slots; NULL: all */
} tm_plan_params;

typedef struct tm_plan {
    tm_trace_shape shape;
    tm_plan_weighting mode;
    double layer_curve;
    uint64_t budget_bytes, used_bytes; /* used = sum of n_slots[l] * expert_bytes[l] <= budget */
    uint64_t *expert_bytes;            /* [n_layer] */
    int32_t *n_slots;                  /* [n_layer] experts cached in each layer */
    int32_t **experts;                 /* [n_layer][n_slots[l]] expert ids, best first */
} tm_plan;

/* "flat", "pressure", "smooth_pressure", "time", "balanced"; another name is
 * TM_ERR_ARG listing them. */
tm_status plan_weighting_parse(const char *name, tm_plan_weighting *out);
const char *plan_weighting_name(tm_plan_weighting mode);

/* Make a plan from observations. A cacheable layer with expert_bytes 0 gets
 * no slots. Fails (TM_ERR_ARG) on a bad mode or a curve outside
 * [0, TM_PLAN_CURVE_MAX]. */
tm_status plan_make(const tm_trace_stats *obs, const tm_plan_params *p, tm_plan *out);
/* Share of the cacheable layers' observed routed slots that the plan's
 * experts take: the hit rate the plan would have had on obs (layers whose
 * experts are all in VRAM left out). cacheable NULL: all layers. */
double plan_hit_rate(const tm_plan *plan, const tm_trace_stats *obs, const bool *cacheable);
/* An empty plan (no slots) for a shape: for building plans by hand. */
tm_status plan_init(tm_plan *plan, const tm_trace_shape *shape);
/* Set layer l's experts (copied; n <= n_expert, ids distinct and in range)
 * and its expert bytes; used_bytes is recomputed. */
tm_status plan_set_layer(tm_plan *plan, uint32_t layer, const int32_t *experts, int32_t n,
                         uint64_t expert_bytes);
void plan_free(tm_plan *plan);

/* One VRAM cache slot a plan rewrites: its layer, the slot, the expert there
 * before (-1: empty) and after. */
typedef struct tm_plan_change {
    uint32_t layer;
    int32_t slot, before, after;
} tm_plan_change;
/* The slots of layer l to rewrite so that its `slots` slots (in_slot: each
 * slot's expert, -1 empty) hold the plan's first min(its count, slots)
 * experts: each of those not resident goes to the next slot whose resident
 * the plan does not list (residents it lists stay put). Appended to ch (room
 * for `slots` more); the rule of POST /moe-hot-cache and tm_cache_apply. */
void plan_cache_diff(const tm_plan *plan, uint32_t l, const int32_t *in_slot, int32_t slots,
                     tm_plan_change *ch, int32_t *n_ch);

/* ---- files (plan_file.c) ---- */

/* The JSON object of docs/plan-format.md (a new reference), or NULL out of memory. */
json_t *plan_to_json(const tm_plan *plan);
/* Parse and validate; origin (a file name or "request body") and the field
 * are named in errors ("plan.json: layers[3].experts[2]: expert 130 of 128").
 * expect (may be NULL) is the loaded model's shape. */
tm_status plan_from_json(const json_t *root, const char *origin, const tm_trace_shape *expect,
                         tm_plan *out);
/* Atomic: written to path.tmp.PID, then renamed over path. */
tm_status plan_write_json(const tm_plan *plan, const char *path);
tm_status plan_read_json(const char *path, const tm_trace_shape *expect, tm_plan *out);
/* Parse JSON text (for fuzzing and request bodies). */
tm_status plan_parse_json(const char *text, size_t len, const char *origin,
                          const tm_trace_shape *expect, tm_plan *out);

#ifdef __cplusplus
}
#endif
#endif
