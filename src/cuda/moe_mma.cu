/* Fused grouped expert products on tensor cores (the default path of
 * cuda_moe_grouped_gemm; moe_mma.cuh has the interface, moe_gemm.cu the host
 * side). Weights are copied quantized into shared memory, dequantized there to
 * f16 by dequant.cuh's tm_dq8_f16 (bit-exact with the CPU rounded to f16, as
 * the dequantize-then-cuBLAS path), multiplied with nvcuda::wmma (16x16x16,
 * f16 inputs, f32 accumulation) and never written to global memory.
 *
 * Two launches a layer, one kernel template:
 *   gate/up (DOWN = false): grid (ceil(n_ff / 64), tiles). A block stages
 *     gate rows f0..f0+63 and the same up rows (128 weight rows), k = n_embd,
 *     activations xg; it ends with h[row][f] = f16(silu(g) * u) (no f32
 *     gate/up buffer).
 *   down (DOWN = true): grid (ceil(n_embd / 128), tiles). A block stages down
 *     rows e0..e0+127, k = n_ff, activations h; it ends by adding
 *     weight * out to y[token] (atomicAdd per element, as the dequantize
 *     path's scatter kernel; padding rows and skipped items add nothing).
 *
 * A block: 256 threads (8 warps), a tile of at most 64 token rows.
 *   k loop: raw chunks of 256 values (one K-quant super-block, 8 blocks of
 *   32-value types) per weight row, copied with cp.async (16-, 8- or 4-byte
 *   pieces: the largest that divides the data pointer, row and expert strides
 *   and chunk sizes; q6_K's 210-byte blocks take aligned 4-byte words around
 *   the chunk, from `off` = address % 4 on) into one of two raw buffers: chunk
 *   c + 1 is in flight while chunk c is used. Each chunk is used in sub-steps
 *   of 32 values: every thread dequantizes 2 units of 8 values (rows tid/4
 *   and tid/4 + 64, unit tid % 4) into W[step % 2] (128 x 32 f16) and stores
 *   its 16 bytes of activations (row tid/4, loaded one step ahead into
 *   registers) into X[step % 2] (64 x 32 f16); one __syncthreads; then the
 *   MMAs. Double-buffered W and X need one barrier a step: a buffer is
 *   rewritten only after every warp has passed the barrier that follows the
 *   MMAs that read it last.
 *   Warp w: token rows 32 (w / 4) .. +32 (2 fragments, the second skipped
 *   when the tile has only 16 rows there), weight rows a0 = 16 (w % 4) and
 *   a1 = a0 + 64 (gate/up: the gate and up rows of one f) or a0 = 32 (w % 4),
 *   a1 = a0 + 16 (down): 4 accumulators, 4 fragment loads for 4 MMAs a
 *   k-step. Warps whose rows lie past the matrix or whose tokens lie past the
 *   tile skip the MMAs and the epilogue; no other thread depends on them.
 *   Epilogue: accumulators through per-warp shared staging (reusing the
 *   tiles' memory after a barrier), read back row by row.
 * Shared memory: W 2 x 128 x 40 f16 (rows padded from 32 to 40 halves: 80
 *   bytes, so 8 consecutive rows of a fragment load hit distinct banks) =
 *   20480 B, X 2 x 64 x 40 f16 = 10240 B, raw 2 x 128 x stride (q4_K: 144 B,
 *   36864 B; q6_K: 224 B; q8_0: 272 B) : 67584 B for q4_K (3 blocks per H100
 *   SM), 88064 B for q6_K, 100352 B for q8_0.
 *
 * Cost against the dequantize path (Qwen3-30B-A3B, q4_K, 128 experts used):
 * the quantized weights are read once per tile of 64 rows of a group (340 MB
 * a layer when no group exceeds 64 rows) instead of 340 MB read + 1.2 GB f16
 * written + 1.2 GB read; activations (xg, h) come from L2. */
#include "cuda/dequant.cuh"
#include "cuda/moe_ext.cuh"
#include "cuda/moe_mma.cuh"

#include <cuda_pipeline.h>
#include <mma.h>

