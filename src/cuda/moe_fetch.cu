/* Copying ahead the experts a decode step is predicted to route to (cuda.h,
 * "moe_fetch.cu"): a one-block kernel chooses the experts from the predicted
 * work items, then a grid copies their slices. Both read everything they need
 * from device memory, so a captured graph replays them for whatever routing
 * the step predicts.
 *
 * The choice is deterministic (each expert's weights summed in item order,
 * ties to the lower id): a replay and the host mock choose the same experts.
 * The copy reads host memory mapped for the device: 16-byte loads, four in
 * flight per thread, over many blocks, so enough reads cross PCIe at once to
 * fill the link. */
#include <math.h>

#include "cuda/cuda_args.h"
#include "cuda/cuda_common.cuh"

#define TM_FETCH_SELECT_THREADS 512 /* one thread an expert: TM_CUDA_ROUTER_MAX_EXPERT */
#define TM_FETCH_ITEMS_SHARED   256 /* items staged in shared memory at a time */
#define TM_FETCH_COPY_THREADS   256
#define TM_FETCH_COPY_UNROLL    4
#define TM_FETCH_COPY_BLOCKS    64 /* per expert: 2.5 MiB a q4_K expert of 30b-a3b */

/* The block's best (value, index) by v (larger, then lower index); -1 when
 * every value is -INFINITY. All threads get the answer. */
static __device__ int tm_fetch_block_best(float v, int i, float *best_v, int *best_i, int *winner) {
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1), warp = threadIdx.x >> 5;
    float bv = v;
    int bi = v == -INFINITY ? 0x7fffffff : i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        float wv = best_v[0];
        int wi = best_i[0];
        for (int w = 1; w < TM_FETCH_SELECT_THREADS / TM_CUDA_WARP; w++)
            if (best_v[w] > wv || (best_v[w] == wv && best_i[w] < wi))
                wv = best_v[w], wi = best_i[w];
        *winner = wv == -INFINITY ? -1 : wi;
    }
    __syncthreads();
    const int w = *winner;
    __syncthreads(); /* read before the next call writes it */
    return w;
}

/* Thread e sums expert e's cold weights; thread s (cache mode) looks after
 * slot s. */
__global__ void __launch_bounds__(TM_FETCH_SELECT_THREADS)
    tm_fetch_select_kernel(const tm_cuda_moe_item *__restrict__ items, int64_t n_items,
                           int32_t n_expert, int32_t n_slots, int32_t *__restrict__ map,
                           int32_t *__restrict__ list, tm_cuda_fetch_cache c, bool cached) {
    __shared__ tm_cuda_moe_item stage[TM_FETCH_ITEMS_SHARED];
    __shared__ float best_v[TM_FETCH_SELECT_THREADS / TM_CUDA_WARP];
    __shared__ int best_i[TM_FETCH_SELECT_THREADS / TM_CUDA_WARP];
    __shared__ int winner;
    __shared__ int chosen[TM_CUDA_FETCH_AHEAD_MAX];
    const int e = threadIdx.x;
    float sum = 0.0f;
    bool seen = false, used = false; /* expert e cold in some item; slot e in some item */
    for (int64_t i0 = 0; i0 < n_items; i0 += TM_FETCH_ITEMS_SHARED) {
        const int64_t n =
            n_items - i0 < TM_FETCH_ITEMS_SHARED ? n_items - i0 : TM_FETCH_ITEMS_SHARED;
        __syncthreads();
        if (e < n) stage[e] = items[i0 + e];
        __syncthreads();
        for (int64_t j = 0; j < n; j++) {
            if (stage[j].slot < 0 && stage[j].expert == e) sum += stage[j].weight, seen = true;
            used |= stage[j].slot == e;
        }
    }
    /* the experts, by their summed weight */
    float v = seen && e < n_expert ? sum : -INFINITY;
    int n_chosen = 0;
    for (int r = 0; r < n_slots; r++) {
        const int w = tm_fetch_block_best(v, e, best_v, best_i, &winner);
        if (w < 0) break;
        if (e == 0) chosen[r] = w;
        if (w == e) v = -INFINITY;
        n_chosen++;
    }
    __syncthreads();
    if (!cached) {
        int my_slot = -1;
        for (int r = 0; r < n_chosen; r++)
            if (chosen[r] == e) my_slot = r;
        if (e < n_expert) map[e] = my_slot;
        if (e < n_slots)
            list[2 * e] = e < n_chosen ? chosen[e] : -1, list[2 * e + 1] = e < n_chosen ? e : -1;
        return;
    }
    /* the slots: those the items use are this step's; the others by age (empty
       ones first), the oldest taking the first expert */
    const uint32_t now = *c.seq;
    float age = -INFINITY;
    if (e < c.n_slots) {
        if (used)
            c.last_use[e] = now;
        else
            age = c.expert_in[e] < 0 ? INFINITY : (float)(now - c.last_use[e]);
    }
    for (int r = 0; r < n_slots; r++) {
        const int w = r < n_chosen ? tm_fetch_block_best(age, e, best_v, best_i, &winner) : -1;
        if (w < 0) {
            if (e == 0) list[2 * r] = -1, list[2 * r + 1] = -1;
        } else if (w == e) { /* slot e takes chosen expert r */
            const int32_t old = c.expert_in[e], ex = chosen[r];
            if (old >= 0) c.slot_map[old] = -1;
            c.slot_map[ex] = e, c.expert_in[e] = ex, c.last_use[e] = now;
            list[2 * r] = ex, list[2 * r + 1] = e;
            age = -INFINITY;
        }
    }
}

