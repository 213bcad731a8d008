/* Quantized matrix × vector for decode batches (1..8 tokens).
 *
 * Fast path (mmvq_fast.cuh: q4_K, q8_0, mxfp4, f32, f16, bf16 with aligned rows):
 * the type and the token count are template parameters chosen once per
 * launch; a warp computes R rows (4 for 1-2 tokens, else 2) so each
 * activation load serves R rows; the TM_FAST_WARPS warps of a block split
 * either rows (large matrices) or the k steps of one row group (small ones,
 * e.g. the 512-row k/v projections), summed through shared memory.
 *
 * Generic path (the other types, unaligned rows): one warp per output row,
 * TM_MMVQ_WARPS rows per block, the per-type code of mmvq.cuh.
 *
 * Bandwidth: every weight byte is read once per launch, whatever n_tok; the
 * activations (n_tok * k floats, a few KiB) stay in L1/L2. */
#include "cuda/mmvq_fast.cuh"

#define TM_MMVQ_WARPS 4 /* generic path: warps (rows) per block */

/* Generic path. NT (the token count) is a template constant so the unused
 * accumulators and their branches fold away. */
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

/* Fast path: R rows per warp, TM_FAST_WARPS / ksplit row groups per block. */
template <int TYPE, int NT>
__global__ void __launch_bounds__(TM_FAST_WARPS *TM_CUDA_WARP)
    tm_mmvq_fast_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows, int64_t k,
                        const float *__restrict__ x, int n_tok, int ksplit, float *__restrict__ y) {
    constexpr int R = NT <= 2 ? 4 : 2;
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1), warp = threadIdx.x >> 5;
    const uint8_t *rp[R];
    const int64_t r0 = tm_fast_group<R>(rp, w, row_bytes, rows, warp, ksplit);
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    tm_fast_rows<TYPE, NT, R>(acc, rp, k, x, k, n_tok, lane, warp % ksplit, ksplit);
    tm_fast_store<NT, R>(acc, r0, rows, n_tok, warp, lane, ksplit, y);
}

template <int TYPE>
static void tm_mmvq_fast_launch(const uint8_t *w, size_t row_bytes, int64_t rows, int64_t k,
                                const float *x, int n_tok, float *y, cudaStream_t stream) {
    const int R = n_tok <= 2 ? 4 : 2;
    const int64_t groups = tm_cdiv(rows, R);
    const int ks = tm_fast_ksplit(groups, tm_fast_steps((tm_type)TYPE, k));
    const dim3 grid((unsigned)tm_cdiv(groups, TM_FAST_WARPS / ks)),
        block(TM_FAST_WARPS * TM_CUDA_WARP);
    if (n_tok == 1)
        tm_mmvq_fast_kernel<TYPE, 1>
            <<<grid, block, 0, stream>>>(w, row_bytes, rows, k, x, n_tok, ks, y);
    else if (n_tok == 2)
        tm_mmvq_fast_kernel<TYPE, 2>
            <<<grid, block, 0, stream>>>(w, row_bytes, rows, k, x, n_tok, ks, y);
    else if (n_tok <= 4)
        tm_mmvq_fast_kernel<TYPE, 4>
            <<<grid, block, 0, stream>>>(w, row_bytes, rows, k, x, n_tok, ks, y);
    else
        tm_mmvq_fast_kernel<TYPE, 8>
            <<<grid, block, 0, stream>>>(w, row_bytes, rows, k, x, n_tok, ks, y);
}

extern "C" tm_status cuda_mmvq(tm_type type, const void *w, size_t row_bytes, int64_t rows,
                               int64_t k, const float *x, int64_t n_tok, float *y,
                               tm_cuda_stream stream) {
    tm_status st = cuda_mmvq_args_check(type, w, row_bytes, rows, k, x, n_tok);
    if (st != TM_OK) return st;
    const bool vec16 = tm_mmvq_vec16(w, row_bytes);
    const uint8_t *wb = (const uint8_t *)w;
    if (tm_fast_ok(type, (uintptr_t)w | row_bytes, k)) {
        const int nt = (int)n_tok;
        switch (type) {
        case TM_TYPE_Q4_K:
            tm_mmvq_fast_launch<TM_TYPE_Q4_K>(wb, row_bytes, rows, k, x, nt, y, stream);
            break;
        case TM_TYPE_Q8_0:
            tm_mmvq_fast_launch<TM_TYPE_Q8_0>(wb, row_bytes, rows, k, x, nt, y, stream);
            break;
        case TM_TYPE_MXFP4:
            tm_mmvq_fast_launch<TM_TYPE_MXFP4>(wb, row_bytes, rows, k, x, nt, y, stream);
            break;
        case TM_TYPE_F32:
            tm_mmvq_fast_launch<TM_TYPE_F32>(wb, row_bytes, rows, k, x, nt, y, stream);
            break;
        case TM_TYPE_F16:
            tm_mmvq_fast_launch<TM_TYPE_F16>(wb, row_bytes, rows, k, x, nt, y, stream);
            break;
        default:
            tm_mmvq_fast_launch<TM_TYPE_BF16>(wb, row_bytes, rows, k, x, nt, y, stream);
            break;
        }
        return tm_cuda_launch_check("cuda_mmvq", rows, k, n_tok);
    }
    const int64_t blocks = (rows + TM_MMVQ_WARPS - 1) / TM_MMVQ_WARPS;
    const dim3 grid((unsigned)blocks), block(TM_MMVQ_WARPS * TM_CUDA_WARP);
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
