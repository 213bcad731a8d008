/* The greedy token of a row of logits, for the tests that run greedy decodes
 * and compare their tokens (test_mock_gpus, test_mock_kv_ring, the placement
 * matrix, check_gpus): the first maximum, so a tie goes to the lowest id. A
 * test's own, not the engine's sampler, which is under test. */
#ifndef TM_TESTS_GREEDY_TEST_UTIL_H
#define TM_TESTS_GREEDY_TEST_UTIL_H

#include <stdint.h>

static inline int32_t test_argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

#endif
