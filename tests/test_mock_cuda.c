/* The host mock of the CUDA backend (tests/mock/): the stream semantics the
 * engine's GPU paths rely on (the ops are test_mock_cuda_ops.c).
 *
 * Stream: launchers return before their work runs (a cuda_wait_host blocks
 * the stream while the rest is queued behind it), work runs in order, a
 * captured graph replays its launches reading device and pinned memory at
 * replay time, synchronous calls and copies of pageable memory during a
 * capture fail instead of deadlocking, a host thread and the stream hand
 * data back and forth through mapped flags for many rounds, a wait that
 * times out sets err and adds nothing, a failure inside the stream is
 * sticky. Memory: pool alignment, "pool full", NaN
 * poison, device memory accounting. */
#include "mock/mock_gpu_util.h"

/* ---- device, memory ---- */

/* MOCK_GPUS=2 with a memory size each: two devices whose pools count against
 * their own memory; a peer copy moves bytes between their pools and refuses
 * a pointer of the wrong device (what the executor's span hand-off relies on);
 * a kernel on one device's stream given the other's memory fails, also on a side
 * stream made with it current; as in CUDA, pools and launches go to the thread's current
 * device only (cuda_device_select). */
static void test_two_devices(void **state) {
    (void)state;
    setenv("MOCK_GPUS", "2", 1);
    setenv("MOCK_GPU_MIB", "64,32", 1);
    int n = 0;
    assert_int_equal(cuda_device_count(&n), TM_OK);
    assert_int_equal(n, 2);
    tm_cuda_device *d0, *d1, *none = NULL;
    assert_int_equal(cuda_device_open(2, &none), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "GPU 2 requested, 2 present"));
    assert_int_equal(cuda_device_open(0, &d0), TM_OK);
    assert_int_equal(cuda_device_open(1, &d1), TM_OK);
    unsetenv("MOCK_GPUS");
    unsetenv("MOCK_GPU_MIB");
    assert_int_equal(cuda_device_info(d1)->index, 1);
    assert_string_equal(cuda_device_info(d1)->name, "mock GPU 1");
    size_t f0, t0, f1, t1;
    tm_cuda_pool *p0, *p1;
    /* d1 opened last is current: d0's pool refused (cudaMalloc would land on d1) */
    assert_int_equal(cuda_pool_create(d0, (size_t)40 << 20, &p0), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "GPU 0 while GPU 1 is current"));
    assert_int_equal(cuda_device_select(d0), TM_OK);
    assert_int_equal(cuda_pool_create(d0, (size_t)40 << 20, &p0), TM_OK);
    assert_int_equal(cuda_device_select(d1), TM_OK);
    assert_int_equal(cuda_pool_create(d1, (size_t)40 << 20, &p1), TM_ERR_DEVICE); /* 32 MiB */
    assert_int_equal(cuda_pool_create(d1, (size_t)20 << 20, &p1), TM_OK);
    assert_int_equal(cuda_device_memory(d0, &f0, &t0), TM_OK);
    assert_int_equal(cuda_device_memory(d1, &f1, &t1), TM_OK);
    assert_int_equal(t0, (size_t)64 << 20);
    assert_int_equal(f0, (size_t)24 << 20);
    assert_int_equal(t1, (size_t)32 << 20);
    assert_int_equal(f1, (size_t)12 << 20);

    float *a, *b, *host;
    assert_int_equal(cuda_pool_alloc(p0, 4096, 0, (void **)&a), TM_OK);
    assert_int_equal(cuda_pool_alloc(p1, 4096, 0, (void **)&b), TM_OK);
    assert_int_equal(cuda_host_alloc(4096, (void **)&host), TM_OK);
    for (int i = 0; i < 1024; i++) host[i] = (float)i * 0.5f;
    assert_int_equal(cuda_copy_to_device(d0, a, host, 4096), TM_OK);
    memset(host, 0, 4096);
    assert_int_equal(cuda_copy_peer_async(d1, b, d0, a, 4096, cuda_device_stream(d0)), TM_OK);
    assert_int_equal(cuda_device_sync(d0), TM_OK);
    assert_int_equal(cuda_copy_to_host(d1, host, b, 4096), TM_OK);
    for (int i = 0; i < 1024; i++) assert_true(host[i] == (float)i * 0.5f);
    /* the devices swapped, or host memory for a device's: refused, naming both GPUs */
    assert_int_equal(cuda_copy_peer_async(d0, b, d1, a, 4096, cuda_device_stream(d0)),
                     TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "from GPU 1 to GPU 0"));
    assert_int_equal(cuda_copy_peer_async(d1, b, d0, host, 4096, cuda_device_stream(d0)),
                     TM_ERR_DEVICE);
    /* a launch on GPU 0's stream while GPU 1 is current: refused at once */
    assert_int_equal(cuda_scale(a, 2.0f, 1024, cuda_device_stream(d0)), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "GPU 0's stream while GPU 1 is current"));
    /* a kernel on one GPU's stream given the other's memory: an illegal address, sticky */
    assert_int_equal(cuda_scale(a, 2.0f, 1024, cuda_device_stream(d1)), TM_OK);
    assert_int_equal(cuda_device_sync(d1), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "illegal address"));
    assert_int_equal(cuda_device_select(d0), TM_OK);
    assert_int_equal(cuda_scale(b, 2.0f, 1024, cuda_device_stream(d0)), TM_OK);
    assert_int_equal(cuda_device_sync(d0), TM_ERR_DEVICE);
    /* a side stream belongs to the device current when it was made, as a CUDA stream does:
       its kernels launch with that device current and address its memory only */
    tm_cuda_stream side;
    assert_int_equal(cuda_device_select(d1), TM_OK);
    assert_int_equal(cuda_stream_create(&side), TM_OK);
    assert_int_equal(cuda_device_select(d0), TM_OK);
    assert_int_equal(cuda_scale(b, 2.0f, 1024, side), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "GPU 1's stream while GPU 0 is current"));
    assert_int_equal(cuda_device_select(d1), TM_OK);
    assert_int_equal(cuda_scale(b, 2.0f, 1024, side), TM_OK);
    assert_int_equal(cuda_stream_sync(side), TM_OK);
    assert_int_equal(cuda_scale(a, 2.0f, 1024, side), TM_OK);
    assert_int_equal(cuda_stream_sync(side), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "illegal address"));
    cuda_stream_free(side);
    cuda_host_free(host);
    cuda_pool_free(p0), cuda_pool_free(p1);
    assert_int_equal(cuda_device_memory(d1, &f1, NULL), TM_OK);
    assert_int_equal(f1, (size_t)32 << 20);
    cuda_device_close(d0), cuda_device_close(d1);
}

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

