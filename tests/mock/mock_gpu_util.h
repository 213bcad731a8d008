/* What the mock tests share (test_mock_cuda.c, test_mock_cuda_ops.c): a device
 * with a stream and a pool, copies, random fill, mapped memory and flags. */
#ifndef TM_TESTS_MOCK_GPU_UTIL_H
#define TM_TESTS_MOCK_GPU_UTIL_H

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/rng.h"
#include "cuda/cuda.h"
#include "quant/quant.h"

static tm_rng rng; /* seeded by each program's main: seed 77, or MOCK_TEST_SEED */

/* ---- helpers ---- */

static inline void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * tm_rng_normal(&rng);
}

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline void sleep_us(long us) {
    const struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

typedef struct gpu {
    tm_cuda_device *dev;
    tm_cuda_stream s;
    tm_cuda_pool *pool;
} gpu;

/* latency_us: MOCK_GPU_LATENCY_US for this device (read when it opens). */
static inline gpu gpu_open(long latency_us) {
    gpu g;
    char v[32];
    snprintf(v, sizeof(v), "%ld", latency_us);
    setenv("MOCK_GPU_LATENCY_US", v, 1);
    assert_int_equal(cuda_device_open(0, &g.dev), TM_OK);
    unsetenv("MOCK_GPU_LATENCY_US");
    g.s = cuda_device_stream(g.dev);
    assert_int_equal(cuda_pool_create(g.dev, (size_t)4 << 20, &g.pool), TM_OK);
    return g;
}

static inline void gpu_close(gpu *g) {
    cuda_pool_free(g->pool);
    cuda_device_close(g->dev);
}

static inline void *dalloc(gpu *g, size_t bytes) {
    void *p = NULL;
    assert_int_equal(cuda_pool_alloc(g->pool, bytes, 0, &p), TM_OK);
    return p;
}

static inline void *upload(gpu *g, const void *host, size_t bytes) {
    void *p = dalloc(g, bytes);
    assert_int_equal(cuda_copy_to_device(g->dev, p, host, bytes), TM_OK);
    return p;
}

static inline void download(gpu *g, void *host, const void *dev, size_t bytes) {
    assert_int_equal(cuda_copy_to_host(g->dev, host, dev, bytes), TM_OK);
}

static inline void *mapped(size_t bytes) {
    void *h = NULL, *d = NULL;
    assert_int_equal(cuda_host_alloc_mapped(bytes, &h, &d), TM_OK);
    assert_ptr_equal(h, d);
    memset(h, 0, bytes); /* pinned memory comes uninitialised */
    return h;
}

static inline void store_flag(uint32_t *flag, uint32_t v) {
    __atomic_store_n(flag, v, __ATOMIC_RELEASE);
}

static inline uint32_t load_flag(const uint32_t *flag) {
    return __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

static inline void assert_close(double got, double want, double tol) {
    if (!(fabs(got - want) <= tol)) fail_msg("got %.9g, want %.9g (tol %.3g)", got, want, tol);
}

static inline void mock_rng_seed(void) {
    tm_rng_seed(&rng, getenv("MOCK_TEST_SEED") ? strtoull(getenv("MOCK_TEST_SEED"), NULL, 10) : 77);
}

#endif
