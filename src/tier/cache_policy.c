/* Cache policies for one layer's VRAM slots (static, LRU, LFU, adaptive) and
 * the between-request updater. See cache_policy.h for the rules.
 *
 * One comparison rule serves every kind: a missed expert c replaces the
 * weakest resident v the step did not use (an empty slot first) when
 * score[c] > (1 + h) * score[v], h = 0 but for adaptive, where score is
 *   lru       the step of the last use (so a miss always beats a resident
 *             not used in this step)
 *   lfu       uses since creation
 *   adaptive  decayed uses
 * Ties between residents evict the least recently used, then the lower slot.
 *
 * Decayed uses without touching every expert each step: a use at token
 * time T adds 2^(T / half_life), stored as exp(log_inc); comparing stored
 * values compares the decayed ones. When log_inc grows large every score is
 * rescaled (O(n_expert), once per ~400 half-lives). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tier/cache_policy.h"

#define RESCALE_AT 300.0 /* exp(300) ~ 2e130: far from overflow with any count */

struct tm_cache_policy {
    tm_cache_policy_params p;
    uint32_t n_expert;
    int32_t n_slots;
    int64_t step;                /* steps seen */
    double log_inc, inc, lambda; /* decay: inc = exp(log_inc); lambda = ln 2 / half_life */
    double *score;               /* [n_expert] the kind's score (adaptive: == freq) */
    double *freq;                /* [n_expert] decayed uses (every kind; for cache_policy_update) */
    int64_t *last;    /* [n_expert] step of the last use (initial residents: -1 - rank) */
    int64_t *stamp;   /* [n_expert] last step that routed it */
    int32_t *n_step;  /* [n_expert] uses in the current step */
    int32_t *slot_of; /* [n_expert] slot or -1 */
    int32_t *at;      /* [n_slots] expert or -1 */
    int32_t *touched; /* [n_expert] experts of the current step, in first-use order */
    int32_t *tmp;     /* [n_expert] scratch */
    double *share;    /* [n_expert] adaptive: share of the warm counts */
    double *base;     /* [n_expert] adaptive: what a stationary expert of that share scores */
    bool warmed;      /* adaptive: cache_policy_warm was called */
    uint32_t prior_k; /* adaptive: the k base[] was computed for (0: base not in use) */
};

static const char *const kind_names[TM_CACHE_KIND_COUNT] = {"static", "lru", "lfu", "adaptive"};

tm_cache_policy_params cache_policy_params_default(tm_cache_policy_kind kind) {
    return (tm_cache_policy_params){.kind = kind,
                                    .max_admit = 0,
                                    .half_life = 0,
                                    .hysteresis = TM_CACHE_HYSTERESIS_DEFAULT,
                                    .prior = TM_CACHE_PRIOR_DEFAULT,
                                    .learn_weight = TM_CACHE_LEARN_WEIGHT_DEFAULT};
}

tm_status cache_policy_kind_parse(const char *name, tm_cache_policy_kind *out) {
    for (int i = 0; i < TM_CACHE_KIND_COUNT; i++)
        if (name && !strcmp(name, kind_names[i])) {
            *out = (tm_cache_policy_kind)i;
            return TM_OK;
        }
    return tm_error_set(TM_ERR_ARG, "unknown cache policy \"%s\" (static, lru, lfu, adaptive)",
                        name ? name : "(null)");
}

const char *cache_policy_kind_name(tm_cache_policy_kind kind) {
    return (unsigned)kind < TM_CACHE_KIND_COUNT ? kind_names[kind] : "?";
}

void cache_policy_free(tm_cache_policy *c) {
    if (!c) return;
    if (c->freq != c->score) free(c->freq);
    free(c->score), free(c->last), free(c->stamp), free(c->n_step);
    free(c->slot_of), free(c->at), free(c->touched), free(c->tmp);
    free(c->share), free(c->base);
    free(c);
}

