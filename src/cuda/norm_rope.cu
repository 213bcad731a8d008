/* Element-wise ops of the layer around the products: RMSNorm over rows,
 * NeoX RoPE from a position list, residual add. Same math as cpu_rmsnorm,
 * cpu_rope_table + cpu_rope_neox_table and a plain add (src/cpu/cpu_ops.c).
 * These are a few hundred KiB per layer and step; they are written to be
 * simple and bounded, not tuned. */
#include <math.h>

#include "cuda/cuda_args.h"
#include "cuda/cuda_common.cuh"

#define TM_NORM_THREADS     256
#define TM_NORM_VEC_THREADS 512 /* vector path: one float4 a thread at n = 2048 */
#define TM_NORM_VEC_MAX     4   /* float4s a thread keeps in registers: n <= 8192 */

/* Block-wide sum for the norm kernels (every thread gets the total). */
template <int THREADS> static __device__ __forceinline__ float tm_block_sum(float s) {
    __shared__ float part[THREADS / TM_CUDA_WARP];
    s = tm_warp_sum(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < THREADS / TM_CUDA_WARP; i++) tot += part[i];
    return tot;
}

/* One block per row, any n: a block-wide sum of squares, then scale (and
 * gain). ADD: x[r] += a[r] first (each thread adds, then reads back, only its
 * own elements). y may alias x: each element is read then written by the same
 * thread, after the barrier that ended every read of the sum. */
template <bool ADD>
__global__ void __launch_bounds__(TM_NORM_THREADS)
    tm_rmsnorm_kernel(float *y, float *x, const float *a, const float *__restrict__ w, int64_t n,
                      float eps) {
    float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += TM_NORM_THREADS) {
        float v = xr[i];
        if (ADD) xr[i] = v = v + a[(int64_t)blockIdx.x * n + i];
        s += v * v;
    }
    const float scale = 1.0f / sqrtf(tm_block_sum<TM_NORM_THREADS>(s) / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += TM_NORM_THREADS)
        yr[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
}

/* n % 4 == 0 and n <= 4 * TM_NORM_VEC_THREADS * TM_NORM_VEC_MAX: the row is
 * read once, in float4s kept in registers (a decode step's norm is a few KiB:
 * its time is the latency of its loads, so there is one round of them). */
template <bool ADD>
__global__ void __launch_bounds__(TM_NORM_VEC_THREADS)
    tm_rmsnorm_vec_kernel(float *y, float *x, const float *a, const float *__restrict__ w,
                          int64_t n, float eps) {
    const int64_t n4 = n / 4, row = (int64_t)blockIdx.x * n4;
    float4 *x4 = (float4 *)x + row, *y4 = (float4 *)y + row;
    float4 v[TM_NORM_VEC_MAX];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < TM_NORM_VEC_MAX; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * TM_NORM_VEC_THREADS;
        if (i >= n4) break;
        v[j] = x4[i];
        if (ADD) {
            const float4 b = ((const float4 *)a)[row + i];
            v[j].x += b.x, v[j].y += b.y, v[j].z += b.z, v[j].w += b.w;
            x4[i] = v[j];
        }
        s += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    const float scale = 1.0f / sqrtf(tm_block_sum<TM_NORM_VEC_THREADS>(s) / (float)n + eps);
#pragma unroll
    for (int j = 0; j < TM_NORM_VEC_MAX; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * TM_NORM_VEC_THREADS;
        if (i >= n4) break;
        float4 o = v[j];
        o.x *= scale, o.y *= scale, o.z *= scale, o.w *= scale;
        if (w) {
            const float4 g = ((const float4 *)w)[i];
            o.x *= g.x, o.y *= g.y, o.z *= g.z, o.w *= g.w;
        }
        y4[i] = o;
    }
}