typedef struct tm_fetch_copy_args {
    const uint8_t *src[3];
    uint8_t *dst[3];
    size_t src_stride[3], dst_stride[3];
    int64_t n16[3]; /* 16-byte words of one expert's slice */
} tm_fetch_copy_args;

__global__ void __launch_bounds__(TM_FETCH_COPY_THREADS)
    tm_fetch_copy_kernel(tm_fetch_copy_args a, const int32_t *__restrict__ list) {
    const int e = list[2 * blockIdx.y], slot = list[2 * blockIdx.y + 1];
    if (e < 0 || slot < 0) return;
    const int64_t step = (int64_t)gridDim.x * TM_FETCH_COPY_THREADS;
    for (int m = 0; m < 3; m++) {
        const uint4 *s = (const uint4 *)(a.src[m] + (size_t)e * a.src_stride[m]);
        uint4 *d = (uint4 *)(a.dst[m] + (size_t)slot * a.dst_stride[m]);
        const int64_t n = a.n16[m];
        for (int64_t i = (int64_t)blockIdx.x * TM_FETCH_COPY_THREADS + threadIdx.x; i < n;
             i += step * TM_FETCH_COPY_UNROLL) {
            uint4 r[TM_FETCH_COPY_UNROLL];
#pragma unroll
            for (int u = 0; u < TM_FETCH_COPY_UNROLL; u++)
                if (i + u * step < n) r[u] = s[i + u * step];
#pragma unroll
            for (int u = 0; u < TM_FETCH_COPY_UNROLL; u++)
                if (i + u * step < n) d[i + u * step] = r[u];
        }
    }
}

extern "C" tm_status cuda_moe_fetch_ahead(const tm_cuda_moe_params *src,
                                          const tm_cuda_moe_params *dst,
                                          const tm_cuda_moe_item *items, int64_t n_items,
                                          int32_t n_expert, int32_t n_slots, int32_t *map,
                                          int32_t *list, const tm_cuda_fetch_cache *cache,
                                          tm_cuda_stream stream) {
    tm_status st =
        cuda_moe_fetch_ahead_args_check(src, dst, n_items, n_expert, n_slots, map, list, cache);
    if (st != TM_OK) return st;
    const tm_cuda_fetch_cache c = cache ? *cache : tm_cuda_fetch_cache{};
    const tm_cuda_moe_matrix *s[3] = {&src->gate, &src->up, &src->down};
    const tm_cuda_moe_matrix *d[3] = {&dst->gate, &dst->up, &dst->down};
    const int64_t rows[3] = {src->n_ff, src->n_ff, src->n_embd};
    tm_fetch_copy_args a;
    for (int m = 0; m < 3; m++) {
        a.src[m] = (const uint8_t *)s[m]->data, a.dst[m] = (uint8_t *)d[m]->data;
        a.src_stride[m] = s[m]->expert_stride, a.dst_stride[m] = d[m]->expert_stride;
        a.n16[m] = (int64_t)((size_t)rows[m] * s[m]->row_bytes / 16);
    }
    tm_fetch_select_kernel<<<1, TM_FETCH_SELECT_THREADS, 0, stream>>>(
        items, n_items, n_expert, n_slots, map, list, c, cache != NULL);
    st = tm_cuda_launch_check("cuda_moe_fetch_ahead (choice)", n_items, n_expert, n_slots);
    if (st != TM_OK) return st;
    tm_fetch_copy_kernel<<<dim3(TM_FETCH_COPY_BLOCKS, (unsigned)n_slots), TM_FETCH_COPY_THREADS, 0,
                           stream>>>(a, list);
    return tm_cuda_launch_check("cuda_moe_fetch_ahead (copy)", n_items, n_expert, n_slots);
}
