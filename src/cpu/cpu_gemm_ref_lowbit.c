/* Scalar reference products of the low-bit types q4_1 q5_0 q5_1 iq4_nl
 * (times q8_0 activations) and q2_K q3_K iq4_xs tq1_0 tq2_0 (times q8_K):
 * the ground truth of their SIMD kernels. As in cpu_gemm_ref.c each block's
 * integer dot product is exact (int32) and floats enter only as block scales:
 *   q4_1/q5_1: d_w*d_x*(q.x) + m_w*d_x*sum(x)        (q unsigned, blocks of 32)
 *   q5_0:      d_w*d_x*((q-16).x);  iq4_nl: d_w*d_x*(kv[q].x)
 *   q2_K:      d_w*d_x*sum_j sc_j*(q.x)_j - dmin_w*d_x*sum_j m_j*bsum_j   (16 of 16)
 *   q3_K:      d_w*d_x*sum_j (sc_j-32)*(q.x)_j, q = low 2 bits - 4 unless hmask (16 of 16)
 *   iq4_xs:    d_w*d_x*sum_j (sc_j-32)*(kv[q].x)_j                      (8 of 32)
 *   tq1_0/tq2_0: d_w*d_x*((c-1).x), c the ternary code 0..2
 * The value layouts are the GGUF format's (see the block structs in quant.h). */
#include "cpu/cpu_internal.h"
#include "quant/quant_grids.h"

static inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Blocks of 32: value i < 16 in the low nibble of qs[i], value 16 + i in the high one. */
static inline int nib(const uint8_t *qs, int i) {
    return i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4;
}

static inline int32_t sum_x32(const int8_t *x) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += x[i];
    return s;
}

/* sum_i ((nibble_i | fifth bit i of qh << 4) - offset) * x_i over a block of 32 */
static inline int32_t dot_nib32(const uint8_t *qs, uint32_t qh, int offset, const int8_t *x) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += ((nib(qs, i) | (int)((qh >> i) & 1) << 4) - offset) * x[i];
    return s;
}

static float dot_q4_1(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q4_1 *w = wv;
    const tm_block_q8_0 *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        const float dx = quant_f16_to_f32(x[b].d);
        sum += quant_f16_to_f32(w[b].d) * dx * (float)dot_nib32(w[b].qs, 0, 0, x[b].qs) +
               quant_f16_to_f32(w[b].m) * dx * (float)sum_x32(x[b].qs);
    }
    return sum;
}

static float dot_q5_0(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q5_0 *w = wv;
    const tm_block_q8_0 *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++)
        sum += quant_f16_to_f32(w[b].d) * quant_f16_to_f32(x[b].d) *
               (float)dot_nib32(w[b].qs, load_u32(w[b].qh), 16, x[b].qs);
    return sum;
}

static float dot_q5_1(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q5_1 *w = wv;
    const tm_block_q8_0 *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        const float dx = quant_f16_to_f32(x[b].d);
        sum += quant_f16_to_f32(w[b].d) * dx *
                   (float)dot_nib32(w[b].qs, load_u32(w[b].qh), 0, x[b].qs) +
               quant_f16_to_f32(w[b].m) * dx * (float)sum_x32(x[b].qs);
    }
    return sum;
}

static float dot_iq4_nl(const void *wv, const void *xv, int64_t nb) {
    const tm_block_iq4_nl *w = wv;
    const tm_block_q8_0 *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += quant_iq4nl_values[nib(w[b].qs, i)] * x[b].qs[i];
        sum += quant_f16_to_f32(w[b].d) * quant_f16_to_f32(x[b].d) * (float)s;
    }
    return sum;
}

/* q2_K/q3_K/tq2_0: value v (0..255) has 2 bits at qs[32*(v/128) + v%32], shift 2*((v/32)%4). */
static inline int two_bits(const uint8_t *qs, int v) {
    return (qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3;
}

static float dot_q2_k(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q2_k *w = wv;
    const tm_block_q8_k *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int v = 16 * j; v < 16 * j + 16; v++) s += two_bits(w[b].qs, v) * x[b].qs[v];
            sumi += (w[b].scales[j] & 0xF) * s;
            summ += (w[b].scales[j] >> 4) * x[b].bsums[j];
        }
        sum += quant_f16_to_f32(w[b].d) * x[b].d * (float)sumi -
               quant_f16_to_f32(w[b].dmin) * x[b].d * (float)summ;
    }
    return sum;
}

/* q3_K: 6-bit scale j (0..15): low 4 bits in nibble j/8 of scales[j%8], high 2 in
 * bits 2*(j/4) of scales[8 + j%4]; minus 32. */
static inline int q3k_scale(const uint8_t *sc, int j) {
    const int lo = (sc[j % 8] >> (4 * (j / 8))) & 0xF;
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

static float dot_q3_k(const void *wv, const void *xv, int64_t nb) {
    const tm_block_q3_k *w = wv;
    const tm_block_q8_k *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int v = 16 * j; v < 16 * j + 16; v++) {
                const int high = (w[b].hmask[v % 32] >> (v / 32)) & 1;
                s += (two_bits(w[b].qs, v) - (high ? 0 : 4)) * x[b].qs[v];
            }
            sumi += q3k_scale(w[b].scales, j) * s;
        }
        sum += quant_f16_to_f32(w[b].d) * x[b].d * (float)sumi;
    }
    return sum;
}

