/* The perf and cache endpoints (docs/server.md):
 *
 *   GET  /moe-layer-perf   the tracer's live counters, in the learn-file format
 *                          (trace_stats_to_json: the one writer; tiermoe plan and
 *                          --moe-learn read what it answers)
 *   POST /moe-layer-perf   {"action":"reset"}: zero them; {"action":"snapshot"}:
 *                          answer them and zero them in one step (no count lost
 *                          between a read and a reset)
 *   GET  /moe-hot-cache    the VRAM cache: per layer its slots and the expert in each
 *   POST /moe-hot-cache    {"from":"counters"}: each cached layer's most selected experts in
 *                          the live counters; {"learn": LEARN, "weighting": MODE}: the same
 *                          from an uploaded learn file; or a plan (docs/plan-format.md, plan_from_json with the
 *                          model's shape) applied inside the fixed capacity: per
 *                          layer the plan's first tier_cache_slots(layer) experts;
 *                          experts already resident stay in their slots, newcomers
 *                          take the slots of residents the plan does not list. The
 *                          answer says what changed. Applied by the worker between
 *                          requests; a failure puts back the experts it had
 *                          replaced, so the previous cache keeps serving.
 *
 * Counters and slot maps are read under the worker's step lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h" /* interim: the counters and the cache until the API has them */
#include "model/layout.h"
#include "server/server_internal.h"
#include "tier/plan.h"

/* The context's tracer (NULL: --no-expert-trace). */
static tm_trace *tracer(const tm_server *s) {
    return s->counters ? ((const api_context *)s->ctx->api)->tr : NULL;
}

static bool tracer_on(srv_req *r, enum MHD_Result *res) {
    if (!srv_ready(r, res)) return false;
    if (tracer(r->s)) return true;
    *res = srv_reply_error(r, 409,
                           "the expert counters are off: the server was started with "
                           "--no-expert-trace");
    return false;
}

static json_t *perf_json(tm_server *s, bool reset) {
    pthread_mutex_lock(&s->step_mu);
    json_t *j = trace_stats_to_json(trace_get_stats(tracer(s)));
    if (j && reset) trace_reset(tracer(s));
    pthread_mutex_unlock(&s->step_mu);
    return j;
}

enum MHD_Result srv_handle_perf_get(srv_req *r) {
    enum MHD_Result res;
    if (!tracer_on(r, &res)) return res;
    json_t *j = perf_json(r->s, false);
    return j ? srv_reply_json(r, 200, j) : srv_reply_error(r, 500, "out of memory");
}

enum MHD_Result srv_handle_perf_post(srv_req *r) {
    enum MHD_Result res;
    if (!tracer_on(r, &res)) return res;
    json_t *body = srv_body_object(r, &res);
    if (!body) return res;
    const json_t *a = json_object_get(body, "action");
    const char *action = json_is_string(a) ? json_string_value(a) : "";
    const bool snapshot = !strcmp(action, "snapshot"), reset = !strcmp(action, "reset");
    json_decref(body);
    if (!snapshot && !reset)
        return srv_reply_error(r, 400, "action: expected \"reset\" or \"snapshot\"");
    if (snapshot) {
        json_t *j = perf_json(r->s, true);
        return j ? srv_reply_json(r, 200, j) : srv_reply_error(r, 500, "out of memory");
    }
    pthread_mutex_lock(&r->s->step_mu);
    trace_reset(tracer(r->s));
    pthread_mutex_unlock(&r->s->step_mu);
    return srv_reply_json(r, 200, json_pack("{s:s, s:b}", "action", "reset", "ok", 1));
}

/* ---- the VRAM cache ---- */

static bool cache_on(srv_req *r, enum MHD_Result *res) {
    if (!srv_ready(r, res)) return false;
    if (r->s->has_cache) return true;
    *res = srv_reply_error(r, 409,
                           "this context has no VRAM expert cache: start the server with "
                           "--moe-cache MIB (or --moe-cache-plan FILE) and experts in RAM "
                           "(--cpu-moe or --n-cpu-moe N) on a GPU");
    return false;
}

/* Each slot's expert (-1: empty) of layer l; slots: tier_cache_slots(l). */
static void slots_read(const tm_server *s, uint32_t l, int32_t *in_slot, int32_t slots) {
    for (int32_t k = 0; k < slots; k++) in_slot[k] = -1;
    for (uint32_t e = 0; e < s->m->cfg.n_expert; e++) {
        const int32_t k = tier_slot_of(s->ctx->tier, l, (int32_t)e);
        if (k >= 0 && k < slots) in_slot[k] = (int32_t)e;
    }
}

