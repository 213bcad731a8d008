/* GET /metrics: Prometheus text format (version 0.0.4). The server's own
 * counters (HTTP replies by status, generations by outcome, prompt and
 * generated tokens and their time, the last request's speeds, the queue) and
 * the tier's per layer class (tm_context_counters: slots by lane, bytes, lane
 * times, cache admissions and exchanges) and per GPU (tm_context_gpus: the
 * same of the layers it serves, its cache, its peer copies), read under the
 * worker's step lock. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
}

void srv_metrics_free(srv_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

void srv_metrics_http(srv_metrics *m, unsigned status) {
    pthread_mutex_lock(&m->mu);
    m->c.http[status < 600 ? status : 599]++;
    pthread_mutex_unlock(&m->mu);
}

/* A growing text buffer. */
typedef struct text {
    char *p;
    size_t len, cap;
    bool failed;
} text;

__attribute__((format(printf, 2, 3))) static void put(text *t, const char *fmt, ...) {
    for (int pass = 0; pass < 2 && !t->failed; pass++) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->p && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap : 8192;
        while (cap <= t->len + (size_t)n) cap *= 2;
        char *q = realloc(t->p, cap);
        if (!q) t->failed = true;
        t->p = q ? q : t->p, t->cap = q ? cap : t->cap;
    }
}

