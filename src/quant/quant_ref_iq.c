/* Scalar reference dequantizers of the grid i-quants: iq2_xxs iq2_xs iq2_s
 * iq3_xxs iq3_s iq1_s iq1_m (grids in quant_grids.h).
 *
 * Each follows the GGUF format operation for operation in float32, so results
 * are bit-identical to the gguf package's numpy code (checked by
 * tests/oracle/test_quant_oracle.py). g is a grid value, s = +-1 its sign:
 *   iq2_xxs/iq2_xs/iq2_s  db = (d * (0.5 + sc)) * 0.25,  x = (db * g) * s
 *   iq3_xxs               db = (d * (0.5 + sc)) * 0.5,   x = (db * g) * s
 *   iq3_s                 db = d * (1 + 2 sc),           x = (db * g) * s
 *   iq1_s/iq1_m           dl = d * (2 sc + 1),           x = dl * (g + delta)
 * The sign is a multiplication by -1.0f, not a negation, so a NaN scale keeps
 * the sign bit numpy gives it. */
#include "quant/quant_ref.h"

#include <string.h>

#include "core/log.h"
#include "quant/quant.h"
#include "quant/quant_grids.h"
#include "quant/quant_ref_util.h"

/* Value k of an 8-byte (or 4-byte) grid entry. */
static inline float grid_u8(uint64_t entry, int k) {
    return (float)(uint8_t)(entry >> (8 * k));
}

static inline float sign_of(unsigned bits, int k) {
    return (bits >> k) & 1 ? -1.0f : 1.0f;
}

/* 8 values (db * g) * s of the 8-byte entry with sign bits `signs`. */
static inline void put8(float *y, float db, uint64_t entry, unsigned signs) {
    for (int k = 0; k < 8; k++) y[k] = db * grid_u8(entry, k) * sign_of(signs, k);
}

static inline float iq2_db(float d, int sc) {
    return d * (0.5f + (float)sc) * 0.25f;
}

/* ---- iq2_xxs: per 32 values aux0 (4 grid indices) and aux1 (4 x 7 signs, scale) ---- */

void quant_ref_dequantize_iq2_xxs(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_iq2_xxs *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        const uint8_t *q = (const uint8_t *)b[i].qs;
        float *y = dst + i * TM_QK_K;
        for (int g = 0; g < TM_QK_K / 32; g++) {
            uint32_t aux1;
            memcpy(&aux1, q + 8 * g + 4, 4);
            const float db = iq2_db(d, (int)(aux1 >> 28));
            for (int l = 0; l < 4; l++)
                put8(y + 32 * g + 8 * l, db, quant_grid_iq2_xxs[q[8 * g + l]],
                     quant_ksigns_iq2[(aux1 >> (7 * l)) & 127]);
        }
    }
}

/* ---- iq2_xs: per 8 values a 9-bit index and 7 sign bits; scales per 16 ---- */

void quant_ref_dequantize_iq2_xs(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_iq2_xs *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK_K;
        for (int e = 0; e < TM_QK_K / 8; e++) {
            const int sc = (b[i].scales[e / 4] >> (4 * ((e / 2) % 2))) & 0x0f;
            const uint16_t q = b[i].qs[e];
            put8(y + 8 * e, iq2_db(d, sc), quant_grid_iq2_xs[q & 511], quant_ksigns_iq2[q >> 9]);
        }
    }
}

/* ---- iq2_s: 10-bit indices (qs low 8, qh top 2), explicit sign bytes ---- */

void quant_ref_dequantize_iq2_s(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_iq2_s *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        const uint8_t *signs = b[i].qs + TM_QK_K / 8;
        float *y = dst + i * TM_QK_K;
        for (int e = 0; e < TM_QK_K / 8; e++) {
            const int sc = (b[i].scales[e / 4] >> (4 * ((e / 2) % 2))) & 0x0f;
            const int idx = b[i].qs[e] | ((b[i].qh[e / 4] >> (2 * (e % 4))) & 3) << 8;
            put8(y + 8 * e, iq2_db(d, sc), quant_grid_iq2_s[idx], signs[e]);
        }
    }
}

