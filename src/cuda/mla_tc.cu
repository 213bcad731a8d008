/* Latent attention (MLA, absorbed form) on tensor cores: the path cuda_mla_attention
 * (mla.cu) takes outside the precise mode for DeepSeek-V3 / Kimi K2's shape (key 576 =
 * latent 512 + RoPE 64, an f16 cache, a multiple of 32 heads). Same contract as the f32
 * kernel; the arithmetic differs in two roundings to f16: q (converted while it is
 * loaded) and the softmax weights P before P·V.
 *
 * Every head of a token reads the same keys (one KV head), so a block takes 32 heads of
 * one token (two row groups of 16: the m16n8k16 rows) and walks their keys in tiles of
 * 64 [key][576] f16 rows in shared memory (two stages: cp.async copies tile i + 1 while
 * tile i is used; keys past the range are zero-filled, never read).
 * 8 warps: warp w serves row group w / 4 and quarter w % 4 of the tile:
 *   S = Q·Kᵀ: the warp scores its quarter's 16 keys (36 k-steps, Q and K fragments by
 *   ldmatrix from shared memory), scaled to base 2, -inf past the range, and writes them
 *   to a shared [32][64] score tile;
 *   after a barrier every warp of a row group reads the group's 16 x 64 scores in the
 *   accumulator layout and runs the same online softmax (the four warps agree: the same
 *   inputs, the same operations); P in f16 is P·V's A fragments;
 *   O += P·V over the warp's 128 of the 512 latent dims (V = the keys' first 512 values,
 *   ldmatrix.trans), 16 x 128 f32 accumulators.
 * Decode (n_tok <= TM_MLA_TC_SPLIT_TOK): the keys are split over n_split blocks
 * (tm_mla_tc_splits: fixed from the sequence's rows, so a captured graph replays at any
 * length; each block's range computed on the device from the real length), each writing
 * per row a record (m, l, acc[512]) that the combine kernel merges with an exact
 * log-sum-exp rescale. Prompts: a block takes all keys of its token (longest first) and
 * writes out.
 * Shared memory: Q 32 x 584 + 2 stages x 64 x 584 halves + 32 x 64 floats: 195,072 B. */
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include "cuda/cuda_common.cuh"
#include "cuda/mla_tc.cuh"
#include "cuda/mma_f16.cuh"

#define TM_MTC_D       576 /* key: latent + RoPE */
#define TM_MTC_L       512 /* value: the latent */
#define TM_MTC_ROWS    32  /* heads a block */
#define TM_MTC_WARPS   8
#define TM_MTC_THREADS (TM_MTC_WARPS * TM_CUDA_WARP)
#define TM_MTC_TK      64             /* keys a tile */
#define TM_MTC_S       (TM_MTC_D + 8) /* a shared row, padded 16 bytes (ldmatrix banks) */
#define TM_MTC_REC     (TM_MTC_L + 2) /* a split's record: m, l, acc */
#define TM_MTC_BLOCKS  264            /* about 2 blocks an SM of an H100 / H200 (132 SMs) */
#define TM_MTC_LOG2E   1.4426950408889634f

static size_t tm_mtc_smem(void) {
    return (size_t)(TM_MTC_ROWS + 2 * TM_MTC_TK) * TM_MTC_S * sizeof(__half) +
           (size_t)TM_MTC_ROWS * TM_MTC_TK * sizeof(float);
}

/* Copy keys [base, base + 64) (cache rows row0 + key) into a stage; keys at or past
 * k_hi zero-filled. */
static __device__ __forceinline__ void tm_mtc_stage(const __half *kc, int64_t row0, __half *sk,
                                                    int64_t base, int64_t k_hi) {
    constexpr int CPR = TM_MTC_D / 8; /* 16-byte chunks a row */
    for (int idx = threadIdx.x; idx < TM_MTC_TK * CPR; idx += TM_MTC_THREADS) {
        const int j = idx / CPR, c = idx % CPR;
        const int64_t kp = base + j;
        const bool in = kp < k_hi;
        const int64_t off = (in ? row0 + kp : 0) * TM_MTC_D + c * 8;
        __pipeline_memcpy_async(sk + j * TM_MTC_S + c * 8, kc + off, 16, in ? 0 : 16);
    }
    __pipeline_commit();
}

