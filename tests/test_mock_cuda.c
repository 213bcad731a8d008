/* The host mock of the CUDA backend (tests/mock/): the stream semantics the
 * engine's GPU paths rely on, and the ops against straightforward
 * double-precision loops written here.
 *
 * Stream: launchers return before their work runs (a cuda_wait_host blocks
 * the stream while the rest is queued behind it), work runs in order, a
 * captured graph replays its launches reading device and pinned memory at
 * replay time, synchronous calls and copies of pageable memory during a
 * capture fail instead of deadlocking, a host thread and the stream hand
 * data back and forth through mapped flags for many rounds, a wait that
 * times out sets err and adds nothing, a failure inside the stream is
 * sticky. Memory: pool alignment, "pool full", NaN
 * poison, device memory accounting.
 *
 * Ops: products sum exactly dequantized weights in double and store float,
 * so they agree with a double loop to float rounding of the result (1e-6 of
 * Σ|w x|). Attention, norms and RoPE run the CPU ops in float: 1e-4 relative
 * to the largest output (f32 cache) and 5e-3 (f16 cache: keys and values
 * rounded to 11 bits, which the double reference does not do). The random
 * inputs come from seed 77, or MOCK_TEST_SEED. */
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

static tm_rng rng;

/* ---- helpers ---- */

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * tm_rng_normal(&rng);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_us(long us) {
    const struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

typedef struct gpu {
    tm_cuda_device *dev;
    tm_cuda_stream s;
    tm_cuda_pool *pool;
} gpu;

/* latency_us: MOCK_GPU_LATENCY_US for this device (read when it opens). */
static gpu gpu_open(long latency_us) {
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

static void gpu_close(gpu *g) {
    cuda_pool_free(g->pool);
    cuda_device_close(g->dev);
}

static void *dalloc(gpu *g, size_t bytes) {
    void *p = NULL;
    assert_int_equal(cuda_pool_alloc(g->pool, bytes, 0, &p), TM_OK);
    return p;
}

static void *upload(gpu *g, const void *host, size_t bytes) {
    void *p = dalloc(g, bytes);
    assert_int_equal(cuda_copy_to_device(g->dev, p, host, bytes), TM_OK);
    return p;
}

static void download(gpu *g, void *host, const void *dev, size_t bytes) {
    assert_int_equal(cuda_copy_to_host(g->dev, host, dev, bytes), TM_OK);
}

static void *mapped(size_t bytes) {
    void *h = NULL, *d = NULL;
    assert_int_equal(cuda_host_alloc_mapped(bytes, &h, &d), TM_OK);
    assert_ptr_equal(h, d);
    memset(h, 0, bytes); /* pinned memory comes uninitialised */
    return h;
}

static void store_flag(uint32_t *flag, uint32_t v) {
    __atomic_store_n(flag, v, __ATOMIC_RELEASE);
}

static uint32_t load_flag(const uint32_t *flag) {
    return __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

static void assert_close(double got, double want, double tol) {
    if (!(fabs(got - want) <= tol)) fail_msg("got %.9g, want %.9g (tol %.3g)", got, want, tol);
}

/* ---- device, memory ---- */

static void test_device_and_pool(void **state) {
    (void)state;
    int n = -1;
    setenv("MOCK_NODEV", "1", 1);
    tm_cuda_device *none = (tm_cuda_device *)&n;
    assert_int_equal(cuda_device_count(&n), TM_OK);
    assert_int_equal(n, 0);
    assert_int_equal(cuda_device_open(0, &none), TM_ERR_DEVICE);
    assert_null(none);
    assert_non_null(strstr(tm_error_message(), "mock: no device"));
    unsetenv("MOCK_NODEV");
    assert_int_equal(cuda_device_count(&n), TM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(cuda_device_open(1, &none), TM_ERR_DEVICE);

    setenv("MOCK_GPU_MIB", "64", 1);
    tm_cuda_device *dev;
    assert_int_equal(cuda_device_open(0, &dev), TM_OK);
    unsetenv("MOCK_GPU_MIB");
    const tm_cuda_device_info *info = cuda_device_info(dev);
    assert_string_equal(info->name, "mock GPU");
    assert_int_equal(info->cc_major, 9);
    assert_int_equal(info->sm_count, 132);
    size_t free_b, total_b;
    assert_int_equal(cuda_device_memory(dev, &free_b, &total_b), TM_OK);
    assert_int_equal(total_b, (size_t)64 << 20);
    assert_int_equal(free_b, total_b);

    tm_cuda_pool *pool = NULL;
    assert_int_equal(cuda_pool_create(dev, (size_t)65 << 20, &pool), TM_ERR_DEVICE);
    assert_null(pool);
    assert_int_equal(cuda_pool_create(dev, 100000, &pool), TM_OK);
    assert_int_equal(cuda_device_memory(dev, &free_b, NULL), TM_OK);
    assert_int_equal(free_b, ((size_t)64 << 20) - 100000);
    assert_int_equal(cuda_pool_size(pool), 100000);

    void *a, *b, *c, *d;
    assert_int_equal(cuda_pool_alloc(pool, 10, 0, &a), TM_OK);
    assert_int_equal((uintptr_t)a % 256, 0);
    assert_int_equal(cuda_pool_used(pool), 10);
    assert_int_equal(cuda_pool_alloc(pool, 1, 64, &b), TM_OK);
    assert_ptr_equal(b, (char *)a + 64);
    assert_int_equal(cuda_pool_alloc(pool, 3, 4096, &c), TM_OK);
    assert_int_equal((uintptr_t)c % 4096, 0);
    assert_int_equal(cuda_pool_alloc(pool, 8, 3, &d), TM_ERR_ARG);
    assert_null(d);
    const size_t used = cuda_pool_used(pool);
    assert_int_equal(cuda_pool_alloc(pool, 100000, 1, &d), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "pool full"));
    assert_int_equal(cuda_pool_used(pool), used);
    assert_int_equal(cuda_pool_alloc(pool, 100000 - used, 1, &d), TM_OK); /* exactly full */
    assert_int_equal(cuda_pool_alloc(pool, 1, 1, &d), TM_ERR_DEVICE);

    float poison[4]; /* never-written device memory reads as NaN */
    assert_int_equal(cuda_copy_to_host(dev, poison, c, sizeof(poison)), TM_OK);
    for (int i = 0; i < 4; i++) assert_true(isnan(poison[i]));
    cuda_pool_reset(pool);
    assert_int_equal(cuda_pool_used(pool), 0);
    assert_int_equal(cuda_pool_alloc(pool, 4, 0, &d), TM_OK);
    assert_ptr_equal(d, a);
    cuda_pool_free(pool);
    assert_int_equal(cuda_device_memory(dev, &free_b, NULL), TM_OK);
    assert_int_equal(free_b, (size_t)64 << 20);

    void *h = NULL;
    assert_int_equal(cuda_host_alloc(100, &h), TM_OK);
    assert_int_equal((uintptr_t)h % 64, 0);
    cuda_host_free(h);
    double rate = 0;
    float up[64], back[64];
    fill(up, 64, 1);
    assert_int_equal(cuda_pool_create(dev, 4096, &pool), TM_OK);
    assert_int_equal(cuda_pool_alloc(pool, sizeof(up), 0, &d), TM_OK);
    assert_int_equal(cuda_upload(dev, d, up, sizeof(up), &rate), TM_OK);
    assert_true(rate > 0);
    assert_int_equal(cuda_copy_to_host(dev, back, d, sizeof(back)), TM_OK);
    assert_memory_equal(up, back, sizeof(up));
    assert_int_equal(cuda_upload(dev, back, up, sizeof(up), NULL), TM_ERR_DEVICE); /* not device */
    cuda_pool_free(pool);
    cuda_device_close(dev);
}

/* ---- asynchrony and order ---- */

static void test_async_in_order(void **state) {
    (void)state;
    enum { N = 20 };
    const long lat_us = 2000;
    gpu g = gpu_open(lat_us);
    uint32_t *flag = mapped(64), *err = mapped(64);
    float *out = mapped(N * sizeof(float));
    for (int i = 0; i < N; i++) out[i] = -7.0f;
    const uint32_t one_u = 1;
    const float zero = 0.0f, one = 1.0f;
    uint32_t *seq = upload(&g, &one_u, 4);
    float *cur = upload(&g, &zero, 4), *ones = upload(&g, &one, 4);
    float *hist = dalloc(&g, N * sizeof(float));
    tm_cuda_event ev_a, ev_b;
    assert_int_equal(cuda_event_create(&ev_a), TM_OK);
    assert_int_equal(cuda_event_create(&ev_b), TM_OK);

    /* the stream waits for the host: everything below is only queued */
    assert_int_equal(cuda_wait_host(flag, seq, 10000000000ull, err, NULL, NULL, 0, g.s), TM_OK);
    const double t0 = now_ms();
    assert_int_equal(cuda_event_record(ev_a, g.s), TM_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(cuda_copy_async(hist + i, cur, 4, g.s), TM_OK);
        assert_int_equal(cuda_add(cur, cur, ones, 1, g.s), TM_OK);
    }
    const tm_cuda_span span = {out, hist, N * sizeof(float)};
    assert_int_equal(cuda_signal_host(&span, 1, flag + 8, seq, g.s), TM_OK);
    assert_int_equal(cuda_event_record(ev_b, g.s), TM_OK);
    assert_true(now_ms() - t0 < 2.0 * N * lat_us / 1000.0); /* far less than running them */
    bool idle = true;
    assert_int_equal(cuda_stream_query(g.s, &idle), TM_OK);
    assert_false(idle);
    sleep_us(20000);
    assert_int_equal(load_flag(flag + 8), 0); /* nothing past the wait has run */
    for (int i = 0; i < N; i++) assert_true(out[i] == -7.0f);

    store_flag(flag, 1); /* release the stream */
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    assert_int_equal(cuda_stream_query(g.s, &idle), TM_OK);
    assert_true(idle);
    assert_int_equal(*err, 0);
    assert_int_equal(load_flag(flag + 8), 1);
    for (int i = 0; i < N; i++) assert_true(out[i] == (float)i); /* in order */
    float ms = -1;
    assert_int_equal(cuda_event_elapsed(ev_a, ev_b, &ms), TM_OK);
    assert_true(ms >= 2.0 * N * lat_us / 1000.0); /* 2N + 1 closures each slept lat_us */

    tm_cuda_timer *timer;
    assert_int_equal(cuda_timer_create(g.dev, &timer), TM_OK);
    assert_int_equal(cuda_timer_start(timer), TM_OK);
    assert_int_equal(cuda_add(cur, cur, ones, 1, g.s), TM_OK);
    assert_int_equal(cuda_timer_stop(timer, &ms), TM_OK);
    assert_true(ms >= lat_us / 1000.0);
    cuda_timer_free(timer);
    tm_cuda_event never;
    assert_int_equal(cuda_event_create(&never), TM_OK);
    assert_int_equal(cuda_event_elapsed(ev_a, never, &ms), TM_ERR_DEVICE);
    cuda_event_free(never);
    cuda_event_free(ev_a);
    cuda_event_free(ev_b);
    cuda_host_free(flag), cuda_host_free(err), cuda_host_free(out);
    gpu_close(&g);
}

/* ---- graphs ---- */

static void test_graph_replay(void **state) {
    (void)state;
    enum { N = 8 };
    gpu g = gpu_open(0);
    float ha[N], hb[N], hy[N];
    for (int i = 0; i < N; i++) ha[i] = (float)(i + 1), hb[i] = 10.0f;
    float *a = upload(&g, ha, sizeof(ha)), *b = upload(&g, hb, sizeof(hb));
    float *y = dalloc(&g, sizeof(hy)), *acc = dalloc(&g, sizeof(hy));
    assert_int_equal(cuda_fill_bytes(g.dev, acc, 0, sizeof(hy)), TM_OK);

    tm_cuda_graph *gr = NULL, *gacc = NULL;
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_add(y, a, b, N, g.s), TM_OK);
    assert_int_equal(cuda_graph_end(g.s, true, &gr), TM_OK);
    assert_non_null(gr);
    download(&g, hy, y, sizeof(hy));
    for (int i = 0; i < N; i++) assert_true(isnan(hy[i])); /* captured, not run */

    assert_int_equal(cuda_graph_launch(gr, g.s), TM_OK);
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    download(&g, hy, y, sizeof(hy));
    for (int i = 0; i < N; i++) assert_true(hy[i] == ha[i] + 10.0f);
    for (int i = 0; i < N; i++) ha[i] = -3.0f * (float)i; /* the replay reads a anew */
    assert_int_equal(cuda_copy_to_device(g.dev, a, ha, sizeof(ha)), TM_OK);
    assert_int_equal(cuda_graph_launch(gr, g.s), TM_OK);
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    download(&g, hy, y, sizeof(hy));
    for (int i = 0; i < N; i++) assert_true(hy[i] == ha[i] + 10.0f);

    assert_int_equal(cuda_graph_begin(g.s), TM_OK); /* replays queue behind each other */
    assert_int_equal(cuda_add(acc, acc, b, N, g.s), TM_OK);
    assert_int_equal(cuda_graph_end(g.s, true, &gacc), TM_OK);
    for (int r = 0; r < 5; r++) assert_int_equal(cuda_graph_launch(gacc, g.s), TM_OK);
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    download(&g, hy, acc, sizeof(hy));
    for (int i = 0; i < N; i++) assert_true(hy[i] == 50.0f);

    /* a captured copy from pinned host memory reads it at replay time; pageable memory
     * cannot be captured */
    float *pinned = NULL;
    tm_cuda_graph *gcopy = NULL;
    assert_int_equal(cuda_host_alloc(sizeof(ha), (void **)&pinned), TM_OK);
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_copy_async(a, pinned, sizeof(ha), g.s), TM_OK);
    assert_int_equal(cuda_add(y, a, b, N, g.s), TM_OK);
    assert_int_equal(cuda_graph_end(g.s, true, &gcopy), TM_OK);
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < N; i++) pinned[i] = (float)(r * 100 + i);
        assert_int_equal(cuda_graph_launch(gcopy, g.s), TM_OK);
        assert_int_equal(cuda_stream_sync(g.s), TM_OK);
        download(&g, hy, y, sizeof(hy));
        for (int i = 0; i < N; i++) assert_true(hy[i] == (float)(r * 100 + i) + 10.0f);
    }
    tm_cuda_graph *bad = (tm_cuda_graph *)&g;
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_copy_async(a, ha, sizeof(ha), g.s), TM_ERR_DEVICE);
    assert_int_equal(cuda_graph_end(g.s, true, &bad), TM_ERR_DEVICE);
    assert_null(bad);
    cuda_graph_free(gcopy);
    cuda_host_free(pinned);

    /* synchronous calls during a capture fail and invalidate it */
    bad = (tm_cuda_graph *)&g;
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_graph_begin(g.s), TM_ERR_DEVICE);
    assert_int_equal(cuda_add(y, a, b, N, g.s), TM_OK);
    assert_int_equal(cuda_stream_sync(g.s), TM_ERR_DEVICE);
    assert_int_equal(cuda_copy_to_host(g.dev, hy, y, sizeof(hy)), TM_ERR_DEVICE);
    assert_int_equal(cuda_graph_end(g.s, true, &bad), TM_ERR_DEVICE);
    assert_null(bad);
    bool idle;
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_stream_query(g.s, &idle), TM_ERR_DEVICE);
    bad = (tm_cuda_graph *)&g;
    assert_int_equal(cuda_graph_end(g.s, false, &bad), TM_OK); /* abandoned */
    assert_null(bad);
    assert_int_equal(cuda_graph_end(g.s, false, &bad), TM_ERR_DEVICE); /* not capturing */
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);                    /* usable again */
    assert_int_equal(cuda_stream_query(g.s, &idle), TM_OK);
    assert_true(idle);
    cuda_graph_free(gr);
    cuda_graph_free(gacc);
    gpu_close(&g);
}

