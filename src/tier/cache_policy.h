/* Cache policies for one layer's VRAM expert slots: which routed experts to
 * upload (admit) after each step, which resident each replaces, and the
 * between-request updater. The same code runs in the live tier (decode, per
 * layer per step) and in the offline replay of routing logs (cache_replay.h).
 *
 * A policy sees each step's routing ids [n_tok][k] once. It counts the
 * step's hits against the experts resident before the step, then may admit
 * some of the step's missed experts (demand admission: never an expert the
 * step did not route), each into an empty slot or over a resident the step
 * did not use. The caller uploads the admissions; the policy treats them as
 * resident from then on.
 *
 *   static    never admits (the plan's experts stay)
 *   lru       admits every miss, evicting the least recently used resident
 *   lfu       counts every expert's uses since creation; admits a miss only
 *             when its count exceeds the least used resident's (ties evict
 *             the least recent)
 *   adaptive  scores every expert by exponentially decayed uses (each use
 *             worth 1, halved every half_life tokens: recency and frequency
 *             in one number, as LRFU), plus a fixed prior from the learn
 *             file (cache_policy_warm) that keeps the generally popular
 *             experts when routing is steady. The half-life follows the
 *             cache's size, by default 8 turnovers (8 * n_slots / k tokens):
 *             a small cache leans to recency, a large one to frequency, as
 *             the replays showed (docs/plan-format.md). A miss is admitted
 *             only when its score exceeds the weakest unused resident's by
 *             the factor (1 + hysteresis), so a one-off expert does not
 *             push out one used steadily. The plan's experts start with a
 *             score of prior for the best, falling linearly with rank.
 * Every kind caps admissions at max_admit per step (0: no cap), taking the
 * missed experts best score first (ties: more uses in the step, then the
 * order of first use in the step, i.e. rank order for one token).
 *
 * Cost of a step: O(n_tok * k) to count, plus O(n_slots) per admission (the
 * victim scan), plus sorting the step's missed experts. */
#ifndef TM_TIER_CACHE_POLICY_H
#define TM_TIER_CACHE_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tm_cache_policy_kind {
    TM_CACHE_STATIC,
    TM_CACHE_LRU,
    TM_CACHE_LFU,
    TM_CACHE_ADAPTIVE,
    TM_CACHE_KIND_COUNT
} tm_cache_policy_kind;

#define TM_CACHE_TURNOVERS            8.0 /* auto half-life: this many times slots / k tokens */
#define TM_CACHE_HYSTERESIS_DEFAULT   0.25
#define TM_CACHE_PRIOR_DEFAULT        1.0
#define TM_CACHE_LEARN_WEIGHT_DEFAULT 0.5

typedef struct tm_cache_policy_params {
    tm_cache_policy_kind kind;
    int32_t max_admit;   /* uploads per layer per step, 0 = no cap */
    double half_life;    /* tokens until a use counts half, for the decayed scores of adaptive
                          and of every kind's cache_policy_update without counts; 0: auto,
                          TM_CACHE_TURNOVERS * n_slots / k (at least 1) */
    double hysteresis;   /* >= 0: adaptive admissions and every update need score > (1 + h) * the
                          replaced resident's */
    double prior;        /* >= 0: the plan's best expert's initial score, in uses */
    double learn_weight; /* >= 0: adaptive: weight of the learn prior of cache_policy_warm */
} tm_cache_policy_params;

/* One admission: upload expert into slot; evicted is the expert it replaces (-1: was empty). */
typedef struct tm_cache_admit {
    int32_t slot, expert, evicted;
} tm_cache_admit;

typedef struct tm_cache_policy tm_cache_policy;

/* The defaults for a kind (the knobs above). */
tm_cache_policy_params cache_policy_params_default(tm_cache_policy_kind kind);
/* "static", "lru", "lfu", "adaptive"; another name is TM_ERR_ARG listing them. */
tm_status cache_policy_kind_parse(const char *name, tm_cache_policy_kind *out);
const char *cache_policy_kind_name(tm_cache_policy_kind kind);

/* A policy for a layer of n_expert experts and n_slots slots (0 <= n_slots <=
 * n_expert), holding initial[n_slots] (expert ids best first, -1 empty; NULL:
 * all empty). Bad parameters, ids out of range or twice: TM_ERR_ARG. */
tm_status cache_policy_create(const tm_cache_policy_params *p, uint32_t n_expert, int32_t n_slots,
                              const int32_t *initial, tm_cache_policy **out);
void cache_policy_free(tm_cache_policy *c);

/* One step's routing of this layer: ids [n_tok][k] (each in [0, n_expert)).
 * *hits gets the routed slots whose expert was resident before the step; the
 * policy's state is updated and at most max_admit admissions are written to
 * out (room for n_slots when max_admit is 0, else max_admit). Returns their
 * number. */
int32_t cache_policy_step(tm_cache_policy *c, const int32_t *ids, int64_t n_tok, uint32_t k,
                          tm_cache_admit *out, int64_t *hits);

/* Seed the scores from counts[n_expert] (a learn file's experts[] for this
 * layer). lfu: added to its counts; static and lru: added to the decayed
 * scores the updater uses, as uses made now; adaptive: a prior that does not
 * decay, learn_weight * (the expert's share of the counts) * k * (the
 * decayed score of one use a token), i.e. what the expert would score if
 * routing kept to the learn file's rates, at learn_weight. */
void cache_policy_warm(tm_cache_policy *c, const uint64_t *counts);

/* Between requests: exchange up to floor(rate * n_slots) of the weakest
 * residents (empty slots first) for the best non-resident experts, by
 * counts[n_expert] (e.g. a perf file's experts[] for this layer since the
 * last update) or, counts NULL, by the policy's decayed scores; a pair is
 * exchanged only when the newcomer's value is > 0 and > (1 + hysteresis) *
 * the resident's. out: room for n_slots. Returns the number of exchanges. */
int32_t cache_policy_update(tm_cache_policy *c, const uint64_t *counts, double rate,
                            tm_cache_admit *out);

/* Where expert e is resident (-1: not); the expert in slot s (-1: empty). */
int32_t cache_policy_slot_of(const tm_cache_policy *c, int32_t expert);
int32_t cache_policy_expert_at(const tm_cache_policy *c, int32_t slot);
int32_t cache_policy_n_slots(const tm_cache_policy *c);

#ifdef __cplusplus
}
#endif
#endif
