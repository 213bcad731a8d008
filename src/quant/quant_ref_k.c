/* Scalar reference dequantizers and quantizers for the K-quants q4_K, q5_K,
 * q6_K (super-blocks of 256 values).
 *
 * Dequantization is ggml's, operation for operation (bit-identical to ggml
 * and the gguf package). Quantization is our own one-pass method, not ggml's
 * iterative search: per sub-block min/max, scales rounded UP so the range a
 * sub-block needs is always covered, then round-to-nearest codes. That gives
 * a guaranteed per-value bound (docs/quant.md) at a few ns per value.
 *
 * Layouts (quant.h):
 *   q4_K  d, dmin: f16; scales[12]: eight 6-bit scales sc and mins m;
 *         qs[128]: 64-value groups g = 0..3 in qs[32g..32g+31], sub-block 2g
 *         in the low nibbles, 2g+1 in the high ones.
 *         x = d*sc[s] * q - dmin*m[s]
 *   q5_K  as q4_K plus qh[32]: bit s of qh[l] is the fifth bit of value l of
 *         sub-block s.
 *   q6_K  ql[128], qh[64], scales[16]: i8, d: f16; sixteen sub-blocks of 16.
 *         Per half h (128 values): ql[64h+l] holds values l (low) and 64+l
 *         (high), ql[64h+32+l] values 32+l and 96+l; qh[32h+l] holds the two
 *         top bits of values l, 32+l, 64+l, 96+l in bits 0-1, 2-3, 4-5, 6-7.
 *         x = d*scales[s] * (q - 32)
 */
#include "quant/quant_ref.h"

#include <math.h>
#include <string.h>

#include "core/log.h"
#include "quant/quant.h"
#include "quant/quant_ref_util.h"

/* ---- the 6-bit scale packing shared by q4_K and q5_K ----
 *  bytes 0-3: sc[0..3] in bits 0-5, top bits of sc[4..7] in bits 6-7
 *  bytes 4-7: m[0..3] in bits 0-5, top bits of m[4..7] in bits 6-7
 *  bytes 8-11: low 4 bits of sc[4..7] | low 4 bits of m[4..7] << 4 */

static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void set_scales_mins_k4(uint8_t *q, const uint8_t *sc, const uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
}

/* ---- q4_K / q5_K dequantization ---- */

void quant_ref_dequantize_q4_k(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_q4_k *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d), min = quant_f16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs;
        float *y = dst + i * TM_QK_K;
        for (int g = 0; g < 4; g++) {
            uint8_t sc, m;
            get_scale_min_k4(2 * g, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(2 * g + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
        }
    }
}

void quant_ref_dequantize_q5_k(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_q5_k *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d), min = quant_f16_to_f32(b[i].dmin);
        const uint8_t *ql = b[i].qs, *qh = b[i].qh;
        float *y = dst + i * TM_QK_K;
        for (int g = 0; g < 4; g++) {
            uint8_t sc, m;
            get_scale_min_k4(2 * g, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(2 * g + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            const uint8_t u1 = (uint8_t)(1u << (2 * g)), u2 = (uint8_t)(2u << (2 * g));
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
        }
    }
}

/* ---- q4_K / q5_K quantization ----
 * For sub-block s with values in [lo_s, hi_s]:
 *   need_m[s] = max(0, -lo_s)          (the min is subtracted, so it is >= 0)
 *   dmin = ceil_f16(max need_m / 63),  m[s] = ceil(need_m[s] / dmin) <= 63
 *   M[s] = dmin * m[s] >= need_m[s]
 *   need_d[s] = (hi_s + M[s]) / nmax   (nmax = 15 or 31 levels)
 *   d = ceil_f16(max need_d / 63),     sc[s] = ceil(need_d[s] / d) <= 63
 *   S[s] = d * sc[s] >= need_d[s]
 * so [-M, nmax*S - M] contains [lo_s, hi_s], and q = nearest((x + M) / S) is
 * within S/2 of x. */

#define K_SUBS 8 /* sub-blocks of 32 */

typedef struct k_scales {
    tm_half d, dmin;
    uint8_t sc[K_SUBS], m[K_SUBS];
    float scale[K_SUBS], min[K_SUBS]; /* d*sc and dmin*m exactly as dequantization computes them */
} k_scales;

static void k_choose_scales(const float *x, int nmax, k_scales *ks) {
    float need_m[K_SUBS], hi[K_SUBS], max_need_m = 0.0f;
    for (int s = 0; s < K_SUBS; s++) {
        float lo_s = 3.0e38f, hi_s = -3.0e38f; /* NaN never wins a comparison */
        for (int l = 0; l < 32; l++) {
            float v = x[32 * s + l];
            lo_s = v < lo_s ? v : lo_s;
            hi_s = v > hi_s ? v : hi_s;
        }
        need_m[s] = quant_clampf(-lo_s, 0.0f, 3.0e38f);
        hi[s] = hi_s;
        max_need_m = need_m[s] > max_need_m ? need_m[s] : max_need_m;
    }
    ks->dmin = quant_f16_ceil(max_need_m / 63);
    const float dmin = quant_f16_to_f32(ks->dmin);
    const float idmin = dmin > 0.0f ? 1.0f / dmin : 0.0f;
    float need_d[K_SUBS], max_need_d = 0.0f;
    for (int s = 0; s < K_SUBS; s++) {
        ks->m[s] = (uint8_t)quant_ceil_int(quant_clampf(need_m[s] * idmin, 0.0f, 63.0f));
        ks->min[s] = dmin * ks->m[s];
        need_d[s] = quant_clampf((hi[s] + ks->min[s]) / (float)nmax, 0.0f, 3.0e38f);
        max_need_d = need_d[s] > max_need_d ? need_d[s] : max_need_d;
    }
    ks->d = quant_f16_ceil(max_need_d / 63);
    const float d = quant_f16_to_f32(ks->d);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int s = 0; s < K_SUBS; s++) {
        ks->sc[s] = (uint8_t)quant_ceil_int(quant_clampf(need_d[s] * id, 0.0f, 63.0f));
        ks->scale[s] = d * ks->sc[s];
    }
}

