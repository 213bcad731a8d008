/* Offline replay of a routing log (trace_log.h) against cache policies, to
 * compare them on the same routing: `tiermoe report --replay LOG`.
 *
 * The log's sequences are split: the first train_fraction of them train a
 * plan (plan_make on their counts, one byte per expert, budget = the asked
 * share of every layer's experts); the rest are held out and replayed, each
 * layer on its own, with every policy starting from the plan's experts and
 * warmed with the training counts (cache_policy_warm):
 *   static    the plan, never changed
 *   update    the plan, exchanged between sequences (cache_policy_update on
 *             the policy's decayed scores, with update_half_life, at most
 *             update_rate * slots a layer)
 *   lru, lfu, adaptive   cache_policy_step on every call (prompt batches and
 *             decode steps), at most max_admit admissions a step
 *   belady    the offline optimum of demand caching (below)
 * Hits are counted on decode steps (calls of one token): what the hot cache
 * serves while generating. Prompt calls still feed the policies and may admit.
 *
 * Lag: the engine decides admissions after step t's routing and uploads them
 * during step t+1, so they serve from step t+1+lag (lag 1 by default); a
 * slot being refilled serves neither its old nor its new expert meanwhile.
 *
 * Belady (MIN with bypass, step-granular, uncapped, no lag): after each
 * step keep, among the residents and the step's experts, the n_slots whose
 * next decode use comes first, where an expert whose next routing is a
 * prompt call (from which it could be admitted again at no cost) counts as
 * not needed now. Any policy that admits only experts a step routed (all
 * but update) scores at most its hits from the same start; tests check this
 * against an exhaustive search. */
#ifndef TM_TIER_CACHE_REPLAY_H
#define TM_TIER_CACHE_REPLAY_H

#include <stdint.h>

#include "core/status.h"
#include "tier/cache_policy.h"
#include "tier/plan.h"
#include "trace/trace_log.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tm_replay_policy {
    TM_REPLAY_STATIC,
    TM_REPLAY_UPDATE,
    TM_REPLAY_LRU,
    TM_REPLAY_LFU,
    TM_REPLAY_ADAPTIVE,
    TM_REPLAY_BELADY,
    TM_REPLAY_COUNT
} tm_replay_policy;
extern const char *const tm_replay_policy_names[TM_REPLAY_COUNT];

typedef struct tm_replay_params {
    double train_fraction;       /* [0, 1): share of the sequences that train the plan */
    int32_t lag;                 /* >= 0: steps an admission waits before it serves */
    int32_t max_admit;           /* lru, lfu, adaptive: admissions per layer per step (0: no cap) */
    tm_plan_weighting weighting; /* the plan's mode */
    double update_rate;          /* update: share of slots exchanged between sequences */
    double update_half_life;     /* update: tokens until a use counts half */
    tm_cache_policy_params knobs; /* half_life, hysteresis, prior of adaptive and update */
} tm_replay_params;

typedef struct tm_replay_result {
    double residency;                  /* share of experts resident asked for */
    int64_t slots;                     /* slots of all layers (the plan's experts) */
    uint32_t n_train, n_eval;          /* sequences */
    uint64_t decode_tokens;            /* held-out decode tokens (calls of one token, any layer) */
    uint64_t routed;                   /* held-out decode routed slots, all layers */
    uint64_t hits[TM_REPLAY_COUNT];    /* of routed */
    uint64_t uploads[TM_REPLAY_COUNT]; /* admissions at decode steps, all layers */
    uint64_t prompt_uploads[TM_REPLAY_COUNT]; /* at prompt calls (update: between sequences) */
} tm_replay_result;

/* The replay defaults: train 0.5, lag 1, no cap, flat, update 0.25, the adaptive defaults. */
tm_replay_params cache_replay_params_default(void);

/* Replay at residency in (0, 1]: per layer round(residency * n_expert) slots
 * on average (the plan may spread them unevenly, as flat does). Fails when
 * the log has fewer than 2 sequences, nothing held out, or bad parameters. */
tm_status cache_replay(const tm_trace_log *log, const tm_replay_params *p, double residency,
                       tm_replay_result *out);

/* ---- pieces, exposed for tests ---- */

/* Train counts of the sequences [0, n_seq_train) of a log, as a learn file's. */
tm_status cache_replay_counts(const tm_trace_log *log, uint32_t n_seq_train, tm_trace_stats *out);
/* Belady's hits on one layer's calls [first, n_calls): steps of n_tok tokens
 * (decode = 1 token), residents initial[n_slots] (-1 empty). Its admissions
 * at decode steps go to *uploads, at prompt calls to *prompt_uploads. */
tm_status cache_replay_belady(const tm_trace_log_layer *ly, uint64_t first, uint32_t k,
                              uint32_t n_expert, int32_t n_slots, const int32_t *initial,
                              uint64_t *hits, uint64_t *uploads, uint64_t *prompt_uploads);

#ifdef __cplusplus
}
#endif
#endif