static json_t *int_array(const int32_t *v, int32_t n) {
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

enum MHD_Result srv_handle_cache_get(srv_req *r) {
    enum MHD_Result res;
    if (!cache_on(r, &res)) return res;
    tm_server *s = r->s;
    int32_t *in_slot = malloc(s->m->cfg.n_expert * sizeof(int32_t));
    json_t *layers = json_array();
    pthread_mutex_lock(&s->step_mu);
    const uint64_t bytes = tier_cache_bytes(s->ctx->tier);
    for (uint32_t l = 0; in_slot && layers && l < s->m->cfg.n_layer; l++) {
        const int32_t slots = tier_cache_slots(s->ctx->tier, l);
        if (slots <= 0) continue;
        slots_read(s, l, in_slot, slots);
        json_array_append_new(layers, json_pack("{s:i, s:i, s:o}", "layer", (int)l, "slots",
                                                (int)slots, "experts", int_array(in_slot, slots)));
    }
    pthread_mutex_unlock(&s->step_mu);
    free(in_slot);
    return srv_reply_json(
        r, 200, json_pack("{s:I, s:o}", "cache_bytes", (json_int_t)bytes, "layers", layers));
}

typedef struct cache_job {
    tm_plan plan;
} cache_job;

static void cache_job_release(void *data) {
    cache_job *c = data;
    plan_free(&c->plan);
    free(c);
}

static json_t *changes_json(const tm_server *s, const tm_plan_change *ch, int32_t n) {
    json_t *layers = json_array();
    for (uint32_t l = 0; layers && l < s->m->cfg.n_layer; l++) {
        const int32_t slots = tier_cache_slots(s->ctx->tier, l);
        if (slots <= 0) continue;
        json_t *added = json_array(), *removed = json_array();
        for (int32_t i = 0; i < n; i++) {
            if (ch[i].layer != l) continue;
            json_array_append_new(added, json_integer(ch[i].after));
            if (ch[i].before >= 0) json_array_append_new(removed, json_integer(ch[i].before));
        }
        json_array_append_new(layers, json_pack("{s:i, s:i, s:o, s:o}", "layer", (int)l, "slots",
                                                (int)slots, "added", added, "removed", removed));
    }
    return layers;
}

static void cache_run(tm_server *s, srv_job *j) {
    const tm_plan *plan = &((cache_job *)j->data)->plan;
    const uint32_t n_layer = s->m->cfg.n_layer;
    int32_t total = 0, n_ch = 0;
    for (uint32_t l = 0; l < n_layer; l++) total += tier_cache_slots(s->ctx->tier, l);
    tm_plan_change *ch = malloc(((size_t)total + 1) * sizeof(*ch));
    int32_t *in_slot = malloc(s->m->cfg.n_expert * sizeof(int32_t));
    json_t *ignored = json_array();
    if (!ch || !in_slot || !ignored) {
        free(ch), free(in_slot), json_decref(ignored);
        srv_job_finish(j, 500,
                       json_pack("{s:{s:i, s:s, s:s}}", "error", "code", 500, "message",
                                 "out of memory", "type", "server_error"));
        return;
    }
    pthread_mutex_lock(&s->step_mu);
    for (uint32_t l = 0; l < n_layer; l++) {
        const int32_t slots = tier_cache_slots(s->ctx->tier, l);
        if (slots <= 0) {
            if (plan->n_slots[l] > 0) json_array_append_new(ignored, json_integer(l));
            continue;
        }
        slots_read(s, l, in_slot, slots);
        plan_cache_diff(plan, l, in_slot, slots, ch, &n_ch);
    }
    tm_status st = TM_OK;
    int32_t done = 0;
    for (; done < n_ch && st == TM_OK; done++)
        st = tier_cache_set(s->ctx->tier, ch[done].layer, ch[done].slot, ch[done].after);
    char msg[600] = "";
    if (st != TM_OK) { /* undo, newest first: each old expert goes back to its slot */
        snprintf(msg, sizeof(msg), "%s", tm_error_message());
        bool undone = true;
        for (int32_t i = done - 1; i >= 0; i--)
            if (ch[i].before >= 0 &&
                tier_cache_set(s->ctx->tier, ch[i].layer, ch[i].slot, ch[i].before) != TM_OK)
                undone = false;
        fprintf(stderr, "tiermoe serve: /moe-hot-cache: %s; %s\n", msg,
                undone ? "the previous cache was put back" : "the cache could not be put back");
    }
    json_t *reply = st == TM_OK
                        ? json_pack("{s:b, s:i, s:o, s:o}", "applied", 1, "changed", (int)n_ch,
                                    "layers", changes_json(s, ch, n_ch), "ignored_layers", ignored)
                        : json_pack("{s:{s:i, s:s, s:s}}", "error", "code", 500, "message", msg,
                                    "type", "server_error");
    pthread_mutex_unlock(&s->step_mu);
    if (st != TM_OK) json_decref(ignored);
    free(ch), free(in_slot);
    srv_job_finish(j, st == TM_OK ? 200 : 500, reply);
}

/* Per cached layer its most selected experts in obs (ties: the lower id), as many as it
 * has slots. With the capacity of every layer fixed, a weighting between layers has
 * nothing to decide: within a layer every mode ranks by share (balanced by rank, the
 * same order). The caller holds the step lock when obs is the live counters. */
static tm_status plan_from_stats(tm_server *s, const tm_trace_stats *obs, tm_plan *plan) {
    tm_trace_shape shape;
    model_trace_shape(s->m, &shape);
    tm_model_layout lay;
    tm_status st = model_layout_scan(s->m->file, &lay);
    if (st != TM_OK) return st;
    const uint32_t E = shape.n_expert;
    int32_t *ids = malloc(E * sizeof(int32_t));
    if (!ids) st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    if (st == TM_OK) st = plan_init(plan, &shape);
    for (uint32_t l = 0; l < shape.n_layer && st == TM_OK; l++) {
        const int32_t slots = tier_cache_slots(s->ctx->tier, l);
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

/* {"from": "counters"}: from the live counters. */
static tm_status plan_from_counters(tm_server *s, tm_plan *plan) {
    pthread_mutex_lock(&s->step_mu);
    const tm_status st = plan_from_stats(s, trace_get_stats(tracer(s)), plan);
    pthread_mutex_unlock(&s->step_mu);
    return st;
}

/* {"learn": LEARN, "weighting": MODE}: from a learn file's observations (the format
 * /moe-layer-perf answers and tiermoe trace writes) of this model's shape; the
 * weighting, optional, must name a mode (see plan_from_stats). 400 on a bad one. */
static tm_status plan_from_learn(tm_server *s, const json_t *body, tm_plan *plan) {
    const json_t *w = json_object_get(body, "weighting");
    tm_plan_weighting mode = TM_PLAN_FLAT;
    if (w && !json_is_null(w) &&
        (!json_is_string(w) || plan_weighting_parse(json_string_value(w), &mode) != TM_OK))
        return tm_error_set(TM_ERR_ARG,
                            "weighting: expected flat, pressure, smooth_pressure, time or "
                            "balanced");
    tm_trace_shape shape;
    model_trace_shape(s->m, &shape);
    const json_t *learn = json_object_get(body, "learn");
    if (!json_is_object(learn))
        return tm_error_set(TM_ERR_ARG, "learn: expected an object (a learn file, as GET "
                                        "/moe-layer-perf answers)");
    tm_trace_stats obs;
    tm_status st = trace_stats_from_json(learn, "learn", &shape, &obs);
    if (st != TM_OK) return st;
    st = plan_from_stats(s, &obs, plan);
    if (st == TM_OK) plan->mode = mode;
    trace_stats_free(&obs);
    return st;
}

enum MHD_Result srv_handle_cache_post(srv_req *r) {
    enum MHD_Result res;
    if (!cache_on(r, &res)) return res;
    json_t *body = srv_body_object(r, &res); /* parsed once, whichever form it takes */
    if (!body) return res;
    const json_t *from = json_object_get(body, "from");
    const bool counters = json_is_string(from) && !strcmp(json_string_value(from), "counters");
    const bool learn = json_object_get(body, "learn") != NULL;
    if (counters && !tracer(r->s)) {
        json_decref(body);
        return srv_reply_error(r, 409, "the expert counters are off (--no-expert-trace)");
    }
    cache_job *c = calloc(1, sizeof(*c));
    if (!c) {
        json_decref(body);
        return srv_reply_error(r, 500, "out of memory");
    }
    tm_trace_shape shape;
    model_trace_shape(r->s->m, &shape);
    const tm_status st = counters ? plan_from_counters(r->s, &c->plan)
                         : learn  ? plan_from_learn(r->s, body, &c->plan)
                                  : plan_from_json(body, "request body", &shape, &c->plan);
    json_decref(body);
    if (st != TM_OK) {
        cache_job_release(c);
        return srv_reply_error(r, st == TM_ERR_NOMEM || counters ? 500 : 400, "%s",
                               tm_error_message());
    }
    srv_job *j = srv_job_new(cache_run, cache_job_release, c);
    if (!j) {
        cache_job_release(c);
        return srv_reply_error(r, 500, "out of memory");
    }
    return srv_reply_job(r, j, false);
}
