/* Linear attention on the CPU (cpu_ssm.h): the convolution, the delta rule
 * token by token and in chunks, the gated RMSNorm. Plain C written so that
 * the compiler vectorises the inner loops over v_dim and k_dim; the delta
 * rule's bodies are inlined into one function per CPU level (scalar, AVX2 +
 * FMA, AVX-512 with 512-bit vectors), chosen at run time like the other
 * kernels. */
#include "cpu/cpu_ssm.h"

#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#define TM_X86 1
#endif

#define SSM_INLINE static inline __attribute__((always_inline))

static inline float ssm_silu(float x) {
    return x / (1.0f + expf(-x));
}

/* ---- convolution ---- */

typedef struct ssm_conv_job {
    float *x, *state;
    const float *w;
    int64_t n_tok, C, K;
} ssm_conv_job;

static void ssm_conv_task(void *ud, int64_t begin, int64_t end, int ith) {
    const ssm_conv_job *j = ud;
    const int64_t K = j->K, C = j->C;
    float hist[16]; /* the last K-1 inputs of a channel, oldest first (K <= 16: hparams) */
    for (int64_t c = begin; c < end; c++) {
        const float *w = j->w + c * K;
        for (int64_t i = 0; i < K - 1; i++) hist[i] = j->state[i * C + c];
        for (int64_t t = 0; t < j->n_tok; t++) {
            const float in = j->x[t * C + c];
            float acc = w[K - 1] * in;
            for (int64_t i = 0; i < K - 1; i++) acc += w[i] * hist[i];
            for (int64_t i = 0; i + 1 < K - 1; i++) hist[i] = hist[i + 1];
            if (K > 1) hist[K - 2] = in;
            j->x[t * C + c] = ssm_silu(acc);
        }
        for (int64_t i = 0; i < K - 1; i++) j->state[i * C + c] = hist[i];
    }
    (void)ith;
}

void cpu_ssm_conv(tm_pool *pool, float *x, int64_t n_tok, int64_t C, int64_t K, const float *w,
                  float *state) {
    ssm_conv_job j = {x, state, w, n_tok, C, K};
    if (n_tok * C < 8192)
        ssm_conv_task(&j, 0, C, 0);
    else
        cpu_pool_for(pool, C, 64, ssm_conv_task, &j);
}

void cpu_l2norm(float *x, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / sqrt(ss + eps));
    for (int64_t i = 0; i < n; i++) x[i] *= r;
}

/* ---- the delta rule ---- */

/* Token by token for one value head: S [dk][dv]. */
SSM_INLINE void delta_serial(const tm_delta_shape *s, int64_t h, int64_t kh, const float *qk,
                             const float *v, const float *g, const float *beta, float *S,
                             float *out, float *kv) {
    const int64_t dk = s->k_dim, dv = s->v_dim;
    for (int64_t t = 0; t < s->n_tok; t++) {
        const float *q = qk + t * s->qk_stride + kh * dk;
        const float *k = q + s->k_off;
        const float *vt = v + t * s->v_stride + h * dv;
        const float decay = expf(g[t * s->n_v_head + h]), b = beta[t * s->n_v_head + h];
        /* S = exp(g) S; kv = Sᵀ k */
        for (int64_t j = 0; j < dv; j++) kv[j] = 0;
        for (int64_t i = 0; i < dk; i++) {
            float *Si = S + i * dv;
            const float ki = k[i];
            for (int64_t j = 0; j < dv; j++) Si[j] *= decay, kv[j] += ki * Si[j];
        }
        /* δ = β (v - Sᵀ k); S += k ⊗ δ; o = Sᵀ q */
        for (int64_t j = 0; j < dv; j++) kv[j] = b * (vt[j] - kv[j]);
        float *o = out + t * s->n_v_head * dv + h * dv;
        for (int64_t j = 0; j < dv; j++) o[j] = 0;
        for (int64_t i = 0; i < dk; i++) {
            float *Si = S + i * dv;
            const float ki = k[i], qi = q[i];
            for (int64_t j = 0; j < dv; j++) Si[j] += ki * kv[j], o[j] += qi * Si[j];
        }
    }
}

