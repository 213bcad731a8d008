/* The fused path of cuda_moe_grouped_gemm (moe_mma.cu): grouped expert
 * products on tensor cores that dequantize weight tiles into shared memory
 * and never write dequantized weights to global memory. Internal to
 * src/cuda; moe_gemm.cu does the host side (sorting, row map, gather) and
 * calls tm_moe_mma_run when tm_moe_mma_supported says yes.
 *
 * Work unit: a "tile" of at most TM_MOE_MMA_TILE_ROWS consecutive gathered
 * rows of one group, given as int32 triples {sorted group s, first row,
 * rows}; rows is a positive multiple of 16 (groups are padded to 16 rows). */
#ifndef TM_CUDA_MOE_MMA_CUH
#define TM_CUDA_MOE_MMA_CUH

#include <cuda_fp16.h>
#include <stdbool.h>

#include "cuda/cuda_common.cuh"

#define TM_MOE_MMA_TILE_ROWS 64

/* What the fused kernels read and write, all device pointers. */
typedef struct tm_moe_mma_work {
    const int32_t *slots;          /* [sorted group] expert slot (valid) */
    const int32_t *tiles;          /* [n_tiles][3] */
    int64_t n_tiles;               /* >= 1 */
    const int32_t *rowmap;         /* [row] item index, -1 for padding rows */
    const tm_cuda_moe_item *items; /* the caller's work list */
    int64_t n_tok;                 /* rows of y */
    const __half *xg;              /* [rows][n_embd], gathered (zeros for padding) */
    __half *h;                     /* [rows][n_ff], written here */
    float *y;                      /* [n_tok][n_embd], y[token] += weight * down(h[row]) */
} tm_moe_mma_work;

/* True when all three matrices are of a block type the kernels stage
 * (every quantized type of cuda_weight_block: q4_K q5_K q6_K q8_0 q4_0 mxfp4
 * and the low-bit types), their k is a multiple of their block (256 or 32),
 * and their rows can be copied in whole aligned 4-byte words without
 * leaving [data, data + (n_slots - 1) expert_stride + rows row_bytes).
 * The matrices are assumed checked by cuda_args.h already. */
bool tm_moe_mma_supported(const tm_cuda_moe_params *p);

/* Gate/up + SwiGLU into w->h, then down scatter-added into w->y with the
 * items' weights (atomicAdd: a token has several items). */
tm_status tm_moe_mma_run(const tm_cuda_moe_params *p, const tm_moe_mma_work *w,
                         cudaStream_t stream);

#endif
