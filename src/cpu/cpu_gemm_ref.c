/* Scalar reference products: the ground truth every SIMD kernel is tested
 * against, and the fallback on CPUs without AVX2. Each block's integer dot
 * product is exact (int32); floats enter only as the block scales:
 *   q4_K/q5_K: d_w*d_x*sum_j sc_j*(q.x)_j - dmin_w*d_x*sum_j m_j*bsum_j
 *   q6_K:      d_w*d_x*sum_j sc_j*((q-32).x)_j      (16 sub-blocks of 16)
 *   q8_0/q4_0: d_w*d_x*(q.x)   (q4_0: q-8)          (blocks of 32)
 *   mxfp4:     e8m0_half(e)*d_x*(v.x), v the doubled e2m1 values
 *   f32/f16/bf16 with f32 activations: sum w*x in float, in order. */
#include "cpu/cpu_internal.h"

const int8_t cpu_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float dot_q4_k(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q4_k *w = wv;
    const tm_block_q8_k *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            cpu_k4_scale_min(j, w[b].scales, &sc, &m);
            const uint8_t *q = w[b].qs + 32 * (j / 2);
            const int8_t *a = x[b].qs + 32 * j;
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += (j & 1 ? q[i] >> 4 : q[i] & 0xF) * a[i];
            sumi += sc * s;
            summ += m * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
        }
        sum += quant_f16_to_f32(w[b].d) * x[b].d * (float)sumi -
               quant_f16_to_f32(w[b].dmin) * x[b].d * (float)summ;
    }
    return sum;
}

static float dot_q5_k(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q5_k *w = wv;
    const tm_block_q8_k *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            cpu_k4_scale_min(j, w[b].scales, &sc, &m);
            const uint8_t *q = w[b].qs + 32 * (j / 2);
            const int8_t *a = x[b].qs + 32 * j;
            int32_t s = 0;
            for (int i = 0; i < 32; i++) {
                int lo = j & 1 ? q[i] >> 4 : q[i] & 0xF;
                int hi = (w[b].qh[i] >> j) & 1;
                s += (lo | hi << 4) * a[i];
            }
            sumi += sc * s;
            summ += m * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
        }
        sum += quant_f16_to_f32(w[b].d) * x[b].d * (float)sumi -
               quant_f16_to_f32(w[b].dmin) * x[b].d * (float)summ;
    }
    return sum;
}

static float dot_q6_k(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q6_k *w = wv;
    const tm_block_q8_k *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        /* 2 halves of 128 values; in each, value 32*p + l (p = 0..3, l = 0..31) has
         * its low 4 bits in ql[l + 32*(p&1)] (nibble p>>1) and high 2 in qh[l] (bits 2p) */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[b].ql + 64 * h, *qh = w[b].qh + 32 * h;
            for (int p = 0; p < 4; p++) {
                for (int g = 0; g < 2; g++) { /* sub-blocks of 16 */
                    int32_t s = 0;
                    for (int l = 16 * g; l < 16 * g + 16; l++) {
                        int lo = (ql[l + 32 * (p & 1)] >> (4 * (p >> 1))) & 0xF;
                        int hi = (qh[l] >> (2 * p)) & 3;
                        s += ((lo | hi << 4) - 32) * x[b].qs[128 * h + 32 * p + l];
                    }
                    sumi += w[b].scales[8 * h + 2 * p + g] * s;
                }
            }
        }
        sum += quant_f16_to_f32(w[b].d) * x[b].d * (float)sumi;
    }
    return sum;
}

static float dot_q8_0(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q8_0 *w = wv, *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += w[b].qs[i] * x[b].qs[i];
        sum += quant_f16_to_f32(w[b].d) * quant_f16_to_f32(x[b].d) * (float)s;
    }
    return sum;
}

static float dot_q4_0(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q4_0 *w = wv;
    const tm_block_q8_0 *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++)
            s += ((w[b].qs[i] & 0xF) - 8) * x[b].qs[i] + ((w[b].qs[i] >> 4) - 8) * x[b].qs[i + 16];
        sum += quant_f16_to_f32(w[b].d) * quant_f16_to_f32(x[b].d) * (float)s;
    }
    return sum;
}

