/* The CUDA backend's C API: device, memory pool, staging/upload, and the op
 * launchers (one op per src/cuda/<op>.cu/.cuh pair; kernels know nothing of
 * models).
 *
 * Compiled only when nvcc is found (TM_HAVE_CUDA=1 for the C library). This
 * header includes no CUDA header so plain C files (tests, the model) can use
 * it: tm_cuda_stream is the same type as cudaStream_t (struct CUstream_st *).
 *
 * Conventions for every launcher:
 *   - pointers are device pointers unless the name says host;
 *   - work is queued on the given stream, nothing synchronises;
 *   - the launch is checked (cudaGetLastError), a failure returns
 *     TM_ERR_DEVICE with the op, the shape and CUDA's message;
 *   - shapes are checked before launching (TM_ERR_ARG), so a kernel never
 *     reads past what the caller described.
 * Layouts are row-major: x [n_tok][k], y [n_tok][rows], as in the CPU ops. */
#ifndef TM_CUDA_CUDA_H
#define TM_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *tm_cuda_stream;

/* ---- device (cuda_device.cu) ---- */

typedef struct tm_cuda_device tm_cuda_device;

typedef struct tm_cuda_device_info {
    char name[256];
    int index, cc_major, cc_minor, sm_count;
    int driver_version, runtime_version; /* 13000 = 13.0 */
    size_t l2_bytes, total_bytes;
} tm_cuda_device_info;

/* Open GPU `index`: checks a driver is present and new enough for this
 * runtime, a device exists, and its compute capability is >= 8.0; creates the
 * compute stream and the upload stream. No GPU / no driver / old driver give
 * TM_ERR_DEVICE with a message saying which. */
tm_status cuda_device_open(int index, tm_cuda_device **out);
void cuda_device_close(tm_cuda_device *dev);
/* Number of usable devices; 0 (and TM_OK) when there is no driver or no GPU,
 * so callers can choose a CPU fallback without treating it as an error. */
tm_status cuda_device_count(int *out);
const tm_cuda_device_info *cuda_device_info(const tm_cuda_device *dev);
tm_status cuda_device_memory(tm_cuda_device *dev, size_t *free_bytes, size_t *total_bytes);
tm_cuda_stream cuda_device_stream(const tm_cuda_device *dev);
/* Make dev the calling host thread's current device (cudaSetDevice; CUDA keeps one a
 * thread, device 0 until set): allocations (cuda_pool_create, cuda_stream_create) go to
 * the current device and a kernel launch on another device's stream fails. cuda_device_open
 * selects the device it opens on the opening thread; a thread that launches on a device
 * other than 0 selects it first (the executor at each step). */
tm_status cuda_device_select(tm_cuda_device *dev);
/* Let dev's kernels read peer's memory (cudaDeviceEnablePeerAccess; leaves dev
 * current): *on false where the pair has no peer access, which is no error. */
tm_status cuda_device_peer_enable(tm_cuda_device *dev, tm_cuda_device *peer, bool *on);
tm_status cuda_device_sync(tm_cuda_device *dev);

/* ---- device memory pool: one cudaMalloc, a bump allocator ---- */

typedef struct tm_cuda_pool tm_cuda_pool;

/* Fails with TM_ERR_DEVICE naming the bytes needed and free. */
tm_status cuda_pool_create(tm_cuda_device *dev, size_t bytes, tm_cuda_pool **out);
/* align: a power of two (0 means 256). Fails with TM_ERR_DEVICE when the pool is full. */
tm_status cuda_pool_alloc(tm_cuda_pool *pool, size_t bytes, size_t align, void **out);
void cuda_pool_reset(tm_cuda_pool *pool); /* every allocation is gone */
size_t cuda_pool_used(const tm_cuda_pool *pool);
size_t cuda_pool_size(const tm_cuda_pool *pool);
void cuda_pool_free(tm_cuda_pool *pool);

/* ---- host memory and copies ---- */

tm_status cuda_host_alloc(size_t bytes, void **out); /* pinned (page-locked) */
/* Pinned host memory the device also reads and writes, at *dev in its address
 * space (the same address as *host where the platform has unified addressing).
 * Freed with cuda_host_free(host). */
tm_status cuda_host_alloc_mapped(size_t bytes, void **host, void **dev);
void cuda_host_free(void *p);
/* Page-lock memory the host already has (a read-only file mapping, say) and
 * map it for kernels, which then read it in place over PCIe: *dev is its
 * address on the device. Registered spans may not overlap. Undone by
 * cuda_host_unregister(p). */
tm_status cuda_host_register(void *p, size_t bytes, bool read_only, void **dev);
void cuda_host_unregister(void *p);
/* Synchronous copies and fill on the compute stream (tests, small setup). */
tm_status cuda_copy_to_device(tm_cuda_device *dev, void *dst, const void *host_src, size_t bytes);
tm_status cuda_copy_to_host(tm_cuda_device *dev, void *host_dst, const void *src, size_t bytes);
tm_status cuda_fill_bytes(tm_cuda_device *dev, void *dst, int byte, size_t bytes);
/* Device-to-device copy queued on the compute stream (no sync): the bandwidth ceiling probe. */
tm_status cuda_copy_device(tm_cuda_device *dev, void *dst, const void *src, size_t bytes);

/* Copy `bytes` of host memory (e.g. the mmap'd model file: pageable) to
 * device memory through the device's two pinned staging buffers: the CPU
 * fills one while the DMA engine drains the other. Returns when the copy is
 * complete; *bytes_per_s (may be NULL) gets the achieved rate. */
tm_status cuda_upload(tm_cuda_device *dev, void *dst, const void *host_src, size_t bytes,
                      double *bytes_per_s);

/* ---- timing (CUDA events on the compute stream) ---- */

typedef struct tm_cuda_timer tm_cuda_timer;
tm_status cuda_timer_create(tm_cuda_device *dev, tm_cuda_timer **out);
tm_status cuda_timer_start(tm_cuda_timer *t);
tm_status cuda_timer_stop(tm_cuda_timer *t, float *ms); /* waits for the stop event */
void cuda_timer_free(tm_cuda_timer *t);

/* ---- asynchronous copies, graphs and events (per-token use) ---- */

