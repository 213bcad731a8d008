/* tm_context_counters (include/tiermoe.h): the tiers' counters by layer
 * class, the VRAM cache's bytes and the SSD tier's, what GET /metrics shows;
 * tm_context_gpus and tm_layer_gpu: the same by GPU, each GPU's cache and peer
 * copies, and the GPU of each layer (GET /moe-hot-cache, the dashboard). */
#include <string.h>

#include "api/api_internal.h"

_Static_assert(TM_LAYER_CLASSES == TM_TIER_CLASS_COUNT && TM_LAYER_VRAM == TM_TIER_VRAM &&
                   TM_LAYER_RAM == TM_TIER_RAM && TM_LAYER_CACHED == TM_TIER_CACHED,
               "the header's layer classes are the tier's");

static tm_tier_counters tier_counters(const tm_tier_stats *t) {
    return (tm_tier_counters){.layers = t->layers,
                              .steps = t->calls,
                              .hot_slots = t->hot_slots,
                              .pcie_slots = t->pcie_slots,
                              .cold_slots = t->cold_slots,
                              .fetch_slots = t->fetch_slots,
                              .fallback_slots = t->fallback_slots,
                              .hot_bytes = t->hot_bytes,
                              .pcie_bytes = t->pcie_bytes,
                              .cold_bytes = t->cold_bytes,
                              .fetch_bytes = t->fetch_bytes,
                              .upload_bytes = t->upload_bytes,
                              .hot_ns = t->hot_ns,
                              .pcie_ns = t->pcie_ns,
                              .cold_ns = t->cold_ns,
                              .wait_ns = t->wait_ns,
                              .gpu_wait_ns = t->gpu_wait_ns,
                              .merge_ns = t->merge_ns,
                              .fetch_ns = t->fetch_ns,
                              .copy_ns = t->copy_ns,
                              .copy_wait_ns = t->copy_wait_ns,
                              .fetch_experts = t->fetch_experts,
                              .admits = t->admits,
                              .exchanges = t->exchanges};
}

tm_status tm_context_counters(const tm_context *c, tm_counters *out) {
    if (!api_context_of(c, "tm_context_counters")) return TM_ERR_ARG;
    API_ARG(out, "tm_context_counters: out must not be NULL");
    memset(out, 0, sizeof(*out));
    if (!c->tier) return TM_OK;
    const tm_tier_stats *ts = tier_stats(c->tier);
    for (int k = 0; k < TM_LAYER_CLASSES; k++) out->tier[k] = tier_counters(&ts[k]);
    out->cache_bytes = tier_cache_bytes(c->tier);
    const tm_store_stats *ss = tier_store_stats(c->tier);
    if (ss) {
        out->has_ssd = true;
        out->ssd = (tm_ssd_counters){.routed = ss->routed,
                                     .hits = ss->hits,
                                     .faults = ss->faults,
                                     .prefetched = ss->prefetched,
                                     .bytes_read = ss->bytes_read,
                                     .wait_ns = ss->wait_ns,
                                     .max_resident = ss->max_resident};
    }
    return TM_OK;
}

tm_status tm_context_gpus(const tm_context *c, tm_gpu_counters *out, size_t cap, size_t *n) {
    if (!api_context_of(c, "tm_context_gpus")) return TM_ERR_ARG;
    API_ARG(n, "tm_context_gpus: n must not be NULL");
    API_ARG(out || !cap, "tm_context_gpus: out is NULL with cap %zu", cap);
    int n_gpu = 0;
    const tm_tier_stats *gs = c->tier ? tier_stats_gpu(c->tier, &n_gpu) : NULL;
    *n = (size_t)n_gpu;
    API_ARG(*n <= cap, "tm_context_gpus: out has room for %zu, the context has %zu GPUs", cap, *n);
    for (int g = 0; g < n_gpu; g++) {
        tm_gpu_counters *o = &out[g];
        memset(o, 0, sizeof(*o));
        o->device = exec_gpu_device(c->exec, g);
        o->tier = tier_counters(&gs[g]);
        tier_cache_gpu(c->tier, g, &o->cache_layers, &o->cache_slots, &o->cache_bytes);
        const tm_exec_peer_stats p = exec_peer_stats(c->exec, g);
        o->peer_copies = p.copies, o->peer_bytes = p.bytes, o->peer_ns = p.ns;
    }
    return TM_OK;
}

tm_status tm_layer_gpu(const tm_context *c, uint32_t layer, int32_t *gpu) {
    if (!api_context_of(c, "tm_layer_gpu")) return TM_ERR_ARG;
    API_ARG(gpu, "tm_layer_gpu: gpu must not be NULL");
    API_ARG(layer < c->model->cfg.n_layer, "tm_layer_gpu: layer %u is not in [0, %u)", layer,
            c->model->cfg.n_layer);
    *gpu = c->tier ? tier_layer_gpu(c->tier, layer) : -1;
    return TM_OK;
}
