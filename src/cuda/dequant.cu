/* Weight rows to f16 (cuda_dequantize_f16 and the internal launchers of
 * dequant.cuh used by the prompt GEMMs), and activations f32 -> f16.
 *
 * Grid: x covers the units (8 values, or 1 for float rows whose k is not a
 * multiple of 8) of one matrix, y the groups (experts) sharing the launch.
 * Bandwidth-bound: a q4_K unit reads ~4.5 bytes and writes 16; the 16-byte
 * store is one vector store when the output is 16-byte aligned. */
#include "cuda/dequant.cuh"

template <int V>
__global__ void __launch_bounds__(TM_DQ_THREADS)
    tm_dequant_f16_kernel(int type, const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows,
                          int64_t k, size_t expert_stride, const int32_t *__restrict__ slots,
                          __half *__restrict__ out, int64_t out_group_stride, bool vec_out) {
    const int64_t per_row = k / V;
    const int64_t u = (int64_t)blockIdx.x * TM_DQ_THREADS + threadIdx.x;
    if (u >= rows * per_row) return;
    const int64_t r = u / per_row, j = (u - r * per_row) * V;
    const int64_t g = blockIdx.y;
    const uint8_t *row = w + (slots ? (size_t)slots[g] * expert_stride : 0) + r * row_bytes;
    __half *o = out + g * out_group_stride + r * k + j;
    if (V == 8) {
        __align__(16) __half h[8];
        tm_dq8_f16(type, row, j, h);
        if (vec_out) {
            *(uint4 *)o = *(const uint4 *)h;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] = h[i];
        }
    } else {
        *o = tm_dq1_f16(type, row, j);
    }
}

__global__ void __launch_bounds__(TM_DQ_THREADS)
    tm_f32_to_f16_kernel(const float *__restrict__ x, int64_t n, __half *__restrict__ out) {
    const int64_t i = (int64_t)blockIdx.x * TM_DQ_THREADS + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

tm_status tm_dequant_f16_run(const char *op, tm_type type, const void *w, size_t row_bytes,
                             int64_t rows, int64_t k, size_t expert_stride, const int32_t *slots,
                             int32_t n_groups, __half *out, int64_t out_group_stride,
                             cudaStream_t stream) {
    if (rows <= 0 || n_groups <= 0) return TM_OK;
    const int v = k % 8 == 0 ? 8 : 1;
    const int64_t blocks = (rows * (k / v) + TM_DQ_THREADS - 1) / TM_DQ_THREADS;
    if (blocks > 0x7fffffffLL || n_groups > 65535)
        return tm_error_set(TM_ERR_ARG, "%s: %lld rows x %lld in %d groups is too large a grid", op,
                            (long long)rows, (long long)k, n_groups);
    const bool vec_out = ((uintptr_t)out & 15) == 0 && out_group_stride % 8 == 0;
    const dim3 grid((unsigned)blocks, (unsigned)n_groups), block(TM_DQ_THREADS);
    const uint8_t *wb = (const uint8_t *)w;
    if (v == 8)
        tm_dequant_f16_kernel<8><<<grid, block, 0, stream>>>((int)type, wb, row_bytes, rows, k,
                                                             expert_stride, slots, out,
                                                             out_group_stride, vec_out);
    else
        tm_dequant_f16_kernel<1><<<grid, block, 0, stream>>>(
            (int)type, wb, row_bytes, rows, k, expert_stride, slots, out, out_group_stride, false);
    return tm_cuda_launch_check(op, rows, k, n_groups);
}

tm_status tm_f32_to_f16_run(const char *op, const float *x, int64_t n, __half *out,
                            cudaStream_t stream) {
    if (n <= 0) return TM_OK;
    const int64_t blocks = (n + TM_DQ_THREADS - 1) / TM_DQ_THREADS;
    if (blocks > 0x7fffffffLL)
        return tm_error_set(TM_ERR_ARG, "%s: %lld activations is too many", op, (long long)n);
    tm_f32_to_f16_kernel<<<(unsigned)blocks, TM_DQ_THREADS, 0, stream>>>(x, n, out);
    return tm_cuda_launch_check(op, n, 1, 1);
}

extern "C" tm_status cuda_dequantize_f16(tm_type type, const void *w, size_t row_bytes,
                                         int64_t rows, int64_t k, void *out_f16,
                                         tm_cuda_stream stream) {
    tm_status st = cuda_dequantize_f16_args_check(type, w, row_bytes, rows, k, out_f16);
    if (st != TM_OK) return st;
    return tm_dequant_f16_run("cuda_dequantize_f16", type, w, row_bytes, rows, k, 0, NULL, 1,
                              (__half *)out_f16, 0, stream);
}