/* Cross-stream capture: a stream that waits on an event recorded in a capture
 * joins it; its work replays in the order issued; the capture ends only once
 * the capturing stream has waited for the joined stream's last work, directly or
 * through another joined stream that waited for it. */
static void test_graph_fork_join(void **state) {
    (void)state;
    enum { N = 8 };
    gpu g = gpu_open(0);
    float ha[N], hb[N], hy[N];
    for (int i = 0; i < N; i++) ha[i] = (float)i, hb[i] = 1.0f;
    float *a = upload(&g, ha, sizeof(ha)), *b = upload(&g, hb, sizeof(hb));
    float *side_out = dalloc(&g, sizeof(hy)), *y = dalloc(&g, sizeof(hy));
    tm_cuda_stream side;
    tm_cuda_event fork, join;
    assert_int_equal(cuda_stream_create(&side), TM_OK);
    assert_int_equal(cuda_event_create(&fork), TM_OK);
    assert_int_equal(cuda_event_create(&join), TM_OK);
    tm_cuda_graph *gr = NULL;
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_add(a, a, b, N, g.s), TM_OK); /* a += 1 */
    assert_int_equal(cuda_event_record(fork, g.s), TM_OK);
    assert_int_equal(cuda_stream_wait_event(side, fork), TM_OK);
    assert_int_equal(cuda_add(side_out, a, a, N, side), TM_OK); /* side_out = 2a */
    assert_int_equal(cuda_event_record(join, side), TM_OK);
    assert_int_equal(cuda_stream_sync(side), TM_ERR_DEVICE); /* joined: capturing */
    assert_int_equal(cuda_stream_wait_event(g.s, join), TM_OK);
    assert_int_equal(cuda_add(y, side_out, b, N, g.s), TM_OK); /* y = 2a + 1 */
    /* the sync above invalidated this capture */
    assert_int_equal(cuda_graph_end(g.s, true, &gr), TM_ERR_DEVICE);
    assert_int_equal(cuda_stream_sync(side), TM_OK); /* out of the capture again */

    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_add(a, a, b, N, g.s), TM_OK);
    assert_int_equal(cuda_event_record(fork, g.s), TM_OK);
    assert_int_equal(cuda_stream_wait_event(side, fork), TM_OK);
    assert_int_equal(cuda_add(side_out, a, a, N, side), TM_OK);
    assert_int_equal(cuda_event_record(join, side), TM_OK);
    assert_int_equal(cuda_stream_wait_event(g.s, join), TM_OK);
    assert_int_equal(cuda_add(y, side_out, b, N, g.s), TM_OK);
    assert_int_equal(cuda_graph_end(g.s, true, &gr), TM_OK);
    for (int r = 1; r <= 3; r++) {
        assert_int_equal(cuda_graph_launch(gr, g.s), TM_OK);
        assert_int_equal(cuda_stream_sync(g.s), TM_OK);
        download(&g, hy, y, sizeof(hy));
        for (int i = 0; i < N; i++) assert_true(hy[i] == 2.0f * (float)(i + r) + 1.0f);
    }
    cuda_graph_free(gr);

    /* a joined stream whose last work nobody waited for: the capture fails */
    tm_cuda_graph *bad = (tm_cuda_graph *)&g;
    assert_int_equal(cuda_graph_begin(g.s), TM_OK);
    assert_int_equal(cuda_event_record(fork, g.s), TM_OK);
    assert_int_equal(cuda_stream_wait_event(side, fork), TM_OK);
    assert_int_equal(cuda_add(side_out, a, a, N, side), TM_OK);
    assert_int_equal(cuda_graph_end(g.s, true, &bad), TM_ERR_DEVICE);
    assert_null(bad);
    /* and eager again: events order the two streams */
    assert_int_equal(cuda_add(a, a, b, N, g.s), TM_OK);
    assert_int_equal(cuda_event_record(fork, g.s), TM_OK);
    assert_int_equal(cuda_stream_wait_event(side, fork), TM_OK);
    assert_int_equal(cuda_add(side_out, a, a, N, side), TM_OK);
    assert_int_equal(cuda_stream_sync(side), TM_OK);
    download(&g, hy, side_out, sizeof(hy));
    for (int i = 0; i < N; i++) assert_true(hy[i] == 2.0f * (float)(i + 4));

    /* a fork of a fork (each GPU's copies ahead forked from a GPU's stream that joined the
       capture): side2 joins side, side joins the capturing stream, so side2 is joined
       through side as in CUDA; the capture ends and replays in order */
    tm_cuda_stream side2;
    tm_cuda_event fork2, join2;
    assert_int_equal(cuda_stream_create(&side2), TM_OK);
    assert_int_equal(cuda_event_create(&fork2), TM_OK);
    assert_int_equal(cuda_event_create(&join2), TM_OK);
    for (int joined = 1; joined >= 0; joined--) {
        tm_cuda_graph *g2 = NULL;
        assert_int_equal(cuda_graph_begin(g.s), TM_OK);
        assert_int_equal(cuda_add(a, a, b, N, g.s), TM_OK); /* a += 1 */
        assert_int_equal(cuda_event_record(fork, g.s), TM_OK);
        assert_int_equal(cuda_stream_wait_event(side, fork), TM_OK);
        assert_int_equal(cuda_event_record(fork2, side), TM_OK);
        assert_int_equal(cuda_stream_wait_event(side2, fork2), TM_OK);
        assert_int_equal(cuda_add(side_out, a, a, N, side2), TM_OK); /* side_out = 2a */
        assert_int_equal(cuda_event_record(join2, side2), TM_OK);
        assert_int_equal(cuda_stream_wait_event(side, join2), TM_OK);
        assert_int_equal(cuda_event_record(join, side), TM_OK);
        if (joined) assert_int_equal(cuda_stream_wait_event(g.s, join), TM_OK);
        assert_int_equal(cuda_add(y, side_out, b, N, g.s), TM_OK); /* y = 2a + 1 */
        if (!joined) { /* side's wait carried side2's work; nobody waited for side */
            assert_int_equal(cuda_graph_end(g.s, true, &g2), TM_ERR_DEVICE);
            assert_null(g2);
            break;
        }
        assert_int_equal(cuda_graph_end(g.s, true, &g2), TM_OK);
        for (int r = 1; r <= 2; r++) {
            assert_int_equal(cuda_graph_launch(g2, g.s), TM_OK);
            assert_int_equal(cuda_stream_sync(g.s), TM_OK);
            download(&g, hy, y, sizeof(hy));
            for (int i = 0; i < N; i++) assert_true(hy[i] == 2.0f * (float)(i + 4 + r) + 1.0f);
        }
        cuda_graph_free(g2);
    }
    cuda_event_free(fork), cuda_event_free(join);
    cuda_event_free(fork2), cuda_event_free(join2);
    cuda_stream_free(side), cuda_stream_free(side2);
    gpu_close(&g);
}

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
    assert_int_equal(cuda_mmvq(TM_TYPE_NVFP4, wd, 36, 1, 64, x, 1, y, g.s), TM_ERR_UNSUPPORTED);
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
    const tm_cuda_moe_params p = {32, 32, 2, m, m, m, {0}, false, false};
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

int main(void) {
    mock_rng_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_and_pool), cmocka_unit_test(test_async_in_order),
        cmocka_unit_test(test_graph_replay),    cmocka_unit_test(test_graph_fork_join),
        cmocka_unit_test(test_handoff),         cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_errors),          cmocka_unit_test(test_two_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