#define TM_MMA_THREADS 256
#define TM_MMA_WROWS   128                  /* weight rows staged */
#define TM_MMA_KC      256                  /* k values a raw chunk holds */
#define TM_MMA_KS      32                   /* k values a sub-step dequantizes */
#define TM_MMA_ST      (TM_MMA_KS + 8)      /* f16 row stride of the W and X tiles */
#define TM_MMA_N       TM_MOE_MMA_TILE_ROWS /* token rows of a tile */
#define TM_MMA_STG_GU  20                   /* f32 staging stride (tokens x 16 f), gate then up */
#define TM_MMA_STG_D   36                   /* f32 staging stride (tokens x 32 e) */
#define TM_MMA_TILE_BYTES                                                                          \
    ((2 * TM_MMA_WROWS + 2 * TM_MMA_N) * TM_MMA_ST * 2) /* W and X, both buffers */
#define TM_MMA_STG_BYTES                                                                           \
    (8 * 64 * TM_MMA_STG_GU * 4 > 8 * 32 * TM_MMA_STG_D * 4 ? 8 * 64 * TM_MMA_STG_GU * 4           \
                                                            : 8 * 32 * TM_MMA_STG_D * 4)

static_assert(TM_MMA_KS == 32 && TM_MMA_THREADS == 256 && TM_MMA_WROWS == 128 && TM_MMA_N == 64,
              "the thread-to-unit maps below assume these sizes");
static_assert(TM_MMA_KC % TM_MMA_KS == 0, "whole sub-steps per chunk");

/* One weight matrix as the kernels read it. */
struct tm_mma_src {
    const uint8_t *data;
    size_t expert_stride, row_bytes;
    int type, block_vals, block_bytes;
    int vec;   /* copy piece: 16, 8 or 4 bytes */
    int units; /* pieces a raw row of a chunk needs at most */
};

struct tm_mma_args {
    tm_mma_src w[2]; /* gate/up: gate, up; down: down twice */
    int64_t rows, k; /* rows of each weight matrix, values of a row */
    int raw_stride;  /* bytes of a raw row in shared memory (16-aligned) */
    const int32_t *slots, *tiles, *rowmap;
    const tm_cuda_moe_item *items;
    int32_t n_slots;
    int64_t n_tok;
    const __half *act; /* [rows][k] */
    __half *h;         /* gate/up output [rows][n_ff] */
    float *y;          /* down output [n_tok][n_embd] */
    tm_cuda_moe_ext ext;
    int64_t n_ff; /* rows of the gate/up biases' experts (= gate/up rows) */
};

static __device__ __forceinline__ const uint8_t *tm_mma_chunk_src(const tm_mma_src &m, int32_t slot,
                                                                  int64_t wrow, int64_t c) {
    return m.data + (size_t)slot * m.expert_stride + (size_t)wrow * m.row_bytes +
           (size_t)(c * (TM_MMA_KC / m.block_vals)) * (size_t)m.block_bytes;
}

static __device__ __forceinline__ int tm_mma_chunk_bytes(const tm_mma_src &m, int64_t k,
                                                         int64_t c) {
    const int64_t left = k - c * TM_MMA_KC;
    const int vals = left < TM_MMA_KC ? (int)left : TM_MMA_KC;
    return vals / m.block_vals * m.block_bytes;
}

/* Queue chunk c of the block's weight rows into `dst` (one raw buffer). */
template <bool DOWN>
static __device__ __forceinline__ void tm_mma_copy(const tm_mma_args &a, int32_t slot, int64_t wr0,
                                                   int64_t c, uint8_t *dst) {
    const int per = DOWN ? TM_MMA_WROWS : TM_MMA_WROWS / 2; /* rows per matrix */
    const int n0 = per * a.w[0].units, total = DOWN ? n0 : n0 + per * a.w[1].units;
    for (int i = threadIdx.x; i < total; i += TM_MMA_THREADS) {
        const int mi = DOWN ? 0 : (i >= n0 ? 1 : 0);
        const tm_mma_src &m = a.w[mi];
        const int ii = i - mi * n0, rl = ii / m.units, u = ii - rl * m.units;
        const int64_t wrow = wr0 + rl;
        if (wrow >= a.rows) continue;
        const uint8_t *s = tm_mma_chunk_src(m, slot, wrow, c);
        const int off = (int)((uintptr_t)s & (uintptr_t)(m.vec - 1));
        if (u * m.vec >= tm_mma_chunk_bytes(m, a.k, c) + off) continue;
        uint8_t *d = dst + (mi * per + rl) * a.raw_stride + u * m.vec;
        const uint8_t *g = s - off + u * m.vec;
        if (m.vec == 16)
            __pipeline_memcpy_async(d, g, 16);
        else if (m.vec == 8)
            __pipeline_memcpy_async(d, g, 8);
        else
            __pipeline_memcpy_async(d, g, 4);
    }
}