/* ---- hand-offs ---- */

enum { BOX_N = 64 };

typedef struct mailbox { /* mapped host memory */
    uint32_t flag_out, pad0[15];
    uint32_t flag_in, pad1[15];
    uint32_t err, pad2[15];
    float data[BOX_N], answer[BOX_N];
} mailbox;

typedef struct host_side {
    mailbox *box;
    int rounds;
    float v0[BOX_N];
    double acc[BOX_N]; /* what the stream should have added up, in float steps */
    int bad_flag, bad_data, timeouts;
} host_side;

static void *host_thread(void *arg) {
    host_side *h = arg;
    float v[BOX_N], acc[BOX_N] = {0};
    memcpy(v, h->v0, sizeof(v));
    for (int r = 1; r <= h->rounds; r++) {
        const double t0 = now_ms();
        uint32_t f;
        while ((int32_t)((f = load_flag(&h->box->flag_out)) - (uint32_t)r) < 0) {
            if (now_ms() - t0 > 10000) {
                h->timeouts++;
                return NULL;
            }
            sleep_us(5);
        }
        if (f != (uint32_t)r) h->bad_flag++; /* the stream cannot run ahead of our answer */
        for (int i = 0; i < BOX_N; i++) {
            v[i] += 1.0f;
            if (h->box->data[i] != v[i]) h->bad_data++;
        }
        if (r % 7 == 0) sleep_us(300); /* a slow answer: the add must wait for the flag */
        for (int i = 0; i < BOX_N; i++) {
            h->box->answer[i] = (float)r * 1000.0f + (float)i;
            acc[i] += h->box->answer[i];
        }
        store_flag(&h->box->flag_in, (uint32_t)r);
    }
    for (int i = 0; i < BOX_N; i++) h->acc[i] = acc[i];
    return NULL;
}

