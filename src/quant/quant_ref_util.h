/* Small helpers shared by the scalar reference quantizers (quant_ref*.c only).
 *
 * Every helper is safe on any float input, NaN and infinities included: values
 * are clamped with comparisons that send NaN to the low end before any
 * float-to-int step, so no input can reach undefined behaviour. */
#ifndef TM_QUANT_QUANT_REF_UTIL_H
#define TM_QUANT_QUANT_REF_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/quant.h"

/* Floating-point contraction (a*b - c as one FMA) would change dequantized
 * values in the last bit and break bit-equality with ggml and the gguf
 * package, which round the product before the subtraction. ISO C mode in GCC
 * already turns contraction off; this keeps it off under GNU mode and clang. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Largest finite half. */
#define TM_HALF_MAX 65504.0f

/* v clamped to [lo, hi]; NaN gives lo. */
static inline float quant_clampf(float v, float lo, float hi) {
    v = v > lo ? v : lo;
    return v < hi ? v : hi;
}

/* Round to nearest, ties to even, for |v| < 2^22 (ggml's nearest_int). */
static inline int quant_nearest_int(float v) {
    float val = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &val, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Smallest integer >= v for v in [0, 2^22]; callers clamp first. */
static inline int quant_ceil_int(float v) {
    int i = (int)v;
    return i + ((float)i < v);
}

/* The smallest half >= x, for x > 0; 0 for x <= 0 or NaN; saturates at the
 * largest finite half. K-quant scales round up with it so that the range a
 * sub-block needs is always covered (no clipping, see docs/quant.md). */
static inline tm_half quant_f16_ceil(float x) {
    if (!(x > 0.0f)) return 0;
    if (x >= TM_HALF_MAX) return 0x7bff;
    tm_half h = quant_f32_to_f16(x);
    if (quant_f16_to_f32(h) < x) h++; /* positive halves are ordered like their bits */
    return h;
}

/* The first of n values of largest magnitude (0 when all are 0; NaNs are
 * skipped); its magnitude in *amax. */
static inline float quant_signed_absmax(const float *x, int n, float *amax) {
    float a = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (a < fabsf(x[j])) {
            a = fabsf(x[j]);
            max = x[j];
        }
    }
    *amax = a;
    return max;
}

/* Half nearest to x, saturating at +-65504 instead of becoming infinite. */
static inline tm_half quant_f16_sat(float x) {
    return quant_f32_to_f16(quant_clampf(x, -TM_HALF_MAX, TM_HALF_MAX));
}

#endif
