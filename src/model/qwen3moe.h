/* Qwen3-MoE internals shared by the CPU forward (qwen3moe.c) and the GPU
 * forward (qwen3moe_gpu.c): the bound weights and the CPU activations.
 * Private to src/model. */
#ifndef TM_MODEL_QWEN3MOE_H
#define TM_MODEL_QWEN3MOE_H

#include "model/model.h"

typedef struct qwen3moe_layer {
    tm_weight attn_norm, wq, wk, wv, wo, q_norm, k_norm;
    tm_weight ffn_norm, router, gate_exps, up_exps, down_exps;
    tm_moe_experts experts;
} qwen3moe_layer;

typedef struct qwen3moe_weights {
    tm_weight token_embd, output_norm, output;
    qwen3moe_layer *layers;
    tm_moe_router_params router;
} qwen3moe_weights;

typedef struct qwen3moe_gpu qwen3moe_gpu;

/* Activations of one chunk of n_batch tokens, named as in the header comment. */
typedef struct qwen3moe_state {
    float *x, *h;          /* [n_batch][n_embd] residual stream, normed input */
    float *q, *k, *v;      /* [n_batch][n_head*head_dim], [n_batch][n_head_kv*head_dim] */
    float *att, *attn_out; /* [n_batch][n_head*head_dim], [n_batch][n_embd] */
    float *router_logits;  /* [n_batch][n_expert] */
    int32_t *topk_ids;     /* [n_batch][k] */
    float *topk_w;
    float *moe_out; /* [n_batch][n_embd] */
    float *attn_scratch;
    float *rope_cos, *rope_sin; /* [n_batch][head_dim/2] for this chunk's positions */
    void *act;                  /* quantized activations for model_matmul */
    tm_moe_worklist wl;
    tm_moe_cpu_lane *lane;
    qwen3moe_gpu *gpu; /* the layers on the GPU (qwen3moe_gpu.c), NULL when none */
} qwen3moe_state;

/* ---- qwen3moe_gpu.c ---- */

/* Put the first ctx->params.n_gpu_layers layers (all of them and the output
 * head when it is >= n_layer; TM_NGL_AUTO: as many as fit, none without a GPU)
 * on the GPU: upload their weights, allocate their KV cache and activations.
 * Sets ctx->n_gpu_layers. Without CUDA in the build, a request for layers
 * fails (auto gives 0). */
tm_status qwen3moe_gpu_create(tm_context *ctx);
void qwen3moe_gpu_free(tm_context *ctx);
/* Embeddings and layers [0, ctx->n_gpu_layers) for n_tok tokens at positions
 * ctx->n_past.. . When ctx->gpu_output, also the output head: the logits of
 * the last token (every token's when all_logits) end in ctx->logits;
 * otherwise the residual stream is copied to x_host [n_tok][n_embd] for the
 * CPU layers that follow. */
tm_status qwen3moe_gpu_forward(tm_context *ctx, const int32_t *tokens, int64_t n_tok,
                               bool all_logits, float *x_host);

#endif
