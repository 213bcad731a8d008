/* Shared pieces of the CUDA op harness: see cuda_check.h. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tm_cuda_device *g_dev;
tm_cuda_pool *g_pool;
char g_why[512] = "built without CUDA";

int cuda_check_setup(void **state) {
    (void)state;
    if (cuda_device_open(0, &g_dev) != TM_OK) {
        snprintf(g_why, sizeof(g_why), "%s", tm_error_message());
        g_dev = NULL;
        return 0;
    }
    const tm_cuda_device_info *in = cuda_device_info(g_dev);
    printf("device: %s, cc %d.%d, %d SMs, L2 %.0f MiB, driver %d, runtime %d\n", in->name,
           in->cc_major, in->cc_minor, in->sm_count, in->l2_bytes / 1048576.0, in->driver_version,
           in->runtime_version);
    /* 1.5 GiB: the bench's rotating weight sets (~0.9 GiB) plus the checks */
    if (cuda_pool_create(g_dev, (size_t)1536 << 20, &g_pool) != TM_OK) {
        snprintf(g_why, sizeof(g_why), "%s", tm_error_message());
        cuda_device_close(g_dev);
        g_dev = NULL;
    }
    return 0;
}

int cuda_check_teardown(void **state) {
    (void)state;
    cuda_pool_free(g_pool);
    cuda_device_close(g_dev);
    return 0;
}

void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CHECK(cuda_pool_alloc(g_pool, bytes, 256, &p));
    return p;
}

void *dev_upload(const void *host, size_t bytes) {
    void *p = dev_alloc(bytes);
    CHECK(cuda_copy_to_device(g_dev, p, host, bytes));
    return p;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

void fill_normal(tm_rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * tm_rng_normal(r);
}

uint8_t *random_matrix(tm_rng *r, tm_type type, int64_t rows, int64_t k, size_t row_bytes,
                       float **deq) {
    uint8_t *w = xmalloc((size_t)rows * row_bytes);
    memset(w, 0x5a, (size_t)rows * row_bytes);
    float *src = xmalloc((size_t)k * sizeof(float));
    float *d = xmalloc((size_t)rows * k * sizeof(float));
    for (int64_t i = 0; i < rows; i++) {
        fill_normal(r, src, k, 0.5f);
        CHECK(quant_row_quantize(type, src, w + i * row_bytes, k));
        CHECK(quant_row_dequantize(type, w + i * row_bytes, d + i * k, k));
    }
    free(src);
    *deq = d;
    return w;
}

#endif /* TM_HAVE_CUDA */
