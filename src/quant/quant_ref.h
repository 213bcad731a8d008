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

/* The low-bit types (quant_ref_legacy.c, quant_ref_k23.c, quant_ref_iq.c);
 * their quantizers are declared beside the dequantizers as they are written. */
#define TM_QUANT_REF_DECLARE_DEQUANT(t)                                                            \
    void quant_ref_dequantize_##t(const void *src, float *dst, int64_t n);

TM_QUANT_REF_DECLARE_DEQUANT(q4_1)
TM_QUANT_REF_DECLARE_DEQUANT(q5_0)
TM_QUANT_REF_DECLARE_DEQUANT(q5_1)
TM_QUANT_REF_DECLARE_DEQUANT(q2_k)
TM_QUANT_REF_DECLARE_DEQUANT(q3_k)
TM_QUANT_REF_DECLARE_DEQUANT(iq4_nl)
TM_QUANT_REF_DECLARE_DEQUANT(iq4_xs)
TM_QUANT_REF_DECLARE_DEQUANT(iq2_xxs)
TM_QUANT_REF_DECLARE_DEQUANT(iq2_xs)
TM_QUANT_REF_DECLARE_DEQUANT(iq2_s)
TM_QUANT_REF_DECLARE_DEQUANT(iq3_xxs)
TM_QUANT_REF_DECLARE_DEQUANT(iq3_s)
TM_QUANT_REF_DECLARE_DEQUANT(iq1_s)
TM_QUANT_REF_DECLARE_DEQUANT(iq1_m)
TM_QUANT_REF_DECLARE_DEQUANT(tq1_0)
TM_QUANT_REF_DECLARE_DEQUANT(tq2_0)

#undef TM_QUANT_REF_DECLARE
#undef TM_QUANT_REF_DECLARE_DEQUANT

#ifdef __cplusplus
}
#endif
#endif
