/* Fused expert routing, one warp per token: router logits → gate scores
 * (softmax over all experts, sigmoid, or the raw logits for softmax-over-top-k)
 * → selection scores (plus the selection bias; the experts outside the best
 * groups ruled out) → top-k (ties to the lower expert id) → weights from the
 * scores without the bias (softmax over the k for SOFTMAX_TOPK) → renormalise
 * → scale. The same function as moe_router_select in src/moe/router.c, in one
 * launch.
 *
 * Each lane holds experts lane, lane+32, ... (16 registers for 512 experts);
 * top-k is k rounds of a warp arg-max with a per-lane "taken" bit mask, and
 * lane j keeps the j-th winner, so the k results never touch memory until
 * they are written (with, when asked, the decode work items {slot, t, weight}
 * for cuda_moe_grouped, slot = id or a VRAM cache's slot of it; and the work
 * lists of the PCIe lane and of the experts copied ahead). A group's score is
 * a warp reduction of each lane's best two in it; the groups are chosen by
 * rounds of arg-max like the experts, and the others' experts marked taken.
 * Sums are float (the CPU's softmax sums in double): the
 * weights agree to float rounding, ids agree except where two scores are
 * within that rounding of each other. */
#include <math.h>

#include "cuda/cuda_args.h"
#include "cuda/cuda_common.cuh"

#define TM_ROUTER_WARPS    4
#define TM_ROUTER_PER_LANE (TM_CUDA_ROUTER_MAX_EXPERT / TM_CUDA_WARP)