/* Y[i][:] += Σ_c X[i][c] B[c][:] for i < m (B: k rows of n, stride ldb), in
 * tiles of 4 rows x 2 vectors held in registers across the k sum: 8
 * independent accumulators (FMA latency x ports). One function per vector
 * width (GCC's vector extension: 4 floats for SSE, 8 for AVX2, 16 for
 * AVX-512), each inlined into its level's delta rule. */
#define SSM_GEMM(NAME, VW)                                                                         \
    typedef float NAME##_v __attribute__((vector_size(4 * (VW))));                                 \
    SSM_INLINE void NAME(int64_t m, int64_t n, int64_t k, const float *X, int64_t ldx,             \
                         const float *B, int64_t ldb, float *Y, int64_t ldy) {                     \
        int64_t i = 0;                                                                             \
        for (; i + 4 <= m; i += 4) {                                                               \
            int64_t j = 0;                                                                         \
            for (; j + 2 * (VW) <= n; j += 2 * (VW)) {                                             \
                NAME##_v a[4][2] = {{{0}}};                                                        \
                const float *x = X + i * ldx;                                                      \
                for (int64_t c = 0; c < k; c++) {                                                  \
                    NAME##_v b0, b1;                                                               \
                    memcpy(&b0, B + c * ldb + j, sizeof(b0));                                      \
                    memcpy(&b1, B + c * ldb + j + (VW), sizeof(b1));                               \
                    for (int r = 0; r < 4; r++) {                                                  \
                        const float xr = x[r * ldx + c];                                           \
                        a[r][0] += xr * b0, a[r][1] += xr * b1;                                    \
                    }                                                                              \
                }                                                                                  \
                for (int r = 0; r < 4; r++)                                                        \
                    for (int h = 0; h < 2; h++) {                                                  \
                        float *y = Y + (i + r) * ldy + j + h * (VW);                               \
                        NAME##_v t;                                                                \
                        memcpy(&t, y, sizeof(t));                                                  \
                        t += a[r][h];                                                              \
                        memcpy(y, &t, sizeof(t));                                                  \
                    }                                                                              \
            }                                                                                      \
            for (; j < n; j++)                                                                     \
                for (int r = 0; r < 4; r++) {                                                      \
                    float acc = 0;                                                                 \
                    for (int64_t c = 0; c < k; c++) acc += X[(i + r) * ldx + c] * B[c * ldb + j];  \
                    Y[(i + r) * ldy + j] += acc;                                                   \
                }                                                                                  \
        }                                                                                          \
        for (; i < m; i++)                                                                         \
            for (int64_t c = 0; c < k; c++) {                                                      \
                const float xv = X[i * ldx + c];                                                   \
                for (int64_t j = 0; j < n; j++) Y[i * ldy + j] += xv * B[c * ldb + j];             \
            }                                                                                      \
    }

SSM_GEMM(ssm_gemm4, 4)
SSM_GEMM(ssm_gemm8, 8)
SSM_GEMM(ssm_gemm16, 16)

/* The product at a level's width (lv a constant where the body is inlined). */
#define ssm_gemm_acc(...)                                                                          \
    (lv == 2 ? ssm_gemm16(__VA_ARGS__) : lv == 1 ? ssm_gemm8(__VA_ARGS__) : ssm_gemm4(__VA_ARGS__))

/* One chunk of L <= CPU_DELTA_CHUNK tokens for one value head, in matrix
 * products (the WY/UT form of the delta rule). With γ_t = Σ_{s<=t} g_s inside
 * the chunk, A[i][j] = β_i (k_i·k_j) e^{γ_i-γ_j} for j < i, T = (I + A)^-1:
 *   U = T (β v)                  the values the chunk writes
 *   W = T (β e^γ k)              how those read the state before the chunk
 *   V' = U - W S
 *   o_i = e^{γ_i} q_i S + Σ_{j<=i} (q_i·k_j) e^{γ_i-γ_j} V'_j
 *   S = e^{γ_L} S + Σ_j e^{γ_L-γ_j} k_j ⊗ V'_j
 * (the same algebra as HF transformers' torch_chunk_gated_delta_rule).
 * scratch: C (2 C + dk + dv) + C floats (C = CPU_DELTA_CHUNK). */
