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
 * q·S[.][j]. Serial in the tokens: a prompt of n tokens takes n such steps
 * (a chunked tensor-core form is later work); qkv is only read. */
#include <math.h>

#include "cuda/cuda_args.h"
#include "cuda/cuda_common.cuh"

#define TM_SSM_CONV_THREADS 128
#define TM_DELTA_THREADS    TM_CUDA_DELTA_MAX_V
#define TM_GATED_WARPS      4 /* cuda_rmsnorm_gated: a group a warp */

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
    const int per_k = p.n_v_head / p.n_k_head;
    const int kh = p.v_tiled ? h % p.n_k_head : h / per_k;
    const int64_t C = 2 * (int64_t)p.n_k_head * KD + (int64_t)p.n_v_head * dv;
    const int64_t nba = p.ba_grouped ? 2 * (int64_t)p.n_v_head : p.n_v_head;
    /* grouped: key head h / r holds its r value heads' b, then their a */
    const int64_t ib = p.ba_grouped ? (int64_t)(h / per_k) * 2 * per_k + h % per_k : h;
    const int64_t ia = p.ba_grouped ? ib + per_k : h;
    const float *av = p.ba_grouped ? b : a;
    const bool col = j < dv;
    float *S = state + ((int64_t)seq * p.n_v_head + h) * KD * dv + j;
    float s[KD];
#pragma unroll
    for (int i = 0; i < KD; i++) s[i] = col && p0 != 0 ? S[(int64_t)i * dv] : 0.0f;
    const float A = p.A[h], dt = p.dt_bias[h], qscale = 1.0f / sqrtf((float)KD);

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
        const float beta = tm_sigmoid(b[t * nba + ib]), x = av[t * nba + ia] + dt;
        const float decay = expf(A * (x > 20.0f ? x : log1pf(expf(x))));
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

/* ---- element-wise: grid-stride loops of at most 65536 blocks ---- */

static unsigned tm_ew_blocks(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b > 65536 ? 65536 : b);
}

#define TM_EW_LOOP(i, n)                                                                           \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

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