/* Queued on `stream`: any direction (pinned host memory for real overlap). */
tm_status cuda_copy_async(void *dst, const void *src, size_t bytes, tm_cuda_stream stream);
/* Copy device memory of src_dev to device memory of dst_dev, queued on stream
 * (no sync): the activations that cross from one GPU's span of layers to the
 * next. With peer access on (cuda_device_peer_enable(dst_dev, src_dev)): a
 * kernel of dst_dev reading src over NVLink or PCIe, on a stream of dst_dev
 * with dst_dev current, which a graph can capture; else cudaMemcpyPeerAsync
 * (through the host without peer access), which a capture refuses. */
tm_status cuda_copy_peer_async(tm_cuda_device *dst_dev, void *dst, tm_cuda_device *src_dev,
                               const void *src, size_t bytes, tm_cuda_stream stream);
tm_status cuda_fill_async(void *dst, int byte, size_t bytes, tm_cuda_stream stream);
tm_status cuda_stream_sync(tm_cuda_stream stream);
/* Without waiting: *idle = every queued operation has finished. A failed
 * operation (a kernel fault) is reported as TM_ERR_DEVICE. */
tm_status cuda_stream_query(tm_cuda_stream stream, bool *idle);
/* A stream of its own (the fetch lane copies on one beside the compute
 * stream); free it only once nothing queued on it is still needed. */
tm_status cuda_stream_create(tm_cuda_stream *out);
void cuda_stream_free(tm_cuda_stream stream);

/* A captured sequence of launches on one stream, replayed with one call (the
 * decode step: hundreds of small kernels cost one launch). Arguments are
 * frozen at capture: anything that changes per token must be read from
 * device memory by the kernels. */
typedef struct tm_cuda_graph tm_cuda_graph;
tm_status cuda_graph_begin(tm_cuda_stream stream);
/* keep false: end a capture abandoned after an error (*out stays NULL). */
tm_status cuda_graph_end(tm_cuda_stream stream, bool keep, tm_cuda_graph **out);
tm_status cuda_graph_launch(tm_cuda_graph *g, tm_cuda_stream stream);
void cuda_graph_free(tm_cuda_graph *g);

typedef struct CUevent_st *tm_cuda_event; /* = cudaEvent_t */
tm_status cuda_event_create(tm_cuda_event *out);
void cuda_event_free(tm_cuda_event e);
tm_status cuda_event_record(tm_cuda_event e, tm_cuda_stream stream);
/* Waits for b, then the milliseconds between a and b. */
tm_status cuda_event_elapsed(tm_cuda_event a, tm_cuda_event b, float *ms);
/* Work queued on `stream` after this call waits until e's latest record (as
 * queued when this is called; none: no wait) has run. Nothing blocks the host. */
tm_status cuda_stream_wait_event(tm_cuda_stream stream, tm_cuda_event e);
/* Without waiting: *done = e's latest record has run (or it has none). */
tm_status cuda_event_query(tm_cuda_event e, bool *done);

/* ---- ops ---- */

/* mmvq.cu: y[t][r] = Σ_i W[r][i] · x[t][i] for decode batches.
 * W: rows of `type` (q4_K q5_K q6_K q8_0 q4_0 mxfp4 f16 bf16 f32), row r at
 * w + r*row_bytes; k a multiple of the type's block size; 1 <= n_tok <= 8.
 * x must be 16-byte aligned. Activations stay f32 (no requantisation), so
 * the result is the float32 dot of the exactly dequantized weights. */
#define TM_CUDA_MMVQ_MAX_TOK 8
tm_status cuda_mmvq(tm_type type, const void *w, size_t row_bytes, int64_t rows, int64_t k,
                    const float *x, int64_t n_tok, float *y, tm_cuda_stream stream);

/* mmvq_q8x.cu: the same product for q8_0 weights with 8-bit activations
 * (integer dot products; the decode path of the normal, not precise, mode).
 * cuda_q8x_quantize writes x[t] (n_tok rows of k, k a multiple of 32) to xq as
 * [n_tok][k] int8 then [n_tok][k/32] float scales (cuda_q8x_bytes; xq 16-byte
 * aligned): per 32 values d = max|x| / 127.0f, id = d ? 1.0f / d : 0,
 * q = x * id rounded to nearest even, all in float (the host mock and the
 * tests redo it bit for bit). cuda_mmvq_q8x then gives y[t][r] = Σ_b d_w d_x
 * Σ_i w_i q_i over the blocks b of row r; it needs cuda_mmvq_q8x_ok(type,
 * address | row stride, k), which the executor asks. It also takes q4_K rows
 * (16-byte aligned, k a multiple of 256: each q8x block is one of its
 * sub-blocks, Σ (d sc q - dmin m) x = d_x (d sc Σ q x_q - dmin m Σ x_q)), for
 * the executor's dense q4_K products and the grouped experts' 8-bit path, and
 * rows of the low-bit types of TM_CUDA_LBX_TYPES (mmvq_lbx.cu: per 32 values,
 * d_x (d_0 Σ q x_q - m_0 Σ x_q + the same for the second 16) with the
 * dequantizer's scales d_h and offsets m_h, lbx_unit.cuh). */
static inline size_t cuda_q8x_bytes(int64_t k, int64_t n_tok) {
    return k > 0 && n_tok > 0 ? (size_t)(n_tok * k) + (size_t)(n_tok * (k / 32)) * sizeof(float)
                              : 0;
}
/* The low-bit types with an 8-bit path too (an unpacker each, src/cuda/lbx_unit*.cuh;
 * adding a type: its unpacker and a line here). Their rows need whole blocks and the
 * alignment their blocks allow: 4 bytes where the block size is a multiple of 4 (the
 * unpackers read those blocks with plain aligned words), else 2. */
#define TM_CUDA_LBX_TYPES(X)                                                                       \
    X(TM_TYPE_Q2_K)                                                                                \
    X(TM_TYPE_Q3_K)                                                                                \
    X(TM_TYPE_IQ4_XS)                                                                              \
    X(TM_TYPE_Q4_1)                                                                                \
    X(TM_TYPE_Q5_0)                                                                                \
    X(TM_TYPE_Q5_1)                                                                                \
    X(TM_TYPE_IQ4_NL)                                                                              \
    X(TM_TYPE_TQ1_0)                                                                               \
    X(TM_TYPE_TQ2_0)                                                                               \
    X(TM_TYPE_IQ2_XXS)                                                                             \
    X(TM_TYPE_IQ2_XS)                                                                              \
    X(TM_TYPE_IQ2_S)                                                                               \
    X(TM_TYPE_IQ3_XXS)                                                                             \
    X(TM_TYPE_IQ3_S)                                                                               \
    X(TM_TYPE_IQ1_S)                                                                               \
    X(TM_TYPE_IQ1_M)
