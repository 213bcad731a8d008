/* Device runtime: open/query a GPU, one device memory pool (a bump allocator
 * over a single cudaMalloc, so no allocation happens per token), pinned host
 * memory, synchronous helper copies, CUDA-event timers, and the weight upload
 * that streams pageable host memory (the mmap'd model) through two pinned
 * staging buffers with the CPU copy of one chunk overlapping the DMA of the
 * previous one. See cuda.h for the contracts. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_common.cuh"

/* Staging: two buffers of this size; 32 MiB chunks reach the PCIe rate
 * (a 2.5 MiB pinned copy already got 50 GB/s on the device machine). */
#define TM_CUDA_STAGING_BYTES ((size_t)32 << 20)

struct tm_cuda_device {
    tm_cuda_device_info info;
    cudaStream_t stream; /* compute */
    cudaStream_t upload; /* weight uploads, separate so uploads never wait on compute */
    void *staging[2];    /* pinned, allocated on first upload */
    cudaEvent_t staged[2];
};

/* Peer access is a property of the process's (primary) contexts, not of one open
 * device: bit j of g_peer_on[i]: device i's kernels read device j's memory. Kept here
 * so a second context never asks again (CUDA would answer with an error). */
static uint64_t g_peer_on[64];
static pthread_mutex_t g_peer_mu = PTHREAD_MUTEX_INITIALIZER;

static bool peer_on(int a, int b) {
    pthread_mutex_lock(&g_peer_mu);
    const bool on = a >= 0 && a < 64 && b >= 0 && b < 64 && (g_peer_on[a] >> b & 1);
    pthread_mutex_unlock(&g_peer_mu);
    return on;
}

struct tm_cuda_pool {
    tm_cuda_device *dev;
    char *base;
    size_t size, used;
};

struct tm_cuda_timer {
    cudaStream_t stream;
    cudaEvent_t start, stop;
};

/* cudaGetDeviceCount's failures, told apart so the user knows what to fix. */
static tm_status count_error(cudaError_t e) {
    switch (e) {
    case cudaErrorInsufficientDriver:
        return tm_error_set(
            TM_ERR_DEVICE,
            "CUDA: no NVIDIA driver, or one older than this build's CUDA runtime %d.%d "
            "(cudaGetDeviceCount: %s)",
            CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10, cudaGetErrorString(e));
    case cudaErrorNoDevice:
        return tm_error_set(TM_ERR_DEVICE, "CUDA: no GPU found (cudaGetDeviceCount: %s)",
                            cudaGetErrorString(e));
    default:
        return tm_error_set(TM_ERR_DEVICE, "CUDA: cannot list GPUs: %s (error %d)",
                            cudaGetErrorString(e), (int)e);
    }
}

tm_status cuda_device_count(int *out) {
    *out = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
        (void)cudaGetLastError(); /* clear it so later calls start clean */
        return TM_OK;
    }
    if (e != cudaSuccess) return count_error(e);
    *out = n;
    return TM_OK;
}

tm_status cuda_device_open(int index, tm_cuda_device **out) {
    *out = NULL;
    int drv = 0, n = 0;
    /* cudaDriverGetVersion works without a driver (returns 0), so it is asked first. */
    if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0) {
        (void)cudaGetLastError();
        return tm_error_set(TM_ERR_DEVICE,
                            "CUDA: no NVIDIA driver installed (this build needs one "
                            "supporting CUDA %d.%d or newer)",
                            CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    }
    if (drv < CUDART_VERSION)
        return tm_error_set(
            TM_ERR_DEVICE,
            "CUDA: the driver supports CUDA %d.%d, this build's runtime needs %d.%d: "
            "update the NVIDIA driver",
            drv / 1000, (drv % 1000) / 10, CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return count_error(e);
    }
    if (index < 0 || index >= n)
        return tm_error_set(TM_ERR_DEVICE, "CUDA: GPU %d requested, %d present", index, n);
    cudaDeviceProp prop;
    TM_CUDA_TRY(cudaGetDeviceProperties(&prop, index));
    if (prop.major < 8)
        return tm_error_set(
            TM_ERR_DEVICE,
            "CUDA: GPU %d (%s) has compute capability %d.%d, tiermoe needs 8.0 or newer", index,
            prop.name, prop.major, prop.minor);
    TM_CUDA_TRY(cudaSetDevice(index));

    tm_cuda_device *dev = (tm_cuda_device *)calloc(1, sizeof(*dev));
    if (!dev) return tm_error_set(TM_ERR_NOMEM, "CUDA: out of host memory for the device handle");
    snprintf(dev->info.name, sizeof(dev->info.name), "%s", prop.name);
    dev->info.index = index;
    dev->info.cc_major = prop.major;
    dev->info.cc_minor = prop.minor;
    dev->info.sm_count = prop.multiProcessorCount;
    dev->info.driver_version = drv;
    dev->info.runtime_version = CUDART_VERSION;
    dev->info.l2_bytes = (size_t)prop.l2CacheSize;
    dev->info.total_bytes = prop.totalGlobalMem;
    cudaError_t e1 = cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking);
    cudaError_t e2 = cudaStreamCreateWithFlags(&dev->upload, cudaStreamNonBlocking);
    if (e1 != cudaSuccess || e2 != cudaSuccess) {
        tm_status st = tm_error_set(TM_ERR_DEVICE, "CUDA: cannot create streams on GPU %d: %s",
                                    index, cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
        cuda_device_close(dev);
        return st;
    }
    *out = dev;
    return TM_OK;
}

