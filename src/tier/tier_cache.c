/* The VRAM expert cache of the layers whose experts are in RAM
 * (docs/executor.md, "The VRAM cache").
 *
 * At load: a plan says how many slots each layer gets and which experts fill
 * them (a plan file of `tiermoe plan`, or one made here from the learn file
 * and the budget, src/tier/plan.h); the slices are copied in.
 *
 * While running (--moe-cache-update full): after each step's routing of a
 * cached layer, the layer's cache policy (src/tier/cache_policy.h, the same
 * code the offline replay runs) may admit routed experts, at most max_admit a
 * layer a step. After the step, each admission's slot is unmapped (the
 * device and host slot maps say -1 for whatever it held, so no later step
 * reads it) and the expert's slices are copied into it on the copy stream
 * while the next step computes; once that copy is done (an event per step's
 * batch) the slot is mapped to its new expert. An admission into a slot whose
 * earlier upload is still in flight supersedes it: the earlier expert is never
 * mapped. Between requests, tier_cache_update exchanges the weakest slots for
 * the best experts by the policies' decayed scores, the same way. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tier/plan.h"
#include "tier/tier_internal.h"
#include "trace/trace.h"

int32_t tier_cache_slots(const tm_tier *t, uint32_t layer) {
    return layer < t->n_layer ? t->layers[layer].n_slots : 0;
}

void tier_cache_gpu(const tm_tier *t, int g, uint32_t *layers, uint64_t *slots, uint64_t *bytes) {
    *layers = 0, *slots = *bytes = 0;
    for (uint32_t l = 0; l < t->n_layer; l++) {
        const tier_layer *L = &t->layers[l];
        if (L->n_slots <= 0 || tier_layer_gpu(t, l) != g) continue;
        ++*layers, *slots += (uint64_t)L->n_slots;
        *bytes += (uint64_t)L->n_slots * L->expert_bytes;
    }
}

int32_t tier_slot_of(const tm_tier *t, uint32_t layer, int32_t expert) {
    if (layer >= t->n_layer || expert < 0 || (uint32_t)expert >= t->n_expert) return -1;
    const tier_layer *L = &t->layers[layer];
    if (L->cls == TM_TIER_VRAM) return expert;
    return L->slot_of ? L->slot_of[expert] : -1;
}

bool tier_expert_resident(void *tier, uint32_t layer, int32_t expert) {
    return tier_slot_of(tier, layer, expert) >= 0;
}

size_t tier_cache_bytes(const tm_tier *t) {
    return t->cache_bytes;
}

/* Copy expert e's slices into slot s: on the copy stream of the slots' GPU (async) or
 * through the staging buffers, waiting. *queued (may be NULL): how many of the three
 * slices were queued (0: the slot is untouched). */
static tm_status tier_slot_copy(tm_tier *t, const tier_layer *L, int32_t slot, int32_t expert,
                                bool async, int *queued) {
    if (queued) *queued = 0;
    tm_status st = exec_gpu_set(t->e, L->gpu_index); /* the slots' GPU (no-op with one) */
    if (st != TM_OK) return st;
    const tm_cuda_stream stream = async ? t->copy_gpu[L->gpu_index] : NULL;
    const tm_moe_matrix *src[3] = {&L->host.gate, &L->host.up, &L->host.down};
    const tm_cuda_moe_matrix *dst[3] = {&L->gpu.gate, &L->gpu.up, &L->gpu.down};
    for (int p = 0; p < 3; p++) {
        void *d = (uint8_t *)dst[p]->data + (size_t)slot * dst[p]->expert_stride;
        const void *s = src[p]->data + (size_t)expert * src[p]->expert_stride;
        const size_t n = dst[p]->expert_stride;
        st = stream ? cuda_copy_async(d, s, n, stream) : cuda_upload(exec_gpu(t->e), d, s, n, NULL);
        if (st != TM_OK) return st;
        if (queued) ++*queued;
    }
    return TM_OK;
}

