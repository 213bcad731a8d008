/* Quantized matrix × vector for decode batches (1..8 tokens): one warp per
 * output row, TM_MMVQ_WARPS rows per block. The per-type dequantize-and-dot
 * code is in mmvq.cuh (shared with the grouped expert kernel).
 *
 * Bandwidth: every weight byte is read once per launch, whatever n_tok; the
 * activations (n_tok * k floats, a few KiB) stay in L1/L2. A warp's lanes read
 * consecutive 16-byte pieces of the row, and the unrolled part loop keeps two
 * of them in flight per lane. */
#include "cuda/mmvq.cuh"

#define TM_MMVQ_WARPS 4

/* NT (the token count) is a template constant so the unused accumulators and
 * their branches fold away: at NT = 1 the kernel needs far fewer registers
 * (more warps per SM, more loads in flight) than the 8-token case. */
template <int NT>
__global__ void __launch_bounds__(TM_MMVQ_WARPS *TM_CUDA_WARP)
    tm_mmvq_kernel(int type, const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows,
                   int64_t k, bool vec16, const float *__restrict__ x, float *__restrict__ y) {
    const int n_tok = NT;
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1);
    const int64_t r = (int64_t)blockIdx.x * TM_MMVQ_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return; /* whole warp leaves together: the shuffles below stay full */
    float acc[TM_CUDA_MMVQ_MAX_TOK];
#pragma unroll
    for (int t = 0; t < TM_CUDA_MMVQ_MAX_TOK; t++) acc[t] = 0.0f;
    tm_mmvq_row_partial(type, w + r * row_bytes, k, vec16, x, k, n_tok, lane, acc);
#pragma unroll
    for (int t = 0; t < TM_CUDA_MMVQ_MAX_TOK; t++) {
        if (t < n_tok) {
            const float s = tm_warp_sum(acc[t]);
            if (lane == 0) y[t * rows + r] = s;
        }
    }
}

extern "C" tm_status cuda_mmvq(tm_type type, const void *w, size_t row_bytes, int64_t rows,
                               int64_t k, const float *x, int64_t n_tok, float *y,
                               tm_cuda_stream stream) {
    if (rows <= 0 || n_tok < 1 || n_tok > TM_CUDA_MMVQ_MAX_TOK)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_mmvq: rows %lld, n_tok %lld (want rows >= 1, 1..%d tokens)",
                            (long long)rows, (long long)n_tok, TM_CUDA_MMVQ_MAX_TOK);
    bool vec16 = false;
    tm_status st = tm_mmvq_check("cuda_mmvq", type, w, row_bytes, k, x, &vec16);
    if (st != TM_OK) return st;
    const int64_t blocks = (rows + TM_MMVQ_WARPS - 1) / TM_MMVQ_WARPS;
    if (blocks > 0x7fffffffLL)
        return tm_error_set(TM_ERR_ARG, "cuda_mmvq: %lld rows is too many", (long long)rows);
    const dim3 grid((unsigned)blocks), block(TM_MMVQ_WARPS * TM_CUDA_WARP);
    const uint8_t *wb = (const uint8_t *)w;
    switch (n_tok) {
    case 1:
        tm_mmvq_kernel<1>
            <<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k, vec16, x, y);
        break;
    case 2:
        tm_mmvq_kernel<2>
            <<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k, vec16, x, y);
        break;
    case 3:
        tm_mmvq_kernel<3>
            <<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k, vec16, x, y);
        break;
    case 4:
        tm_mmvq_kernel<4>
            <<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k, vec16, x, y);
        break;
    case 5:
        tm_mmvq_kernel<5>
            <<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k, vec16, x, y);
        break;
    case 6:
        tm_mmvq_kernel<6>
            <<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k, vec16, x, y);
        break;
    case 7:
        tm_mmvq_kernel<7>
            <<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k, vec16, x, y);
        break;
    default:
        tm_mmvq_kernel<8>
            <<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k, vec16, x, y);
        break;
    }
    return tm_cuda_launch_check("cuda_mmvq", rows, k, n_tok);
}
