/* Decode steps copy ahead the experts the next layer is predicted to route to
 * (Post-Fetch with next-layer prediction, docs/executor.md).
 *
 * As layer l's decode step begins, the compute stream forks to the lane's own
 * stream, which applies layer l + 1's router to layer l's normed input (the
 * residual stream changes little from one layer to the next), takes each
 * token's top k through layer l + 1's slot map, and copies the few cold
 * experts with the largest summed weight from the pinned file pages into VRAM
 * buffer (l + 1) % 2 (cuda_moe_fetch_ahead: the choice is made on the device,
 * so the decode graph keeps one launch for any routing). The copies run while
 * layer l's lanes, its wait for the CPU and layer l + 1's attention do; layer
 * l + 1's step joins them before its router, whose kernel then hands the routed
 * slots of those experts to the fetched lane (the same grouped kernels, over
 * the buffer) instead of the CPU, and its hand-off carries the buffer's map so
 * the host leaves them out. Buffer (l + 1) % 2 was last read by layer l - 1,
 * which the compute stream finished before the fork.
 *
 * A cached layer takes the copies into its own slots instead: the least
 * recently used ones the predicted routing does not use, the slot map updated
 * on the GPU, so its router finds them hot and its hot lane computes them.
 * The GPU's map is then the truth: the hand-off carries it for the host's
 * split, and after each step the host's maps are refreshed from it.
 *
 * Over several GPUs (layer spans) each GPU has all of this for its own layers
 * (tm_tier.ahead[g]: buffers, routers, stream, events, the cached layers' slot
 * state), and a layer's copies are queued only by the layer before it on the
 * same GPU, where h and the compute stream are: the first layer of a GPU's span
 * gets none. In a decode graph the lane's stream of GPU 1 forks from and joins
 * GPU 1's compute stream, itself joined to the capture (docs/executor.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tier/tier_internal.h"

/* The experts copied ahead per layer step: --moe-ahead N, or auto. */
static int32_t tier_ahead_count(const tm_tier *t, int32_t asked) {
    if (asked <= 0) return 0; /* auto is resolved by tier_create */
    int32_t n = asked;
    if (n > (int32_t)t->k) n = (int32_t)t->k;
    return n > TM_CUDA_FETCH_AHEAD_MAX ? TM_CUDA_FETCH_AHEAD_MAX : n;
}

/* Layer l's experts can be copied ahead: in RAM and pinned for the GPU
 * (L->pcie), a router to predict with, and a layer with routed experts before
 * it on the same GPU (whose step queues the copies: the first layer of a GPU's
 * span gets none, as the fetch ring plans a layer only from its own GPU's). */
static bool tier_ahead_target(const tm_tier *t, uint32_t l) {
    const tier_layer *L = &t->layers[l];
    return l > 0 && t->layers[l - 1].moe && t->layers[l - 1].gpu_index == L->gpu_index &&
           L->cls != TM_TIER_VRAM && L->pcie.n_slots > 0 && L->host.router &&
           (!t->ahead_cached_only || L->cls == TM_TIER_CACHED);
}

static size_t tier_align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* GPU g's copies ahead of n experts a step for its own target layers (t->ahead[g]; none
 * when it has no target); the GPU is current. *n_targets: its target layers. */
