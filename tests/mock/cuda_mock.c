/* Host mock of the CUDA backend (src/cuda/cuda.h) so the engine's GPU paths
 * (executor, tier, hand-offs) run in CI without a GPU, under ASan.
 *
 * The model of a GPU it keeps:
 *   - one device with one compute stream; the stream is a FIFO of closures
 *     (a function and a heap copy of its argument block) run in order by one
 *     worker thread, started by cuda_device_open and joined by
 *     cuda_device_close. Launchers and *_async calls queue and return at once;
 *     pointers in the block are read when the closure runs, as a kernel's
 *     arguments are.
 *   - cuda_stream_sync waits for an empty queue and an idle worker;
 *     cuda_stream_query looks without waiting.
 *   - graphs: between cuda_graph_begin and cuda_graph_end closures are
 *     appended to a capture list instead of run; cuda_graph_launch queues a
 *     copy of each. Another stream joins the capture by waiting on an event
 *     recorded in it (CUDA's cross-stream capture): its closures go to the
 *     same list in the order the host issues them (a valid order of the
 *     graph's nodes), and waits on events recorded in the capture add
 *     nothing; cuda_graph_end fails for a joined stream whose last work the
 *     capturing stream never waited for (CUDA: unjoined). A node keeps the
 *     device of the stream it was captured on (a graph over several GPUs: each
 *     closure checks its pointers against its own GPU when replayed). A
 *     synchronous call during a capture (sync, query, the
 *     synchronous copies, an op CUDA cannot capture, a copy of pageable host
 *     memory) fails with TM_ERR_DEVICE and invalidates the capture, as in
 *     CUDA, instead of deadlocking.
 *   - a closure that fails (a bad argument found when it runs, an address
 *     outside device memory) makes the stream sticky failed: later closures
 *     are dropped, and sync, query and launches return TM_ERR_DEVICE naming the
 *     op. Checks the real launchers make before launching return their
 *     TM_ERR_ARG at once (cuda_mock_ops.c).
 *   - several devices (MOCK_GPUS): each with its memory, its pools and its
 *     compute stream; a kernel on a device's stream (a side stream's device:
 *     the one current when it was made) that reads another's pool fails as an
 *     illegal address (cuda_copy_peer_async moves data across).
 *   - memory: a pool is one aligned_alloc filled with 0xff bytes (NaN), with
 *     the real bump allocator; pinned and mapped host memory are
 *     aligned_alloc too (mapped: device address = host address). Kernels
 *     check their pointers against these blocks.
 *   - events store the host's monotonic time when their closure runs; an event
 *     belongs to the device current when it was made, and records only on that
 *     device's compute stream (CUDA: on its device's streams).
 *
 * Environment: MOCK_NODEV=1 (no device), MOCK_GPUS (devices, 1 .. MOCK_MAX_GPUS; 1),
 * MOCK_GPU_MIB (device memory, 4096; "A,B,...": each device's, the last for the rest),
 * MOCK_FAIL_SIDE_COPY=1 (copies queued on a stream of cuda_stream_create fail
 * at once: a fetch lane whose copies cannot be queued),
 * MOCK_GPU_LATENCY_US (each closure but event records first sleeps this long,
 * read at cuda_device_open: exposes races between host threads and the
 * stream). */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_mock_stream.h"

/* ---- small helpers ---- */

long mock_env_long(const char *name, long def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end = NULL;
    const long r = strtol(v, &end, 10);
    return end && *end == '\0' && r >= 0 ? r : def;
}

double mock_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static size_t round_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

bool mock_fail(char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    return false;
}

/* ---- device-addressable blocks (pools, pinned host memory) ---- */

typedef struct mock_block {
    uintptr_t base;
    size_t size;
    int dev; /* the device whose pool it is, or -1: pinned host memory (every device's) */
} mock_block;

static pthread_mutex_t g_mem_mu = PTHREAD_MUTEX_INITIALIZER;
static mock_block *g_blocks;
static size_t g_n_blocks, g_cap_blocks;
/* bytes of each device's live pools: what cuda_device_memory counts as used */
static size_t g_pool_bytes[MOCK_MAX_GPUS];

