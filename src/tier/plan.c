/* The hot-cache planner: weighting modes, layer priority, greedy packing
 * into the byte budget. The definitions are in plan.h and docs/plan-format.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tier/plan.h"

static const char *const weighting_names[TM_PLAN_WEIGHTING_COUNT] = {
    "flat", "pressure", "smooth_pressure", "time", "balanced"};

tm_status plan_weighting_parse(const char *name, tm_plan_weighting *out) {
    for (int i = 0; i < TM_PLAN_WEIGHTING_COUNT; i++)
        if (name && !strcmp(name, weighting_names[i])) {
            *out = (tm_plan_weighting)i;
            return TM_OK;
        }
    return tm_error_set(TM_ERR_ARG,
                        "unknown weighting mode \"%s\" (flat, pressure, smooth_pressure, time, "
                        "balanced)",
                        name ? name : "(null)");
}

const char *plan_weighting_name(tm_plan_weighting mode) {
    return (unsigned)mode < TM_PLAN_WEIGHTING_COUNT ? weighting_names[mode] : "?";
}

/* ---- plan storage ---- */

tm_status plan_init(tm_plan *plan, const tm_trace_shape *shape) {
    memset(plan, 0, sizeof(*plan));
    if (!shape->n_layer || shape->n_layer > TM_TRACE_MAX_LAYER || !shape->n_expert ||
        shape->n_expert > TM_TRACE_MAX_EXPERT)
        return tm_error_set(TM_ERR_ARG, "plan: unsupported shape %u layers, %u experts",
                            shape->n_layer, shape->n_expert);
    plan->shape = *shape;
    plan->layer_curve = TM_PLAN_CURVE_DEFAULT;
    plan->expert_bytes = calloc(shape->n_layer, sizeof(uint64_t));
    plan->n_slots = calloc(shape->n_layer, sizeof(int32_t));
    plan->experts = calloc(shape->n_layer, sizeof(int32_t *));
    if (!plan->expert_bytes || !plan->n_slots || !plan->experts) {
        plan_free(plan);
        return tm_error_set(TM_ERR_NOMEM, "plan: out of memory");
    }
    return TM_OK;
}

void plan_free(tm_plan *plan) {
    if (plan->experts)
        for (uint32_t l = 0; l < plan->shape.n_layer; l++) free(plan->experts[l]);
    free(plan->experts);
    free(plan->n_slots);
    free(plan->expert_bytes);
    memset(plan, 0, sizeof(*plan));
}

void plan_cache_diff(const tm_plan *plan, uint32_t l, const int32_t *in_slot, int32_t slots,
                     tm_plan_change *ch, int32_t *n_ch) {
    const int32_t want = plan->n_slots[l] < slots ? plan->n_slots[l] : slots;
    int32_t free_slot = 0;
    for (int32_t i = 0; i < want; i++) {
        const int32_t e = plan->experts[l][i];
        bool resident = false;
        for (int32_t k = 0; k < slots && !resident; k++) resident = in_slot[k] == e;
        if (resident) continue;
        for (; free_slot < slots; free_slot++) { /* the next slot the plan does not want */
            bool wanted = false;
            for (int32_t w = 0; w < want && !wanted; w++)
                wanted = in_slot[free_slot] == plan->experts[l][w];
            if (!wanted) break;
        }
        ch[(*n_ch)++] = (tm_plan_change){l, free_slot, in_slot[free_slot], e};
        free_slot++;
    }
}

tm_status plan_set_layer(tm_plan *plan, uint32_t layer, const int32_t *experts, int32_t n,
                         uint64_t expert_bytes) {
    const uint32_t E = plan->shape.n_expert;
    if (layer >= plan->shape.n_layer || n < 0 || (uint32_t)n > E)
        return tm_error_set(TM_ERR_ARG,
                            "plan: layer %u: %d experts (the model has %u layers of %u)", layer, n,
                            plan->shape.n_layer, E);
    uint8_t *seen = calloc(E, 1);
    int32_t *ids = malloc((n ? (size_t)n : 1) * sizeof(int32_t));
    if (!seen || !ids) {
        free(seen), free(ids);
        return tm_error_set(TM_ERR_NOMEM, "plan: out of memory");
    }
    for (int32_t i = 0; i < n; i++) {
        const int32_t e = experts[i];
        if (e < 0 || (uint32_t)e >= E || seen[e]) {
            free(seen), free(ids);
            return tm_error_set(TM_ERR_ARG, "plan: layer %u: expert %d %s", layer, e,
                                e < 0 || (uint32_t)e >= E ? "out of range" : "listed twice");
        }
        seen[e] = 1, ids[i] = e;
    }
    free(seen);
    free(plan->experts[layer]);
    plan->experts[layer] = ids;
    plan->n_slots[layer] = n;
    plan->expert_bytes[layer] = expert_bytes;
    plan->used_bytes = 0;
    for (uint32_t l = 0; l < plan->shape.n_layer; l++)
        plan->used_bytes += (uint64_t)plan->n_slots[l] * plan->expert_bytes[l];
    return TM_OK;
}

