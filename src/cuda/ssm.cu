/* Linear attention (Gated DeltaNet) on the GPU and the element-wise gates
 * around it (cuda.h, ssm.cu's section): the causal conv with its state, the
 * gated delta rule as a serial scan, the gated RMSNorm, the split of
 * interleaved projections, SwiGLU and the sigmoid gates. Same math as
 * src/cpu/cpu_ssm.c and the executor's exec_ssm.c, in f32.
 *
 * Runs: the recurrent kernels take a launch's rows from device memory
 * (row_pos / row_seq), so the grid is sized by n_tok alone and a captured
 * graph replays for any positions and sequences. A block (or thread) is
 * given a row; only the row that starts a run (the first, or one that is not
 * the next position of the previous row's sequence) works: it walks the run
 * to its end, carrying the state in registers, and writes it back once.
 *
 * cuda_delta_rule: one block per (row, value head), a thread per column j of
 * S (S[.][j] in KD registers, KD = k_dim a template argument), v_dim threads
 * rounded up to a warp. Per token the block stages q and k of its key head in
 * shared memory, reduces their sums of squares, normalises them there, then
 * each thread decays its column, takes k·S[.][j], applies the delta update and
 * q·S[.][j]. Serial in the tokens: n tokens take n such steps; qkv is only
 * read. Decode steps (up to TM_CUDA_DELTA_SERIAL_TOK rows) take it.
 *
 * Launches of more rows (prompts) take the chunked form (the same algebra as
 * the CPU's delta_chunk, src/cpu/cpu_ssm.c): a block per (run, value head,
 * 32 of its value columns: S's columns evolve apart, so a head's columns
 * split over blocks for parallelism), the run in chunks of TM_DCH_C tokens,
 * everything in shared memory (S's [k_dim][32] slice, the chunk's normalised
 * q and k, W, U, A and the causal q·k weights): per chunk, with γ the
 * cumulative log decay,
 *   A[i][j] = β_i (k_i·k_j) e^{γ_i-γ_j} (j < i), QK[i][j] = (q_i·k_j) e^{γ_i-γ_j} (j <= i);
 *   U = (I + A)^-1 (β v), W = (I + A)^-1 (β e^γ k): forward substitution, a thread
 *     a column (no barrier inside: a column's rows depend on that column only);
 *   V' = U - W S;  o_i = e^{γ_i} q_i S + Σ_{j<=i} QK[i][j] V'_j;
 *   S = e^{γ_L} S + Σ_m e^{γ_L-γ_m} k_m ⊗ V'_m.
 * Six barriers a chunk where the scan takes three a token. `TIERMOE_DELTA_CHUNKED=0`
 * keeps the scan for every launch (for comparison). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_args.h"
#include "cuda/cuda_common.cuh"

#define TM_SSM_CONV_THREADS 128
#define TM_DELTA_THREADS    TM_CUDA_DELTA_MAX_V
#define TM_GATED_WARPS      4  /* cuda_rmsnorm_gated: a group a warp */
#define TM_DCH_C            32 /* tokens a chunk */
#define TM_DCH_VB           32 /* value columns a block */
#define TM_DCH_THREADS      256

static __device__ __forceinline__ float tm_silu(float x) {
    return x / (1.0f + expf(-x));
}

static __device__ __forceinline__ float tm_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* Whether row t starts a run, and whether row t + 1 continues row t's. */
static __device__ __forceinline__ bool tm_ssm_run_start(const tm_cuda_ssm_rows &r, int64_t t) {
    return t == 0 || r.row_seq[t] != r.row_seq[t - 1] || r.row_pos[t] != r.row_pos[t - 1] + 1;
}

static __device__ __forceinline__ bool tm_ssm_run_next(const tm_cuda_ssm_rows &r, int64_t t) {
    return t + 1 < r.n_tok && r.row_seq[t + 1] == r.row_seq[t] &&
           r.row_pos[t + 1] == r.row_pos[t] + 1;
}

/* ---- the conv: a thread per (run, channel) ---- */

/* KT: the width as a template argument (its history in registers), 0: K at run time
 * (up to TM_CUDA_SSM_MAX_CONV, the arrays then in local memory). */
