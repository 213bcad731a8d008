/* Grouped expert products over a work list (the role of ggml's mul_mat_id):
 * for each item (slot e, token t, weight w)
 *   h[item] = silu(gate_e · x[t]) ⊙ (up_e · x[t])          kernel 1
 *   y[t]   += w · (down_e · h[item])                         kernel 2
 * Two launches for all experts of a layer, whatever the number of items.
 * An extension (gpt-oss: biases, the clamped SwiGLU) changes only the
 * epilogues: moe_ext.cuh.
 *
 * Kernel 1 gives one warp a (item, n_ff row) pair and computes the gate and
 * up dots together (fused SwiGLU: the gate/up outputs never reach memory).
 * Kernel 2 gives one warp an (item, n_embd row) pair and scatter-adds with
 * atomicAdd, since several items (the k experts of a token) hit one row of y.
 *
 * Fast path (mmvq_fast.cuh), taken per kernel when the matrices' type has
 * one and their rows and expert starts are aligned (gate and up also of one
 * type): a gate/up warp computes gate rows r, r+1 and up rows r, r+1 against
 * one load of x (R = 4 rows), a down warp 4 consecutive rows against h; the
 * type is a template parameter chosen once per launch, and so is Q8X: q4_K or
 * low-bit experts with 8-bit activations (tm_cuda_moe_params.q8x), the same
 * row groups over x or h quantized per 32 values, with the integer dots of
 * mmvq_q8x.cuh and mmvq_lbx.cuh; chosen per kernel (cuda_moe_q8x_gate_up,
 * cuda_moe_q8x_down: gate/up on gate's type, down on down's). The generic kernels
 * (one warp per row, per-type code of mmvq.cuh) take the rest.
 *
 * Shapes: this first version is written for decode (1 token x 8 experts: 8
 * items). Prompts use the same kernels: each item re-reads its expert's rows
 * (from L2 when the tokens of an expert are adjacent in the list), which is
 * correct but not the fast prompt path (that is a tiled/tensor-core kernel
 * over expert-major groups, to come). */
#include "cuda/mmvq_lbx.cuh"
#include "cuda/moe_ext.cuh"

/* TM_MOE_WARPS: cuda_args.h (the grid bound checks it) */
/* Blocks a multiprocessor must hold of the fast kernels (registers capped to
 * fit: 96 instead of ~125, no spills): 5 instead of the 4 the registers
 * allowed, for more warps in flight against DRAM latency (Nsight Compute: 20%
 * achieved occupancy, DRAM 27% busy). H100, 30b-a3b -ngl all tg128: 1 (no
 * cap) 289.8 / 291.1, 5: 294.1 / 296.3, 6: 286.7 / 287.3 (80 registers,
 * spills), 8: 259.0 (64, more spills). -DTM_MOE_FAST_MIN_BLOCKS=N to try. */
#ifndef TM_MOE_FAST_MIN_BLOCKS
#define TM_MOE_FAST_MIN_BLOCKS 5
#endif

static __device__ __forceinline__ bool tm_moe_item_ok(const tm_cuda_moe_item &it,
                                                      const tm_cuda_moe_params &p, int64_t n_tok) {
    return tm_moe_item_valid(it, p.n_slots, n_tok, p.ext);
}

