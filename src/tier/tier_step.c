/* The tiered MoE step of one layer (tier.h, docs/executor.md).
 *
 * Decode (up to TM_CUDA_MMVQ_MAX_TOK tokens, routing and the residual stream
 * on the GPU), all queued on the stream, capturable in the decode graph:
 *   router select: ids, weights, work items through the layer's slot map
 *                  (and the PCIe lane's: the first cold slots of each token)
 *   [cold possible] signal: h, ids, weights → mailbox; flag_h[l] = step
 *   [hot possible]  hot lane: grouped kernels over the items, y += hot sums
 *   [PCIe lane]     grouped kernels reading pinned RAM, y += their sums
 *   [cold possible] wait: flag_y[l] == step, then y += the CPU's sum
 * and a host task (tier_decode_task): wait for flag_h[l], run the CPU lane on
 * the cold slots the PCIe lane left into the mailbox, write flag_y[l]. The
 * hot and PCIe lanes run while the CPU lane does.
 *
 * Anything else (prompts; routing or the residual stream on the host): the
 * routing comes to the host, the worklist (expert-major for prompts) is split
 * into cold and hot slots, the hot groups are queued on the GPU, the CPU lane
 * runs the cold runs meanwhile, and the side that does not hold the residual
 * stream sends its sum over. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timing.h"
#include "cpu/cpu_ops.h"
#include "tier/tier_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define tier_relax() _mm_pause()
#else
#define tier_relax() ((void)0)
#endif

#define TIER_QUERY_NS 1000000 /* how often a waiting host asks whether the stream failed */

/* The slot map the split goes by: NULL (every slot cold) for a layer in RAM. */
static const int32_t *tier_split_map(const tier_layer *L) {
    return L->cls == TM_TIER_CACHED ? L->slot_of : NULL;
}

static void tier_count(tm_tier *t, const tier_layer *L, int64_t n_hot, int64_t n_pcie,
                       int64_t n_cold) {
    tm_tier_stats *by[2] = {&t->stats[L->cls], &t->stats_gpu[L->gpu_index]};
    for (int i = 0; i < 1 + L->on_gpu; i++) {
        tm_tier_stats *s = by[i];
        s->calls++;
        s->hot_slots += (uint64_t)n_hot, s->cold_slots += (uint64_t)n_cold;
        s->pcie_slots += (uint64_t)n_pcie;
        s->hot_bytes += (uint64_t)n_hot * L->expert_bytes;
        s->cold_bytes += (uint64_t)n_cold * L->expert_bytes;
        s->pcie_bytes += (uint64_t)n_pcie * L->expert_bytes;
    }
}

/* A lane's time, into the counters of the layer's class and of its GPU. */
#define TIER_TIME(t, L, field, ns)                                                                 \
    do {                                                                                           \
        const uint64_t tier_ns_ = (ns);                                                            \
        (t)->stats[(L)->cls].field += tier_ns_;                                                    \
        if ((L)->on_gpu) (t)->stats_gpu[(L)->gpu_index].field += tier_ns_;                         \
    } while (0)

static uint64_t tier_event_ns(tm_cuda_event a, tm_cuda_event b) {
    float ms = 0;
    return cuda_event_elapsed(a, b, &ms) == TM_OK ? (uint64_t)(ms * 1e6) : 0;
}

static tm_status tier_split_room(tm_tier *t) {
    if (t->wl.n_slots <= t->cap_split) return TM_OK;
    tm_moe_slot *p = realloc(t->split_tmp, (size_t)t->wl.n_slots * sizeof(*p));
    if (!p)
        return tm_error_set(TM_ERR_NOMEM, "tier: out of memory for %lld slots",
                            (long long)t->wl.n_slots);
    t->split_tmp = p, t->cap_split = t->wl.n_slots;
    return TM_OK;
}

/* The routed slots of a layer step, counted per expert (the CPU lane of
 * prompts takes the least used experts). */
static void tier_seen(tier_layer *L, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) L->seen[ids[i]]++;
}