static inline bool cuda_lbx_type(tm_type type) {
    switch (type) {
#define TM_CUDA_LBX_CASE(T) case T:
        TM_CUDA_LBX_TYPES(TM_CUDA_LBX_CASE)
#undef TM_CUDA_LBX_CASE
        return true;
    default:
        return false;
    }
}
static inline bool cuda_mmvq_q8x_ok(tm_type type, uintptr_t align, int64_t k) {
    if (type == TM_TYPE_Q4_K) return (align & 15) == 0 && k > 0 && k % 256 == 0;
    if (cuda_lbx_type(type)) {
        const tm_type_traits *tr = quant_type_traits((uint32_t)type);
        return (align & (tr->type_size % 4 == 0 ? 3 : 1)) == 0 && k > 0 && k % tr->block_size == 0;
    }
    return type == TM_TYPE_Q8_0 && (align & 3) == 0 && k > 0 && k % 64 == 0;
}
tm_status cuda_q8x_quantize(const float *x, int64_t k, int64_t n_tok, void *xq,
                            tm_cuda_stream stream);
tm_status cuda_mmvq_q8x(tm_type type, const void *w, size_t row_bytes, int64_t rows, int64_t k,
                        const void *xq, int64_t n_tok, float *y, tm_cuda_stream stream);

/* moe_grouped.cu: y[tok] += weight · down_e(silu(gate_e · x[tok]) ⊙ up_e · x[tok])
 * for each work item (expert slot e, token, weight); items is a device array,
 * x and y are [n_tok][n_embd] (items with a token outside [0, n_tok) or a slot
 * outside [0, n_slots) are skipped, never read past). Expert e of a matrix is
 * at data + e*expert_stride, its rows row_bytes apart (as tm_moe_matrix).
 * Several items may target one token: y is updated with atomicAdd, so the
 * summation order (and the last bits) may vary between runs.
 * With an extension (tm_cuda_moe_ext, gpt-oss) the expert is instead
 *   g = gate_e x + gate_bias[id], u = up_e x + up_bias[id], h = act(g, u),
 *   y[tok] += weight · (down_e h + down_bias[id])
 * where id is the item's expert id (the slot says where the weights are, the
 * id which expert they are: a cache slot or a fetch buffer holds any expert).
 * h_scratch: device floats, at least cuda_moe_scratch_floats(). */
typedef struct tm_cuda_moe_matrix {
    const void *data;
    tm_type type;
    size_t expert_stride, row_bytes;
} tm_cuda_moe_matrix;

typedef struct tm_cuda_moe_item {
    int32_t slot;  /* expert index into the matrices */
    int32_t token; /* row of x and y */
    float weight;
    int32_t expert; /* the expert's id: row of the extension's biases */
} tm_cuda_moe_item;

/* The activation between the gate/up and down products. */
typedef enum tm_cuda_moe_act {
    TM_CUDA_MOE_SWIGLU = 0,     /* silu(g) u (= TM_MOE_ACT_SWIGLU) */
    TM_CUDA_MOE_SWIGLU_OAI = 1, /* gc = min(g, limit), uc = clamp(u, +-limit):
                                   gc sigmoid(alpha gc) (uc + 1) (= TM_MOE_ACT_SWIGLU_OAI) */
    TM_CUDA_MOE_GEGLU = 2,      /* gelu_tanh(g) u (= TM_MOE_ACT_GEGLU) */
} tm_cuda_moe_act;

/* What experts compute beyond the plain SwiGLU (zeroed: nothing). Biases are
 * device f32 arrays indexed by the item's expert id: gate and up [n_expert][n_ff],
 * down [n_expert][n_embd] (NULL: none). With any bias, items whose id is
 * outside [0, n_expert) are skipped like those with a bad slot. */
typedef struct tm_cuda_moe_ext {
    tm_cuda_moe_act act;
    float alpha, limit; /* TM_CUDA_MOE_SWIGLU_OAI's constants */
    const float *gate_bias, *up_bias, *down_bias;
    int32_t n_expert;
} tm_cuda_moe_ext;

typedef struct tm_cuda_moe_params {
    int64_t n_embd, n_ff;
    int32_t n_slots; /* expert slots addressable in the matrices; items outside are skipped */
    tm_cuda_moe_matrix gate, up; /* n_ff rows of n_embd */
    tm_cuda_moe_matrix down;     /* n_embd rows of n_ff */
    tm_cuda_moe_ext ext;         /* zeroed: silu(g) u, no biases */
    /* 8-bit activations (the normal mode's decode): when n_tok <= n_items, the
     * kernels whose matrices cuda_moe_q8x_gate_up / cuda_moe_q8x_down accept
     * (q4_K or low-bit experts that cuda_mmvq_q8x reads) take integer products
     * with x, or the items' h, quantized by cuda_q8x_quantize's rule; the other
     * kernel keeps f32. Ignored otherwise. */
    bool q8x;
    /* The weights stream in (a fetch ring's copies, or host memory read over PCIe):
     * cuda_moe_grouped_gemm keeps its fused path whatever the rows a group (H200,
     * 30b-a3b --cpu-moe pp4096 through the ring: fused 6,141, dequantize 5,269 t/s). */
    bool streamed;
} tm_cuda_moe_params;

/* cuda_moe_grouped's h_scratch for n_items items: h [n_items][n_ff] floats,
 * then with q8x (n_tok <= n_items) the 8-bit x and the 8-bit h, each in
 * cuda_q8x_quantize's layout (values, then scales) from a 16-byte boundary. */