static float dot_iq4_xs(const void *wv, const void *xv, int64_t nb) {
    const tm_block_iq4_xs *w = wv;
    const tm_block_q8_k *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        for (int j = 0; j < 8; j++) {
            const int ls = (((w[b].scales_l[j / 2] >> (4 * (j % 2))) & 0xF) |
                            ((w[b].scales_h >> (2 * j)) & 3) << 4) -
                           32;
            int32_t s = 0;
            for (int i = 0; i < 32; i++)
                s += quant_iq4nl_values[nib(w[b].qs + 16 * j, i)] * x[b].qs[32 * j + i];
            sumi += ls * s;
        }
        sum += quant_f16_to_f32(w[b].d) * x[b].d * (float)sumi;
    }
    return sum;
}

/* tq1_0: value v's base-3 byte and its power of 3: values 0..159 from qs[0..31]
 * (power v/32), 160..239 from qs[32..47] (power (v-160)/16), 240..255 from qh
 * (power (v-240)/4); the code is the top trit of byte*3^p (mod 256), i.e.
 * (q * 3) >> 8. */
static inline int tq1_code(const tm_block_tq1_0 *w, int v) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    uint8_t byte, p;
    if (v < 160)
        byte = w->qs[v % 32], p = pow3[v / 32];
    else if (v < 240)
        byte = w->qs[32 + (v - 160) % 16], p = pow3[(v - 160) / 16];
    else
        byte = w->qh[(v - 240) % 4], p = pow3[(v - 240) / 4];
    const uint8_t q = (uint8_t)(byte * p);
    return (q * 3) >> 8;
}

static float dot_tq1_0(const void *wv, const void *xv, int64_t nb) {
    const tm_block_tq1_0 *w = wv;
    const tm_block_q8_k *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int v = 0; v < TM_QK_K; v++) s += (tq1_code(&w[b], v) - 1) * x[b].qs[v];
        sum += quant_f16_to_f32(w[b].d) * x[b].d * (float)s;
    }
    return sum;
}

static float dot_tq2_0(const void *wv, const void *xv, int64_t nb) {
    const tm_block_tq2_0 *w = wv;
    const tm_block_q8_k *x = xv;
    float sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int v = 0; v < TM_QK_K; v++) s += (two_bits(w[b].qs, v) - 1) * x[b].qs[v];
        sum += quant_f16_to_f32(w[b].d) * x[b].d * (float)s;
    }
    return sum;
}

typedef float (*lowbit_dot_fn)(const void *w, const void *x, int64_t n_blocks);

static inline void gemm_lowbit(lowbit_dot_fn dot, int64_t nb, const void *w, size_t wrb, int64_t r0,
                               int64_t r1, const void *xq, size_t xqrb, int64_t n_tok, float *y,
                               int64_t ldy) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = r0; r < r1; r++)
            y[t * ldy + r] =
                dot((const char *)w + (size_t)r * wrb, (const char *)xq + (size_t)t * xqrb, nb);
}

#define LOWBIT_GEMM(name, block)                                                                   \
    static void gemm_ref_##name(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,      \
                                const void *xq, size_t xqrb, int64_t n_tok, float *y,              \
                                int64_t ldy) {                                                     \
        gemm_lowbit(dot_##name, k / (block), w, wrb, r0, r1, xq, xqrb, n_tok, y, ldy);             \
    }
LOWBIT_GEMM(q4_1, 32)
LOWBIT_GEMM(q5_0, 32)
LOWBIT_GEMM(q5_1, 32)
LOWBIT_GEMM(iq4_nl, 32)
LOWBIT_GEMM(q2_k, TM_QK_K)
LOWBIT_GEMM(q3_k, TM_QK_K)
LOWBIT_GEMM(iq4_xs, TM_QK_K)
LOWBIT_GEMM(tq1_0, TM_QK_K)
LOWBIT_GEMM(tq2_0, TM_QK_K)
#undef LOWBIT_GEMM

cpu_gemm_fn cpu_gemm_ref_lowbit_get(tm_type wtype) {
    switch (wtype) {
    case TM_TYPE_Q4_1:
        return gemm_ref_q4_1;
    case TM_TYPE_Q5_0:
        return gemm_ref_q5_0;
    case TM_TYPE_Q5_1:
        return gemm_ref_q5_1;
    case TM_TYPE_IQ4_NL:
        return gemm_ref_iq4_nl;
    case TM_TYPE_Q2_K:
        return gemm_ref_q2_k;
    case TM_TYPE_Q3_K:
        return gemm_ref_q3_k;
    case TM_TYPE_IQ4_XS:
        return gemm_ref_iq4_xs;
    case TM_TYPE_TQ1_0:
        return gemm_ref_tq1_0;
    case TM_TYPE_TQ2_0:
        return gemm_ref_tq2_0;
    default:
        return NULL;
    }
}