__global__ void __launch_bounds__(TM_MOE_WARPS *TM_CUDA_WARP)
    tm_moe_gate_up_kernel(tm_cuda_moe_params p, bool gate_vec16, bool up_vec16,
                          const tm_cuda_moe_item *__restrict__ items, const float *__restrict__ x,
                          int64_t n_tok, float *__restrict__ h) {
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1);
    const int64_t item = blockIdx.x;
    const int64_t r = (int64_t)blockIdx.y * TM_MOE_WARPS + (threadIdx.x >> 5);
    if (r >= p.n_ff) return;
    const tm_cuda_moe_item it = items[item];
    float *hr = h + item * p.n_ff + r;
    if (!tm_moe_item_ok(it, p, n_tok)) {
        if (lane == 0) *hr = 0.0f; /* defined contents for the down kernel, which skips it anyway */
        return;
    }
    const float *xt = x + (int64_t)it.token * p.n_embd;
    const uint8_t *g = (const uint8_t *)p.gate.data + (size_t)it.slot * p.gate.expert_stride +
                       r * p.gate.row_bytes;
    const uint8_t *u =
        (const uint8_t *)p.up.data + (size_t)it.slot * p.up.expert_stride + r * p.up.row_bytes;
    float ag[TM_CUDA_MMVQ_MAX_TOK], au[TM_CUDA_MMVQ_MAX_TOK];
#pragma unroll
    for (int t = 0; t < TM_CUDA_MMVQ_MAX_TOK; t++) ag[t] = au[t] = 0.0f;
    tm_mmvq_row_partial(p.gate.type, g, p.n_embd, gate_vec16, xt, p.n_embd, 1, lane, ag);
    tm_mmvq_row_partial(p.up.type, u, p.n_embd, up_vec16, xt, p.n_embd, 1, lane, au);
    const float gs = tm_warp_sum(ag[0]), us = tm_warp_sum(au[0]);
    if (lane == 0) *hr = tm_moe_ext_h(p.ext, it.expert, r, p.n_ff, gs, us);
}

__global__ void __launch_bounds__(TM_MOE_WARPS *TM_CUDA_WARP)
    tm_moe_down_kernel(tm_cuda_moe_params p, bool down_vec16,
                       const tm_cuda_moe_item *__restrict__ items, const float *__restrict__ h,
                       int64_t n_tok, float *__restrict__ y) {
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1);
    const int64_t item = blockIdx.x;
    const int64_t r = (int64_t)blockIdx.y * TM_MOE_WARPS + (threadIdx.x >> 5);
    if (r >= p.n_embd) return;
    const tm_cuda_moe_item it = items[item];
    if (!tm_moe_item_ok(it, p, n_tok)) return;
    const uint8_t *d = (const uint8_t *)p.down.data + (size_t)it.slot * p.down.expert_stride +
                       r * p.down.row_bytes;
    float acc[TM_CUDA_MMVQ_MAX_TOK];
#pragma unroll
    for (int t = 0; t < TM_CUDA_MMVQ_MAX_TOK; t++) acc[t] = 0.0f;
    tm_mmvq_row_partial(p.down.type, d, p.n_ff, down_vec16, h + item * p.n_ff, p.n_ff, 1, lane,
                        acc);
    const float s = tm_warp_sum(acc[0]) + tm_moe_ext_down(p.ext, it.expert, r, p.n_embd);
    if (lane == 0) atomicAdd(y + (int64_t)it.token * p.n_embd + r, it.weight * s);
}

/* ---- fast path ---- */

/* A fast kernel's input rows (row i of k values): f32 at x + i k, or with Q8X
 * (8-bit activations) cuda_q8x_quantize's values at q + i k and scales at
 * d + i k/32. */
struct tm_moe_in {
    const float *x;
    const int8_t *q;
    const float *d;
};

/* This lane's share of rows rp[0..R) · input row `row` (k values). */
template <int TYPE, bool Q8X, int R>
static __device__ __forceinline__ void tm_moe_rows(float (&acc)[R][1], const uint8_t *const *rp,
                                                   tm_moe_in in, int64_t row, int64_t k, int lane) {
    if constexpr (Q8X) {
        const tm_q8x_view v = {in.q + row * k, in.d + row * (k / 32), k};
        tm_q8x_type_rows<TYPE, 1, R>(acc, rp, v, 1, lane, 0, 1);
    } else {
        tm_fast_rows<TYPE, 1, R>(acc, rp, k, in.x + row * k, k, 1, lane, 0, 1);
    }
}