static bool block_add_dev(void *p, size_t size, int dev) {
    pthread_mutex_lock(&g_mem_mu);
    bool ok = true;
    if (g_n_blocks == g_cap_blocks) {
        const size_t cap = g_cap_blocks ? 2 * g_cap_blocks : 64;
        mock_block *b = realloc(g_blocks, cap * sizeof(*b));
        if (b)
            g_blocks = b, g_cap_blocks = cap;
        else
            ok = false;
    }
    if (ok) g_blocks[g_n_blocks++] = (mock_block){(uintptr_t)p, size, dev};
    pthread_mutex_unlock(&g_mem_mu);
    return ok;
}

static bool block_add(void *p, size_t size) {
    return block_add_dev(p, size, -1);
}

static bool block_remove(void *p) {
    pthread_mutex_lock(&g_mem_mu);
    bool found = false;
    for (size_t i = 0; i < g_n_blocks && !found; i++)
        if (g_blocks[i].base == (uintptr_t)p) {
            g_blocks[i] = g_blocks[--g_n_blocks];
            found = true;
        }
    if (g_n_blocks == 0) { /* the last one gone: leave nothing for the leak checker */
        free(g_blocks);
        g_blocks = NULL, g_cap_blocks = 0;
    }
    pthread_mutex_unlock(&g_mem_mu);
    return found;
}

/* The device whose stream the calling thread runs (-1: the host): its kernels may address pinned host memory and its own pools only, as a
 * kernel on one GPU faults on another's memory without peer access. */
_Thread_local int mock_t_dev = -1;
/* The calling host thread's current device (cudaSetDevice: 0 until cuda_device_open or
 * cuda_device_select sets it): pools are allocated on it and kernels launch only on its
 * streams, as in CUDA. */
_Thread_local int mock_t_cur = 0;

bool mock_device_range(const void *p, size_t bytes) {
    if (bytes == 0) return true;
    const uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g_mem_mu);
    bool ok = false;
    for (size_t i = 0; i < g_n_blocks && !ok; i++)
        ok = a >= g_blocks[i].base && a - g_blocks[i].base <= g_blocks[i].size &&
             bytes <= g_blocks[i].size - (a - g_blocks[i].base) &&
             (mock_t_dev < 0 || g_blocks[i].dev < 0 || g_blocks[i].dev == mock_t_dev);
    pthread_mutex_unlock(&g_mem_mu);
    return ok;
}

/* A range partly in the device-addressable blocks (device memory, pinned or
 * registered host memory) and partly outside: CUDA refuses copies of such
 * ranges ("memory regions spanning over allocations that are both registered
 * and not registered ... return CUDA_ERROR_INVALID_VALUE"), e.g. a tensor of a
 * mapped file between expert pages another context has pinned. */
static bool mock_range_straddles(const void *p, size_t bytes) {
    if (bytes == 0 || mock_device_range(p, bytes)) return false;
    const uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g_mem_mu);
    bool touches = false;
    for (size_t i = 0; i < g_n_blocks && !touches; i++)
        touches = a < g_blocks[i].base + g_blocks[i].size && g_blocks[i].base < a + bytes;
    pthread_mutex_unlock(&g_mem_mu);
    return touches;
}

static tm_status mock_copy_check(const char *op, const void *dst, const void *src, size_t bytes) {
    if (mock_range_straddles(src, bytes) || mock_range_straddles(dst, bytes))
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: %s of %zu bytes (%p -> %p): invalid argument (a range partly "
                            "registered with CUDA and partly not)",
                            op, bytes, src, dst);
    return TM_OK;
}

/* The device whose pool holds all of [p, p + bytes): its index, -1 for pinned
 * host memory, -2 for neither. */
static int block_device(const void *p, size_t bytes) {
    const uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g_mem_mu);
    int dev = -2;
    for (size_t i = 0; i < g_n_blocks && dev == -2; i++)
        if (a >= g_blocks[i].base && a - g_blocks[i].base <= g_blocks[i].size &&
            bytes <= g_blocks[i].size - (a - g_blocks[i].base))
            dev = g_blocks[i].dev;
    pthread_mutex_unlock(&g_mem_mu);
    return dev;
}