tm_status cache_policy_create(const tm_cache_policy_params *p, uint32_t n_expert, int32_t n_slots,
                              const int32_t *initial, tm_cache_policy **out) {
    *out = NULL;
    if ((unsigned)p->kind >= TM_CACHE_KIND_COUNT || p->max_admit < 0 || !(p->half_life >= 0) ||
        isinf(p->half_life) || !(p->hysteresis >= 0) || !(p->prior >= 0) ||
        !(p->learn_weight >= 0) || isinf(p->hysteresis) || isinf(p->prior) ||
        isinf(p->learn_weight))
        return tm_error_set(TM_ERR_ARG,
                            "cache policy: bad parameters (kind %d, max_admit %d, half_life %g, "
                            "hysteresis %g, prior %g, learn_weight %g)",
                            (int)p->kind, p->max_admit, p->half_life, p->hysteresis, p->prior,
                            p->learn_weight);
    if (!n_expert || n_expert > (1u << 24) || n_slots < 0 || (uint32_t)n_slots > n_expert)
        return tm_error_set(TM_ERR_ARG, "cache policy: %d slots for %u experts", n_slots, n_expert);
    tm_cache_policy *c = calloc(1, sizeof(*c));
    if (!c) return tm_error_set(TM_ERR_NOMEM, "cache policy: out of memory");
    c->p = *p, c->n_expert = n_expert, c->n_slots = n_slots;
    c->inc = 1, c->lambda = p->half_life > 0 ? log(2.0) / p->half_life : 0; /* 0: at step 1 */
    const size_t E = n_expert;
    c->score = calloc(E, sizeof(double));
    c->freq = p->kind == TM_CACHE_ADAPTIVE ? c->score : calloc(E, sizeof(double));
    c->last = malloc(E * sizeof(int64_t));
    c->stamp = calloc(E, sizeof(int64_t));
    c->n_step = calloc(E, sizeof(int32_t));
    c->slot_of = malloc(E * sizeof(int32_t));
    c->at = malloc((n_slots ? (size_t)n_slots : 1) * sizeof(int32_t));
    c->touched = malloc(E * sizeof(int32_t));
    c->tmp = malloc(E * sizeof(int32_t));
    if (p->kind == TM_CACHE_ADAPTIVE) /* the learn prior; allocated here so warm cannot fail */
        c->share = calloc(E, sizeof(double)), c->base = calloc(E, sizeof(double));
    if (!c->score || !c->freq || !c->last || !c->stamp || !c->n_step || !c->slot_of || !c->at ||
        !c->touched || !c->tmp || (p->kind == TM_CACHE_ADAPTIVE && (!c->share || !c->base))) {
        cache_policy_free(c);
        return tm_error_set(TM_ERR_NOMEM, "cache policy: out of memory for %u experts", n_expert);
    }
    for (size_t e = 0; e < E; e++) c->slot_of[e] = -1, c->last[e] = INT64_MIN / 2;
    for (int32_t s = 0; s < n_slots; s++) {
        const int32_t e = initial ? initial[s] : -1;
        c->at[s] = e;
        if (e < 0) continue;
        if ((uint32_t)e >= n_expert || c->slot_of[e] >= 0) {
            cache_policy_free(c);
            return tm_error_set(TM_ERR_ARG, "cache policy: initial[%d]: expert %d %s", s, e,
                                (uint32_t)e >= n_expert ? "out of range" : "listed twice");
        }
        c->slot_of[e] = s;
        /* best first: the better, the more recent and the larger the prior */
        c->last[e] = -1 - (int64_t)s;
        c->freq[e] = p->prior * (double)(n_slots - s) / (double)n_slots;
        c->score[e] = p->kind == TM_CACHE_LRU   ? (double)c->last[e]
                      : p->kind == TM_CACHE_LFU ? 0
                                                : c->freq[e];
    }
    *out = c;
    return TM_OK;
}

/* The kind's score of expert e; adaptive adds its learn-file prior. */
static inline double policy_score(const tm_cache_policy *c, int32_t e) {
    return c->prior_k ? c->score[e] + c->base[e] * c->inc : c->score[e];
}

/* The learn prior of every expert for k experts a token (adaptive, warmed). */
static void policy_prior(tm_cache_policy *c, uint32_t k) {
    for (uint32_t e = 0; e < c->n_expert; e++)
        c->base[e] = c->p.learn_weight * c->share[e] * k / c->lambda;
    c->prior_k = k;
}

/* Move the decay clock by n tokens; rescale every decayed score when large. */
static void policy_advance(tm_cache_policy *c, int64_t n) {
    c->log_inc += (double)n * c->lambda;
    if (c->log_inc > RESCALE_AT) {
        const double f = exp(-c->log_inc);
        for (uint32_t e = 0; e < c->n_expert; e++) c->freq[e] *= f;
        c->log_inc = 0;
    }
    c->inc = exp(c->log_inc);
}

