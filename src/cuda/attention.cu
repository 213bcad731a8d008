/* Attention of one layer on the GPU: the Q/K preparation (QK-norm, NeoX RoPE,
 * KV-cache store) and causal grouped-query attention, both reading the batch
 * position from device memory (*pos0) so a captured decode graph replays at
 * the next position. Same math as the CPU path (src/cpu/cpu_ops.c:
 * cpu_rmsnorm, cpu_rope_table + cpu_rope_neox_table, cpu_store_kv,
 * cpu_attention), in float32 with float accumulation.
 *
 * cuda_attn_prepare: one block of 128 threads per (token, head slot); slots
 * are the n_head query heads, then the n_head_kv key heads, then the
 * n_head_kv value heads. Thread i < head_dim/2 owns the RoPE pair (i, i + d/2).
 *
 * cuda_attention: a prompt of one sequence with an f16 cache and head_dim 64
 * or 128 goes to the tensor-core kernel (attention_tc.cu) unless precise;
 * everything else runs the f32 kernel below, one kernel for prompts and
 * decode. A block (4 warps) owns one KV head g, a block of query rows of that
 * group (row r = t*G + hh is token t, head g*G + hh; each warp owns RW
 * consecutive rows) and a key range.
 * It walks the range in tiles of 32 keys, staged in shared memory as float
 * (K, V [32][ds], Q [4*RW][ds], ds = padded head_dim so the per-lane float4
 * reads of K rows hit distinct banks): lane j scores key j for the warp's
 * rows, the warp updates its rows' online softmax (max, sum, accumulator;
 * lane owns dims lane + 32c), then accumulates P·V with p broadcast by
 * shuffle. Keys past a row's causal limit score -inf.
 *   prompt (n_tok > 8): one key range per block (all keys), out written.
 *   decode (n_tok <= 8): the keys are split over n_split blocks (fixed at
 *     launch from n_kv_max, so enough blocks fill the GPU); the split length
 *     is computed on the device from the real KV length (a multiple of 32),
 *     splits past it exit at once. Each block writes per row a record
 *     (max, sum, acc[head_dim]) to scratch
 *     [n_split][n_tok * n_head][head_dim + 2]; a combine kernel (one warp per
 *     row) merges the used records with an exact log-sum-exp rescale.
 *   rows of several sequences (row_pos / row_seq): grid z covers tokens times
 *     the row blocks of one token; a block takes its token's position and
 *     its sequence from the arrays and runs as a launch of that token alone
 *     would (the splits of one token, up to 8 rows) over that sequence's rows.
 * A ring cache (a sliding layer's: position p at row p % seq_rows) changes
 * only where a tile's rows are read: keys stay positions, the block's key
 * range spans at most the ring, so its first key's wrap point (one division
 * a block) and one compare a key row give each row (tm_attn_row).
 * A sliding window (keys (p - window, p]) starts each block's key range at
 * the window of its first row (decode: of the batch's first token, and the
 * splits cover the keys from there) and scores keys before a row's window
 * -inf; sinks add exp(sink - m) to each row's denominator at the end (or in
 * the combine), with m raised to the sink when it is larger. */
#include <cuda_fp16.h>
#include <math.h>

#include "cuda/attention.cuh"
#include "cuda/attention_check.h"

#define TM_ATTN_WARPS   4
#define TM_ATTN_THREADS (TM_ATTN_WARPS * TM_CUDA_WARP)
#define TM_ATTN_TK      32 /* keys per tile: one per lane */
/* dims per lane: NC = 8 up to head_dim 256, 16 up to TM_CUDA_ATTN_MAX_DIM (512: Gemma 4's
 * global heads), so the smaller heads keep their registers */
#define TM_ATTN_NC_SMALL     8
#define TM_ATTN_NC_LARGE     (TM_CUDA_ATTN_MAX_DIM / TM_CUDA_WARP)
#define TM_ATTN_PREP_MAX     256 /* prepare's threads: head_dim / 2 of the largest head */
#define TM_ATTN_MAX_SPLITS   256
#define TM_ATTN_TARGET_BLKS  264 /* about 2 blocks per SM of an H100 (132 SMs) */
#define TM_ATTN_SMEM_DEFAULT (48 * 1024)

/* Keys per split: the real length over n_split, rounded up to whole tiles. */
static __device__ __forceinline__ int64_t tm_attn_chunk(int64_t n_kv, int32_t n_split) {
    int64_t c = (n_kv + n_split - 1) / n_split;
    c = (c + TM_ATTN_TK - 1) / TM_ATTN_TK * TM_ATTN_TK;
    return c > 0 ? c : TM_ATTN_TK;
}

