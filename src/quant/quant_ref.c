/* Scalar reference dequantizers and quantizers: f32, f16, bf16, q8_0, q4_0,
 * q8_K, mxfp4 (the K-quants q4_K q5_K q6_K live in quant_ref_k.c).
 *
 * Dequantization is ggml's math operation for operation, so results are
 * bit-identical to ggml and to the gguf package's numpy code (checked by
 * tests/oracle/test_quant_oracle.py). Quantization follows ggml's reference
 * rounding for q8_0, q4_0, q8_K and mxfp4 (bit-identical to the gguf package
 * where it can quantize), except where ggml would store an infinite or
 * undefined value: scales that overflow a half saturate at 65504, and
 * non-finite reciprocals give zero codes. Error bounds: docs/quant.md.
 *
 * Block layouts (quant.h):
 *   q8_0  d:f16, qs[32]:i8                      x = d * qs[j]
 *   q4_0  d:f16, qs[16]: j in low nibbles, 16+j in high   x = d * (nib - 8)
 *   q8_K  d:f32, qs[256]:i8, bsums[16] (sums of 16 qs)    x = d * qs[j]
 *   mxfp4 e:E8M0, qs[16] like q4_0              x = 2^(e-128) * kvalues[nib]
 */
#include "quant/quant_ref.h"

#include <math.h>
#include <string.h>

#include "core/log.h"
#include "quant/quant.h"
#include "quant/quant_ref_util.h"

/* ---- f32, f16, bf16 ---- */

void quant_ref_dequantize_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void quant_ref_quantize_f32(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void quant_ref_dequantize_f16(const void *src, float *dst, int64_t n) {
    const tm_half *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(h[i]);
}

/* Round to nearest even; finite values past the half range saturate at
 * +-65504 rather than becoming infinite (IEEE and numpy would give inf). */
void quant_ref_quantize_f16(const float *src, void *dst, int64_t n) {
    tm_half *h = dst;
    for (int64_t i = 0; i < n; i++) {
        float x = src[i];
        if (fabsf(x) >= 65520.0f && isfinite(x)) x = x < 0 ? -TM_HALF_MAX : TM_HALF_MAX;
        h[i] = quant_f32_to_f16(x);
    }
}

void quant_ref_dequantize_bf16(const void *src, float *dst, int64_t n) {
    const tm_bf16 *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(h[i]);
}

/* Round to nearest even like ggml; finite values that would round up to
 * infinity saturate at the largest finite bf16 (0x7f7f). */
void quant_ref_quantize_bf16(const float *src, void *dst, int64_t n) {
    tm_bf16 *h = dst;
    for (int64_t i = 0; i < n; i++) {
        tm_bf16 b = quant_f32_to_bf16(src[i]);
        if ((b & 0x7fff) == 0x7f80 && isfinite(src[i])) b = (tm_bf16)((b & 0x8000) | 0x7f7f);
        h[i] = b;
    }
}

/* ---- q8_0 ---- */

void quant_ref_dequantize_q8_0(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK8_0 == 0);
    const tm_block_q8_0 *b = src;
    for (int64_t i = 0; i < n / TM_QK8_0; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        for (int j = 0; j < TM_QK8_0; j++) dst[i * TM_QK8_0 + j] = b[i].qs[j] * d;
    }
}

/* ggml's quantize_row_q8_0_ref: d = max|x| / 127, q = roundf(x / d) with ties
 * away from zero. */
void quant_ref_quantize_q8_0(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK8_0 == 0);
    tm_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / TM_QK8_0; i++) {
        const float *x = src + i * TM_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < TM_QK8_0; j++) {
            float a = fabsf(x[j]);
            amax = amax < a ? a : amax;
        }
        float d = amax / 127;
        if (d > TM_HALF_MAX) d = TM_HALF_MAX; /* saturate instead of an infinite scale */
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (!isfinite(id)) id = 0.0f; /* d below 2^-128 is zero as a half anyway */
        b[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < TM_QK8_0; j++) {
            float v = quant_clampf(x[j] * id, -127.0f, 127.0f);
            float a = fabsf(v);
            int q = (int)a;
            q += (a - (float)q) >= 0.5f; /* roundf: ties away from zero */
            b[i].qs[j] = (int8_t)(v < 0 ? -q : q);
        }
    }
}

/* ---- q4_0 ---- */