static void handoff_rounds(long latency_us, int rounds) {
    gpu g = gpu_open(latency_us);
    mailbox *box = mapped(sizeof(mailbox));
    host_side h = {.box = box, .rounds = rounds};
    fill(h.v0, BOX_N, 10);
    float ones[BOX_N];
    for (int i = 0; i < BOX_N; i++) ones[i] = 1.0f;
    float *v = upload(&g, h.v0, sizeof(h.v0)), *one = upload(&g, ones, sizeof(ones));
    float *acc = dalloc(&g, sizeof(ones));
    uint32_t *seq = dalloc(&g, 4);
    assert_int_equal(cuda_fill_bytes(g.dev, acc, 0, sizeof(ones)), TM_OK);

    /* one step: the stream computes v, hands it to the host, adds the host's answer */
    tm_cuda_graph *step;
    const tm_cuda_span span = {box->data, v, sizeof(box->data)};
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_add(v, v, one, BOX_N, g.s), TM_OK);
    assert_int_equal(cuda_signal_host(&span, 1, &box->flag_out, seq, g.s), TM_OK);
    assert_int_equal(
        cuda_wait_host(&box->flag_in, seq, 10000000000ull, &box->err, acc, box->answer, BOX_N, g.s),
        TM_OK);
    assert_int_equal(cuda_graph_end(g.s, true, &step), TM_OK);

    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, host_thread, &h), 0);
    uint32_t *seqs = malloc((size_t)rounds * sizeof(uint32_t));
    for (int r = 1; r <= rounds; r++) { /* all queued at once: the stream paces itself */
        seqs[r - 1] = (uint32_t)r;
        assert_int_equal(cuda_copy_async(seq, &seqs[r - 1], 4, g.s), TM_OK);
        assert_int_equal(cuda_graph_launch(step, g.s), TM_OK);
    }
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    pthread_join(th, NULL);
    assert_int_equal(h.timeouts, 0);
    assert_int_equal(h.bad_flag, 0);
    assert_int_equal(h.bad_data, 0);
    assert_int_equal(box->err, 0);
    float got[BOX_N];
    download(&g, got, acc, sizeof(got));
    for (int i = 0; i < BOX_N; i++) assert_true(got[i] == (float)h.acc[i]);
    free(seqs);
    cuda_graph_free(step);
    cuda_host_free(box);
    gpu_close(&g);
}

static void test_handoff(void **state) {
    (void)state;
    handoff_rounds(0, 300);
    handoff_rounds(200, 40); /* a slow stream: the host waits instead */
}

