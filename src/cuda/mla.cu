/* Latent attention (MLA decoded in the absorbed form, cuda.h) on the GPU, and
 * the strided copies of the per-head products around it. Same math as the CPU
 * path (src/exec/exec_cpu.c: cpu_qk_latent_task, cpu_attention with v_in_k),
 * in float32 with float accumulation; angles in double as cpu_rope_table.
 * Correctness first, not tuned:
 *
 * cuda_mla_prepare: a block of 256 threads a token: the RoPE pairs of every q
 * head, then the key row: the latent's sum of squares by a block reduction,
 * the latent normed, the RoPE key turned, the row written back and stored.
 *
 * cuda_mla_attention: a block of 256 threads (8 warps) a (head, token). It
 * walks the token's keys in tiles of 32: warp w scores keys w, w + 8, w + 16,
 * w + 24 of the tile (lanes over the key's values, a warp sum), thread 0 takes
 * the tile's online-softmax step (max, rescale, weights into shared memory),
 * then thread i accumulates dims i, i + 256, ... of the latent over the
 * tile's keys. Every head reads the whole cache: a kernel that shares a key
 * tile among the heads is the next step. */
#include <cuda_fp16.h>
#include <math.h>

#include "cuda/cuda_common.cuh"
#include "cuda/mla_check.h"
#include "cuda/mla_tc.cuh"

#define TM_MLA_THREADS 256
#define TM_MLA_WARPS   (TM_MLA_THREADS / TM_CUDA_WARP)
#define TM_MLA_TK      32                                     /* keys a tile */
#define TM_MLA_PER     (TM_CUDA_MLA_MAX_DIM / TM_MLA_THREADS) /* latent dims a thread */

/* Token t's position and its cache row (cuda_attn_prepare's rule; no ring). */
static __device__ __forceinline__ void tm_mla_row(const tm_cuda_attn_params &p, const int32_t *pos0,
                                                  int64_t t, int64_t *pos, int64_t *row0) {
    const int64_t seq_rows = p.seq_rows ? p.seq_rows : p.n_ctx;
    *pos = p.row_pos ? (int64_t)p.row_pos[t] : (int64_t)*pos0 + t;
    *row0 = p.row_seq ? (int64_t)p.row_seq[t] * seq_rows : 0;
}

/* The pair (e0, e1) of RoPE pair i of a part of n_rot values. */
static __device__ __forceinline__ void tm_mla_pair(const tm_cuda_attn_params &p, int i, int *e0,
                                                   int *e1) {
    *e0 = p.rope_interleaved ? 2 * i : i;
    *e1 = p.rope_interleaved ? 2 * i + 1 : i + p.n_rot / 2;
}

/* cos and sin of pair i at pos (cuda_attn_prepare's angles, of width n_rot). */
static __device__ __forceinline__ void tm_mla_angle(const tm_cuda_attn_params &p, int64_t pos,
                                                    int i, float *c, float *s) {
    const double theta =
        p.rope_freq ? (double)pos * (double)p.rope_freq[i]
                    : (double)pos * pow((double)p.rope_base, -2.0 * (double)i / (double)p.n_rot);
    const double ms = p.rope_freq && p.rope_mscale ? p.rope_mscale : 1.0;
    double sd, cd;
    sincos(theta, &sd, &cd);
    *c = (float)(cd * ms), *s = (float)(sd * ms);
}