/* ---- iq3_xxs: 64 grid indices of 4 values, then per 32 values signs and scale ---- */

void quant_ref_dequantize_iq3_xxs(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_iq3_xxs *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        const uint8_t *q = b[i].qs;
        float *y = dst + i * TM_QK_K;
        for (int g = 0; g < TM_QK_K / 32; g++) {
            uint32_t aux;
            memcpy(&aux, q + TM_QK_K / 4 + 4 * g, 4);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++) {
                const unsigned signs = quant_ksigns_iq2[(aux >> (7 * l)) & 127];
                const uint64_t entry = (uint64_t)quant_grid_iq3_xxs[q[8 * g + 2 * l]] |
                                       (uint64_t)quant_grid_iq3_xxs[q[8 * g + 2 * l + 1]] << 32;
                put8(y + 32 * g + 8 * l, db, entry, signs);
            }
        }
    }
}

/* ---- iq3_s: 9-bit indices of 4 values, sign bits, scales per 32 ---- */

void quant_ref_dequantize_iq3_s(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_iq3_s *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK_K;
        for (int g = 0; g < TM_QK_K / 32; g++) {
            const int sc = (b[i].scales[g / 2] >> (4 * (g % 2))) & 0x0f;
            const float db = d * (float)(1 + 2 * sc);
            for (int l = 0; l < 4; l++) { /* 8 values: entries 8g+2l and 8g+2l+1 */
                uint64_t entry = 0;
                for (int h = 0; h < 2; h++) {
                    const int e = 8 * g + 2 * l + h;
                    const int idx = b[i].qs[e] | ((b[i].qh[e / 8] >> (e % 8)) & 1) << 8;
                    entry |= (uint64_t)quant_grid_iq3_s[idx] << (32 * h);
                }
                put8(y + 32 * g + 8 * l, db, entry, b[i].signs[4 * g + l]);
            }
        }
    }
}

/* ---- iq1_s / iq1_m: ternary grid plus a signed delta ---- */

/* 8 values dl * (g + delta) of ternary grid entry idx. */
static inline void put8_iq1(float *y, float dl, int idx, float delta) {
    const uint64_t entry = quant_grid_iq1_s[idx];
    for (int k = 0; k < 8; k++) y[k] = dl * ((float)(int8_t)(entry >> (8 * k)) + delta);
}

void quant_ref_dequantize_iq1_s(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_iq1_s *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        float *y = dst + i * TM_QK_K;
        for (int g = 0; g < TM_QK_K / 32; g++) {
            const unsigned qh = b[i].qh[g];
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -TM_IQ1_DELTA : TM_IQ1_DELTA;
            for (int l = 0; l < 4; l++)
                put8_iq1(y + 32 * g + 8 * l, dl, b[i].qs[4 * g + l] | ((qh >> (3 * l)) & 7) << 8,
                         delta);
        }
    }
}

void quant_ref_dequantize_iq1_m(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_iq1_m *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        uint16_t sc[4];
        memcpy(sc, b[i].scales, sizeof(sc));
        const tm_half dh = (tm_half)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
                                     ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        const float d = quant_f16_to_f32(dh);
        float *y = dst + i * TM_QK_K;
        for (int e = 0; e < TM_QK_K / 8; e++) {
            const int t = e / 2; /* sub-block of 16 */
            const float dl = d * (float)(2 * ((sc[t / 4] >> (3 * (t % 4))) & 7) + 1);
            const int qh = (b[i].qh[e / 2] >> (4 * (e % 2))) & 0x0f;
            put8_iq1(y + 8 * e, dl, b[i].qs[e] | (qh & 7) << 8,
                     qh & 8 ? -TM_IQ1_DELTA : TM_IQ1_DELTA);
        }
    }
}
