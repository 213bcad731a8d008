/* Scalar reference dequantizers of the 32-value legacy types q4_1 q5_0 q5_1,
 * the non-linear 4-bit types iq4_nl iq4_xs and the ternary types tq1_0 tq2_0.
 *
 * Dequantization follows the GGUF format's definition operation for operation
 * in float32 (bit-identical to the gguf package's numpy code, checked by
 * tests/oracle/test_quant_oracle.py):
 *   q4_1   x = (d * n) + m                  n = nibble (value j low, 16+j high)
 *   q5_0   x = d * (n - 16)                 n = nibble | bit j of qh << 4
 *   q5_1   x = (d * n) + m
 *   iq4_nl x = d * kv[nibble]               kv = quant_iq4nl_values
 *   iq4_xs x = (d * (ls - 32)) * kv[nibble] ls: 6-bit scale per 32 values
 *   tq1_0  x = d * (t - 1)                  t: base-3 digits, see tq1_trit
 *   tq2_0  x = d * (c - 1)                  c: 2-bit codes
 */
#include "quant/quant_ref.h"

#include "core/log.h"
#include "quant/quant.h"
#include "quant/quant_grids.h"
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

/* ---- iq4_nl / iq4_xs ---- */

void quant_ref_dequantize_iq4_nl(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    const tm_block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK4_0;
        for (int j = 0; j < TM_QK4_0 / 2; j++) {
            y[j] = d * (float)quant_iq4nl_values[b[i].qs[j] & 0x0f];
            y[j + TM_QK4_0 / 2] = d * (float)quant_iq4nl_values[b[i].qs[j] >> 4];
        }
    }
}

void quant_ref_dequantize_iq4_xs(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK_K;
        for (int s = 0; s < TM_QK_K / 32; s++) {
            const int ls = ((b[i].scales_l[s / 2] >> (4 * (s % 2))) & 0x0f) |
                           ((b[i].scales_h >> (2 * s)) & 3) << 4;
            const float dl = d * (float)(ls - 32);
            const uint8_t *q = b[i].qs + 16 * s;
            for (int j = 0; j < 16; j++) {
                y[32 * s + j] = dl * (float)quant_iq4nl_values[q[j] & 0x0f];
                y[32 * s + 16 + j] = dl * (float)quant_iq4nl_values[q[j] >> 4];
            }
        }
    }
}

/* ---- tq1_0 / tq2_0 ---- */

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
