/* Scalar reference products of the grid i-quants (iq2_xxs iq2_xs iq2_s
 * iq3_xxs iq3_s iq1_s iq1_m) with q8_K activations: the ground truth of
 * their SIMD kernels (cpu_gemm_iq_avx2.c, cpu_gemm_iq_avx512.c).
 *
 * A block of 256 weights unpacks (iq_unpack) to integers: w_i = grid
 * magnitude times sign (iq2/iq3), or 8 g_i + delta sign (iq1: grid value
 * g in {-1, 0, 1} plus the +-1/8 delta, times 8), and one odd integer scale
 * m_j = 2 s_j + 1 per 16 values. The format's value is c * d * m_j * w_i with
 * c = 1/8 (iq2_*, iq1_*), 1/4 (iq3_xxs), 1 (iq3_s). The block's dot product
 * with a q8_K block is the exact int32
 *   sumi = sum_j m_j * sum_{i in sub-block j} w_i * x_i
 * (|sumi| <= 256 * 62 * 127 * 31 < 2^31), and the only float operations are
 *   y += (d_w * c) * d_x * (float)sumi        (per block, in block order),
 * d_w * c being exact (c a power of two). The SIMD kernels compute the same
 * sumi; they convert partial sums to float and add them in another order. */
#include "cpu/cpu_internal.h"
#include "quant/quant_grids.h"

/* Grid entry e of 8 (or 4) bytes as bytes. */
static inline void grid8(const uint64_t *grid, unsigned e, uint8_t out[8]) {
    memcpy(out, &grid[e], 8);
}

static inline void grid4(const uint32_t *grid, unsigned e, uint8_t out[4]) {
    memcpy(out, &grid[e], 4);
}

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 8 magnitudes times the signs of sign byte s (bit k set: value k negative). */
static inline void signed8(const uint8_t mag[8], uint8_t s, int8_t *w) {
    for (int k = 0; k < 8; k++) w[k] = (int8_t)(s >> k & 1 ? -mag[k] : mag[k]);
}

/* iq1: 8 grid values (int8 -1/0/1) times 8, plus the delta sign (+1 or -1). */
static inline void iq1_values(unsigned e, int delta, int8_t *w) {
    int8_t g[8];
    memcpy(g, &quant_grid_iq1_s[e], 8);
    for (int k = 0; k < 8; k++) w[k] = (int8_t)(8 * g[k] + delta);
}

static float iq_unpack(tm_type t, const void *blk, int8_t w[256], uint8_t m[16]) {
    uint8_t mag[8];
    switch (t) {
    case TM_TYPE_IQ2_XXS: {
        const tm_block_iq2_xxs *b = blk;
        for (int g = 0; g < 8; g++) {
            const uint8_t *idx = (const uint8_t *)(b->qs + 4 * g);
            const uint32_t aux = load_u32(b->qs + 4 * g + 2);
            for (int e = 0; e < 4; e++) {
                grid8(quant_grid_iq2_xxs, idx[e], mag);
                signed8(mag, quant_ksigns_iq2[aux >> (7 * e) & 127], w + 32 * g + 8 * e);
            }
            m[2 * g] = m[2 * g + 1] = (uint8_t)(2 * (aux >> 28) + 1);
        }
        return quant_f16_to_f32(b->d) * 0.125f;
    }
    case TM_TYPE_IQ2_XS: {
        const tm_block_iq2_xs *b = blk;
        for (int e = 0; e < 32; e++) {
            grid8(quant_grid_iq2_xs, b->qs[e] & 511, mag);
            signed8(mag, quant_ksigns_iq2[b->qs[e] >> 9], w + 8 * e);
        }
        for (int j = 0; j < 16; j++)
            m[j] = (uint8_t)(2 * (b->scales[j / 2] >> 4 * (j % 2) & 15) + 1);
        return quant_f16_to_f32(b->d) * 0.125f;
    }
    case TM_TYPE_IQ2_S: {
        const tm_block_iq2_s *b = blk;
        for (int e = 0; e < 32; e++) {
            grid8(quant_grid_iq2_s, b->qs[e] | (b->qh[e / 4] >> 2 * (e % 4) & 3) << 8, mag);
            signed8(mag, b->qs[32 + e], w + 8 * e);
        }
        for (int j = 0; j < 16; j++)
            m[j] = (uint8_t)(2 * (b->scales[j / 2] >> 4 * (j % 2) & 15) + 1);
        return quant_f16_to_f32(b->d) * 0.125f;
    }
    case TM_TYPE_IQ3_XXS: {
        const tm_block_iq3_xxs *b = blk;
        for (int g = 0; g < 8; g++) {
            const uint32_t aux = load_u32(b->qs + 64 + 4 * g);
            for (int e = 0; e < 4; e++) { /* 8 values: two grid entries, one sign byte */
                grid4(quant_grid_iq3_xxs, b->qs[8 * g + 2 * e], mag);
                grid4(quant_grid_iq3_xxs, b->qs[8 * g + 2 * e + 1], mag + 4);
                signed8(mag, quant_ksigns_iq2[aux >> (7 * e) & 127], w + 32 * g + 8 * e);
            }
            m[2 * g] = m[2 * g + 1] = (uint8_t)(2 * (aux >> 28) + 1);
        }
        return quant_f16_to_f32(b->d) * 0.25f;
    }
    case TM_TYPE_IQ3_S: {
        const tm_block_iq3_s *b = blk;
        for (int e = 0; e < 32; e++) { /* 8 values: two 9-bit grid indices, one sign byte */
            const unsigned i0 = b->qs[2 * e] | (b->qh[e / 4] >> (2 * e % 8) & 1) << 8;
            const unsigned i1 = b->qs[2 * e + 1] | (b->qh[e / 4] >> (2 * e % 8 + 1) & 1) << 8;
            grid4(quant_grid_iq3_s, i0, mag);
            grid4(quant_grid_iq3_s, i1, mag + 4);
            signed8(mag, b->signs[e], w + 8 * e);
        }
        for (int j = 0; j < 16; j++)
            m[j] = (uint8_t)(2 * (b->scales[j / 4] >> 4 * (j / 2 % 2) & 15) + 1);
        return quant_f16_to_f32(b->d);
    }
    case TM_TYPE_IQ1_S: {
        const tm_block_iq1_s *b = blk;
        for (int g = 0; g < 8; g++) {
            const unsigned qh = b->qh[g];
            const int delta = qh & 0x8000 ? -1 : 1;
            for (int e = 0; e < 4; e++)
                iq1_values(b->qs[4 * g + e] | (qh >> 3 * e & 7) << 8, delta, w + 32 * g + 8 * e);
            m[2 * g] = m[2 * g + 1] = (uint8_t)(2 * (qh >> 12 & 7) + 1);
        }
        return quant_f16_to_f32(b->d) * 0.125f;
    }
    case TM_TYPE_IQ1_M: {
        const tm_block_iq1_m *b = blk;
        uint16_t sc[4];
        memcpy(sc, b->scales, 8);
        for (int e = 0; e < 32; e++) {
            const unsigned h = b->qh[e / 2] >> 4 * (e % 2);
            iq1_values(b->qs[e] | (h & 7) << 8, h & 8 ? -1 : 1, w + 8 * e);
        }
        for (int j = 0; j < 16; j++) m[j] = (uint8_t)(2 * (sc[j / 4] >> 3 * (j % 4) & 7) + 1);
        const tm_half d = (tm_half)((sc[0] >> 12) | (sc[1] >> 8 & 0xF0) | (sc[2] >> 4 & 0xF00) |
                                    (sc[3] & 0xF000));
        return quant_f16_to_f32(d) * 0.125f;
    }
    default:
        return 0;
    }
}