/* The CPU lane on slots [s0, s1) of the worklist: from the store (--ram-cache)
 * or the mapped file. */
static tm_status tier_cpu_lane(tm_tier *t, tier_layer *L, int64_t s0, int64_t s1, const float *x,
                               float *y) {
    tm_exec *e = t->e;
    if (t->store)
        return store_lane_run(t->store, L->index, t->lane, exec_pool(e), &t->wl, s0, s1, x, y,
                              exec_precise(e));
    return moe_cpu_lane_run(t->lane, exec_pool(e), &L->host, &t->wl, s0, s1, x, y, exec_precise(e));
}

/* ---- decode: the hand-off ---- */

/* Spin until the GPU has published layer l of this step. Gives up when the
 * stream fails, finishes without publishing, or the timeout passes. */
static tm_status tier_wait_gpu(tm_tier *t, uint32_t l, uint32_t seq) {
    uint64_t t0 = 0, last = 0;
    for (unsigned i = 0;; i++) {
        if ((int32_t)(__atomic_load_n(&t->mb.flag_h[l], __ATOMIC_ACQUIRE) - seq) >= 0) return TM_OK;
        tier_relax();
        if ((i & 1023) != 1023) continue;
        const uint64_t now = tm_time_ns();
        if (!t0) t0 = last = now;
        if (now - last < TIER_QUERY_NS) continue;
        last = now;
        bool idle = false; /* every GPU's: the layer's may not be the one ops run on now */
        tm_status st = exec_streams_query(t->e, &idle);
        if (st != TM_OK) return tm_error_wrap(st, "layer %u, waiting for the GPU's hand-off: ", l);
        if (idle && (int32_t)(__atomic_load_n(&t->mb.flag_h[l], __ATOMIC_ACQUIRE) - seq) < 0)
            return tm_error_set(TM_ERR_DEVICE,
                                "layer %u: the GPU finished the step without handing the layer's "
                                "cold experts over",
                                l);
        if (now - t0 > t->timeout_ns)
            return tm_error_set(TM_ERR_DEVICE,
                                "layer %u: no hand-off from the GPU in %.1f s "
                                "(TIERMOE_HANDOFF_TIMEOUT_MS)",
                                l, t->timeout_ns * 1e-9);
    }
}

/* The host's half of a decode layer: the cold slots on the CPU lane. It
 * always answers (flag_y), so a failure here costs the step, never a GPU
 * left waiting. */
static tm_status tier_decode_task(void *ud) {
    tier_layer *L = ud;
    tm_tier *t = L->t;
    tm_exec *e = t->e;
    const uint32_t seq = exec_step_seq(e);
    const int64_t n_tok = exec_n_tok(e);
    const tier_inbox *in = &t->mb.in[L->index];
    t->tune.rows = n_tok; /* the step's rows, for the tuner after it */
    const uint64_t t0 = tm_time_ns();
    tm_status st = tier_wait_gpu(t, L->index, seq);
    const uint64_t t1 = tm_time_ns();
    TIER_TIME(t, L, wait_ns, t1 - t0);
    int64_t n_cold = 0, n_pcie = 0;
    if (st == TM_OK) {
        tier_seen(L, in->ids, n_tok * t->k);
        if (L->cls == TM_TIER_CACHED) tier_cache_observe(t, L, in->ids, n_tok);
        st = moe_worklist_build(&t->wl, in->ids, in->w, n_tok, t->n_expert, t->k,
                                TM_MOE_PHASE_DECODE);
    }
    if (st == TM_OK) st = tier_split_room(t);
    const int32_t *map = tier_split_map(L);
    int64_t n_ahead = 0;              /* slots of experts copied ahead in this step */
    if (st == TM_OK && L->fetched_on) /* the experts copied ahead are the GPU's */
        map = tier_ahead_split(t, L, map, in->fetched, in->ids, n_tok * t->k, &n_ahead);
    if (st == TM_OK)
        n_cold =
            tier_worklist_split(&t->wl, map, L->n_pcie, t->pcie_share_q8, t->split_tmp, &n_pcie);
    if (st == TM_OK) { /* the GPU adds the answer only when it left the CPU slots */
        int64_t gpu_cold = 0;
        for (int64_t i = 0; i < n_tok; i++) gpu_cold += in->cpu_slots[i];
        if (gpu_cold != n_cold)
            st = tm_error_set(TM_ERR_DEVICE,
                              "layer %u: the GPU left %lld slots to the CPU, the host's split %lld",
                              L->index, (long long)gpu_cold, (long long)n_cold);
    }
    if (n_tok > 1) tier_worklist_group(&t->wl, n_cold); /* rows of several sequences */
    memset(t->mb.y, 0, (size_t)(n_tok * t->n_embd) * sizeof(float));
    const uint64_t t2 = tm_time_ns();
    if (st == TM_OK && n_cold) st = tier_cpu_lane(t, L, 0, n_cold, in->h, t->mb.y);
    TIER_TIME(t, L, cold_prep_ns, t2 - t1);
    if (st == TM_OK) {
        tier_count(t, L, t->wl.n_slots - n_cold - n_pcie - n_ahead, n_pcie, n_cold);
        TIER_TIME(t, L, cold_ns, tm_time_ns() - t1);
    }
    __atomic_store_n(&t->mb.flag_y[L->index], seq, __ATOMIC_RELEASE);
    return st;
}

