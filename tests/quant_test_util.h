/* Block layout helpers shared by the CPU kernel tests and tools
 * (test_cpu_gemm, emu_check, cpu_gemm_bench) that fill random blocks. */
#ifndef TM_TESTS_QUANT_TEST_UTIL_H
#define TM_TESTS_QUANT_TEST_UTIL_H

#include <stdint.h>

#include "quant/quant.h"

/* iq1_m keeps its f16 d in the top nibbles of its four u16 scale words: set
 * them to d, keeping the 3-bit scales below. */
static inline void quant_test_iq1m_set_d(tm_block_iq1_m *b, tm_half d) {
    for (int i = 0; i < 4; i++)
        b->scales[2 * i + 1] = (uint8_t)((b->scales[2 * i + 1] & 0x0F) | (d >> 4 * i & 0xF) << 4);
}

#endif
