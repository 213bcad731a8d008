/* Perf mode of tests/test_cuda_ops.c (TM_CUDA_BENCH=1); included by it, not a
 * public header. Times the decode shapes of Qwen3-30B-A3B:
 *   q4_K 768 x 2048 x 16 matrices (one layer's expert products for 1 token
 *   at k = 8: 8 experts x gate, up; down is 2048 x 768, timed in the moe row),
 *   q8_0 4096 x 2048 (attention q / output projections), q8_0 151936 x 2048
 *   (the output head), and the grouped experts (1 token x 8 of 128 experts);
 * and gpt-oss-20b's mxfp4 experts: 2880 x 2880 x 8 matrices (4 experts x
 * gate, up) and the grouped experts (1 token x 4 of 32).
 * Method (METHOD.md): random (not zero) weights; warm-up; each repetition is
 * bracketed by CUDA events and the median is reported; consecutive
 * repetitions read different weight copies, the rotation spanning more
 * memory than the L2 holds, so the numbers are DRAM numbers. GB/s counts the
 * bytes each launch must read (weights + activations) and write; the
 * ceiling row is a device-to-device copy (read + write bytes). */

#define BENCH_WARMUP   10
#define BENCH_ROWS_MAX 16

typedef struct bench_row {
    char op[48], shape[40];
    int n_tok;
    double us, gbs, bytes;
} bench_row;

static bench_row g_rows[BENCH_ROWS_MAX];
static int g_n_rows;
static double g_ceiling_gbs;

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void bench_add(const char *op, const char *shape, int n_tok, float *ms, int reps,
                      double bytes) {
    qsort(ms, (size_t)reps, sizeof(float), cmp_float);
    const double med = ms[reps / 2];
    if (g_n_rows == BENCH_ROWS_MAX) return;
    bench_row *r = &g_rows[g_n_rows++];
    snprintf(r->op, sizeof(r->op), "%s", op);
    snprintf(r->shape, sizeof(r->shape), "%s", shape);
    r->n_tok = n_tok;
    r->us = med * 1e3;
    r->gbs = bytes / (med * 1e-3) / 1e9;
    r->bytes = bytes;
    printf("bench %-22s %-18s n_tok %d: median %.2f us, %.0f GB/s (min %.2f us, max %.2f us, %d "
           "reps)\n",
           op, shape, n_tok, med * 1e3, r->gbs, ms[0] * 1e3, ms[reps - 1] * 1e3, reps);
}

/* Fill n_copies matrices of rows x k of `type` on the device, all from one
 * random host matrix (copies are distinct memory; values repeat, never zero). */
static uint8_t *bench_weights(tm_rng *r, tm_type type, int64_t rows, int64_t k, int n_copies,
                              double *up_gbs) {
    const size_t rb = quant_row_size(type, k), one = (size_t)rows * rb,
                 all = one * (size_t)n_copies;
    const int64_t tile_rows = rows < 512 ? rows : 512;
    uint8_t *tile = xmalloc((size_t)tile_rows * rb), *host = xmalloc(all);
    float *src = xmalloc((size_t)k * sizeof(float));
    for (int64_t i = 0; i < tile_rows; i++) {
        fill_normal(r, src, k, 0.5f);
        CHECK(quant_row_quantize(type, src, tile + i * rb, k));
    }
    for (size_t off = 0; off < all; off += (size_t)tile_rows * rb) {
        const size_t n = all - off < (size_t)tile_rows * rb ? all - off : (size_t)tile_rows * rb;
        memcpy(host + off, tile, n);
    }
    uint8_t *dst = dev_alloc(all);
    CHECK(cuda_upload(g_dev, dst, host, all, up_gbs)); /* pageable source, like the mmap'd file */
    *up_gbs /= 1e9;
    free(tile), free(host), free(src);
    return dst;
}

