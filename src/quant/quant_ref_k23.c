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
 *
 * Quantization (the gguf package has none for these), one pass, no importance
 * matrix: each sub-block of 16 searches its own float scale (and min) for the
 * lowest squared error: candidate scales around the min/max one, each
 * candidate's codes refitted by least squares (k_fit_*). The super-block
 * scales then map the largest sub-block scale onto the top 4-bit (q2_K) or
 * 6-bit signed (q3_K) code; each sub-block takes the scale code nearest its
 * own (q2_K: that or a neighbour of the scale and min codes, whichever gives
 * the lower error; worth 2.5% of RMSE there, nothing for q3_K), and every
 * value takes its nearest code under the scales as dequantization computes
 * them.
 */
#include "quant/quant_ref.h"

#include <math.h>
#include <string.h>

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
        for (int s = 0; s < 16; s++) { /* sub-block s: values 16s .. 16s+15 */
            const float dl = d * (float)(b[i].scales[s] & 0x0f);
            const float ml = dmin * (float)(b[i].scales[s] >> 4);
            const uint8_t *q = b[i].qs + 32 * (s / 8) + 16 * (s % 2);
            const int shift = 2 * ((s / 2) % 4);
            for (int l = 0; l < 16; l++) y[16 * s + l] = dl * (float)((q[l] >> shift) & 3) - ml;
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
        for (int s = 0; s < 16; s++) {
            const float dl = d * (float)q3_k_scale(b[i].scales, s);
            const uint8_t *q = b[i].qs + 32 * (s / 8) + 16 * (s % 2);
            const uint8_t *hm = b[i].hmask + 16 * (s % 2);
            const int shift = 2 * ((s / 2) % 4), hbit = s / 2; /* bit (v / 32) of hmask[v % 32] */
            for (int l = 0; l < 16; l++) {
                const int lo = (q[l] >> shift) & 3;
                y[16 * s + l] = dl * (float)(lo - ((hm[l] >> hbit) & 1 ? 0 : 4));
            }
        }
    }
}

/* ---- quantization ---- */

#define K_SUB 16 /* values per sub-block */
/* Candidate scales each side of the min/max one (q2_K) or of the max-magnitude one
 * (q3_K). More steps buy little at a cost proportional to the count (N(0,1) rows,
 * rmse/rms: q2_K 0.2704 / 0.2696 / 0.2695 with 4 / 6 / 8 steps, q3_K 0.1435 with
 * 4 or 8, measured without q2_K's neighbour search below). */
#define K_STEPS_Q2 6
#define K_STEPS_Q3 4

/* sum x[j] q[j] over a sub-block, in 8 lanes (a vector's worth, no serial chain). */
static inline float k_dot16(const float *x, const int *q) {
    float acc[8] = {0};
    for (int j = 0; j < K_SUB; j += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[j + l] * (float)q[j + l];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Affine fit x ~ S q - M with codes 0..nmax, M >= 0 (the format subtracts a
 * non-negative min). For each candidate the codes are the nearest under that
 * candidate; S and M are then refitted by least squares on those codes (M
 * clamped at 0, S refitted alone then). Returns the lowest squared error. */
static float k_fit_affine(const float *x, int nmax, float *out_s, float *out_m) {
    float mn = 0.0f, mx = 0.0f; /* min <= 0 <= max: the zero is representable */
    for (int j = 0; j < K_SUB; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
    }
    *out_s = 0.0f;
    *out_m = -mn;
    float best = 0.0f;
    for (int j = 0; j < K_SUB; j++) best += (x[j] - mn) * (x[j] - mn);
    if (!(mx > mn) || !isfinite(mx - mn)) return best;
    float sx = 0.0f, sxx = 0.0f;
    for (int j = 0; j < K_SUB; j++) {
        sx += x[j];
        sxx += x[j] * x[j];
    }
    for (int k = -K_STEPS_Q2; k <= K_STEPS_Q2; k++) {
        const float is = ((float)nmax + 0.1f * (float)k) / (mx - mn);
        int q[K_SUB], sl = 0, sll = 0;
        for (int j = 0; j < K_SUB; j++) {
            q[j] = quant_nearest_int(quant_clampf((x[j] - mn) * is, 0.0f, (float)nmax));
            sl += q[j];
            sll += q[j] * q[j];
        }
        const float sxl = k_dot16(x, q);
        if (sll == 0) continue; /* all codes 0: the min/max start covers it */
        const float det = (float)(K_SUB * sll - sl * sl);
        float S = 0.0f, b = 1.0f;
        if (det > 0.0f) {
            S = (K_SUB * sxl - (float)sl * sx) / det;
            b = ((float)sll * sx - (float)sl * sxl) / det;
        }
        if (b > 0.0f) { /* a min above zero is not representable (or all codes are equal):
                         * fit the scale alone */
            b = 0.0f;
            S = sxl / (float)sll;
        }
        /* sum (S q + b - x)^2, expanded */
        const float e = sxx - 2 * S * sxl - 2 * b * sx + S * S * (float)sll +
                        2 * S * b * (float)sl + K_SUB * b * b;
        if (e < best && S > 0.0f) {
            best = e;
            *out_s = S;
            *out_m = -b;
        }
    }
    return best;
}

/* Symmetric fit x ~ s q with codes -4..3 (q3_K): candidates map the value of
 * largest magnitude onto -4 or +3 times 1 + k/16; each candidate's codes get
 * their least-squares scale; the one of lowest error wins. */
static float k_fit_q3(const float *x) {
    float amax;
    const float max = quant_signed_absmax(x, K_SUB, &amax);
    if (!(amax > 0.0f) || !isfinite(amax)) return 0.0f;
    float best = -1.0f, best_s = max / -4.0f;
    for (int end = 0; end < 2; end++) {
        const float base = end ? max / 3.0f : max / -4.0f;
        for (int k = -K_STEPS_Q3; k <= K_STEPS_Q3; k++) {
            const float is = 1.0f / (base * (1.0f + (float)k / 16.0f));
            int q[K_SUB], iqq = 0;
            for (int j = 0; j < K_SUB; j++) {
                q[j] = quant_nearest_int(quant_clampf(x[j] * is, -4.0f, 3.0f));
                iqq += q[j] * q[j];
            }
            const float sxq = k_dot16(x, q), sqq = (float)iqq;
            if (sqq > 0.0f && sxq * sxq / sqq > best) { /* error = sum x^2 - sxq^2 / sqq */
                best = sxq * sxq / sqq;
                best_s = sxq / sqq;
            }
        }
    }
    return best_s;
}

/* Nearest code of v / scale in [lo, hi] (lo for a zero or non-finite ratio). */
static inline int k_code(float v, float scale, int lo, int hi) {
    const float t = scale != 0.0f ? v / scale : 0.0f;
    return quant_nearest_int(quant_clampf(t, (float)lo, (float)hi));
}

/* Pack 256 two-bit codes: byte 32h + l holds values 128h + 32j + l at bits 2j. */
static void k_pack2(const uint8_t *q, uint8_t *qs) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *c = q + 128 * h + l;
            qs[32 * h + l] =
                (uint8_t)((c[0] & 3) | (c[32] & 3) << 2 | (c[64] & 3) << 4 | (c[96] & 3) << 6);
        }
}