__global__ void __launch_bounds__(TM_MLA_THREADS)
    tm_mla_prepare_kernel(tm_cuda_attn_params p, float *q, float *kv, const float *kv_norm,
                          const int32_t *pos0, void *k_cache) {
    __shared__ float part[TM_MLA_WARPS];
    const int64_t t = blockIdx.x;
    const int D = p.head_dim, L = p.v_dim, half = p.n_rot / 2, tid = threadIdx.x;
    int64_t pos, row0;
    tm_mla_row(p, pos0, t, &pos, &row0);
    /* the q heads' RoPE parts: each thread its pairs, in place */
    for (int idx = tid; idx < p.n_head * half; idx += TM_MLA_THREADS) {
        const int h = idx / half, i = idx % half;
        int e0, e1;
        tm_mla_pair(p, i, &e0, &e1);
        float c, s;
        tm_mla_angle(p, pos, i, &c, &s);
        float *x = q + (t * p.n_head + h) * D + L;
        const float a = x[e0], b = x[e1];
        x[e0] = a * c - b * s, x[e1] = a * s + b * c;
    }
    /* the latent's RMSNorm (block-uniform branch: every thread reaches the barrier) */
    float *row = kv + t * D;
    if (kv_norm) {
        float ss = 0.f;
        for (int i = tid; i < L; i += TM_MLA_THREADS) ss += row[i] * row[i];
        ss = tm_warp_sum(ss);
        if (tid % TM_CUDA_WARP == 0) part[tid / TM_CUDA_WARP] = ss;
        __syncthreads();
        float tot = 0.f;
#pragma unroll
        for (int w = 0; w < TM_MLA_WARPS; w++) tot += part[w];
        const float scale = 1.0f / sqrtf(tot / (float)L + p.rms_eps);
        __syncthreads(); /* every read of the row before the first write */
        for (int i = tid; i < L; i += TM_MLA_THREADS) row[i] = row[i] * scale * kv_norm[i];
    }
    for (int i = tid; i < half; i += TM_MLA_THREADS) { /* the RoPE key */
        int e0, e1;
        tm_mla_pair(p, i, &e0, &e1);
        float c, s;
        tm_mla_angle(p, pos, i, &c, &s);
        const float a = row[L + e0], b = row[L + e1];
        row[L + e0] = a * c - b * s, row[L + e1] = a * s + b * c;
    }
    __syncthreads(); /* the row complete before it is stored */
    const int64_t seq_rows = p.seq_rows ? p.seq_rows : p.n_ctx, at = row0 + pos;
    if (pos < 0 || pos >= seq_rows || at < 0 || at >= p.n_ctx) return; /* never outside */
    for (int i = tid; i < D; i += TM_MLA_THREADS) {
        if (p.kv_type == TM_TYPE_F16)
            ((__half *)k_cache)[at * D + i] = __float2half_rn(row[i]);
        else
            ((float *)k_cache)[at * D + i] = row[i];
    }
}

static __device__ __forceinline__ float tm_mla_key(const tm_cuda_attn_params &p, const void *kc,
                                                   int64_t off) {
    return p.kv_type == TM_TYPE_F16 ? __half2float(((const __half *)kc)[off])
                                    : ((const float *)kc)[off];
}

__global__ void __launch_bounds__(TM_MLA_THREADS)
    tm_mla_attention_kernel(tm_cuda_attn_params p, const float *q, const void *k_cache,
                            const int32_t *pos0, float *out) {
    __shared__ float sc[TM_MLA_TK];
    __shared__ float st[2]; /* the tile's rescale of the accumulators, and the running sum */
    const int h = blockIdx.x;
    const int64_t t = blockIdx.y;
    const int D = p.head_dim, L = p.v_dim, tid = threadIdx.x, w = tid / TM_CUDA_WARP,
              lane = tid % TM_CUDA_WARP;
    int64_t pos, row0;
    tm_mla_row(p, pos0, t, &pos, &row0);
    const int64_t seq_rows = p.seq_rows ? p.seq_rows : p.n_ctx;
    const int64_t n_kv = pos < 0 ? 0 : pos + 1 < seq_rows ? pos + 1 : seq_rows;
    const float *qh = q + (t * p.n_head + h) * D;
    float acc[TM_MLA_PER];
#pragma unroll
    for (int r = 0; r < TM_MLA_PER; r++) acc[r] = 0.f;
    float m = -INFINITY, l = 0.f; /* thread 0's running max and sum */
    for (int64_t base = 0; base < n_kv; base += TM_MLA_TK) {
        for (int j = w; j < TM_MLA_TK; j += TM_MLA_WARPS) { /* scores */
            float s = 0.f;
            if (base + j < n_kv) {
                const int64_t off = (row0 + base + j) * D;
                for (int i = lane; i < D; i += TM_CUDA_WARP)
                    s += qh[i] * tm_mla_key(p, k_cache, off + i);
            }
            s = tm_warp_sum(s);
            if (lane == 0) sc[j] = base + j < n_kv ? s * p.scale : -INFINITY;
        }
        __syncthreads();
        if (tid == 0) { /* the tile's online-softmax step */
            float mb = m;
            for (int j = 0; j < TM_MLA_TK; j++) mb = fmaxf(mb, sc[j]);
            const float alpha = expf(m - mb); /* 0 on the first tile: m = -inf */
            float sum = 0.f;
            for (int j = 0; j < TM_MLA_TK; j++) sum += sc[j] = expf(sc[j] - mb);
            m = mb, l = l * alpha + sum;
            st[0] = alpha, st[1] = l;
        }
        __syncthreads();
        const float alpha = st[0];
#pragma unroll
        for (int r = 0; r < TM_MLA_PER; r++) {
            const int i = tid + r * TM_MLA_THREADS;
            if (i >= L) continue;
            float a = acc[r] * alpha;
            for (int j = 0; j < TM_MLA_TK && base + j < n_kv; j++)
                a += sc[j] * tm_mla_key(p, k_cache, (row0 + base + j) * D + i);
            acc[r] = a;
        }
        __syncthreads(); /* sc and st are the next tile's */
    }
    const float inv = n_kv ? 1.0f / st[1] : 0.f;
#pragma unroll
    for (int r = 0; r < TM_MLA_PER; r++) {
        const int i = tid + r * TM_MLA_THREADS;
        if (i < L) out[(t * p.n_head + h) * (int64_t)L + i] = acc[r] * inv;
    }
}