template <int TYPE, bool Q8X>
__global__ void __launch_bounds__(TM_FAST_WARPS *TM_CUDA_WARP, TM_MOE_FAST_MIN_BLOCKS)
    tm_moe_gate_up_fast_kernel(tm_cuda_moe_params p, const tm_cuda_moe_item *__restrict__ items,
                               tm_moe_in x, int64_t n_tok, float *__restrict__ h) {
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1);
    const int64_t item = blockIdx.x;
    const int64_t r0 = ((int64_t)blockIdx.y * TM_FAST_WARPS + (threadIdx.x >> 5)) * TM_MOE_FAST_FF;
    if (r0 >= p.n_ff) return; /* whole warp: no block-wide barrier below */
    const tm_cuda_moe_item it = items[item];
    float *hr = h + item * p.n_ff;
    if (!tm_moe_item_ok(it, p, n_tok)) {
        if (lane < TM_MOE_FAST_FF && r0 + lane < p.n_ff) hr[r0 + lane] = 0.0f;
        return;
    }
    const uint8_t *g = (const uint8_t *)p.gate.data + (size_t)it.slot * p.gate.expert_stride;
    const uint8_t *u = (const uint8_t *)p.up.data + (size_t)it.slot * p.up.expert_stride;
    const uint8_t *rp[2 * TM_MOE_FAST_FF];
#pragma unroll
    for (int i = 0; i < TM_MOE_FAST_FF; i++) { /* rows past n_ff read the last row, unused */
        const int64_t r = r0 + i < p.n_ff ? r0 + i : p.n_ff - 1;
        rp[i] = g + r * p.gate.row_bytes;
        rp[TM_MOE_FAST_FF + i] = u + r * p.up.row_bytes;
    }
    float acc[2 * TM_MOE_FAST_FF][1];
#pragma unroll
    for (int i = 0; i < 2 * TM_MOE_FAST_FF; i++) acc[i][0] = 0.0f;
    tm_moe_rows<TYPE, Q8X, 2 * TM_MOE_FAST_FF>(acc, rp, x, it.token, p.n_embd, lane);
#pragma unroll
    for (int i = 0; i < TM_MOE_FAST_FF; i++) {
        const float gs = tm_warp_sum(acc[i][0]), us = tm_warp_sum(acc[TM_MOE_FAST_FF + i][0]);
        if (lane == 0 && r0 + i < p.n_ff)
            hr[r0 + i] = tm_moe_ext_h(p.ext, it.expert, r0 + i, p.n_ff, gs, us);
    }
}

template <int TYPE, bool Q8X>
__global__ void __launch_bounds__(TM_FAST_WARPS *TM_CUDA_WARP, TM_MOE_FAST_MIN_BLOCKS)
    tm_moe_down_fast_kernel(tm_cuda_moe_params p, const tm_cuda_moe_item *__restrict__ items,
                            tm_moe_in h, int64_t n_tok, float *__restrict__ y) {
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1);
    const int64_t item = blockIdx.x;
    const int64_t r0 = ((int64_t)blockIdx.y * TM_FAST_WARPS + (threadIdx.x >> 5)) * TM_MOE_FAST_E;
    if (r0 >= p.n_embd) return;
    const tm_cuda_moe_item it = items[item];
    if (!tm_moe_item_ok(it, p, n_tok)) return;
    const uint8_t *d = (const uint8_t *)p.down.data + (size_t)it.slot * p.down.expert_stride;
    const uint8_t *rp[TM_MOE_FAST_E];
#pragma unroll
    for (int i = 0; i < TM_MOE_FAST_E; i++)
        rp[i] = d + (r0 + i < p.n_embd ? r0 + i : p.n_embd - 1) * p.down.row_bytes;
    float acc[TM_MOE_FAST_E][1];
#pragma unroll
    for (int i = 0; i < TM_MOE_FAST_E; i++) acc[i][0] = 0.0f;
    tm_moe_rows<TYPE, Q8X, TM_MOE_FAST_E>(acc, rp, h, item, p.n_ff, lane);
    float *yt = y + (int64_t)it.token * p.n_embd;