static void test_wait_timeout(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    uint32_t *flag = mapped(64), *err = mapped(64);
    float *add = mapped(4 * sizeof(float));
    const float x0[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) add[i] = 100.0f;
    float *x = upload(&g, x0, sizeof(x0)), got[4];
    const uint32_t seq_h = 5;
    uint32_t *seq = upload(&g, &seq_h, 4);

    const double t0 = now_ms();
    assert_int_equal(cuda_wait_host(flag, seq, 30000000, err, x, add, 4, g.s), TM_OK);
    assert_int_equal(cuda_stream_sync(g.s), TM_OK); /* not a stream error */
    assert_true(now_ms() - t0 >= 30.0);
    assert_int_equal(*err, 1);
    download(&g, got, x, sizeof(got));
    assert_memory_equal(got, x0, sizeof(x0)); /* nothing added */

    /* flags compare as sequence numbers: ahead passes, across the wrap too */
    *err = 0;
    const uint32_t cases[][3] = {/* flag, seq, passes */
                                 {7, 5, 1},
                                 {5, 5, 1},
                                 {4, 5, 0},
                                 {2, 0xffffffffu, 1},
                                 {0xfffffff0u, 1, 0}};
    float want = 1.0f;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        store_flag(flag, cases[c][0]);
        assert_int_equal(cuda_copy_to_device(g.dev, seq, &cases[c][1], 4), TM_OK);
        assert_int_equal(cuda_wait_host(flag, seq, 5000000, err, x, add, 1, g.s), TM_OK);
        assert_int_equal(cuda_stream_sync(g.s), TM_OK);
        assert_int_equal(*err, cases[c][2] ? 0u : 1u);
        want += cases[c][2] ? 100.0f : 0.0f;
        download(&g, got, x, 4);
        assert_true(got[0] == want);
        *err = 0;
    }
    cuda_host_free(flag), cuda_host_free(err), cuda_host_free(add);
    gpu_close(&g);
}

/* ---- errors ---- */

static void test_errors(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    float *x = dalloc(&g, 4096), *y = dalloc(&g, 4096);
    float w[64] = {0};
    void *wd = upload(&g, w, sizeof(w));
    /* checks at the launch, as the real launchers: the stream is untouched */
    tm_cuda_router_params rp = {
        .gating = TM_CUDA_GATING_SOFTMAX, .n_expert = 513, .n_used = 8, .norm_topk = 1, .scale = 1};
    assert_int_equal(cuda_router_select(&rp, x, 1, (int32_t *)y, y, NULL, g.s), TM_ERR_ARG);
    rp.n_expert = 64, rp.n_used = 33;
    assert_int_equal(cuda_router_select(&rp, x, 1, (int32_t *)y, y, NULL, g.s), TM_ERR_ARG);
    rp.n_used = 8, rp.mapped = (tm_cuda_moe_item *)y; /* a mapped list without a slot map */
    assert_int_equal(cuda_router_select(&rp, x, 1, (int32_t *)y, y, NULL, g.s), TM_ERR_ARG);
    rp.mapped = NULL;
    tm_cuda_span span = {y, x, 6};
    uint32_t *flag = mapped(64);
    assert_int_equal(cuda_signal_host(&span, 1, flag, (uint32_t *)x, g.s), TM_ERR_ARG);
    assert_int_equal(cuda_signal_host(&span, 5, flag, (uint32_t *)x, g.s), TM_ERR_ARG);
    assert_int_equal(cuda_mmvq(TM_TYPE_F32, wd, 64 * 4, 1, 64, x, 9, y, g.s), TM_ERR_ARG);
    assert_int_equal(cuda_mmvq(TM_TYPE_F32, wd, 64 * 4, 1, 64, x + 1, 1, y, g.s), TM_ERR_ARG);
    assert_int_equal(cuda_mmvq(TM_TYPE_Q4_1, wd, 40, 1, 32, x, 1, y, g.s), TM_ERR_UNSUPPORTED);
    assert_int_equal(cuda_wait_host(flag, flag, 1, flag, x, NULL, 4, g.s), TM_ERR_ARG);
    const tm_cuda_attn_params ap = {.n_head = 4,
                                    .n_head_kv = 2,
                                    .head_dim = 16,
                                    .n_ctx = 8,
                                    .kv_type = TM_TYPE_F32,
                                    .scale = 0.25f,
                                    .rms_eps = 1e-6f,
                                    .rope_base = 1e4f};
    assert_int_equal(cuda_attention(&ap, x, y, y, (int32_t *)x, 1, 9, y, NULL, g.s), TM_ERR_ARG);
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);

    /* a failure inside the stream is sticky; what was queued behind it never runs */
    uint32_t *mark = mapped(64);
    const uint32_t one = 1;
    uint32_t *seq = upload(&g, &one, 4);
    assert_int_equal(cuda_wait_host(flag, seq, 10000000000ull, flag + 1, NULL, NULL, 0, g.s),
                     TM_OK);
    float *host_only = malloc(64);
    assert_int_equal(cuda_add(y, x, host_only, 4, g.s), TM_OK); /* found when it runs */
    assert_int_equal(cuda_fill_async(mark, 0x11, 4, g.s), TM_OK);
    store_flag(flag, 1);
    assert_int_equal(cuda_stream_sync(g.s), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "cuda_add"));
    assert_non_null(strstr(tm_error_message(), "illegal address"));
    assert_int_equal(*mark, 0);
    bool idle;
    assert_int_equal(cuda_stream_query(g.s, &idle), TM_ERR_DEVICE);
    assert_int_equal(cuda_add(y, x, x, 4, g.s), TM_ERR_DEVICE);
    assert_int_equal(cuda_copy_to_host(g.dev, w, x, 4), TM_ERR_DEVICE);
    assert_int_equal(cuda_device_sync(g.dev), TM_ERR_DEVICE);
    free(host_only);
    gpu_close(&g);

    /* a value read when the op runs: an item outside its group */
    g = gpu_open(0);
    x = dalloc(&g, 4096), y = dalloc(&g, 4096);
    tm_cuda_blas *blas;
    assert_int_equal(cuda_blas_create(g.dev, &blas), TM_OK);
    float *wm = dalloc(&g, 2 * 32 * 32 * 4);
    const tm_cuda_moe_item items_h[2] = {{0, 0, 1.0f, 0}, {1, 0, 1.0f, 1}};
    tm_cuda_moe_item *items = upload(&g, items_h, sizeof(items_h));
    const tm_cuda_moe_matrix m = {wm, TM_TYPE_F32, 32 * 32 * 4, 32 * 4};
    const tm_cuda_moe_params p = {32, 32, 2, m, m, m, {0}};
    const int32_t slots[1] = {0};
    const int64_t starts[2] = {0, 2};
    const tm_cuda_moe_groups gr = {1, slots, starts, items};
    void *scratch = dalloc(&g, cuda_moe_grouped_gemm_scratch_bytes(&p, 2, 1));
    assert_int_equal(cuda_moe_grouped_gemm(blas, &p, &gr, x, 1, y, scratch, g.s), TM_OK);
    assert_int_equal(cuda_stream_sync(g.s), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "cuda_moe_grouped_gemm"));
    assert_non_null(strstr(tm_error_message(), "slot"));
    cuda_blas_free(blas);
    cuda_host_free(flag), cuda_host_free(mark);
    gpu_close(&g);
}