/* Grid x: the token's blocks of 32 heads, times the tokens; y: the key splits (1 for a
 * prompt). rec NULL: write out (one split). */
__global__ void __launch_bounds__(TM_MTC_THREADS)
    tm_mtc_kernel(tm_cuda_attn_params p, const float *q, const __half *kc, const int32_t *pos0,
                  int64_t n_tok, float *out, float *rec) {
    extern __shared__ float4 tm_mtc_smem4[];
    __half *const sq = (__half *)tm_mtc_smem4;                   /* [32][S] */
    __half *const sk0 = sq + TM_MTC_ROWS * TM_MTC_S;             /* [2][64][S] */
    float *const ss = (float *)(sk0 + 2 * TM_MTC_TK * TM_MTC_S); /* [32][64] */
    const int warp = threadIdx.x / TM_CUDA_WARP, lane = threadIdx.x % TM_CUDA_WARP;
    const int gq = lane / 4, tq = lane % 4, rg = warp / 4, qd = warp % 4;
    const int hb = p.n_head / TM_MTC_ROWS;                            /* blocks a token */
    const int64_t bx = rec ? blockIdx.x : gridDim.x - 1 - blockIdx.x; /* prompts: longest first */
    const int64_t t = bx / hb;
    const int h0 = (int)(bx % hb) * TM_MTC_ROWS;
    int64_t pos, row0;
    {
        const int64_t seq_rows = p.seq_rows ? p.seq_rows : p.n_ctx;
        pos = p.row_pos ? (int64_t)p.row_pos[t] : (int64_t)*pos0 + t;
        row0 = p.row_seq ? (int64_t)p.row_seq[t] * seq_rows : 0;
        pos = pos + 1 < seq_rows ? pos : seq_rows - 1; /* keys [0, n_kv) */
    }
    const int64_t n_kv = pos < 0 ? 0 : pos + 1;
    /* the block's keys: its split of n_kv, whole tiles a split */
    const int64_t n_split = gridDim.y;
    int64_t len = (n_kv + n_split - 1) / n_split;
    len = (len + TM_MTC_TK - 1) / TM_MTC_TK * TM_MTC_TK;
    const int64_t k_lo = (int64_t)blockIdx.y * len;
    const int64_t k_hi = k_lo + len < n_kv ? k_lo + len : n_kv;

    /* Q: 32 heads x 576 f32 -> f16 in shared memory */
    const float *qb = q + (t * p.n_head + h0) * TM_MTC_D;
    for (int i = threadIdx.x; i < TM_MTC_ROWS * TM_MTC_D / 2; i += TM_MTC_THREADS) {
        const int r = 2 * i / TM_MTC_D, c = 2 * i % TM_MTC_D;
        const float2 v = *(const float2 *)(qb + (int64_t)r * TM_MTC_D + c);
        *(__half2 *)(sq + r * TM_MTC_S + c) = __floats2half2_rn(v.x, v.y);
    }

    float o[16][4];
#pragma unroll
    for (int n = 0; n < 16; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    const float c = p.scale * TM_MTC_LOG2E;
    const int64_t n_tiles = k_hi > k_lo ? (k_hi - k_lo + TM_MTC_TK - 1) / TM_MTC_TK : 0;
    if (n_tiles > 0) tm_mtc_stage(kc, row0, sk0, k_lo, k_hi);
    const __half *qw = sq + (16 * rg) * TM_MTC_S;
    /* block-uniform trip count: every thread reaches every barrier */
    for (int64_t it = 0; it < n_tiles; it++) {
        const int64_t base = k_lo + it * TM_MTC_TK;
        if (it + 1 < n_tiles) {
            tm_mtc_stage(kc, row0, sk0 + ((it + 1) & 1) * TM_MTC_TK * TM_MTC_S, base + TM_MTC_TK,
                         k_hi);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads(); /* tile it (and, first, Q) in every thread's view */
        const __half *sk = sk0 + (it & 1) * TM_MTC_TK * TM_MTC_S;

        /* the warp's 16 keys: n-tiles 2qd and 2qd + 1 of the tile */
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
        for (int kk = 0; kk < TM_MTC_D / 16; kk += 2) {
            uint32_t a0[4], a1[4];
            tm_mma_ldsm4(a0, qw + (lane % 16) * TM_MTC_S + 16 * kk + 8 * (lane / 16));
            tm_mma_ldsm4(a1, qw + (lane % 16) * TM_MTC_S + 16 * (kk + 1) + 8 * (lane / 16));
#pragma unroll
            for (int j = 0; j < 2; j++) {
                uint32_t b[4];
                tm_mma_ldsm4(b, sk + (16 * qd + 8 * j + lane % 8) * TM_MTC_S + 16 * kk +
                                    8 * (lane / 8));
                tm_mma_16816(s[j], a0, b[0], b[1]);
                tm_mma_16816(s[j], a1, b[2], b[3]);
            }
        }
        /* base-2 scores to the shared tile, -inf past the range */
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = 16 * qd + 8 * j + 2 * tq + (e & 1);
                ss[(16 * rg + gq + 8 * (e / 2)) * TM_MTC_TK + key] =
                    base + key < k_hi ? s[j][e] * c : -INFINITY;
            }
        __syncthreads(); /* the group's scores complete */

        /* the row group's 16 x 64 scores in the accumulator layout: n-tile j, element e:
         * row gq + 8 (e / 2), key 8j + 2tq + e % 2 */
        float sf[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sf[j][e] = ss[(16 * rg + gq + 8 * (e / 2)) * TM_MTC_TK + 8 * j + 2 * tq + (e & 1)];
        uint32_t pf[4][4];
        tm_mma_softmax_step(sf, m_a, m_b, l_a, l_b, pf, o);
        /* O += P·V over dims 128qd ..: ldmatrix.trans of keys 16kk + l % 8 + 8 (l / 8 % 2),
         * dims 8n + 8 (l / 16): n-tiles n and n + 1 */
        const __half *sv = sk + 128 * qd;
#pragma unroll
        for (int kk = 0; kk < TM_MTC_TK / 16; kk++) {
#pragma unroll
            for (int n = 0; n < 16; n += 2) {
                uint32_t b[4];
                tm_mma_ldsm4_t(b, sv + (16 * kk + lane % 8 + 8 * (lane / 8 % 2)) * TM_MTC_S +
                                      8 * n + 8 * (lane / 16));
                tm_mma_16816(o[n], pf[kk], b[0], b[1]);
                tm_mma_16816(o[n + 1], pf[kk], b[2], b[3]);
            }
        }
        __syncthreads(); /* the stage and the score tile are the next tile's */
    }

    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int64_t row = t * p.n_head + h0 + 16 * rg + gq + 8 * hh; /* t n_head + head */
        const float m = hh ? m_b : m_a, l = hh ? l_b : l_a;
        if (rec) { /* the split's record: m, l, then the unnormalised accumulators */
            float *r = rec + ((int64_t)blockIdx.y * n_tok * p.n_head + row) * TM_MTC_REC;
            if (qd == 0 && tq == 0) r[0] = m, r[1] = l;
            float *acc = r + 2 + 128 * qd + 2 * tq;
#pragma unroll
            for (int n = 0; n < 16; n++)
                *(float2 *)(acc + 8 * n) = make_float2(o[n][2 * hh], o[n][2 * hh + 1]);
        } else {
            const float inv = l > 0.f ? 1.0f / l : 0.f;
            float *dst = out + row * TM_MTC_L + 128 * qd + 2 * tq;
#pragma unroll
            for (int n = 0; n < 16; n++)
                *(float2 *)(dst + 8 * n) = make_float2(o[n][2 * hh] * inv, o[n][2 * hh + 1] * inv);
        }
    }
}

/* out[row] = Σ_s 2^(m_s - M) acc_s / Σ_s 2^(m_s - M) l_s over the splits that saw keys
 * (M their largest m); a block a row. */
__global__ void __launch_bounds__(256)
    tm_mtc_combine_kernel(const float *rec, int64_t rows, int n_split, float *out) {
    const int64_t row = blockIdx.x;
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, rec[((int64_t)s * rows + row) * TM_MTC_REC]);
    float l = 0.f, acc[TM_MTC_L / 256] = {0.f, 0.f};
    for (int s = 0; s < n_split; s++) {
        const float *r = rec + ((int64_t)s * rows + row) * TM_MTC_REC;
        if (r[0] == -INFINITY) continue; /* no key: its accumulators were never written */
        const float w = exp2f(r[0] - M);
        l += w * r[1];
#pragma unroll
        for (int i = 0; i < TM_MTC_L / 256; i++) acc[i] += w * r[2 + threadIdx.x + 256 * i];
    }
    const float inv = l > 0.f ? 1.0f / l : 0.f;
#pragma unroll
    for (int i = 0; i < TM_MTC_L / 256; i++)
        out[row * TM_MTC_L + threadIdx.x + 256 * i] = acc[i] * inv;
}

