/* Scalar reference dequantizers and quantizers of the 32-value legacy types
 * q4_1 q5_0 q5_1 and the ternary types tq1_0 tq2_0.
 *
 * Dequantization follows the GGUF format's definition operation for operation
 * in float32 (bit-identical to the gguf package's numpy code, checked by
 * tests/oracle/test_quant_oracle.py):
 *   q4_1   x = (d * n) + m                  n = nibble (value j low, 16+j high)
 *   q5_0   x = d * (n - 16)                 n = nibble | bit j of qh << 4
 *   q5_1   x = (d * n) + m
 *   tq1_0  x = d * (t - 1)                  t: base-3 digits, see tq1_trit
 *   tq2_0  x = d * (c - 1)                  c: 2-bit codes
 *
 * Quantization is the gguf package's (and ggml's reference) rounding, bit for
 * bit, wherever that stores finite halves: q4_1/q5_1 map [min, max] onto the
 * codes, q5_0 maps the value of largest magnitude to -16, tq1_0/tq2_0 round
 * x / max|x| to -1, 0, 1 (ties away from zero). Where ggml would store an
 * infinite scale the scale saturates at 65504 instead, and non-finite
 * reciprocals give zero codes (as quant_ref.c does for q4_0).
 */
#include "quant/quant_ref.h"

#include <math.h>

#include "core/log.h"
#include "quant/quant.h"
#include "quant/quant_ref_util.h"

/* ---- q4_1 / q5_0 / q5_1 ---- */

void quant_ref_dequantize_q4_1(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    const tm_block_q4_1 *b = src;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        const float d = quant_f16_to_f32(b[i].d), m = quant_f16_to_f32(b[i].m);
        float *y = dst + i * TM_QK4_0;
        for (int j = 0; j < TM_QK4_0 / 2; j++) {
            y[j] = d * (float)(b[i].qs[j] & 0x0f) + m;
            y[j + TM_QK4_0 / 2] = d * (float)(b[i].qs[j] >> 4) + m;
        }
    }
}

static inline uint32_t load_u32_le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The 5-bit code of value j (0..31) of a q5_0 / q5_1 block. */
static inline int q5_code(const uint8_t *qs, uint32_t qh, int j) {
    const int nib = j < TM_QK4_0 / 2 ? qs[j] & 0x0f : qs[j - TM_QK4_0 / 2] >> 4;
    return nib | (int)((qh >> j) & 1) << 4;
}

void quant_ref_dequantize_q5_0(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    const tm_block_q5_0 *b = src;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        const uint32_t qh = load_u32_le(b[i].qh);
        float *y = dst + i * TM_QK4_0;
        for (int j = 0; j < TM_QK4_0; j++) y[j] = d * (float)(q5_code(b[i].qs, qh, j) - 16);
    }
}

void quant_ref_dequantize_q5_1(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    const tm_block_q5_1 *b = src;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        const float d = quant_f16_to_f32(b[i].d), m = quant_f16_to_f32(b[i].m);
        const uint32_t qh = load_u32_le(b[i].qh);
        float *y = dst + i * TM_QK4_0;
        for (int j = 0; j < TM_QK4_0; j++) y[j] = d * (float)q5_code(b[i].qs, qh, j) + m;
    }
}

/* Reciprocal of a scale, 0 where the scale is 0 or the reciprocal overflows. */
static inline float inv_or_zero(float d) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return isfinite(id) ? id : 0.0f;
}

/* min and max of n values (NaNs never win a comparison). */
static inline void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = x[0] == x[0] ? x[0] : 0.0f, hi = lo;
    for (int j = 1; j < n; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    *mn = lo;
    *mx = hi;
}

/* Codes trunc((x - min) * id + 0.5) in [0, nmax] for q4_1 / q5_1, stored as the
 * gguf package does: d = (max - min) / nmax and m = min as halves. */
static void q_min_max_codes(const float *x, int nmax, tm_half *dh, tm_half *mh, uint8_t *q) {
    float mn, mx;
    min_max(x, TM_QK4_0, &mn, &mx);
    const float d = quant_clampf((mx - mn) / (float)nmax, 0.0f, TM_HALF_MAX);
    const float id = inv_or_zero(d);
    *dh = quant_f32_to_f16(d);
    *mh = quant_f16_sat(mn);
    for (int j = 0; j < TM_QK4_0; j++)
        q[j] = (uint8_t)quant_clampf((x[j] - mn) * id + 0.5f, 0.0f, (float)nmax);
}

void quant_ref_quantize_q4_1(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    tm_block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        uint8_t q[TM_QK4_0];
        q_min_max_codes(src + i * TM_QK4_0, 15, &b[i].d, &b[i].m, q);
        for (int j = 0; j < TM_QK4_0 / 2; j++)
            b[i].qs[j] = (uint8_t)(q[j] | q[j + TM_QK4_0 / 2] << 4);
    }
}