template <int KT>
__global__ void __launch_bounds__(TM_SSM_CONV_THREADS)
    tm_ssm_conv_kernel(tm_cuda_ssm_rows r, float *x, int64_t C, int K_rt,
                       const float *__restrict__ w, float *state) {
    constexpr int H = KT ? KT - 1 : TM_CUDA_SSM_MAX_CONV - 1;
    const int K = KT ? KT : K_rt;
    const int64_t t0 = blockIdx.x, c = (int64_t)blockIdx.y * TM_SSM_CONV_THREADS + threadIdx.x;
    if (c >= C || !tm_ssm_run_start(r, t0)) return;
    const int32_t seq = r.row_seq[t0], p0 = r.row_pos[t0];
    if (p0 < 0 || seq < 0 || seq >= r.n_seq) return;
    float *st = state + (int64_t)seq * (K - 1) * C + c;
    float hist[H], wc[H + 1]; /* the last K-1 inputs, oldest first; the channel's taps */
#pragma unroll
    for (int i = 0; i < H; i++)
        if (i < K - 1) hist[i] = p0 == 0 ? 0.0f : st[(int64_t)i * C]; /* a new sequence: zeros */
#pragma unroll
    for (int i = 0; i <= H; i++)
        if (i < K) wc[i] = w[c * K + i];
    for (int64_t t = t0;; t++) {
        const float in = x[t * C + c];
        float acc = wc[K - 1] * in;
#pragma unroll
        for (int i = 0; i < H; i++)
            if (i < K - 1) acc += wc[i] * hist[i];
#pragma unroll
        for (int i = 0; i < H; i++) /* constant indices: the history stays in registers */
            if (i < K - 1) hist[i] = i + 1 < K - 1 ? hist[i + 1 < H ? i + 1 : i] : in;
        x[t * C + c] = tm_silu(acc);
        if (!tm_ssm_run_next(r, t)) break;
    }
#pragma unroll
    for (int i = 0; i < H; i++)
        if (i < K - 1) st[(int64_t)i * C] = hist[i];
}

extern "C" tm_status cuda_ssm_conv(const tm_cuda_ssm_rows *rows, float *x, int64_t C, int32_t K,
                                   const float *w, float *state, tm_cuda_stream stream) {
    tm_status st = cuda_ssm_conv_args_check(rows, x, C, K, w, state);
    if (st != TM_OK || rows->n_tok == 0) return st;
    const dim3 grid((unsigned)rows->n_tok,
                    (unsigned)((C + TM_SSM_CONV_THREADS - 1) / TM_SSM_CONV_THREADS));
    if (K == 4) /* Qwen3-Next's */
        tm_ssm_conv_kernel<4><<<grid, TM_SSM_CONV_THREADS, 0, stream>>>(*rows, x, C, K, w, state);
    else
        tm_ssm_conv_kernel<0><<<grid, TM_SSM_CONV_THREADS, 0, stream>>>(*rows, x, C, K, w, state);
    return tm_cuda_launch_check("cuda_ssm_conv", rows->n_tok, C, K);
}

/* ---- the delta rule: a block per (run, value head), a thread per column of S ---- */

/* Where value head h's inputs are (both delta-rule kernels): its key head, the width of
 * a qkv row, and its b and a in their arrays (grouped: key head h / r holds its r value
 * heads' b, then their a). */
struct tm_delta_head {
    int kh;
    int64_t row, nba, ib, ia;
    const float *av;
    float A, dt;
};

static __device__ __forceinline__ tm_delta_head tm_delta_head_of(const tm_cuda_delta_params &p,
                                                                 int h, int kd, const float *b,
                                                                 const float *a) {
    const int per_k = p.n_v_head / p.n_k_head;
    tm_delta_head d;
    d.kh = p.v_tiled ? h % p.n_k_head : h / per_k;
    d.row = 2 * (int64_t)p.n_k_head * kd + (int64_t)p.n_v_head * p.v_dim;
    d.nba = p.ba_grouped ? 2 * (int64_t)p.n_v_head : p.n_v_head;
    d.ib = p.ba_grouped ? (int64_t)(h / per_k) * 2 * per_k + h % per_k : h;
    d.ia = p.ba_grouped ? d.ib + per_k : h;
    d.av = p.ba_grouped ? b : a;
    d.A = p.A[h], d.dt = p.dt_bias[h];
    return d;
}