void quant_ref_dequantize_q4_0(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    const tm_block_q4_0 *b = src;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK4_0;
        for (int j = 0; j < TM_QK4_0 / 2; j++) {
            y[j] = ((b[i].qs[j] & 0x0f) - 8) * d;
            y[j + TM_QK4_0 / 2] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* ggml's quantize_row_q4_0_ref: the value of largest magnitude (the first one
 * on ties) maps to -8, d = max / -8, q = trunc(x / d + 8.5) capped at 15. */
void quant_ref_quantize_q4_0(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    tm_block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        const float *x = src + i * TM_QK4_0;
        float amax;
        const float max = quant_signed_absmax(x, TM_QK4_0, &amax);
        float d = quant_clampf(max / -8, -TM_HALF_MAX, TM_HALF_MAX);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (!isfinite(id)) id = 0.0f;
        b[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < TM_QK4_0 / 2; j++) {
            int q0 = (int)quant_clampf(x[j] * id + 8.5f, 0.0f, 15.0f);
            int q1 = (int)quant_clampf(x[j + TM_QK4_0 / 2] * id + 8.5f, 0.0f, 15.0f);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ---- q8_K ---- */

void quant_ref_dequantize_q8_k(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_q8_k *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++)
        for (int j = 0; j < TM_QK_K; j++) dst[i * TM_QK_K + j] = b[i].d * b[i].qs[j];
}

/* ggml's quantize_row_q8_K_ref: the value of largest magnitude maps to -127,
 * q = nearest(x * -127 / max) (ties to even) capped at 127, d = 1 / iscale,
 * bsums[g] = sum of qs[16g .. 16g+15] (the K-quant dot products use them).
 * Blocks whose -127/max overflows (max below ~1e-37) take the division path. */
void quant_ref_quantize_q8_k(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_q8_k *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float *x = src + i * TM_QK_K;
        tm_block_q8_k *y = &b[i];
        float amax;
        const float max = quant_signed_absmax(x, TM_QK_K, &amax);
        if (amax == 0.0f || !isfinite(amax)) {
            /* zeros, or an infinite value nothing can scale: store zeros */
            memset(y, 0, sizeof(*y));
            continue;
        }
        const float iscale = -127.0f / max;
        if (isfinite(iscale)) {
            for (int j = 0; j < TM_QK_K; j++)
                y->qs[j] = (int8_t)quant_nearest_int(quant_clampf(iscale * x[j], -128.0f, 127.0f));
            y->d = 1 / iscale;
        } else {
            const float d = max / -127.0f;
            for (int j = 0; j < TM_QK_K; j++)
                y->qs[j] = (int8_t)quant_nearest_int(quant_clampf(x[j] / d, -128.0f, 127.0f));
            y->d = d;
        }
        for (int g = 0; g < TM_QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y->qs[16 * g + j];
            y->bsums[g] = (int16_t)sum;
        }
    }
}

/* ---- mxfp4 ---- */

/* E2M1 values doubled, as ggml stores them; the exponent below is halved to
 * compensate. */
static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e-127) / 2 as ggml computes it (e = 0 and 1 give subnormal floats). */
static inline float e8m0_to_f32_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void quant_ref_dequantize_mxfp4(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_MXFP4 == 0);
    const tm_block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / TM_QK_MXFP4; i++) {
        const float d = e8m0_to_f32_half(b[i].e);
        float *y = dst + i * TM_QK_MXFP4;
        for (int j = 0; j < TM_QK_MXFP4 / 2; j++) {
            y[j] = kvalues_mxfp4[b[i].qs[j] & 0x0f] * d;
            y[j + TM_QK_MXFP4 / 2] = kvalues_mxfp4[b[i].qs[j] >> 4] * d;
        }
    }
}

/* Index of the grid value nearest to x (the first one on ties), comparing the
 * same float expressions as ggml's best_index_mxfp4 so ties break alike. */
static inline int mxfp4_best_index(float x, float d) {
    int best = 0;
    float best_err = fabsf(kvalues_mxfp4[0] * d - x);
    for (int k = 1; k < 16; k++) {
        float err = fabsf(kvalues_mxfp4[k] * d - x);
        if (err < best_err) {
            best = k;
            best_err = err;
        }
    }
    return best;
}

/* ggml's quantize_row_mxfp4_ref: e = floor(log2(max|x|)) - 2 + 127 (clamped
 * to [0, 254], where ggml would cast a negative float to uint8), then each
 * value takes the nearest grid point. */
void quant_ref_quantize_mxfp4(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_MXFP4 == 0);
    tm_block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / TM_QK_MXFP4; i++) {
        const float *x = src + i * TM_QK_MXFP4;
        float amax = 0.0f;
        for (int j = 0; j < TM_QK_MXFP4; j++) {
            float a = fabsf(x[j]);
            amax = amax < a ? a : amax;
        }
        float ef = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0.0f;
        const uint8_t e = (uint8_t)quant_clampf(ef, 0.0f, 254.0f);
        const float d = e8m0_to_f32_half(e);
        b[i].e = e;
        for (int j = 0; j < TM_QK_MXFP4 / 2; j++) {
            int q0 = mxfp4_best_index(x[j], d);
            int q1 = mxfp4_best_index(x[j + TM_QK_MXFP4 / 2], d);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void quant_ref_quantize_q8x(const float *x, int64_t n, int8_t *q, float *d) {
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        const float dv = amax / 127.0f, id = dv != 0.0f ? 1.0f / dv : 0.0f;
        for (int i = 0; i < 32; i++) q[32 * b + i] = (int8_t)lrintf(x[32 * b + i] * id);
        d[b] = dv;
    }
}
