/* Prompt attention on tensor cores: the path cuda_attention (attention.cu)
 * takes for a prompt of one sequence (n_tok > TM_ATTN_SPLIT_TOK) with an f16
 * KV cache and head_dim 64 or 128, outside the precise mode. Same contract as
 * the f32 kernel (causal, grouped-query heads, sliding window, sinks, ring
 * caches: a tile's rows addressed one by one, so a tile may wrap); the
 * arithmetic differs in two roundings to f16: Q (f32 from cuda_attn_prepare,
 * converted while it is loaded) and the softmax weights P before P·V.
 *
 * Flash-attention 2 with mma.sync.m16n8k16 (f16 inputs, f32 accumulation):
 *   A block (4 warps) owns one KV head g and 64 query rows of its group (row
 *   r = t*G + hh is token t, head g*G + hh, as the f32 kernel: the G heads
 *   sharing a KV head read each K/V tile once). Warp w owns rows 16w..16w+15;
 *   lane l holds rows l/4 and l/4 + 8 of them (the m16n8k16 row pairs). Blocks
 *   are taken longest first (the last rows see the most keys).
 *   Q: the warp's 16 rows x head_dim in registers as A fragments (f32 pairs
 *   read from global memory, rounded to f16), loaded once.
 *   K/V: tiles of 64 keys [key][head_dim] f16 in shared memory, rows padded
 *   by 16 bytes (the 8 row addresses of an ldmatrix land in distinct banks),
 *   two stages: cp.async copies tile i + 1 while tile i is used; keys at or
 *   past the block's last key are zero-filled, never read (the cache past
 *   the batch may hold anything).
 *   S = Q·Kᵀ: K fragments by ldmatrix (a K row is a B column), 16 x 64 f32
 *   scores per warp in registers, times scale·log2(e) (softmax in base 2).
 *   Keys past a row's causal limit, before its window, or past the block's
 *   range score -inf (checked only in tiles that touch a limit).
 *   Online softmax per row in registers (max over the 4 lanes of a row by
 *   shuffle); P is rounded to f16 and packed: the accumulator layout of S is
 *   the A-fragment layout of P·V, no shared memory round trip. The row sum l
 *   adds the rounded weights, the ones P·V uses.
 *   O += P·V: V fragments by ldmatrix.trans, 16 x head_dim f32 accumulators.
 *   End: l summed over the row's 4 lanes, the sink's exp added
 *   (tm_attn_inv), out = O / l written as float pairs.
 * Shared memory: 2 stages x (K + V) x 64 x (head_dim + 8) halves: 69,632 B
 * for head_dim 128 (opt-in over 48 KiB), 36,864 B for 64. */
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include "cuda/attention.cuh"
#include "cuda/mma_f16.cuh"

#define TM_ATC_WARPS   4
#define TM_ATC_THREADS (TM_ATC_WARPS * TM_CUDA_WARP)
#define TM_ATC_ROWS    (16 * TM_ATC_WARPS) /* query rows a block */
#define TM_ATC_TK      64                  /* keys a tile */
#define TM_ATC_PAD     8                   /* halves of padding a shared row */

static size_t tm_atc_smem(int d) {
    return (size_t)2 * 2 * TM_ATC_TK * (d + TM_ATC_PAD) * sizeof(__half);
}

/* Copy keys [base, base + 64) of KV head g into one stage (K then V);
 * keys at or past k_hi are zero-filled. Each key's row on its own (a ring's
 * tile may wrap: tm_attn_row from the block's wrap point). */
template <int D>
static __device__ __forceinline__ void tm_atc_stage(const tm_attn_args &a, __half *sk, int g,
                                                    int64_t base, int64_t k_hi, int64_t wrap) {
    constexpr int S = D + TM_ATC_PAD, CPR = D / 8; /* 16-byte chunks a row */
    __half *sv = sk + TM_ATC_TK * S;
    const int64_t row_elems = (int64_t)a.n_head_kv * D;
#pragma unroll
    for (int idx = threadIdx.x; idx < TM_ATC_TK * CPR; idx += TM_ATC_THREADS) {
        const int j = idx / CPR, c = idx % CPR;
        const int64_t kp = base + j;
        const bool in = kp < k_hi;
        const int64_t off =
            (in ? tm_attn_row(a, kp, wrap) : 0) * row_elems + (int64_t)g * D + c * 8;
        __pipeline_memcpy_async(sk + j * S + c * 8, (const __half *)a.k + off, 16, in ? 0 : 16);
        __pipeline_memcpy_async(sv + j * S + c * 8, (const __half *)a.v + off, 16, in ? 0 : 16);
    }
    __pipeline_commit();
}

