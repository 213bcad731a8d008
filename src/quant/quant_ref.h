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

/* The low-bit types: quant_ref_legacy.c (q4_1 q5_0 q5_1 tq1_0 tq2_0),
 * quant_ref_iq4.c (iq4_nl iq4_xs), quant_ref_k23.c (q2_K q3_K) with both
 * directions; quant_ref_iq.c (the grid i-quants) dequantizes, their quantizers
 * are declared beside as they are written. */
#define TM_QUANT_REF_DECLARE_DEQUANT(t)                                                            \
    void quant_ref_dequantize_##t(const void *src, float *dst, int64_t n);

TM_QUANT_REF_DECLARE(q4_1)
TM_QUANT_REF_DECLARE(q5_0)
TM_QUANT_REF_DECLARE(q5_1)
TM_QUANT_REF_DECLARE(q2_k)
TM_QUANT_REF_DECLARE(q3_k)
TM_QUANT_REF_DECLARE(iq4_nl)
TM_QUANT_REF_DECLARE(iq4_xs)
TM_QUANT_REF_DECLARE_DEQUANT(iq2_xxs)
TM_QUANT_REF_DECLARE_DEQUANT(iq2_xs)
TM_QUANT_REF_DECLARE_DEQUANT(iq2_s)
TM_QUANT_REF_DECLARE_DEQUANT(iq3_xxs)
TM_QUANT_REF_DECLARE_DEQUANT(iq3_s)
TM_QUANT_REF_DECLARE_DEQUANT(iq1_s)
TM_QUANT_REF_DECLARE_DEQUANT(iq1_m)
TM_QUANT_REF_DECLARE(tq1_0)
TM_QUANT_REF_DECLARE(tq2_0)

#undef TM_QUANT_REF_DECLARE
#undef TM_QUANT_REF_DECLARE_DEQUANT

/* Quantizers of the grid i-quants (quant_iq_quantize.c): no importance matrix. */
void quant_ref_quantize_iq2_xxs(const float *src, void *dst, int64_t n);
void quant_ref_quantize_iq2_xs(const float *src, void *dst, int64_t n);
void quant_ref_quantize_iq2_s(const float *src, void *dst, int64_t n);
void quant_ref_quantize_iq3_xxs(const float *src, void *dst, int64_t n);
void quant_ref_quantize_iq3_s(const float *src, void *dst, int64_t n);
void quant_ref_quantize_iq1_s(const float *src, void *dst, int64_t n);
void quant_ref_quantize_iq1_m(const float *src, void *dst, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
