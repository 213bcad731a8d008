/* The expert's activation and biases (tm_cuda_moe_ext) as every grouped
 * expert kernel applies them: moe_grouped.cu (decode), moe_mma.cu (fused
 * prompt), moe_gemm.cu (dequantize-then-cuBLAS prompt), and the emulation
 * harness (tests/emu) that runs them on the CPU. The arithmetic is the CPU
 * lane's (moe_experts_act: cpu_swiglu / cpu_swiglu_oai / cpu_geglu after the biases;
 * the down bias times the routing weight), so all lanes agree to rounding. */
#ifndef TM_CUDA_MOE_EXT_CUH
#define TM_CUDA_MOE_EXT_CUH

#include "core/status.h"
#include "cuda/cuda.h"

static __host__ __device__ __forceinline__ bool tm_moe_ext_biased(const tm_cuda_moe_ext &x) {
    return x.gate_bias || x.up_bias || x.down_bias;
}

/* An item the kernels compute: its slot, token and (with biases) expert id in range. */
static __host__ __device__ __forceinline__ bool tm_moe_item_valid(const tm_cuda_moe_item &it,
                                                                  int32_t n_slots, int64_t n_tok,
                                                                  const tm_cuda_moe_ext &x) {
    return it.slot >= 0 && it.slot < n_slots && it.token >= 0 && it.token < n_tok &&
           (!tm_moe_ext_biased(x) || (it.expert >= 0 && it.expert < x.n_expert));
}

/* h = act(g + gate_bias[expert][f], u + up_bias[expert][f]) (expert valid when biased). */
static __host__ __device__ __forceinline__ float
tm_moe_ext_h(const tm_cuda_moe_ext &x, int32_t expert, int64_t f, int64_t n_ff, float g, float u) {
    if (x.gate_bias) g += x.gate_bias[(int64_t)expert * n_ff + f];
    if (x.up_bias) u += x.up_bias[(int64_t)expert * n_ff + f];
    if (x.act == TM_CUDA_MOE_SWIGLU_OAI) {
        const float gc = g > x.limit ? x.limit : g; /* NaN stays NaN, as cpu_swiglu_oai */
        const float uc = u < -x.limit ? -x.limit : u > x.limit ? x.limit : u;
        return gc / (1.0f + expf(-x.alpha * gc)) * (uc + 1.0f);
    }
    if (x.act == TM_CUDA_MOE_GEGLU) /* as cpu_geglu */
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    return g / (1.0f + expf(-g)) * u; /* as cpu_swiglu */
}

/* down_bias[expert][e], or 0. */
static __host__ __device__ __forceinline__ float
tm_moe_ext_down(const tm_cuda_moe_ext &x, int32_t expert, int64_t e, int64_t n_embd) {
    return x.down_bias ? x.down_bias[(int64_t)expert * n_embd + e] : 0.0f;
}

#endif