/* (a_val, a_idx) better than (b_val, b_idx): larger value, then lower id. */
static __device__ __forceinline__ bool tm_better(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

/* Group-limited choice: group g (experts [g G, (g + 1) G), G = n_expert / n_group)
 * scores the sum of its two largest sel (float, as the CPU's a + b); the
 * n_group_used best groups are kept (ties to the lower group) and every expert of
 * the others is marked taken. */
static __device__ void tm_router_groups(const tm_cuda_router_params &p, int lane, const float *sel,
                                        uint32_t *taken) {
    const int G = p.n_expert / p.n_group;
    float my_gs = -INFINITY; /* lane g < n_group: group g's score */
    for (int g = 0; g < p.n_group; g++) {
        float a = -INFINITY, b = -INFINITY; /* this lane's largest two of group g */
#pragma unroll
        for (int j = 0; j < TM_ROUTER_PER_LANE; j++) {
            const int e = lane + TM_CUDA_WARP * j;
            if (e >= p.n_expert || e / G != g) continue;
            if (sel[j] > a)
                b = a, a = sel[j];
            else if (sel[j] > b)
                b = sel[j];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) { /* merge the lanes' pairs */
            const float oa = __shfl_xor_sync(0xffffffffu, a, o);
            const float ob = __shfl_xor_sync(0xffffffffu, b, o);
            if (oa > a)
                b = fmaxf(a, ob), a = oa;
            else
                b = fmaxf(b, oa);
        }
        if (lane == g) my_gs = a + b;
    }
    uint32_t keep = 0;             /* bit g: group g kept */
    bool mine = lane >= p.n_group; /* this lane's group is chosen or does not exist */
    for (int r = 0; r < p.n_group_used; r++) {
        float bv = mine ? -INFINITY : my_gs;
        int bi = mine ? 0x7fffffff : lane;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (tm_better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        keep |= 1u << bi; /* a valid group: n_group_used <= n_group */
        if (lane == bi) mine = true;
    }
#pragma unroll
    for (int j = 0; j < TM_ROUTER_PER_LANE; j++) {
        const int e = lane + TM_CUDA_WARP * j;
        if (e < p.n_expert && !((keep >> (e / G)) & 1)) *taken |= 1u << j;
    }
}

__global__ void __launch_bounds__(TM_ROUTER_WARPS *TM_CUDA_WARP)
    tm_router_kernel(tm_cuda_router_params p, const float *__restrict__ logits, int64_t n_tok,
                     int32_t *__restrict__ ids, float *__restrict__ weights,
                     tm_cuda_moe_item *__restrict__ items) {
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1);
    const int64_t t = (int64_t)blockIdx.x * TM_ROUTER_WARPS + (threadIdx.x >> 5);
    if (t >= n_tok) return; /* whole warp */
    const int E = p.n_expert, K = p.n_used;
    const float *l = logits + t * E;

    float s[TM_ROUTER_PER_LANE];
    uint32_t taken = 0; /* bit j: expert lane+32j is chosen or does not exist */
#pragma unroll
    for (int j = 0; j < TM_ROUTER_PER_LANE; j++) {
        const int e = lane + TM_CUDA_WARP * j;
        s[j] = e < E ? l[e] : -INFINITY;
        if (e >= E) taken |= 1u << j;
    }
    if (p.gating == TM_CUDA_GATING_SOFTMAX) {
        float m = -INFINITY;
#pragma unroll
        for (int j = 0; j < TM_ROUTER_PER_LANE; j++) m = fmaxf(m, s[j]);
        m = tm_warp_max(m);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < TM_ROUTER_PER_LANE; j++) {
            s[j] = (taken >> j) & 1 ? 0.0f : expf(s[j] - m);
            sum += s[j];
        }
        const float inv = 1.0f / tm_warp_sum(sum);
#pragma unroll
        for (int j = 0; j < TM_ROUTER_PER_LANE; j++)
            s[j] = (taken >> j) & 1 ? -INFINITY : s[j] * inv;
    } else if (p.gating == TM_CUDA_GATING_SIGMOID) {
#pragma unroll
        for (int j = 0; j < TM_ROUTER_PER_LANE; j++)
            if (!((taken >> j) & 1)) s[j] = 1.0f / (1.0f + expf(-s[j]));
    }

    /* A NaN score would never win a comparison and leave no valid id: rank it lowest. */
#pragma unroll
    for (int j = 0; j < TM_ROUTER_PER_LANE; j++)
        if (isnan(s[j])) s[j] = -INFINITY;

    /* the selection scores: the scores plus the bias, which chooses but never weighs */
    float sel[TM_ROUTER_PER_LANE];
#pragma unroll
    for (int j = 0; j < TM_ROUTER_PER_LANE; j++) {
        const int e = lane + TM_CUDA_WARP * j;
        sel[j] = p.sel_bias && !((taken >> j) & 1) ? s[j] + p.sel_bias[e] : s[j];
        if (isnan(sel[j])) sel[j] = -INFINITY;
    }
    if (p.n_group > 1 && p.n_group_used < p.n_group) tm_router_groups(p, lane, sel, &taken);

    /* k rounds of arg-max of sel; lane i keeps round i's winner and its score */
    float my_score = 0.0f;
    int my_id = 0;
    for (int r = 0; r < K; r++) {
        float bv = -INFINITY, bs = 0.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < TM_ROUTER_PER_LANE; j++) {
            const int e = lane + TM_CUDA_WARP * j;
            if (!((taken >> j) & 1) && tm_better(sel[j], e, bv, bi)) bv = sel[j], bi = e, bs = s[j];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            const float os = __shfl_xor_sync(0xffffffffu, bs, o);
            if (tm_better(ov, oi, bv, bi)) bv = ov, bi = oi, bs = os;
        }
        /* every lane now holds the same winner; its owner marks it taken */
        if (bi != 0x7fffffff && (bi & (TM_CUDA_WARP - 1)) == lane) taken |= 1u << (bi >> 5);
        if (lane == r) my_score = bs, my_id = bi;
    }

    const bool mine = lane < K;
    float w = my_score;
    if (p.gating == TM_CUDA_GATING_SOFTMAX_TOPK) {
        const float m = tm_warp_max(mine ? w : -INFINITY);
        const float e = mine ? expf(w - m) : 0.0f;
        w = e / tm_warp_sum(e);
    }
    if (p.norm_topk) w = w / tm_warp_sum(mine ? w : 0.0f);
    if (p.scale != 1.0f) w *= p.scale;
    if (p.expert_scale && mine) w *= p.expert_scale[my_id];
    /* the mapped lane's share: the first n_mapped cold slots (ballot over the k lanes) */
    int32_t slot = my_id, fslot = -1;
    if (mine && p.slot_map) slot = p.slot_map[my_id];
    if (mine && slot < 0 && p.fetch_map) fslot = p.fetch_map[my_id]; /* copied ahead */
    const unsigned cold = __ballot_sync(0xffffffffu, mine && slot < 0 && fslot < 0);
    const int32_t share =
        p.mapped_share_live ? *(const volatile int32_t *)p.mapped_share_live : p.mapped_share_q8;
    const int n_map = tm_cuda_mapped_count(__popc(cold), p.n_mapped, share);
    const bool mapped = mine && slot < 0 && fslot < 0 && __popc(cold & ((1u << lane) - 1u)) < n_map;
    if (p.cpu_slots && lane == 0) p.cpu_slots[t] = __popc(cold) - n_map;
    if (mine) {
        ids[t * K + lane] = my_id;
        weights[t * K + lane] = w;
        if (items) { /* the decode work list, without a launch of its own */
            tm_cuda_moe_item it;
            it.slot = slot, it.token = (int32_t)t, it.weight = w, it.expert = my_id;
            items[t * K + lane] = it;
        }
        if (p.mapped) {
            tm_cuda_moe_item it;
            it.slot = mapped ? my_id : -1, it.token = (int32_t)t, it.weight = w, it.expert = my_id;
            p.mapped[t * K + lane] = it;
        }
        if (p.fetched) {
            tm_cuda_moe_item it;
            it.slot = fslot, it.token = (int32_t)t, it.weight = w, it.expert = my_id;
            p.fetched[t * K + lane] = it;
        }
    }
}

extern "C" tm_status cuda_router_select(const tm_cuda_router_params *p, const float *logits,
                                        int64_t n_tok, int32_t *ids, float *weights,
                                        tm_cuda_moe_item *items, tm_cuda_stream stream) {
    tm_status st = cuda_router_select_args_check(p, n_tok);
    if (st != TM_OK || n_tok == 0) return st;
    const int64_t blocks = (n_tok + TM_ROUTER_WARPS - 1) / TM_ROUTER_WARPS;
    tm_router_kernel<<<(unsigned)blocks, TM_ROUTER_WARPS * TM_CUDA_WARP, 0, stream>>>(
        *p, logits, n_tok, ids, weights, items);
    return tm_cuda_launch_check("cuda_router_select", n_tok, p->n_expert, p->n_used);
}