SSM_INLINE void delta_chunk(const tm_delta_shape *s, int64_t h, int64_t kh, int64_t t0, int64_t L,
                            const float *qk, const float *v, const float *g, const float *beta,
                            float *S, float *out, float *scratch, int lv) {
    const int64_t dk = s->k_dim, dv = s->v_dim, C = CPU_DELTA_CHUNK;
    float *A = scratch;      /* [C][C]: A */
    float *QK = A + C * C;   /* [C][C]: the causal q·k weights */
    float *U = QK + C * C;   /* [C][dv]: U, then V' */
    float *W = U + C * dv;   /* [C][dk]: the keys transposed ([dk][L]), then W, then ... */
    float *gam = W + C * dk; /* [C] */
#define Q_(i) (qk + (t0 + (i)) * s->qk_stride + kh * dk)
#define K_(i) (Q_(i) + s->k_off)
#define B_(i) beta[(t0 + (i)) * s->n_v_head + h]
    float acc = 0;
    for (int64_t i = 0; i < L; i++) acc += g[(t0 + i) * s->n_v_head + h], gam[i] = acc;

    /* k_i·k_j and q_i·k_j as products with the keys transposed; then A's and the
     * causal weights' decays: A[i][j] = β_i (k_i·k_j) e^{γ_i-γ_j} for j < i,
     * QK[i][j] = (q_i·k_j) e^{γ_i-γ_j} for j <= i, 0 above */
    for (int64_t m = 0; m < L; m++)
        for (int64_t c = 0; c < dk; c++) W[c * L + m] = K_(m)[c];
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < L; j++) A[i * C + j] = QK[i * C + j] = 0;
    ssm_gemm_acc(L, L, dk, K_(0), s->qk_stride, W, L, A, C);
    ssm_gemm_acc(L, L, dk, Q_(0), s->qk_stride, W, L, QK, C);
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < L; j++) {
            const float e = j <= i ? expf(gam[i] - gam[j]) : 0.0f;
            A[i * C + j] *= j < i ? B_(i) * e : 0.0f;
            QK[i * C + j] *= e;
        }
    /* the forward substitution: row i of T(·) = x_i - Σ_{j<i} A[i][j] row j */
    for (int64_t i = 0; i < L; i++) {
        float *u = U + i * dv, *w = W + i * dk;
        const float *vi = v + (t0 + i) * s->v_stride + h * dv, *ki = K_(i);
        const float bi = B_(i), eg = expf(gam[i]);
        for (int64_t c = 0; c < dv; c++) u[c] = bi * vi[c];
        for (int64_t c = 0; c < dk; c++) w[c] = bi * eg * ki[c];
        for (int64_t j = 0; j < i; j++) {
            const float a = A[i * C + j];
            const float *uj = U + j * dv, *wj = W + j * dk;
            for (int64_t c = 0; c < dv; c++) u[c] -= a * uj[c];
            for (int64_t c = 0; c < dk; c++) w[c] -= a * wj[c];
        }
    }
    /* V' = U - W S (in U: W negated, then a product) */
    for (int64_t c = 0; c < L * dk; c++) W[c] = -W[c];
    ssm_gemm_acc(L, dv, dk, W, dk, S, dv, U, dv);
    /* o_i = e^{γ_i} q_i S + Σ_j A[i][j] V'_j: the q rows times e^γ (in W), two products */
    const int64_t ldo = s->n_v_head * dv;
    float *o = out + t0 * ldo + h * dv;
    for (int64_t i = 0; i < L; i++) {
        const float eg = expf(gam[i]);
        for (int64_t c = 0; c < dk; c++) W[i * dk + c] = eg * Q_(i)[c];
        for (int64_t j = 0; j < dv; j++) o[i * ldo + j] = 0;
    }
    ssm_gemm_acc(L, dv, dk, W, dk, S, dv, o, ldo);
    ssm_gemm_acc(L, dv, L, QK, C, U, dv, o, ldo);
    /* S = e^{γ_L} S + Σ_m e^{γ_L-γ_m} k_m ⊗ V'_m: the keys transposed and decayed (in
     * W as [dk][L]), a product */
    const float gl = gam[L - 1], el = expf(gl);
    for (int64_t c = 0; c < dk * dv; c++) S[c] *= el;
    for (int64_t m = 0; m < L; m++) {
        const float e = expf(gl - gam[m]);
        for (int64_t c = 0; c < dk; c++) W[c * L + m] = e * K_(m)[c];
    }
    ssm_gemm_acc(dk, dv, L, W, L, U, dv, S, dv);
#undef Q_
#undef K_
#undef B_
}