/* Token t's log decay g = A softplus(a + dt_bias) (the decay is e^g). */
static __device__ __forceinline__ float tm_delta_log_decay(const tm_delta_head &d, int64_t t) {
    const float x = d.av[t * d.nba + d.ia] + d.dt;
    return d.A * (x > 20.0f ? x : log1pf(expf(x)));
}

template <int KD>
__global__ void __launch_bounds__(TM_DELTA_THREADS)
    tm_delta_kernel(tm_cuda_delta_params p, tm_cuda_ssm_rows r, const float *__restrict__ qkv,
                    const float *__restrict__ b, const float *__restrict__ a, float *state,
                    float *out) {
    __shared__ float sq[KD], sk[KD], red[2][TM_DELTA_THREADS / TM_CUDA_WARP];
    const int64_t t0 = blockIdx.x;
    const int h = blockIdx.y, j = threadIdx.x, nthr = blockDim.x, dv = p.v_dim;
    if (!tm_ssm_run_start(r, t0)) return; /* the whole block */
    const int32_t seq = r.row_seq[t0], p0 = r.row_pos[t0];
    if (p0 < 0 || seq < 0 || seq >= r.n_seq) return;
    const tm_delta_head hd = tm_delta_head_of(p, h, KD, b, a);
    const int kh = hd.kh;
    const int64_t C = hd.row;
    const bool col = j < dv;
    float *S = state + ((int64_t)seq * p.n_v_head + h) * KD * dv + j;
    float s[KD];
#pragma unroll
    for (int i = 0; i < KD; i++) s[i] = col && p0 != 0 ? S[(int64_t)i * dv] : 0.0f;
    const float qscale = 1.0f / sqrtf((float)KD);

    for (int64_t t = t0;; t++) {
        const float *q = qkv + t * C + (int64_t)kh * KD, *k = q + (int64_t)p.n_k_head * KD;
        float qq = 0.0f, kk = 0.0f;
        __syncthreads(); /* the previous token's reads of sq, sk and red are done */
        for (int i = j; i < KD; i += nthr) {
            const float qi = q[i], ki = k[i];
            sq[i] = qi, sk[i] = ki;
            qq += qi * qi, kk += ki * ki;
        }
        qq = tm_warp_sum(qq), kk = tm_warp_sum(kk);
        if (j % TM_CUDA_WARP == 0) red[0][j / TM_CUDA_WARP] = qq, red[1][j / TM_CUDA_WARP] = kk;
        __syncthreads();
        qq = kk = 0.0f;
        for (int wi = 0; wi < nthr / TM_CUDA_WARP; wi++) qq += red[0][wi], kk += red[1][wi];
        const float rq = 1.0f / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
        for (int i = j; i < KD; i += nthr) sq[i] = sq[i] * rq * qscale, sk[i] *= rk;
        /* the gates: every thread the same, from the same values */
        const float beta = tm_sigmoid(b[t * hd.nba + hd.ib]);
        const float decay = expf(tm_delta_log_decay(hd, t));
        __syncthreads(); /* sq, sk normalised */
        if (col) {
            float kv = 0.0f;
#pragma unroll
            for (int i = 0; i < KD; i++) s[i] *= decay, kv += sk[i] * s[i];
            const float v = qkv[t * C + 2 * (int64_t)p.n_k_head * KD + (int64_t)h * dv + j];
            const float delta = beta * (v - kv);
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < KD; i++) s[i] += sk[i] * delta, o += sq[i] * s[i];
            out[(t * p.n_v_head + h) * dv + j] = o;
        }
        if (!tm_ssm_run_next(r, t)) break; /* block-uniform */
    }
    if (col)
#pragma unroll
        for (int i = 0; i < KD; i++) S[(int64_t)i * dv] = s[i];
}

/* ---- the chunked delta rule (prompts): a block per (run, value head, 32 columns) ---- */

static size_t tm_dch_smem_floats(int kd) {
    const int kp = kd + 1; /* rows of q, k, W padded: a warp's column reads hit distinct banks */
    return (size_t)kd * TM_DCH_VB + 3 * (size_t)TM_DCH_C * kp + (size_t)TM_DCH_C * TM_DCH_VB +
           2 * (size_t)TM_DCH_C * TM_DCH_C + 3 * TM_DCH_C;
}