/* Stage keys [base, base + 32) of head g into a [32][ds] float tile; rows at
 * or past k_hi are zero (never read from the cache). Dims >= d are untouched.
 * An f16 cache with 16-byte rows goes through tm_attn_load_kv instead. wrap:
 * the block's ring wrap point (tm_attn_row). */
static __device__ __forceinline__ void tm_attn_load_tile(const tm_attn_args &a, const void *src,
                                                         float *tile, int g, int64_t base,
                                                         int64_t k_hi, int64_t wrap) {
    const int d = a.d;
    const int64_t row_elems = (int64_t)a.n_head_kv * d;
    if (a.vec && !a.f16) { /* 16-byte loads of 4 floats */
        const int per_row = d / 4;
        for (int idx = threadIdx.x; idx < TM_ATTN_TK * per_row; idx += TM_ATTN_THREADS) {
            const int j = idx / per_row, c = idx % per_row;
            const int64_t kp = base + j;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (kp < k_hi)
                x = *((const float4 *)((const float *)src + tm_attn_row(a, kp, wrap) * row_elems +
                                       (int64_t)g * d) +
                      c);
            *(float4 *)(tile + j * a.ds + c * 4) = x;
        }
    } else { /* any even head_dim or unaligned cache: one value per thread */
        for (int idx = threadIdx.x; idx < TM_ATTN_TK * d; idx += TM_ATTN_THREADS) {
            const int j = idx / d, i = idx % d;
            const int64_t kp = base + j;
            float x = 0.f;
            if (kp < k_hi) {
                const int64_t off = tm_attn_row(a, kp, wrap) * row_elems + (int64_t)g * d + i;
                x = a.f16 ? __half2float(((const __half *)src)[off]) : ((const float *)src)[off];
            }
            tile[j * a.ds + i] = x;
        }
    }
}

/* f16 halves 8 at a time to 8 floats at dst. */
static __device__ __forceinline__ void tm_attn_store8(float *dst, const uint4 &raw) {
    const __half2 *h2 = (const __half2 *)&raw;
    const float2 f0 = __half22float2(h2[0]), f1 = __half22float2(h2[1]);
    const float2 f2 = __half22float2(h2[2]), f3 = __half22float2(h2[3]);
    ((float4 *)dst)[0] = make_float4(f0.x, f0.y, f1.x, f1.y);
    ((float4 *)dst)[1] = make_float4(f2.x, f2.y, f3.x, f3.y);
}

/* The K and V tiles of keys [base, base + 32) (rows at or past k_hi zero). With
 * an f16 cache and 16-byte rows, each thread issues all its loads of both
 * tiles before its first shared store: a decode block holds one or two tiles,
 * and loads taken one loop trip at a time (runtime bounds: nvcc does not batch
 * them) cost a memory latency each. */
#define TM_ATTN_LD 4 /* 16-byte loads of each tile per thread per round */
static __device__ __forceinline__ void tm_attn_load_kv(const tm_attn_args &a, const void *kc,
                                                       const void *vc, float *sK, float *sV, int g,
                                                       int64_t base, int64_t k_hi, int64_t wrap) {
    if (!(a.vec && a.f16)) {
        tm_attn_load_tile(a, kc, sK, g, base, k_hi, wrap);
        tm_attn_load_tile(a, vc, sV, g, base, k_hi, wrap);
        return;
    }
    const int per_row = a.d / 8, n = TM_ATTN_TK * per_row;
    const int64_t row_elems = (int64_t)a.n_head_kv * a.d;
    for (int i0 = threadIdx.x; i0 < n; i0 += TM_ATTN_LD * TM_ATTN_THREADS) {
        uint4 rk[TM_ATTN_LD], rv[TM_ATTN_LD];
#pragma unroll
        for (int u = 0; u < TM_ATTN_LD; u++) {
            const int idx = i0 + u * TM_ATTN_THREADS, j = idx / per_row, c = idx % per_row;
            rk[u] = rv[u] = make_uint4(0u, 0u, 0u, 0u);
            if (idx < n && base + j < k_hi) {
                const int64_t off = tm_attn_row(a, base + j, wrap) * row_elems + (int64_t)g * a.d;
                rk[u] = ((const uint4 *)((const __half *)kc + off))[c];
                rv[u] = ((const uint4 *)((const __half *)vc + off))[c];
            }
        }
#pragma unroll
        for (int u = 0; u < TM_ATTN_LD; u++) {
            const int idx = i0 + u * TM_ATTN_THREADS, j = idx / per_row, c = idx % per_row;
            if (idx < n) {
                tm_attn_store8(sK + j * a.ds + c * 8, rk[u]);
                tm_attn_store8(sV + j * a.ds + c * 8, rv[u]);
            }
        }
    }
}