static int64_t delta_scratch_per_thread(const tm_delta_shape *s) {
    const int64_t C = CPU_DELTA_CHUNK;
    return C * (2 * C + s->v_dim + s->k_dim) + C;
}

int64_t cpu_delta_scratch_floats(const tm_delta_shape *s, int n_threads) {
    return delta_scratch_per_thread(s) * (n_threads > 0 ? n_threads : 1);
}

typedef struct delta_job {
    const tm_delta_shape *s;
    const float *qk, *v, *g, *beta;
    float *state, *out, *scratch;
    bool chunked;
} delta_job;

/* Value heads [begin, end) of a job: the body each level's function inlines. */
SSM_INLINE void delta_heads(const delta_job *j, int64_t begin, int64_t end, float *scratch,
                            int lv) {
    const tm_delta_shape *s = j->s;
    const int64_t per_k = s->n_v_head / s->n_k_head;
    for (int64_t h = begin; h < end; h++) {
        const int64_t kh = s->v_tiled ? h % s->n_k_head : h / per_k;
        float *S = j->state + h * s->k_dim * s->v_dim;
        if (!j->chunked) {
            delta_serial(s, h, kh, j->qk, j->v, j->g, j->beta, S, j->out, scratch);
            continue;
        }
        for (int64_t t0 = 0; t0 < s->n_tok; t0 += CPU_DELTA_CHUNK) {
            const int64_t L = s->n_tok - t0 < CPU_DELTA_CHUNK ? s->n_tok - t0 : CPU_DELTA_CHUNK;
            delta_chunk(s, h, kh, t0, L, j->qk, j->v, j->g, j->beta, S, j->out, scratch, lv);
        }
    }
}

static void delta_heads_scalar(const delta_job *j, int64_t begin, int64_t end, float *scratch) {
    delta_heads(j, begin, end, scratch, 0);
}

#ifdef TM_X86
TM_AVX2 static void delta_heads_avx2(const delta_job *j, int64_t begin, int64_t end,
                                     float *scratch) {
    delta_heads(j, begin, end, scratch, 1);
}

__attribute__((target("avx2,fma,avx512f,avx512vl,prefer-vector-width=512"))) static void
delta_heads_avx512(const delta_job *j, int64_t begin, int64_t end, float *scratch) {
    delta_heads(j, begin, end, scratch, 2);
}
#endif

typedef void (*delta_heads_fn)(const delta_job *j, int64_t begin, int64_t end, float *scratch);

/* The level's function (TIERMOE_CPU_LEVEL, or the machine's best). */
static delta_heads_fn delta_heads_for_level(void) {
#ifdef TM_X86
    const tm_cpu_features *f = cpu_features();
    const tm_cpu_level lv = cpu_level_get();
    if (lv >= TM_CPU_AVX512 && f->avx512f && f->avx512vl) return delta_heads_avx512;
    if (lv >= TM_CPU_AVX2 && f->avx2 && f->fma) return delta_heads_avx2;
#endif
    return delta_heads_scalar;
}

static void delta_task(void *ud, int64_t begin, int64_t end, int ith) {
    const delta_job *j = ud;
    delta_heads_for_level()(j, begin, end, j->scratch + ith * delta_scratch_per_thread(j->s));
}

void cpu_delta_rule(tm_pool *pool, const tm_delta_shape *s, const float *qk, const float *v,
                    const float *g, const float *beta, float *state, float *out, bool chunked,
                    float *scratch) {
    delta_job j = {s, qk, v, g, beta, state, out, scratch, chunked};
    if (s->n_tok == 1 && s->n_v_head * s->k_dim * s->v_dim < 65536)
        delta_task(&j, 0, s->n_v_head, 0);
    else
        cpu_pool_for(pool, s->n_v_head, 1, delta_task, &j);
}

/* ---- gated RMSNorm ---- */

void cpu_rmsnorm_gated(float *y, const float *x, const float *z, const float *w, int64_t n_groups,
                       int64_t n, float eps) {
    for (int64_t g = 0; g < n_groups; g++) {
        const float *xg = x + g * n, *zg = z + g * n;
        float *yg = y + g * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xg[i] * xg[i];
        const float r = (float)(1.0 / sqrt(ss / (double)n + eps));
        for (int64_t i = 0; i < n; i++) yg[i] = xg[i] * r * w[i] * ssm_silu(zg[i]);
    }
}