template <int KD>
__global__ void __launch_bounds__(TM_DCH_THREADS)
    tm_delta_chunk_kernel(tm_cuda_delta_params p, tm_cuda_ssm_rows r, const float *__restrict__ qkv,
                          const float *__restrict__ b, const float *__restrict__ a, float *state,
                          float *out) {
    constexpr int C = TM_DCH_C, VB = TM_DCH_VB, KP = KD + 1, NT = TM_DCH_THREADS;
    extern __shared__ float tm_dch_smem[];
    float *sS = tm_dch_smem;  /* [KD][VB] the state's columns c0 .. c0 + VB */
    float *sQ = sS + KD * VB; /* [C][KP] q normalised and scaled */
    float *sK = sQ + C * KP;  /* [C][KP] k normalised */
    float *sW = sK + C * KP;  /* [C][KP] W */
    float *sU = sW + C * KP;  /* [C][VB] U, then V' */
    float *sA = sU + C * VB;  /* [C][C] */
    float *sQK = sA + C * C;  /* [C][C] */
    float *sg = sQK + C * C;  /* [C] γ */
    float *sb = sg + C;       /* [C] β */
    float *se = sb + C;       /* [C] e^{γ_L-γ_m} */
    __shared__ int64_t run_end;
    const int64_t t0 = blockIdx.x;
    const int nb = (p.v_dim + VB - 1) / VB, tid = threadIdx.x;
    const int h = blockIdx.y / nb, c0 = blockIdx.y % nb * VB, dv = p.v_dim;
    const int warp = tid / TM_CUDA_WARP, lane = tid % TM_CUDA_WARP;
    if (!tm_ssm_run_start(r, t0)) return; /* the whole block */
    const int32_t seq = r.row_seq[t0], p0 = r.row_pos[t0];
    if (p0 < 0 || seq < 0 || seq >= r.n_seq) return;
    const tm_delta_head hd = tm_delta_head_of(p, h, KD, b, a);
    const int kh = hd.kh;
    const int64_t Cw = hd.row;
    const float qscale = 1.0f / sqrtf((float)KD);
    float *Sg = state + ((int64_t)seq * p.n_v_head + h) * KD * dv + c0;
    for (int idx = tid; idx < KD * VB; idx += NT) {
        const int i = idx / VB, c = idx % VB;
        sS[idx] = c0 + c < dv && p0 != 0 ? Sg[(int64_t)i * dv + c] : 0.0f;
    }
    if (tid == 0) {
        int64_t t = t0;
        while (tm_ssm_run_next(r, t)) t++;
        run_end = t + 1;
    }
    __syncthreads();
    const int64_t t_end = run_end;
    for (int64_t tc = t0; tc < t_end; tc += C) {
        const int L = t_end - tc < C ? (int)(t_end - tc) : C;
        /* q and k of the chunk normalised (a warp a token), the gates */
        for (int i = warp; i < L; i += NT / TM_CUDA_WARP) {
            const float *q = qkv + (tc + i) * Cw + (int64_t)kh * KD,
                        *k = q + (int64_t)p.n_k_head * KD;
            float qq = 0.0f, kk = 0.0f;
            for (int d = lane; d < KD; d += TM_CUDA_WARP) {
                const float qv = q[d], kv = k[d];
                sQ[i * KP + d] = qv, sK[i * KP + d] = kv;
                qq += qv * qv, kk += kv * kv;
            }
            qq = tm_warp_sum(qq), kk = tm_warp_sum(kk);
            const float rq = 1.0f / sqrtf(qq + 1e-6f) * qscale, rk = 1.0f / sqrtf(kk + 1e-6f);
            for (int d = lane; d < KD; d += TM_CUDA_WARP)
                sQ[i * KP + d] *= rq, sK[i * KP + d] *= rk;
            if (lane == 0) {
                sb[i] = tm_sigmoid(b[(tc + i) * hd.nba + hd.ib]);
                sg[i] = tm_delta_log_decay(hd, tc + i);
            }
        }
        __syncthreads();
        if (tid == 0)
            for (int i = 1; i < L; i++) sg[i] += sg[i - 1];
        __syncthreads();
        /* A and the causal weights (a warp a row i, a lane a column j) */
        for (int idx = tid; idx < C * C; idx += NT) {
            const int i = idx / C, j = idx % C;
            float av_ = 0.0f, qk = 0.0f;
            if (i < L && j <= i) {
                float kk = 0.0f, qkd = 0.0f;
                for (int d = 0; d < KD; d++) {
                    const float kj = sK[j * KP + d];
                    kk += sK[i * KP + d] * kj, qkd += sQ[i * KP + d] * kj;
                }
                const float e = expf(sg[i] - sg[j]);
                av_ = j < i ? sb[i] * kk * e : 0.0f;
                qk = qkd * e;
            }
            sA[idx] = av_, sQK[idx] = qk;
        }
        __syncthreads();
        /* forward substitution: U's columns, then W's, a thread a column */
        for (int col = tid; col < VB + KD; col += NT) {
            if (col < VB) {
                const bool valid = c0 + col < dv;
                const float *v = qkv + 2 * (int64_t)p.n_k_head * KD + (int64_t)h * dv + c0 + col;
                for (int i = 0; i < L; i++) {
                    float x = valid ? sb[i] * v[(tc + i) * Cw] : 0.0f;
                    for (int j = 0; j < i; j++) x -= sA[i * C + j] * sU[j * VB + col];
                    sU[i * VB + col] = x;
                }
            } else {
                const int d = col - VB;
                for (int i = 0; i < L; i++) {
                    float x = sb[i] * expf(sg[i]) * sK[i * KP + d];
                    for (int j = 0; j < i; j++) x -= sA[i * C + j] * sW[j * KP + d];
                    sW[i * KP + d] = x;
                }
            }
        }
        __syncthreads();
        /* V' = U - W S */
        for (int idx = tid; idx < L * VB; idx += NT) {
            const int i = idx / VB, c = idx % VB;
            float x = sU[idx];
            for (int d = 0; d < KD; d++) x -= sW[i * KP + d] * sS[d * VB + c];
            sU[idx] = x;
        }
        __syncthreads();
        /* o_i = e^{γ_i} q_i S + Σ_{j<=i} QK[i][j] V'_j */
        for (int idx = tid; idx < L * VB; idx += NT) {
            const int i = idx / VB, c = idx % VB;
            if (c0 + c >= dv) continue;
            float x = 0.0f;
            for (int d = 0; d < KD; d++) x += sQ[i * KP + d] * sS[d * VB + c];
            x *= expf(sg[i]);
            for (int j = 0; j <= i; j++) x += sQK[i * C + j] * sU[j * VB + c];
            out[((tc + i) * p.n_v_head + h) * dv + c0 + c] = x;
        }
        if (tid < L) se[tid] = expf(sg[L - 1] - sg[tid]);
        __syncthreads();
        /* S = e^{γ_L} S + Σ_m e^{γ_L-γ_m} k_m ⊗ V'_m */
        const float el = expf(sg[L - 1]);
        for (int idx = tid; idx < KD * VB; idx += NT) {
            const int d = idx / VB, c = idx % VB;
            float x = el * sS[idx];
            for (int m = 0; m < L; m++) x += se[m] * sK[m * KP + d] * sU[m * VB + c];
            sS[idx] = x;
        }
        __syncthreads(); /* the chunk's arrays are the next chunk's */
    }
    for (int idx = tid; idx < KD * VB; idx += NT) {
        const int i = idx / VB, c = idx % VB;
        if (c0 + c < dv) Sg[(int64_t)i * dv + c] = sS[idx];
    }
}