void quant_ref_quantize_q2_k(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_q2_k *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float *x = src + i * TM_QK_K;
        float S[16], M[16], smax = 0.0f, mmax = 0.0f;
        for (int s = 0; s < 16; s++) {
            k_fit_affine(x + K_SUB * s, 3, &S[s], &M[s]);
            smax = S[s] > smax ? S[s] : smax;
            mmax = M[s] > mmax ? M[s] : mmax;
        }
        b[i].d = quant_f16_sat(smax / 15.0f);
        b[i].dmin = quant_f16_sat(mmax / 15.0f);
        const float d = quant_f16_to_f32(b[i].d), dmin = quant_f16_to_f32(b[i].dmin);
        uint8_t q[TM_QK_K];
        for (int s = 0; s < 16; s++) {
            /* the scale and min codes nearest S and M, or their neighbours if those fit
             * this sub-block better under the half-rounded d and dmin */
            const int sc0 = k_code(S[s], d, 0, 15), m0 = k_code(M[s], dmin, 0, 15);
            float best = INFINITY;
            for (int k = 0; k < 9; k++) { /* (sc0, m0) first: it is kept if all errors are NaN */
                const int sc = sc0 + (k % 3 == 2 ? -1 : k % 3), m = m0 + (k / 3 == 2 ? -1 : k / 3);
                if (sc < 0 || sc > 15 || m < 0 || m > 15) continue;
                const float dl = d * (float)sc, ml = dmin * (float)m; /* as dequantization */
                uint8_t c[K_SUB];
                float e = 0.0f;
                for (int j = 0; j < K_SUB; j++) {
                    c[j] = (uint8_t)k_code(x[K_SUB * s + j] + ml, dl, 0, 3);
                    const float r = dl * (float)c[j] - ml - x[K_SUB * s + j];
                    e += r * r;
                }
                if (k == 0 || e < best) {
                    best = e;
                    b[i].scales[s] = (uint8_t)(sc | m << 4);
                    memcpy(q + K_SUB * s, c, K_SUB);
                }
            }
        }
        k_pack2(q, b[i].qs);
    }
}

void quant_ref_quantize_q3_k(const float *src, void *dst, int64_t n) {
    TM_ASSERT(n % TM_QK_K == 0);
    tm_block_q3_k *b = dst;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        const float *x = src + i * TM_QK_K;
        float S[16], big = 0.0f;
        for (int s = 0; s < 16; s++) {
            S[s] = k_fit_q3(x + K_SUB * s);
            big = fabsf(S[s]) > fabsf(big) ? S[s] : big;
        }
        b[i].d = quant_f16_sat(big / -32.0f);
        const float d = quant_f16_to_f32(b[i].d);
        uint8_t q[TM_QK_K];
        memset(b[i].scales, 0, sizeof(b[i].scales));
        memset(b[i].hmask, 0, sizeof(b[i].hmask));
        for (int s = 0; s < 16; s++) {
            const int sc = k_code(S[s], d, -32, 31), u = sc + 32;
            const float dl = d * (float)sc;
            for (int j = 0; j < K_SUB; j++)
                q[K_SUB * s + j] = (uint8_t)(k_code(x[K_SUB * s + j], dl, -4, 3) + 4);
            b[i].scales[s % 8] |= (uint8_t)((u & 15) << (s < 8 ? 0 : 4));
            b[i].scales[8 + s % 4] |= (uint8_t)((u >> 4) << (2 * (s / 4)));
        }
        for (int v = 0; v < TM_QK_K; v++) b[i].hmask[v % 32] |= (uint8_t)((q[v] >> 2) << (v / 32));
        k_pack2(q, b[i].qs);
    }
}
