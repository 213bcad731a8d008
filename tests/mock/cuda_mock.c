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

#include "cuda_mock.h"

/* ---- small helpers ---- */

static long env_long(const char *name, long def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end = NULL;
    const long r = strtol(v, &end, 10);
    return end && *end == '\0' && r >= 0 ? r : def;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
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

#define MOCK_MAX_GPUS 8

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
static _Thread_local int t_dev = -1;
/* The calling host thread's current device (cudaSetDevice: 0 until cuda_device_open or
 * cuda_device_select sets it): pools are allocated on it and kernels launch only on its
 * streams, as in CUDA. */
static _Thread_local int t_cur = 0;

bool mock_device_range(const void *p, size_t bytes) {
    if (bytes == 0) return true;
    const uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&g_mem_mu);
    bool ok = false;
    for (size_t i = 0; i < g_n_blocks && !ok; i++)
        ok = a >= g_blocks[i].base && a - g_blocks[i].base <= g_blocks[i].size &&
             bytes <= g_blocks[i].size - (a - g_blocks[i].base) &&
             (t_dev < 0 || g_blocks[i].dev < 0 || g_blocks[i].dev == t_dev);
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

/* ---- closures and the stream ---- */

typedef struct mock_closure {
    struct mock_closure *next;
    mock_fn fn;
    void (*queued)(void *arg); /* when it enters a run queue (not a capture): events */
    void (*cancel)(void *arg); /* instead of fn once the stream has failed: events */
    const char *op;
    bool delay;  /* MOCK_GPU_LATENCY_US applies */
    bool placed; /* dev set: the stream it was first put on (a graph's node keeps its GPU) */
    int dev;     /* that stream's device */
    size_t size;
    max_align_t arg[]; /* size bytes */
} mock_closure;

static mock_closure *closure_new(const char *op, mock_fn fn, const void *arg, size_t size) {
    mock_closure *c = malloc(sizeof(*c) + size);
    if (!c) return NULL;
    memset(c, 0, sizeof(*c));
    c->fn = fn, c->op = op, c->delay = true, c->size = size;
    if (size) memcpy(c->arg, arg, size);
    return c;
}

static void closure_list_free(mock_closure *c) {
    while (c) {
        mock_closure *next = c->next;
        free(c);
        c = next;
    }
}

struct CUstream_st {
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    pthread_t thread;
    mock_closure *head, *tail; /* queued, not started */
    bool busy, stop;           /* the worker runs a closure; close asked */
    bool capturing, cap_invalid;
    mock_closure *cap_head, *cap_tail;
    struct CUstream_st *origin; /* joined into this stream's capture (NULL: none) */
    /* capturing: the streams that joined it (each GPU's compute stream and copies ahead) */
    struct CUstream_st *joined[2 * MOCK_MAX_GPUS];
    int n_joined;
    bool unjoined;    /* joined: work since the origin last waited for it */
    char cap_why[96]; /* what invalidated the capture */
    bool failed;      /* sticky */
    bool side;        /* made by cuda_stream_create (MOCK_FAIL_SIDE_COPY) */
    int dev;          /* its device: a compute stream's, or the one current when a side
                         stream was made (as CUDA's streams belong to a device) */
    char err[640];
    long latency_us;
};

static void *stream_worker(void *p) {
    struct CUstream_st *s = p;
    char err[512];
    t_dev = s->dev;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work, &s->mu);
        if (!s->head) break; /* stop, and everything queued has run */
        mock_closure *c = s->head;
        s->head = c->next;
        if (!s->head) s->tail = NULL;
        s->busy = true;
        const bool skip = s->failed;
        pthread_mutex_unlock(&s->mu);
        bool ok = true;
        if (skip) {
            if (c->cancel) c->cancel(c->arg);
        } else {
            if (c->delay && s->latency_us > 0) sleep_us(s->latency_us);
            t_dev = c->placed ? c->dev : s->dev; /* a replayed graph's node: its own GPU's */
            err[0] = '\0';
            ok = c->fn(c->arg, err, sizeof(err));
        }
        pthread_mutex_lock(&s->mu);
        if (!ok && !s->failed) {
            s->failed = true;
            snprintf(s->err, sizeof(s->err), "%s: %s", c->op, err);
        }
        free(c);
        s->busy = false;
        if (!s->head) pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Under s->mu. */
static tm_status stream_sticky(const struct CUstream_st *s) {
    return tm_error_set(TM_ERR_DEVICE, "mock GPU: the stream failed: %s", s->err);
}

/* Under s->mu: a synchronous call during a capture. */
static tm_status capture_break(struct CUstream_st *s, const char *op) {
    if (!s->cap_invalid) snprintf(s->cap_why, sizeof(s->cap_why), "%s", op);
    s->cap_invalid = true;
    return tm_error_set(TM_ERR_DEVICE,
                        "mock GPU: %s while the stream is capturing a graph (CUDA: operation not "
                        "permitted when stream is capturing); the capture is invalidated",
                        op);
}

/* Queue a NULL-terminated list of closures (or append it to the capture). */
static tm_status stream_put(struct CUstream_st *s, mock_closure *first) {
    if (!first) return TM_OK;
    mock_closure *last = first;
    for (;; last = last->next) {
        if (!last->placed) last->placed = true, last->dev = s->dev;
        if (!last->next) break;
    }
    pthread_mutex_lock(&s->mu);
    if (s->origin) { /* joined: the work goes to the capture it joined */
        struct CUstream_st *o = s->origin;
        s->unjoined = true;
        pthread_mutex_unlock(&s->mu);
        return stream_put(o, first);
    }
    if (s->failed) {
        const tm_status st = stream_sticky(s);
        pthread_mutex_unlock(&s->mu);
        closure_list_free(first);
        return st;
    }
    if (s->capturing) {
        if (s->cap_tail)
            s->cap_tail->next = first;
        else
            s->cap_head = first;
        s->cap_tail = last;
    } else {
        for (mock_closure *c = first; c; c = c->next)
            if (c->queued) c->queued(c->arg);
        if (s->tail)
            s->tail->next = first;
        else
            s->head = first;
        s->tail = last;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return TM_OK;
}

static tm_status check_stream(tm_cuda_stream s, const char *op) {
    return s ? TM_OK
             : tm_error_set(TM_ERR_ARG, "%s: NULL stream (the mock has no default stream)", op);
}

/* mock_launch without the current-device check: copies, which CUDA queues on any
 * device's stream. */
static tm_status stream_launch(tm_cuda_stream stream, const char *op, mock_fn fn, const void *arg,
                               size_t size);

tm_status mock_launch(tm_cuda_stream stream, const char *op, mock_fn fn, const void *arg,
                      size_t size) {
    if (stream && stream->dev >= 0 && stream->dev != t_cur)
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: %s on GPU %d's stream while GPU %d is current (invalid "
                            "resource handle: the thread must cuda_device_select it)",
                            op, stream->dev, t_cur);
    return stream_launch(stream, op, fn, arg, size);
}

static tm_status stream_launch(tm_cuda_stream stream, const char *op, mock_fn fn, const void *arg,
                               size_t size) {
    tm_status st = check_stream(stream, op);
    if (st != TM_OK) return st;
    mock_closure *c = closure_new(op, fn, arg, size);
    if (!c) return tm_error_set(TM_ERR_NOMEM, "%s: out of host memory for the launch", op);
    return stream_put(stream, c);
}

tm_status mock_not_in_capture(tm_cuda_stream stream, const char *op) {
    tm_status st = check_stream(stream, op);
    if (st != TM_OK) return st;
    pthread_mutex_lock(&stream->mu);
    if (stream->capturing || stream->origin) st = capture_break(stream, op);
    pthread_mutex_unlock(&stream->mu);
    return st;
}

static struct CUstream_st *stream_create(int dev) {
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->dev = dev;
    s->latency_us = env_long("MOCK_GPU_LATENCY_US", 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (pthread_create(&s->thread, NULL, stream_worker, s) != 0) {
        pthread_cond_destroy(&s->idle);
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    pthread_setname_np(s->thread, "mock-gpu");
    return s;
}

static void stream_destroy(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* after the queue has drained, as cudaStreamSynchronize */
    closure_list_free(s->cap_head);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

tm_status cuda_stream_create(tm_cuda_stream *out) {
    *out = stream_create(t_cur); /* its kernels launch with that device current, and address
                                    its memory only (copies go anywhere, as in CUDA) */
    if (*out) (*out)->side = true;
    return *out ? TM_OK : tm_error_set(TM_ERR_DEVICE, "mock: cannot start a stream's worker");
}

void cuda_stream_free(tm_cuda_stream stream) {
    if (stream) stream_destroy(stream);
}

tm_status cuda_stream_sync(tm_cuda_stream s) {
    tm_status st = check_stream(s, "cuda_stream_sync");
    if (st != TM_OK) return st;
    pthread_mutex_lock(&s->mu);
    if (s->capturing || s->origin) {
        st = capture_break(s, "cuda_stream_sync");
    } else {
        while (s->head || s->busy) pthread_cond_wait(&s->idle, &s->mu);
        if (s->failed) st = stream_sticky(s);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

tm_status cuda_stream_query(tm_cuda_stream s, bool *idle) {
    *idle = false;
    tm_status st = check_stream(s, "cuda_stream_query");
    if (st != TM_OK) return st;
    pthread_mutex_lock(&s->mu);
    if (s->capturing || s->origin) {
        st = capture_break(s, "cuda_stream_query");
    } else {
        *idle = !s->head && !s->busy;
        if (s->failed) st = stream_sticky(s);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
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
    const long n = env_long("MOCK_GPUS", 1);
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
    if (!(dev->stream = stream_create(index))) {
        free(dev);
        return tm_error_set(TM_ERR_DEVICE, "mock: cannot start the stream's worker thread");
    }
    t_cur = index; /* cudaSetDevice on the opening thread, as the real open */
    *out = dev;
    return TM_OK;
}

void cuda_device_close(tm_cuda_device *dev) {
    if (!dev) return;
    stream_destroy(dev->stream);
    free(dev);
}

const tm_cuda_device_info *cuda_device_info(const tm_cuda_device *dev) {
    return &dev->info;
}

tm_status cuda_device_select(tm_cuda_device *dev) {
    t_cur = dev->info.index;
    return TM_OK;
}

/* Every pair has peer access here (the copy is the same closure either way). */
tm_status cuda_device_peer_enable(tm_cuda_device *dev, tm_cuda_device *peer, bool *on) {
    *on = dev->info.index != peer->info.index;
    t_cur = dev->info.index; /* leaves dev current, as CUDA's */
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
    if (dev->info.index != t_cur) /* cudaMalloc allocates on the current device */
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_pool_create for GPU %d while GPU %d is current (the "
                            "thread must cuda_device_select it)",
                            dev->info.index, t_cur);
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
    if (env_long("MOCK_NOREGISTER", 0))
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
    tm_status st = check_stream(s, op);
    if (st != TM_OK || !bytes) return st;
    const bool pageable = !mock_device_range(dst, bytes) || (src && !mock_device_range(src, bytes));
    pthread_mutex_lock(&s->mu);
    if (s->capturing && pageable) {
        char what[64];
        snprintf(what, sizeof(what), "%s of pageable host memory", op);
        st = capture_break(s, what);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

tm_status cuda_copy_async(void *dst, const void *src, size_t bytes, tm_cuda_stream stream) {
    const copy_arg a = {dst, src, bytes};
    if (stream && stream->side && env_long("MOCK_FAIL_SIDE_COPY", 0))
        return tm_error_set(TM_ERR_DEVICE, "mock: cuda_copy_async on a side stream refused "
                                           "(MOCK_FAIL_SIDE_COPY)");
    tm_status st = mock_copy_check("cuda_copy_async", dst, src, bytes);
    if (st == TM_OK) st = capture_pageable(stream, "cuda_copy_async", dst, src, bytes);
    return st != TM_OK ? st : stream_launch(stream, "cuda_copy_async", copy_run, &a, sizeof(a));
}

tm_status cuda_fill_async(void *dst, int byte, size_t bytes, tm_cuda_stream stream) {
    const fill_arg a = {dst, byte, bytes};
    tm_status st = capture_pageable(stream, "cuda_fill_async", dst, NULL, bytes);
    return st != TM_OK ? st : stream_launch(stream, "cuda_fill_async", fill_run, &a, sizeof(a));
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
    return stream_launch(stream, "cuda_copy_peer_async", copy_run, &a, sizeof(a));
}

/* Queue, then wait: refused during a capture, as a stream synchronisation is. */
static tm_status sync_op(tm_cuda_device *dev, const char *op, mock_fn fn, const void *arg,
                         size_t size) {
    tm_status st = mock_not_in_capture(dev->stream, op);
    if (st == TM_OK) st = stream_launch(dev->stream, op, fn, arg, size);
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
    return stream_launch(dev->stream, "cuda_copy_device", copy_run, &a, sizeof(a));
}

/* The real upload runs on a stream of its own, ordered with nothing on the
 * compute stream, and returns when complete: a memcpy on this thread. */
tm_status cuda_upload(tm_cuda_device *dev, void *dst, const void *host_src, size_t bytes,
                      double *bytes_per_s) {
    if (bytes_per_s) *bytes_per_s = 0;
    if (!mock_device_range(dst, bytes))
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_upload: %zu bytes at %p are not device memory", bytes, dst);
    const double t0 = now_ms();
    if (bytes) memcpy(dst, host_src, bytes);
    const double dt = (now_ms() - t0) * 1e-3;
    if (bytes_per_s) *bytes_per_s = dt > 0 ? (double)bytes / dt : 1e12;
    return TM_OK;
}

/* ---- graphs ---- */

struct tm_cuda_graph {
    mock_closure *head; /* the captured closures, in order */
};

tm_status cuda_graph_begin(tm_cuda_stream stream) {
    tm_status st = check_stream(stream, "cuda_graph_begin");
    if (st != TM_OK) return st;
    pthread_mutex_lock(&stream->mu);
    if (stream->capturing)
        st = tm_error_set(TM_ERR_DEVICE, "mock: cuda_graph_begin: the stream is already capturing");
    else if (stream->failed)
        st = stream_sticky(stream);
    else {
        stream->capturing = true, stream->cap_invalid = false, stream->cap_why[0] = '\0';
        stream->cap_head = stream->cap_tail = NULL, stream->n_joined = 0;
    }
    pthread_mutex_unlock(&stream->mu);
    return st;
}

tm_status cuda_graph_end(tm_cuda_stream stream, bool keep, tm_cuda_graph **out) {
    *out = NULL;
    tm_status st = check_stream(stream, "cuda_graph_end");
    if (st != TM_OK) return st;
    pthread_mutex_lock(&stream->mu);
    const bool was = stream->capturing;
    bool invalid = stream->cap_invalid;
    char why[sizeof(stream->cap_why)];
    memcpy(why, stream->cap_why, sizeof(why));
    mock_closure *list = stream->cap_head;
    stream->capturing = false, stream->cap_invalid = false;
    stream->cap_head = stream->cap_tail = NULL;
    bool unjoined = false;
    for (int i = 0; i < stream->n_joined; i++) { /* the joined streams leave the capture */
        struct CUstream_st *j = stream->joined[i];
        pthread_mutex_lock(&j->mu);
        unjoined |= j->unjoined;
        if (j->cap_invalid && !invalid) /* a joined stream broke the capture */
            invalid = true, memcpy(why, j->cap_why, sizeof(why));
        j->origin = NULL, j->unjoined = false, j->cap_invalid = false;
        pthread_mutex_unlock(&j->mu);
    }
    stream->n_joined = 0;
    pthread_mutex_unlock(&stream->mu);
    if (was && keep && unjoined && !invalid) {
        closure_list_free(list);
        return tm_error_set(TM_ERR_DEVICE, "mock: cuda_graph_end: a stream joined the capture and "
                                           "was not waited for (CUDA: capture unjoined)");
    }
    if (!was)
        return tm_error_set(TM_ERR_DEVICE, "mock: cuda_graph_end: the stream is not capturing");
    if (!keep) {
        closure_list_free(list);
        return TM_OK;
    }
    if (invalid) {
        closure_list_free(list);
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_graph_end: the capture was invalidated by %s (CUDA: "
                            "operation failed due to a previous error during capture)",
                            why);
    }
    tm_cuda_graph *g = calloc(1, sizeof(*g));
    if (!g) {
        closure_list_free(list);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    g->head = list;
    *out = g;
    return TM_OK;
}

tm_status cuda_graph_launch(tm_cuda_graph *g, tm_cuda_stream stream) {
    tm_status st = check_stream(stream, "cuda_graph_launch");
    if (st != TM_OK) return st;
    if (!g) return tm_error_set(TM_ERR_ARG, "cuda_graph_launch: NULL graph");
    mock_closure *first = NULL, **tail = &first;
    for (const mock_closure *c = g->head; c; c = c->next) {
        mock_closure *k = malloc(sizeof(*k) + c->size); /* the arguments, by value */
        if (!k) {
            closure_list_free(first);
            return tm_error_set(TM_ERR_NOMEM, "cuda_graph_launch: out of host memory");
        }
        memcpy(k, c, sizeof(*k) + c->size);
        k->next = NULL;
        *tail = k, tail = &k->next;
    }
    return stream_put(stream, first);
}

void cuda_graph_free(tm_cuda_graph *g) {
    if (!g) return;
    closure_list_free(g->head);
    free(g);
}

/* ---- events and timers ---- */

struct CUevent_st {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct CUstream_st *cap;    /* last recorded in this stream's capture (NULL: outside one) */
    struct CUstream_st *cap_by; /* by this stream (the capturing one or one that joined it) */
    uint64_t queued, done;      /* records put on a run queue / run or dropped */
    bool dropped;               /* the last record was dropped: its stream had failed */
    double t_ms;                /* host monotonic time of the last record that ran */
    int dev;                    /* the device current when it was made */
};

typedef struct event_arg {
    struct CUevent_st *e;
} event_arg;

static void event_queued(void *arg) {
    struct CUevent_st *e = ((event_arg *)arg)->e;
    pthread_mutex_lock(&e->mu);
    e->queued++;
    pthread_mutex_unlock(&e->mu);
}

static void event_finish(struct CUevent_st *e, bool dropped) {
    pthread_mutex_lock(&e->mu);
    if (!dropped) e->t_ms = now_ms();
    e->done++, e->dropped = dropped;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static bool event_run(void *arg, char *err, size_t err_size) {
    event_finish(((event_arg *)arg)->e, false);
    return true;
}

static void event_cancel(void *arg) {
    event_finish(((event_arg *)arg)->e, true);
}

tm_status cuda_event_create(tm_cuda_event *out) {
    struct CUevent_st *e = calloc(1, sizeof(*e));
    *out = e;
    if (!e) return tm_error_set(TM_ERR_NOMEM, "mock: out of host memory for an event");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->dev = t_cur;
    return TM_OK;
}

void cuda_event_free(tm_cuda_event e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu); /* a queued record still points here */
    while (e->done < e->queued) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

tm_status cuda_event_record(tm_cuda_event e, tm_cuda_stream stream) {
    tm_status st = check_stream(stream, "cuda_event_record");
    if (st != TM_OK) return st;
    if (!e) return tm_error_set(TM_ERR_ARG, "cuda_event_record: NULL event");
    if (stream->dev >= 0 && stream->dev != e->dev) /* as CUDA's: an event records only there */
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_event_record of an event made on GPU %d on GPU %d's "
                            "stream (CUDA: invalid resource handle)",
                            e->dev, stream->dev);
    pthread_mutex_lock(&stream->mu);
    struct CUstream_st *cap = stream->origin ? stream->origin : stream->capturing ? stream : NULL;
    pthread_mutex_unlock(&stream->mu);
    pthread_mutex_lock(&e->mu);
    e->cap = cap, e->cap_by = stream;
    pthread_mutex_unlock(&e->mu);
    if (cap) return TM_OK; /* a node of the graph: the list's order keeps what it orders */
    const event_arg a = {e};
    mock_closure *c = closure_new("cuda_event_record", event_run, &a, sizeof(a));
    if (!c) return tm_error_set(TM_ERR_NOMEM, "cuda_event_record: out of host memory");
    c->queued = event_queued, c->cancel = event_cancel, c->delay = false;
    return stream_put(stream, c);
}

/* Wait for the event's latest record (as queued now) and give its time. */
static tm_status event_wait(struct CUevent_st *e, double *t_ms) {
    pthread_mutex_lock(&e->mu);
    const uint64_t want = e->queued;
    while (e->done < want) pthread_cond_wait(&e->cv, &e->mu);
    const bool dropped = e->dropped;
    *t_ms = e->t_ms;
    pthread_mutex_unlock(&e->mu);
    if (want == 0)
        return tm_error_set(
            TM_ERR_DEVICE,
            "mock: an event that was never recorded (CUDA: invalid resource handle)");
    if (dropped)
        return tm_error_set(TM_ERR_DEVICE, "mock: the event's stream failed before the record");
    return TM_OK;
}

/* The stream's worker blocks until the event's record number `want` has run
 * (or been dropped), as a GPU stream waits on an event from another. */
typedef struct wait_event_arg {
    struct CUevent_st *e;
    uint64_t want;
} wait_event_arg;

static bool wait_event_run(void *arg, char *err, size_t err_size) {
    (void)err, (void)err_size;
    const wait_event_arg *a = arg;
    pthread_mutex_lock(&a->e->mu);
    while (a->e->done < a->want) pthread_cond_wait(&a->e->cv, &a->e->mu);
    pthread_mutex_unlock(&a->e->mu);
    return true;
}

tm_status cuda_stream_wait_event(tm_cuda_stream stream, tm_cuda_event e) {
    tm_status st = check_stream(stream, "cuda_stream_wait_event");
    if (st != TM_OK) return st;
    if (!e) return tm_error_set(TM_ERR_ARG, "cuda_stream_wait_event: NULL event");
    pthread_mutex_lock(&e->mu);
    struct CUstream_st *cap = e->cap, *by = e->cap_by;
    pthread_mutex_unlock(&e->mu);
    if (cap) { /* recorded in a capture */
        pthread_mutex_lock(&cap->mu);
        const bool live = cap->capturing;
        pthread_mutex_unlock(&cap->mu);
        if (!live)
            return tm_error_set(TM_ERR_DEVICE, "mock: cuda_stream_wait_event: the event was "
                                               "recorded in a capture that has ended");
        if (stream == cap) { /* the capturing stream waits for a joined one: joined back */
            if (by != cap) {
                pthread_mutex_lock(&by->mu);
                by->unjoined = false;
                pthread_mutex_unlock(&by->mu);
            }
            return TM_OK;
        }
        pthread_mutex_lock(&stream->mu);
        if (stream->capturing || (stream->origin && stream->origin != cap))
            st = capture_break(stream, "cuda_stream_wait_event (another capture)");
        const bool join = st == TM_OK && !stream->origin;
        if (join) stream->origin = cap;
        pthread_mutex_unlock(&stream->mu);
        if (st == TM_OK && by != cap && by != stream) {
            /* a joined stream waits for another: that one's work is joined once this one
               is (CUDA: the capturing stream's dependency reaches it through this one) */
            pthread_mutex_lock(&by->mu);
            const bool carried = by->unjoined;
            by->unjoined = false;
            pthread_mutex_unlock(&by->mu);
            if (carried) {
                pthread_mutex_lock(&stream->mu);
                stream->unjoined = true;
                pthread_mutex_unlock(&stream->mu);
            }
        }
        if (join) {
            pthread_mutex_lock(&cap->mu);
            if (cap->n_joined < 2 * MOCK_MAX_GPUS)
                cap->joined[cap->n_joined++] = stream;
            else
                st = capture_break(cap, "too many streams joining the capture");
            pthread_mutex_unlock(&cap->mu);
        }
        return st;
    }
    if ((st = mock_not_in_capture(stream, "cuda_stream_wait_event"))) return st;
    pthread_mutex_lock(&e->mu);
    const wait_event_arg a = {e, e->queued};
    pthread_mutex_unlock(&e->mu);
    if (!a.want) return TM_OK; /* never recorded: nothing to wait for */
    return stream_launch(stream, "cuda_stream_wait_event", wait_event_run, &a, sizeof(a));
}

tm_status cuda_event_query(tm_cuda_event e, bool *done) {
    if (!e) return tm_error_set(TM_ERR_ARG, "cuda_event_query: NULL event");
    pthread_mutex_lock(&e->mu);
    *done = e->done >= e->queued;
    const bool dropped = e->dropped && *done;
    pthread_mutex_unlock(&e->mu);
    return dropped ? tm_error_set(TM_ERR_DEVICE, "mock: the event's stream failed") : TM_OK;
}

tm_status cuda_event_elapsed(tm_cuda_event a, tm_cuda_event b, float *ms) {
    double ta = 0, tb = 0;
    if (a->dev != b->dev)
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_event_elapsed between events of GPUs %d and %d (CUDA: "
                            "invalid resource handle)",
                            a->dev, b->dev);
    tm_status st = event_wait(b, &tb);
    if (st == TM_OK) st = event_wait(a, &ta);
    if (st != TM_OK) return tm_error_wrap(st, "cuda_event_elapsed: ");
    *ms = (float)(tb - ta);
    return TM_OK;
}

struct tm_cuda_timer {
    tm_cuda_stream stream;
    tm_cuda_event start, stop;
};

tm_status cuda_timer_create(tm_cuda_device *dev, tm_cuda_timer **out) {
    *out = NULL;
    tm_cuda_timer *t = calloc(1, sizeof(*t));
    if (!t) return tm_error_set(TM_ERR_NOMEM, "mock: out of host memory for a timer");
    t->stream = dev->stream;
    tm_status st = cuda_event_create(&t->start);
    if (st == TM_OK) st = cuda_event_create(&t->stop);
    if (st != TM_OK) {
        cuda_timer_free(t);
        return st;
    }
    *out = t;
    return TM_OK;
}

tm_status cuda_timer_start(tm_cuda_timer *t) {
    return cuda_event_record(t->start, t->stream);
}

tm_status cuda_timer_stop(tm_cuda_timer *t, float *ms) {
    tm_status st = mock_not_in_capture(t->stream, "cuda_timer_stop"); /* it waits */
    if (st == TM_OK) st = cuda_event_record(t->stop, t->stream);
    return st != TM_OK ? st : cuda_event_elapsed(t->start, t->stop, ms);
}

void cuda_timer_free(tm_cuda_timer *t) {
    if (!t) return;
    cuda_event_free(t->start);
    cuda_event_free(t->stop);
    free(t);
}