template <int D> __global__ void __launch_bounds__(TM_ATC_THREADS) tm_atc_kernel(tm_attn_args a) {
    constexpr int S = D + TM_ATC_PAD, NT = TM_ATC_TK / 8; /* n-tiles of keys */
    extern __shared__ float4 tm_atc_smem4[];
    __half *const sm = (__half *)tm_atc_smem4; /* [stage][K, V][TK][S] */
    const int warp = threadIdx.x / TM_CUDA_WARP, lane = threadIdx.x % TM_CUDA_WARP;
    const int gq = lane / 4, tq = lane % 4, g = blockIdx.y, G = a.group;
    const int64_t pos0 = *a.pos0, n_kv = tm_attn_n_kv(a, pos0, a.n_tok);
    const int64_t rows = (int64_t)G * a.n_tok;
    const int64_t r0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TM_ATC_ROWS; /* longest first */
    const int64_t r_end = r0 + TM_ATC_ROWS < rows ? r0 + TM_ATC_ROWS : rows;
    const int64_t k_lo = tm_attn_first_key(a, pos0 + r0 / G);
    int64_t k_hi = pos0 + (r_end - 1) / G + 1; /* past the block's last row's position */
    if (k_hi > n_kv) k_hi = n_kv;
    const int64_t wrap = tm_attn_wrap(a, k_lo); /* keys [k_lo, k_hi) span at most a ring */

    /* the lane's two rows: causal limit and window start (-1, 0: no row) */
    const int64_t rw0 = r0 + 16 * warp, ra = rw0 + gq, rb = ra + 8;
    const int64_t lim_a = ra < rows ? pos0 + ra / G : -1, lim_b = rb < rows ? pos0 + rb / G : -1;
    const int64_t lo_a = a.window ? lim_a + 1 - a.window : 0;
    const int64_t lo_b = a.window ? lim_b + 1 - a.window : 0;
    /* the warp's tightest limits: a tile inside them needs no mask */
    const bool warp_full = rw0 + 15 < rows;
    const int64_t wlim = pos0 + rw0 / G, wlo = a.window ? pos0 + (rw0 + 15) / G + 1 - a.window : 0;

    /* Q fragments: k-step kk holds dims 16kk + 2tq (+1) and + 8, rows a and b */
    uint32_t qf[D / 16][4];
    {
        const float *qa = a.q + ((ra / G) * a.n_head + (int64_t)g * G + ra % G) * D;
        const float *qb = a.q + ((rb / G) * a.n_head + (int64_t)g * G + rb % G) * D;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int i = 16 * kk + 8 * h + 2 * tq;
                const float2 xa = ra < rows ? *(const float2 *)(qa + i) : make_float2(0.f, 0.f);
                const float2 xb = rb < rows ? *(const float2 *)(qb + i) : make_float2(0.f, 0.f);
                qf[kk][2 * h] = tm_mma_pack(xa.x, xa.y);
                qf[kk][2 * h + 1] = tm_mma_pack(xb.x, xb.y);
            }
        }
    }

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    const float c = a.scale * TM_ATTN_LOG2E;

    const int64_t n_tiles = k_hi > k_lo ? (k_hi - k_lo + TM_ATC_TK - 1) / TM_ATC_TK : 0;
    if (n_tiles > 0) tm_atc_stage<D>(a, sm, g, k_lo, k_hi, wrap);
    /* block-uniform trip count: every thread reaches every barrier */
    for (int64_t it = 0; it < n_tiles; it++) {
        const int64_t base = k_lo + it * TM_ATC_TK;
        if (it + 1 < n_tiles) {
            tm_atc_stage<D>(a, sm + ((it + 1) & 1) * 2 * TM_ATC_TK * S, g, base + TM_ATC_TK, k_hi,
                            wrap);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads(); /* tile it is in every thread's view */
        const __half *sk = sm + (it & 1) * 2 * TM_ATC_TK * S, *sv = sk + TM_ATC_TK * S;

        /* S = Q·Kᵀ: ldmatrix of keys 8j + l % 8, dims 16kk + 8 (l / 8): two k-steps */
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk += 2) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                uint32_t b[4];
                tm_mma_ldsm4(b, sk + (8 * j + lane % 8) * S + 16 * kk + 8 * (lane / 8));
                tm_mma_16816(s[j], qf[kk], b[0], b[1]);
                tm_mma_16816(s[j], qf[kk + 1], b[2], b[3]);
            }
        }

        /* base-2 scores; -inf outside each row's keys (element e: row a for
         * e < 2, else b; key base + 8j + 2tq + e % 2) */
        const bool full = warp_full && base + TM_ATC_TK <= k_hi && base + TM_ATC_TK - 1 <= wlim &&
                          base >= wlo; /* warp-uniform */
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[j][e] * c;
                if (!full) {
                    const int64_t kp = base + 8 * j + 2 * tq + (e & 1);
                    const int64_t lim = e < 2 ? lim_a : lim_b, lo = e < 2 ? lo_a : lo_b;
                    if (kp >= k_hi || kp > lim || kp < lo) x = -INFINITY;
                }
                s[j][e] = x;
            }
        }

        /* online softmax (P in f16 as P·V's A fragments) */
        uint32_t pf[TM_ATC_TK / 16][4];
        tm_mma_softmax_step(s, m_a, m_b, l_a, l_b, pf, o);

        /* O += P·V: ldmatrix.trans of keys 16kk + l % 8 + 8 (l / 8 % 2), dims
         * 8n + 8 (l / 16): n-tiles n and n + 1 */