tm_status cuda_device_select(tm_cuda_device *dev) {
    TM_CUDA_TRY(cudaSetDevice(dev->info.index));
    return TM_OK;
}

void cuda_device_close(tm_cuda_device *dev) {
    if (!dev) return;
    if (dev->stream) cudaStreamSynchronize(dev->stream);
    if (dev->upload) cudaStreamSynchronize(dev->upload);
    for (int i = 0; i < 2; i++) {
        if (dev->staged[i]) cudaEventDestroy(dev->staged[i]);
        if (dev->staging[i]) cudaFreeHost(dev->staging[i]);
    }
    if (dev->stream) cudaStreamDestroy(dev->stream);
    if (dev->upload) cudaStreamDestroy(dev->upload);
    free(dev);
}

const tm_cuda_device_info *cuda_device_info(const tm_cuda_device *dev) {
    return &dev->info;
}

tm_status cuda_device_memory(tm_cuda_device *dev, size_t *free_bytes, size_t *total_bytes) {
    (void)dev;
    size_t f = 0, t = 0;
    TM_CUDA_TRY(cudaMemGetInfo(&f, &t));
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return TM_OK;
}

tm_cuda_stream cuda_device_stream(const tm_cuda_device *dev) {
    return dev->stream;
}

tm_status cuda_device_sync(tm_cuda_device *dev) {
    TM_CUDA_TRY(cudaStreamSynchronize(dev->stream));
    return TM_OK;
}

/* ---- pool ---- */

tm_status cuda_pool_create(tm_cuda_device *dev, size_t bytes, tm_cuda_pool **out) {
    *out = NULL;
    tm_cuda_pool *p = (tm_cuda_pool *)calloc(1, sizeof(*p));
    if (!p) return tm_error_set(TM_ERR_NOMEM, "CUDA: out of host memory for the pool handle");
    cudaError_t e = cudaMalloc((void **)&p->base, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        free(p);
        return tm_error_set(
            TM_ERR_DEVICE,
            "CUDA: cannot allocate the %.1f MiB device pool on %s: %.1f MiB free of "
            "%.1f MiB (%s)",
            bytes / 1048576.0, dev->info.name, f / 1048576.0, t / 1048576.0, cudaGetErrorString(e));
    }
    p->dev = dev;
    p->size = bytes;
    *out = p;
    return TM_OK;
}

tm_status cuda_pool_alloc(tm_cuda_pool *pool, size_t bytes, size_t align, void **out) {
    *out = NULL;
    if (align == 0) align = 256;
    if (align & (align - 1))
        return tm_error_set(TM_ERR_ARG, "cuda_pool_alloc: alignment %zu is not a power of two",
                            align);
    /* cudaMalloc's base is 256-byte aligned, so aligning the offset aligns the address
     * for every align <= 256; larger ones are aligned on the address itself. */
    uintptr_t base = (uintptr_t)pool->base;
    uintptr_t at = (base + pool->used + align - 1) & ~(uintptr_t)(align - 1);
    size_t off = (size_t)(at - base);
    if (off > pool->size || bytes > pool->size - off)
        return tm_error_set(TM_ERR_DEVICE,
                            "CUDA: device pool full: %zu bytes requested, %zu of %zu used", bytes,
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
    cudaFree(pool->base);
    free(pool);
}

/* ---- host memory, copies ---- */

tm_status cuda_host_alloc(size_t bytes, void **out) {
    *out = NULL;
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return tm_error_set(TM_ERR_DEVICE, "CUDA: cannot pin %.1f MiB of host memory: %s",
                            bytes / 1048576.0, cudaGetErrorString(e));
    }
    return TM_OK;
}