__global__ void tm_copy_rows_kernel(float *dst, int64_t dst_ld, const float *src, int64_t src_ld,
                                    int64_t rows, int64_t n) {
    const int64_t total = rows * n;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x)
        dst[idx / n * dst_ld + idx % n] = src[idx / n * src_ld + idx % n];
}

/* ---- launchers ---- */

extern "C" tm_status cuda_mla_prepare(const tm_cuda_attn_params *p, float *q, float *kv,
                                      const float *kv_norm, const int32_t *pos0, int64_t n_tok,
                                      void *k_cache, tm_cuda_stream stream) {
    tm_status st = cuda_mla_check("cuda_mla_prepare", p, n_tok, q, kv, pos0, k_cache);
    if (st || n_tok == 0) return st;
    tm_mla_prepare_kernel<<<(unsigned)n_tok, TM_MLA_THREADS, 0, stream>>>(*p, q, kv, kv_norm, pos0,
                                                                          k_cache);
    return tm_cuda_launch_check("cuda_mla_prepare", n_tok, p->n_head, p->head_dim);
}

extern "C" int64_t cuda_mla_scratch_floats(const tm_cuda_attn_params *p, int64_t n_tok) {
    return p && tm_mla_tc_ok(*p, NULL, NULL, NULL) ? tm_mla_tc_scratch_floats(*p, n_tok) : 0;
}

extern "C" tm_status cuda_mla_attention(const tm_cuda_attn_params *p, const float *q,
                                        const void *k_cache, const int32_t *pos0, int64_t n_tok,
                                        float *out, float *scratch, tm_cuda_stream stream) {
    tm_status st = cuda_mla_check("cuda_mla_attention", p, n_tok, q, out, pos0, k_cache);
    if (st || n_tok == 0) return st;
    if (tm_mla_tc_ok(*p, q, k_cache, out)) /* DeepSeek-V3's shape on tensor cores */
        return tm_mla_tc_launch(*p, q, k_cache, pos0, n_tok, out, scratch, stream);
    const dim3 grid((unsigned)p->n_head, (unsigned)n_tok);
    tm_mla_attention_kernel<<<grid, TM_MLA_THREADS, 0, stream>>>(*p, q, k_cache, pos0, out);
    return tm_cuda_launch_check("cuda_mla_attention", n_tok, p->n_head, p->head_dim);
}

extern "C" tm_status cuda_copy_rows(float *dst, int64_t dst_ld, const float *src, int64_t src_ld,
                                    int64_t rows, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_copy_rows_check(dst, dst_ld, src, src_ld, rows, n);
    if (st || !rows || !n) return st;
    const int64_t blocks = (rows * n + 255) / 256;
    tm_copy_rows_kernel<<<(unsigned)(blocks < 1024 ? blocks : 1024), 256, 0, stream>>>(
        dst, dst_ld, src, src_ld, rows, n);
    return tm_cuda_launch_check("cuda_copy_rows", rows, n, 1);
}