#pragma unroll
        for (int kk = 0; kk < TM_ATC_TK / 16; kk++) {
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                uint32_t b[4];
                tm_mma_ldsm4_t(b, sv + (16 * kk + lane % 8 + 8 * (lane / 8 % 2)) * S + 8 * n +
                                      8 * (lane / 16));
                tm_mma_16816(o[n], pf[kk], b[0], b[1]);
                tm_mma_16816(o[n + 1], pf[kk], b[2], b[3]);
            }
        }
        __syncthreads(); /* tile it is consumed: the next iteration refills its stage */
    }

    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t r = h ? rb : ra;
        if (r >= rows) continue;
        const int64_t orow = (r / G) * a.n_head + (int64_t)g * G + r % G; /* t n_head + head */
        const float inv = tm_attn_inv(a, orow % a.n_head, h ? m_b : m_a, h ? l_b : l_a, true);
        float *out = a.out + orow * D + 2 * tq;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *(float2 *)(out + 8 * n) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
    }
}

bool tm_attn_tc_ok(const tm_attn_args &a, bool precise) {
    return !precise && a.n_tok > TM_ATTN_SPLIT_TOK && !a.row_pos && a.f16 &&
           (a.d == 64 || a.d == 128) && (uintptr_t)a.k % 16 == 0 && (uintptr_t)a.v % 16 == 0 &&
           (uintptr_t)a.q % 8 == 0 && (uintptr_t)a.out % 8 == 0;
}

template <int D> static tm_status tm_atc_launch(const tm_attn_args &a, tm_cuda_stream stream) {
    const size_t smem = tm_atc_smem(D);
    if (smem > 48 * 1024)
        TM_CUDA_TRY(cudaFuncSetAttribute(tm_atc_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int64_t blocks = ((int64_t)a.group * a.n_tok + TM_ATC_ROWS - 1) / TM_ATC_ROWS;
    if (blocks > 0x7fffffffLL)
        return tm_error_set(TM_ERR_ARG, "cuda_attention: %lld tokens x %d heads a group: too many",
                            (long long)a.n_tok, a.group);
    const dim3 grid((unsigned)blocks, (unsigned)a.n_head_kv);
    tm_atc_kernel<D><<<grid, TM_ATC_THREADS, smem, stream>>>(a);
    return TM_OK;
}

tm_status tm_attn_tc_launch(const tm_attn_args &a, tm_cuda_stream stream) {
    return a.d == 64 ? tm_atc_launch<64>(a, stream) : tm_atc_launch<128>(a, stream);
}