/* ---- device ---- */

struct tm_cuda_device {
    tm_cuda_device_info info;
    struct CUstream_st *stream;
};

static bool no_device(void) {
    const char *v = getenv("MOCK_NODEV");
    return v && *v && strcmp(v, "0") != 0;
}

static int n_devices(void) {
    if (no_device()) return 0;
    const long n = mock_env_long("MOCK_GPUS", 1);
    return n < 1 ? 1 : n > MOCK_MAX_GPUS ? MOCK_MAX_GPUS : (int)n;
}

/* Device index's memory in MiB: MOCK_GPU_MIB's index-th item (its last for the rest). */
static size_t device_mib(int index) {
    const char *v = getenv("MOCK_GPU_MIB");
    long mib = 4096;
    for (int i = 0; v && *v && i <= index; i++) {
        char *end = NULL;
        const long r = strtol(v, &end, 10);
        if (end == v || r < 0) break;
        mib = r;
        if (*end != ',') break;
        v = end + 1;
    }
    return (size_t)mib;
}

tm_status cuda_device_count(int *out) {
    *out = n_devices();
    return TM_OK;
}

tm_status cuda_device_open(int index, tm_cuda_device **out) {
    *out = NULL;
    if (no_device()) return tm_error_set(TM_ERR_DEVICE, "mock: no device");
    const int n = n_devices();
    if (index < 0 || index >= n)
        return tm_error_set(TM_ERR_DEVICE, "mock: GPU %d requested, %d present", index, n);
    tm_cuda_device *dev = calloc(1, sizeof(*dev));
    if (!dev) return tm_error_set(TM_ERR_NOMEM, "mock: out of host memory for the device");
    /* device 0 keeps the one-GPU mock's name (calibration files are keyed by it) */
    if (index)
        snprintf(dev->info.name, sizeof(dev->info.name), "mock GPU %d", index);
    else
        snprintf(dev->info.name, sizeof(dev->info.name), "mock GPU");
    dev->info.index = index;
    dev->info.cc_major = 9, dev->info.cc_minor = 0, dev->info.sm_count = 132;
    dev->info.driver_version = 13000, dev->info.runtime_version = 13000;
    dev->info.l2_bytes = (size_t)50 << 20;
    dev->info.total_bytes = device_mib(index) << 20;
    if (!(dev->stream = mock_stream_create(index))) {
        free(dev);
        return tm_error_set(TM_ERR_DEVICE, "mock: cannot start the stream's worker thread");
    }
    mock_t_cur = index; /* cudaSetDevice on the opening thread, as the real open */
    *out = dev;
    return TM_OK;
}

void cuda_device_close(tm_cuda_device *dev) {
    if (!dev) return;
    mock_stream_destroy(dev->stream);
    free(dev);
}

const tm_cuda_device_info *cuda_device_info(const tm_cuda_device *dev) {
    return &dev->info;
}

tm_status cuda_device_select(tm_cuda_device *dev) {
    mock_t_cur = dev->info.index;
    return TM_OK;
}

/* Every pair has peer access here (the copy is the same closure either way). */
tm_status cuda_device_peer_enable(tm_cuda_device *dev, tm_cuda_device *peer, bool *on) {
    *on = dev->info.index != peer->info.index;
    mock_t_cur = dev->info.index; /* leaves dev current, as CUDA's */
    return TM_OK;
}

tm_status cuda_device_memory(tm_cuda_device *dev, size_t *free_bytes, size_t *total_bytes) {
    const size_t total = dev->info.total_bytes;
    pthread_mutex_lock(&g_mem_mu);
    const size_t used = g_pool_bytes[dev->info.index];
    pthread_mutex_unlock(&g_mem_mu);
    if (free_bytes) *free_bytes = used < total ? total - used : 0;
    if (total_bytes) *total_bytes = total;
    return TM_OK;
}

tm_cuda_stream cuda_device_stream(const tm_cuda_device *dev) {
    return dev->stream;
}

tm_status cuda_device_sync(tm_cuda_device *dev) {
    return cuda_stream_sync(dev->stream);
}