typedef struct tm_cuda_moe_q8x_scratch {
    int8_t *xq, *hq; /* [n_tok][n_embd], [n_items][n_ff] */
    float *xd, *hd;  /* their scales, one per 32 values */
} tm_cuda_moe_q8x_scratch;
static inline size_t cuda_moe_scratch_part(int64_t k, int64_t rows) { /* 16-byte multiple */
    return (cuda_q8x_bytes(k, rows) + 15) & ~(size_t)15;
}
static inline int64_t cuda_moe_scratch_floats(const tm_cuda_moe_params *p, int64_t n_items) {
    const int64_t h = n_items * p->n_ff;
    if (!p->q8x) return h;
    return ((h + 3) & ~(int64_t)3) + (int64_t)(cuda_moe_scratch_part(p->n_embd, n_items) +
                                               cuda_moe_scratch_part(p->n_ff, n_items)) /
                                         4;
}
static inline tm_cuda_moe_q8x_scratch cuda_moe_q8x_scratch(const tm_cuda_moe_params *p,
                                                           int64_t n_items, int64_t n_tok,
                                                           float *h_scratch) {
    tm_cuda_moe_q8x_scratch s;
    s.xq = (int8_t *)(h_scratch + ((n_items * p->n_ff + 3) & ~(int64_t)3));
    s.xd = (float *)(s.xq + n_tok * p->n_embd);
    s.hq = s.xq + cuda_moe_scratch_part(p->n_embd, n_items);
    s.hd = (float *)(s.hq + n_items * p->n_ff);
    return s;
}
/* Which of cuda_moe_grouped's two kernels take 8-bit activations (the launcher and both
 * mocks ask): gate/up where gate and up have one type that cuda_mmvq_q8x reads (q4_K or
 * TM_CUDA_LBX_TYPES: q8_0 experts keep f32), down where down has; each independently. */
static inline bool cuda_moe_q8x_matrix(const tm_cuda_moe_matrix *m, int64_t k) {
    return (m->type == TM_TYPE_Q4_K || cuda_lbx_type(m->type)) &&
           cuda_mmvq_q8x_ok(m->type, (uintptr_t)m->data | m->row_bytes | m->expert_stride, k);
}
static inline bool cuda_moe_q8x_gate_up(const tm_cuda_moe_params *p, int64_t n_items,
                                        int64_t n_tok) {
    return p->q8x && n_tok <= n_items && p->gate.type == p->up.type &&
           cuda_moe_q8x_matrix(&p->gate, p->n_embd) && cuda_moe_q8x_matrix(&p->up, p->n_embd);
}
static inline bool cuda_moe_q8x_down(const tm_cuda_moe_params *p, int64_t n_items, int64_t n_tok) {
    return p->q8x && n_tok <= n_items && cuda_moe_q8x_matrix(&p->down, p->n_ff);
}
tm_status cuda_moe_grouped(const tm_cuda_moe_params *p, const tm_cuda_moe_item *items,
                           int64_t n_items, const float *x, int64_t n_tok, float *y,
                           float *h_scratch, tm_cuda_stream stream);

/* router.cu: logits [n_tok][n_expert] → ids/weights [n_tok][n_used], as
 * moe_router_select (src/moe/router.c): same gating modes, selection bias,
 * groups, ties to the lower id, renormalise, scale. n_expert <= 512, n_used
 * <= 32, n_group <= 32. */
typedef enum tm_cuda_gating {
    TM_CUDA_GATING_SOFTMAX = 0,      /* = TM_MOE_GATING_SOFTMAX */
    TM_CUDA_GATING_SIGMOID = 1,      /* = TM_MOE_GATING_SIGMOID */
    TM_CUDA_GATING_SOFTMAX_TOPK = 2, /* = TM_MOE_GATING_SOFTMAX_TOPK */
} tm_cuda_gating;

typedef struct tm_cuda_router_params {
    tm_cuda_gating gating;
    int32_t n_expert, n_used;
    int32_t norm_topk; /* 0/1 */
    float scale;
    /* Device [n_expert] or NULL: added to the scores for the choice only (tm_moe_router_params) */
    const float *sel_bias;
    /* Group-limited top-k (tm_moe_router_params): n_group <= 1 none; else n_group (<= 32)
     * equal groups of 2 or more experts, of which the n_group_used best may be chosen */
    int32_t n_group, n_group_used;
    /* Device [n_expert] or NULL: the work items get slot_map[id] instead of
     * id (a VRAM cache's slot, or -1 for an expert it does not hold, which
     * cuda_moe_grouped skips). ids are always the expert ids. */
    const int32_t *slot_map;
    /* Device [n_tok * n_used] or NULL: a second work list, for a lane that
     * reads cold experts from host memory (cuda_host_register): the first
     * tm_cuda_mapped_count cold slots of each token, in rank order, get
     * {id, t, w, id}, every other slot -1. Cold: slot_map[id] < 0 (a slot_map is
     * needed). */
    tm_cuda_moe_item *mapped;
    int32_t n_mapped, mapped_share_q8;
    /* Mapped host memory or NULL: the share, read when the kernel runs instead of
     * mapped_share_q8 (the tier tunes it between decode steps; a graph keeps serving) */
    const int32_t *mapped_share_live;
    /* Device [n_expert] or NULL: the experts a fetch buffer holds (buffer slot,
     * or -1), from cuda_moe_fetch_ahead. A slot the slot map calls cold whose
     * expert the buffer holds is not cold: with fetched (device [n_tok * n_used])
     * it gets {fetch_map[id], t, w, id} there, every other slot -1, and the
     * mapped lane counts only the slots left cold. */
    const int32_t *fetch_map;
    tm_cuda_moe_item *fetched;
    /* Device [n_tok] or NULL: each token's slots left cold (neither in a slot,
     * nor fetched, nor the mapped lane's): what the CPU computes. */
    int32_t *cpu_slots;
    /* Device [n_expert] or NULL: each chosen expert's weight times its factor, last
     * (tm_moe_router_params.expert_scale) */
    const float *expert_scale;
} tm_cuda_router_params;

/* moe_fetch.cu: copy ahead the experts a layer is predicted to route to.
 * Of the items[0, n_items) with slot < 0 (cold: predicted routing through the
 * layer's slot map), the up to n_slots experts with the largest summed weight
 * (ties to the lower id) are chosen, in that order, and each one's gate, up and
 * down are copied from src (indexed by expert id, typically host memory mapped
 * for the device) into a slot of dst (dst's strides and types those of src).
 * list [2 * n_slots] gets {expert, slot} pairs ({-1, -1}: none).
 *   cache NULL: dst is a buffer; chosen expert i goes to slot i, and map[e] =
 *     its slot or -1 for each of the n_expert experts.
 *   cache set: dst is the layer's cache and the chosen experts replace the
 *     least recently used of its slots (last_use, ties to the lower slot),
 *     never one the items use (their slot >= 0, whose last_use becomes *seq):
 *     cache->slot_map and expert_in are updated (the evicted expert -> -1) and
 *     map is not used. A slot the items reach is never written, so the step's
 *     predicted hot experts stay; one mispredicted is then cold (the CPU's).
 * The one launch a decode graph keeps works for any routing: the choice is made
 * on the device. */
