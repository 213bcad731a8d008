/* Fitting a 256-value block to an i-quant grid (quant_iq_quantize.c only).
 *
 * Every grid i-quant decodes a value as step * (grid value [+ delta]) * sign,
 * with step = d * m(sc): d the block's f16 scale, sc a 3- or 4-bit scale per
 * sub-block of 16 or 32 values, m affine in sc. The fit minimises the plain
 * squared error (no importance weights):
 *
 *  1. per sub-block, a continuous step: a few candidates relative to max|x|,
 *     each searched exactly (quant_iq_search.h) then refined once by least
 *     squares on the chosen points (which only lowers the error); the best
 *     step s_j is kept with its curvature w_j = sum of squared grid values;
 *  2. d: the candidate (a range below max s_j / m(sc_max)) that minimises
 *     sum_j w_j (d m(sc_j) - s_j)^2 with sc_j rounded, i.e. the error growth
 *     of moving each sub-block off its best step; d is rounded to f16;
 *  3. per sub-block, the two sc around s_j / d are searched exactly with the
 *     step as the decoder computes it from the f16 d, and the better kept.
 *
 * So every group's stored grid point and signs are the best ones for the step
 * the decoder will use. TIERMOE_IQ_SEARCH=fast ranks step 1's candidates by a
 * proxy (nearest level per value, no grid) instead: faster, a little worse. All-zero blocks give d = 0 (decode to zeros); inputs
 * are clamped to +-1e15 and NaN read as 0, so no input gives NaN scales. */
#ifndef TM_QUANT_QUANT_IQ_FIT_H
#define TM_QUANT_QUANT_IQ_FIT_H

#include <stdint.h>

#include "quant/quant.h"
#include "quant/quant_iq_search.h"

/* One group of 8 values: one grid index (8-dim grids) or two (4-dim), the 8
 * sign bits (bit i set: value i negative; parity types keep an even count),
 * and for iq1 whether the delta is negative. */
typedef struct iq_unit {
    uint16_t idx[2];
    uint8_t signs;
    uint8_t neg_delta;
} iq_unit;

typedef enum iq_kind_id {
    IQ_KIND_2XXS,
    IQ_KIND_2XS,
    IQ_KIND_2S,
    IQ_KIND_3XXS,
    IQ_KIND_3S,
    IQ_KIND_1S,
    IQ_KIND_1M,
    IQ_KIND_COUNT,
} iq_kind_id;

typedef struct iq_block_fit {
    tm_half d;
    uint8_t sc[TM_QK_K / 16]; /* per sub-block */
    iq_unit u[TM_QK_K / 8];   /* per 8 values */
} iq_block_fit;

/* Fit 256 values of x. */
void quant_iq_fit_block(iq_kind_id kind, const float *x, iq_block_fit *out);

/* The step the decoder uses for sub-block scale sc (the gguf package's formula). */
float quant_iq_step(iq_kind_id kind, float d, int sc);

#endif