/* ---- device memory pool ---- */

struct tm_cuda_pool {
    tm_cuda_device *dev;
    char *base;
    size_t size, used;
};

tm_status cuda_pool_create(tm_cuda_device *dev, size_t bytes, tm_cuda_pool **out) {
    *out = NULL;
    if (dev->info.index != mock_t_cur) /* cudaMalloc allocates on the current device */
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_pool_create for GPU %d while GPU %d is current (the "
                            "thread must cuda_device_select it)",
                            dev->info.index, mock_t_cur);
    const size_t total = dev->info.total_bytes;
    pthread_mutex_lock(&g_mem_mu);
    size_t *used = &g_pool_bytes[dev->info.index];
    const size_t free_b = *used < total ? total - *used : 0;
    const bool fits = bytes <= free_b;
    if (fits) *used += bytes; /* reserved before the allocation: no race with another */
    pthread_mutex_unlock(&g_mem_mu);
    if (!fits)
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cannot allocate the %.1f MiB device pool on %s: %.1f MiB free "
                            "of %.1f MiB (out of memory)",
                            bytes / 1048576.0, dev->info.name, free_b / 1048576.0,
                            total / 1048576.0);
    tm_cuda_pool *p = calloc(1, sizeof(*p));
    const size_t alloc = round_up(bytes ? bytes : 1, 256);
    char *base = p ? aligned_alloc(256, alloc) : NULL;
    if (!base || !block_add_dev(base, bytes, dev->info.index)) {
        free(base), free(p);
        pthread_mutex_lock(&g_mem_mu);
        *used -= bytes;
        pthread_mutex_unlock(&g_mem_mu);
        return tm_error_set(TM_ERR_NOMEM, "mock: out of host memory for a %.1f MiB pool",
                            bytes / 1048576.0);
    }
    memset(base, 0xff, alloc); /* NaN poison: a read of never-written memory shows */
    p->dev = dev, p->base = base, p->size = bytes;
    *out = p;
    return TM_OK;
}

tm_status cuda_pool_alloc(tm_cuda_pool *pool, size_t bytes, size_t align, void **out) {
    *out = NULL;
    if (align == 0) align = 256;
    if (align & (align - 1))
        return tm_error_set(TM_ERR_ARG, "cuda_pool_alloc: alignment %zu is not a power of two",
                            align);
    const uintptr_t base = (uintptr_t)pool->base;
    const uintptr_t at = (base + pool->used + align - 1) & ~(uintptr_t)(align - 1);
    const size_t off = (size_t)(at - base);
    if (off > pool->size || bytes > pool->size - off)
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: device pool full: %zu bytes requested, %zu of %zu used", bytes,
                            pool->used, pool->size);
    pool->used = off + bytes;
    *out = pool->base + off;
    return TM_OK;
}

void cuda_pool_reset(tm_cuda_pool *pool) {
    pool->used = 0;
}

size_t cuda_pool_used(const tm_cuda_pool *pool) {
    return pool->used;
}

size_t cuda_pool_size(const tm_cuda_pool *pool) {
    return pool->size;
}

void cuda_pool_free(tm_cuda_pool *pool) {
    if (!pool) return;
    block_remove(pool->base);
    pthread_mutex_lock(&g_mem_mu);
    g_pool_bytes[pool->dev->info.index] -= pool->size;
    pthread_mutex_unlock(&g_mem_mu);
    free(pool->base);
    free(pool);
}

/* ---- host memory ---- */

tm_status cuda_host_alloc(size_t bytes, void **out) {
    *out = NULL;
    const size_t alloc = round_up(bytes ? bytes : 1, 64);
    void *p = aligned_alloc(64, alloc);
    if (!p || !block_add(p, alloc)) {
        free(p);
        return tm_error_set(TM_ERR_DEVICE, "mock: cannot pin %.1f MiB of host memory",
                            bytes / 1048576.0);
    }
    *out = p;
    return TM_OK;
}

tm_status cuda_host_alloc_mapped(size_t bytes, void **host, void **dev) {
    *host = *dev = NULL;
    tm_status st = cuda_host_alloc(bytes, host);
    if (st != TM_OK) return st;
    *dev = *host; /* unified addressing */
    return TM_OK;
}