template <int KD>
static tm_status tm_delta_chunk_launch(const tm_cuda_delta_params *p, const tm_cuda_ssm_rows *r,
                                       const float *qkv, const float *b, const float *a,
                                       float *state, float *out, cudaStream_t stream) {
    const size_t smem = tm_dch_smem_floats(KD) * sizeof(float);
    if (smem > 48 * 1024) {
        static bool set; /* once: the attribute is the kernel's */
        if (!set)
            TM_CUDA_TRY(cudaFuncSetAttribute(
                tm_delta_chunk_kernel<KD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        set = true;
    }
    const int nb = (p->v_dim + TM_DCH_VB - 1) / TM_DCH_VB;
    const dim3 grid((unsigned)r->n_tok, (unsigned)(p->n_v_head * nb));
    tm_delta_chunk_kernel<KD>
        <<<grid, TM_DCH_THREADS, smem, stream>>>(*p, *r, qkv, b, a, state, out);
    return TM_OK;
}

template <int KD>
static void tm_delta_launch(const tm_cuda_delta_params *p, const tm_cuda_ssm_rows *r,
                            const float *qkv, const float *b, const float *a, float *state,
                            float *out, cudaStream_t stream) {
    const int threads = (p->v_dim + TM_CUDA_WARP - 1) / TM_CUDA_WARP * TM_CUDA_WARP;
    const dim3 grid((unsigned)r->n_tok, (unsigned)p->n_v_head);
    tm_delta_kernel<KD><<<grid, threads, 0, stream>>>(*p, *r, qkv, b, a, state, out);
}

extern "C" tm_status cuda_delta_rule(const tm_cuda_delta_params *p, const tm_cuda_ssm_rows *rows,
                                     const float *qkv, const float *b, const float *a, float *state,
                                     float *out, tm_cuda_stream stream) {
    tm_status st = cuda_delta_rule_args_check(p, rows, qkv, b, a, state, out);
    if (st != TM_OK || rows->n_tok == 0) return st;
    static int chunked = -1; /* TIERMOE_DELTA_CHUNKED=0: the scan for prompts too */
    if (chunked < 0) {
        const char *env = getenv("TIERMOE_DELTA_CHUNKED");
        chunked = !(env && strcmp(env, "0") == 0);
    }
    if (chunked && rows->n_tok > TM_CUDA_DELTA_SERIAL_TOK) {
        switch (p->k_dim) {
        case 16:
            st = tm_delta_chunk_launch<16>(p, rows, qkv, b, a, state, out, stream);
            break;
        case 32:
            st = tm_delta_chunk_launch<32>(p, rows, qkv, b, a, state, out, stream);
            break;
        case 64:
            st = tm_delta_chunk_launch<64>(p, rows, qkv, b, a, state, out, stream);
            break;
        case 128:
            st = tm_delta_chunk_launch<128>(p, rows, qkv, b, a, state, out, stream);
            break;
        default:
            st = tm_delta_chunk_launch<256>(p, rows, qkv, b, a, state, out, stream);
            break;
        }
        return st ? st
                  : tm_cuda_launch_check("cuda_delta_rule", rows->n_tok, p->n_v_head, p->k_dim);
    }
    switch (p->k_dim) {
    case 16:
        tm_delta_launch<16>(p, rows, qkv, b, a, state, out, stream);
        break;
    case 32:
        tm_delta_launch<32>(p, rows, qkv, b, a, state, out, stream);
        break;
    case 64:
        tm_delta_launch<64>(p, rows, qkv, b, a, state, out, stream);
        break;
    case 128:
        tm_delta_launch<128>(p, rows, qkv, b, a, state, out, stream);
        break;
    default:
        tm_delta_launch<256>(p, rows, qkv, b, a, state, out, stream);
        break;
    }
    return tm_cuda_launch_check("cuda_delta_rule", rows->n_tok, p->n_v_head, p->k_dim);
}

/* ---- the gated RMSNorm: a warp per group ---- */

__global__ void __launch_bounds__(TM_GATED_WARPS *TM_CUDA_WARP)
    tm_rmsnorm_gated_kernel(float *x, const float *__restrict__ z, const float *__restrict__ w,
                            int64_t n_groups, int64_t n, float eps) {
    const int64_t g = (int64_t)blockIdx.x * TM_GATED_WARPS + threadIdx.x / TM_CUDA_WARP;
    if (g >= n_groups) return; /* the whole warp */
    const int lane = threadIdx.x % TM_CUDA_WARP;
    float *xg = x + g * n;
    const float *zg = z + g * n;
    float ss = 0.0f;
    for (int64_t i = lane; i < n; i += TM_CUDA_WARP) ss += xg[i] * xg[i];
    const float scale = 1.0f / sqrtf(tm_warp_sum(ss) / (float)n + eps);
    for (int64_t i = lane; i < n; i += TM_CUDA_WARP) xg[i] = xg[i] * scale * w[i] * tm_silu(zg[i]);
}

extern "C" tm_status cuda_rmsnorm_gated(float *x, const float *z, const float *w, int64_t n_rows,
                                        int64_t n_per_row, int64_t n, float eps,
                                        tm_cuda_stream stream) {
    tm_status st = cuda_rmsnorm_gated_args_check(x, z, w, n_rows, n_per_row, n);
    if (st != TM_OK || n_rows == 0) return st;
    const int64_t groups = n_rows * (n_per_row / n);
    const int64_t blocks = (groups + TM_GATED_WARPS - 1) / TM_GATED_WARPS;
    tm_rmsnorm_gated_kernel<<<(unsigned)blocks, TM_GATED_WARPS * TM_CUDA_WARP, 0, stream>>>(
        x, z, w, groups, n, eps);
    return tm_cuda_launch_check("cuda_rmsnorm_gated", n_rows, n_per_row, n);
}

/* ---- element-wise: grid-stride loops of at most 65536 blocks (cuda_common.cuh) ---- */

__global__ void tm_unzip_kernel(const float *src, float *a, float *b, int64_t n_tok,
                                int64_t n_group, int64_t na, int64_t nb) {
    const int64_t gw = na + nb, row = n_group * gw;
    TM_EW_LOOP(e, n_tok * row) {
        const int64_t t = e / row, g = e % row / gw, o = e % gw;
        if (o < na)
            a[(t * n_group + g) * na + o] = src[e];
        else
            b[(t * n_group + g) * nb + o - na] = src[e];
    }
}

extern "C" tm_status cuda_unzip(const float *src, float *a, float *b, int64_t n_tok,
                                int64_t n_group, int64_t na, int64_t nb, tm_cuda_stream stream) {
    tm_status st = cuda_unzip_args_check(src, a, b, n_tok, n_group, na, nb);
    if (st != TM_OK || n_tok == 0) return st;
    tm_unzip_kernel<<<tm_ew_blocks(n_tok * n_group * (na + nb)), 256, 0, stream>>>(src, a, b, n_tok,
                                                                                   n_group, na, nb);
    return tm_cuda_launch_check("cuda_unzip", n_tok, n_group, na + nb);
}

__global__ void tm_swiglu_kernel(float *y, const float *g, const float *u, int64_t n) {
    TM_EW_LOOP(i, n) y[i] = tm_silu(g[i]) * u[i];
}

extern "C" tm_status cuda_swiglu(float *y, const float *g, const float *u, int64_t n,
                                 tm_cuda_stream stream) {
    tm_status st = cuda_gate_args_check("cuda_swiglu", n);
    if (st != TM_OK || n == 0) return st;
    tm_swiglu_kernel<<<tm_ew_blocks(n), 256, 0, stream>>>(y, g, u, n);
    return tm_cuda_launch_check("cuda_swiglu", n, 1, 1);
}

__global__ void tm_gate_mul_kernel(float *y, const float *g, int64_t n) {
    TM_EW_LOOP(i, n) y[i] *= tm_sigmoid(g[i]);
}

extern "C" tm_status cuda_gate_mul(float *y, const float *g, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_gate_args_check("cuda_gate_mul", n);
    if (st != TM_OK || n == 0) return st;
    tm_gate_mul_kernel<<<tm_ew_blocks(n), 256, 0, stream>>>(y, g, n);
    return tm_cuda_launch_check("cuda_gate_mul", n, 1, 1);
}

__global__ void tm_gate_add_kernel(float *x, float *y, const float *s, int64_t n_rows, int64_t n) {
    TM_EW_LOOP(i, n_rows * n) {
        const float v = y[i] * tm_sigmoid(s[i / n]);
        y[i] = v;
        x[i] += v;
    }
}

extern "C" tm_status cuda_gate_add(float *x, float *y, const float *s, int64_t n_rows, int64_t n,
                                   tm_cuda_stream stream) {
    tm_status st = cuda_gate_add_args_check(n_rows, n);
    if (st != TM_OK || n_rows == 0) return st;
    tm_gate_add_kernel<<<tm_ew_blocks(n_rows * n), 256, 0, stream>>>(x, y, s, n_rows, n);
    return tm_cuda_launch_check("cuda_gate_add", n_rows, n, 1);
}
