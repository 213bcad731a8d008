/* Scalar reference dequantizers and quantizers of the non-linear 4-bit types
 * iq4_nl (blocks of 32) and iq4_xs (256 values, 6-bit scales per 32).
 *
 * Dequantization follows the GGUF format in float32 (bit-identical to the
 * gguf package, tests/oracle/test_quant_oracle.py):
 *   iq4_nl x = d * kv[nibble]                 kv = quant_iq4nl_values
 *   iq4_xs x = (d * (ls - 32)) * kv[nibble]   ls: 6-bit scale per 32 values
 *
 * Quantization (the gguf package has none for these): each value takes the
 * nearest of the 16 values times the scale; the scale of 32 values is
 * searched: candidates map the value of largest magnitude onto -127 or +113
 * times 1 + k/32 (k = -3..3), each candidate's codes get their least-squares
 * scale, and the one of lowest squared error wins. No importance matrix. */
#include "quant/quant_ref.h"

#include <math.h>

#include "core/log.h"
#include "quant/quant.h"
#include "quant/quant_grids.h"
#include "quant/quant_ref_util.h"

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

/* ---- quantization ---- */

/* Midpoints between consecutive values of quant_iq4nl_values. */
static const float iq4_mid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                  7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};

/* Codes of 32 values for scale d: the nearest of the 16 values to x / d (the
 * lower one on ties) is the count of midpoints below it, counted for all 32
 * values a midpoint at a time (branch-free, so the compiler can vectorise it).
 * Returns sum x*v and sum v*v of the chosen values. */
static void iq4_codes(const float *x, float d, uint8_t *q, float *sxv, float *svv) {
    float id = d != 0.0f ? 1.0f / d : 0.0f, t[32];
    if (!isfinite(id)) id = 0.0f;
    for (int j = 0; j < 32; j++) {
        t[j] = x[j] * id;
        q[j] = 0;
    }
    for (int m = 0; m < 15; m++)
        for (int j = 0; j < 32; j++) q[j] += (uint8_t)(t[j] > iq4_mid[m]);
    float v[32], acc[8] = {0};
    int vv = 0;
    for (int j = 0; j < 32; j++) {
        v[j] = quant_iq4nl_values[q[j]];
        vv += quant_iq4nl_values[q[j]] * quant_iq4nl_values[q[j]];
    }
    for (int j = 0; j < 32; j += 8) /* 8 lanes: no serial chain of additions */
        for (int l = 0; l < 8; l++) acc[l] += x[j + l] * v[j + l];
    *sxv = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    *svv = (float)vv;
}

/* The least-squares scale of the best candidate for 32 values (0 if all are 0).
 * Squared error for scale s = sum(x v) / sum(v v) is sum x^2 - sum(x v)^2 / sum(v v),
 * so the winner maximises sum(x v)^2 / sum(v v). */
static float iq4_best_scale(const float *x) {
    float amax;
    const float max = quant_signed_absmax(x, 32, &amax);
    if (!(amax > 0.0f) || !isfinite(amax)) return 0.0f;
    float best = -1.0f, best_d = max / -127.0f;
    uint8_t q[32];
    for (int end = 0; end < 2; end++) {
        const float base = end ? max / 113.0f : max / -127.0f;
        for (int k = -3; k <= 3; k++) {
            float sxv, svv;
            iq4_codes(x, base * (1.0f + (float)k / 32.0f), q, &sxv, &svv);
            if (svv > 0.0f && sxv * sxv / svv > best) {
                best = sxv * sxv / svv;
                best_d = sxv / svv;
            }
        }
    }
    return best_d;
}

void quant_ref_quantize_iq4_nl(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK4_0 == 0);
    tm_block_iq4_nl *b = dst;
    for (int64_t i = 0; i < n / TM_QK4_0; i++) {
        const float *x = src + i * TM_QK4_0;
        b[i].d = quant_f16_sat(iq4_best_scale(x));
        uint8_t q[TM_QK4_0];
        float sxv, svv;
        iq4_codes(x, quant_f16_to_f32(b[i].d), q, &sxv, &svv);
        for (int j = 0; j < TM_QK4_0 / 2; j++)
            b[i].qs[j] = (uint8_t)(q[j] | q[j + TM_QK4_0 / 2] << 4);
    }
}

/* Squared error of 32 values with scale dl and their nearest codes. */
static float iq4_error(const float *x, float dl, uint8_t *q) {
    float sxv, svv, e = 0.0f;
    iq4_codes(x, dl, q, &sxv, &svv);
    for (int j = 0; j < 32; j++) {
        const float r = dl * (float)quant_iq4nl_values[q[j]] - x[j];
        e += r * r;
    }
    return e;
}

/* Per 32 values the searched scale s; d maps the s of largest magnitude onto
 * -32 (d = s / -32); each sub-block then takes whichever of the two 6-bit
 * scales nearest s / d gives the lower error, and its codes for that scale. */
void quant_ref_quantize_iq4_xs(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_iq4_xs *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float *x = src + i * TM_QK_K;
        float s[8], big = 0.0f;
        for (int g = 0; g < 8; g++) {
            s[g] = iq4_best_scale(x + 32 * g);
            big = fabsf(s[g]) > fabsf(big) ? s[g] : big;
        }
        b[i].d = quant_f16_sat(big / -32.0f);
        const float d = quant_f16_to_f32(b[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].scales_h = 0;
        for (int g = 0; g < 8; g++) {
            const float t = quant_clampf(isfinite(id) ? s[g] * id : 0.0f, -32.0f, 31.0f);
            const int lo = (int)floorf(t), hi = lo + 1 > 31 ? 31 : lo + 1;
            uint8_t q[32], q2[32];
            int ls = lo;
            if (hi != lo &&
                iq4_error(x + 32 * g, d * (float)hi, q2) < iq4_error(x + 32 * g, d * (float)lo, q))
                ls = hi;
            iq4_error(x + 32 * g, d * (float)ls, q);
            const int u = ls + 32;
            b[i].scales_l[g / 2] =
                (uint8_t)(g % 2 ? (b[i].scales_l[g / 2] & 0x0f) | (u & 15) << 4 : (u & 15));
            b[i].scales_h |= (uint16_t)((u >> 4) << (2 * g));
            for (int j = 0; j < 16; j++) b[i].qs[16 * g + j] = (uint8_t)(q[j] | q[j + 16] << 4);
        }
    }
}
