/* Scalar reference dequantizers and quantizers, one pair per compute type.
 * These define the math; SIMD and CUDA versions are tested against them. */
#ifndef TM_QUANT_QUANT_REF_H
#define TM_QUANT_QUANT_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TM_QUANT_REF_DECLARE(t)                                                                    \
    void quant_ref_dequantize_##t(const void *src, float *dst, int64_t n);                         \
    void quant_ref_quantize_##t(const float *src, void *dst, int64_t n);

TM_QUANT_REF_DECLARE(f32)
TM_QUANT_REF_DECLARE(f16)
TM_QUANT_REF_DECLARE(bf16)
TM_QUANT_REF_DECLARE(q8_0)
TM_QUANT_REF_DECLARE(q4_0)
TM_QUANT_REF_DECLARE(q4_k)
TM_QUANT_REF_DECLARE(q5_k)
TM_QUANT_REF_DECLARE(q6_k)
TM_QUANT_REF_DECLARE(q8_k)
TM_QUANT_REF_DECLARE(mxfp4)

#undef TM_QUANT_REF_DECLARE

#ifdef __cplusplus
}
#endif
#endif