bool tm_mla_tc_ok(const tm_cuda_attn_params &p, const void *q, const void *k_cache,
                  const void *out) {
    return !p.precise && p.kv_type == TM_TYPE_F16 && p.head_dim == TM_MTC_D &&
           p.v_dim == TM_MTC_L && p.n_head % TM_MTC_ROWS == 0 && (uintptr_t)k_cache % 16 == 0 &&
           (uintptr_t)q % 8 == 0 && (uintptr_t)out % 8 == 0;
}

int64_t tm_mla_tc_splits(const tm_cuda_attn_params &p, int64_t n_tok) {
    if (n_tok < 1 || n_tok > TM_MLA_TC_SPLIT_TOK) return 1;
    const int64_t seq_rows = p.seq_rows ? p.seq_rows : p.n_ctx;
    const int64_t blocks = n_tok * (p.n_head / TM_MTC_ROWS), tiles = (seq_rows + 63) / 64;
    int64_t s = TM_MTC_BLOCKS / (blocks > 0 ? blocks : 1);
    s = s < tiles ? s : tiles;
    return s < 1 ? 1 : s;
}

int64_t tm_mla_tc_scratch_floats(const tm_cuda_attn_params &p, int64_t n_tok) {
    const int64_t s = tm_mla_tc_splits(p, n_tok);
    return s > 1 ? s * n_tok * p.n_head * TM_MTC_REC : 0;
}