/* Every layer's slot map to each GPU in one copy (its compute stream: the next
 * step's router reads them). Over several GPUs the first GPU's stream then waits for
 * the others' (exec_gpu_set's event, a chain through each): a decode graph is launched
 * on the first GPU's stream, and its nodes on another GPU are ordered after the first's
 * work only (seen on the mock: a router read GPU 1's map before its push). */
static tm_status tier_map_push(tm_tier *t) {
    tm_status st = TM_OK;
    for (int g = 0; g < t->n_bufs && st == TM_OK; g++)
        if ((st = exec_gpu_set(t->e, g)) == TM_OK)
            st = cuda_copy_async(t->slot_maps_gpu[g], t->slot_maps,
                                 (size_t)t->n_layer * t->n_expert * sizeof(int32_t),
                                 exec_stream(t->e));
    return st == TM_OK ? exec_gpu_set(t->e, 0) : st;
}

/* Wait for every GPU's uploads. */
static tm_status tier_copies_sync(tm_tier *t) {
    tm_status st = TM_OK;
    for (int g = 0; g < t->n_bufs && st == TM_OK; g++) st = cuda_stream_sync(t->copy_gpu[g]);
    return st;
}

/* A policy that starts from the slots as they are (and, given a learn
 * file's counts for the layer, with them as a prior). */
static tm_status tier_policy_make(tm_tier *t, tier_layer *L, const uint64_t *learn) {
    cache_policy_free(L->policy);
    L->policy = NULL;
    if (t->update_mode == TM_MOE_UPDATE_OFF) return TM_OK;
    tm_cache_policy_params pp = cache_policy_params_default(t->policy_kind);
    pp.max_admit = t->max_admit;
    tm_status st = cache_policy_create(&pp, t->n_expert, L->n_slots, L->expert_in, &L->policy);
    if (st == TM_OK && learn) cache_policy_warm(L->policy, learn);
    return st;
}

/* ---- at load ---- */

/* GPU g's cache size in MiB: --moe-cache A,B's, or --moe-cache's on each. */
static int64_t tier_cache_mib(const tm_tier_params *p, int g) {
    return p->n_cache_gpu ? (g < p->n_cache_gpu ? p->cache_mib_gpu[g] : 0) : p->cache_mib;
}

/* The budget in bytes for GPU g's cache (errors name the flag and the GPU). */
static tm_status tier_cache_budget(tm_tier *t, const tm_tier_params *p, int g, size_t *budget) {
    size_t free_b = 0, total_b = 0;
    tm_status st = exec_gpu_set(t->e, g);
    if (st == TM_OK) st = cuda_device_memory(exec_gpu(t->e), &free_b, &total_b);
    if (st != TM_OK) return st;
    const int64_t mib = tier_cache_mib(p, g);
    if (mib == TM_MOE_CACHE_AUTO) {
        const size_t keep = p->reserve + t->gemm_reserve;
        *budget = free_b > keep ? free_b - keep : 0;
        return TM_OK;
    }
    *budget = mib > 0 ? (size_t)mib << 20 : 0;
    if (*budget > free_b)
        return tm_error_set(TM_ERR_DEVICE,
                            "--moe-cache %s%lld: %.1f MiB needed, %.1f MiB of VRAM free on CUDA%d "
                            "(of %.1f MiB)",
                            p->n_cache_gpu ? "A,B: " : "", (long long)mib, *budget / 1048576.0,
                            free_b / 1048576.0, cuda_device_info(exec_gpu(t->e))->index,
                            total_b / 1048576.0);
    return TM_OK;
}

/* The plan the cache follows: the given one, checked against this model and
 * placement, or one made from the learn file (or no data) and the budget. */
