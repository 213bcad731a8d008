/* Element-wise ops of the dense layers (Gemma 4's embedding and residual scales, its
 * final logit soft-cap and the dense MLP's GELU-tanh gate), so those steps keep their
 * activations on the GPU (a step without a host round trip can be captured as a graph).
 * Grid-stride loops (cuda_common.cuh); the arithmetic is the CPU's
 * (cpu_geglu; the soft-cap as exec_softcap), in float. */
#include <math.h>

#include "cuda/cuda_args.h"
#include "cuda/cuda_common.cuh"

__global__ void tm_scale_kernel(float *x, float s, int64_t n) {
    TM_EW_LOOP(i, n) x[i] *= s;
}

__global__ void tm_softcap_kernel(float *x, float cap, int64_t n) {
    TM_EW_LOOP(i, n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void tm_geglu_kernel(float *y, const float *g, const float *u, int64_t n) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    TM_EW_LOOP(i, n) {
        const float x = g[i];
        y[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

extern "C" tm_status cuda_scale(float *x, float s, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_ew_args_check("cuda_scale", n, 1.0f);
    if (st != TM_OK || n == 0) return st;
    tm_scale_kernel<<<tm_ew_blocks(n), 256, 0, stream>>>(x, s, n);
    return tm_cuda_launch_check("cuda_scale", n, 1, 1);
}

extern "C" tm_status cuda_softcap(float *x, float cap, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_ew_args_check("cuda_softcap", n, cap);
    if (st != TM_OK || n == 0) return st;
    tm_softcap_kernel<<<tm_ew_blocks(n), 256, 0, stream>>>(x, cap, n);
    return tm_cuda_launch_check("cuda_softcap", n, 1, 1);
}

extern "C" tm_status cuda_geglu(float *y, const float *g, const float *u, int64_t n,
                                tm_cuda_stream stream) {
    tm_status st = cuda_ew_args_check("cuda_geglu", n, 1.0f);
    if (st != TM_OK || n == 0) return st;
    tm_geglu_kernel<<<tm_ew_blocks(n), 256, 0, stream>>>(y, g, u, n);
    return tm_cuda_launch_check("cuda_geglu", n, 1, 1);
}
