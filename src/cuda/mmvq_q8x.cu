/* q8_0 (and q4_K) matrix × 8-bit activations for decode batches
 * (mmvq_q8x.cuh; the low-bit types go to mmvq_lbx.cu), and the activation quantizer. Launch shape as mmvq.cu's fast path: a warp computes
 * R = 4 rows (TIERMOE_Q8X_R=2: 2 for 3+ tokens), TM_FAST_WARPS warps a block split rows
 * or the k steps of a row group. */
#include <stdlib.h>

#include "cuda/mmvq_lbx.cuh"

/* One warp per 32 values: n_tok * k is a multiple of 32, so a warp is one
 * block of one token. */
__global__ void __launch_bounds__(256)
    tm_q8x_quantize_kernel(const float *__restrict__ x, int64_t n, int8_t *__restrict__ q,
                           float *__restrict__ d) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return; /* whole warps: n % 32 == 0 */
    const float v = x[i];
    const float amax = tm_warp_max(fabsf(v));
    const float dv = amax / 127.0f, id = dv != 0.0f ? 1.0f / dv : 0.0f;
    q[i] = (int8_t)__float2int_rn(v * id);
    if ((threadIdx.x & 31) == 0) d[i / 32] = dv;
}

tm_status tm_q8x_quantize_n(const float *x, int64_t n, int8_t *q, float *d, cudaStream_t stream) {
    tm_q8x_quantize_kernel<<<(unsigned)tm_cdiv(n, 256), 256, 0, stream>>>(x, n, q, d);
    return tm_cuda_launch_check("q8x quantize", n, 1, 1);
}

extern "C" tm_status cuda_q8x_quantize(const float *x, int64_t k, int64_t n_tok, void *xq,
                                       tm_cuda_stream stream) {
    tm_status st = cuda_q8x_quantize_args_check(x, k, n_tok, xq);
    if (st != TM_OK) return st;
    const int64_t n = n_tok * k;
    int8_t *q = (int8_t *)xq;
    return tm_q8x_quantize_n(x, n, q, (float *)(q + n), stream);
}

extern "C" tm_status cuda_mmvq_q8x(tm_type type, const void *w, size_t row_bytes, int64_t rows,
                                   int64_t k, const void *xq, int64_t n_tok, float *y,
                                   tm_cuda_stream stream) {
    tm_status st = cuda_mmvq_q8x_args_check(type, w, row_bytes, rows, k, xq, n_tok);
    if (st != TM_OK) return st;
    const bool q4k = type == TM_TYPE_Q4_K;
    const tm_q8x_view x = tm_q8x_at(xq, k, n_tok);
    const uint8_t *wb = (const uint8_t *)w;
    if (!q4k && type != TM_TYPE_Q8_0)
        return tm_mmvq_lbx(type, wb, row_bytes, rows, k, x, (int)n_tok, y, stream);
    /* rows a warp computes: with 3 or more tokens the activations are most of
     * what a warp loads, and each activation load serves R rows. H200, 30b-a3b
     * -ngl all, 8 sequences: tg64 x8 854 t/s with R = 2, 910 with 4 (2 for 3+
     * tokens before; TIERMOE_Q8X_R=2 brings it back, for comparisons) */
    static int r_many; /* 0: not read yet */
    if (!r_many) {
        const char *e = getenv("TIERMOE_Q8X_R");
        r_many = e && atoi(e) == 2 ? 2 : 4;
    }
    const int nt = (int)n_tok, R = nt <= 2 ? 4 : r_many;
    const int64_t groups = tm_cdiv(rows, R);
    const int ks = tm_fast_ksplit(groups, q4k ? tm_q4k::steps(k) : tm_q8x_steps(k));
    const dim3 grid((unsigned)tm_cdiv(groups, TM_FAST_WARPS / ks)),
        block(TM_FAST_WARPS * TM_CUDA_WARP);
    cudaStream_t s = stream;
#define TM_Q8X_LAUNCH(NT, R)                                                                       \
    (q4k ? tm_mmvq_q8x_kernel<TM_TYPE_Q4_K, NT, R>                                                 \
         <<<grid, block, 0, s>>>(wb, row_bytes, rows, x, nt, ks, y)                                \
         : tm_mmvq_q8x_kernel<TM_TYPE_Q8_0, NT, R>                                                 \
         <<<grid, block, 0, s>>>(wb, row_bytes, rows, x, nt, ks, y))
    if (nt == 1)
        TM_Q8X_LAUNCH(1, 4);
    else if (nt == 2)
        TM_Q8X_LAUNCH(2, 4);
    else if (nt <= 4)
        R == 4 ? TM_Q8X_LAUNCH(4, 4) : TM_Q8X_LAUNCH(4, 2);
    else
        R == 4 ? TM_Q8X_LAUNCH(8, 4) : TM_Q8X_LAUNCH(8, 2);
#undef TM_Q8X_LAUNCH
    return tm_cuda_launch_check("cuda_mmvq_q8x", rows, k, n_tok);
}
