/* CPU kernels of linear attention (the gated delta rule of Gated DeltaNet,
 * as in Qwen3-Next): the short causal convolution with its state, the L2 norm
 * of q and k, the gates, the delta rule as a serial recurrence (decode) and
 * in chunks of matrix products (prompts), and the gated RMSNorm. Shapes are
 * given explicitly; nothing here knows a model.
 *
 * The delta rule of one value head, state S [k_dim][v_dim], per token t:
 *   S = exp(g_t) S
 *   S = S + k_t ⊗ β_t (v_t - Sᵀ k_t)
 *   o_t = Sᵀ q_t
 * with q, k L2-normalised and q scaled by 1/sqrt(k_dim). The chunked form
 * (cpu_delta_chunk) gives the same outputs and final state within float
 * rounding (tests/test_cpu_ssm.c checks it against the recurrence). */
#ifndef TM_CPU_CPU_SSM_H
#define TM_CPU_CPU_SSM_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tokens of one chunk of the chunked delta rule. */
#define CPU_DELTA_CHUNK 64

/* The causal depthwise convolution of width K over n_tok rows of one
 * sequence, then SiLU, in place on x [n_tok][C]:
 *   y[t][c] = silu(Σ_{j<K} w[c][j] · x[t - (K-1) + j][c])
 * where the rows before the first come from state [K-1][C] (oldest first),
 * which ends holding the last K-1 inputs. w: [C][K] (the file's ssm_conv1d
 * rows). Channels are spread over the pool. */
void cpu_ssm_conv(tm_pool *pool, float *x, int64_t n_tok, int64_t C, int64_t K, const float *w,
                  float *state);

/* x = x / sqrt(Σ x² + eps) over n values. */
void cpu_l2norm(float *x, int64_t n, float eps);

/* One sequence's delta rule over n_tok tokens.
 *   qk: rows of qk_stride floats, q of key head h at h k_dim, k at k_off + h k_dim
 *       (both L2-normalised, q also scaled by 1/sqrt(k_dim), by the caller)
 *   v:  rows of v_stride floats, value head h at h v_dim
 *   g, beta: [n_tok][n_v_head] the log decay (<= 0) and beta
 *   state: [n_v_head][k_dim][v_dim], updated
 *   out: [n_tok][n_v_head v_dim]
 * Value head h reads key head h % n_k_head (v_tiled) or h / (n_v_head /
 * n_k_head). chunked: in chunks of CPU_DELTA_CHUNK tokens of matrix products
 * (prompts), else token by token. Heads are spread over the pool. */
typedef struct tm_delta_shape {
    int64_t n_tok, n_k_head, n_v_head, k_dim, v_dim;
    int64_t qk_stride, k_off, v_stride;
    bool v_tiled;
} tm_delta_shape;

/* Floats of scratch cpu_delta_rule needs for a pool of n_threads. */
int64_t cpu_delta_scratch_floats(const tm_delta_shape *s, int n_threads);

void cpu_delta_rule(tm_pool *pool, const tm_delta_shape *s, const float *qk, const float *v,
                    const float *g, const float *beta, float *state, float *out, bool chunked,
                    float *scratch);

/* y = rmsnorm(x) * w * silu(z) per group of n values (x, z, y: [n_groups][n];
 * w: [n], shared by the groups). y may alias x. */
void cpu_rmsnorm_gated(float *y, const float *x, const float *z, const float *w, int64_t n_groups,
                       int64_t n, float eps);

#ifdef __cplusplus
}
#endif
#endif