#pragma unroll
    for (int i = 0; i < TM_MOE_FAST_E; i++) {
        const float s = tm_warp_sum(acc[i][0]);
        if (lane == 0 && r0 + i < p.n_embd)
            atomicAdd(yt + r0 + i,
                      it.weight * (s + tm_moe_ext_down(p.ext, it.expert, r0 + i, p.n_embd)));
    }
}

/* Launch kernel K<type> for a fast-path type (the caller checked tm_fast_ok). */
#define TM_MOE_FAST_SWITCH(type, K, grid, block, stream, ...)                                      \
    switch (type) {                                                                                \
    case TM_TYPE_Q4_K:                                                                             \
        K<TM_TYPE_Q4_K, false><<<grid, block, 0, stream>>>(__VA_ARGS__);                           \
        break;                                                                                     \
    case TM_TYPE_Q8_0:                                                                             \
        K<TM_TYPE_Q8_0, false><<<grid, block, 0, stream>>>(__VA_ARGS__);                           \
        break;                                                                                     \
    case TM_TYPE_MXFP4:                                                                            \
        K<TM_TYPE_MXFP4, false><<<grid, block, 0, stream>>>(__VA_ARGS__);                          \
        break;                                                                                     \
    case TM_TYPE_F32:                                                                              \
        K<TM_TYPE_F32, false><<<grid, block, 0, stream>>>(__VA_ARGS__);                            \
        break;                                                                                     \
    case TM_TYPE_F16:                                                                              \
        K<TM_TYPE_F16, false><<<grid, block, 0, stream>>>(__VA_ARGS__);                            \
        break;                                                                                     \
    default:                                                                                       \
        K<TM_TYPE_BF16, false><<<grid, block, 0, stream>>>(__VA_ARGS__);                           \
        break;                                                                                     \
    }

/* Launch the gate/up (down: the down) fast kernel with 8-bit activations for experts
 * of type `type` (q4_K or TM_CUDA_LBX_TYPES; the caller checked cuda_moe_q8x_*). */
template <int TYPE>
static void tm_moe_q8x_kernel(bool down, dim3 grid, dim3 block, cudaStream_t s,
                              const tm_cuda_moe_params &p, const tm_cuda_moe_item *items,
                              tm_moe_in in, int64_t n_tok, float *out) {
    if (down)
        tm_moe_down_fast_kernel<TYPE, true><<<grid, block, 0, s>>>(p, items, in, n_tok, out);
    else
        tm_moe_gate_up_fast_kernel<TYPE, true><<<grid, block, 0, s>>>(p, items, in, n_tok, out);
}
static tm_status tm_moe_q8x_launch(tm_type type, bool down, dim3 grid, dim3 block, cudaStream_t s,
                                   const tm_cuda_moe_params &p, const tm_cuda_moe_item *items,
                                   tm_moe_in in, int64_t n_tok, float *out) {
    switch (type) {
    case TM_TYPE_Q4_K:
        tm_moe_q8x_kernel<TM_TYPE_Q4_K>(down, grid, block, s, p, items, in, n_tok, out);
        return TM_OK;
#define TM_MOE_LBX_CASE(T)                                                                         \
    case T:                                                                                        \
        tm_moe_q8x_kernel<T>(down, grid, block, s, p, items, in, n_tok, out);                      \
        return TM_OK;
        TM_CUDA_LBX_TYPES(TM_MOE_LBX_CASE)
#undef TM_MOE_LBX_CASE
    default:
        return tm_error_set(TM_ERR_UNSUPPORTED, "cuda_moe_grouped: no 8-bit path for %s experts",
                            quant_type_name(type));
    }
}