typedef struct tm_cuda_fetch_cache {
    int32_t *slot_map;   /* device [n_expert]: the layer's slot of each expert, or -1 */
    int32_t *expert_in;  /* device [n_slots]: each slot's expert, or -1 */
    uint32_t *last_use;  /* device [n_slots]: the step that last used or filled it */
    int32_t n_slots;     /* at most TM_CUDA_ROUTER_MAX_EXPERT */
    const uint32_t *seq; /* device: this step's number */
} tm_cuda_fetch_cache;
tm_status cuda_moe_fetch_ahead(const tm_cuda_moe_params *src, const tm_cuda_moe_params *dst,
                               const tm_cuda_moe_item *items, int64_t n_items, int32_t n_expert,
                               int32_t n_slots, int32_t *map, int32_t *list,
                               const tm_cuda_fetch_cache *cache, tm_cuda_stream stream);
#define TM_CUDA_FETCH_AHEAD_MAX 16 /* n_slots at most */

#ifdef __CUDACC__
#define TM_CUDA_HOST_DEVICE __host__ __device__
#else
#define TM_CUDA_HOST_DEVICE
#endif

/* The mapped lane's slots of a token with n_cold cold ones: n_mapped, or with
 * a share (in 1/256: the lane's rate over both lanes' rates) the count that
 * ends both lanes soonest, at most n_mapped. With n slots the GPU takes
 * n (256 - share) and the CPU (n_cold - n) share (in 1/256 of a slot at the
 * sum of the rates); of floor(n_cold share) and one more, the one whose
 * slower lane is faster, the smaller on a tie (rounding to the nearest gave
 * 1 of 2 cold slots at a third and cost the H200 machine 13% of a cached
 * decode). Integer, so the host and the GPU agree. */
static inline TM_CUDA_HOST_DEVICE int32_t tm_cuda_mapped_count(int32_t n_cold, int32_t n_mapped,
                                                               int32_t share_q8) {
    if (share_q8 <= 0) return n_mapped;
    const int32_t r = 256 - share_q8;
    int32_t n = (n_cold * share_q8) >> 8;
    const int32_t gpu0 = n * r, cpu0 = (n_cold - n) * share_q8;
    const int32_t gpu1 = (n + 1) * r, cpu1 = (n_cold - n - 1) * share_q8;
    if (n < n_cold && (gpu1 > cpu1 ? gpu1 : cpu1) < (gpu0 > cpu0 ? gpu0 : cpu0)) n++;
    return n < n_mapped ? n : n_mapped;
}

#define TM_CUDA_ROUTER_MAX_EXPERT 512
#define TM_CUDA_ROUTER_MAX_USED   32
#define TM_CUDA_ROUTER_MAX_GROUP  32 /* a lane each */
/* items (may be NULL): also items[t*n_used + j] = {slot, t, weights[t][j], ids[t][j]}
 * with slot = ids[t][j] (or slot_map[ids[t][j]]), the top-k as a work list for
 * cuda_moe_grouped (decode, no host trip). */
tm_status cuda_router_select(const tm_cuda_router_params *p, const float *logits, int64_t n_tok,
                             int32_t *ids, float *weights, tm_cuda_moe_item *items,
                             tm_cuda_stream stream);

/* norm_rope.cu */
/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w  (w may be NULL); y may alias x. */
tm_status cuda_rmsnorm(float *y, const float *x, const float *w, int64_t n_rows, int64_t n,
                       float eps, tm_cuda_stream stream);
/* NeoX RoPE in place on x [n_tok][n_head][head_dim] (row stride
 * n_head*head_dim), token t at position pos[t]; angles as cpu_rope_table
 * (theta_i = pos * base^(-2i/d), in double). head_dim even. */
tm_status cuda_rope_neox(float *x, const int32_t *pos, int64_t n_tok, int64_t n_head,
                         int64_t head_dim, float base, tm_cuda_stream stream);
/* y[i] = a[i] + b[i]; y may alias a or b. */
tm_status cuda_add(float *y, const float *a, const float *b, int64_t n, tm_cuda_stream stream);
/* y[r][i] += b[i] for n_rows rows of n (a bias). */
tm_status cuda_add_bias(float *y, const float *b, int64_t n_rows, int64_t n, tm_cuda_stream stream);
/* The residual add and the next norm in one launch: x[r] += a[r], then
 * h[r] = rmsnorm(x[r]) * w, for n_rows rows of n. */
tm_status cuda_add_rmsnorm(float *x, const float *a, float *h, const float *w, int64_t n_rows,
                           int64_t n, float eps, tm_cuda_stream stream);

/* ---- attention.cu ----
 * Positions come from device memory (*pos0: the position of the batch's first
 * token; token t is at *pos0 + t) so a captured decode graph replays at the
 * next position without being rebuilt. KV cache: per layer [n_ctx][n_head_kv *
 * head_dim] of kv_type (row-major, as the CPU cache): sequence s owns rows
 * [s seq_rows, (s + 1) seq_rows), where its position p has row p, or p %
 * seq_rows in a ring (a sliding-window layer's cache, reused as keys leave
 * the window). */
