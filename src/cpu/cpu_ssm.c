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

/* One chunk of L <= CPU_DELTA_CHUNK tokens for one value head, in matrix
 * products (the WY/UT form of the delta rule). With γ_t = Σ_{s<=t} g_s inside
 * the chunk, A[i][j] = β_i (k_i·k_j) e^{γ_i-γ_j} for j < i, T = (I + A)^-1:
 *   U = T (β v)                  the values the chunk writes
 *   W = T (β e^γ k)              how those read the state before the chunk
 *   V' = U - W S
 *   o_i = e^{γ_i} q_i S + Σ_{j<=i} (q_i·k_j) e^{γ_i-γ_j} V'_j
 *   S = e^{γ_L} S + Σ_j e^{γ_L-γ_j} k_j ⊗ V'_j
 * (the same algebra as HF transformers' torch_chunk_gated_delta_rule).
 * scratch: L (2 L + dk + 2 dv) + L + dv floats. */
SSM_INLINE void delta_chunk(const tm_delta_shape *s, int64_t h, int64_t kh, int64_t t0, int64_t L,
                            const float *qk, const float *v, const float *g, const float *beta,
                            float *S, float *out, float *scratch) {
    const int64_t dk = s->k_dim, dv = s->v_dim, C = CPU_DELTA_CHUNK;
    float *A = scratch;      /* [C][C]: A, then the causal q·k weights */
    float *U = A + C * C;    /* [C][dv]: U, then V' */
    float *W = U + C * dv;   /* [C][dk] */
    float *gam = W + C * dk; /* [C] */
    float *row = gam + C;    /* [dv] */
#define Q_(i) (qk + (t0 + (i)) * s->qk_stride + kh * dk)
#define K_(i) (Q_(i) + s->k_off)
#define B_(i) beta[(t0 + (i)) * s->n_v_head + h]
    float acc = 0;
    for (int64_t i = 0; i < L; i++) acc += g[(t0 + i) * s->n_v_head + h], gam[i] = acc;

    /* A and the forward substitution: row i of T(·) = x_i - Σ_{j<i} A[i][j] row j */
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < i; j++) {
            float d = 0;
            for (int64_t c = 0; c < dk; c++) d += K_(i)[c] * K_(j)[c];
            A[i * C + j] = B_(i) * d * expf(gam[i] - gam[j]);
        }
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
    /* V' = U - W S (in U) */
    for (int64_t i = 0; i < L; i++) {
        float *u = U + i * dv;
        const float *w = W + i * dk;
        for (int64_t c = 0; c < dk; c++) {
            const float wc = w[c];
            const float *Sc = S + c * dv;
            for (int64_t j = 0; j < dv; j++) u[j] -= wc * Sc[j];
        }
    }
    /* the causal weights (q_i·k_j) e^{γ_i-γ_j}, j <= i (in A) */
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j <= i; j++) {
            float d = 0;
            for (int64_t c = 0; c < dk; c++) d += Q_(i)[c] * K_(j)[c];
            A[i * C + j] = d * expf(gam[i] - gam[j]);
        }
    /* o_i = e^{γ_i} q_i S + Σ_j A[i][j] V'_j */
    for (int64_t i = 0; i < L; i++) {
        float *o = out + (t0 + i) * s->n_v_head * dv + h * dv;
        for (int64_t j = 0; j < dv; j++) row[j] = 0;
        const float *q = Q_(i);
        for (int64_t c = 0; c < dk; c++) {
            const float qc = q[c];
            const float *Sc = S + c * dv;
            for (int64_t j = 0; j < dv; j++) row[j] += qc * Sc[j];
        }
        const float eg = expf(gam[i]);
        for (int64_t j = 0; j < dv; j++) o[j] = eg * row[j];
        for (int64_t m = 0; m <= i; m++) {
            const float a = A[i * C + m];
            const float *um = U + m * dv;
            for (int64_t j = 0; j < dv; j++) o[j] += a * um[j];
        }
    }
    /* S = e^{γ_L} S + Σ_j e^{γ_L-γ_j} k_j ⊗ V'_j */
    const float gl = gam[L - 1], el = expf(gl);
    for (int64_t c = 0; c < dk * dv; c++) S[c] *= el;
    for (int64_t m = 0; m < L; m++) {
        const float *km = K_(m), *um = U + m * dv;
        const float e = expf(gl - gam[m]);
        for (int64_t c = 0; c < dk; c++) {
            const float kc = e * km[c];
            float *Sc = S + c * dv;
            for (int64_t j = 0; j < dv; j++) Sc[j] += kc * um[j];
        }
    }
#undef Q_
#undef K_
#undef B_
}

static int64_t delta_scratch_per_thread(const tm_delta_shape *s) {
    const int64_t C = CPU_DELTA_CHUNK;
    return C * (C + s->v_dim + s->k_dim) + C + s->v_dim;
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
SSM_INLINE void delta_heads(const delta_job *j, int64_t begin, int64_t end, float *scratch) {
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
            delta_chunk(s, h, kh, t0, L, j->qk, j->v, j->g, j->beta, S, j->out, scratch);
        }
    }
}

static void delta_heads_scalar(const delta_job *j, int64_t begin, int64_t end, float *scratch) {
    delta_heads(j, begin, end, scratch);
}

#ifdef TM_X86
TM_AVX2 static void delta_heads_avx2(const delta_job *j, int64_t begin, int64_t end,
                                     float *scratch) {
    delta_heads(j, begin, end, scratch);
}

__attribute__((target("avx2,fma,avx512f,avx512vl,prefer-vector-width=512"))) static void
delta_heads_avx512(const delta_job *j, int64_t begin, int64_t end, float *scratch) {
    delta_heads(j, begin, end, scratch);
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