static tm_status tier_ahead_gpu_create(tm_tier *t, int g, int32_t n, uint32_t *n_targets) {
    size_t gb = 0, u = 0, d = 0; /* the largest slices, one expert, of layers without slots */
    uint32_t targets = 0;
    for (uint32_t l = 0; l < t->n_layer; l++) {
        if (!tier_ahead_target(t, l) || t->layers[l].gpu_index != g) continue;
        const tm_cuda_moe_params *s = &t->layers[l].pcie;
        if (t->layers[l].cls != TM_TIER_CACHED) { /* copies into the buffer */
            gb = s->gate.expert_stride > gb ? s->gate.expert_stride : gb;
            u = s->up.expert_stride > u ? s->up.expert_stride : u;
            d = s->down.expert_stride > d ? s->down.expert_stride : d;
        }
        targets++;
    }
    *n_targets = targets;
    if (!targets) return TM_OK;
    tier_ahead *A = calloc(1, sizeof(*A));
    if (!A) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    t->ahead[g] = A;
    A->n_slots = n, A->for_layer = -1;
    tm_cuda_device *dev = exec_gpu(t->e);
    const int64_t T = TM_CUDA_MMVQ_MAX_TOK, E = t->n_expert, K = t->k;
    const size_t buf = (size_t)n * (gb + u + d), router = (size_t)(E * t->n_embd) * sizeof(float);
    tm_status st = TM_OK;
    if (!(A->router = calloc(t->n_layer, sizeof(*A->router))) ||
        !(A->bias = calloc(t->n_layer, sizeof(*A->bias))) ||
        !(A->split = malloc((size_t)E * sizeof(int32_t))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < 2; i++)
        if ((buf && (st = exec_dev_alloc(t->e, buf, (void **)&A->buf[i]))) ||
            (st = exec_dev_alloc(t->e, tier_align16((size_t)E * 4), (void **)&A->map[i])) ||
            (st = exec_dev_alloc(t->e, tier_align16((size_t)n * 8), (void **)&A->list[i])) ||
            (st = cuda_fill_bytes(dev, A->map[i], 0xff, (size_t)E * 4)) ||
            (st = cuda_event_create(&A->done[i])))
            return st;
    if ((st = cuda_stream_create(&A->stream)) || (st = cuda_event_create(&A->fork)) ||
        (st = cuda_event_create(&A->read)) ||
        (st = exec_dev_alloc(t->e, tier_align16((size_t)(T * E) * 4), (void **)&A->logits)) ||
        (st = exec_dev_alloc(t->e, tier_align16((size_t)(T * K) * 4), (void **)&A->ids)) ||
        (st = exec_dev_alloc(t->e, tier_align16((size_t)(T * K) * 4), (void **)&A->w)) ||
        (st =
             exec_dev_alloc(t->e, (size_t)(T * K) * sizeof(tm_cuda_moe_item), (void **)&A->pred)) ||
        (st = exec_dev_alloc(t->e, (size_t)(T * K) * sizeof(tm_cuda_moe_item), (void **)&A->items)))
        return st;
    A->bytes = 2 * buf;
    /* its cached layers' slot state on the GPU, all in one block (one copy back a step):
       experts, then ages; and the range of their rows in the GPU's slot maps */
    for (uint32_t l = 0; l < t->n_layer; l++)
        if (tier_ahead_target(t, l) && t->layers[l].gpu_index == g &&
            t->layers[l].cls == TM_TIER_CACHED) {
            if (!A->n_cache_slots) A->maps_lo = l;
            A->n_cache_slots += t->layers[l].n_slots, A->maps_hi = l;
        }
    if (A->n_cache_slots) {
        const size_t all = (size_t)A->n_cache_slots * 4;
        if ((st = exec_dev_alloc(t->e, 2 * all, (void **)&A->cache_state)) ||
            (st = cuda_fill_bytes(dev, A->cache_state, 0, 2 * all)))
            return st;
        if (!(A->expert_in_host = malloc(all)) ||
            !(A->maps_host = malloc((size_t)(A->maps_hi - A->maps_lo + 1) * E * sizeof(int32_t))))
            return tm_error_set(TM_ERR_NOMEM, "out of memory");
        A->lru = true;
    }
    int64_t at = 0;
    for (uint32_t l = 0; l < t->n_layer && st == TM_OK; l++) {
        tier_layer *L = &t->layers[l];
        if (!tier_ahead_target(t, l) || L->gpu_index != g) continue;
        if (L->cls == TM_TIER_CACHED) { /* into the cache's slots */
            L->expert_in_dev = A->cache_state + at;
            L->last_use_dev = (uint32_t *)(A->cache_state + A->n_cache_slots + at);
            L->cache_at = at, at += L->n_slots;
            if ((st = cuda_copy_to_device(dev, L->expert_in_dev, L->expert_in,
                                          (size_t)L->n_slots * 4)))
                break;
        } else {
            L->ahead = L->pcie; /* the same slices, in slots of buffer l % 2 */
            L->ahead.n_slots = n;
            uint8_t *slots = A->buf[l % 2];
            L->ahead.gate.data = slots, L->ahead.up.data = slots + (size_t)n * gb;
            L->ahead.down.data = slots + (size_t)n * (gb + u);
        }
        if (L->router_dev && (L->router_bias_dev || !L->host.router_bias)) {
            A->router[l] = L->router_dev, A->bias[l] = L->router_bias_dev; /* the executor's */
            continue;
        }
        void *r; /* through the staging buffers: the router lies beside pinned experts */
        if ((st = exec_dev_alloc(t->e, router, &r)) ||
            (st = cuda_upload(dev, r, L->host.router, router, NULL)))
            break;
        A->router[l] = r, A->bytes += router;
        if (L->host.router_bias) {
            void *b;
            if ((st = exec_dev_alloc(t->e, tier_align16((size_t)E * 4), &b)) ||
                (st = cuda_upload(dev, b, L->host.router_bias, (size_t)E * 4, NULL)))
                break;
            A->bias[l] = b;
        }
    }
    return st;
}

tm_status tier_ahead_create(tm_tier *t, const tm_tier_params *p) {
    const int32_t n = t->gpu ? tier_ahead_count(t, p->ahead) : 0;
    if (n <= 0) return TM_OK;
    uint32_t targets = 0;
    bool aligned = true;
    for (uint32_t l = 0; l < t->n_layer; l++) {
        if (!tier_ahead_target(t, l)) continue;
        const tier_layer *L = &t->layers[l];
        const tm_cuda_moe_params *s = &L->pcie, *c = &L->gpu; /* from; into a cache's slots */
        const tm_cuda_moe_matrix *m[6] = {&s->gate, &s->up, &s->down, &c->gate, &c->up, &c->down};
        for (int i = 0; i < (L->cls == TM_TIER_CACHED ? 6 : 3); i++)
            aligned &= (((uintptr_t)m[i]->data | m[i]->expert_stride) & 15) == 0;
        targets++;
    }
    if (!targets) return TM_OK;
    if (!aligned) {
        tm_log_info("--moe-ahead: the experts' slices are not 16-byte aligned in the file; "
                    "decode steps copy nothing ahead");
        return TM_OK;
    }
    tm_status st = TM_OK;
    char each[256] = "";
    size_t k = 0;
    bool lru = false;
    for (int g = 0; g < t->n_bufs && st == TM_OK; g++) {
        uint32_t mine = 0;
        if ((st = exec_gpu_set(t->e, g)) || (st = tier_ahead_gpu_create(t, g, n, &mine))) break;
        lru |= t->ahead[g] && t->ahead[g]->lru;
        if (t->n_bufs > 1 && k < sizeof(each))
            k += (size_t)snprintf(each + k, sizeof(each) - k, "%sCUDA%d %u layers", k ? ", " : "",
                                  cuda_device_info(exec_gpu(t->e))->index, mine);
    }
    if (st == TM_OK) st = exec_gpu_set(t->e, 0);
    if (st != TM_OK) return st;
    tm_log_info("--moe-ahead: decode steps copy up to %d of the next layer's predicted cold "
                "experts ahead, for %u layers (%.1f MiB of VRAM: the buffer, and routers the "
                "executor does not hold)%s",
                n, targets, tier_ahead_bytes(t) / 1048576.0,
                lru ? "; into a cached layer's least recently used slots" : "");
    if (*each)
        tm_log_info("--moe-ahead: each GPU copies for its own layers, from the layer before on "
                    "it (a span's first layer gets none): %s",
                    each);
    return TM_OK;
}

void tier_ahead_free(tm_tier *t) {
    for (int g = 0; g < EXEC_MAX_GPUS; g++) {
        tier_ahead *A = t->ahead[g];
        if (!A) continue;
        if (A->stream) (void)cuda_stream_sync(A->stream);
        cuda_stream_free(A->stream);
        cuda_event_free(A->fork), cuda_event_free(A->read);
        cuda_event_free(A->done[0]), cuda_event_free(A->done[1]);
        free(A->router), free(A->bias), free(A->split), free(A->expert_in_host);
        free(A->maps_host);
        free(A);
        t->ahead[g] = NULL;
    }
}

size_t tier_ahead_bytes(const tm_tier *t) {
    size_t bytes = 0;
    for (int g = 0; g < EXEC_MAX_GPUS; g++) bytes += t->ahead[g] ? t->ahead[g]->bytes : 0;
    return bytes;
}

tm_status tier_ahead_join(tm_tier *t, const tier_layer *L, tm_cuda_stream s, bool *ready) {
    tier_ahead *A = tier_ahead_of(t, L);
    *ready = false;
    if (!A || A->for_layer < 0) return TM_OK;
    const int64_t l = A->for_layer;
    A->for_layer = -1;
    /* a stale fork is joined too: a capture may not end with a stream left out */
    tm_status st = cuda_stream_wait_event(s, A->done[l % 2]);
    *ready = st == TM_OK && l == (int64_t)L->index;
    return st;
}

tm_status tier_ahead_release(tm_tier *t, const tier_layer *L, tm_cuda_stream s) {
    const tier_ahead *A = tier_ahead_of(t, L);
    return A && A->for_layer == (int64_t)L->index + 1 ? cuda_stream_wait_event(s, A->read) : TM_OK;
}

const int32_t *tier_ahead_map(const tm_tier *t, const tier_layer *L) {
    return tier_ahead_of(t, L)->map[L->index % 2];
}

tm_status tier_ahead_queue(tm_tier *t, const tier_layer *L, const float *h, int64_t n_tok,
                           tm_cuda_stream s) {
    tier_ahead *A = tier_ahead_of(t, L);
    const uint32_t next = L->index + 1;
    /* the next layer a target of this GPU's (another GPU's: its step is on that GPU) */
    if (!A || next >= t->n_layer || !A->router[next]) return TM_OK;
    const tier_layer *N = &t->layers[next];
    const tm_cuda_stream a = A->stream;
    const int nb = (int)(next % 2);
    const int64_t E = t->n_expert;
    const bool cached = N->cls == TM_TIER_CACHED;
    const tm_cuda_router_params rp =
        tier_router_gpu(t, N, cached ? N->slot_of_dev : t->cold_map_dev);
    const tm_cuda_fetch_cache fc = {cached ? N->slot_of_dev : NULL, N->expert_in_dev,
                                    N->last_use_dev, N->n_slots, exec_step_seq_dev(t->e)};
    tm_status st;
    if ((st = cuda_event_record(A->fork, s)) || (st = cuda_stream_wait_event(a, A->fork)) ||
        (st = cuda_mmvq(TM_TYPE_F32, A->router[next], (size_t)t->n_embd * sizeof(float), E,
                        t->n_embd, h, n_tok, A->logits, a)) ||
        (A->bias[next] && (st = cuda_add_bias(A->logits, A->bias[next], n_tok, E, a))) ||
        (st = cuda_router_select(&rp, A->logits, n_tok, A->ids, A->w, A->pred, a)) ||
        (st = cuda_event_record(A->read, a)) ||
        (st = cuda_moe_fetch_ahead(&N->pcie, cached ? &N->gpu : &N->ahead, A->pred, n_tok * t->k,
                                   (int32_t)E, A->n_slots, A->map[nb], A->list[nb],
                                   cached ? &fc : NULL, a)) ||
        (st = cuda_event_record(A->done[nb], a)))
        return st;
    A->for_layer = next;
    return TM_OK;
}

const int32_t *tier_ahead_split(tm_tier *t, const tier_layer *L, const int32_t *slot_of,
                                const int32_t *fetched, const int32_t *ids, int64_t n_ids,
                                int64_t *n_slots) {
    tier_ahead *A = tier_ahead_of(t, L); /* a host task: any GPU may be current */
    const int64_t E = t->n_expert;
    const bool cached = L->cls == TM_TIER_CACHED;
    uint64_t copied = 0, used = 0, slots = 0;
    for (int64_t e = 0; e < E; e++) {
        const int32_t host = slot_of ? slot_of[e] : -1;
        if (cached) { /* fetched: the GPU's slot map; copied: hot there since the last refresh */
            const bool now = fetched[e] >= 0, copy = now && host != fetched[e];
            A->split[e] = !now ? -1 : copy ? (int32_t)E + fetched[e] : fetched[e];
            copied += copy;
        } else {
            A->split[e] = host >= 0 ? host : fetched[e] >= 0 ? (int32_t)E + fetched[e] : -1;
            copied += host < 0 && fetched[e] >= 0;
        }
    }
    for (int64_t i = 0; i < n_ids; i++) {
        const int32_t e = ids[i];
        if (A->split[e] < E) continue;
        slots++;
        used += A->split[e] < 2 * E; /* the first slot of the expert: counted once */
        A->split[e] += (int32_t)E;
    }
    for (int64_t e = 0; e < E; e++)
        if (A->split[e] >= 2 * E) A->split[e] -= (int32_t)E;
    tm_tier_stats *by[2] = {&t->stats[L->cls], &t->stats_gpu[L->gpu_index]};
    for (int i = 0; i < 2; i++) {
        tm_tier_stats *s = by[i];
        s->ahead_experts += copied, s->ahead_used += used, s->ahead_slots += slots;
        s->ahead_bytes += copied * L->expert_bytes;
    }
    *n_slots = (int64_t)slots;
    return A->split;
}

/* GPU g's part of the refresh (it is current): its layers' rows of its copy of the maps,
 * and their slot contents. */
static tm_status tier_ahead_refresh_gpu(tm_tier *t, int g) {
    tier_ahead *A = t->ahead[g];
    tm_cuda_device *dev = exec_gpu(t->e);
    const size_t E = t->n_expert;
    tm_status st = cuda_copy_to_host(dev, A->maps_host, t->slot_maps_gpu[g] + A->maps_lo * E,
                                     (A->maps_hi - A->maps_lo + 1) * E * sizeof(int32_t));
    if (st == TM_OK)
        st = cuda_copy_to_host(dev, A->expert_in_host, A->cache_state,
                               (size_t)A->n_cache_slots * sizeof(int32_t));
    for (uint32_t l = A->maps_lo; l <= A->maps_hi && st == TM_OK; l++) {
        tier_layer *L = &t->layers[l];
        if (!L->expert_in_dev || L->gpu_index != g) continue;
        memcpy(L->slot_of, A->maps_host + (l - A->maps_lo) * E, E * sizeof(int32_t));
        const int32_t *now = A->expert_in_host + L->cache_at;
        uint64_t changed = 0;
        for (int32_t i = 0; i < L->n_slots; i++) changed += now[i] != L->expert_in[i];
        memcpy(L->expert_in, now, (size_t)L->n_slots * sizeof(int32_t));
        t->stats[L->cls].admits += changed;
    }
    return st;
}

tm_status tier_ahead_refresh(tm_tier *t) {
    tm_status st = TM_OK;
    bool any = false;
    for (int g = 0; g < t->n_bufs && st == TM_OK; g++) {
        if (!t->ahead[g] || !t->ahead[g]->lru) continue;
        any = true;
        if ((st = exec_gpu_set(t->e, g)) == TM_OK) st = tier_ahead_refresh_gpu(t, g);
    }
    return any && st == TM_OK ? exec_gpu_set(t->e, 0) : st;
}

tm_status tier_ahead_push(tm_tier *t, const tier_layer *L) {
    if (!L->expert_in_dev) return TM_OK;
    tm_status st = exec_gpu_set(t->e, L->gpu_index); /* its GPU's state */
    return st == TM_OK ? cuda_copy_to_device(exec_gpu(t->e), L->expert_in_dev, L->expert_in,
                                             (size_t)L->n_slots * sizeof(int32_t))
                       : st;
}