static void test_bench(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0xbe4c);
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    tm_cuda_timer *tm;
    CHECK(cuda_timer_create(g_dev, &tm));
    const int reps = 200;
    float *ms = xmalloc(reps * sizeof(float));
    float one;

    /* ceiling: 256 MiB device-to-device copy */
    {
        cuda_pool_reset(g_pool);
        const size_t n = (size_t)256 << 20;
        void *a = dev_alloc(n), *b = dev_alloc(n);
        CHECK(cuda_fill_bytes(g_dev, a, 0x3c, n));
        for (int i = 0; i < 3; i++) CHECK(cuda_copy_device(g_dev, b, a, n));
        for (int i = 0; i < 20; i++) {
            CHECK(cuda_timer_start(tm));
            CHECK(cuda_copy_device(g_dev, b, a, n));
            CHECK(cuda_timer_stop(tm, &ms[i]));
        }
        bench_add("d2d copy (ceiling)", "256 MiB", 0, ms, 20, 2.0 * n);
        g_ceiling_gbs = g_rows[g_n_rows - 1].gbs;
    }

    /* mmvq shapes: (type, rows, k, matrices per step, copies in rotation) */
    static const struct {
        tm_type type;
        int64_t rows, k;
        int per_step, copies;
        const char *op;
    } shapes[] = {
        {TM_TYPE_Q4_K, 768, 2048, 16, 128, "mmvq q4_K x16"},
        {TM_TYPE_Q8_0, 4096, 2048, 1, 8, "mmvq q8_0"},
        {TM_TYPE_Q8_0, 151936, 2048, 1, 1, "mmvq q8_0 (output)"},
        {TM_TYPE_MXFP4, 2880, 2880, 8, 64, "mmvq mxfp4 x8"},
    };
    double up_gbs = 0;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        cuda_pool_reset(g_pool);
        const tm_type type = shapes[si].type;
        const int64_t rows = shapes[si].rows, k = shapes[si].k;
        const size_t rb = quant_row_size(type, k), mat = (size_t)rows * rb;
        const int copies = shapes[si].copies, per = shapes[si].per_step;
        const uint8_t *w = bench_weights(&r, type, rows, k, copies, &up_gbs);
        printf("bench upload %.1f MiB of %s: %.1f GB/s\n", mat * copies / 1048576.0,
               quant_type_name(type), up_gbs);
        float *xh = xmalloc((size_t)8 * k * sizeof(float));
        fill_normal(&r, xh, 8 * k, 1.0f);
        const float *x = dev_upload(xh, (size_t)8 * k * sizeof(float));
        float *y = dev_alloc((size_t)8 * rows * sizeof(float) * per);
        free(xh);
        static const int toks[] = {1, 8};
        for (int ti = 0; ti < 2; ti++) {
            const int nt = toks[ti];
            const int n = rows > 100000 ? 50 : reps;
            int rot = 0;
            for (int i = -BENCH_WARMUP; i < n; i++) {
                CHECK(cuda_timer_start(tm));
                for (int m = 0; m < per; m++, rot = (rot + 1) % copies)
                    CHECK(cuda_mmvq(type, w + (size_t)rot * mat, rb, rows, k, x, nt,
                                    y + (size_t)m * 8 * rows, s));
                CHECK(cuda_timer_stop(tm, i >= 0 ? &ms[i] : &one));
            }
            char shape[40];
            snprintf(shape, sizeof(shape), "%lldx%lld", (long long)rows, (long long)k);
            const double bytes = per * ((double)mat + 4.0 * nt * (k + rows));
            bench_add(shapes[si].op, shape, nt, ms, n, bytes);
        }
    }

    /* grouped experts, decode: 1 token x 8 of 128 q4_K experts (2048 x 768), and
     * 1 token x 4 of 32 mxfp4 experts (2880 x 2880) */
    static const struct {
        tm_type type;
        int64_t E, F, NS;
        int k;
        const char *op, *shape;
    } moes[] = {
        {TM_TYPE_Q4_K, 2048, 768, 128, 8, "moe grouped q4_K", "1 tok x 8 of 128"},
        {TM_TYPE_MXFP4, 2880, 2880, 32, 4, "moe grouped mxfp4", "1 tok x 4 of 32"},
    };
    for (size_t mi = 0; mi < sizeof(moes) / sizeof(moes[0]); mi++) {
        cuda_pool_reset(g_pool);
        const tm_type type = moes[mi].type;
        const int64_t E = moes[mi].E, F = moes[mi].F, NS = moes[mi].NS;
        const int K = moes[mi].k;
        const size_t gb = quant_row_size(type, E), db = quant_row_size(type, F);
        tm_cuda_moe_params p;
        memset(&p, 0, sizeof(p));
        p.n_embd = E, p.n_ff = F, p.n_slots = (int32_t)NS;
        p.gate.data = bench_weights(&r, type, F, E, (int)NS, &up_gbs);
        p.up.data = bench_weights(&r, type, F, E, (int)NS, &up_gbs);
        p.down.data = bench_weights(&r, type, E, F, (int)NS, &up_gbs);
        p.gate.type = p.up.type = p.down.type = type;
        p.gate.row_bytes = p.up.row_bytes = gb, p.down.row_bytes = db;
        p.gate.expert_stride = p.up.expert_stride = F * gb, p.down.expert_stride = E * db;
        const int n = reps + BENCH_WARMUP;
        tm_cuda_moe_item *items = xmalloc((size_t)n * K * sizeof(*items));
        const uint64_t stride = (uint64_t)NS / (uint64_t)K;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < K; j++) {
                /* K distinct experts: a random offset plus a stride of NS / K */
                items[i * K + j].slot =
                    (int32_t)((tm_rng_u64(&r) % stride + stride * (uint64_t)j) % (uint64_t)NS);
                items[i * K + j].token = 0;
                items[i * K + j].weight = 1.0f / (float)K;
                items[i * K + j].expert = items[i * K + j].slot;
            }
        const tm_cuda_moe_item *items_d = dev_upload(items, (size_t)n * K * sizeof(*items));
        float *xh = xmalloc((size_t)E * sizeof(float));
        fill_normal(&r, xh, E, 1.0f);
        const float *x = dev_upload(xh, (size_t)E * sizeof(float));
        float *y = dev_alloc((size_t)E * sizeof(float)),
              *h = dev_alloc((size_t)K * F * sizeof(float));
        CHECK(cuda_fill_bytes(g_dev, y, 0, (size_t)E * sizeof(float)));
        for (int i = 0; i < n; i++) {
            CHECK(cuda_timer_start(tm));
            CHECK(cuda_moe_grouped(&p, items_d + (size_t)i * K, K, x, 1, y, h, s));
            CHECK(cuda_timer_stop(tm, i >= BENCH_WARMUP ? &ms[i - BENCH_WARMUP] : &one));
        }
        const double bytes = (double)K * (2.0 * F * gb + E * db) + 4.0 * (E * 2 + K * F * 2);
        bench_add(moes[mi].op, moes[mi].shape, 1, ms, reps, bytes);
        free(items), free(xh);
    }

    /* router: 1 and 512 tokens x 128 experts, top-8 (latency, not bandwidth) */
    {
        cuda_pool_reset(g_pool);
        float *lh = xmalloc((size_t)512 * 128 * sizeof(float));
        fill_normal(&r, lh, 512 * 128, 2.0f);
        const float *l = dev_upload(lh, (size_t)512 * 128 * sizeof(float));
        int32_t *ids = dev_alloc((size_t)512 * 8 * sizeof(int32_t));
        float *w = dev_alloc((size_t)512 * 8 * sizeof(float));
        tm_cuda_router_params rp = {.gating = TM_CUDA_GATING_SOFTMAX,
                                    .n_expert = 128,
                                    .n_used = 8,
                                    .norm_topk = 1,
                                    .scale = 1.0f};
        static const int toks[] = {1, 512};
        for (int ti = 0; ti < 2; ti++) {
            for (int i = -BENCH_WARMUP; i < reps; i++) {
                CHECK(cuda_timer_start(tm));
                CHECK(cuda_router_select(&rp, l, toks[ti], ids, w, NULL, s));
                CHECK(cuda_timer_stop(tm, i >= 0 ? &ms[i] : &one));
            }
            bench_add("router softmax top-8", "128 experts", toks[ti], ms, reps,
                      toks[ti] * (128.0 * 4 + 8.0 * 8));
        }
        free(lh);
    }

    /* floor: the bytes at 3 TB/s; launches of a few us each set another floor for small ones */
    printf("\n| op | shape | n_tok | MB moved | floor us @3TB/s | median us | GB/s | %% of d2d "
           "ceiling | %% of 3000 GB/s |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < g_n_rows; i++)
        printf("| %s | %s | %d | %.1f | %.1f | %.2f | %.0f | %.0f%% | %.0f%% |\n", g_rows[i].op,
               g_rows[i].shape, g_rows[i].n_tok, g_rows[i].bytes / 1e6,
               g_rows[i].bytes / 3e12 * 1e6, g_rows[i].us, g_rows[i].gbs,
               100.0 * g_rows[i].gbs / g_ceiling_gbs, 100.0 * g_rows[i].gbs / 3000.0);
    printf("(H100 HBM3: ~3.35 TB/s peak, ~3 TB/s reachable; the router row is latency-bound, its "
           "GB/s is "
           "only for scale)\n");
    cuda_timer_free(tm);
    free(ms);
}
