/* Helpers shared by the .cu files of the CUDA backend (never by C files):
 * turning CUDA errors into tm_status, and the launch check every launcher
 * ends with. */
#ifndef TM_CUDA_CUDA_COMMON_CUH
#define TM_CUDA_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/status.h"
#include "cuda/cuda.h"

/* Return TM_ERR_DEVICE naming the call and CUDA's message when `call` fails.
 * The error is taken off CUDA's last-error slot, so the next launch check
 * does not report it again as its own. */
#define TM_CUDA_TRY(call)                                                                          \
    do {                                                                                           \
        cudaError_t tm_e_ = (call);                                                                \
        if (tm_e_ != cudaSuccess) {                                                                \
            (void)cudaGetLastError();                                                              \
            return tm_error_set(TM_ERR_DEVICE, "%s:%d: %s failed: %s (error %d)", __FILE__,        \
                                __LINE__, #call, cudaGetErrorString(tm_e_), (int)tm_e_);           \
        }                                                                                          \
    } while (0)

/* After a launch: a bad configuration shows up here, not at the next sync. */
static inline tm_status tm_cuda_launch_check(const char *op, int64_t a, int64_t b, int64_t c) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return tm_error_set(TM_ERR_DEVICE, "%s launch (shape %lld x %lld x %lld) failed: %s", op,
                            (long long)a, (long long)b, (long long)c, cudaGetErrorString(e));
    return TM_OK;
}

#define TM_CUDA_WARP 32

/* Element-wise ops: grid-stride loops of at most 65536 blocks of 256 threads. */
static inline unsigned tm_ew_blocks(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b > 65536 ? 65536 : b);
}

#define TM_EW_LOOP(i, n)                                                                           \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* An f16 at p as f32; byte loads: scales of odd-sized blocks (q8_0, q6_K, the
 * low-bit types) are at most 2-byte aligned. */
static __device__ __forceinline__ float tm_ld_f16(const uint8_t *p) {
    unsigned short h = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(h));
}

/* PRMT as the hardware does it: unlike __byte_perm, bit 3 of a selector
 * nibble is kept and gives the sign of the selected byte replicated (0x00 or
 * 0xff) instead of the byte. The host emulation (tests/emu/cuda_warp_shim.h) brings its own. */
#ifndef TM_CUDA_EMU_PRMT
static __device__ __forceinline__ uint32_t tm_prmt(uint32_t lo, uint32_t hi, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(sel));
    return d;
}
#endif

static __device__ __forceinline__ float tm_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float tm_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