template <bool DOWN>
__global__ void __launch_bounds__(TM_MMA_THREADS, 3)
    tm_moe_mma_kernel(const __grid_constant__ tm_mma_args a) {
    namespace wmma = nvcuda::wmma;
    extern __shared__ __align__(128) unsigned char tm_mma_smem[];
    __half *const ws = (__half *)tm_mma_smem;             /* [2][128][ST] */
    __half *const xs = ws + 2 * TM_MMA_WROWS * TM_MMA_ST; /* [2][64][ST] */
    uint8_t *const raw = tm_mma_smem + TM_MMA_TILE_BYTES; /* [2][128][raw_stride] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int32_t *tile = a.tiles + 3 * (int64_t)blockIdx.y;
    const int32_t slot = a.slots[tile[0]];
    const int64_t r0 = tile[1];
    const int nr = tile[2];
    const int per = DOWN ? TM_MMA_WROWS : TM_MMA_WROWS / 2;
    const int64_t wr0 = (int64_t)blockIdx.x * per;
    const int raw_buf = TM_MMA_WROWS * a.raw_stride;

    /* warp roles (rows multiples of 32, nr of 16: sub-tiles are whole) */
    const int a0 = DOWN ? 32 * (warp & 3) : 16 * (warp & 3), a1 = DOWN ? a0 + 16 : a0 + 64;
    const int t0 = 32 * (warp >> 2);
    const bool w_on = wr0 + a0 < a.rows && t0 < nr, two = nr - t0 >= 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    /* this thread's dequantize rows (q = 0, 1) and activation row */
    const int du = tid & 3, tk = tid >> 2;
    const bool x_on = tk < nr;
    const __half *xsrc = a.act + (r0 + tk) * a.k + 8 * du;
    uint4 xr = make_uint4(0, 0, 0, 0);

    tm_mma_copy<DOWN>(a, slot, wr0, 0, raw);
    __pipeline_commit();
    if (x_on) xr = *(const uint4 *)xsrc;
    __pipeline_wait_prior(0);
    __syncthreads();

    const int64_t n_chunks = (a.k + TM_MMA_KC - 1) / TM_MMA_KC, n_steps = a.k / TM_MMA_KS;
    int64_t step = 0;
    for (int64_t c = 0; c < n_chunks; c++) {
        if (c + 1 < n_chunks) tm_mma_copy<DOWN>(a, slot, wr0, c + 1, raw + ((c + 1) & 1) * raw_buf);
        __pipeline_commit(); /* empty on the last chunk: the wait below stays uniform */
        const uint8_t *rb = raw + (c & 1) * raw_buf;
        int off[2];
        bool d_on[2];
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int64_t wrow = wr0 + (DOWN ? tk + 64 * q : tk);
            const tm_mma_src &m = a.w[DOWN ? 0 : q];
            d_on[q] = wrow < a.rows;
            off[q] =
                d_on[q]
                    ? (int)((uintptr_t)tm_mma_chunk_src(m, slot, wrow, c) & (uintptr_t)(m.vec - 1))
                    : 0;
        }
        const int64_t left = a.k - c * TM_MMA_KC;
        const int n_sub = (int)((left < TM_MMA_KC ? left : TM_MMA_KC) / TM_MMA_KS);
        for (int s = 0; s < n_sub; s++, step++) {
            const int b = (int)(step & 1);
            __half *wb = ws + b * TM_MMA_WROWS * TM_MMA_ST;
            __half *xb = xs + b * TM_MMA_N * TM_MMA_ST;
#pragma unroll
            for (int q = 0; q < 2; q++) {
                if (!d_on[q]) continue;
                const int r = tk + 64 * q;
                __align__(16) __half v[8];
                tm_dq8_f16(a.w[DOWN ? 0 : q].type, rb + r * a.raw_stride + off[q],
                           s * TM_MMA_KS + 8 * du, v);
                *(uint4 *)(wb + r * TM_MMA_ST + 8 * du) = *(const uint4 *)v;
            }
            if (x_on) {
                *(uint4 *)(xb + tk * TM_MMA_ST + 8 * du) = xr;
                if (step + 1 < n_steps) xr = *(const uint4 *)(xsrc + (step + 1) * TM_MMA_KS);
            }
            if (s == n_sub - 1) __pipeline_wait_prior(0); /* chunk c + 1 landed */
            __syncthreads();
            if (w_on) {
#pragma unroll
                for (int kk = 0; kk < TM_MMA_KS; kk += 16) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa0, fa1;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
                    wmma::load_matrix_sync(fa0, wb + a0 * TM_MMA_ST + kk, TM_MMA_ST);
                    wmma::load_matrix_sync(fa1, wb + a1 * TM_MMA_ST + kk, TM_MMA_ST);
                    wmma::load_matrix_sync(fb, xb + t0 * TM_MMA_ST + kk, TM_MMA_ST);
                    wmma::mma_sync(acc[0][0], fa0, fb, acc[0][0]);
                    wmma::mma_sync(acc[1][0], fa1, fb, acc[1][0]);
                    if (two) {
                        wmma::load_matrix_sync(fb, xb + (t0 + 16) * TM_MMA_ST + kk, TM_MMA_ST);
                        wmma::mma_sync(acc[0][1], fa0, fb, acc[0][1]);
                        wmma::mma_sync(acc[1][1], fa1, fb, acc[1][1]);
                    }
                }
            }
        }
    }
    __syncthreads(); /* every warp's MMAs done: the staging below reuses the tiles */
    if (!w_on) return;
    const int nt = two ? 32 : 16; /* token rows of this warp */
    /* the tile's expert id (one group: every row's item has it; the first row is never
       padding), for the extension's biases */
    int32_t ex = -1;
    if (tm_moe_ext_biased(a.ext)) {
        const int32_t i0 = a.rowmap[r0];
        const tm_cuda_moe_item m0 = i0 >= 0 ? a.items[i0] : tm_cuda_moe_item{-1, -1, 0.0f, -1};
        ex = tm_moe_item_valid(m0, a.n_slots, a.n_tok, a.ext) ? m0.expert : -1;
    }
    if (!DOWN) {
        /* gate and up staged [token][16 f] each; h = act(g, u) per element (with the
           biases of row f: the fragments' element order is opaque) */
        float *stg = (float *)tm_mma_smem + warp * 64 * TM_MMA_STG_GU;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if (j == 1 && !two) break;
#pragma unroll
            for (int q = 0; q < 2; q++)
                wmma::store_matrix_sync(stg + (32 * q + 16 * j) * TM_MMA_STG_GU, acc[q][j],
                                        TM_MMA_STG_GU, wmma::mem_col_major);
        }
        __syncwarp();
        if (lane < nt) {
            const float *sg = stg + lane * TM_MMA_STG_GU, *su = sg + 32 * TM_MMA_STG_GU;
            const bool bias_ok = ex >= 0 || !tm_moe_ext_biased(a.ext);
            __align__(16) __half hv[16];
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int64_t f = wr0 + a0 + i;
                const float h = bias_ok ? tm_moe_ext_h(a.ext, ex, f, a.n_ff, sg[i], su[i]) : 0.0f;
                hv[i] = __float2half_rn(h);
            }
            uint4 *o = (uint4 *)(a.h + (r0 + t0 + lane) * a.rows + wr0 + a0);
            o[0] = ((const uint4 *)hv)[0];
            o[1] = ((const uint4 *)hv)[1];
        }
    } else {
        float *stg = (float *)tm_mma_smem + warp * 32 * TM_MMA_STG_D; /* [token][32 e] */
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                if (j == 0 || two)
                    wmma::store_matrix_sync(stg + 16 * j * TM_MMA_STG_D + 16 * i, acc[i][j],
                                            TM_MMA_STG_D, wmma::mem_col_major);
        __syncwarp();
        int32_t tok = -1;
        float wt = 0.0f;
        if (lane < nt) {
            const int32_t it = a.rowmap[r0 + t0 + lane];
            if (it >= 0) {
                const tm_cuda_moe_item m = a.items[it];
                if (tm_moe_item_valid(m, a.n_slots, a.n_tok, a.ext)) tok = m.token, wt = m.weight;
            }
        }
        float *yc = a.y + wr0 + a0 + lane;
        const float db = ex >= 0 ? tm_moe_ext_down(a.ext, ex, wr0 + a0 + lane, a.rows) : 0.0f;
        for (int t = 0; t < nt; t++) {
            const int32_t tt = __shfl_sync(0xffffffffu, tok, t);
            const float wv = __shfl_sync(0xffffffffu, wt, t);
            if (tt >= 0)
                atomicAdd(yc + (int64_t)tt * a.rows, wv * (stg[t * TM_MMA_STG_D + lane] + db));
        }
    }
}