/* ---- products ---- */

/* Independent q8_0: a row of k values, one f16 scale and 32 int8 per block. */
static void q8_0_row(const void *row, float *out, int64_t k) {
    const uint8_t *b = row;
    for (int64_t j = 0; j < k / 32; j++, b += 34) {
        const float d = quant_f16_to_f32((tm_half)(b[0] | b[1] << 8));
        for (int i = 0; i < 32; i++) out[j * 32 + i] = d * (float)(int8_t)b[2 + i];
    }
}

static void ref_row(tm_type t, const void *row, float *out, int64_t k) {
    if (t == TM_TYPE_Q8_0)
        q8_0_row(row, out, k);
    else
        memcpy(out, row, (size_t)k * sizeof(float));
}

/* rows x k random weights of type t, row_bytes apart (pad extra bytes a row). */
static uint8_t *make_weights(tm_type t, int64_t rows, int64_t k, size_t pad, size_t *row_bytes) {
    *row_bytes = quant_row_size(t, k) + pad;
    uint8_t *w = calloc((size_t)rows, *row_bytes);
    float *src = malloc((size_t)k * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        fill(src, k, 1);
        assert_int_equal(quant_row_quantize(t, src, w + r * *row_bytes, k), TM_OK);
    }
    free(src);
    return w;
}

static void test_products(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    tm_cuda_blas *blas;
    assert_int_equal(cuda_blas_create(g.dev, &blas), TM_OK);
    const tm_type types[] = {TM_TYPE_Q8_0, TM_TYPE_F32};
    for (size_t ti = 0; ti < 2; ti++) {
        const tm_type t = types[ti];
        const int64_t rows = 37, k = 96, nt = 11;
        size_t rb;
        uint8_t *w = make_weights(t, rows, k, t == TM_TYPE_F32 ? 8 : 2, &rb);
        float x[11 * 96], y[11 * 37], row[96];
        fill(x, nt * k, 1);
        void *wd = upload(&g, w, (size_t)rows * rb);
        float *xd = upload(&g, x, sizeof(x)), *yd = dalloc(&g, sizeof(y));
        void *scratch = dalloc(&g, cuda_gemm_scratch_bytes(rows, k, nt));
        tm_half *hd = dalloc(&g, (size_t)(rows * k) * 2), h[37 * 96];
        for (int pass = 0; pass < 2; pass++) { /* mmvq with 3 tokens, gemm with 11 */
            const int64_t n = pass ? nt : 3;
            assert_int_equal(cuda_fill_bytes(g.dev, yd, 0xff, sizeof(y)), TM_OK);
            if (pass)
                assert_int_equal(cuda_gemm(blas, t, wd, rb, rows, k, xd, n, yd, scratch, g.s),
                                 TM_OK);
            else
                assert_int_equal(cuda_mmvq(t, wd, rb, rows, k, xd, n, yd, g.s), TM_OK);
            download(&g, y, yd, (size_t)(n * rows) * 4);
            for (int64_t r = 0; r < rows; r++) {
                ref_row(t, w + r * rb, row, k);
                for (int64_t tk = 0; tk < n; tk++) {
                    double s = 0, mag = 0;
                    for (int64_t i = 0; i < k; i++)
                        s += (double)row[i] * x[tk * k + i],
                            mag += fabs((double)row[i] * x[tk * k + i]);
                    assert_close(y[tk * rows + r], s, 1e-6 * mag + 1e-30);
                }
            }
        }
        assert_int_equal(cuda_dequantize_f16(t, wd, rb, rows, k, hd, g.s), TM_OK);
        download(&g, h, hd, sizeof(h));
        for (int64_t r = 0; r < rows; r++) {
            ref_row(t, w + r * rb, row, k);
            for (int64_t i = 0; i < k; i++)
                assert_int_equal(h[r * k + i], quant_f32_to_f16(row[i]));
        }
        free(w);
        cuda_pool_reset(g.pool);
    }
    cuda_blas_free(blas);
    gpu_close(&g);
}

/* ---- grouped experts ---- */

enum { ME = 32, MF = 64, MS = 4, MT = 3 }; /* n_embd, n_ff, slots, tokens */

typedef struct moe_case {
    uint8_t *gate, *up, *down; /* MS experts each, expert_stride = rows * row_bytes */
    size_t gate_rb, up_rb, down_rb;
    float x[MT * ME], y0[MT * ME];
} moe_case;

/* y[token] += weight * down(silu(gate x) * up x), in double */
static void moe_ref(const moe_case *c, int32_t slot, int32_t token, float weight, double *y) {
    double h[MF];
    float row[MF];
    for (int r = 0; r < MF; r++) {
        double gs = 0, us = 0;
        ref_row(TM_TYPE_Q8_0, c->gate + ((size_t)slot * MF + r) * c->gate_rb, row, ME);
        for (int i = 0; i < ME; i++) gs += (double)row[i] * c->x[token * ME + i];
        ref_row(TM_TYPE_Q8_0, c->up + ((size_t)slot * MF + r) * c->up_rb, row, ME);
        for (int i = 0; i < ME; i++) us += (double)row[i] * c->x[token * ME + i];
        h[r] = gs / (1 + exp(-gs)) * us;
    }
    for (int r = 0; r < ME; r++) {
        double s = 0;
        ref_row(TM_TYPE_F32, c->down + ((size_t)slot * ME + r) * c->down_rb, row, MF);
        for (int i = 0; i < MF; i++) s += (double)row[i] * h[i];
        y[token * ME + r] += weight * s;
    }
}

