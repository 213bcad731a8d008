/* The perf and cache endpoints (docs/server.md):
 *
 *   GET  /moe-layer-perf   the tracer's live counters, in the learn-file format
 *                          (tm_expert_stats_json: the library's one writer; tiermoe
 *                          plan and --moe-learn read what it answers)
 *   POST /moe-layer-perf   {"action":"reset"}: zero them; {"action":"snapshot"}:
 *                          answer them and zero them in one step (no count lost
 *                          between a read and a reset)
 *   GET  /moe-hot-cache    the VRAM cache: per layer its slots, the expert in each and
 *                          the GPU that holds them; per GPU its share (tm_context_gpus)
 *   POST /moe-hot-cache    {"from":"counters"}: each cached layer's most selected experts in
 *                          the live counters; {"learn": LEARN, "weighting": MODE}: the same
 *                          from an uploaded learn file (both made by tm_cache_plan); or
 *                          a plan (docs/plan-format.md) applied by tm_cache_apply
 *                          inside the fixed capacity: per layer the plan's first
 *                          experts, as many as it has slots;
 *                          experts already resident stay in their slots, newcomers
 *                          take the slots of residents the plan does not list. The
 *                          answer says what changed. Applied by the worker between
 *                          requests; a failure puts back the experts it had
 *                          replaced, so the previous cache keeps serving.
 *
 * Counters and slot maps are read under the worker's step lock. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

static bool tracer_on(srv_req *r, enum MHD_Result *res) {
    if (!srv_ready(r, res)) return false;
    if (r->s->counters) return true;
    *res = srv_reply_error(r, 409,
                           "the expert counters are off: the server was started with "
                           "--no-expert-trace");
    return false;
}

/* A text the library writes under the header's size rule, into a malloc'd *out
 * (TM_ERR_ARG asks the size when it sets *len; another TM_ERR_ARG is a bad argument). */
typedef tm_status (*text_fn)(const tm_context *c, const void *arg, char *text, size_t cap,
                             size_t *len);

static tm_status text_of(const tm_context *c, text_fn fn, const void *arg, char **out,
                         size_t *len) {
    *out = NULL, *len = SIZE_MAX;
    tm_status st = fn(c, arg, NULL, 0, len);
    if (st != TM_ERR_ARG || *len == SIZE_MAX) return srv_error_api(st);
    if (!(*out = malloc(*len + 1))) return srv_error_set(TM_ERR_NOMEM, "out of memory");
    if ((st = fn(c, arg, *out, *len + 1, len)) != TM_OK) free(*out), *out = NULL;
    return srv_error_api(st);
}

static tm_status stats_json(const tm_context *c, const void *arg, char *text, size_t cap,
                            size_t *len) {
    (void)arg;
    return tm_expert_stats_json(c, text, cap, len);
}

