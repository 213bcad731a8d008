/* tm_cache_plan (include/tiermoe.h): a plan for the VRAM cache's fixed slots
 * from the live expert counts or a learn file, what POST /moe-hot-cache
 * makes before applying it (tm_cache_apply). */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/api_internal.h"
#include "model/layout.h"

/* Per cached layer its most selected experts in obs (ties: the lower id), as many as it
 * has slots. With the capacity of every layer fixed, a weighting between layers has
 * nothing to decide: within a layer every mode ranks by share (balanced by rank, the
 * same order). */
static tm_status plan_from_stats(const tm_context *c, const tm_trace_stats *obs,
                                 const tm_trace_shape *shape, tm_plan *plan) {
    tm_model_layout lay;
    tm_status st = model_layout_scan(c->model->file, &lay);
    if (st != TM_OK) return st;
    const uint32_t E = shape->n_expert;
    int32_t *ids = malloc(E * sizeof(int32_t));
    if (!ids) st = tm_error_set(TM_ERR_NOMEM, "tm_cache_plan: out of memory");
    if (st == TM_OK) st = plan_init(plan, shape);
    for (uint32_t l = 0; l < shape->n_layer && st == TM_OK; l++) {
        const int32_t slots = api_layer_slots(c, l);
        if (slots <= 0) continue;
        const uint64_t *hits = obs->layers[l].experts;
        for (uint32_t e = 0; e < E; e++) ids[e] = (int32_t)e;
        for (int32_t i = 0; i < slots; i++) /* partial selection sort: slots is small */
            for (uint32_t j = (uint32_t)i + 1; j < E; j++)
                if (hits[ids[j]] > hits[ids[i]] ||
                    (hits[ids[j]] == hits[ids[i]] && ids[j] < ids[i])) {
                    const int32_t t = ids[i];
                    ids[i] = ids[j], ids[j] = t;
                }
        st = plan_set_layer(plan, l, ids, slots,
                            l < lay.n_layer && E ? lay.layer_expert_bytes[l] / E : 1);
    }
    free(ids);
    model_layout_free(&lay);
    return st;
}

/* The learn file's observations of this model's shape. */
static tm_status learn_parse(const char *text, size_t len, const tm_trace_shape *shape,
                             tm_trace_stats *obs) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root)
        return tm_error_set(TM_ERR_FORMAT, "tm_cache_plan: learn: not JSON: %s (line %d)",
                            jerr.text, jerr.line);
    if (!json_is_object(root)) {
        json_decref(root);
        return tm_error_set(TM_ERR_ARG, "learn: expected an object (a learn file, as GET "
                                        "/moe-layer-perf answers)");
    }
    const tm_status st = trace_stats_from_json(root, "learn", shape, obs);
    json_decref(root);
    return st;
}

tm_status tm_cache_plan(const tm_context *c, const char *learn_json, size_t learn_len,
                        const char *weighting, char *plan_json, size_t cap, size_t *len) {
    const api_context *a = api_context_of(c, "tm_cache_plan");
    if (!a) return TM_ERR_ARG;
    API_ARG(plan_json || !cap, "tm_cache_plan: plan_json is NULL with cap %zu", cap);
    API_ARG(len, "tm_cache_plan: len must not be NULL");
    tm_plan_weighting mode = TM_PLAN_FLAT;
    API_ARG(!weighting || plan_weighting_parse(weighting, &mode) == TM_OK,
            "tm_cache_plan: weighting: expected flat, pressure, smooth_pressure, time or balanced "
            "(not '%s')",
            weighting);
    tm_trace_shape shape;
    model_trace_shape(c->model, &shape);
    tm_trace_stats learned;
    const tm_trace_stats *obs = NULL;
    tm_status st = TM_OK;
    if (learn_json) {
        if ((st = learn_parse(learn_json, learn_len, &shape, &learned)) != TM_OK) return st;
        obs = &learned;
    } else if (a->tr) {
        obs = trace_get_stats(a->tr);
    } else {
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_cache_plan: the context was made without expert_stats (no live "
                            "counts to plan from)");
    }
    if (!api_context_has_cache(c))
        st =
            tm_error_set(TM_ERR_UNSUPPORTED, "tm_cache_plan: the context has no VRAM expert cache");
    tm_plan plan;
    memset(&plan, 0, sizeof(plan));
    if (st == TM_OK) st = plan_from_stats(c, obs, &shape, &plan);
    if (st == TM_OK) { /* the budget: the cache's VRAM (a plan file's used <= budget) */
        const uint64_t cache = tier_cache_bytes(c->tier);
        plan.mode = mode;
        plan.budget_bytes = cache > plan.used_bytes ? cache : plan.used_bytes;
    }
    json_t *root = st == TM_OK ? plan_to_json(&plan) : NULL;
    char *s = root ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
    if (st == TM_OK && !s) st = tm_error_set(TM_ERR_NOMEM, "tm_cache_plan: out of memory");
    if (st == TM_OK) st = api_text_out("tm_cache_plan", s, strlen(s), plan_json, cap, len);
    free(s);
    json_decref(root);
    plan_free(&plan);
    if (learn_json) trace_stats_free(&learned);
    return st;
}
