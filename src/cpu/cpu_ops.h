/* CPU element-wise and attention ops: RMSNorm, RoPE (NeoX), softmax, SwiGLU,
 * top-k, and causal attention over a KV cache. Each has a plain C reference
 * path (the TM_CPU_SCALAR level) and, where it pays, an AVX2/F16C one chosen
 * at run time; results agree to float rounding. Shapes are given explicitly;
 * nothing here knows a model. */
#ifndef TM_CPU_CPU_OPS_H
#define TM_CPU_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/cpu.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x / sqrt(mean(x^2) + eps) * w   (w may be NULL: no gain). y may alias x. */
void cpu_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);

/* RoPE with NeoX pairing (i, i + d/2), theta_i = pos * base^(-2i/d), from a
 * table: cpu_rope_table fills cos/sin(theta_i) for one position (once per
 * position, shared by every head and layer); cpu_rope_neox_table rotates one
 * head in place. */
void cpu_rope_table(float *cos_out, float *sin_out, int64_t head_dim, int64_t pos, float base);
/* The same from given inverse frequencies theta_i = pos * inv_freq[i] (scaled RoPE
 * such as YaRN), cos and sin multiplied by mscale (YaRN's attention factor). */
void cpu_rope_table_freq(float *cos_out, float *sin_out, int64_t head_dim, int64_t pos,
                         const float *inv_freq, float mscale);
void cpu_rope_neox_table(float *x, int64_t head_dim, const float *cos_t, const float *sin_t);
/* The same with adjacent pairs (2i, 2i + 1): llama.cpp's "normal" RoPE (GPT-J; HF's
 * rope_interleave), which Mixtral's converter-permuted q and k rows take. */
void cpu_rope_interleaved_table(float *x, int64_t head_dim, const float *cos_t, const float *sin_t);

/* In-place softmax over n values; returns nothing, the sum is 1. */
void cpu_softmax(float *x, int64_t n);

/* h[i] = silu(g[i]) * u[i]. */
void cpu_swiglu(float *h, const float *g, const float *u, int64_t n);

/* The clamped SwiGLU (gpt-oss): g' = min(g, limit), u' = clamp(u, -limit, limit),
 * h[i] = g' sigmoid(alpha g') (u' + 1). h may alias g. */
void cpu_swiglu_oai(float *h, const float *g, const float *u, int64_t n, float alpha, float limit);

/* The GELU-gated unit with GELU's tanh form (Gemma's gelu_pytorch_tanh):
 * h[i] = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u[i]. h may alias g. */
void cpu_geglu(float *h, const float *g, const float *u, int64_t n);

/* y[i] += a * x[i]. */
void cpu_axpy(float *y, float a, const float *x, int64_t n);

/* Indices of the k largest values of x[n], largest first (ties: lower index first). */
void cpu_topk(const float *x, int64_t n, int64_t k, int32_t *idx);

/* f16/f32 rows of a KV cache. */
void cpu_store_kv(void *dst, const float *src, tm_type kv_type, int64_t n);
void cpu_load_kv(float *dst, const void *src, tm_type kv_type, int64_t n);

/* Causal attention for a batch of query rows against a KV cache.
 *   q:   [n_tok][n_head * head_dim]       query rows (RoPE applied)
 *   k:   [n_ctx][n_head_kv * head_dim]    cache rows of type kv_type, positions 0..pos0+n_tok-1
 *                                         (a ring: position p at row p % ring)
 *   v:   [n_ctx][n_head_kv * v_dim]       likewise; or (v_in_k) none: value head g is the first
 *                                         v_dim values of key head g (MLA's latent, v unused)
 * filled out: [n_tok][n_head * v_dim]    Query i sits at position pos0 + i and sees keys 0..pos0+i.
 * Heads are grouped: head h reads kv head h / (n_head / n_head_kv). Work is spread over the pool by
 * (kv group, query block) for batches, each task walking the keys in blocks with an online softmax,
 * and for a single token by (kv group, chunk of 64 keys) with an exact log-sum-exp merge per head,
 * so long contexts use every core. A query's result does not depend on the batch it came in. */
typedef struct tm_attention_shape {
    int64_t n_tok, pos0, n_head, n_head_kv, head_dim;
    int64_t v_dim; /* a value head's width (0: head_dim) */
    bool v_in_k;   /* value head g = key head g's first v_dim values (the cache holds keys only) */
    float scale;
    tm_type kv_type;    /* TM_TYPE_F16 or TM_TYPE_F32 */
    int64_t window;     /* sliding window: query at p sees keys (p - window, p] (0: all <= p) */
    const float *sinks; /* [n_head]: a logit per head added to the softmax's denominator only
                            (attention sinks; NULL: none) */
    int64_t ring;       /* 0: key position p at cache row p; else at row p % ring (a sliding
                           window's cache: rows are reused once their keys left every window).
                           Needs a window and window + n_tok - 1 <= ring, so the keys the
                           batch sees are distinct rows; the results are the same bits as with
                           every position's row (the blocks and sums follow positions) */
} tm_attention_shape;

/* Scratch floats the attention needs for a pool of n_threads and a context of n_ctx. */
int64_t cpu_attention_scratch_floats(const tm_attention_shape *s, int64_t n_ctx, int n_threads);

void cpu_attention(tm_pool *pool, const tm_attention_shape *s, const float *q, const void *k,
                   const void *v, float *out, float *scratch);

/* Double-precision product with dequantized weights: y[t][r] = Σ W[r][i] x[t][i].
 * Slow; the exact reference that checks the quantized-activation paths. */
tm_status cpu_matmul_precise(tm_pool *pool, tm_type wtype, int64_t k, int64_t rows, const void *w,
                             size_t w_row_bytes, const float *x, int64_t n_tok, float *y);

#ifdef __cplusplus
}
#endif
#endif
