/* Memory read bandwidth of this machine, measured with the pool's threads:
 * each thread sums its part of a large buffer (larger than the caches), best
 * of several passes. The bench prints it next to the weight bytes a model
 * streams, so the distance to the limit is on screen. */
#include <stdlib.h>
#include <string.h>

#include "core/timing.h"
#include "cpu/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct membw_job {
    const uint8_t *buf;
    size_t bytes;
    volatile uint64_t sink[64];
} membw_job;

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t membw_read_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
}
#endif

static uint64_t membw_read(const uint8_t *p, size_t n) {
#if defined(__x86_64__)
    if (cpu_features()->avx2) return membw_read_avx2(p, n);
#endif
    uint64_t acc = 0, v;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        memcpy(&v, p + i, 8);
        acc ^= v;
    }
    return acc;
}

static void membw_task(void *ctx, int ith, int nth) {
    membw_job *j = ctx;
    size_t per = (j->bytes / (size_t)nth) & ~(size_t)4095;
    j->sink[ith & 63] = membw_read(j->buf + (size_t)ith * per, per);
}

static void membw_touch(void *ctx, int ith, int nth) {
    membw_job *j = ctx;
    size_t per = (j->bytes / (size_t)nth) & ~(size_t)4095;
    memset((uint8_t *)j->buf + (size_t)ith * per, ith + 1,
           per); /* first touch by the reader thread */
}

double cpu_read_bandwidth_gbs(tm_pool *pool, size_t bytes) {
    membw_job j = {.bytes = bytes};
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, bytes)) return 0;
    j.buf = buf;
    cpu_pool_run(pool, membw_touch, &j);
    double best = 0;
    const int nth = pool ? cpu_pool_size(pool) : 1;
    const size_t read = ((bytes / (size_t)nth) & ~(size_t)4095) * (size_t)nth;
    for (int pass = 0; pass < 5; pass++) {
        uint64_t t0 = tm_time_ns();
        cpu_pool_run(pool, membw_task, &j);
        double gbs = (double)read / (double)(tm_time_ns() - t0);
        best = gbs > best ? gbs : best;
    }
    free(buf);
    return best;
}