static void test_moe(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    moe_case c;
    c.gate = make_weights(TM_TYPE_Q8_0, MS * MF, ME, 0, &c.gate_rb);
    c.up = make_weights(TM_TYPE_Q8_0, MS * MF, ME, 0, &c.up_rb);
    c.down = make_weights(TM_TYPE_F32, MS * ME, MF, 0, &c.down_rb);
    fill(c.x, MT * ME, 1), fill(c.y0, MT * ME, 1);
    const tm_cuda_moe_params p = {
        ME,
        MF,
        MS,
        {upload(&g, c.gate, MS * MF * c.gate_rb), TM_TYPE_Q8_0, MF * c.gate_rb, c.gate_rb},
        {upload(&g, c.up, MS * MF * c.up_rb), TM_TYPE_Q8_0, MF * c.up_rb, c.up_rb},
        {upload(&g, c.down, MS * ME * c.down_rb), TM_TYPE_F32, ME * c.down_rb, c.down_rb},
        {0}};
    /* skipped: slot -1 (not cached), slot MS, token MT */
    const tm_cuda_moe_item items_h[] = {{0, 0, 0.5f, 0},  {2, 0, 0.25f, 2}, {-1, 1, 1.0f, -1},
                                        {3, 1, 0.7f, 3},  {1, 2, 0.3f, 1},  {MS, 2, 9.0f, MS},
                                        {1, MT, 1.0f, 1}, {2, 2, -0.4f, 2}};
    const int64_t n_items = sizeof(items_h) / sizeof(items_h[0]);
    double want[MT * ME];
    for (int i = 0; i < MT * ME; i++) want[i] = c.y0[i];
    for (int64_t i = 0; i < n_items; i++) {
        const tm_cuda_moe_item *it = &items_h[i];
        if (it->slot >= 0 && it->slot < MS && it->token >= 0 && it->token < MT)
            moe_ref(&c, it->slot, it->token, it->weight, want);
    }
    double mag = 0;
    for (int i = 0; i < MT * ME; i++) mag = fmax(mag, fabs(want[i]));
    tm_cuda_moe_item *items = upload(&g, items_h, sizeof(items_h));
    float *x = upload(&g, c.x, sizeof(c.x)), *y = upload(&g, c.y0, sizeof(c.y0)), got[MT * ME];
    float *h = dalloc(&g, (size_t)cuda_moe_scratch_floats(&p, n_items) * 4);
    assert_int_equal(cuda_moe_grouped(&p, items, n_items, x, MT, y, h, g.s), TM_OK);
    download(&g, got, y, sizeof(got));
    for (int i = 0; i < MT * ME; i++) assert_close(got[i], want[i], 1e-5 * mag);

    /* the same work, expert-major: slot 0 | 1 | 2 | 3 | -1 (skipped group) */
    const tm_cuda_moe_item sorted_h[] = {{0, 0, 0.5f, 0},  {1, 2, 0.3f, 1},  {1, MT, 1.0f, 1},
                                         {2, 0, 0.25f, 2}, {2, 2, -0.4f, 2}, {3, 1, 0.7f, 3},
                                         {-1, 1, 1.0f, -1}};
    const int32_t slots[] = {0, 1, 2, 3, -1};
    const int64_t starts[] = {0, 1, 3, 5, 6, 7};
    tm_cuda_blas *blas;
    assert_int_equal(cuda_blas_create(g.dev, &blas), TM_OK);
    const tm_cuda_moe_groups gr = {5, slots, starts, upload(&g, sorted_h, sizeof(sorted_h))};
    void *scratch = dalloc(&g, cuda_moe_grouped_gemm_scratch_bytes(&p, 7, 5));
    assert_int_equal(cuda_copy_to_device(g.dev, y, c.y0, sizeof(c.y0)), TM_OK);
    assert_int_equal(cuda_moe_grouped_gemm(blas, &p, &gr, x, MT, y, scratch, g.s), TM_OK);
    download(&g, got, y, sizeof(got));
    for (int i = 0; i < MT * ME; i++) assert_close(got[i], want[i], 1e-5 * mag);
    assert_int_equal(cuda_graph_begin(g.s), TM_OK); /* its host upload cannot be captured */
    assert_int_equal(cuda_moe_grouped_gemm(blas, &p, &gr, x, MT, y, scratch, g.s), TM_ERR_DEVICE);
    tm_cuda_graph *none;
    assert_int_equal(cuda_graph_end(g.s, false, &none), TM_OK);
    cuda_blas_free(blas);
    free(c.gate), free(c.up), free(c.down);
    gpu_close(&g);
}

/* ---- router ---- */

static void test_router(void **state) {
    (void)state;
    enum { E = 16, K = 4, T = 3 };
    gpu g = gpu_open(0);
    float logits[T * E];
    fill(logits, T * E, 2);
    logits[1 * E + 3] = logits[1 * E + 9] = 9.0f; /* a tie: the lower id first */
    int32_t map[E];
    for (int e = 0; e < E; e++) map[e] = e % 3 == 0 ? -1 : 100 + e;
    float *ld = upload(&g, logits, sizeof(logits));
    int32_t *mapd = upload(&g, map, sizeof(map));
    int32_t *ids = dalloc(&g, T * K * 4), ids_h[T * K];
    float *wd = dalloc(&g, T * K * 4), w_h[T * K];
    tm_cuda_moe_item *items = dalloc(&g, T * K * sizeof(tm_cuda_moe_item)), items_h[T * K];
    tm_cuda_moe_item *mitems = dalloc(&g, T * K * sizeof(tm_cuda_moe_item)), mitems_h[T * K];
    for (int gating = 0; gating < 2; gating++) {
        /* softmax: a slot map and the PCIe lane's list (2 cold slots a token) */
        const tm_cuda_router_params p = {.gating = gating ? TM_CUDA_GATING_SIGMOID
                                                          : TM_CUDA_GATING_SOFTMAX,
                                         .n_expert = E,
                                         .n_used = K,
                                         .norm_topk = gating ? 0 : 1,
                                         .scale = 2.5f,
                                         .slot_map = gating ? NULL : mapd,
                                         .mapped = gating ? NULL : mitems,
                                         .n_mapped = 2};
        assert_int_equal(cuda_router_select(&p, ld, T, ids, wd, items, g.s), TM_OK);
        download(&g, ids_h, ids, sizeof(ids_h));
        download(&g, w_h, wd, sizeof(w_h));
        download(&g, items_h, items, sizeof(items_h));
        download(&g, mitems_h, mitems, sizeof(mitems_h));
        for (int t = 0; t < T; t++) {
            double sc[E], m = -INFINITY, sum = 0, wsum = 0;
            for (int e = 0; e < E; e++) m = fmax(m, logits[t * E + e]);
            for (int e = 0; e < E; e++) {
                sc[e] = gating ? 1 / (1 + exp(-(double)logits[t * E + e]))
                               : exp((double)logits[t * E + e] - m);
                sum += sc[e];
            }
            if (!gating)
                for (int e = 0; e < E; e++) sc[e] /= sum;
            int want[K];
            bool taken[E] = {false};
            for (int j = 0; j < K; j++) { /* the best left, ties to the lower id */
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!taken[e] && (best < 0 || sc[e] > sc[best])) best = e;
                taken[best] = true, want[j] = best, wsum += sc[best];
            }
            if (t == 1 && !gating) assert_true(want[0] == 3 && want[1] == 9);
            int n_cold = 0;
            for (int j = 0; j < K; j++) {
                const double ww = (gating ? sc[want[j]] : sc[want[j]] / wsum) * 2.5;
                assert_int_equal(ids_h[t * K + j], want[j]);
                assert_close(w_h[t * K + j], ww, 1e-5 * ww);
                const tm_cuda_moe_item *it = &items_h[t * K + j];
                assert_int_equal(it->slot, gating ? want[j] : map[want[j]]);
                assert_int_equal(it->token, t);
                assert_int_equal(it->expert, want[j]);
                assert_true(it->weight == w_h[t * K + j]);
                if (gating) continue;
                const bool pcie = map[want[j]] < 0 && n_cold++ < 2; /* its id, else -1 */
                assert_int_equal(mitems_h[t * K + j].slot, pcie ? want[j] : -1);
                assert_int_equal(mitems_h[t * K + j].expert, want[j]);
                assert_true(mitems_h[t * K + j].weight == w_h[t * K + j]);
            }
        }
    }
    gpu_close(&g);
}

