/* The public API's expert functions (include/tiermoe.h, "experts"): the
 * tracer's counts and their summary and file, the VRAM cache's slots and
 * plans, and the --profile report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/api_internal.h"
#include "model/model_profile.h"
#include "model/synth.h"

bool api_context_has_cache(const tm_context *c) {
    for (uint32_t l = 0; c->tier && l < c->model->cfg.n_layer; l++)
        if (tier_cache_slots(c->tier, l) > 0) return true;
    return false;
}

/* A report printed into memory (open_memstream), then copied out under the
 * header's size rule. */
typedef struct report {
    char *buf;
    size_t n;
    FILE *f;
} report;

static tm_status report_open(const char *fn, report *r) {
    *r = (report){0};
    r->f = open_memstream(&r->buf, &r->n);
    return r->f ? TM_OK : tm_error_set(TM_ERR_NOMEM, "%s: out of memory", fn);
}

static tm_status report_close(const char *fn, report *r, char *text, size_t cap, size_t *len) {
    tm_status st = fclose(r->f) ? tm_error_set(TM_ERR_NOMEM, "%s: out of memory", fn) : TM_OK;
    if (st == TM_OK) st = api_text_out(fn, r->buf, r->n, text, cap, len);
    free(r->buf);
    return st;
}

tm_status tm_context_profile(const tm_context *c, char *text, size_t cap, size_t *len) {
    const api_context *a = api_context_of(c, "tm_context_profile");
    if (!a) return TM_ERR_ARG;
    API_ARG(text || !cap, "tm_context_profile: text is NULL with cap %zu", cap);
    API_ARG(len, "tm_context_profile: len must not be NULL");
    if (!c->params.profile)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_context_profile: the context was made without profile");
    report r;
    const tm_status st = report_open("tm_context_profile", &r);
    if (st != TM_OK) return st;
    model_profile_print(c, NULL, NULL, NULL, 1, r.f);
    model_store_print(c, NULL, (double)a->eval_ns * 1e-9, r.f);
    synth_routing_print(c->model->file, r.f);
    return report_close("tm_context_profile", &r, text, cap, len);
}

/* ---- experts ---- */

#define API_LAYER(fn, c, layer)                                                                    \
    API_ARG((layer) < (c)->model->cfg.n_layer, fn ": layer %u is not in [0, %u)", (layer),         \
            (c)->model->cfg.n_layer)

tm_status tm_expert_counts(const tm_context *c, uint32_t layer, uint64_t *counts, size_t cap) {
    const api_context *a = api_context_of(c, "tm_expert_counts");
    if (!a) return TM_ERR_ARG;
    API_LAYER("tm_expert_counts", c, layer);
    const uint32_t E = c->model->cfg.n_expert;
    API_ARG(counts && cap >= E, "tm_expert_counts: counts needs room for %u (cap is %zu)", E, cap);
    if (!a->tr)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_expert_counts: the context was made without expert_stats");
    memcpy(counts, trace_get_stats(a->tr)->layers[layer].experts, E * sizeof(uint64_t));
    return TM_OK;
}

tm_status tm_expert_counts_reset(tm_context *c) {
    const api_context *a = api_context_of(c, "tm_expert_counts_reset");
    if (!a) return TM_ERR_ARG;
    if (!a->tr)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_expert_counts_reset: the context was made without expert_stats");
    trace_reset(a->tr);
    return TM_OK;
}

/* The context's tracer, or NULL after TM_ERR_UNSUPPORTED naming fn. */
static const tm_trace *context_tracer(const api_context *a, const char *fn) {
    if (!a->tr)
        tm_error_set(TM_ERR_UNSUPPORTED, "%s: the context was made without expert_stats", fn);
    return a->tr;
}

tm_status tm_expert_stats_summary(const tm_context *c, bool per_layer, char *text, size_t cap,
                                  size_t *len) {
    const api_context *a = api_context_of(c, "tm_expert_stats_summary");
    if (!a) return TM_ERR_ARG;
    API_ARG(text || !cap, "tm_expert_stats_summary: text is NULL with cap %zu", cap);
    API_ARG(len, "tm_expert_stats_summary: len must not be NULL");
    const tm_trace *tr = context_tracer(a, "tm_expert_stats_summary");
    if (!tr) return TM_ERR_UNSUPPORTED;
    report r;
    const tm_status st = report_open("tm_expert_stats_summary", &r);
    if (st != TM_OK) return st;
    trace_stats_print(trace_get_stats(tr), per_layer, r.f);
    return report_close("tm_expert_stats_summary", &r, text, cap, len);
}

tm_status tm_expert_stats_write(const tm_context *c, const char *path) {
    const api_context *a = api_context_of(c, "tm_expert_stats_write");
    if (!a) return TM_ERR_ARG;
    API_ARG(path && path[0], "tm_expert_stats_write: path must not be NULL or empty");
    const tm_trace *tr = context_tracer(a, "tm_expert_stats_write");
    if (!tr) return TM_ERR_UNSUPPORTED;
    const tm_status st = trace_stats_write(trace_get_stats(tr), path);
    return st != TM_OK ? tm_error_wrap(st, "tm_expert_stats_write") : TM_OK;
}

