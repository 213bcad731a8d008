/* Block layout helpers shared by the CPU kernel tests and tools
 * (test_cpu_gemm, emu_check, cpu_gemm_bench) that fill random blocks. */
#ifndef TM_TESTS_QUANT_TEST_UTIL_H
#define TM_TESTS_QUANT_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

/* iq1_m keeps its f16 d in the top nibbles of its four u16 scale words: set
 * them to d, keeping the 3-bit scales below. */
static inline void quant_test_iq1m_set_d(tm_block_iq1_m *b, tm_half d) {
    for (int i = 0; i < 4; i++)
        b->scales[2 * i + 1] = (uint8_t)((b->scales[2 * i + 1] & 0x0F) | (d >> 4 * i & 0xF) << 4);
}

/* Types whose values are d * q - dmin * m (or d * q + m): the byte offsets of
 * their two f16 scales in a block; false for the others. */
static inline bool quant_test_two_scales(tm_type t, size_t *off_d, size_t *off_m) {
    switch (t) {
    case TM_TYPE_Q4_K:
    case TM_TYPE_Q5_K:
    case TM_TYPE_Q4_1:
    case TM_TYPE_Q5_1:
        *off_d = 0, *off_m = 2;
        return true;
    case TM_TYPE_Q2_K:
        *off_d = offsetof(tm_block_q2_k, d), *off_m = offsetof(tm_block_q2_k, dmin);
        return true;
    default:
        return false;
    }
}

/* m[i]: the magnitude of weight i's parts, |d sc q| + |dmin m| (|d q| + |m|)
 * for the types with two scales (from dequantizing copies with one of them
 * zeroed), else |w_i|: what the kernels' float rounding is relative to. */
static inline tm_status quant_test_magnitudes(tm_type t, const void *w, int64_t k, float *m) {
    size_t rb = quant_row_size(t, k);
    tm_status st = quant_row_dequantize(t, w, m, k);
    if (st != TM_OK) return st;
    for (int64_t i = 0; i < k; i++) m[i] = fabsf(m[i]);
    size_t off[2];
    if (!quant_test_two_scales(t, &off[0], &off[1])) return TM_OK;
    uint8_t *c = malloc(rb);
    float *part = malloc(sizeof(float) * (size_t)k);
    size_t bs = quant_type_traits(t)->type_size;
    for (int pass = 0; pass < 2 && st == TM_OK; pass++) { /* pass 0: dmin = 0; pass 1: d = 0 */
        memcpy(c, w, rb);
        for (size_t b = 0; b < rb / bs; b++) memset(c + b * bs + off[!pass], 0, 2);
        st = quant_row_dequantize(t, c, part, k);
        for (int64_t i = 0; i < k && st == TM_OK; i++)
            m[i] = pass ? m[i] + fabsf(part[i]) : fabsf(part[i]);
    }
    free(c);
    free(part);
    return st;
}

#endif
