/* The low-bit weight types with 8-bit activations: the contract between the
 * per-type unpackers (lbx_unit_k.cuh: legacy, K, iq4 and ternary types;
 * lbx_unit_iq.cuh: the grid i-quants) and the decode kernels that use them
 * (mmvq_lbx.cuh, for cuda_mmvq_q8x and the grouped experts' 8-bit path).
 *
 * A "unit" is 32 consecutive values [32u, 32u + 32) of a row: exactly one
 * block of cuda_q8x_quantize's activations. A type unpacks unit j of a block
 * (j < BS / 32) into 8 words of 4 signed 8-bit values and a scale and an
 * offset per 16-value half h:
 *     w[32j + 16h + 4i + b] = d[h] * (int8_t)byte b of q[4h + i] - m[h]
 * so the unit's dot with activations x = d_x * xq is
 *     d_x * (d[0] S_0 + d[1] S_1 - m[0] X_0 - m[1] X_1)
 * with S_h = Σ_i __dp4a(q[4h + i], xq word 4h + i) and X_h = Σ xq over the
 * half (a __dp4a with 0x01010101, shared by every row a warp computes; only
 * types with MIN need it). Every type's values fit: q2_K 0..3 (with its min),
 * q3_K -4..3, q5_0 -16..15, q5_1 0..31, iq4 -127..113, iq2 grids ±8..±43,
 * iq3 grids ±4..±62, ternary -1..1, and iq1's g + delta (g in {-1, 0, 1},
 * delta ±1/8) as 8g ± 1 with d / 8.
 *
 * d and m are those of the reference dequantizer, computed in float in its
 * order (dequant_lowbit.cuh lists them): d[h] * q - m[h] then equals the
 * dequantized weight up to the rounding of one product, and the kernels'
 * results differ from the f32 reference by the activations' quantization
 * (the same rule as q8_0's 8-bit path) and float rounding.
 *
 * Blocks may start at any even address (66-, 110-byte blocks...): an unpacker
 * reads with the widest loads its block's alignment allows (aligned 4-byte
 * words, funnel-shifted where the block is only 2-byte aligned), never past
 * its block. */
#ifndef TM_CUDA_LBX_UNIT_CUH
#define TM_CUDA_LBX_UNIT_CUH

#include <stdint.h>

#include "cuda/dequant_lowbit.cuh"

/* One unit of a weight row, unpacked. */
struct tm_lbx_unit {
    int q[8];   /* 32 int8 values, 4 a word, value order */
    float d[2]; /* scale of each 16-value half */
    float m[2]; /* offset of each half (0 unless the type has MIN) */
};

/* Specialised per type:
 *   static constexpr int BS;      values a block (32 or 256)
 *   static constexpr int BYTES;   bytes a block
 *   static constexpr bool MIN;    whether m can be non-zero
 *   static __device__ void unit(tm_lbx_unit &w, const uint8_t *block, int j);
 * The primary template has none of these: a type without a specialisation
 * does not compile into the 8-bit kernels (their launchers reject it). */
template <int TYPE> struct tm_lbx;

#endif
