/* Shared pieces of the CUDA op harness: see cuda_check.h. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
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

check_oai_biases check_oai_biases_make(tm_rng *r, int64_t n_expert, int64_t n_ff, int64_t n_embd) {
    check_oai_biases b = {n_expert, xmalloc((size_t)(n_expert * n_ff) * sizeof(float)),
                          xmalloc((size_t)(n_expert * n_ff) * sizeof(float)),
                          xmalloc((size_t)(n_expert * n_embd) * sizeof(float))};
    fill_normal(r, b.gate, n_expert * n_ff, 4.0f), fill_normal(r, b.up, n_expert * n_ff, 4.0f);
    fill_normal(r, b.down, n_expert * n_embd, 1.0f);
    return b;
}

void check_oai_biases_free(check_oai_biases *b) {
    free(b->gate), free(b->up), free(b->down);
}

tm_cuda_moe_ext check_oai_ext(const check_oai_biases *b, int64_t n_ff, int64_t n_embd) {
    return (tm_cuda_moe_ext){TM_CUDA_MOE_SWIGLU_OAI,
                             CHECK_OAI_ALPHA,
                             CHECK_OAI_LIMIT,
                             dev_upload(b->gate, (size_t)(b->n_expert * n_ff) * sizeof(float)),
                             dev_upload(b->up, (size_t)(b->n_expert * n_ff) * sizeof(float)),
                             dev_upload(b->down, (size_t)(b->n_expert * n_embd) * sizeof(float)),
                             (int32_t)b->n_expert};
}

double check_swiglu_oai(double g, double u, double *dg, double *du) {
    const double a = CHECK_OAI_ALPHA, lim = CHECK_OAI_LIMIT;
    const double gc = fmin(g, lim), uc = fmax(-lim, fmin(u, lim));
    *dg = (1 + a * fabs(gc) / 4) * fabs(uc + 1), *du = fabs(gc);
    return gc / (1.0 + exp(-a * gc)) * (uc + 1);
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