extern "C" tm_status cuda_moe_grouped(const tm_cuda_moe_params *p, const tm_cuda_moe_item *items,
                                      int64_t n_items, const float *x, int64_t n_tok, float *y,
                                      float *h_scratch, tm_cuda_stream stream) {
    tm_status st = cuda_moe_grouped_args_check(p, n_items, x, n_tok, h_scratch);
    if (st != TM_OK || n_items == 0) return st;
    /* 16-byte weight loads need every expert's start aligned too */
    const bool gv = tm_mmvq_vec16(p->gate.data, p->gate.row_bytes | p->gate.expert_stride),
               uv = tm_mmvq_vec16(p->up.data, p->up.row_bytes | p->up.expert_stride),
               dv = tm_mmvq_vec16(p->down.data, p->down.row_bytes | p->down.expert_stride);
    const dim3 block(TM_MOE_WARPS * TM_CUDA_WARP), fblock(TM_FAST_WARPS * TM_CUDA_WARP);
    /* the fast kernels' grids: an item and a group of rows a block */
    const dim3 fg1((unsigned)n_items, (unsigned)tm_cdiv(p->n_ff, TM_FAST_WARPS * TM_MOE_FAST_FF)),
        fg2((unsigned)n_items, (unsigned)tm_cdiv(p->n_embd, TM_FAST_WARPS * TM_MOE_FAST_E));
    const bool qgu = cuda_moe_q8x_gate_up(p, n_items, n_tok),
               qd = cuda_moe_q8x_down(p, n_items, n_tok);
    const tm_cuda_moe_q8x_scratch q = cuda_moe_q8x_scratch(p, n_items, n_tok, h_scratch);
    if (qgu) { /* x quantized into the scratch, past h */
        if ((st = tm_q8x_quantize_n(x, n_tok * p->n_embd, q.xq, q.xd, stream)) != TM_OK) return st;
        st = tm_moe_q8x_launch(p->gate.type, false, fg1, fblock, stream, *p, items,
                               tm_moe_in{NULL, q.xq, q.xd}, n_tok, h_scratch);
    } else if (tm_moe_fast_gate_up(p)) {
        TM_MOE_FAST_SWITCH(p->gate.type, tm_moe_gate_up_fast_kernel, fg1, fblock, stream, *p, items,
                           tm_moe_in{x, NULL, NULL}, n_tok, h_scratch);
    } else {
        const dim3 g1((unsigned)n_items, (unsigned)((p->n_ff + TM_MOE_WARPS - 1) / TM_MOE_WARPS));
        tm_moe_gate_up_kernel<<<g1, block, 0, stream>>>(*p, gv, uv, items, x, n_tok, h_scratch);
    }
    if (st != TM_OK || (st = tm_cuda_launch_check("cuda_moe_grouped gate/up", n_items, p->n_ff,
                                                  p->n_embd)) != TM_OK)
        return st;
    if (qd) { /* the items' h quantized after them */
        if ((st = tm_q8x_quantize_n(h_scratch, n_items * p->n_ff, q.hq, q.hd, stream)) != TM_OK ||
            (st = tm_moe_q8x_launch(p->down.type, true, fg2, fblock, stream, *p, items,
                                    tm_moe_in{NULL, q.hq, q.hd}, n_tok, y)) != TM_OK)
            return st;
    } else if (tm_moe_fast_matrix(&p->down, p->n_ff)) {
        TM_MOE_FAST_SWITCH(p->down.type, tm_moe_down_fast_kernel, fg2, fblock, stream, *p, items,
                           tm_moe_in{h_scratch, NULL, NULL}, n_tok, y);
    } else {
        const dim3 g2((unsigned)n_items, (unsigned)((p->n_embd + TM_MOE_WARPS - 1) / TM_MOE_WARPS));
        tm_moe_down_kernel<<<g2, block, 0, stream>>>(*p, dv, items, h_scratch, n_tok, y);
    }
    return tm_cuda_launch_check("cuda_moe_grouped down", n_items, p->n_embd, p->n_ff);
}