void cuda_host_free(void *p) {
    if (!p) return;
    if (!block_remove(p)) {
        fprintf(stderr, "mock: cuda_host_free(%p): not memory from cuda_host_alloc\n", p);
        abort();
    }
    free(p);
}

/* The span becomes device-addressable at its own address; as CUDA, an
 * overlap with a registered span fails. MOCK_NOREGISTER=1: every
 * registration fails (a host that cannot pin). */
tm_status cuda_host_register(void *p, size_t bytes, bool read_only, void **dev) {
    (void)read_only;
    *dev = NULL;
    if (mock_env_long("MOCK_NOREGISTER", 0))
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cannot pin and map %.1f MiB of host memory "
                            "(MOCK_NOREGISTER)",
                            bytes / 1048576.0);
    const uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g_mem_mu);
    bool overlap = false;
    for (size_t i = 0; i < g_n_blocks; i++)
        overlap |= a < g_blocks[i].base + g_blocks[i].size && g_blocks[i].base < a + bytes;
    pthread_mutex_unlock(&g_mem_mu);
    if (overlap || !bytes)
        return tm_error_set(TM_ERR_DEVICE, "mock: cuda_host_register(%p, %zu): %s", p, bytes,
                            overlap ? "overlaps registered memory" : "empty");
    if (!block_add(p, bytes)) return tm_error_set(TM_ERR_NOMEM, "mock: out of memory");
    *dev = p;
    return TM_OK;
}

void cuda_host_unregister(void *p) {
    if (p && !block_remove(p)) {
        fprintf(stderr, "mock: cuda_host_unregister(%p): not registered\n", p);
        abort();
    }
}

/* ---- copies and fills ---- */

typedef struct copy_arg {
    void *dst;
    const void *src;
    size_t bytes;
} copy_arg;

static bool copy_run(void *arg, char *err, size_t err_size) {
    const copy_arg *a = arg;
    if (a->bytes) memmove(a->dst, a->src, a->bytes);
    return true;
}

typedef struct fill_arg {
    void *dst;
    int byte;
    size_t bytes;
} fill_arg;

static bool fill_run(void *arg, char *err, size_t err_size) {
    const fill_arg *a = arg;
    if (a->bytes) memset(a->dst, a->byte, a->bytes);
    return true;
}

/* A graph cannot hold a copy to or from pageable host memory (CUDA refuses
 * it during the capture): anything outside the device-addressable blocks. */
