/* Test kernels for check_lbx.c: each thread unpacks one unit with
 * tm_lbx<TYPE>::unit (every type of TM_CUDA_LBX_TYPES) and decodes the same 32 values
 * with tm_lb<TYPE>::dq8, the f32 decoders check_dequant proves bit-exact. */
#include "cuda/cuda_common.cuh"
#include "cuda/lbx_unit_iq.cuh"
#include "cuda/lbx_unit_k.cuh"

#include "check_lbx.h"

#define CHECK_LBX_THREADS 128

template <int TYPE>
__global__ void __launch_bounds__(CHECK_LBX_THREADS)
    check_lbx_kernel(const uint8_t *__restrict__ w, size_t stride, int64_t n_units,
                     check_lbx_unit *__restrict__ units, float *__restrict__ dq) {
    constexpr int UPB = tm_lbx<TYPE>::BS / 32; /* units a block */
    const int64_t u = (int64_t)blockIdx.x * CHECK_LBX_THREADS + threadIdx.x;
    if (u >= n_units) return;
    const uint8_t *bp = w + (u / UPB) * stride;
    const int j = (int)(u % UPB);
    tm_lbx_unit x;
    tm_lbx<TYPE>::unit(x, bp, j);
    check_lbx_unit *o = units + u;
#pragma unroll
    for (int i = 0; i < 8; i++) o->q[i] = x.q[i];
    o->d[0] = x.d[0], o->d[1] = x.d[1], o->m[0] = x.m[0], o->m[1] = x.m[1];
#pragma unroll
    for (int g = 0; g < 4; g++) tm_lb<TYPE>::dq8(bp, 32 * j + 8 * g, dq + 32 * u + 8 * g);
}

extern "C" bool check_lbx_has(tm_type type, bool *min) {
    switch (type) {
#define CHECK_LBX_HAS(T)                                                                           \
    case T:                                                                                        \
        *min = tm_lbx<T>::MIN;                                                                     \
        return true;
        TM_CUDA_LBX_TYPES(CHECK_LBX_HAS)
#undef CHECK_LBX_HAS
    default:
        return false;
    }
}

template <int TYPE>
static tm_status check_lbx_run(const uint8_t *w, size_t stride, int64_t n_blocks,
                               check_lbx_unit *units, float *dq, cudaStream_t stream) {
    const int64_t n = n_blocks * (tm_lbx<TYPE>::BS / 32);
    const unsigned grid = (unsigned)((n + CHECK_LBX_THREADS - 1) / CHECK_LBX_THREADS);
    if (n > 0)
        check_lbx_kernel<TYPE><<<grid, CHECK_LBX_THREADS, 0, stream>>>(w, stride, n, units, dq);
    return tm_cuda_launch_check("check_lbx_units", n_blocks, (int64_t)stride, TYPE);
}

extern "C" tm_status check_lbx_units(tm_type type, const void *w, size_t stride, int64_t n_blocks,
                                     check_lbx_unit *units, float *dq, tm_cuda_stream stream) {
    const uint8_t *wb = (const uint8_t *)w;
    switch (type) {
#define CHECK_LBX_RUN(T)                                                                           \
    case T:                                                                                        \
        return check_lbx_run<T>(wb, stride, n_blocks, units, dq, stream);
        TM_CUDA_LBX_TYPES(CHECK_LBX_RUN)
#undef CHECK_LBX_RUN
    default:
        return tm_error_set(TM_ERR_ARG, "check_lbx_units: type %d has no 8-bit unpacker",
                            (int)type);
    }
}