static tm_status tier_cache_plan(tm_tier *t, const tm_tier_params *p, tm_plan *out) {
    const tm_moe_cache_opts *o = &p->cache;
    tm_trace_shape shape = {{0}, t->n_layer, t->n_expert, t->k};
    uint64_t *bytes = calloc(t->n_layer, sizeof(uint64_t));
    bool *cacheable = calloc(t->n_layer, sizeof(bool));
    tm_status st = bytes && cacheable ? TM_OK : tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < t->n_layer && st == TM_OK; l++) {
        cacheable[l] = t->layers[l].cls == TM_TIER_RAM;
        bytes[l] = cacheable[l] ? t->layers[l].expert_bytes : 0;
    }
    if (st == TM_OK && o->plan) {
        const tm_plan *pl = o->plan;
        if (pl->shape.n_layer != t->n_layer || pl->shape.n_expert != t->n_expert)
            st = tm_error_set(TM_ERR_ARG,
                              "--moe-cache-plan: a plan for %u layers of %u experts, "
                              "the model has %u of %u",
                              pl->shape.n_layer, pl->shape.n_expert, t->n_layer, t->n_expert);
        bool skipped = false;
        if (st == TM_OK) st = plan_init(out, &pl->shape);
        for (uint32_t l = 0; l < t->n_layer && st == TM_OK; l++) {
            if (!pl->n_slots[l]) continue;
            if (!cacheable[l]) {
                skipped = true;
                continue;
            }
            if (pl->expert_bytes[l] != bytes[l])
                st = tm_error_set(TM_ERR_ARG,
                                  "--moe-cache-plan: layers[%u]: experts of %llu bytes, the "
                                  "model's have %llu",
                                  l, (unsigned long long)pl->expert_bytes[l],
                                  (unsigned long long)bytes[l]);
            else
                st = plan_set_layer(out, l, pl->experts[l], pl->n_slots[l], bytes[l]);
        }
        if (st == TM_OK && skipped)
            tm_log_warn("--moe-cache-plan: the plan caches experts of layers whose experts are "
                        "all in VRAM here; those are left out");
    } else if (st == TM_OK) {
        /* each GPU's budget over its own layers (one GPU: the plan itself) */
        tm_trace_stats none = {0};
        const tm_trace_stats *obs = o->learn;
        bool *mine = calloc(t->n_layer, sizeof(bool));
        if (!mine) st = tm_error_set(TM_ERR_NOMEM, "out of memory");
        if (st == TM_OK && !obs && (st = trace_stats_init(&none, &shape, 0)) == TM_OK) obs = &none;
        if (st == TM_OK && t->n_bufs > 1) st = plan_init(out, &shape);
        for (int g = 0; g < t->n_bufs && st == TM_OK; g++) {
            size_t budget = 0;
            for (uint32_t l = 0; l < t->n_layer; l++)
                mine[l] = cacheable[l] && t->layers[l].gpu_index == g;
            if ((st = tier_cache_budget(t, p, g, &budget))) break;
            const tm_plan_params pp = {(tm_plan_weighting)o->weighting,
                                       o->curve > 0 ? o->curve : TM_PLAN_CURVE_DEFAULT, budget,
                                       bytes, mine};
            if (t->n_bufs == 1) {
                st = plan_make(obs, &pp, out);
                break;
            }
            tm_plan pg = {0};
            st = plan_make(obs, &pp, &pg);
            for (uint32_t l = 0; l < t->n_layer && st == TM_OK; l++)
                if (mine[l] && pg.n_slots[l])
                    st = plan_set_layer(out, l, pg.experts[l], pg.n_slots[l], bytes[l]);
            plan_free(&pg);
        }
        free(mine);
        trace_stats_free(&none);
    }
    free(bytes), free(cacheable);
    return st;
}