tm_status tm_expert_stats_json(const tm_context *c, char *text, size_t cap, size_t *len) {
    const api_context *a = api_context_of(c, "tm_expert_stats_json");
    if (!a) return TM_ERR_ARG;
    API_ARG(text || !cap, "tm_expert_stats_json: text is NULL with cap %zu", cap);
    API_ARG(len, "tm_expert_stats_json: len must not be NULL");
    const tm_trace *tr = context_tracer(a, "tm_expert_stats_json");
    if (!tr) return TM_ERR_UNSUPPORTED;
    json_t *root = trace_stats_to_json(trace_get_stats(tr));
    /* as trace_stats_write_json writes it */
    char *s = root ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) return tm_error_set(TM_ERR_NOMEM, "tm_expert_stats_json: out of memory");
    const tm_status st = api_text_out("tm_expert_stats_json", s, strlen(s), text, cap, len);
    free(s);
    return st;
}

/* Each slot's expert (-1: empty) of layer l into in_slot[0..slots). */
static void slots_read(const tm_context *c, uint32_t l, int32_t *in_slot, int32_t slots) {
    for (int32_t k = 0; k < slots; k++) in_slot[k] = -1;
    for (uint32_t e = 0; e < c->model->cfg.n_expert; e++) {
        const int32_t k = tier_slot_of(c->tier, l, (int32_t)e);
        if (k >= 0 && k < slots) in_slot[k] = (int32_t)e;
    }
}

int32_t api_layer_slots(const tm_context *c, uint32_t l) {
    return c->tier ? tier_cache_slots(c->tier, l) : 0;
}

tm_status tm_cache_experts(const tm_context *c, uint32_t layer, int32_t *experts, size_t cap,
                           size_t *n_slots) {
    const api_context *a = api_context_of(c, "tm_cache_experts");
    if (!a) return TM_ERR_ARG;
    API_LAYER("tm_cache_experts", c, layer);
    API_ARG(experts || !cap, "tm_cache_experts: experts is NULL with cap %zu", cap);
    API_ARG(n_slots, "tm_cache_experts: n_slots must not be NULL");
    const int32_t slots = api_layer_slots(c, layer);
    *n_slots = slots > 0 ? (size_t)slots : 0;
    API_ARG(*n_slots <= cap, "tm_cache_experts: experts has room for %zu, layer %u has %zu slots",
            cap, layer, *n_slots);
    if (slots > 0) slots_read(c, layer, experts, slots);
    return TM_OK;
}

tm_status tm_cache_apply(tm_context *c, const char *plan_json, size_t len, int32_t *n_changed) {
    api_context *a = api_context_of(c, "tm_cache_apply");
    if (!a) return TM_ERR_ARG;
    API_ARG(plan_json, "tm_cache_apply: plan_json must not be NULL");
    tm_trace_shape shape;
    model_trace_shape(c->model, &shape);
    tm_plan plan;
    tm_status st = plan_parse_json(plan_json, len, "tm_cache_apply: plan", &shape, &plan);
    if (st != TM_OK) return st;
    if (!api_context_has_cache(c)) {
        plan_free(&plan);
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "tm_cache_apply: the context has no VRAM expert cache (it needs a GPU, "
                            "experts in RAM: cpu_moe or n_cpu_moe, and moe_cache_mib or "
                            "moe_cache_plan)");
    }
    const uint32_t L = c->model->cfg.n_layer;
    int64_t total = 0;
    for (uint32_t l = 0; l < L; l++) total += api_layer_slots(c, l) > 0 ? api_layer_slots(c, l) : 0;
    tm_plan_change *ch = malloc(((size_t)total + 1) * sizeof(*ch));
    if (!ch) {
        plan_free(&plan);
        return tm_error_set(TM_ERR_NOMEM, "tm_cache_apply: out of memory");
    }
    int32_t n_ch = 0, done = 0;
    for (uint32_t l = 0; l < L; l++) {
        const int32_t slots = api_layer_slots(c, l);
        if (slots <= 0) continue; /* a plan's layer without slots is left as it is */
        slots_read(c, l, a->in_slot, slots);
        plan_cache_diff(&plan, l, a->in_slot, slots, ch, &n_ch);
    }
    for (; done < n_ch && st == TM_OK; done++)
        st = tier_cache_set(c->tier, ch[done].layer, ch[done].slot, ch[done].after);
    if (st != TM_OK) { /* undo, newest first: each old expert back to its slot */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", tm_error_message());
        for (int32_t i = done - 1; i >= 0; i--)
            if (ch[i].before >= 0) tier_cache_set(c->tier, ch[i].layer, ch[i].slot, ch[i].before);
        tm_error_set(st, "tm_cache_apply: %s (the previous experts were put back)", msg);
    }
    if (st == TM_OK && n_changed) *n_changed = n_ch;
    free(ch);
    plan_free(&plan);
    return st;
}

tm_status tm_cache_update(tm_context *c) {
    if (!api_context_of(c, "tm_cache_update")) return TM_ERR_ARG;
    if (!api_context_has_cache(c)) return TM_OK;
    return tier_cache_update(c->tier, TM_MOE_UPDATE_RATE); /* nothing with the updater off */
}