static void family(text *t, const char *name, const char *type, const char *help) {
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *const class_label[TM_LAYER_CLASSES] = {"vram", "ram", "cached"};

/* One tier counter family: a sample per layer class (and lane). */
typedef struct tier_metric {
    const char *name, *help, *lane;
    size_t offset; /* of the uint64_t in tm_tier_counters */
    double scale;  /* ns to seconds, or 1 */
} tier_metric;

#define TS(f) offsetof(tm_tier_counters, f)
static const tier_metric tier_metrics[] = {
    {"tiermoe_tier_layer_steps_total", "MoE steps of the layers of a class", NULL, TS(steps), 1},
    {"tiermoe_tier_slots_total",
     "routed slots by the lane that computed them (hot: GPU from "
     "VRAM; pcie: GPU reading RAM; cold: CPU; fetch: prompts' experts in RAM computed by the "
     "GPU; fallback: taken by the CPU after a failed copy)",
     "hot", TS(hot_slots), 1},
    {NULL, NULL, "pcie", TS(pcie_slots), 1},
    {NULL, NULL, "cold", TS(cold_slots), 1},
    {NULL, NULL, "fetch", TS(fetch_slots), 1},
    {NULL, NULL, "fallback", TS(fallback_slots), 1},
    {"tiermoe_tier_bytes_total",
     "expert weight bytes read by each lane (upload: the VRAM "
     "cache's uploads)",
     "hot", TS(hot_bytes), 1},
    {NULL, NULL, "pcie", TS(pcie_bytes), 1},
    {NULL, NULL, "cold", TS(cold_bytes), 1},
    {NULL, NULL, "fetch", TS(fetch_bytes), 1},
    {NULL, NULL, "upload", TS(upload_bytes), 1},
    {"tiermoe_tier_lane_seconds_total",
     "time of each lane (hot, pcie, fetch, copy, copy_wait, "
     "gpu_wait and merge are measured only with --profile)",
     "hot", TS(hot_ns), 1e-9},
    {NULL, NULL, "pcie", TS(pcie_ns), 1e-9},
    {NULL, NULL, "cold", TS(cold_ns), 1e-9},
    {NULL, NULL, "host_wait", TS(wait_ns), 1e-9},
    {NULL, NULL, "gpu_wait", TS(gpu_wait_ns), 1e-9},
    {NULL, NULL, "merge", TS(merge_ns), 1e-9},
    {NULL, NULL, "fetch", TS(fetch_ns), 1e-9},
    {NULL, NULL, "copy", TS(copy_ns), 1e-9},
    {NULL, NULL, "copy_wait", TS(copy_wait_ns), 1e-9},
    {"tiermoe_tier_fetched_experts_total", "prompts: experts in RAM the GPU computed", NULL,
     TS(fetch_experts), 1},
    {"tiermoe_tier_cache_admits_total", "experts uploaded into the VRAM cache after a step", NULL,
     TS(admits), 1},
    {"tiermoe_tier_cache_exchanges_total", "experts exchanged by the updater between requests",
     NULL, TS(exchanges), 1},
};
#undef TS

/* The SSD tier (--ram-cache, docs/ssd.md). */
static void ssd_section(text *t, const tm_ssd_counters *s) {
    const struct {
        const char *name, *help;
        uint64_t v;
    } c[] = {
        {"tiermoe_ssd_routed_experts_total", "distinct experts layer steps asked the RAM cache for",
         s->routed},
        {"tiermoe_ssd_hits_total", "... that were resident", s->hits},
        {"tiermoe_ssd_experts_faulted_total",
         "experts read from the file because a step needed them", s->faults},
        {"tiermoe_ssd_experts_prefetched_total",
         "experts read ahead (predicted by the next layers' routers, or one-token lag)",
         s->prefetched},
        {"tiermoe_ssd_bytes_read_total", "bytes read from the file", s->bytes_read},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        family(t, c[i].name, "counter", c[i].help);
        put(t, "%s %llu\n", c[i].name, (unsigned long long)c[i].v);
    }
    family(t, "tiermoe_ssd_read_wait_seconds_total", "counter", "the CPU lane waiting for reads");
    put(t, "tiermoe_ssd_read_wait_seconds_total %.6f\n", s->wait_ns * 1e-9);
    family(t, "tiermoe_ssd_max_resident_experts", "gauge",
           "experts resident in one layer, at most");
    put(t, "tiermoe_ssd_max_resident_experts %d\n", s->max_resident);
}

static void tier_section(text *t, const tm_tier_counters *ts, uint64_t cache_bytes) {
    family(t, "tiermoe_tier_layers", "gauge", "layers by where their experts are");
    for (int c = 0; c < TM_LAYER_CLASSES; c++)
        put(t, "tiermoe_tier_layers{class=\"%s\"} %u\n", class_label[c], ts[c].layers);
    const char *name = NULL;
    for (size_t i = 0; i < sizeof(tier_metrics) / sizeof(tier_metrics[0]); i++) {
        const tier_metric *m = &tier_metrics[i];
        if (m->name) family(t, name = m->name, "counter", m->help);
        for (int c = 0; c < TM_LAYER_CLASSES; c++) {
            if (!ts[c].layers) continue;
            const uint64_t v = *(const uint64_t *)((const char *)&ts[c] + m->offset);
            if (m->lane)
                put(t, "%s{class=\"%s\",lane=\"%s\"} %.9g\n", name, class_label[c], m->lane,
                    v * m->scale);
            else
                put(t, "%s{class=\"%s\"} %.9g\n", name, class_label[c], v * m->scale);
        }
    }
    family(t, "tiermoe_tier_cache_bytes", "gauge", "VRAM the expert cache holds");
    put(t, "tiermoe_tier_cache_bytes %llu\n", (unsigned long long)cache_bytes);
}

/* Per GPU (label gpu: its index in the context's list, device: CUDAn). */
static void gpu_section(text *t, const tm_gpu_counters *g, size_t n) {
    static const char *const lane[3] = {"hot", "pcie", "cold"};
    family(t, "tiermoe_gpu_slots_total", "counter",
           "routed slots of the layers a GPU serves, by the lane that computed them");
    for (size_t i = 0; i < n; i++) {
        const uint64_t v[3] = {g[i].tier.hot_slots, g[i].tier.pcie_slots, g[i].tier.cold_slots};
        for (int k = 0; k < 3; k++)
            put(t, "tiermoe_gpu_slots_total{gpu=\"%zu\",device=\"CUDA%d\",lane=\"%s\"} %llu\n", i,
                g[i].device, lane[k], (unsigned long long)v[k]);
    }
    family(t, "tiermoe_gpu_lane_seconds_total", "counter",
           "time of a GPU's lanes (hot, pcie, gpu_wait: measured only with --profile)");
    for (size_t i = 0; i < n; i++) {
        const uint64_t v[3] = {g[i].tier.hot_ns, g[i].tier.pcie_ns, g[i].tier.gpu_wait_ns};
        static const char *const tl[3] = {"hot", "pcie", "gpu_wait"};
        for (int k = 0; k < 3; k++)
            put(t,
                "tiermoe_gpu_lane_seconds_total{gpu=\"%zu\",device=\"CUDA%d\",lane=\"%s\"} %.9g\n",
                i, g[i].device, tl[k], v[k] * 1e-9);
    }
    const struct {
        const char *name, *type, *help;
        size_t off;
        double scale;
    } f[] = {
        {"tiermoe_gpu_cache_slots", "gauge", "VRAM cache slots a GPU holds",
         offsetof(tm_gpu_counters, cache_slots), 1},
        {"tiermoe_gpu_cache_bytes", "gauge", "VRAM a GPU's cache slots take",
         offsetof(tm_gpu_counters, cache_bytes), 1},
        {"tiermoe_gpu_peer_copies_total", "counter",
         "activations copied into a GPU from another at span boundaries",
         offsetof(tm_gpu_counters, peer_copies), 1},
        {"tiermoe_gpu_peer_bytes_total", "counter", "... their bytes",
         offsetof(tm_gpu_counters, peer_bytes), 1},
        {"tiermoe_gpu_peer_seconds_total", "counter", "... their time (only with --profile)",
         offsetof(tm_gpu_counters, peer_ns), 1e-9},
    };
    for (size_t j = 0; j < sizeof(f) / sizeof(f[0]); j++) {
        family(t, f[j].name, f[j].type, f[j].help);
        for (size_t i = 0; i < n; i++)
            put(t, "%s{gpu=\"%zu\",device=\"CUDA%d\"} %.9g\n", f[j].name, i, g[i].device,
                *(const uint64_t *)((const char *)&g[i] + f[j].off) * f[j].scale);
    }
}

enum MHD_Result srv_handle_metrics(srv_req *r) {
    tm_server *s = r->s;
    pthread_mutex_lock(&s->metrics.mu);
    const srv_counts m = s->metrics.c;
    pthread_mutex_unlock(&s->metrics.mu);
    text t = {0};
    family(&t, "tiermoe_http_requests_total", "counter", "HTTP replies by status code");
    for (unsigned c = 100; c < 600; c++)
        if (m.http[c])
            put(&t, "tiermoe_http_requests_total{code=\"%u\"} %llu\n", c,
                (unsigned long long)m.http[c]);
    family(&t, "tiermoe_http_read_timeouts_total", "counter",
           "connections cut for not sending a request within --read-timeout");
    put(&t, "tiermoe_http_read_timeouts_total %llu\n",
        (unsigned long long)srv_watch_cut_count(&s->watch));
    family(&t, "tiermoe_requests_total", "counter",
           "generation requests by outcome (cancelled: the client left or the server stopped)");
    static const char *const outcome[3] = {"ok", "cancelled", "error"};
    for (int i = 0; i < 3; i++)
        put(&t, "tiermoe_requests_total{outcome=\"%s\"} %llu\n", outcome[i],
            (unsigned long long)m.requests[i]);
    family(&t, "tiermoe_prompt_tokens_total", "counter", "prompt tokens of requests");
    put(&t, "tiermoe_prompt_tokens_total %llu\n", (unsigned long long)m.prompt_tokens);
    family(&t, "tiermoe_prompt_tokens_evaluated_total", "counter",
           "prompt tokens evaluated (the rest reused from the previous request)");
    put(&t, "tiermoe_prompt_tokens_evaluated_total %llu\n",
        (unsigned long long)m.prompt_eval_tokens);
    family(&t, "tiermoe_tokens_predicted_total", "counter", "tokens generated");
    put(&t, "tiermoe_tokens_predicted_total %llu\n", (unsigned long long)m.gen_tokens);
    family(&t, "tiermoe_prompt_seconds_total", "counter", "time evaluating prompts");
    put(&t, "tiermoe_prompt_seconds_total %.6f\n", m.prompt_s);
    family(&t, "tiermoe_tokens_predicted_seconds_total", "counter", "time generating");
    put(&t, "tiermoe_tokens_predicted_seconds_total %.6f\n", m.gen_s);
    family(&t, "tiermoe_prompt_tokens_per_second", "gauge", "prompt speed of the last request");
    put(&t, "tiermoe_prompt_tokens_per_second %.3f\n", m.last_prompt_tps);
    family(&t, "tiermoe_predicted_tokens_per_second", "gauge",
           "generation speed of the last request");
    put(&t, "tiermoe_predicted_tokens_per_second %.3f\n", m.last_gen_tps);
    const int busy = srv_slots_busy(s);
    family(&t, "tiermoe_requests_processing", "gauge", "requests being generated");
    put(&t, "tiermoe_requests_processing %d\n", busy);
    family(&t, "tiermoe_slots", "gauge", "slots (--parallel): sequences decoded together");
    put(&t, "tiermoe_slots %d\n", s->p.parallel > 0 ? s->p.parallel : 1);
    family(&t, "tiermoe_slots_busy", "gauge", "slots running a request");
    put(&t, "tiermoe_slots_busy %d\n", busy);
    family(&t, "tiermoe_decode_steps_total", "counter", "decode steps (one row per decoding slot)");
    put(&t, "tiermoe_decode_steps_total %llu\n", (unsigned long long)m.decode_steps);
    family(&t, "tiermoe_decode_rows_total", "counter", "rows of the decode steps");
    put(&t, "tiermoe_decode_rows_total %llu\n", (unsigned long long)m.decode_rows);
    family(&t, "tiermoe_decode_step_seconds_total", "counter", "time in the engine's decode steps");
    put(&t, "tiermoe_decode_step_seconds_total %.6f\n", m.decode_step_s);
    family(&t, "tiermoe_prompt_steps_total", "counter",
           "prompt steps (the waiting prompts' next chunks together)");
    put(&t, "tiermoe_prompt_steps_total %llu\n", (unsigned long long)m.prompt_steps);
    family(&t, "tiermoe_prompt_rows_total", "counter", "rows of the prompt steps");
    put(&t, "tiermoe_prompt_rows_total %llu\n", (unsigned long long)m.prompt_step_rows);
    family(&t, "tiermoe_prompt_step_prompts_total", "counter",
           "prompts in the prompt steps (a step's count: the prompts sharing it)");
    put(&t, "tiermoe_prompt_step_prompts_total %llu\n", (unsigned long long)m.prompt_step_seqs);
    family(&t, "tiermoe_prompt_step_seconds_total", "counter", "time in the engine's prompt steps");
    put(&t, "tiermoe_prompt_step_seconds_total %.6f\n", m.prompt_step_s);
    family(&t, "tiermoe_requests_deferred", "gauge", "requests waiting in the queue");
    put(&t, "tiermoe_requests_deferred %d\n", srv_queue_depth(s));
    if (atomic_load(&s->state) == SRV_READY) {
        tm_counters k;
        tm_gpu_counters g[TM_MAX_GPUS];
        size_t n_gpu = 0;
        pthread_mutex_lock(&s->step_mu);
        const tm_status st = tm_context_counters(s->ctx, &k);
        if (tm_context_gpus(s->ctx, g, TM_MAX_GPUS, &n_gpu) != TM_OK || n_gpu > TM_MAX_GPUS)
            n_gpu = 0;
        pthread_mutex_unlock(&s->step_mu);
        if (st == TM_OK) {
            tier_section(&t, k.tier, k.cache_bytes);
            if (k.has_ssd) ssd_section(&t, &k.ssd);
        }
        if (n_gpu) gpu_section(&t, g, n_gpu);
    }
    if (t.failed) {
        free(t.p);
        return srv_reply_error(r, 500, "out of memory");
    }
    const enum MHD_Result res =
        srv_reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", t.p, t.len);
    free(t.p);
    return res;
}