static tm_status capture_pageable(tm_cuda_stream s, const char *op, const void *dst,
                                  const void *src, size_t bytes) {
    tm_status st = mock_stream_check(s, op);
    if (st != TM_OK || !bytes) return st;
    const bool pageable = !mock_device_range(dst, bytes) || (src && !mock_device_range(src, bytes));
    pthread_mutex_lock(&s->mu);
    if (s->capturing && pageable) {
        char what[64];
        snprintf(what, sizeof(what), "%s of pageable host memory", op);
        st = mock_capture_break(s, what);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

tm_status cuda_copy_async(void *dst, const void *src, size_t bytes, tm_cuda_stream stream) {
    const copy_arg a = {dst, src, bytes};
    if (stream && stream->side && mock_env_long("MOCK_FAIL_SIDE_COPY", 0))
        return tm_error_set(TM_ERR_DEVICE, "mock: cuda_copy_async on a side stream refused "
                                           "(MOCK_FAIL_SIDE_COPY)");
    tm_status st = mock_copy_check("cuda_copy_async", dst, src, bytes);
    if (st == TM_OK) st = capture_pageable(stream, "cuda_copy_async", dst, src, bytes);
    return st != TM_OK ? st
                       : mock_stream_launch(stream, "cuda_copy_async", copy_run, &a, sizeof(a));
}

tm_status cuda_fill_async(void *dst, int byte, size_t bytes, tm_cuda_stream stream) {
    const fill_arg a = {dst, byte, bytes};
    tm_status st = capture_pageable(stream, "cuda_fill_async", dst, NULL, bytes);
    return st != TM_OK ? st
                       : mock_stream_launch(stream, "cuda_fill_async", fill_run, &a, sizeof(a));
}

/* The real copy goes over NVLink or PCIe (cudaMemcpyPeerAsync); here the check
 * that each side lies in its own device's pool is what a wrong device index
 * would break. */
tm_status cuda_copy_peer_async(tm_cuda_device *dst_dev, void *dst, tm_cuda_device *src_dev,
                               const void *src, size_t bytes, tm_cuda_stream stream) {
    if (!bytes) return TM_OK;
    const int dd = block_device(dst, bytes), sd = block_device(src, bytes);
    if (dd != dst_dev->info.index || sd != src_dev->info.index)
        return tm_error_set(
            TM_ERR_DEVICE,
            "mock: cuda_copy_peer_async of %zu bytes from GPU %d to GPU %d: the "
            "source is %s%d's, the destination %s%d's (invalid argument)",
            bytes, src_dev->info.index, dst_dev->info.index, sd < 0 ? "not a pool of GPU " : "GPU ",
            sd < 0 ? src_dev->info.index : sd, dd < 0 ? "not a pool of GPU " : "GPU ",
            dd < 0 ? dst_dev->info.index : dd);
    const copy_arg a = {dst, src, bytes};
    return mock_stream_launch(stream, "cuda_copy_peer_async", copy_run, &a, sizeof(a));
}

/* Queue, then wait: refused during a capture, as a stream synchronisation is. */
static tm_status sync_op(tm_cuda_device *dev, const char *op, mock_fn fn, const void *arg,
                         size_t size) {
    tm_status st = mock_not_in_capture(dev->stream, op);
    if (st == TM_OK) st = mock_stream_launch(dev->stream, op, fn, arg, size);
    if (st == TM_OK) st = cuda_stream_sync(dev->stream);
    return st;
}

tm_status cuda_copy_to_device(tm_cuda_device *dev, void *dst, const void *host_src, size_t bytes) {
    const copy_arg a = {dst, host_src, bytes};
    tm_status st = mock_copy_check("cuda_copy_to_device", dst, host_src, bytes);
    return st != TM_OK ? st : sync_op(dev, "cuda_copy_to_device", copy_run, &a, sizeof(a));
}

tm_status cuda_copy_to_host(tm_cuda_device *dev, void *host_dst, const void *src, size_t bytes) {
    const copy_arg a = {host_dst, src, bytes};
    tm_status st = mock_copy_check("cuda_copy_to_host", host_dst, src, bytes);
    return st != TM_OK ? st : sync_op(dev, "cuda_copy_to_host", copy_run, &a, sizeof(a));
}

tm_status cuda_fill_bytes(tm_cuda_device *dev, void *dst, int byte, size_t bytes) {
    const fill_arg a = {dst, byte, bytes};
    return sync_op(dev, "cuda_fill_bytes", fill_run, &a, sizeof(a));
}

tm_status cuda_copy_device(tm_cuda_device *dev, void *dst, const void *src, size_t bytes) {
    const copy_arg a = {dst, src, bytes};
    tm_status st = capture_pageable(dev->stream, "cuda_copy_device", dst, src, bytes);
    if (st != TM_OK) return st;
    return mock_stream_launch(dev->stream, "cuda_copy_device", copy_run, &a, sizeof(a));
}

/* The real upload runs on a stream of its own, ordered with nothing on the
 * compute stream, and returns when complete: a memcpy on this thread. */
tm_status cuda_upload(tm_cuda_device *dev, void *dst, const void *host_src, size_t bytes,
                      double *bytes_per_s) {
    if (bytes_per_s) *bytes_per_s = 0;
    if (!mock_device_range(dst, bytes))
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_upload: %zu bytes at %p are not device memory", bytes, dst);
    const double t0 = mock_now_ms();
    if (bytes) memcpy(dst, host_src, bytes);
    const double dt = (mock_now_ms() - t0) * 1e-3;
    if (bytes_per_s) *bytes_per_s = dt > 0 ? (double)bytes / dt : 1e12;
    return TM_OK;
}
