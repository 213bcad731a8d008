/* Kernel lab for the CPU products: single-thread GB/s of cpu_gemm (the
 * production kernels, at the level TIERMOE_CPU_LEVEL picks) for one weight
 * type and shape, with the weights in cache (one matrix read over and over)
 * and out of cache (a ring of copies larger than the last-level cache, as
 * decode meets expert matrices). Rows go in chunks of `chunk` like the lane's
 * items, so tile and prefetch effects at chunk ends show.
 *
 *   cmake --build build/release --target gemv_bench
 *   build/release/gemv_bench [type=q4_K] [k=2048] [rows=768] [n_tok=1] [chunk=64] [ring_mb=512]
 *
 * Not a test: it checks nothing and takes a few seconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/rng.h"
#include "cpu/cpu.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tm_type type_by_name(const char *s) {
    for (int t = 0; t < TM_TYPE_COUNT; t++)
        if (quant_type_traits((tm_type)t) && !strcmp(quant_type_name((tm_type)t), s))
            return (tm_type)t;
    fprintf(stderr, "gemv_bench: unknown type %s\n", s);
    exit(2);
}

/* Seconds per product of matrices w[i % n] (rows in chunks), best of 5 passes of `reps`. */
static double time_products(tm_type t, int64_t k, int64_t rows, int64_t chunk, uint8_t *const *w,
                            int n, const void *xq, size_t xrb, int64_t n_tok, float *y, int reps) {
    const size_t rb = quant_row_size(t, k);
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        const double t0 = now_s();
        for (int i = 0; i < reps; i++)
            for (int64_t r0 = 0; r0 < rows; r0 += chunk)
                cpu_gemm(t, k, w[i % n], rb, r0, r0 + chunk < rows ? r0 + chunk : rows, xq, xrb,
                         n_tok, y, rows);
        const double dt = (now_s() - t0) / reps;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    const tm_type t = type_by_name(argc > 1 ? argv[1] : "q4_K");
    const int64_t k = argc > 2 ? atoll(argv[2]) : 2048, rows = argc > 3 ? atoll(argv[3]) : 768;
    const int64_t n_tok = argc > 4 ? atoll(argv[4]) : 1, chunk = argc > 5 ? atoll(argv[5]) : 64;
    const size_t ring = (size_t)(argc > 6 ? atoll(argv[6]) : 512) << 20;
    const size_t rb = quant_row_size(t, k), mat = rb * (size_t)rows;
    int n = (int)(ring / mat) + 1;

    tm_rng r;
    tm_rng_seed(&r, 42);
    float *f = malloc(sizeof(float) * (size_t)(k * (rows > n_tok ? rows : n_tok)));
    uint8_t **w = malloc(sizeof(*w) * (size_t)n);
    w[0] = malloc(mat);
    for (int64_t row = 0; row < rows; row++) {
        for (int64_t i = 0; i < k; i++) f[i] = tm_rng_normal(&r) * 0.05f;
        if (quant_row_quantize(t, f, w[0] + rb * (size_t)row, k) != TM_OK) return 1;
    }
    for (int i = 1; i < n; i++) w[i] = malloc(mat), memcpy(w[i], w[0], mat);
    const size_t xrb = cpu_act_row_size(t, k);
    uint8_t *xq = malloc(xrb * (size_t)n_tok);
    for (int64_t i = 0; i < k * n_tok; i++) f[i] = tm_rng_normal(&r);
    for (int64_t j = 0; j < n_tok; j++) cpu_act_quantize(t, f + j * k, xq + xrb * (size_t)j, k);
    float *y = malloc(sizeof(float) * (size_t)(rows * n_tok));

    const int reps_hot = (int)(2e8 / (double)mat) + 1;
    const double hot = time_products(t, k, rows, chunk, w, 1, xq, xrb, n_tok, y, reps_hot);
    const double cold = time_products(t, k, rows, chunk, w, n, xq, xrb, n_tok, y, n);
    printf("%s k=%lld rows=%lld n_tok=%lld chunk=%lld level=%s: %.1f KB/matrix\n",
           quant_type_name(t), (long long)k, (long long)rows, (long long)n_tok, (long long)chunk,
           cpu_level_name(cpu_level_get()), mat / 1024.0);
    printf("  in cache:     %7.2f us  %6.2f GB/s\n", hot * 1e6, mat / hot * 1e-9);
    printf("  out of cache: %7.2f us  %6.2f GB/s  (ring of %d, %.0f MB)\n", cold * 1e6,
           mat / cold * 1e-9, n, (double)n * mat / 1048576.0);
    for (int i = 0; i < n; i++) free(w[i]);
    free(w), free(f), free(xq), free(y);
    return 0;
}