static tm_status tier_decode(tm_tier *t, tier_layer *L, tm_act *logits, tm_act *h, tm_act *ids,
                             tm_act *w, tm_act *y) {
    tm_exec *e = t->e;
    const tm_cuda_stream s = exec_stream(e);
    const int64_t n_tok = exec_n_tok(e), E = t->n_embd, K = t->k, l = L->index;
    const uint32_t *seq = exec_step_seq_dev(e);
    const bool hot = L->cls != TM_TIER_RAM, cold = L->cls != TM_TIER_VRAM, pcie = L->n_pcie > 0;
    const bool prof = tier_profiling(t);
    tier_ahead *A = tier_ahead_of(t, L); /* its GPU's copies ahead */
    bool fetched = false; /* copies ahead for this layer: joined before its router reads them */
    tm_status st = tier_ahead_join(t, L, s, &fetched);
    if (st != TM_OK) return st;
    fetched &= cold;
    /* and the next layer's, on their own stream from here (h is ready) */
    bool ahead = false;
    if (A && ((prof && (st = cuda_event_record(t->ev[6], s))) ||
              (st = tier_ahead_queue(t, L, h->dev, n_tok, s))))
        return st;
    if (A && A->for_layer == (int64_t)l + 1) {
        ahead = true;
        if (prof && (st = cuda_event_record(t->ev[7], A->stream))) return st;
    }
    /* a layer in RAM: every slot cold (the router counts them for the CPU) */
    tm_cuda_router_params rp = tier_router_gpu(t, L,
                                               L->cls == TM_TIER_CACHED ? L->slot_of_dev
                                               : cold                   ? t->cold_map_dev
                                                                        : NULL);
    if (pcie)
        rp.mapped = t->pcie_items, rp.n_mapped = L->n_pcie, rp.mapped_share_q8 = t->pcie_share_q8,
        rp.mapped_share_live = t->tune.on ? t->mb_dev.share : NULL;
    /* a cached layer's copies are in its slots (its map says so); others' in the buffer */
    const bool buffered = fetched && L->cls != TM_TIER_CACHED;
    if (buffered) rp.fetch_map = tier_ahead_map(t, L), rp.fetched = A->items;
    if (cold) rp.cpu_slots = t->cpu_slots_dev; /* none: the GPU does not wait for the CPU */
    L->fetched_on = fetched; /* a graph replays this step's choice, and so does its host task */
    st =
        cuda_router_select(&rp, logits->dev, n_tok, ids->dev, w->dev, hot ? t->items_dev : NULL, s);
    if (st != TM_OK) return st;
    exec_act_wrote(ids, TM_DEV_GPU), exec_act_wrote(w, TM_DEV_GPU);
    if (cold) {
        const tier_inbox *in = &t->mb_dev.in[l];
        const tm_cuda_span spans[5] = {{in->cpu_slots, t->cpu_slots_dev, n_tok * 4},
                                       {in->h, h->dev, n_tok * E * 4},
                                       {in->ids, ids->dev, n_tok * K * 4},
                                       {in->w, w->dev, n_tok * K * 4},
                                       {in->fetched,
                                        buffered  ? tier_ahead_map(t, L)
                                        : fetched ? L->slot_of_dev
                                                  : NULL,
                                        (int64_t)t->n_expert * 4}};
        if ((st = cuda_signal_host(spans, fetched ? 5 : 4, &t->mb_dev.flag_h[l], seq, s)))
            return st;
    }
    if (hot) {
        if ((prof && (st = cuda_event_record(t->ev[0], s))) ||
            (st = cuda_moe_grouped(&L->gpu, t->items_dev, n_tok * K, h->dev, n_tok, y->dev,
                                   t->h_scratch, s)) ||
            (prof && (st = cuda_event_record(t->ev[1], s))))
            return st;
        if (!cold) tier_count(t, L, n_tok * K, 0, 0);
    }
    if (pcie && ((prof && (st = cuda_event_record(t->ev[4], s))) ||
                 (st = cuda_moe_grouped(&L->pcie, t->pcie_items, n_tok * K, h->dev, n_tok, y->dev,
                                        t->h_scratch, s)) ||
                 (prof && (st = cuda_event_record(t->ev[5], s)))))
        return st;
    /* the experts copied ahead for this layer */
    if (buffered && (st = cuda_moe_grouped(&L->ahead, A->items, n_tok * K, h->dev, n_tok, y->dev,
                                           t->h_scratch, s)))
        return st;
    if (cold) {
        if ((prof && (st = cuda_event_record(t->ev[2], s))) ||
            (st = cuda_wait_host_unless(t->cpu_slots_dev, (int32_t)n_tok, &t->mb_dev.flag_y[l], seq,
                                        t->timeout_ns, &t->mb_dev.err[l], y->dev, t->mb_dev.y,
                                        n_tok * E, s)) ||
            (prof && (st = cuda_event_record(t->ev[3], s))) ||
            (st = exec_host_task(e, tier_decode_task, L)))
            return st;
    }
    if ((st = tier_ahead_release(t, L, s))) return st; /* h is rewritten after this layer */
    exec_act_wrote(y, TM_DEV_GPU);
    if (!prof) return TM_OK;
    if ((st = exec_sync(e)) || (ahead && (st = cuda_stream_sync(A->stream)))) return st;
    if (hot) TIER_TIME(t, L, hot_ns, tier_event_ns(t->ev[0], t->ev[1]));
    if (pcie) TIER_TIME(t, L, pcie_ns, tier_event_ns(t->ev[4], t->ev[5]));
    if (cold) TIER_TIME(t, L, gpu_wait_ns, tier_event_ns(t->ev[2], t->ev[3]));
    if (ahead) TIER_TIME(t, L, ahead_ns, tier_event_ns(t->ev[6], t->ev[7]));
    return TM_OK;
}

