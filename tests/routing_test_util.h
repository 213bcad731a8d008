/* Routing for tests: k distinct expert ids per token, uniformly random. */
#ifndef TM_TESTS_ROUTING_TEST_UTIL_H
#define TM_TESTS_ROUTING_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/rng.h"

static inline void test_random_ids(tm_rng *r, int32_t *ids, int64_t n_tok, uint32_t E, uint32_t k) {
    for (int64_t t = 0; t < n_tok; t++)
        for (uint32_t j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(tm_rng_u64(r) % E);
                dup = false;
                for (uint32_t q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = e;
        }
}

#endif