/* The weakest resident the current step did not use: an empty slot first,
 * then the lowest score, the least recent use, the lower slot. -1: none. */
static int32_t policy_victim(const tm_cache_policy *c) {
    int32_t best = -1;
    for (int32_t s = 0; s < c->n_slots; s++) {
        const int32_t e = c->at[s];
        if (e < 0) return s;
        if (c->stamp[e] == c->step) continue;
        if (best < 0) {
            best = s;
            continue;
        }
        const int32_t b = c->at[best];
        const double se = policy_score(c, e), sb = policy_score(c, b);
        if (se < sb || (se == sb && c->last[e] < c->last[b])) best = s;
    }
    return best;
}

/* Candidate order: score desc, uses in the step desc, first use in the step. */
static bool cand_before(const tm_cache_policy *c, int32_t a, int32_t ia, int32_t b, int32_t ib) {
    const double sa = policy_score(c, a), sb = policy_score(c, b);
    if (sa != sb) return sa > sb;
    if (c->n_step[a] != c->n_step[b]) return c->n_step[a] > c->n_step[b];
    return ia < ib;
}

static void policy_admit(tm_cache_policy *c, int32_t slot, int32_t e, tm_cache_admit *out) {
    const int32_t old = c->at[slot];
    if (old >= 0) c->slot_of[old] = -1;
    c->at[slot] = e, c->slot_of[e] = slot;
    *out = (tm_cache_admit){.slot = slot, .expert = e, .evicted = old};
}

int32_t cache_policy_step(tm_cache_policy *c, const int32_t *ids, int64_t n_tok, uint32_t k,
                          tm_cache_admit *out, int64_t *hits) {
    const int64_t t = ++c->step;
    int64_t h = 0;
    int32_t n_touched = 0;
    if (c->lambda == 0) { /* auto half-life, now that k is known */
        const double hl = TM_CACHE_TURNOVERS * (double)c->n_slots / (double)(k ? k : 1);
        c->lambda = log(2.0) / (hl > 1 ? hl : 1);
    }
    if (c->warmed && c->prior_k != k) policy_prior(c, k); /* now that k is known */
    policy_advance(c, n_tok);
    for (int64_t i = 0; i < n_tok * (int64_t)k; i++) {
        const int32_t e = ids[i];
        h += c->slot_of[e] >= 0;
        if (c->stamp[e] != t) c->stamp[e] = t, c->n_step[e] = 0, c->touched[n_touched++] = e;
        c->n_step[e]++;
    }
    *hits = h;
    /* scores, and the missed experts (first-use order) into tmp */
    int32_t n_cand = 0;
    for (int32_t i = 0; i < n_touched; i++) {
        const int32_t e = c->touched[i];
        c->last[e] = t;
        if (c->p.kind != TM_CACHE_ADAPTIVE) c->freq[e] += c->n_step[e] * c->inc;
        switch (c->p.kind) {
        case TM_CACHE_LRU:
            c->score[e] = (double)t;
            break;
        case TM_CACHE_LFU:
            c->score[e] += c->n_step[e];
            break;
        case TM_CACHE_ADAPTIVE:
            c->score[e] += c->n_step[e] * c->inc;
            break;
        default:
            break;
        }
        if (c->slot_of[e] < 0) c->tmp[n_cand++] = e;
    }
    if (c->p.kind == TM_CACHE_STATIC || !n_cand || !c->n_slots) return 0;
    /* best first (ties: first use in the step); with a cap only the first
     * max_admit places are needed */
    const int32_t cap = c->p.max_admit ? c->p.max_admit : c->n_slots;
    int32_t *order = c->touched; /* reused: the first-use index of each candidate */
    for (int32_t i = 0; i < n_cand; i++) order[i] = i;
    const int32_t want = n_cand < cap ? n_cand : cap;
    for (int32_t i = 0; i < want; i++) { /* selection of the best remaining: O(n_cand * want) */
        int32_t b = i;
        for (int32_t j = i + 1; j < n_cand; j++)
            if (cand_before(c, c->tmp[j], order[j], c->tmp[b], order[b])) b = j;
        const int32_t te = c->tmp[i], to = order[i];
        c->tmp[i] = c->tmp[b], order[i] = order[b];
        c->tmp[b] = te, order[b] = to;
    }
    const double margin = c->p.kind == TM_CACHE_ADAPTIVE ? 1 + c->p.hysteresis : 1;
    int32_t n = 0;
    for (int32_t i = 0; i < want; i++) {
        const int32_t e = c->tmp[i], v = policy_victim(c);
        if (v < 0) break;
        const int32_t r = c->at[v];
        if (r >= 0 && !(policy_score(c, e) > margin * policy_score(c, r))) break;
        policy_admit(c, v, e, &out[n++]);
    }
    return n;
}

