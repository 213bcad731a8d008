/* Scalar reference dequantizers and quantizers of the low K-quants q2_K and
 * q3_K (super-blocks of 256 values, 16 sub-blocks of 16).
 *
 * Dequantization follows the GGUF format operation for operation in float32
 * (bit-identical to the gguf package, tests/oracle/test_quant_oracle.py).
 *
 * Layouts (quant.h):
 *   q2_K  scales[16]: sub-block s has scale sc = low nibble, min m = high nibble;
 *         qs[64]: byte 32h + l holds values 128h + 32j + l in bits 2j..2j+1;
 *         x = (d * sc) * q - (dmin * m)
 *   q3_K  hmask[32]: bit j of hmask[l] is the third bit of value 32j + l;
 *         qs[64] as q2_K (the low two bits); scales[12]: 16 six-bit scales,
 *         low nibbles in bytes 0..7 (s < 8: low nibble of byte s, else high
 *         nibble of byte s - 8), top two bits in bytes 8..11 (bits 2(s/4).. of
 *         byte 8 + s%4); x = (d * (sc - 32)) * (q - (hbit ? 0 : 4))
 */
#include "quant/quant_ref.h"

#include "core/log.h"
#include "quant/quant.h"
#include "quant/quant_ref_util.h"

/* ---- q2_K ---- */

void quant_ref_dequantize_q2_k(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_q2_k *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d), dmin = quant_f16_to_f32(b[i].dmin);
        float *y = dst + i * TM_QK_K;
        for (int v = 0; v < TM_QK_K; v++) {
            const int s = v / 16, h = v / 128, j = (v / 32) % 4, l = v % 32;
            const float dl = d * (float)(b[i].scales[s] & 0x0f);
            const float ml = dmin * (float)(b[i].scales[s] >> 4);
            const int q = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
            y[v] = dl * (float)q - ml;
        }
    }
}

/* ---- q3_K ---- */

static inline int q3_k_scale(const uint8_t *sc, int s) {
    const int lo = s < 8 ? sc[s] & 0x0f : sc[s - 8] >> 4;
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | hi << 4) - 32;
}

void quant_ref_dequantize_q3_k(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_q3_k *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK_K;
        for (int v = 0; v < TM_QK_K; v++) {
            const int s = v / 16, h = v / 128, j = (v / 32) % 4, l = v % 32;
            const float dl = d * (float)q3_k_scale(b[i].scales, s);
            const int lo = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
            const int hbit = (b[i].hmask[l] >> (v / 32)) & 1;
            y[v] = dl * (float)(lo - (hbit ? 0 : 4));
        }
    }
}