/* The counters' learn-file JSON (reset: zeroed in the same step). */
static json_t *perf_json(tm_server *s, bool reset) {
    size_t len = 0;
    char *text = NULL;
    pthread_mutex_lock(&s->step_mu);
    if (text_of(s->ctx, stats_json, NULL, &text, &len) == TM_OK && reset)
        tm_expert_counts_reset(s->ctx);
    pthread_mutex_unlock(&s->step_mu);
    json_t *j = text ? json_loadb(text, len, JSON_DECODE_ANY, NULL) : NULL;
    free(text);
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
    tm_expert_counts_reset(r->s->ctx);
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

/* Layer l's slots, each with its expert (-1: empty), into in_slot[0..n_expert). */
static size_t slots_read(const tm_server *s, uint32_t l, int32_t *in_slot) {
    size_t n = 0;
    return tm_cache_experts(s->ctx, l, in_slot, s->info.n_expert, &n) == TM_OK ? n : 0;
}

static json_t *int_array(const int32_t *v, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* Each GPU's share of the cache and of the routed slots of the layers it serves. */
static json_t *gpus_json(const tm_gpu_counters *g, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) {
        const tm_tier_counters *t = &g[i].tier;
        json_array_append_new(
            a, json_pack("{s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "gpu", (int)i,
                         "device", (int)g[i].device, "layers", (int)t->layers, "cache_layers",
                         (int)g[i].cache_layers, "cache_slots", (json_int_t)g[i].cache_slots,
                         "cache_bytes", (json_int_t)g[i].cache_bytes, "hot_slots",
                         (json_int_t)t->hot_slots, "pcie_slots", (json_int_t)t->pcie_slots,
                         "cold_slots", (json_int_t)t->cold_slots, "peer_copies",
                         (json_int_t)g[i].peer_copies, "peer_bytes", (json_int_t)g[i].peer_bytes));
    }
    return a;
}

enum MHD_Result srv_handle_cache_get(srv_req *r) {
    enum MHD_Result res;
    if (!cache_on(r, &res)) return res;
    tm_server *s = r->s;
    int32_t *in_slot = malloc(s->info.n_expert * sizeof(int32_t));
    json_t *layers = json_array();
    tm_counters k;
    tm_gpu_counters g[TM_MAX_GPUS];
    size_t n_gpu = 0;
    pthread_mutex_lock(&s->step_mu);
    const uint64_t bytes = tm_context_counters(s->ctx, &k) == TM_OK ? k.cache_bytes : 0;
    if (tm_context_gpus(s->ctx, g, TM_MAX_GPUS, &n_gpu) != TM_OK || n_gpu > TM_MAX_GPUS) n_gpu = 0;
    for (uint32_t l = 0; in_slot && layers && l < s->info.n_layer; l++) {
        const size_t slots = slots_read(s, l, in_slot);
        int32_t gpu = -1;
        if (!slots) continue;
        (void)tm_layer_gpu(s->ctx, l, &gpu);
        json_array_append_new(layers, json_pack("{s:i, s:i, s:i, s:o}", "layer", (int)l, "slots",
                                                (int)slots, "gpu", (int)gpu, "experts",
                                                int_array(in_slot, slots)));
    }
    pthread_mutex_unlock(&s->step_mu);
    free(in_slot);
    return srv_reply_json(r, 200,
                          json_pack("{s:I, s:o, s:o}", "cache_bytes", (json_int_t)bytes, "layers",
                                    layers, "gpus", gpus_json(g, n_gpu)));
}

typedef struct cache_job {
    char *plan; /* the plan's JSON */
    size_t len;
    json_t *ignored; /* layers the plan lists experts for that have no slots */
} cache_job;

static void cache_job_release(void *data) {
    cache_job *c = data;
    free(c->plan);
    json_decref(c->ignored);
    free(c);
}

/* Per layer with slots: the experts that came in and those that left, slot by slot
 * (the order tm_cache_apply fills them). */
static json_t *changes_json(const tm_server *s, const int32_t *before, const int32_t *after,
                            const size_t *n_slots, int *changed) {
    const uint32_t E = s->info.n_expert;
    json_t *layers = json_array();
    *changed = 0;
    for (uint32_t l = 0; layers && l < s->info.n_layer; l++) {
        if (!n_slots[l]) continue;
        json_t *added = json_array(), *removed = json_array();
        for (size_t k = 0; k < n_slots[l]; k++) {
            const int32_t b = before[(size_t)l * E + k], a = after[(size_t)l * E + k];
            if (a == b) continue;
            ++*changed;
            json_array_append_new(added, json_integer(a));
            if (b >= 0) json_array_append_new(removed, json_integer(b));
        }
        json_array_append_new(layers,
                              json_pack("{s:i, s:i, s:o, s:o}", "layer", (int)l, "slots",
                                        (int)n_slots[l], "added", added, "removed", removed));
    }
    return layers;
}

static json_t *error_json(unsigned status, const char *type, const char *msg) {
    return json_pack("{s:{s:i, s:s, s:s}}", "error", "code", (int)status, "message", msg, "type",
                     type);
}

static void cache_run(tm_server *s, srv_job *j) {
    cache_job *c = j->data;
    const uint32_t L = s->info.n_layer, E = s->info.n_expert;
    int32_t *before = malloc((size_t)L * E * sizeof(int32_t));
    int32_t *after = malloc((size_t)L * E * sizeof(int32_t));
    size_t *n_slots = calloc(L, sizeof(size_t));
    if (!before || !after || !n_slots) {
        free(before), free(after), free(n_slots);
        srv_job_finish(j, 500, error_json(500, "server_error", "out of memory"));
        return;
    }
    pthread_mutex_lock(&s->step_mu);
    for (uint32_t l = 0; l < L; l++) n_slots[l] = slots_read(s, l, before + (size_t)l * E);
    int32_t n_changed = 0;
    const tm_status st = tm_cache_apply(s->ctx, c->plan, c->len, &n_changed);
    for (uint32_t l = 0; l < L; l++) slots_read(s, l, after + (size_t)l * E);
    pthread_mutex_unlock(&s->step_mu);
    json_t *reply;
    unsigned status = 200;
    if (st == TM_OK) {
        int changed = 0;
        json_t *layers = changes_json(s, before, after, n_slots, &changed);
        reply = json_pack("{s:b, s:i, s:o, s:O}", "applied", 1, "changed", changed, "layers",
                          layers, "ignored_layers", c->ignored);
    } else if (st == TM_ERR_FORMAT || st == TM_ERR_ARG) { /* a bad plan: nothing changed */
        status = 400;
        reply = error_json(400, "invalid_request_error", tm_error_message());
    } else { /* the library put the replaced experts back */
        status = 500;
        fprintf(stderr, "tiermoe serve: /moe-hot-cache: %s\n", tm_error_message());
        reply = error_json(500, "server_error", tm_error_message());
    }
    free(before), free(after), free(n_slots);
    srv_job_finish(j, status, reply);
}

/* What tm_cache_plan plans from: a learn file's JSON (NULL: the live counters). */
typedef struct plan_from {
    const char *learn, *weighting;
} plan_from;

static tm_status plan_text(const tm_context *c, const void *arg, char *text, size_t cap,
                           size_t *len) {
    const plan_from *f = arg;
    return tm_cache_plan(c, f->learn, f->learn ? strlen(f->learn) : 0, f->weighting, text, cap,
                         len);
}

/* The layers a plan (body) lists experts for that have no slots here. */
static json_t *ignored_layers(tm_server *s, const json_t *body) {
    json_t *ignored = json_array();
    const json_t *layers = json_object_get(body, "layers");
    int32_t *in_slot = malloc(s->info.n_expert * sizeof(int32_t));
    pthread_mutex_lock(&s->step_mu);
    for (size_t l = 0; ignored && in_slot && l < json_array_size(layers) && l < s->info.n_layer;
         l++)
        if (json_array_size(json_object_get(json_array_get(layers, l), "experts")) &&
            !slots_read(s, (uint32_t)l, in_slot))
            json_array_append_new(ignored, json_integer((json_int_t)l));
    pthread_mutex_unlock(&s->step_mu);
    free(in_slot);
    return ignored;
}

enum MHD_Result srv_handle_cache_post(srv_req *r) {
    enum MHD_Result res;
    if (!cache_on(r, &res)) return res;
    json_t *body = srv_body_object(r, &res); /* parsed once, whichever form it takes */
    if (!body) return res;
    tm_server *s = r->s;
    const json_t *from = json_object_get(body, "from"), *learn = json_object_get(body, "learn");
    const json_t *w = json_object_get(body, "weighting");
    const bool counters = json_is_string(from) && !strcmp(json_string_value(from), "counters");
    const char *bad = NULL;
    if (counters && !s->counters) {
        json_decref(body);
        return srv_reply_error(r, 409, "the expert counters are off (--no-expert-trace)");
    }
    if (!counters && learn && w && !json_is_null(w) && !json_is_string(w))
        bad = "weighting: expected flat, pressure, smooth_pressure, time or balanced";
    else if (!counters && learn && !json_is_object(learn))
        bad = "learn: expected an object (a learn file, as GET /moe-layer-perf answers)";
    if (bad) {
        json_decref(body);
        return srv_reply_error(r, 400, "%s", bad);
    }
    cache_job *c = calloc(1, sizeof(*c));
    bool ok = c != NULL;
    tm_status st = TM_OK;
    if (ok && (counters || learn)) { /* planned here, applied by the worker */
        plan_from f = {.learn = counters ? NULL : json_dumps(learn, JSON_COMPACT),
                       .weighting = counters ? NULL : json_string_value(w)};
        ok = counters || f.learn;
        if (ok) {
            pthread_mutex_lock(&s->step_mu);
            st = text_of(s->ctx, plan_text, &f, &c->plan, &c->len);
            pthread_mutex_unlock(&s->step_mu);
        }
        free((char *)f.learn);
        if (ok) c->ignored = json_array();
    } else if (ok) { /* the body is the plan: the library checks it when it applies it */
        c->plan = malloc(r->body_len + 1);
        if ((ok = c->plan != NULL)) memcpy(c->plan, r->body, r->body_len), c->len = r->body_len;
        if (ok) c->plan[r->body_len] = '\0';
        c->ignored = ignored_layers(s, body);
    }
    json_decref(body);
    ok = ok && (st != TM_OK || c->ignored);
    if (!ok) {
        if (c) cache_job_release(c);
        return srv_reply_error(r, 500, "out of memory");
    }
    if (st != TM_OK) {
        cache_job_release(c);
        return srv_reply_error(r, st == TM_ERR_NOMEM || counters ? 500 : 400, "%s",
                               server_error_message());
    }
    srv_job *j = srv_job_new(cache_run, cache_job_release, c);
    if (!j) {
        cache_job_release(c);
        return srv_reply_error(r, 500, "out of memory");
    }
    return srv_reply_job(r, j, false);
}