/* ---- everything else: prompts, host-side routing or residual ---- */

/* ids and weights on the host, by the side that holds the logits. */
static tm_status tier_route(tm_tier *t, const tier_layer *L, tm_act *logits, tm_act *ids,
                            tm_act *w) {
    tm_exec *e = t->e;
    const int64_t n_tok = exec_n_tok(e);
    tm_status st;
    if (t->gpu && exec_act_on(logits, TM_DEV_GPU)) {
        const tm_cuda_router_params rp = tier_router_gpu(t, L, NULL);
        if ((st = cuda_router_select(&rp, logits->dev, n_tok, ids->dev, w->dev, NULL,
                                     exec_stream(e))))
            return st;
        exec_act_wrote(ids, TM_DEV_GPU), exec_act_wrote(w, TM_DEV_GPU);
        if ((st = exec_act_to(e, ids, TM_DEV_CPU, n_tok)) ||
            (st = exec_act_to(e, w, TM_DEV_CPU, n_tok)))
            return st;
        return TM_OK;
    }
    if ((st = exec_act_to(e, logits, TM_DEV_CPU, n_tok))) return st;
    const tm_moe_router_params rp = tier_router(t, L);
    moe_router_select(exec_pool(e), &rp, logits->host, n_tok, ids->host, w->host);
    exec_act_wrote(ids, TM_DEV_CPU), exec_act_wrote(w, TM_DEV_CPU);
    return TM_OK;
}