/* Codes in [0, nmax] for the 32 values of sub-block s. */
static inline void k_codes(const float *x, const k_scales *ks, int s, float nmax, uint8_t *q) {
    const float is = ks->scale[s] > 0.0f ? 1.0f / ks->scale[s] : 0.0f, m = ks->min[s];
    for (int l = 0; l < 32; l++)
        q[l] = (uint8_t)quant_nearest_int(quant_clampf((x[l] + m) * is, 0.0f, nmax));
}

void quant_ref_quantize_q4_k(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_q4_k *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float *x = src + i * TM_QK_K;
        k_scales ks;
        k_choose_scales(x, 15, &ks);
        b[i].d = ks.d;
        b[i].dmin = ks.dmin;
        set_scales_mins_k4(b[i].scales, ks.sc, ks.m);
        for (int g = 0; g < 4; g++) {
            uint8_t q0[32], q1[32];
            k_codes(x + 64 * g, &ks, 2 * g, 15.0f, q0);
            k_codes(x + 64 * g + 32, &ks, 2 * g + 1, 15.0f, q1);
            for (int l = 0; l < 32; l++) b[i].qs[32 * g + l] = (uint8_t)(q0[l] | (q1[l] << 4));
        }
    }
}

void quant_ref_quantize_q5_k(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_q5_k *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float *x = src + i * TM_QK_K;
        k_scales ks;
        k_choose_scales(x, 31, &ks);
        b[i].d = ks.d;
        b[i].dmin = ks.dmin;
        set_scales_mins_k4(b[i].scales, ks.sc, ks.m);
        memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int g = 0; g < 4; g++) {
            uint8_t q0[32], q1[32];
            k_codes(x + 64 * g, &ks, 2 * g, 31.0f, q0);
            k_codes(x + 64 * g + 32, &ks, 2 * g + 1, 31.0f, q1);
            for (int l = 0; l < 32; l++) {
                b[i].qs[32 * g + l] = (uint8_t)((q0[l] & 0x0f) | ((q1[l] & 0x0f) << 4));
                b[i].qh[l] |= (uint8_t)(((q0[l] >> 4) << (2 * g)) | ((q1[l] >> 4) << (2 * g + 1)));
            }
        }
    }
}

/* ---- q6_K ---- */

void quant_ref_dequantize_q6_k(const void *src, float *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    const tm_block_q6_k *b = src;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float d = quant_f16_to_f32(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        float *y = dst + i * TM_QK_K;
        for (int h = 0; h < 2; h++) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

/* Symmetric, codes q - 32 in [-32, 31]. Per sub-block of 16 the side with the
 * larger magnitude takes the 32 end (the scale's sign picks the side), so
 *   need[s] = max(big / 32, small / 31)   (big/small: larger/smaller of the
 *                                          positive and negative extents)
 *   d = ceil_f16(max need / 127),  |scales[s]| = ceil(need[s] / d) <= 127
 * and q = nearest(x / (d * scales[s])) is within |d * scales[s]| / 2 of x. */
void quant_ref_quantize_q6_k(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_q6_k *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float *x = src + i * TM_QK_K;
        float need[16], max_need = 0.0f;
        int neg[16];
        for (int s = 0; s < 16; s++) {
            float pos = 0.0f, nm = 0.0f;
            for (int l = 0; l < 16; l++) {
                float v = x[16 * s + l];
                pos = v > pos ? v : pos;
                nm = -v > nm ? -v : nm;
            }
            neg[s] = pos >= nm; /* positive side maps to -32: negative scale */
            float big = pos >= nm ? pos : nm, small = pos >= nm ? nm : pos;
            float a = big / 32, c = small / 31;
            need[s] = quant_clampf(a > c ? a : c, 0.0f, 3.0e38f);
            max_need = need[s] > max_need ? need[s] : max_need;
        }
        const tm_half dh = quant_f16_ceil(max_need / 127);
        const float d = quant_f16_to_f32(dh);
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        b[i].d = dh;
        uint8_t q[TM_QK_K];
        for (int s = 0; s < 16; s++) {
            int sc = quant_ceil_int(quant_clampf(need[s] * id, 0.0f, 127.0f));
            b[i].scales[s] = (int8_t)(neg[s] ? -sc : sc);
            const float scale = d * b[i].scales[s];
            const float is = scale != 0.0f ? 1.0f / scale : 0.0f;
            for (int l = 0; l < 16; l++)
                q[16 * s + l] =
                    (uint8_t)(quant_nearest_int(quant_clampf(x[16 * s + l] * is, -32.0f, 31.0f)) +
                              32);
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *qq = q + 128 * h;
            uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((qq[l] & 0x0f) | ((qq[l + 64] & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((qq[l + 32] & 0x0f) | ((qq[l + 96] & 0x0f) << 4));
                qh[l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                  ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
            }
        }
    }
}