tm_status tier_cache_create(tm_tier *t, const tm_tier_params *p) {
    const tm_moe_cache_opts *o = &p->cache;
    t->update_mode = o->update;
    t->policy_kind = t->update_mode == TM_MOE_UPDATE_BETWEEN ? TM_CACHE_STATIC
                     : o->policy_set                         ? o->policy
                                                             : TM_CACHE_ADAPTIVE;
    t->max_admit = !o->max_admit ? 1 : o->max_admit < 0 ? 0 : o->max_admit;
    bool any_ram = false, any_mib = p->cache_mib != 0;
    for (uint32_t l = 0; l < t->n_layer; l++) any_ram |= t->layers[l].cls == TM_TIER_RAM;
    for (int g = 0; g < p->n_cache_gpu; g++) any_mib |= p->cache_mib_gpu[g] != 0;
    if (!any_mib && !p->cache.plan) return TM_OK;
    if (!t->gpu) {
        tm_log_info("--moe-cache: no GPU in use, every expert is computed on the CPU");
        return TM_OK;
    }
    if (!any_ram) {
        tm_log_info("--moe-cache: every layer's experts are in VRAM already; no cache needed");
        return TM_OK;
    }
    tm_plan plan = {0};
    tm_status st = tier_cache_plan(t, p, &plan);
    size_t total[EXEC_MAX_GPUS] = {0}, n_cached = 0; /* each GPU's slots */
    size_t smallest = SIZE_MAX;                      /* layers' experts may differ in size */
    uint32_t n_layers = 0;
    int32_t lo = (int32_t)t->n_expert, hi = 0;
    for (uint32_t l = 0; l < t->n_layer && st == TM_OK; l++) {
        if (!plan.n_slots[l]) continue;
        total[t->layers[l].gpu_index] +=
            (size_t)plan.n_slots[l] * t->layers[l].expert_bytes + 3 * 256;
        n_cached += (size_t)plan.n_slots[l];
        n_layers++;
        if (plan.n_slots[l] < lo) lo = plan.n_slots[l];
        if (plan.n_slots[l] > hi) hi = plan.n_slots[l];
    }
    for (uint32_t l = 0; l < t->n_layer; l++)
        if (t->layers[l].expert_bytes && t->layers[l].expert_bytes < smallest)
            smallest = t->layers[l].expert_bytes;
    if (st == TM_OK && !n_layers) {
        tm_log_warn("--moe-cache: the budget holds no expert (the smallest: %.2f MiB): no cache",
                    smallest == SIZE_MAX ? 0.0 : smallest / 1048576.0);
        plan_free(&plan);
        return TM_OK;
    }
    const size_t map_bytes = (size_t)t->n_layer * t->n_expert * sizeof(int32_t);
    if (st == TM_OK) st = cuda_host_alloc(map_bytes, (void **)&t->slot_maps);
    if (st == TM_OK) memset(t->slot_maps, 0xff, map_bytes); /* -1: layers without slots too */
    if (st == TM_OK && !(t->admit = malloc(t->n_expert * sizeof(*t->admit))))
        st = tm_error_set(TM_ERR_NOMEM, "--moe-cache: out of memory");
    /* each GPU's maps, slots and events (its uploads: its copy stream, copy_gpu[g]) */
    uint8_t *at[EXEC_MAX_GPUS] = {0};
    for (int g = 0; g < t->n_bufs && st == TM_OK; g++) {
        if ((st = exec_gpu_set(t->e, g))) break;
        if ((st = exec_dev_alloc(t->e, map_bytes, (void **)&t->slot_maps_gpu[g]))) break;
        if (total[g] && (st = exec_dev_alloc(t->e, total[g], (void **)&at[g]))) {
            st = tm_error_wrap(st,
                               "--moe-cache (CUDA%d): ", cuda_device_info(exec_gpu(t->e))->index);
            break;
        }
        for (int i = 0; i < TIER_UP_BATCHES && st == TM_OK && t->update_mode != TM_MOE_UPDATE_OFF;
             i++)
            st = cuda_event_create(&t->up_done[i][g]);
    }
    t->slot_maps_dev = t->slot_maps_gpu[0], t->cache_mem = at[0];
    for (uint32_t l = 0; l < t->n_layer && st == TM_OK; l++) {
        tier_layer *L = &t->layers[l];
        const int32_t slots = plan.n_slots[l];
        if (!slots) continue;
        uint8_t **mem = &at[L->gpu_index];
        L->cls = TM_TIER_CACHED, L->n_slots = slots;
        t->cache_bytes += (size_t)slots * L->expert_bytes;
        const tm_moe_matrix *m[3] = {&L->host.gate, &L->host.up, &L->host.down};
        tm_cuda_moe_matrix *g[3] = {&L->gpu.gate, &L->gpu.up, &L->gpu.down};
        for (int i = 0; i < 3; i++) { /* slot arrays packed, one expert's slice apart */
            const size_t slice = tier_slice_bytes(&L->host, i);
            *g[i] = (tm_cuda_moe_matrix){*mem, m[i]->type, slice, m[i]->row_bytes};
            *mem += ((size_t)slots * slice + 255) & ~(size_t)255;
        }
        L->gpu.n_embd = t->n_embd, L->gpu.n_ff = t->n_ff, L->gpu.n_slots = slots;
        L->slot_of = t->slot_maps + (size_t)l * t->n_expert;
        if (!(L->expert_in = malloc((size_t)slots * sizeof(int32_t)))) {
            st = tm_error_set(TM_ERR_NOMEM, "out of memory");
            break;
        }
        for (int32_t s = 0; s < slots && st == TM_OK; s++) {
            const int32_t e = plan.experts[l][s];
            L->expert_in[s] = e, L->slot_of[e] = s;
            st = tier_slot_copy(t, L, s, e, false, NULL);
        }
        L->slot_of_dev = t->slot_maps_gpu[L->gpu_index] + (size_t)l * t->n_expert;
        if (st == TM_OK) st = tier_policy_make(t, L, o->learn ? o->learn->layers[l].experts : NULL);
    }
    for (int g = 0; g < t->n_bufs && st == TM_OK; g++)
        if ((st = exec_gpu_set(t->e, g)) == TM_OK)
            st = cuda_copy_to_device(exec_gpu(t->e), t->slot_maps_gpu[g], t->slot_maps, map_bytes);
    if (st == TM_OK) st = exec_gpu_set(t->e, 0);
    if (st == TM_OK) {
        static const char *const upd[] = {"exchanged between requests",
                                          "the policy admits routed experts after each step",
                                          "fixed"};
        tm_log_info("--moe-cache: %zu experts in VRAM over %u layers (%d..%d a layer, %.2f GiB; "
                    "%s); %s",
                    n_cached, n_layers, lo, hi, t->cache_bytes / 1073741824.0,
                    p->cache.plan    ? "the plan file's"
                    : p->cache.learn ? "planned from the learn file"
                                     : "no learn file: the lowest ids",
                    upd[t->update_mode]);
        char each[256] = "";
        size_t k = 0;
        for (int g = 0; g < t->n_bufs && t->n_bufs > 1 && k < sizeof(each); g++) {
            uint32_t layers = 0;
            for (uint32_t l = 0; l < t->n_layer; l++)
                layers += plan.n_slots[l] && t->layers[l].gpu_index == g;
            if ((st = exec_gpu_set(t->e, g))) break;
            k += (size_t)snprintf(each + k, sizeof(each) - k, "%sCUDA%d %.1f MiB (%u layers)",
                                  k ? ", " : "", cuda_device_info(exec_gpu(t->e))->index,
                                  total[g] / 1048576.0, layers);
        }
        if (st == TM_OK) st = exec_gpu_set(t->e, 0);
        if (*each) tm_log_info("--moe-cache: each GPU's slots for its own layers: %s", each);
    }
    plan_free(&plan);
    return st;
}