/* ---- layer priority ---- */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The mode's raw layer cost r[l] (< 0: no data for the layer). */
static void layer_raw_cost(const tm_trace_stats *obs, tm_plan_weighting mode, const bool *use,
                           double *r) {
    const uint32_t L = obs->shape.n_layer;
    /* pressure: wait per cold slot when every used layer with hits has a
     * hot/cold split (a run with the cache), else expert time per routed slot */
    bool split = false;
    if (mode == TM_PLAN_PRESSURE || mode == TM_PLAN_SMOOTH_PRESSURE) {
        split = true;
        bool any = false;
        for (uint32_t l = 0; l < L; l++) {
            const tm_trace_layer *y = &obs->layers[l];
            if (!use[l] || !y->expert_hits_total) continue;
            any = true;
            split &= y->cold_slots_total > 0;
        }
        split &= any;
    }
    for (uint32_t l = 0; l < L; l++) {
        const tm_trace_layer *y = &obs->layers[l];
        r[l] = -1;
        if (!use[l] || !y->expert_hits_total) continue;
        if (mode == TM_PLAN_TIME)
            r[l] = (double)(y->routing_ns + y->experts_ns + y->merge_ns + y->wait_ns) /
                   (double)(y->tokens ? y->tokens : 1);
        else if (split)
            r[l] = (double)y->wait_ns / (double)y->cold_slots_total;
        else
            r[l] = (double)y->experts_ns / (double)y->expert_hits_total;
    }
}

/* P[l] for the cacheable layers: 1 for flat and balanced; otherwise the raw
 * cost over its mean (smooth: sqrt of cost / median clamped to [1/4, 4],
 * then over its mean). Layers without data, or a file without timings, get 1. */
static tm_status layer_priority(const tm_trace_stats *obs, tm_plan_weighting mode, const bool *use,
                                double *P) {
    const uint32_t L = obs->shape.n_layer;
    for (uint32_t l = 0; l < L; l++) P[l] = 1;
    if (mode == TM_PLAN_FLAT || mode == TM_PLAN_BALANCED) return TM_OK;
    double *r = malloc(2 * (size_t)L * sizeof(double));
    if (!r) return tm_error_set(TM_ERR_NOMEM, "plan: out of memory");
    double *sorted = r + L;
    layer_raw_cost(obs, mode, use, r);
    uint32_t n = 0;
    for (uint32_t l = 0; l < L; l++)
        if (r[l] >= 0) sorted[n++] = r[l];
    if (n && mode == TM_PLAN_SMOOTH_PRESSURE) {
        qsort(sorted, n, sizeof(double), cmp_double);
        const double med = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
        for (uint32_t l = 0; l < L; l++) {
            if (r[l] < 0) continue;
            double q = med > 0 ? r[l] / med : 1;
            q = q < 0.25 ? 0.25 : q > 4 ? 4 : q;
            r[l] = sqrt(q);
        }
    }
    double mean = 0;
    for (uint32_t l = 0; l < L; l++)
        if (r[l] >= 0) mean += r[l] / n;
    if (mean > 0)
        for (uint32_t l = 0; l < L; l++)
            if (r[l] >= 0) P[l] = r[l] / mean;
    free(r);
    return TM_OK;
}

/* ---- packing ---- */

typedef struct plan_cand {
    double score, share;
    uint32_t layer, expert;
    bool hits;
} plan_cand;

/* Best first. Experts without hits after the rest, spread over the layers
 * (ids round-robin), so a plan from no data is the lowest ids of each layer. */
static int cand_cmp(const void *a, const void *b) {
    const plan_cand *x = a, *y = b;
    if (x->hits != y->hits) return x->hits ? -1 : 1;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->share != y->share) return x->share > y->share ? -1 : 1;
    if (!x->hits && x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return x->expert < y->expert ? -1 : x->expert > y->expert;
}

typedef struct plan_rank_item {
    uint64_t count;
    uint32_t expert;
} plan_rank_item;

static int rank_cmp(const void *a, const void *b) {
    const plan_rank_item *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->expert < y->expert ? -1 : x->expert > y->expert;
}

/* Rank of each expert in its layer: most selected first, ties to the lower id. */
static void layer_ranks(const uint64_t *counts, uint32_t E, plan_rank_item *tmp, uint32_t *rank) {
    for (uint32_t e = 0; e < E; e++) tmp[e].count = counts[e], tmp[e].expert = e;
    qsort(tmp, E, sizeof(*tmp), rank_cmp);
    for (uint32_t i = 0; i < E; i++) rank[tmp[i].expert] = i;
}