/* ---- norms, rope, attention ---- */

enum { NH = 4, NKV = 2, HD = 16, NCTX = 32, PROMPT = 5, STEPS = 4 };

static void ref_norm_rope(const float *src, const float *w, int64_t pos, double *out) {
    double ss = 0;
    for (int i = 0; i < HD; i++) ss += (double)src[i] * src[i];
    const double r = 1 / sqrt(ss / HD + 1e-6);
    double v[HD];
    for (int i = 0; i < HD; i++) v[i] = w ? src[i] * r * w[i] : src[i];
    for (int i = 0; i < HD / 2; i++) {
        const double th = (double)pos * pow(1e4, -2.0 * i / HD);
        out[i] = v[i] * cos(th) - v[i + HD / 2] * sin(th);
        out[i + HD / 2] = v[i] * sin(th) + v[i + HD / 2] * cos(th);
    }
}

static void test_norm_rope_add(void **state) {
    (void)state;
    enum { R = 3, N = 48 };
    gpu g = gpu_open(0);
    float x[R * N], a[R * N], w[N], got[R * N], h[R * N];
    fill(x, R * N, 2), fill(a, R * N, 1), fill(w, N, 1);
    float *xd = upload(&g, x, sizeof(x)), *ad = upload(&g, a, sizeof(a));
    float *wd = upload(&g, w, sizeof(w)), *hd = dalloc(&g, sizeof(h));
    assert_int_equal(cuda_add_rmsnorm(xd, ad, hd, wd, R, N, 1e-6f, g.s), TM_OK);
    download(&g, got, xd, sizeof(got));
    download(&g, h, hd, sizeof(h));
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < N; i++)
            ss += ((double)x[r * N + i] + a[r * N + i]) * (x[r * N + i] + a[r * N + i]);
        const double s = 1 / sqrt(ss / N + 1e-6);
        for (int i = 0; i < N; i++) {
            const double v = (double)x[r * N + i] + a[r * N + i];
            assert_close(got[r * N + i], v, 1e-6 * fabs(v));
            assert_close(h[r * N + i], v * s * w[i], 1e-5 * fabs(v * s * w[i]) + 1e-7);
        }
    }
    assert_int_equal(cuda_rmsnorm(hd, xd, NULL, R, N, 1e-6f, g.s), TM_OK); /* no gain */
    assert_int_equal(cuda_add(xd, xd, ad, R * N, g.s), TM_OK);
    download(&g, h, hd, sizeof(h));
    download(&g, x, xd, sizeof(x));
    for (int i = 0; i < R * N; i++) assert_close(x[i], (double)got[i] + a[i], 1e-6 * fabs(x[i]));
    { /* a bias over the rows */
        float y[R * N];
        assert_int_equal(cuda_add_bias(xd, wd, R, N, g.s), TM_OK);
        download(&g, y, xd, sizeof(y));
        for (int i = 0; i < R * N; i++) assert_true(y[i] == x[i] + w[i % N]);
        assert_int_equal(cuda_add_bias(xd, wd, R, 0, g.s), TM_ERR_ARG);
    }
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < N; i++) ss += (double)got[r * N + i] * got[r * N + i];
        for (int i = 0; i < N; i++)
            assert_close(h[r * N + i], got[r * N + i] / sqrt(ss / N + 1e-6), 1e-5);
    }

    float q[2 * NH * HD], q0[2 * NH * HD];
    const int32_t pos[2] = {7, 30000};
    fill(q0, 2 * NH * HD, 1);
    float *qd = upload(&g, q0, sizeof(q0));
    int32_t *posd = upload(&g, pos, sizeof(pos));
    assert_int_equal(cuda_rope_neox(qd, posd, 2, NH, HD, 1e4f, g.s), TM_OK);
    download(&g, q, qd, sizeof(q));
    for (int t = 0; t < 2; t++)
        for (int hh = 0; hh < NH; hh++) {
            double want[HD];
            ref_norm_rope(q0 + (t * NH + hh) * HD, NULL, pos[t], want);
            for (int i = 0; i < HD; i++) assert_close(q[(t * NH + hh) * HD + i], want[i], 1e-5);
        }
    gpu_close(&g);
}

typedef struct attn_ref {
    double k[NCTX][NKV * HD], v[NCTX][NKV * HD]; /* roped keys, values */
} attn_ref;