void cache_policy_warm(tm_cache_policy *c, const uint64_t *counts) {
    if (c->p.kind == TM_CACHE_ADAPTIVE) {
        double total = 0;
        for (uint32_t e = 0; e < c->n_expert; e++) total += (double)counts[e];
        for (uint32_t e = 0; e < c->n_expert; e++)
            c->share[e] = total > 0 ? (double)counts[e] / total : 0;
        c->warmed = true;
        if (c->prior_k) policy_prior(c, c->prior_k); /* else at the first step */
        return;
    }
    for (uint32_t e = 0; e < c->n_expert; e++) {
        c->freq[e] += (double)counts[e] * c->inc;
        if (c->p.kind == TM_CACHE_LFU) c->score[e] += (double)counts[e];
    }
}

/* The updater's value of expert e: the given counts, or the decayed uses
 * (adaptive: with its learn prior). */
static double update_value(const tm_cache_policy *c, const uint64_t *counts, int32_t e) {
    if (counts) return (double)counts[e];
    return c->p.kind == TM_CACHE_ADAPTIVE ? policy_score(c, e) : c->freq[e];
}

/* The weakest resident for the updater: an empty slot first, then the lowest
 * value, the least recent use, the lower slot. -1: no slots. */
static int32_t update_weakest(const tm_cache_policy *c, const uint64_t *counts) {
    int32_t w = -1;
    for (int32_t s = 0; s < c->n_slots; s++) {
        const int32_t e = c->at[s];
        if (e < 0) return s;
        if (w < 0) {
            w = s;
            continue;
        }
        const int32_t b = c->at[w];
        const double ve = update_value(c, counts, e), vb = update_value(c, counts, b);
        if (ve < vb || (ve == vb && c->last[e] < c->last[b])) w = s;
    }
    return w;
}

int32_t cache_policy_update(tm_cache_policy *c, const uint64_t *counts, double rate,
                            tm_cache_admit *out) {
    rate = !(rate > 0) ? 0 : rate > 1 ? 1 : rate;
    const int32_t max_x = (int32_t)floor(rate * c->n_slots + 1e-9);
    int32_t *cand = c->tmp, n_cand = 0, n = 0;
    for (uint32_t e = 0; max_x && e < c->n_expert; e++)
        if (c->slot_of[e] < 0 && update_value(c, counts, (int32_t)e) > 0)
            cand[n_cand++] = (int32_t)e;
    for (int32_t i = 0; i < n_cand && n < max_x; i++) {
        /* the best remaining newcomer (ties: the lower id) */
        int32_t b = i;
        for (int32_t j = i + 1; j < n_cand; j++) {
            const double vj = update_value(c, counts, cand[j]),
                         vb = update_value(c, counts, cand[b]);
            if (vj > vb || (vj == vb && cand[j] < cand[b])) b = j;
        }
        const int32_t x = cand[b];
        cand[b] = cand[i], cand[i] = x;
        const int32_t w = update_weakest(c, counts);
        if (w < 0) break;
        const int32_t r = c->at[w];
        if (r >= 0 &&
            !(update_value(c, counts, x) > (1 + c->p.hysteresis) * update_value(c, counts, r)))
            break;
        policy_admit(c, w, x, &out[n++]);
        /* the newcomer counts as just used, so live admissions do not evict it at once */
        c->last[x] = c->step;
        if (c->p.kind == TM_CACHE_LRU) c->score[x] = (double)c->step;
    }
    return n;
}

int32_t cache_policy_slot_of(const tm_cache_policy *c, int32_t expert) {
    return expert >= 0 && (uint32_t)expert < c->n_expert ? c->slot_of[expert] : -1;
}

int32_t cache_policy_expert_at(const tm_cache_policy *c, int32_t slot) {
    return slot >= 0 && slot < c->n_slots ? c->at[slot] : -1;
}

int32_t cache_policy_n_slots(const tm_cache_policy *c) {
    return c->n_slots;
}