tm_status cuda_host_alloc_mapped(size_t bytes, void **host, void **dev) {
    *host = *dev = NULL;
    cudaError_t e =
        cudaHostAlloc(host, bytes ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer(dev, *host, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (*host) cudaFreeHost(*host);
        *host = *dev = NULL;
        return tm_error_set(TM_ERR_DEVICE, "CUDA: cannot map %.1f KiB of pinned host memory: %s",
                            bytes / 1024.0, cudaGetErrorString(e));
    }
    return TM_OK;
}

void cuda_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

tm_status cuda_host_register(void *p, size_t bytes, bool read_only, void **dev) {
    *dev = NULL;
    unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
    if (read_only) flags |= cudaHostRegisterReadOnly;
    cudaError_t e = cudaHostRegister(p, bytes, flags);
    if (e == cudaSuccess) {
        e = cudaHostGetDevicePointer(dev, p, 0);
        if (e != cudaSuccess) cudaHostUnregister(p);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *dev = NULL;
        return tm_error_set(TM_ERR_DEVICE, "CUDA: cannot pin and map %.1f MiB of host memory: %s",
                            bytes / 1048576.0, cudaGetErrorString(e));
    }
    return TM_OK;
}

void cuda_host_unregister(void *p) {
    if (p && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

tm_status cuda_copy_to_device(tm_cuda_device *dev, void *dst, const void *host_src, size_t bytes) {
    TM_CUDA_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, dev->stream));
    TM_CUDA_TRY(cudaStreamSynchronize(dev->stream));
    return TM_OK;
}

tm_status cuda_copy_to_host(tm_cuda_device *dev, void *host_dst, const void *src, size_t bytes) {
    TM_CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, dev->stream));
    TM_CUDA_TRY(cudaStreamSynchronize(dev->stream));
    return TM_OK;
}

tm_status cuda_fill_bytes(tm_cuda_device *dev, void *dst, int byte, size_t bytes) {
    TM_CUDA_TRY(cudaMemsetAsync(dst, byte, bytes, dev->stream));
    TM_CUDA_TRY(cudaStreamSynchronize(dev->stream));
    return TM_OK;
}

tm_status cuda_copy_device(tm_cuda_device *dev, void *dst, const void *src, size_t bytes) {
    TM_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, dev->stream));
    return TM_OK;
}

/* ---- upload ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

tm_status cuda_upload(tm_cuda_device *dev, void *dst, const void *host_src, size_t bytes,
                      double *bytes_per_s) {
    if (bytes_per_s) *bytes_per_s = 0;
    for (int i = 0; i < 2; i++) {
        if (!dev->staging[i]) {
            tm_status st = cuda_host_alloc(TM_CUDA_STAGING_BYTES, &dev->staging[i]);
            if (st != TM_OK) return tm_error_wrap(st, "upload staging buffer: ");
        }
        if (!dev->staged[i])
            TM_CUDA_TRY(cudaEventCreateWithFlags(&dev->staged[i], cudaEventDisableTiming));
    }
    const double t0 = now_s();
    const char *src = (const char *)host_src;
    char *d = (char *)dst;
    int used[2] = {0, 0};
    for (size_t off = 0, i = 0; off < bytes; off += TM_CUDA_STAGING_BYTES, i++) {
        const int b = (int)(i & 1);
        const size_t n = bytes - off < TM_CUDA_STAGING_BYTES ? bytes - off : TM_CUDA_STAGING_BYTES;
        /* The buffer's previous DMA must have finished before the CPU refills it;
         * meanwhile the other buffer's DMA runs, which is the overlap. */
        if (used[b]) TM_CUDA_TRY(cudaEventSynchronize(dev->staged[b]));
        memcpy(dev->staging[b], src + off, n);
        TM_CUDA_TRY(
            cudaMemcpyAsync(d + off, dev->staging[b], n, cudaMemcpyHostToDevice, dev->upload));
        TM_CUDA_TRY(cudaEventRecord(dev->staged[b], dev->upload));
        used[b] = 1;
    }
    TM_CUDA_TRY(cudaStreamSynchronize(dev->upload));
    const double dt = now_s() - t0;
    if (bytes_per_s) *bytes_per_s = dt > 0 ? (double)bytes / dt : 0;
    return TM_OK;
}