/* Queue the hot slots [first, n_slots) of the worklist on the GPU: y (device,
 * [n_tok][n_embd]) += their weighted outputs. */
static tm_status tier_hot_lane(tm_tier *t, tier_layer *L, int64_t first, const float *h, float *y) {
    tm_exec *e = t->e;
    const tm_cuda_stream s = exec_stream(e);
    const int64_t n_tok = exec_n_tok(e), n_hot = t->wl.n_slots - first;
    const tm_moe_slot *sl = t->wl.slots + first;
    for (int64_t i = 0; i < n_hot; i++) {
        const int32_t slot = tier_slot_of(t, L->index, sl[i].expert);
        t->items_host[i] = (tm_cuda_moe_item){slot, sl[i].token, sl[i].weight, sl[i].expert};
    }
    tm_status st =
        cuda_copy_async(t->items_dev, t->items_host, (size_t)n_hot * sizeof(tm_cuda_moe_item), s);
    if (st != TM_OK) return st;
    if (n_tok <= TM_CUDA_MMVQ_MAX_TOK || !t->wl.expert_major)
        return cuda_moe_grouped(&L->gpu, t->items_dev, n_hot, h, n_tok, y, t->h_scratch, s);
    /* expert-major: a group per run of one expert (a token-major list of rows of
       several sequences has more runs than experts, and took the branch above) */
    const int32_t n_groups = tier_groups(t, t->items_host, sl, 0, n_hot);
    const tm_cuda_moe_groups g = {n_groups, t->group_slots, t->group_starts, t->items_dev};
    return cuda_moe_grouped_gemm(exec_blas(e), &L->gpu, &g, h, n_tok, y, t->gemm_scratch, s);
}