typedef struct tm_cuda_attn_params {
    int32_t n_head, n_head_kv, head_dim; /* n_head % n_head_kv == 0; head_dim even, <= 512 */
    int64_t n_ctx;                       /* rows of each KV cache */
    int64_t seq_rows;                    /* rows of one sequence (0: n_ctx) */
    /* The sequences' rows are rings: position p at row p % seq_rows of its sequence's.
     * Needs a window and window + n_tok - 1 <= seq_rows (the keys a launch's rows see
     * are distinct rows; n_kv_max is then not bounded by the rows). */
    bool ring;
    tm_type kv_type; /* TM_TYPE_F16 or TM_TYPE_F32 */
    float scale;     /* softmax scale, 1/sqrt(head_dim) for Qwen3 */
    float rms_eps, rope_base;
    /* Rows of several sequences (NULL, NULL: one sequence, token t at *pos0 + t, the
     * cache its rows). Else device arrays of n_tok: row t is at position row_pos[t]
     * of sequence row_seq[t]; its K and V go to that sequence's row of the position
     * and it sees that sequence's keys up to row_pos[t] only (*pos0 is not read).
     * Read when the kernels run, so a captured graph replays at new positions. */
    const int32_t *row_pos, *row_seq;
    /* Scaled RoPE (YaRN): device [head_dim / 2] inverse frequencies (theta_i = pos *
     * rope_freq[i], in double), cos and sin times rope_mscale (0: 1). NULL: base^(-2i/d). */
    const float *rope_freq;
    float rope_mscale;
    int64_t window;     /* sliding window: the query at p sees keys (p - window, p] (0: all) */
    const float *sinks; /* device [n_head] sink logits in each softmax's denominator (NULL: none) */
    /* f32 arithmetic throughout (the CUDA-core kernel) for prompts too: the
     * precise mode. Else a prompt of one sequence with an f16 cache and
     * head_dim 64 or 128 runs on tensor cores, Q and P rounded to f16. */
    bool precise;
    /* Partial RoPE (Qwen3-Next's gated attention): only the first n_rot values of
     * each q/k head rotate, as NeoX pairs (i, i + n_rot/2) at theta_i = pos *
     * base^(-2i/n_rot); the values from n_rot on pass through (after the QK-norm,
     * which spans the whole head). Even, <= head_dim; 0: head_dim. Not with
     * rope_freq (its table is of the whole head). */
    int32_t n_rot;
    /* RoPE of adjacent pairs (2i, 2i + 1) at theta_i (llama.cpp's "normal" kind), the
     * whole head (n_rot 0 or head_dim); else NeoX pairs (i, i + d/2). */
    bool rope_interleaved;
    /* Latent attention (MLA decoded in the absorbed form: cuda_mla_prepare,
     * cuda_mla_attention; the other attention ops refuse it): one KV head whose key is
     * head_dim = v_dim + n_rot values, the value its first v_dim; RoPE turns each
     * head's last n_rot values (rope_freq: n_rot / 2 of them). No ring, window or
     * sinks. */
    bool latent;
    int32_t v_dim;
    /* Each value head rmsnorm'ed without a gain (rms_eps) before it is stored (Gemma 4's
     * v_norm; as exec's CPU side). */
    bool v_norm;
} tm_cuda_attn_params;

/* For every token t and head: q[t][h] = rope_neox(rmsnorm(q[t][h]) * q_norm, pos)
 * in place (q: [n_tok][n_head*head_dim]); k row likewise with k_norm, then
 * stored at k_cache row pos (converted to kv_type); v [n_tok][n_head_kv*head_dim]
 * stored at v_cache row pos (each head normed first when v_norm). v may be k (K as V:
 * Gemma 4's global layers; k is read, never written, so its value is k as given). q_norm / k_norm: head_dim f32 (NULL: no norm).
 * RoPE angles as cpu_rope_table (theta_i = pos * base^(-2i/d) in double; with
 * n_rot < head_dim: of the first n_rot values, d = n_rot). */
tm_status cuda_attn_prepare(const tm_cuda_attn_params *p, float *q, const float *k, const float *v,
                            const float *q_norm, const float *k_norm, const int32_t *pos0,
                            int64_t n_tok, void *k_cache, void *v_cache, tm_cuda_stream stream);

/* Causal grouped-query attention: out[t][h] = Σ_{j <= pos(t)} softmax_j(scale ·
 * q[t][h]·K[j][g]) V[j][g], g = h / (n_head / n_head_kv); out [n_tok][n_head*head_dim].
 * n_kv_max: an upper bound on *pos0 + n_tok known when launching (it sizes the
 * grid: a decode graph passes n_ctx; blocks past the real length do nothing);
 * with row_pos, a bound on every row_pos[t] + 1. Rows of several sequences
 * run each token's heads in their own blocks, as a launch of that token alone
 * would (the same splits, so the same bits); up to 8 rows split the keys over
 * blocks, more rows do not.
 * Decode (n_tok small) splits the KV length over blocks and combines; prompts
 * run flash-attention style (online softmax over KV tiles): on tensor cores
 * (attention_tc.cu: Q and the softmax weights rounded to f16, f32
 * accumulation) when n_tok > 8, one sequence (no row_pos), an f16 cache with
 * 16-byte aligned bases, head_dim 64 or 128 and not precise; else in f32.
 * scratch: device floats, at least cuda_attention_scratch_floats(). */
int64_t cuda_attention_scratch_floats(const tm_cuda_attn_params *p, int64_t n_tok,
                                      int64_t n_kv_max);
tm_status cuda_attention(const tm_cuda_attn_params *p, const float *q, const void *k_cache,
                         const void *v_cache, const int32_t *pos0, int64_t n_tok, int64_t n_kv_max,
                         float *out, float *scratch, tm_cuda_stream stream);

/* ---- mla.cu: latent attention (MLA, absorbed) and the strided copies of the
 * per-head products around it. Simple kernels, not tuned: a block a (token,
 * head), reading the whole cache row by row. ---- */

/* For every token t (at its position, as cuda_attn_prepare's rows): the last n_rot values
 * of each q head turned in place (pairs (2i, 2i + 1) when rope_interleaved, else NeoX's
 * (i, i + n_rot / 2); angles as cuda_attn_prepare's, of width n_rot); kv's row
 * [latent (v_dim) ; RoPE key (n_rot)]: the latent RMS-normed with kv_norm (v_dim f32;
 * NULL: none), the key turned, stored at the token's cache row (kv_type) and written back
 * to kv. q: [n_tok][n_head head_dim]; kv: [n_tok][head_dim]; k_cache: [n_ctx][head_dim]. */
tm_status cuda_mla_prepare(const tm_cuda_attn_params *p, float *q, float *kv, const float *kv_norm,
                           const int32_t *pos0, int64_t n_tok, void *k_cache,
                           tm_cuda_stream stream);
/* out[t][h] = Σ_{j <= pos(t)} softmax_j(scale · q[t][h] · K[j]) K[j][0, v_dim), over
 * the token's sequence's rows; out [n_tok][n_head v_dim]. Outside the precise mode, an
 * f16 cache with DeepSeek-V3's key (576 = 512 + 64) and a multiple of 32 heads runs on
 * tensor cores (q and the softmax weights rounded to f16), a few tokens with their keys
 * split over blocks: scratch holds cuda_mla_scratch_floats(p, n_tok) floats (may be
 * NULL where that is 0). */
int64_t cuda_mla_scratch_floats(const tm_cuda_attn_params *p, int64_t n_tok);
tm_status cuda_mla_attention(const tm_cuda_attn_params *p, const float *q, const void *k_cache,
                             const int32_t *pos0, int64_t n_tok, float *out, float *scratch,
                             tm_cuda_stream stream);