static float dot_mxfp4(const void *wv, const void *xv, int64_t nb) {
    const tm_block_mxfp4 *w = wv;
    const tm_block_q8_0 *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++)
            s += cpu_mxfp4_values[w[b].qs[i] & 0xF] * x[b].qs[i] +
                 cpu_mxfp4_values[w[b].qs[i] >> 4] * x[b].qs[i + 16];
        sum += cpu_e8m0_half(w[b].e) * quant_f16_to_f32(x[b].d) * (float)s;
    }
    return sum;
}

static float dot_f32(const void *wv, const void *xv, int64_t k) {
    const float *w = wv, *x = xv;
    float sum = 0;
    for (int64_t i = 0; i < k; i++) sum += w[i] * x[i];
    return sum;
}

static float dot_f16(const void *wv, const void *xv, int64_t k) {
    const tm_half *w = wv;
    const float *x = xv;
    float sum = 0;
    for (int64_t i = 0; i < k; i++) sum += quant_f16_to_f32(w[i]) * x[i];
    return sum;
}

static float dot_bf16(const void *wv, const void *xv, int64_t k) {
    const tm_bf16 *w = wv;
    const float *x = xv;
    float sum = 0;
    for (int64_t i = 0; i < k; i++) sum += quant_bf16_to_f32(w[i]) * x[i];
    return sum;
}

typedef float (*ref_dot_fn)(const void *w, const void *x, int64_t n_blocks);

static inline void gemm_ref(ref_dot_fn dot, int64_t nb, const void *w, size_t wrb, int64_t r0,
                            int64_t r1, const void *xq, size_t xqrb, int64_t n_tok, float *y,
                            int64_t ldy) {
    for (int64_t t = 0; t < n_tok; t++) {
        const void *x = (const char *)xq + (size_t)t * xqrb;
        for (int64_t r = r0; r < r1; r++)
            y[t * ldy + r] = dot((const char *)w + (size_t)r * wrb, x, nb);
    }
}

#define REF_GEMM(name, block)                                                                      \
    static void gemm_ref_##name(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,      \
                                const void *xq, size_t xqrb, int64_t n_tok, float *y,              \
                                int64_t ldy) {                                                     \
        gemm_ref(dot_##name, k / (block), w, wrb, r0, r1, xq, xqrb, n_tok, y, ldy);                \
    }
REF_GEMM(q4_k, TM_QK_K)
REF_GEMM(q5_k, TM_QK_K)
REF_GEMM(q6_k, TM_QK_K)
REF_GEMM(q8_0, 32)
REF_GEMM(q4_0, 32)
REF_GEMM(mxfp4, 32)
REF_GEMM(f32, 1)
REF_GEMM(f16, 1)
REF_GEMM(bf16, 1)
#undef REF_GEMM

cpu_gemm_fn cpu_gemm_ref_get(tm_type wtype) {
    switch (wtype) {
    case TM_TYPE_Q4_K:
        return gemm_ref_q4_k;
    case TM_TYPE_Q5_K:
        return gemm_ref_q5_k;
    case TM_TYPE_Q6_K:
        return gemm_ref_q6_k;
    case TM_TYPE_Q8_0:
        return gemm_ref_q8_0;
    case TM_TYPE_Q4_0:
        return gemm_ref_q4_0;
    case TM_TYPE_MXFP4:
        return gemm_ref_mxfp4;
    case TM_TYPE_F32:
        return gemm_ref_f32;
    case TM_TYPE_F16:
        return gemm_ref_f16;
    case TM_TYPE_BF16:
        return gemm_ref_bf16;
    default: {
        cpu_gemm_fn fn = cpu_gemm_ref_iq_get(wtype);
        return fn ? fn : cpu_gemm_ref_lowbit_get(wtype);
    }
    }
}