tm_status plan_make(const tm_trace_stats *obs, const tm_plan_params *p, tm_plan *out) {
    memset(out, 0, sizeof(*out));
    const uint32_t L = obs->shape.n_layer, E = obs->shape.n_expert;
    if ((unsigned)p->mode >= TM_PLAN_WEIGHTING_COUNT)
        return tm_error_set(TM_ERR_ARG, "plan: unknown weighting mode %d", (int)p->mode);
    if (!(p->layer_curve >= 0 && p->layer_curve <= TM_PLAN_CURVE_MAX))
        return tm_error_set(TM_ERR_ARG, "plan: layer curve %g outside [0, %g]", p->layer_curve,
                            TM_PLAN_CURVE_MAX);
    tm_status st = plan_init(out, &obs->shape);
    if (st != TM_OK) return st;
    out->mode = p->mode, out->layer_curve = p->layer_curve, out->budget_bytes = p->budget_bytes;
    bool *use = malloc(L * sizeof(bool));
    double *P = malloc(L * sizeof(double));
    plan_cand *c = malloc((size_t)L * E * sizeof(plan_cand));
    plan_rank_item *order = malloc((size_t)E * sizeof(plan_rank_item));
    uint32_t *rank = malloc((size_t)E * sizeof(uint32_t));
    if (!use || !P || !c || !order || !rank) {
        st = tm_error_set(TM_ERR_NOMEM, "plan: out of memory");
        goto done;
    }
    for (uint32_t l = 0; l < L; l++) {
        use[l] = (!p->cacheable || p->cacheable[l]) && p->expert_bytes[l] > 0;
        out->expert_bytes[l] = p->expert_bytes[l];
    }
    if ((st = layer_priority(obs, p->mode, use, P))) goto done;
    size_t n = 0;
    for (uint32_t l = 0; l < L; l++) {
        if (!use[l]) continue;
        const tm_trace_layer *y = &obs->layers[l];
        const double w = pow(P[l], p->layer_curve) / (double)p->expert_bytes[l];
        const double H = (double)y->expert_hits_total;
        if (p->mode == TM_PLAN_BALANCED) layer_ranks(y->experts, E, order, rank);
        for (uint32_t e = 0; e < E; e++) {
            plan_cand *x = &c[n++];
            x->layer = l, x->expert = e, x->hits = y->experts[e] > 0;
            x->share = H > 0 ? (double)y->experts[e] / H : 0;
            const double v = p->mode == TM_PLAN_BALANCED ? 1.0 / (1.0 + rank[e]) : x->share;
            /* no hits: after every expert with hits, better layers first */
            x->score = x->hits ? w * v : w;
        }
    }
    qsort(c, n, sizeof(*c), cand_cmp);
    /* first pass counts each layer's slots, second fills them best first */
    for (size_t i = 0; i < n; i++) {
        const uint64_t b = p->expert_bytes[c[i].layer];
        if (b > p->budget_bytes - out->used_bytes) {
            c[i].layer = UINT32_MAX; /* does not fit */
            continue;
        }
        out->used_bytes += b;
        out->n_slots[c[i].layer]++;
    }
    for (uint32_t l = 0; l < L; l++) {
        out->experts[l] = malloc((out->n_slots[l] ? (size_t)out->n_slots[l] : 1) * sizeof(int32_t));
        if (!out->experts[l]) {
            st = tm_error_set(TM_ERR_NOMEM, "plan: out of memory");
            goto done;
        }
        out->n_slots[l] = 0;
    }
    for (size_t i = 0; i < n; i++)
        if (c[i].layer != UINT32_MAX)
            out->experts[c[i].layer][out->n_slots[c[i].layer]++] = (int32_t)c[i].expert;
done:
    free(use), free(P), free(c), free(order), free(rank);
    if (st != TM_OK) plan_free(out);
    return st;
}

double plan_hit_rate(const tm_plan *plan, const tm_trace_stats *obs, const bool *cacheable) {
    uint64_t hit = 0, total = 0;
    for (uint32_t l = 0; l < obs->shape.n_layer && l < plan->shape.n_layer; l++) {
        if (cacheable && !cacheable[l]) continue;
        const tm_trace_layer *y = &obs->layers[l];
        total += y->expert_hits_total;
        for (int32_t i = 0; i < plan->n_slots[l]; i++) {
            const int32_t e = plan->experts[l][i];
            if (e >= 0 && (uint32_t)e < obs->shape.n_expert) hit += y->experts[e];
        }
    }
    return total ? (double)hit / (double)total : 0;
}