/* dst[r][i] = src[r][i] for r < rows, i < n, rows dst_ld and src_ld floats apart. */
tm_status cuda_copy_rows(float *dst, int64_t dst_ld, const float *src, int64_t src_ld, int64_t rows,
                         int64_t n, tm_cuda_stream stream);

/* ---- ssm.cu: linear attention (Gated DeltaNet, as in Qwen3-Next) and the
 * element-wise gates around it. Same math as src/cpu/cpu_ssm.h and the
 * executor's exec_ssm.c. ----
 * The recurrent ops take rows like tm_cuda_attn_params.row_pos / row_seq:
 * row t of a launch is at position row_pos[t] of sequence row_seq[t] (device
 * arrays read when the kernels run, so a captured graph replays at new
 * positions and sequences). Rows of one sequence are consecutive, at
 * consecutive positions: a run (a prompt: one run; a decode step: up to 8 rows
 * of distinct sequences, each its own run); a run may not share its sequence
 * with another run of the launch. A run that starts at position 0 starts from a
 * zero state, any other from the sequence's state; the state ends as the run
 * leaves it. A run whose sequence is outside [0, n_seq) or whose first position
 * is negative is skipped (nothing of it read or written). */
typedef struct tm_cuda_ssm_rows {
    const int32_t *row_pos, *row_seq; /* device [n_tok] */
    int64_t n_tok;
    int32_t n_seq; /* sequences the states hold */
} tm_cuda_ssm_rows;

#define TM_CUDA_SSM_MAX_CONV 16 /* conv width K at most */
/* The causal depthwise convolution of width K, then SiLU, in place on x
 * [n_tok][C]: y[t][c] = silu(sum_{j<K} w[c][j] x[t - (K-1) + j][c]), where the
 * rows before a run's first come from its sequence's state (state: [n_seq][K-1][C],
 * oldest row first), which ends holding the run's last K-1 inputs (as
 * cpu_ssm_conv). w: [C][K] f32 (the file's ssm_conv1d rows). 2 <= K <= 16. */
tm_status cuda_ssm_conv(const tm_cuda_ssm_rows *rows, float *x, int64_t C, int32_t K,
                        const float *w, float *state, tm_cuda_stream stream);

/* The gated delta rule. qkv: [n_tok][C] after the conv, C = 2 n_k_head k_dim +
 * n_v_head v_dim channels [q | k | v] (key head h's q at h k_dim, its k at
 * (n_k_head + h) k_dim, value head h's v at 2 n_k_head k_dim + h v_dim). Per row:
 *   q, k l2-normalised per key head (x / sqrt(sum x^2 + 1e-6)), q *= 1/sqrt(k_dim),
 *   beta = sigmoid(b), g = A softplus(a + dt_bias) (torch's softplus, threshold 20)
 * with b and a [n_tok][n_v_head] each, or with ba_grouped one [n_tok][2 n_v_head]
 * array b (a: NULL or b) in HF Qwen3-Next's order: per key head its r = n_v_head /
 * n_k_head value heads' b, then their a. Then per value head h, reading key head
 * h % n_k_head (v_tiled) or h / r, with S = state[seq][h] ([k_dim][v_dim] f32;
 * state: [n_seq][n_v_head][k_dim][v_dim]):
 *   S = e^g S;  S += k (beta (v - S^T k))^T;  out[t][h v_dim ..] = S^T q
 * out: [n_tok][n_v_head v_dim]. qkv is only read: the normalised q and k are not
 * written back (the CPU executor normalises them in place). A, dt_bias: device
 * [n_v_head] f32. k_dim one of 16, 32, 64, 128, 256; v_dim 1..256. Up to
 * TM_CUDA_DELTA_SERIAL_TOK rows (decode) one block per (value head, run) scans the
 * run token by token, its S in registers (a thread a column of v); more rows
 * (prompts) run the chunked form of the same recurrence (chunks of 32 tokens in
 * matrix products: ssm.cu), the same sums in another order. */
typedef struct tm_cuda_delta_params {
    int32_t n_k_head, n_v_head, k_dim, v_dim;
    bool v_tiled, ba_grouped;
    const float *A, *dt_bias;
} tm_cuda_delta_params;
#define TM_CUDA_DELTA_MAX_V      256
#define TM_CUDA_DELTA_SERIAL_TOK 8
tm_status cuda_delta_rule(const tm_cuda_delta_params *p, const tm_cuda_ssm_rows *rows,
                          const float *qkv, const float *b, const float *a, float *state,
                          float *out, tm_cuda_stream stream);

/* Per group of n values of x ([n_rows][n_per_row], n_per_row a multiple of n):
 * x = x / sqrt(mean(x^2) + eps) * w * silu(z), in place; z like x, w [n] shared
 * by the groups (as cpu_rmsnorm_gated). */
tm_status cuda_rmsnorm_gated(float *x, const float *z, const float *w, int64_t n_rows,
                             int64_t n_per_row, int64_t n, float eps, tm_cuda_stream stream);
/* src rows of n_group groups of [na values | nb values] split into a [n_tok][n_group
 * na] and b [n_tok][n_group nb] (no aliasing). */
tm_status cuda_unzip(const float *src, float *a, float *b, int64_t n_tok, int64_t n_group,
                     int64_t na, int64_t nb, tm_cuda_stream stream);
/* y[i] = silu(g[i]) u[i] for i < n (y may alias g or u). */
tm_status cuda_swiglu(float *y, const float *g, const float *u, int64_t n, tm_cuda_stream stream);
/* y[i] *= sigmoid(g[i]) for i < n. */
tm_status cuda_gate_mul(float *y, const float *g, int64_t n, tm_cuda_stream stream);
/* For rows t < n_rows of n: y[t] *= sigmoid(s[t]), then x[t] += y[t] (the gated
 * shared expert's add; s: [n_rows]). */
tm_status cuda_gate_add(float *x, float *y, const float *s, int64_t n_rows, int64_t n,
                        tm_cuda_stream stream);