template <int RW, int TM_ATTN_NC>
__global__ void __launch_bounds__(TM_ATTN_THREADS) tm_attn_kernel(tm_attn_args a) {
    extern __shared__ float4 tm_attn_smem4[];
    float *sK = (float *)tm_attn_smem4, *sV = sK + TM_ATTN_TK * a.ds,
          *sQ = sV + TM_ATTN_TK * a.ds; /* sQ: [TM_ATTN_WARPS * RW][ds] */
    const int split = blockIdx.x, g = blockIdx.y;
    const int warp = threadIdx.x / TM_CUDA_WARP, lane = threadIdx.x % TM_CUDA_WARP;
    const int d = a.d, G = a.group;
    /* rows of several sequences: this block is token t0's alone, at its own
     * position, over its own sequence's cache rows */
    int64_t t0 = 0, n_tok = a.n_tok, zb = blockIdx.z, pos0;
    const void *kc = a.k, *vc = a.v;
    if (a.row_pos) {
        t0 = blockIdx.z / a.row_blocks, zb = blockIdx.z % a.row_blocks, n_tok = 1;
        pos0 = a.row_pos[t0];
        const int64_t kv0 = (int64_t)a.row_seq[t0] * a.seq_rows * a.n_head_kv * d * (a.f16 ? 2 : 4);
        kc = (const char *)a.k + kv0, vc = (const char *)a.v + kv0;
    } else {
        pos0 = *a.pos0;
    }
    const int64_t n_kv = tm_attn_n_kv(a, pos0, n_tok);

    const int64_t rows = (int64_t)G * n_tok, r0 = zb * TM_ATTN_WARPS * RW;
    int64_t k_lo = tm_attn_first_key(a, pos0 + r0 / G), k_hi = n_kv;
    if (a.n_split > 1) {
        const int64_t k0 = tm_attn_first_key(a, pos0), chunk = tm_attn_chunk(n_kv - k0, a.n_split);
        k_lo = k0 + split * chunk;
        if (k_lo >= n_kv) return; /* the whole block: past the real length */
        k_hi = k_lo + chunk < n_kv ? k_lo + chunk : n_kv;
    }
    const int64_t r_end = r0 + TM_ATTN_WARPS * RW < rows ? r0 + TM_ATTN_WARPS * RW : rows;
    /* no row of this block sees past its last token's position */
    const int64_t causal_hi = pos0 + (r_end - 1) / G + 1;
    if (causal_hi < k_hi) k_hi = causal_hi;
    const int64_t wrap = tm_attn_wrap(a, k_lo); /* keys [k_lo, k_hi) span at most a ring */

    /* Q rows (zero past the real rows and in the pad dims) and the K pad dims */
    /* (loads of a round first, then the stores: one latency a round, as tm_attn_load_kv) */
    const int nq = TM_ATTN_WARPS * RW * a.dp;
    for (int i0 = threadIdx.x; i0 < nq; i0 += 8 * TM_ATTN_THREADS) {
        float x[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int idx = i0 + u * TM_ATTN_THREADS, rr = idx / a.dp, i = idx % a.dp;
            const int64_t r = r0 + rr;
            x[u] = 0.f;
            if (idx < nq && r < rows && i < d)
                x[u] = a.q[((t0 + r / G) * a.n_head + (int64_t)g * G + r % G) * d + i];
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int idx = i0 + u * TM_ATTN_THREADS;
            if (idx < nq) sQ[(idx / a.dp) * a.ds + idx % a.dp] = x[u];
        }
    }
    for (int idx = threadIdx.x; idx < TM_ATTN_TK * (a.dp - d); idx += TM_ATTN_THREADS)
        sK[(idx / (a.dp - d)) * a.ds + d + idx % (a.dp - d)] = 0.f;

    int64_t lim[RW], lo[RW]; /* first and last key each of the warp's rows sees; -1: no row */
    float m[RW], lsum[RW], acc[RW][TM_ATTN_NC];
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        const int64_t r = r0 + warp * RW + rr;
        lim[rr] = r < rows ? pos0 + r / G : -1;
        lo[rr] = a.window && r < rows ? lim[rr] + 1 - a.window : 0;
        m[rr] = -INFINITY;
        lsum[rr] = 0.f;
#pragma unroll
        for (int c = 0; c < TM_ATTN_NC; c++) acc[rr][c] = 0.f;
    }

    /* block-uniform trip count: every thread reaches every barrier */
    for (int64_t base = k_lo; base < k_hi; base += TM_ATTN_TK) {
        __syncthreads(); /* the previous tile is consumed; Q and pads are stored */
        tm_attn_load_kv(a, kc, vc, sK, sV, g, base, k_hi, wrap);
        __syncthreads();

        /* scores: lane = key */
        float s[RW];
#pragma unroll
        for (int rr = 0; rr < RW; rr++) s[rr] = 0.f;
        const float *kr = sK + lane * a.ds;
        for (int i = 0; i < a.dp; i += 4) {
            const float4 k4 = *(const float4 *)(kr + i);
#pragma unroll
            for (int rr = 0; rr < RW; rr++) {
                const float4 q4 = *(const float4 *)(sQ + (warp * RW + rr) * a.ds + i);
                s[rr] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
            }
        }
        const int64_t kp = base + lane;
        const int nv = k_hi - base < TM_ATTN_TK ? (int)(k_hi - base) : TM_ATTN_TK;
#pragma unroll
        for (int rr = 0; rr < RW; rr++) {
            const float sc =
                kp < k_hi && kp <= lim[rr] && kp >= lo[rr] ? s[rr] * a.scale : -INFINITY;
            const float m_new = fmaxf(m[rr], tm_warp_max(sc)); /* warp-uniform */
            /* -inf - -inf would be NaN: a row with no key yet has nothing to rescale */
            const float alpha = m[rr] == -INFINITY ? 0.f : expf(m[rr] - m_new);
            s[rr] = sc == -INFINITY ? 0.f : expf(sc - m_new); /* now p */
            lsum[rr] = lsum[rr] * alpha + s[rr];
            m[rr] = m_new;
#pragma unroll
            for (int c = 0; c < TM_ATTN_NC; c++) acc[rr][c] *= alpha;
        }
        /* P·V: key j's weight from lane j; lane owns dims lane + 32c */
        for (int j = 0; j < nv; j++) {
            const float *vr = sV + j * a.ds;
#pragma unroll
            for (int rr = 0; rr < RW; rr++) {
                const float p = __shfl_sync(0xffffffffu, s[rr], j);
#pragma unroll
                for (int c = 0; c < TM_ATTN_NC; c++)
                    if (c * TM_CUDA_WARP + lane < d) acc[rr][c] += p * vr[c * TM_CUDA_WARP + lane];
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        const int64_t r = r0 + warp * RW + rr;
        if (r >= rows) break; /* warp-uniform */
        const float l = tm_warp_sum(lsum[rr]);
        const int64_t orow = (t0 + r / G) * a.n_head + (int64_t)g * G + r % G; /* t n_head + h */
        if (a.n_split == 1) {
            const float inv = tm_attn_inv(a, orow % a.n_head, m[rr], l);
            float *o = a.out + orow * d;
#pragma unroll
            for (int c = 0; c < TM_ATTN_NC; c++)
                if (c * TM_CUDA_WARP + lane < d) o[c * TM_CUDA_WARP + lane] = acc[rr][c] * inv;
        } else {
            float *rec = a.rec + ((int64_t)split * a.n_tok * a.n_head + orow) * (d + 2);
            if (lane == 0) rec[0] = m[rr], rec[1] = l;
#pragma unroll
            for (int c = 0; c < TM_ATTN_NC; c++)
                if (c * TM_CUDA_WARP + lane < d) rec[2 + c * TM_CUDA_WARP + lane] = acc[rr][c];
        }
    }
}

/* One warp per output row (t * n_head + h): merge the splits' records. Lane
 * j holds split c0 + j's weight exp(m - max); the records' values are read 8
 * splits at a time, all loads before the sums (a split at a time would cost
 * a memory latency per split: 21 us a layer at 512 keys on an H200, more
 * than the attention itself). */
#define TM_ATTN_COMB_U 8
template <int TM_ATTN_NC>
__global__ void __launch_bounds__(TM_ATTN_THREADS) tm_attn_combine_kernel(tm_attn_args a) {
    const int lane = threadIdx.x % TM_CUDA_WARP, d = a.d;
    const int64_t row = (int64_t)blockIdx.x * TM_ATTN_WARPS + threadIdx.x / TM_CUDA_WARP;
    if (row >= a.n_tok * a.n_head) return; /* whole warp */
    const int64_t p0 = a.row_pos ? a.row_pos[row / a.n_head] : *a.pos0;
    const int64_t n_kv = tm_attn_n_kv(a, p0, a.row_pos ? 1 : a.n_tok),
                  k0 = tm_attn_first_key(a, p0), chunk = tm_attn_chunk(n_kv - k0, a.n_split);
    int n_used = (int)((n_kv - k0 + chunk - 1) / chunk);
    if (n_used > a.n_split) n_used = a.n_split;
    const int64_t stride = a.n_tok * a.n_head * (d + 2);
    const float *rec = a.rec + row * (d + 2);
    float mx = -INFINITY;
    for (int sp = lane; sp < n_used; sp += TM_CUDA_WARP) mx = fmaxf(mx, rec[sp * stride]);
    mx = tm_warp_max(mx);
    float l = 0.f, acc[TM_ATTN_NC];
#pragma unroll
    for (int c = 0; c < TM_ATTN_NC; c++) acc[c] = 0.f;
    for (int c0 = 0; c0 < n_used; c0 += TM_CUDA_WARP) {
        float w = 0.f; /* this lane's split: a split no row key reached weighs 0 */
        if (c0 + lane < n_used) {
            const float ms = rec[(c0 + lane) * stride];
            w = ms == -INFINITY ? 0.f : expf(ms - mx);
            l += w * rec[(c0 + lane) * stride + 1];
        }
        const int nj = n_used - c0 < TM_CUDA_WARP ? n_used - c0 : TM_CUDA_WARP;
        for (int j0 = 0; j0 < nj; j0 += TM_ATTN_COMB_U) {
            float v[TM_ATTN_COMB_U][TM_ATTN_NC];
#pragma unroll
            for (int u = 0; u < TM_ATTN_COMB_U; u++) {
                const float *r = rec + (int64_t)(c0 + j0 + u) * stride + 2;
#pragma unroll
                for (int c = 0; c < TM_ATTN_NC; c++)
                    v[u][c] = j0 + u < nj && c * TM_CUDA_WARP + lane < d
                                  ? r[c * TM_CUDA_WARP + lane]
                                  : 0.f;
            }
#pragma unroll
            for (int u = 0; u < TM_ATTN_COMB_U; u++) {
                const float wu = __shfl_sync(0xffffffffu, w, (j0 + u) & (TM_CUDA_WARP - 1));
#pragma unroll
                for (int c = 0; c < TM_ATTN_NC; c++) acc[c] += wu * v[u][c];
            }
        }
    }
    l = tm_warp_sum(l);
    const float inv = tm_attn_inv(a, row % a.n_head, mx, l);
    float *o = a.out + row * d;
#pragma unroll
    for (int c = 0; c < TM_ATTN_NC; c++)
        if (c * TM_CUDA_WARP + lane < d) o[c * TM_CUDA_WARP + lane] = acc[c] * inv;
}

/* Partial RoPE of one head: the normalised head (x0, x1 at i and i + d/2 of
 * thread i < d/2) goes through shared memory, then thread i < n_rot/2 rotates
 * the pair (i, i + n_rot/2) at theta_i = pos * base^(-2i/n_rot) and the values
 * from n_rot on are written as they are. qh: the q head (in place: every read
 * of it was before the barrier; NULL for a key head) or kh, a key head's place
 * in its cache row (kv_type; NULL: a q head, or a key not stored). */
static __device__ void tm_attn_prepare_partial(const tm_cuda_attn_params &p, float x0, float x1,
                                               int64_t pos, float *qh, void *kh) {
    __shared__ float xs[TM_CUDA_ATTN_MAX_DIM];
    const int d = p.head_dim, half = d / 2, rh = p.n_rot / 2, i = threadIdx.x;
    if (i < half) xs[i] = x0, xs[i + half] = x1;
    __syncthreads();
    if (i >= half || (!qh && !kh)) return;
    const bool f16 = p.kv_type == TM_TYPE_F16;
    float y[2];
    int e[2], n = 0;
    if (i < rh) {
        const double theta =
            (double)pos * pow((double)p.rope_base, -2.0 * (double)i / (double)p.n_rot);
        double sd, cd;
        sincos(theta, &sd, &cd);
        const float c = (float)cd, s = (float)sd, a = xs[i], b = xs[i + rh];
        y[0] = a * c - b * s, y[1] = a * s + b * c;
        e[0] = i, e[1] = i + rh, n = 2;
    }
    for (int m = 0;; m++) { /* the rotated pair, then the values passed through */
        int at;
        float v;
        if (m < n)
            at = e[m], v = y[m];
        else if ((at = p.n_rot + i + (m - n) * half) < d)
            v = xs[at];
        else
            break;
        if (qh)
            qh[at] = v;
        else if (f16)
            ((__half *)kh)[at] = __float2half_rn(v);
        else
            ((float *)kh)[at] = v;
    }
}

/* Sum of v over the block (blockDim.x threads, whole warps); every thread gets it. */
static __device__ __forceinline__ float tm_attn_block_sum(float v, float *part) {
    v = tm_warp_sum(v);
    if (threadIdx.x % TM_CUDA_WARP == 0) part[threadIdx.x / TM_CUDA_WARP] = v;
    __syncthreads();
    float tot = 0.f;
    for (int j = 0; j < (int)(blockDim.x / TM_CUDA_WARP); j++) tot += part[j];
    return tot;
}

/* Thread i < d/2 owns the pair (i, i + d/2) of one head of one token (interleaved
 * RoPE: the pair (2i, 2i + 1)); blockDim.x: 128, or 256 for heads over 256. */
__global__ void __launch_bounds__(TM_ATTN_PREP_MAX)
    tm_attn_prepare_kernel(tm_cuda_attn_params p, float *q, const float *k, const float *v,
                           const float *q_norm, const float *k_norm, const int32_t *pos0,
                           void *k_cache, void *v_cache) {
    __shared__ float part[TM_ATTN_PREP_MAX / TM_CUDA_WARP];
    const int64_t t = blockIdx.x;
    const int slot = blockIdx.y, d = p.head_dim, half = d / 2, i = threadIdx.x;
    const int64_t pos = p.row_pos ? (int64_t)p.row_pos[t] : (int64_t)*pos0 + t;
    const int64_t seq_rows = p.seq_rows ? p.seq_rows : p.n_ctx;
    /* the cache row: the position's in its sequence's rows (a ring's: pos % seq_rows) */
    const int64_t kv_row = (p.row_seq ? (int64_t)p.row_seq[t] * seq_rows : 0) +
                           (p.ring && pos >= 0 ? pos % seq_rows : pos);
    const int64_t kvw = (int64_t)p.n_head_kv * d;
    const bool store = pos >= 0 && (p.ring || pos < seq_rows) && kv_row >= 0 &&
                       kv_row < p.n_ctx; /* never outside the sequence's rows or the cache */
    const bool f16 = p.kv_type == TM_TYPE_F16;

    if (slot >= p.n_head + p.n_head_kv) { /* a value head: convert and store */
        if (!store) return;               /* the whole block */
        const int64_t hv = slot - p.n_head - p.n_head_kv;
        const float *src = v + t * kvw + hv * d;
        const int64_t off = kv_row * kvw + hv * d;
        float r = 1.f; /* the value norm (no gain), as cpu_rmsnorm's */
        if (p.v_norm) {
            float ss = 0.f;
            for (int j = i; j < d; j += blockDim.x) ss += src[j] * src[j];
            r = 1.0f / sqrtf(tm_attn_block_sum(ss, part) / (float)d + p.rms_eps);
        }
        for (int j = i; j < d; j += blockDim.x) {
            const float x = p.v_norm ? src[j] * r : src[j];
            if (f16)
                ((__half *)v_cache)[off + j] = __float2half_rn(x);
            else
                ((float *)v_cache)[off + j] = x;
        }
        return;
    }
    const bool is_q = slot < p.n_head;
    const int64_t hk = slot - p.n_head;
    const float *src = is_q ? q + (t * p.n_head + slot) * d : k + t * kvw + hk * d;
    const float *w = is_q ? q_norm : k_norm;
    const int e0 = p.rope_interleaved ? 2 * i : i, e1 = p.rope_interleaved ? 2 * i + 1 : i + half;
    float x0 = 0.f, x1 = 0.f;
    if (i < half) x0 = src[e0], x1 = src[e1];
    if (w) { /* block-uniform: every thread reaches the barrier */
        const float tot = tm_attn_block_sum(x0 * x0 + x1 * x1, part);
        const float scale = 1.0f / sqrtf(tot / (float)d + p.rms_eps);
        if (i < half) x0 = x0 * scale * w[e0], x1 = x1 * scale * w[e1];
    }
    if (p.n_rot && p.n_rot != d) { /* partial RoPE (block-uniform) */
        float *qh = is_q ? q + (t * p.n_head + slot) * d : NULL;
        void *kh =
            !is_q && store ? (char *)k_cache + (kv_row * kvw + hk * d) * (f16 ? 2 : 4) : NULL;
        tm_attn_prepare_partial(p, x0, x1, pos, qh, kh);
        return;
    }
    if (i >= half) return;
    /* angles in double, as cpu_rope_table (cpu_rope_table_freq with a table); one
     * sincos: one range reduction for both */
    const double theta = p.rope_freq
                             ? (double)pos * (double)p.rope_freq[i]
                             : (double)pos * pow((double)p.rope_base, -2.0 * (double)i / (double)d);
    const double ms = p.rope_freq && p.rope_mscale ? p.rope_mscale : 1.0;
    double sd, cd;
    sincos(theta, &sd, &cd);
    const float c = (float)(cd * ms), s = (float)(sd * ms);
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    if (is_q) { /* in place: this thread read exactly these two values */
        q[(t * p.n_head + slot) * d + e0] = y0;
        q[(t * p.n_head + slot) * d + e1] = y1;
    } else if (store) {
        const int64_t off = kv_row * kvw + hk * d;
        if (f16) {
            ((__half *)k_cache)[off + e0] = __float2half_rn(y0);
            ((__half *)k_cache)[off + e1] = __float2half_rn(y1);
        } else {
            ((float *)k_cache)[off + e0] = y0;
            ((float *)k_cache)[off + e1] = y1;
        }
    }
}

/* ---- launchers ---- */

extern "C" tm_status cuda_attn_prepare(const tm_cuda_attn_params *p, float *q, const float *k,
                                       const float *v, const float *q_norm, const float *k_norm,
                                       const int32_t *pos0, int64_t n_tok, void *k_cache,
                                       void *v_cache, tm_cuda_stream stream) {
    tm_status st = cuda_attn_shape_check("cuda_attn_prepare", p, n_tok);
    if (st) return st;
    if (n_tok == 0) return TM_OK;
    if ((st = cuda_attn_prepare_check(p, q, k, v, pos0, k_cache, v_cache))) return st;
    const dim3 grid((unsigned)n_tok, (unsigned)(p->n_head + 2 * p->n_head_kv));
    const int threads = p->head_dim / 2 > TM_ATTN_THREADS ? TM_ATTN_PREP_MAX : TM_ATTN_THREADS;
    tm_attn_prepare_kernel<<<grid, threads, 0, stream>>>(*p, q, k, v, q_norm, k_norm, pos0, k_cache,
                                                         v_cache);
    return tm_cuda_launch_check("cuda_attn_prepare", n_tok, p->n_head, p->head_dim);
}

typedef struct tm_attn_plan {
    int rw;                  /* query rows per warp: 1, 2 or 4 */
    int64_t row_blocks;      /* blocks of TM_ATTN_WARPS * rw rows per KV head */
    int32_t n_split, dp, ds; /* key splits; head_dim padded to 4; smem row stride */
    size_t smem;             /* dynamic shared memory bytes */
} tm_attn_plan;

/* Launch shape from host-known sizes only (the same for a graph's every replay). */
static tm_attn_plan tm_attn_plan_make_one(const tm_cuda_attn_params *p, int64_t n_tok,
                                          int64_t n_kv_max) {
    tm_attn_plan pl;
    const int64_t rows = (int64_t)(p->n_head / p->n_head_kv) * n_tok;
    pl.rw = rows <= TM_ATTN_WARPS ? 1 : rows <= 2 * TM_ATTN_WARPS ? 2 : 4;
    pl.row_blocks = (rows + TM_ATTN_WARPS * pl.rw - 1) / (TM_ATTN_WARPS * pl.rw);
    pl.n_split = 1;
    if (n_tok <= TM_ATTN_SPLIT_TOK) {
        const int64_t blocks = p->n_head_kv * pl.row_blocks;
        int64_t want = (TM_ATTN_TARGET_BLKS + blocks - 1) / blocks;
        const int64_t tiles = (n_kv_max + TM_ATTN_TK - 1) / TM_ATTN_TK;
        if (want > tiles) want = tiles;
        if (want > TM_ATTN_MAX_SPLITS) want = TM_ATTN_MAX_SPLITS;
        pl.n_split = want > 1 ? (int32_t)want : 1;
    }
    pl.dp = (p->head_dim + 3) & ~3;
    pl.ds = 4 * ((pl.dp / 4) | 1); /* an odd number of float4s: conflict-free row reads */
    pl.smem = (size_t)(2 * TM_ATTN_TK + TM_ATTN_WARPS * pl.rw) * pl.ds * sizeof(float);
    return pl;
}

static tm_attn_plan tm_attn_plan_make(const tm_cuda_attn_params *p, int64_t n_tok,
                                      int64_t n_kv_max) {
    if (!p->row_pos) return tm_attn_plan_make_one(p, n_tok, n_kv_max);
    /* rows of several sequences: each token's blocks as a launch of it alone */
    tm_attn_plan pl = tm_attn_plan_make_one(p, 1, n_kv_max);
    if (n_tok > TM_ATTN_SPLIT_TOK) pl.n_split = 1; /* no scratch for many rows' records */
    return pl;
}

extern "C" int64_t cuda_attention_scratch_floats(const tm_cuda_attn_params *p, int64_t n_tok,
                                                 int64_t n_kv_max) {
    if (cuda_attn_shape_check("cuda_attention_scratch_floats", p, n_tok) || n_tok < 1 ||
        n_kv_max < 1)
        return 0;
    const tm_attn_plan pl = tm_attn_plan_make(p, n_tok, n_kv_max);
    return pl.n_split > 1 ? (int64_t)pl.n_split * n_tok * p->n_head * (p->head_dim + 2) : 0;
}

template <int RW, int NC>
static tm_status tm_attn_launch(const tm_attn_plan &pl, const tm_attn_args &a,
                                tm_cuda_stream stream) {
    if (pl.smem > TM_ATTN_SMEM_DEFAULT) /* head_dim > ~180: opt in to the larger carve-out */
        TM_CUDA_TRY(cudaFuncSetAttribute(
            tm_attn_kernel<RW, NC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.smem));
    const int64_t z = a.row_pos ? pl.row_blocks * a.n_tok : pl.row_blocks;
    const dim3 grid((unsigned)pl.n_split, (unsigned)a.n_head_kv, (unsigned)z);
    tm_attn_kernel<RW, NC><<<grid, TM_ATTN_THREADS, pl.smem, stream>>>(a);
    return TM_OK;
}

extern "C" tm_status cuda_attention(const tm_cuda_attn_params *p, const float *q,
                                    const void *k_cache, const void *v_cache, const int32_t *pos0,
                                    int64_t n_tok, int64_t n_kv_max, float *out, float *scratch,
                                    tm_cuda_stream stream) {
    tm_status st = cuda_attn_shape_check("cuda_attention", p, n_tok);
    if (st) return st;
    if (n_tok == 0) return TM_OK;
    if ((st = cuda_attention_check(p, n_tok, n_kv_max, q, k_cache, v_cache, pos0, out))) return st;
    const tm_attn_plan pl = tm_attn_plan_make(p, n_tok, n_kv_max);
    if ((p->row_pos ? pl.row_blocks * n_tok : pl.row_blocks) > 65535)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_attention: %lld tokens x %d heads per group: too many",
                            (long long)n_tok, p->n_head / p->n_head_kv);
    if (pl.n_split > 1 && !scratch)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_attention: n_tok %lld, n_kv_max %lld need %lld "
                            "scratch floats, got NULL",
                            (long long)n_tok, (long long)n_kv_max,
                            (long long)cuda_attention_scratch_floats(p, n_tok, n_kv_max));
    tm_attn_args a;
    a.q = q, a.k = k_cache, a.v = v_cache, a.pos0 = pos0, a.out = out, a.rec = scratch;
    a.row_pos = p->row_pos, a.row_seq = p->row_seq, a.row_blocks = (int32_t)pl.row_blocks;
    a.n_head = p->n_head, a.n_head_kv = p->n_head_kv, a.group = p->n_head / p->n_head_kv;
    a.d = p->head_dim, a.dp = pl.dp, a.ds = pl.ds;
    a.n_tok = n_tok, a.n_kv_max = n_kv_max;
    a.seq_rows = p->seq_rows ? p->seq_rows : p->n_ctx, a.ring = p->ring ? a.seq_rows : 0;
    a.n_split = pl.n_split, a.f16 = p->kv_type == TM_TYPE_F16, a.scale = p->scale;
    a.window = p->window > 0 ? p->window : 0, a.sinks = p->sinks;
    /* 16-byte loads need whole vectors per head row and aligned cache bases */
    a.vec = p->head_dim % (a.f16 ? 8 : 4) == 0 && ((uintptr_t)k_cache % 16) == 0 &&
            ((uintptr_t)v_cache % 16) == 0;
    if (tm_attn_tc_ok(a, p->precise)) { /* a prompt on tensor cores */
        if ((st = tm_attn_tc_launch(a, stream))) return st;
        return tm_cuda_launch_check("cuda_attention (tensor cores)", n_tok, p->n_head, n_kv_max);
    }
    const bool large = p->head_dim > TM_ATTN_NC_SMALL * TM_CUDA_WARP;
    if (large)
        st = pl.rw == 1   ? tm_attn_launch<1, TM_ATTN_NC_LARGE>(pl, a, stream)
             : pl.rw == 2 ? tm_attn_launch<2, TM_ATTN_NC_LARGE>(pl, a, stream)
                          : tm_attn_launch<4, TM_ATTN_NC_LARGE>(pl, a, stream);
    else
        st = pl.rw == 1   ? tm_attn_launch<1, TM_ATTN_NC_SMALL>(pl, a, stream)
             : pl.rw == 2 ? tm_attn_launch<2, TM_ATTN_NC_SMALL>(pl, a, stream)
                          : tm_attn_launch<4, TM_ATTN_NC_SMALL>(pl, a, stream);
    if (st) return st;
    if ((st = tm_cuda_launch_check("cuda_attention", n_tok, p->n_head, n_kv_max))) return st;
    if (pl.n_split > 1) {
        const int64_t rows = n_tok * p->n_head;
        const unsigned blocks = (unsigned)((rows + TM_ATTN_WARPS - 1) / TM_ATTN_WARPS);
        if (large)
            tm_attn_combine_kernel<TM_ATTN_NC_LARGE><<<blocks, TM_ATTN_THREADS, 0, stream>>>(a);
        else
            tm_attn_combine_kernel<TM_ATTN_NC_SMALL><<<blocks, TM_ATTN_THREADS, 0, stream>>>(a);
        return tm_cuda_launch_check("cuda_attention combine", n_tok, p->n_head, pl.n_split);
    }
    return TM_OK;
}