static float dot_iq(tm_type t, const char *w, size_t bsize, const tm_block_q8_k *x, int64_t nb) {
    float sum = 0;
    int8_t v[256];
    uint8_t m[16];
    for (int64_t b = 0; b < nb; b++) {
        const float dw = iq_unpack(t, w + (size_t)b * bsize, v, m);
        int32_t sumi = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) s += v[i] * x[b].qs[i];
            sumi += m[j] * s;
        }
        sum += dw * x[b].d * (float)sumi;
    }
    return sum;
}

static inline void gemm_ref_iq(tm_type t, int64_t k, const void *w, size_t wrb, int64_t r0,
                               int64_t r1, const void *xq, size_t xqrb, int64_t n_tok, float *y,
                               int64_t ldy) {
    const size_t bsize = quant_type_traits((uint32_t)t)->type_size;
    for (int64_t tk = 0; tk < n_tok; tk++) {
        const tm_block_q8_k *x = (const tm_block_q8_k *)((const char *)xq + (size_t)tk * xqrb);
        for (int64_t r = r0; r < r1; r++)
            y[tk * ldy + r] = dot_iq(t, (const char *)w + (size_t)r * wrb, bsize, x, k / TM_QK_K);
    }
}

#define REF_GEMM_IQ(name, type)                                                                    \
    static void gemm_ref_##name(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,      \
                                const void *xq, size_t xqrb, int64_t n_tok, float *y,              \
                                int64_t ldy) {                                                     \
        gemm_ref_iq(type, k, w, wrb, r0, r1, xq, xqrb, n_tok, y, ldy);                             \
    }
REF_GEMM_IQ(iq2_xxs, TM_TYPE_IQ2_XXS)
REF_GEMM_IQ(iq2_xs, TM_TYPE_IQ2_XS)
REF_GEMM_IQ(iq2_s, TM_TYPE_IQ2_S)
REF_GEMM_IQ(iq3_xxs, TM_TYPE_IQ3_XXS)
REF_GEMM_IQ(iq3_s, TM_TYPE_IQ3_S)
REF_GEMM_IQ(iq1_s, TM_TYPE_IQ1_S)
REF_GEMM_IQ(iq1_m, TM_TYPE_IQ1_M)
#undef REF_GEMM_IQ

cpu_gemm_fn cpu_gemm_ref_iq_get(tm_type wtype) {
    switch (wtype) {
    case TM_TYPE_IQ2_XXS:
        return gemm_ref_iq2_xxs;
    case TM_TYPE_IQ2_XS:
        return gemm_ref_iq2_xs;
    case TM_TYPE_IQ2_S:
        return gemm_ref_iq2_s;
    case TM_TYPE_IQ3_XXS:
        return gemm_ref_iq3_xxs;
    case TM_TYPE_IQ3_S:
        return gemm_ref_iq3_s;
    case TM_TYPE_IQ1_S:
        return gemm_ref_iq1_s;
    case TM_TYPE_IQ1_M:
        return gemm_ref_iq1_m;
    default:
        return NULL;
    }
}