void tier_cache_free(tm_tier *t) {
    for (uint32_t l = 0; t->layers && l < t->n_layer; l++) {
        free(t->layers[l].expert_in);
        cache_policy_free(t->layers[l].policy);
    }
    for (int g = 0; g < EXEC_MAX_GPUS; g++)
        for (int i = 0; i < TIER_UP_BATCHES; i++) cuda_event_free(t->up_done[i][g]);
    cuda_host_free(t->slot_maps);
    free(t->admit), free(t->want), free(t->pending);
}

/* ---- while running ---- */

static tm_status tier_want_room(tier_upload **a, int64_t *cap, int64_t n) {
    if (n <= *cap) return TM_OK;
    const int64_t c = n > 2 * *cap ? n : 2 * *cap;
    tier_upload *p = realloc(*a, (size_t)c * sizeof(**a));
    if (!p) return tm_error_set(TM_ERR_NOMEM, "VRAM cache: out of memory");
    *a = p, *cap = c;
    return TM_OK;
}

static void tier_want_add(tm_tier *t, uint32_t layer, const tm_cache_admit *a, int32_t n,
                          bool exchange) {
    if (tier_want_room(&t->want, &t->cap_want, t->n_want + n) != TM_OK) return; /* dropped */
    for (int32_t i = 0; i < n; i++)
        t->want[t->n_want++] = (tier_upload){layer, a[i].slot, a[i].expert, 0, false, exchange};
}