/* ---- host ---- */

/* The kernels' view of one matrix; false when the fused path cannot take it. */
static bool tm_mma_src_make(const tm_cuda_moe_matrix *m, int64_t rows, int64_t k, int32_t n_slots,
                            tm_mma_src *o) {
    int64_t need;
    size_t esz;
    switch (m->type) {
    case TM_TYPE_F32:
    case TM_TYPE_F16:
    case TM_TYPE_BF16:
        return false; /* float rows: a 256-value chunk would need 64-128 KiB of raw rows */
    default:
        /* the block types tm_dq8_f16 decodes (cuda_args.h), q4_K ... iq1_m: at most
           272 raw bytes (q8_0) a 256-value chunk */
        need = cuda_weight_block(m->type, &esz);
        if (need != 32 && need != 256) return false;
        break;
    }
    if (k <= 0 || k % need || k % TM_MMA_KS || rows <= 0 || rows % 32 || n_slots <= 0) return false;
    const tm_type_traits *tr = quant_type_traits((uint32_t)m->type);
    if (!tr || tr->block_size <= 0 || TM_MMA_KC % tr->block_size) return false;
    const int64_t n_chunks = (k + TM_MMA_KC - 1) / TM_MMA_KC;
    const size_t full = quant_row_size(m->type, k < TM_MMA_KC ? k : TM_MMA_KC);
    const size_t last = quant_row_size(m->type, k - (n_chunks - 1) * TM_MMA_KC);
    const uintptr_t g = (uintptr_t)m->data | (uintptr_t)m->row_bytes | (uintptr_t)m->expert_stride |
                        (uintptr_t)full | (uintptr_t)last;
    const int vec = g % 16 == 0 ? 16 : g % 8 == 0 ? 8 : 4;
    const bool window = g % 4 != 0;
    if (window) {
        /* whole aligned words around each chunk: they stay inside [data, end)
         * when both ends are word-aligned */
        const uintptr_t end = (uintptr_t)m->data + (uintptr_t)(n_slots - 1) * m->expert_stride +
                              (uintptr_t)rows * m->row_bytes;
        if ((uintptr_t)m->data % 4 || end % 4) return false;
    }
    o->data = (const uint8_t *)m->data;
    o->expert_stride = m->expert_stride, o->row_bytes = m->row_bytes;
    o->type = (int)m->type, o->block_vals = (int)tr->block_size,
    o->block_bytes = (int)tr->type_size;
    o->vec = vec;
    o->units = (int)((full + (window ? 3 : 0) + (size_t)vec - 1) / (size_t)vec);
    return true;
}