static tm_status tier_general(tm_tier *t, tier_layer *L, tm_act *logits, tm_act *h, tm_act *ids,
                              tm_act *w, tm_act *y, tm_dev side) {
    tm_exec *e = t->e;
    const tm_cuda_stream s = exec_stream(e);
    const int64_t n_tok = exec_n_tok(e), E = t->n_embd;
    const size_t y_bytes = (size_t)(n_tok * E) * sizeof(float);
    const bool prof = tier_profiling(t);
    /* prompts with the residual on the GPU: RAM experts on the GPU too (the
     * fetch ring or in place), beside the CPU lane's share */
    const tier_prompt_mode mode =
        t->gpu && side == TM_DEV_GPU && n_tok > TM_CUDA_MMVQ_MAX_TOK && L->cls != TM_TIER_VRAM
            ? tier_prompt_mode_of(t, L, n_tok)
            : TIER_PROMPT_CPU;
    /* more tokens than the matrix-vector kernels take go to the GPU's
     * tensor cores in expert groups, whatever the phase */
    const tm_moe_phase phase =
        n_tok > TM_CUDA_MMVQ_MAX_TOK && (L->cls != TM_TIER_RAM || mode != TIER_PROMPT_CPU)
            ? TM_MOE_PHASE_PROMPT
            : exec_phase(e);
    tm_status st;
    /* copies of this layer's experts start before its routing is known */
    if (mode == TIER_PROMPT_FETCH && (st = tier_fetch_begin(t, L))) return st;
    if ((st = tier_route(t, L, logits, ids, w)) ||
        (st = moe_worklist_build(&t->wl, ids->host, w->host, n_tok, t->n_expert, t->k, phase)) ||
        (st = tier_split_room(t)))
        return st;
    tier_seen(L, ids->host, n_tok * t->k);
    if (L->cls == TM_TIER_CACHED) tier_cache_observe(t, L, ids->host, n_tok);
    if (mode == TIER_PROMPT_FETCH && (st = tier_fetch_plan_next(t, (int64_t)L->index + 1)))
        return st;
    int64_t n_cold = 0, n_gpu = 0; /* the CPU lane's slots, the GPU's RAM-expert slots */
    if (mode != TIER_PROMPT_CPU) {
        int64_t counts[3];
        tier_prompt_lanes(t, L, mode, &t->wl);
        tier_worklist_partition(&t->wl, t->lane_of, t->split_tmp, counts);
        n_cold = counts[TIER_LANE_CPU], n_gpu = counts[TIER_LANE_GPU];
    } else if (L->cls != TM_TIER_VRAM) {
        int64_t n_pcie = 0;
        n_cold = tier_worklist_split(&t->wl, tier_split_map(L), 0, 0, t->split_tmp, &n_pcie);
    }
    /* a decode step of several rows: experts they share read once by the CPU lane */
    if (!t->wl.expert_major && n_tok > 1 && n_tok <= TM_CUDA_MMVQ_MAX_TOK)
        tier_worklist_group(&t->wl, n_cold);
    const int64_t n_hot = t->wl.n_slots - n_cold - n_gpu;
    /* h to the host before any GPU lane is queued, so that waiting for it
     * does not wait for them */
    if (n_cold && (st = exec_act_to(e, h, TM_DEV_CPU, n_tok))) return st;
    /* the GPU lanes first, so they run while the CPU lane does */
    if (n_hot) {
        float *yh = side == TM_DEV_GPU ? y->dev : t->y_dev;
        if ((st = exec_act_to(e, h, TM_DEV_GPU, n_tok)) ||
            (side == TM_DEV_CPU && (st = cuda_fill_async(t->y_dev, 0, y_bytes, s))) ||
            (prof && (st = cuda_event_record(t->ev[0], s))) ||
            (st = tier_hot_lane(t, L, n_cold + n_gpu, h->dev, yh)) ||
            (prof && (st = cuda_event_record(t->ev[1], s))))
            return st;
    }
    if (mode != TIER_PROMPT_CPU &&
        (st = tier_prompt_gpu(t, L, mode, t->wl.slots + n_cold, n_gpu, h->dev, y->dev)))
        return st;
    if (n_cold) {
        float *yc = side == TM_DEV_CPU ? y->host : t->y_host;
        if (side == TM_DEV_GPU) memset(yc, 0, y_bytes);
        const uint64_t t0 = tm_time_ns();
        if ((st = tier_cpu_lane(t, L, 0, n_cold, h->host, yc))) return st;
        TIER_TIME(t, L, cold_ns, tm_time_ns() - t0);
    }
    if (mode != TIER_PROMPT_CPU && (st = tier_prompt_balance(t, mode))) return st;
    if (n_cold) {
        if (side == TM_DEV_GPU && /* the CPU's sum into the residual on the GPU */
            ((prof && (st = cuda_event_record(t->ev[2], s))) ||
             (st = cuda_copy_async(t->y_dev, t->y_host, y_bytes, s)) ||
             (st = cuda_add(y->dev, y->dev, t->y_dev, n_tok * E, s)) ||
             (prof && (st = cuda_event_record(t->ev[3], s)))))
            return st;
    }
    if (n_hot && side == TM_DEV_CPU) { /* the GPU's sum into the residual on the host */
        if ((st = cuda_copy_async(t->y_host, t->y_dev, y_bytes, s)) || (st = exec_sync(e)))
            return st;
        cpu_axpy(y->host, 1.0f, t->y_host, n_tok * E);
    }
    tier_count(t, L, n_hot, 0, n_cold);
    exec_act_wrote(y, side);
    if (!prof || !t->gpu) return TM_OK;
    if ((st = exec_sync(e))) return st;
    if (n_hot) TIER_TIME(t, L, hot_ns, tier_event_ns(t->ev[0], t->ev[1]));
    if (n_cold && side == TM_DEV_GPU) TIER_TIME(t, L, merge_ns, tier_event_ns(t->ev[2], t->ev[3]));
    return TM_OK;
}