void tier_cache_observe(tm_tier *t, tier_layer *L, const int32_t *ids, int64_t n_tok) {
    if (!L->policy) return;
    int64_t hits = 0;
    const int32_t n = cache_policy_step(L->policy, ids, n_tok, t->k, t->admit, &hits);
    tier_want_add(t, L->index, t->admit, n, false);
}

/* Use the uploads whose batch is done. */
static tm_status tier_cache_finish(tm_tier *t, bool *dirty) {
    while (t->up_used < t->up_next) {
        bool done = true;
        for (int g = 0; g < t->n_bufs && done; g++) {
            tm_status st = cuda_event_query(t->up_done[t->up_used % TIER_UP_BATCHES][g], &done);
            if (st != TM_OK) return st;
        }
        if (!done) break;
        const uint32_t b = t->up_used++;
        int64_t keep = 0;
        for (int64_t i = 0; i < t->n_pending; i++) {
            const tier_upload *u = &t->pending[i];
            if (u->batch != b) {
                t->pending[keep++] = *u;
                continue;
            }
            if (u->superseded) continue;
            tier_layer *L = &t->layers[u->layer];
            L->expert_in[u->slot] = u->expert, L->slot_of[u->expert] = u->slot;
            dirty[u->layer] = true;
        }
        t->n_pending = keep;
    }
    return TM_OK;
}

/* Queue the wanted uploads as one batch: unmap each slot, copy, record. */
static tm_status tier_cache_start(tm_tier *t, bool *dirty) {
    if (!t->n_want) return TM_OK;
    tm_status st = TM_OK;
    if (t->up_next - t->up_used == TIER_UP_BATCHES) { /* the oldest batch first */
        if ((st = tier_copies_sync(t)) || (st = tier_cache_finish(t, dirty))) return st;
    }
    if ((st = tier_want_room(&t->pending, &t->cap_pending, t->n_pending + t->n_want))) return st;
    const uint32_t b = t->up_next;
    for (int64_t i = 0; i < t->n_want && st == TM_OK; i++) {
        tier_upload u = t->want[i];
        tier_layer *L = &t->layers[u.layer];
        int queued = 0;
        const bool ok = tier_slot_copy(t, L, u.slot, u.expert, true, &queued) == TM_OK;
        if (queued) { /* the slot is being written: nothing maps it until its batch is done
                         (no step runs now, and the maps reach the device before the next) */
            for (int64_t j = 0; j < t->n_pending; j++) /* an earlier upload into the slot */
                if (t->pending[j].layer == u.layer && t->pending[j].slot == u.slot)
                    t->pending[j].superseded = true;
            const int32_t old = L->expert_in[u.slot];
            if (old >= 0) L->slot_of[old] = -1;
            L->expert_in[u.slot] = -1;
            dirty[u.layer] = true;
        }
        if (!ok) { /* nothing queued: the slot serves what it held; part of it: empty */
            if (!t->upload_warned)
                tm_log_warn("VRAM cache: an upload could not be queued (%s); the slot keeps %s",
                            tm_error_message(), queued ? "nothing" : "its expert");
            t->upload_warned = true;
            u.superseded = true;
        }
        u.batch = b;
        t->pending[t->n_pending++] = u;
        if (!ok) continue;
        tm_tier_stats *s = &t->stats[L->cls];
        if (u.exchange)
            s->exchanges++;
        else
            s->admits++;
        s->upload_bytes += L->expert_bytes;
    }
    t->n_want = 0;
    for (int g = 0; g < t->n_bufs && st == TM_OK; g++) /* each GPU's, with it current */
        if ((st = exec_gpu_set(t->e, g)) == TM_OK)
            st = cuda_event_record(t->up_done[b % TIER_UP_BATCHES][g], t->copy_gpu[g]);
    if (st == TM_OK) t->up_next++;
    return st;
}