/* Pack 5-bit codes: low nibbles as q4_0 does, fifth bits into qh (bit j). */
static void q5_pack(const uint8_t *q, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < TM_QK4_0 / 2; j++)
        qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + TM_QK4_0 / 2] & 0x0f) << 4);
    for (int j = 0; j < TM_QK4_0; j++) h |= (uint32_t)(q[j] >> 4) << j;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

void quant_ref_quantize_q5_0(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    tm_block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        const float *x = src + i * TM_QK4_0;
        float amax;
        const float max = quant_signed_absmax(x, TM_QK4_0, &amax);
        const float d = quant_clampf(max / -16, -TM_HALF_MAX, TM_HALF_MAX);
        const float id = inv_or_zero(d);
        b[i].d = quant_f32_to_f16(d);
        uint8_t q[TM_QK4_0];
        for (int j = 0; j < TM_QK4_0; j++)
            q[j] = (uint8_t)quant_clampf(x[j] * id + 16.5f, 0.0f, 31.0f);
        q5_pack(q, b[i].qs, b[i].qh);
    }
}

void quant_ref_quantize_q5_1(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    tm_block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        uint8_t q[TM_QK4_0];
        q_min_max_codes(src + i * TM_QK4_0, 31, &b[i].d, &b[i].m, q);
        q5_pack(q, b[i].qs, b[i].qh);
    }
}

/* ---- tq1_0 / tq2_0 ---- */

/* Ternary codes 0, 1, 2 (value + 1) of a block of 256: round(x / max|x|) with
 * ties away from zero, computed as the gguf package's np_roundf does; returns
 * the scale max|x| (saturated at the largest half). */
static float tq_codes(const float *x, uint8_t *q) {
    float amax = 0.0f;
    for (int j = 0; j < TM_QK_K; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float d = quant_clampf(amax, 0.0f, TM_HALF_MAX);
    const float id = inv_or_zero(amax);
    for (int j = 0; j < TM_QK_K; j++) {
        const float v = quant_clampf(x[j] * id, -1.0f, 1.0f);
        const float a = fabsf(v), fl = floorf(a);
        const float r = fl + floorf(2 * (a - fl));
        q[j] = (uint8_t)(1 + (v < 0 ? -(int)r : (int)r));
    }
    return d;
}

/* Base-3 byte of digits q[0], q[stride], ... (count of them, most significant
 * first, padded to 5 digits) as the fraction ceil(value * 256 / 243). */
static uint8_t tq1_byte(const uint8_t *q, int stride, int count) {
    int v = 0;
    for (int k = 0; k < 5; k++) v = 3 * v + (k < count ? q[k * stride] : 0);
    return (uint8_t)((v * 256 + 242) / 243);
}

void quant_ref_quantize_tq1_0(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_tq1_0 *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        uint8_t q[TM_QK_K];
        b[i].d = quant_f32_to_f16(tq_codes(src + i * TM_QK_K, q));
        for (int l = 0; l < 32; l++) b[i].qs[l] = tq1_byte(q + l, 32, 5);
        for (int l = 0; l < 16; l++) b[i].qs[32 + l] = tq1_byte(q + 160 + l, 16, 5);
        for (int l = 0; l < 4; l++) b[i].qh[l] = tq1_byte(q + 240 + l, 4, 4);
    }
}

void quant_ref_quantize_tq2_0(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_tq2_0 *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        uint8_t q[TM_QK_K];
        b[i].d = quant_f32_to_f16(tq_codes(src + i * TM_QK_K, q));
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *c = q + 128 * h + l;
                b[i].qs[32 * h + l] = (uint8_t)(c[0] | c[32] << 2 | c[64] << 4 | c[96] << 6);
            }
    }
}

/* Digit k (0 = most significant) of a byte holding 5 (or 4) base-3 digits as
 * the fraction byte = ceil(value * 256 / 243): multiplying by 3^k (mod 256)
 * shifts digit k to the top, and (b * 3) >> 8 reads it. */
static inline int tq1_trit(uint8_t byte, int k) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const uint8_t v = (uint8_t)(byte * pow3[k]);
    return ((int)v * 3) >> 8;
}

void quant_ref_dequantize_tq1_0(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_tq1_0 *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK_K;
        /* qs[0..31]: values 32k + l; qs[32..47]: 160 + 16k + l; qh[0..3]: 240 + 4k + l */
        for (int k = 0; k < 5; k++)
            for (int l = 0; l < 32; l++) y[32 * k + l] = d * (float)(tq1_trit(b[i].qs[l], k) - 1);
        for (int k = 0; k < 5; k++)
            for (int l = 0; l < 16; l++)
                y[160 + 16 * k + l] = d * (float)(tq1_trit(b[i].qs[32 + l], k) - 1);
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 4; l++)
                y[240 + 4 * k + l] = d * (float)(tq1_trit(b[i].qh[l], k) - 1);
    }
}

void quant_ref_dequantize_tq2_0(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_tq2_0 *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK_K;
        /* byte 32h + l holds values 128h + 32j + l in bits 2j..2j+1 */
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    y[128 * h + 32 * j + l] =
                        d * (float)(((b[i].qs[32 * h + l] >> (2 * j)) & 3) - 1);
    }
}