/* ---- timers ---- */

tm_status cuda_timer_create(tm_cuda_device *dev, tm_cuda_timer **out) {
    *out = NULL;
    tm_cuda_timer *t = (tm_cuda_timer *)calloc(1, sizeof(*t));
    if (!t) return tm_error_set(TM_ERR_NOMEM, "CUDA: out of host memory for a timer");
    t->stream = dev->stream;
    cudaError_t e1 = cudaEventCreate(&t->start), e2 = cudaEventCreate(&t->stop);
    if (e1 != cudaSuccess || e2 != cudaSuccess) {
        cuda_timer_free(t);
        return tm_error_set(TM_ERR_DEVICE, "CUDA: cannot create timer events: %s",
                            cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
    }
    *out = t;
    return TM_OK;
}

tm_status cuda_timer_start(tm_cuda_timer *t) {
    TM_CUDA_TRY(cudaEventRecord(t->start, t->stream));
    return TM_OK;
}

tm_status cuda_timer_stop(tm_cuda_timer *t, float *ms) {
    TM_CUDA_TRY(cudaEventRecord(t->stop, t->stream));
    TM_CUDA_TRY(cudaEventSynchronize(t->stop));
    TM_CUDA_TRY(cudaEventElapsedTime(ms, t->start, t->stop));
    return TM_OK;
}

void cuda_timer_free(tm_cuda_timer *t) {
    if (!t) return;
    if (t->start) cudaEventDestroy(t->start);
    if (t->stop) cudaEventDestroy(t->stop);
    free(t);
}

/* ---- asynchronous copies, graphs (used per token by the model) ---- */

tm_status cuda_copy_async(void *dst, const void *src, size_t bytes, tm_cuda_stream stream) {
    TM_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    return TM_OK;
}

tm_status cuda_device_peer_enable(tm_cuda_device *dev, tm_cuda_device *peer, bool *on) {
    *on = false;
    const int a = dev->info.index, b = peer->info.index;
    if (a == b || a >= 64 || b >= 64) return TM_OK;
    TM_CUDA_TRY(cudaSetDevice(a));
    if (peer_on(a, b)) return *on = true, TM_OK;
    int can = 0;
    TM_CUDA_TRY(cudaDeviceCanAccessPeer(&can, a, b));
    if (!can) return TM_OK;
    pthread_mutex_lock(&g_peer_mu);
    cudaError_t e = g_peer_on[a] >> b & 1 ? cudaSuccess : cudaDeviceEnablePeerAccess(b, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) /* by a library beside us */
        (void)cudaGetLastError(), e = cudaSuccess;
    if (e == cudaSuccess) g_peer_on[a] |= 1ull << b;
    pthread_mutex_unlock(&g_peer_mu);
    if (e != cudaSuccess)
        return tm_error_set(TM_ERR_DEVICE, "CUDA: GPU %d cannot enable peer access to GPU %d: %s",
                            a, b, cudaGetErrorString(e));
    *on = true;
    return TM_OK;
}

/* A copy by the reading GPU's threads (peer loads): unlike cudaMemcpyPeerAsync, a
 * kernel can be captured in a graph. 16 bytes a thread when everything is aligned. */
__global__ void copy_peer_16(int4 *dst, const int4 *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

__global__ void copy_peer_1(char *dst, const char *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

tm_status cuda_copy_peer_async(tm_cuda_device *dst_dev, void *dst, tm_cuda_device *src_dev,
                               const void *src, size_t bytes, tm_cuda_stream stream) {
    if (!bytes) return TM_OK;
    const int from = src_dev->info.index;
    if (!peer_on(dst_dev->info.index, from)) {
        TM_CUDA_TRY(cudaMemcpyPeerAsync(dst, dst_dev->info.index, src, from, bytes, stream));
        return TM_OK;
    }
    const bool v16 = (((uintptr_t)dst | (uintptr_t)src | bytes) & 15) == 0;
    const size_t n = v16 ? bytes / 16 : bytes;
    const unsigned blocks = (unsigned)(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024);
    if (v16)
        copy_peer_16<<<blocks, 256, 0, stream>>>((int4 *)dst, (const int4 *)src, n);
    else
        copy_peer_1<<<blocks, 256, 0, stream>>>((char *)dst, (const char *)src, n);
    TM_CUDA_TRY(cudaGetLastError());
    return TM_OK;
}

tm_status cuda_fill_async(void *dst, int byte, size_t bytes, tm_cuda_stream stream) {
    TM_CUDA_TRY(cudaMemsetAsync(dst, byte, bytes, stream));
    return TM_OK;
}

tm_status cuda_stream_sync(tm_cuda_stream stream) {
    TM_CUDA_TRY(cudaStreamSynchronize(stream));
    return TM_OK;
}

tm_status cuda_stream_query(tm_cuda_stream stream, bool *idle) {
    const cudaError_t e = cudaStreamQuery(stream);
    *idle = e == cudaSuccess;
    if (e == cudaSuccess || e == cudaErrorNotReady) return TM_OK;
    return tm_error_set(TM_ERR_DEVICE, "CUDA: the stream failed: %s (error %d)",
                        cudaGetErrorString(e), (int)e);
}

tm_status cuda_stream_create(tm_cuda_stream *out) {
    cudaStream_t s = NULL;
    TM_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = s;
    return TM_OK;
}

void cuda_stream_free(tm_cuda_stream stream) {
    if (stream) cudaStreamDestroy(stream);
}

struct tm_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

tm_status cuda_graph_begin(tm_cuda_stream stream) {
    /* relaxed: other threads may use CUDA (e.g. allocate) while we capture */
    TM_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    return TM_OK;
}

tm_status cuda_graph_end(tm_cuda_stream stream, bool keep, tm_cuda_graph **out) {
    *out = NULL;
    cudaGraph_t g = NULL;
    TM_CUDA_TRY(cudaStreamEndCapture(stream, &g));
    if (!keep) { /* capture was only to leave the stream usable after a failed step */
        cudaGraphDestroy(g);
        return TM_OK;
    }
    tm_cuda_graph *r = (tm_cuda_graph *)calloc(1, sizeof(*r));
    if (!r) {
        cudaGraphDestroy(g);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    r->graph = g;
    cudaError_t e = cudaGraphInstantiate(&r->exec, g, 0);
    if (e != cudaSuccess) {
        cudaGraphDestroy(g);
        free(r);
        return tm_error_set(TM_ERR_DEVICE, "cudaGraphInstantiate failed: %s",
                            cudaGetErrorString(e));
    }
    *out = r;
    return TM_OK;
}

tm_status cuda_graph_launch(tm_cuda_graph *g, tm_cuda_stream stream) {
    TM_CUDA_TRY(cudaGraphLaunch(g->exec, stream));
    return TM_OK;
}

void cuda_graph_free(tm_cuda_graph *g) {
    if (!g) return;
    cudaGraphExecDestroy(g->exec);
    cudaGraphDestroy(g->graph);
    free(g);
}

/* ---- events for per-part timing ---- */

tm_status cuda_event_create(tm_cuda_event *out) {
    cudaEvent_t e;
    TM_CUDA_TRY(cudaEventCreate(&e));
    *out = (tm_cuda_event)e;
    return TM_OK;
}

void cuda_event_free(tm_cuda_event e) {
    if (e) cudaEventDestroy((cudaEvent_t)e);
}

tm_status cuda_event_record(tm_cuda_event e, tm_cuda_stream stream) {
    TM_CUDA_TRY(cudaEventRecord((cudaEvent_t)e, stream));
    return TM_OK;
}

tm_status cuda_event_elapsed(tm_cuda_event a, tm_cuda_event b, float *ms) {
    TM_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)b));
    TM_CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b));
    return TM_OK;
}

tm_status cuda_stream_wait_event(tm_cuda_stream stream, tm_cuda_event e) {
    TM_CUDA_TRY(cudaStreamWaitEvent(stream, (cudaEvent_t)e, 0));
    return TM_OK;
}

tm_status cuda_event_query(tm_cuda_event e, bool *done) {
    const cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    *done = r == cudaSuccess;
    if (r == cudaSuccess || r == cudaErrorNotReady) return TM_OK;
    return tm_error_set(TM_ERR_DEVICE, "CUDA: cudaEventQuery failed: %s (error %d)",
                        cudaGetErrorString(r), (int)r);
}