static tm_status tier_cache_sync_maps(tm_tier *t, bool wait) {
    if (!t->slot_maps) return TM_OK;
    bool *dirty = calloc(t->n_layer, sizeof(bool));
    if (!dirty) return tm_error_set(TM_ERR_NOMEM, "VRAM cache: out of memory");
    tm_status st = tier_cache_finish(t, dirty);
    if (st == TM_OK) st = tier_cache_start(t, dirty);
    if (st == TM_OK && wait && (st = tier_copies_sync(t)) == TM_OK)
        st = tier_cache_finish(t, dirty);
    bool any = false;
    for (uint32_t l = 0; l < t->n_layer; l++) any |= dirty[l];
    if (st == TM_OK && any) st = tier_map_push(t);
    free(dirty);
    return st;
}

tm_status tier_cache_apply(tm_tier *t) {
    return tier_cache_sync_maps(t, false);
}

tm_status tier_cache_settle(tm_tier *t) {
    tm_status st = exec_sync(t->e);
    if (st == TM_OK) st = tier_cache_sync_maps(t, true);
    return st == TM_OK ? exec_sync(t->e) : st;
}

tm_status tier_cache_update(tm_tier *t, double rate) {
    if (!t->slot_maps || t->update_mode == TM_MOE_UPDATE_OFF) return TM_OK;
    if (!(rate >= 0 && rate <= 1))
        return tm_error_set(TM_ERR_ARG, "cache update: rate %g outside [0, 1]", rate);
    tm_status st = exec_select(t->e);      /* called between requests, from any thread */
    if (st == TM_OK) st = exec_sync(t->e); /* the host maps may change: no copy in flight */
    for (uint32_t l = 0; l < t->n_layer && st == TM_OK; l++) {
        tier_layer *L = &t->layers[l];
        if (!L->policy) continue;
        const int32_t n = cache_policy_update(L->policy, NULL, rate, t->admit);
        tier_want_add(t, l, t->admit, n, true);
    }
    return st == TM_OK ? tier_cache_apply(t) : st;
}

tm_status tier_cache_set(tm_tier *t, uint32_t layer, int32_t slot, int32_t expert) {
    if (layer >= t->n_layer || t->layers[layer].cls != TM_TIER_CACHED)
        return tm_error_set(TM_ERR_ARG, "layer %u has no VRAM cache", layer);
    tier_layer *L = &t->layers[layer];
    if (slot < 0 || slot >= L->n_slots || expert < 0 || (uint32_t)expert >= t->n_expert)
        return tm_error_set(TM_ERR_ARG, "layer %u: slot %d of %d, expert %d of %u", layer, slot,
                            L->n_slots, expert, t->n_expert);
    if (L->slot_of[expert] >= 0 && L->slot_of[expert] != slot)
        return tm_error_set(TM_ERR_ARG, "layer %u: expert %d is in slot %d already", layer, expert,
                            L->slot_of[expert]);
    /* nothing may read the slots or be uploading into them */
    tm_status st = exec_select(t->e); /* an API or HTTP thread */
    if (st == TM_OK) st = tier_cache_settle(t);
    if (st == TM_OK) st = tier_slot_copy(t, L, slot, expert, false, NULL);
    if (st != TM_OK) return st;
    if (L->expert_in[slot] >= 0) L->slot_of[L->expert_in[slot]] = -1;
    L->expert_in[slot] = expert, L->slot_of[expert] = slot;
    if ((st = tier_ahead_push(t, L))) return st; /* copies ahead keep the slots on the GPU */
    /* the policy starts again from the slots as they are now */
    if (L->policy && (st = tier_policy_make(t, L, NULL))) return st;
    if ((st = tier_map_push(t))) return st;
    return exec_sync(t->e);
}