typedef struct tm_mma_plan {
    tm_mma_src gate, up, down;
} tm_mma_plan;

static bool tm_mma_plan_make(const tm_cuda_moe_params *p, tm_mma_plan *pl) {
    return p->n_embd <= 0x7fffffffLL && p->n_ff <= 0x7fffffffLL &&
           tm_mma_src_make(&p->gate, p->n_ff, p->n_embd, p->n_slots, &pl->gate) &&
           tm_mma_src_make(&p->up, p->n_ff, p->n_embd, p->n_slots, &pl->up) &&
           tm_mma_src_make(&p->down, p->n_embd, p->n_ff, p->n_slots, &pl->down);
}

bool tm_moe_mma_supported(const tm_cuda_moe_params *p) {
    tm_mma_plan pl;
    return tm_mma_plan_make(p, &pl);
}

static int tm_mma_raw_stride(const tm_mma_src *x, const tm_mma_src *y) {
    const int a = x->units * x->vec, b = y->units * y->vec;
    return ((a > b ? a : b) + 15) & ~15;
}

/* Launch one kernel over all tiles (grid.y at most 65535 a launch). */
template <bool DOWN>
static tm_status tm_mma_launch(const char *op, tm_mma_args a, int64_t n_tiles, int64_t row_tiles,
                               cudaStream_t stream) {
    const size_t tiles_smem = (size_t)TM_MMA_TILE_BYTES + (size_t)2 * TM_MMA_WROWS * a.raw_stride;
    const size_t smem = tiles_smem > TM_MMA_STG_BYTES ? tiles_smem : TM_MMA_STG_BYTES;
    cudaError_t e = cudaFuncSetAttribute(tm_moe_mma_kernel<DOWN>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return tm_error_set(TM_ERR_DEVICE, "%s: %zu bytes of shared memory a block refused: %s", op,
                            smem, cudaGetErrorString(e));
    const int32_t *tiles = a.tiles;
    for (int64_t t = 0; t < n_tiles; t += 65535) {
        const int64_t n = n_tiles - t < 65535 ? n_tiles - t : 65535;
        a.tiles = tiles + 3 * t;
        const dim3 grid((unsigned)row_tiles, (unsigned)n);
        tm_moe_mma_kernel<DOWN><<<grid, TM_MMA_THREADS, smem, stream>>>(a);
        tm_status st = tm_cuda_launch_check(op, row_tiles, n, a.k);
        if (st != TM_OK) return st;
    }
    return TM_OK;
}

tm_status tm_moe_mma_run(const tm_cuda_moe_params *p, const tm_moe_mma_work *w,
                         cudaStream_t stream) {
    tm_mma_plan pl;
    if (!tm_mma_plan_make(p, &pl))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_moe_grouped_gemm: the fused path cannot take %s/%s/%s",
                            quant_type_name(p->gate.type), quant_type_name(p->up.type),
                            quant_type_name(p->down.type));
    if (w->n_tiles <= 0) return TM_OK;
    const int64_t E = p->n_embd, F = p->n_ff;
    if ((F + 63) / 64 > 65535 || (E + 127) / 128 > 65535)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_moe_grouped_gemm: n_embd %lld, n_ff %lld: too many "
                            "row tiles for the fused kernels",
                            (long long)E, (long long)F);
    tm_mma_args a;
    a.slots = w->slots, a.tiles = w->tiles, a.rowmap = w->rowmap, a.items = w->items;
    a.n_slots = p->n_slots, a.n_tok = w->n_tok, a.h = w->h, a.y = w->y;
    a.ext = p->ext, a.n_ff = F;

    a.w[0] = pl.gate, a.w[1] = pl.up, a.rows = F, a.k = E, a.act = w->xg;
    a.raw_stride = tm_mma_raw_stride(&pl.gate, &pl.up);
    tm_status st = tm_mma_launch<false>("cuda_moe_grouped_gemm gate/up (fused)", a, w->n_tiles,
                                        (F + 63) / 64, stream);
    if (st != TM_OK) return st;
    a.w[0] = a.w[1] = pl.down, a.rows = E, a.k = F, a.act = w->h;
    a.raw_stride = tm_mma_raw_stride(&pl.down, &pl.down);
    return tm_mma_launch<true>("cuda_moe_grouped_gemm down (fused)", a, w->n_tiles, (E + 127) / 128,
                               stream);
}