/* Over several GPUs: the layer's GPU the one ops run on, the tier's buffers its own,
 * and the inputs valid on the GPU brought there (from the GPU before a span boundary). */
static tm_status tier_bufs_use(tm_tier *t, const tier_layer *L, tm_act *const *acts, int n) {
    tm_exec *e = t->e;
    tm_status st = exec_gpu_set(e, L->gpu_index);
    for (int i = 0; i < n && st == TM_OK; i++)
        if (acts[i] && exec_act_on(acts[i], TM_DEV_GPU))
            st = exec_act_to(e, acts[i], TM_DEV_GPU, exec_n_tok(e));
    if (st != TM_OK || t->bufs_gpu == L->gpu_index) return st;
    tier_bufs_save(t, t->bufs_gpu);
    tier_bufs_load(t, L->gpu_index);
    return TM_OK;
}

tm_status tier_moe(tm_tier *t, uint32_t layer, tm_act *logits, tm_act *h, tm_act *ids, tm_act *w,
                   tm_act *x, tm_act *ffn_out) {
    if (layer >= t->n_layer)
        return tm_error_set(TM_ERR_ARG, "tier_moe: layer %u of %u", layer, t->n_layer);
    tm_exec *e = t->e;
    tier_layer *L = &t->layers[layer];
    if (!L->moe) return tm_error_set(TM_ERR_ARG, "tier_moe: layer %u has no routed experts", layer);
    const int64_t n_tok = exec_n_tok(e), E = t->n_embd;
    if (!x && !ffn_out) return tm_error_set(TM_ERR_ARG, "tier_moe: layer %u: no output", layer);
    if (t->n_bufs > 1) { /* spans: on the GPU of the layer's experts, with its buffers */
        /* what the step reads: ffn_out is only written (the named sum), so it does not
           cross (the peer-copy counters found it crossing each boundary) */
        tm_act *in[] = {logits, h, x};
        tm_status s = tier_bufs_use(t, L, in, 3);
        if (s != TM_OK) return s;
    }
    /* x NULL: the sum alone into ffn_out, on the side of the experts' input */
    const tm_dev side = exec_act_on(x ? x : h, TM_DEV_GPU) ? TM_DEV_GPU : TM_DEV_CPU;
    const bool named = (exec_emitting(e) || !x) && ffn_out;
    tm_act *y = named ? ffn_out : x;
    tm_status st;
    if (named) { /* the sum on its own first, so it can be named */
        if (side == TM_DEV_GPU)
            st = cuda_fill_async(ffn_out->dev, 0, (size_t)(n_tok * E) * 4, exec_stream(e));
        else
            st = (memset(ffn_out->host, 0, (size_t)(n_tok * E) * 4), TM_OK);
        if (st != TM_OK) return st;
        exec_act_wrote(ffn_out, side);
    }
    const bool decode = t->gpu && side == TM_DEV_GPU && exec_phase(e) == TM_MOE_PHASE_DECODE &&
                        n_tok <= TM_CUDA_MMVQ_MAX_TOK && exec_act_on(logits, TM_DEV_GPU) &&
                        exec_act_on(h, TM_DEV_GPU);
    st = decode ? tier_decode(t, L, logits, h, ids, w, y)
                : tier_general(t, L, logits, h, ids, w, y, side);
    if (st != TM_OK || !named || !x) return st;
    if (side == TM_DEV_GPU) {
        if ((st = cuda_add(x->dev, x->dev, ffn_out->dev, n_tok * E, exec_stream(e)))) return st;
    } else {
        cpu_axpy(x->host, 1.0f, ffn_out->host, n_tok * E);
    }
    exec_act_wrote(x, side);
    return TM_OK;
}