template <bool ADD>
static tm_status tm_rmsnorm_launch(const char *op, float *y, float *x, const float *a,
                                   const float *w, int64_t n_rows, int64_t n, float eps,
                                   cudaStream_t stream) {
    tm_status st = cuda_rmsnorm_args_check(op, n_rows, n);
    if (st != TM_OK) return st;
    const bool vec = n % 4 == 0 && n <= 4LL * TM_NORM_VEC_THREADS * TM_NORM_VEC_MAX &&
                     (((uintptr_t)y | (uintptr_t)x | (uintptr_t)a | (uintptr_t)w) & 15) == 0;
    if (vec)
        tm_rmsnorm_vec_kernel<ADD>
            <<<(unsigned)n_rows, TM_NORM_VEC_THREADS, 0, stream>>>(y, x, a, w, n, eps);
    else
        tm_rmsnorm_kernel<ADD>
            <<<(unsigned)n_rows, TM_NORM_THREADS, 0, stream>>>(y, x, a, w, n, eps);
    return tm_cuda_launch_check(op, n_rows, n, 1);
}

extern "C" tm_status cuda_rmsnorm(float *y, const float *x, const float *w, int64_t n_rows,
                                  int64_t n, float eps, tm_cuda_stream stream) {
    /* x is only read without ADD */
    return tm_rmsnorm_launch<false>("cuda_rmsnorm", y, (float *)x, NULL, w, n_rows, n, eps, stream);
}

extern "C" tm_status cuda_add_rmsnorm(float *x, const float *a, float *h, const float *w,
                                      int64_t n_rows, int64_t n, float eps, tm_cuda_stream stream) {
    return tm_rmsnorm_launch<true>("cuda_add_rmsnorm", h, x, a, w, n_rows, n, eps, stream);
}

/* One thread per rotated pair (token, head, i < d/2). Angles in double like
 * cpu_rope_table: at positions in the tens of thousands, float angles lose
 * the low bits the rotation depends on. */
__global__ void tm_rope_neox_kernel(float *x, const int32_t *__restrict__ pos, int64_t n_tok,
                                    int64_t n_head, int64_t head_dim, float base) {
    const int64_t half = head_dim / 2;
    const int64_t total = n_tok * n_head * half;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < total;
         g += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = g % half, th = g / half; /* th = token * n_head + head */
        const int64_t t = th / n_head;
        const double theta =
            (double)pos[t] * pow((double)base, -2.0 * (double)i / (double)head_dim);
        const float c = (float)cos(theta), s = (float)sin(theta);
        float *xh = x + th * head_dim;
        const float a = xh[i], b = xh[i + half];
        xh[i] = a * c - b * s;
        xh[i + half] = a * s + b * c;
    }
}

extern "C" tm_status cuda_rope_neox(float *x, const int32_t *pos, int64_t n_tok, int64_t n_head,
                                    int64_t head_dim, float base, tm_cuda_stream stream) {
    tm_status st = cuda_rope_neox_args_check(n_tok, n_head, head_dim);
    if (st != TM_OK) return st;
    const int64_t total = n_tok * n_head * (head_dim / 2);
    int64_t blocks = (total + 255) / 256;
    if (blocks > 65536) blocks = 65536; /* grid-stride loop covers the rest */
    tm_rope_neox_kernel<<<(unsigned)blocks, 256, 0, stream>>>(x, pos, n_tok, n_head, head_dim,
                                                              base);
    return tm_cuda_launch_check("cuda_rope_neox", n_tok, n_head, head_dim);
}

__global__ void tm_add_kernel(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

__global__ void tm_add_bias_kernel(float *y, const float *b, int64_t n_rows, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_rows * n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += b[i % n];
}

extern "C" tm_status cuda_add_bias(float *y, const float *b, int64_t n_rows, int64_t n,
                                   tm_cuda_stream stream) {
    tm_status st = cuda_add_bias_args_check(n_rows, n);
    if (st != TM_OK || n_rows == 0) return st;
    int64_t blocks = (n_rows * n + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    tm_add_bias_kernel<<<(unsigned)blocks, 256, 0, stream>>>(y, b, n_rows, n);
    return tm_cuda_launch_check("cuda_add_bias", n_rows, n, 1);
}

extern "C" tm_status cuda_add(float *y, const float *a, const float *b, int64_t n,
                              tm_cuda_stream stream) {
    tm_status st = cuda_add_args_check(n);
    if (st != TM_OK || n == 0) return st;
    int64_t blocks = (n + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    tm_add_kernel<<<(unsigned)blocks, 256, 0, stream>>>(y, a, b, n);
    return tm_cuda_launch_check("cuda_add", n, 1, 1);
}