/* q/k/v for n tokens from pos0: checks q after prepare, the cache rows, and the output. */
static void attn_check_step(gpu *g, const tm_cuda_attn_params *p, attn_ref *ref, int64_t pos0,
                            int64_t n, const float *q, const float *k, const float *v,
                            const float *qn, const float *kn, float *qd, void *kc, void *vc,
                            float *outd) {
    const bool f16 = p->kv_type == TM_TYPE_F16;
    const double ktol = f16 ? 2e-3 : 1e-5, otol = f16 ? 5e-3 : 1e-4;
    float qgot[PROMPT * NH * HD], out[PROMPT * NH * HD];
    double qw[PROMPT][NH * HD], want[NH * HD];
    download(g, qgot, qd, (size_t)(n * NH * HD) * 4);
    download(g, out, outd, (size_t)(n * NH * HD) * 4);
    for (int64_t t = 0; t < n; t++) {
        const int64_t pos = pos0 + t;
        for (int h = 0; h < NH; h++) ref_norm_rope(q + (t * NH + h) * HD, qn, pos, qw[t] + h * HD);
        for (int h = 0; h < NKV; h++)
            ref_norm_rope(k + (t * NKV + h) * HD, kn, pos, ref->k[pos] + h * HD);
        for (int i = 0; i < NKV * HD; i++) ref->v[pos][i] = v[t * NKV * HD + i];
        for (int i = 0; i < NH * HD; i++) assert_close(qgot[t * NH * HD + i], qw[t][i], 1e-5);
        uint16_t row16[NKV * HD];
        float row[NKV * HD];
        for (int which = 0; which < 2; which++) {
            const void *cache = which ? vc : kc;
            const size_t off = (size_t)pos * NKV * HD * (f16 ? 2 : 4);
            if (f16) {
                download(g, row16, (const char *)cache + off, sizeof(row16));
                for (int i = 0; i < NKV * HD; i++) row[i] = quant_f16_to_f32(row16[i]);
            } else {
                download(g, row, (const char *)cache + off, sizeof(row));
            }
            const double *w = which ? ref->v[pos] : ref->k[pos];
            for (int i = 0; i < NKV * HD; i++)
                assert_close(row[i], w[i], ktol * (fabs(w[i]) + 1.0));
        }
    }
    for (int64_t t = 0; t < n; t++) {
        const int64_t pos = pos0 + t;
        double mag = 0;
        for (int h = 0; h < NH; h++) {
            const int kv = h / (NH / NKV);
            double s[NCTX], m = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= pos; j++) {
                s[j] = 0;
                for (int i = 0; i < HD; i++) s[j] += qw[t][h * HD + i] * ref->k[j][kv * HD + i];
                s[j] *= p->scale, m = fmax(m, s[j]);
            }
            for (int64_t j = 0; j <= pos; j++) sum += s[j] = exp(s[j] - m);
            for (int i = 0; i < HD; i++) {
                double o = 0;
                for (int64_t j = 0; j <= pos; j++) o += s[j] / sum * ref->v[j][kv * HD + i];
                want[h * HD + i] = o, mag = fmax(mag, fabs(o));
            }
        }
        for (int i = 0; i < NH * HD; i++) assert_close(out[t * NH * HD + i], want[i], otol * mag);
    }
}

static void test_attention(void **state) {
    (void)state;
    for (int kvt = 0; kvt < 2; kvt++) {
        gpu g = gpu_open(0);
        const tm_cuda_attn_params p = {.n_head = NH,
                                       .n_head_kv = NKV,
                                       .head_dim = HD,
                                       .n_ctx = NCTX,
                                       .kv_type = kvt ? TM_TYPE_F16 : TM_TYPE_F32,
                                       .scale = 0.25f,
                                       .rms_eps = 1e-6f,
                                       .rope_base = 1e4f};
        const size_t esz = kvt ? 2 : 4, qb = PROMPT * NH * HD * 4, kb = PROMPT * NKV * HD * 4;
        attn_ref *ref = calloc(1, sizeof(*ref));
        float q[PROMPT * NH * HD], k[PROMPT * NKV * HD], v[PROMPT * NKV * HD], qn[HD], kn[HD];
        fill(qn, HD, 1), fill(kn, HD, 1);
        float *qd = dalloc(&g, qb), *kd = dalloc(&g, kb), *vd = dalloc(&g, kb);
        float *outd = dalloc(&g, qb), *qnd = upload(&g, qn, sizeof(qn)),
              *knd = upload(&g, kn, sizeof(kn));
        void *kc = dalloc(&g, NCTX * NKV * HD * esz), *vc = dalloc(&g, NCTX * NKV * HD * esz);
        const int32_t zero = 0;
        int32_t *pos0 = upload(&g, &zero, 4);
        float *scratch =
            dalloc(&g, (size_t)cuda_attention_scratch_floats(&p, PROMPT, PROMPT) * 4 + 4);

        /* the prompt: 5 tokens from position 0 */
        fill(q, PROMPT * NH * HD, 1), fill(k, PROMPT * NKV * HD, 1), fill(v, PROMPT * NKV * HD, 1);
        assert_int_equal(cuda_copy_to_device(g.dev, qd, q, qb), TM_OK);
        assert_int_equal(cuda_copy_to_device(g.dev, kd, k, kb), TM_OK);
        assert_int_equal(cuda_copy_to_device(g.dev, vd, v, kb), TM_OK);
        assert_int_equal(cuda_attn_prepare(&p, qd, kd, vd, qnd, knd, pos0, PROMPT, kc, vc, g.s),
                         TM_OK);
        assert_int_equal(cuda_attention(&p, qd, kc, vc, pos0, PROMPT, PROMPT, outd, scratch, g.s),
                         TM_OK);
        attn_check_step(&g, &p, ref, 0, PROMPT, q, k, v, qn, kn, qd, kc, vc, outd);

        /* decode: one captured step, replayed at the position read from pos0 */
        tm_cuda_graph *step;
        assert_int_equal(cuda_graph_begin(g.s), TM_OK);
        assert_int_equal(cuda_attn_prepare(&p, qd, kd, vd, NULL, knd, pos0, 1, kc, vc, g.s), TM_OK);
        assert_int_equal(cuda_attention(&p, qd, kc, vc, pos0, 1, NCTX, outd, scratch, g.s), TM_OK);
        assert_int_equal(cuda_graph_end(g.s, true, &step), TM_OK);
        for (int32_t s = 0; s < STEPS; s++) {
            const int32_t pos = PROMPT + s;
            fill(q, NH * HD, 1), fill(k, NKV * HD, 1), fill(v, NKV * HD, 1);
            assert_int_equal(cuda_copy_async(qd, q, NH * HD * 4, g.s), TM_OK);
            assert_int_equal(cuda_copy_async(kd, k, NKV * HD * 4, g.s), TM_OK);
            assert_int_equal(cuda_copy_async(vd, v, NKV * HD * 4, g.s), TM_OK);
            assert_int_equal(cuda_copy_async(pos0, &pos, 4, g.s), TM_OK);
            assert_int_equal(cuda_graph_launch(step, g.s), TM_OK);
            assert_int_equal(cuda_stream_sync(g.s), TM_OK);
            attn_check_step(&g, &p, ref, pos, 1, q, k, v, NULL, kn, qd, kc, vc, outd);
        }
        /* a position the launch did not allow for is a fault, not a silent wrong answer */
        const int32_t far = NCTX;
        assert_int_equal(cuda_copy_to_device(g.dev, pos0, &far, 4), TM_OK);
        assert_int_equal(cuda_graph_launch(step, g.s), TM_OK);
        assert_int_equal(cuda_stream_sync(g.s), TM_ERR_DEVICE);
        assert_non_null(strstr(tm_error_message(), "cuda_attn_prepare"));
        cuda_graph_free(step);
        free(ref);
        gpu_close(&g);
    }
}

int main(void) {
    tm_rng_seed(&rng, getenv("MOCK_TEST_SEED") ? strtoull(getenv("MOCK_TEST_SEED"), NULL, 10) : 77);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_and_pool), cmocka_unit_test(test_async_in_order),
        cmocka_unit_test(test_graph_replay),    cmocka_unit_test(test_handoff),
        cmocka_unit_test(test_wait_timeout),    cmocka_unit_test(test_errors),
        cmocka_unit_test(test_products),        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_router),          cmocka_unit_test(test_norm_rope_add),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
