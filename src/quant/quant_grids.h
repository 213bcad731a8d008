/* Lookup grids of the i-quant types, as the GGUF format defines them
 * (generated from the gguf package by scripts/gen_quant_grids.py).
 *
 * Byte k of an entry is value k of the lattice point (little-endian), so an
 * entry can be loaded as 8 (or 4) int8 lanes:
 *   iq2_xxs/iq2_xs/iq2_s: 8 magnitudes from {8, 25, 43}
 *   iq3_xxs: 4 magnitudes from {4, 12, 20, 28, 36, 44, 52, 62}
 *   iq3_s:   4 magnitudes from {1, 3, 5, 7, 9, 11, 13, 15}
 *   iq1_s/iq1_m: 8 signed values from {-1, 0, 1} (int8 bytes)
 * quant_ksigns_iq2[i] is the 7 sign bits i with an 8th that makes the count of
 * set bits even (bit k set: value k is negative). */
#ifndef TM_QUANT_QUANT_GRIDS_H
#define TM_QUANT_QUANT_GRIDS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

extern const uint64_t quant_grid_iq2_xxs[256];
extern const uint64_t quant_grid_iq2_xs[512];
extern const uint64_t quant_grid_iq2_s[1024];
extern const uint32_t quant_grid_iq3_xxs[256];
extern const uint32_t quant_grid_iq3_s[512];
extern const uint64_t quant_grid_iq1_s[2048];
extern const uint8_t quant_ksigns_iq2[128];
extern const int8_t quant_iq4nl_values[16];

/* The delta iq1_s/iq1_m add to every grid value (its sign per group is stored). */
#define TM_IQ1_DELTA 0.125f

#ifdef __cplusplus
}
#endif
#endif