/* ---- ew.cu: element-wise ops of the dense layers (Gemma 4's) ---- */
/* x[i] *= s for i < n. */
tm_status cuda_scale(float *x, float s, int64_t n, tm_cuda_stream stream);
/* x[i] = cap tanh(x[i] / cap) for i < n (cap > 0: a final logit soft-cap). */
tm_status cuda_softcap(float *x, float cap, int64_t n, tm_cuda_stream stream);
/* y[i] = gelu_tanh(g[i]) u[i] for i < n, as cpu_geglu (y may alias g or u). */
tm_status cuda_geglu(float *y, const float *g, const float *u, int64_t n, tm_cuda_stream stream);

/* ---- gemm.cu: prompt-size products on tensor cores ----
 * Quantized and 16-bit weights are dequantized to f16 (in row chunks) and
 * activations rounded to f16 (so |x| above 65504 overflows); cuBLAS multiplies
 * with f32 accumulation and f32 output. f32 weights stay f32 (cublasSgemm). */
typedef struct tm_cuda_blas tm_cuda_blas; /* a cuBLAS handle bound to one stream */
tm_status cuda_blas_create(tm_cuda_device *dev, tm_cuda_blas **out);
void cuda_blas_free(tm_cuda_blas *b);

/* Dequantize `rows` rows (row_bytes apart, k values each) to f16, row-major
 * [rows][k]; bit-exact with quant_row_dequantize rounded to f16. */
tm_status cuda_dequantize_f16(tm_type type, const void *w, size_t row_bytes, int64_t rows,
                              int64_t k, void *out_f16, tm_cuda_stream stream);

/* y[t][r] = Σ_i W[r][i] x[t][i], any n_tok >= 1 (W, x as cuda_mmvq). */
size_t cuda_gemm_scratch_bytes(int64_t rows, int64_t k, int64_t n_tok);
tm_status cuda_gemm(tm_cuda_blas *b, tm_type type, const void *w, size_t row_bytes, int64_t rows,
                    int64_t k, const float *x, int64_t n_tok, float *y, void *scratch,
                    tm_cuda_stream stream);

/* Per-head products (MLA's attn_k_b, attn_v_b) in one batched product: for each token
 * t < n_tok, head h < n_head and o < out,
 *   y[t ldy + h hy + o] = Σ_{i < in} W[h out + o][i] x[t ldx + h hx + i]
 * (W: n_head·out rows of in values, row_bytes apart). Weights dequantized to f16 (f16 ones
 * read as they are) and x rounded to f16, f32 accumulation; f32 weights stay f32. Scratch:
 * cuda_gemm_heads_scratch_bytes (x is converted in chunks of tokens that fit it). */
size_t cuda_gemm_heads_scratch_bytes(tm_type type, int64_t in, int64_t out, int64_t n_head);
tm_status cuda_gemm_heads(tm_cuda_blas *b, tm_type type, const void *w, size_t row_bytes,
                          int64_t in, int64_t out, int64_t n_head, const float *x, int64_t ldx,
                          int64_t hx, int64_t n_tok, float *y, int64_t ldy, int64_t hy,
                          void *scratch, tm_cuda_stream stream);

/* Grouped experts for prompt batches: the same math as cuda_moe_grouped
 * (y[tok] += weight · down_e(silu(gate_e x) ⊙ up_e x), or the extension's), with the work list
 * expert-major and its groups known on the host: group i has expert slot
 * slots[i] and the items items[starts[i] .. starts[i+1]) (items: device array;
 * slots, starts: host arrays; every item of group i has .slot == slots[i]:
 * the weights come from slots[i]). Each group's tokens are gathered,
 * multiplied on tensor cores, and scattered back with their weights. */
typedef struct tm_cuda_moe_groups {
    int32_t n_groups;
    const int32_t *slots;          /* host, [n_groups] */
    const int64_t *starts;         /* host, [n_groups + 1] */
    const tm_cuda_moe_item *items; /* device, [starts[n_groups]] */
} tm_cuda_moe_groups;

size_t cuda_moe_grouped_gemm_scratch_bytes(const tm_cuda_moe_params *p, int64_t n_items,
                                           int32_t n_groups);
tm_status cuda_moe_grouped_gemm(tm_cuda_blas *b, const tm_cuda_moe_params *p,
                                const tm_cuda_moe_groups *g, const float *x, int64_t n_tok,
                                float *y, void *scratch, tm_cuda_stream stream);

/* ---- handoff.cu: the stream and a host thread hand data to each other
 * without a stream synchronisation ----
 * A mailbox is mapped pinned memory (cuda_host_alloc_mapped). The stream
 * writes data there, then a flag; a host thread spins on the flag, works, and
 * writes its answer and then another flag, on which a one-block kernel of the
 * stream spins. Both are ordinary kernels, so a captured CUDA graph replays
 * them. Flags hold sequence numbers: a wait is over once
 * (int32_t)(*flag - *seq) >= 0, so no flag is ever reset; *seq is read from
 * device memory when the kernel runs (a replayed graph reads the number of
 * the step it runs for). */
typedef struct tm_cuda_span {
    void *dst;       /* mapped host memory (device address) */
    const void *src; /* device memory */
    int64_t bytes;   /* a multiple of 4 */
} tm_cuda_span;
#define TM_CUDA_SIGNAL_SPANS 5

/* Copy the spans, then, once every byte is visible to the host, write
 * *flag = *seq (flag: mapped host memory, device address). */
tm_status cuda_signal_host(const tm_cuda_span *spans, int n_spans, uint32_t *flag,
                           const uint32_t *seq, tm_cuda_stream stream);

/* Wait until (int32_t)(*flag - *seq) >= 0 (flag: mapped host memory the host
 * writes), then x[i] += add[i] for i < n (add: mapped host memory read after
 * the flag; n may be 0). After timeout_ns without the flag it writes *err = 1
 * (mapped host memory) and adds nothing: a host that never answers costs an
 * error, never a hung GPU. */
tm_status cuda_wait_host(const uint32_t *flag, const uint32_t *seq, uint64_t timeout_ns,
                         uint32_t *err, float *x, const float *add, int64_t n,
                         tm_cuda_stream stream);
/* The same, unless need (device [n_need], e.g. the router's cpu_slots) sums to
 * 0: then nothing is waited for or added (the host has nothing to answer with;
 * it still answers, later, and no later wait reads that answer). */
tm_status cuda_wait_host_unless(const int32_t *need, int32_t n_need, const uint32_t *flag,
                                const uint32_t *seq, uint64_t timeout_ns, uint32_t *err, float *x,
                                const float *add, int64_t n, tm_cuda_stream stream);

#ifdef __cplusplus
}
#endif
#endif