tm_status tm_mla_tc_launch(const tm_cuda_attn_params &p, const float *q, const void *k_cache,
                           const int32_t *pos0, int64_t n_tok, float *out, float *scratch,
                           tm_cuda_stream stream) {
    const size_t smem = tm_mtc_smem();
    static bool smem_set; /* once: the attribute is the kernel's, on every device */
    if (!smem_set) {
        TM_CUDA_TRY(cudaFuncSetAttribute(tm_mtc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem));
        smem_set = true;
    }
    const int64_t blocks = n_tok * (p.n_head / TM_MTC_ROWS), s = tm_mla_tc_splits(p, n_tok);
    if (blocks > 0x7fffffffLL)
        return tm_error_set(TM_ERR_ARG, "cuda_mla_attention: %lld tokens x %d heads: too many",
                            (long long)n_tok, p.n_head);
    if (s > 1 && !scratch)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_mla_attention: %lld splits of the keys need "
                            "scratch (cuda_mla_scratch_floats), got NULL",
                            (long long)s);
    const dim3 grid((unsigned)blocks, (unsigned)s);
    tm_mtc_kernel<<<grid, TM_MTC_THREADS, smem, stream>>>(p, q, (const __half *)k_cache, pos0,
                                                          n_tok, out, s > 1 ? scratch : NULL);
    if (s > 1)
        tm_mtc_combine_kernel<<<(unsigned)(n_tok * p.n_head), 256, 0, stream>>>(
            scratch, n_tok * p.n_head, (int)s, out);
    return tm_cuda_launch_check("cuda_mla_attention", n_tok, p.n_head, p.head_dim);
}
