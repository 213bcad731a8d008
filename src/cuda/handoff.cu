/* Hand-offs between the stream and a host thread without a stream
 * synchronisation (cuda.h, "handoff.cu"): the tiered MoE step publishes a
 * layer's normed input and routing to the CPU lane, and waits for its answer,
 * inside the decode step's CUDA graph.
 *
 * Ordering. Publishing: every thread copies its part of the spans to mapped
 * host memory, makes its writes visible to the system (__threadfence_system),
 * the block meets at a barrier, and only then does thread 0 write the flag,
 * so a host that sees the flag sees the data. Waiting: thread 0 polls the flag
 * with cache-bypassing loads (__ldcv: a line of host memory cached by an
 * earlier step would be stale), the block meets at a barrier, and the add
 * reads the host's data with __ldcv too. */
#include "cuda/cuda_args.h"
#include "cuda/cuda_common.cuh"

#define TM_HANDOFF_THREADS 512 /* one pass of float4 reads covers 8192 values over PCIe */

typedef struct tm_signal_args {
    tm_cuda_span spans[TM_CUDA_SIGNAL_SPANS];
    int n_spans;
} tm_signal_args;

__global__ void __launch_bounds__(TM_HANDOFF_THREADS)
    tm_signal_host_kernel(tm_signal_args a, uint32_t *flag, const uint32_t *seq) {
    for (int s = 0; s < a.n_spans; s++) {
        uint32_t *dst = (uint32_t *)a.spans[s].dst;
        const uint32_t *src = (const uint32_t *)a.spans[s].src;
        const int64_t n = a.spans[s].bytes / 4;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) *(volatile uint32_t *)flag = *seq;
}

__global__ void __launch_bounds__(TM_HANDOFF_THREADS)
    tm_wait_host_kernel(const int32_t *need, int32_t n_need, const uint32_t *flag,
                        const uint32_t *seq, uint64_t timeout_ns, uint32_t *err, float *x,
                        const float *add, int64_t n) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        int32_t needed = need ? 0 : 1;
        for (int32_t i = 0; i < n_need; i++) needed += need[i];
        ok = needed > 0;
    }
    __syncthreads();
    if (!ok) return; /* nothing for the host to compute: no wait, nothing to add */
    __syncthreads(); /* ok read before thread 0 writes it again */
    if (threadIdx.x == 0) {
        const uint32_t want = *seq;
        uint64_t t0, now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        ok = 1;
        while ((int32_t)(__ldcv(flag) - want) < 0) {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            if (now - t0 > timeout_ns) {
                *(volatile uint32_t *)err = 1;
                ok = 0;
                break;
            }
            __nanosleep(200);
        }
    }
    __syncthreads();
    if (!ok) return;
    /* each read crosses PCIe (about a microsecond): 16 bytes a read, all in flight at once */
    if ((((uintptr_t)x | (uintptr_t)add) & 15) == 0) {
        const int64_t n4 = n / 4;
        for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
            const float4 a = __ldcv((const float4 *)add + i);
            float4 v = ((float4 *)x)[i];
            v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
            ((float4 *)x)[i] = v;
        }
        for (int64_t i = n4 * 4 + threadIdx.x; i < n; i += blockDim.x) x[i] += __ldcv(add + i);
    } else {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[i] += __ldcv(add + i);
    }
}

extern "C" tm_status cuda_signal_host(const tm_cuda_span *spans, int n_spans, uint32_t *flag,
                                      const uint32_t *seq, tm_cuda_stream stream) {
    tm_status st = cuda_signal_host_args_check(spans, n_spans);
    if (st != TM_OK) return st;
    tm_signal_args a;
    a.n_spans = n_spans;
    for (int s = 0; s < n_spans; s++) a.spans[s] = spans[s];
    tm_signal_host_kernel<<<1, TM_HANDOFF_THREADS, 0, stream>>>(a, flag, seq);
    return tm_cuda_launch_check("cuda_signal_host", n_spans, 0, 0);
}

extern "C" tm_status cuda_wait_host(const uint32_t *flag, const uint32_t *seq, uint64_t timeout_ns,
                                    uint32_t *err, float *x, const float *add, int64_t n,
                                    tm_cuda_stream stream) {
    return cuda_wait_host_unless(NULL, 0, flag, seq, timeout_ns, err, x, add, n, stream);
}

extern "C" tm_status cuda_wait_host_unless(const int32_t *need, int32_t n_need,
                                           const uint32_t *flag, const uint32_t *seq,
                                           uint64_t timeout_ns, uint32_t *err, float *x,
                                           const float *add, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_wait_host_args_check(need, n_need, x, add, n);
    if (st != TM_OK) return st;
    tm_wait_host_kernel<<<1, TM_HANDOFF_THREADS, 0, stream>>>(need, n_need, flag, seq, timeout_ns,
                                                              err, x, add, n);
    return tm_cuda_launch_check("cuda_wait_host", n, 0, 0);
}
