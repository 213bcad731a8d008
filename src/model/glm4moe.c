/* GLM-4.5 / GLM-4.5-Air / GLM-4.6 / GLM-4.7 (architecture `glm4moe`) as
 * llama.cpp's converter stores them: leading dense layers, then MoE layers with
 * a shared expert and a sigmoid router with a selection bias and expert groups.
 *
 *   x = token_embd[tok]
 *   for each layer l (the first leading_dense_block_count dense):
 *       h = rmsnorm(x) * attn_norm
 *       q, k, v = Wq h + bq, Wk h + bk, Wv h + bv
 *       [q, k = rmsnorm(q) * q_norm, rmsnorm(k) * k_norm    per head, when the file has them]
 *       q, k = rope_neox(q), rope_neox(k)   the first rope.dimension_count values of a head,
 *                                           pairs (i, i + n_rot/2) at pos · base^(-2i/n_rot)
 *       x += Wo · softmax(q kᵀ / sqrt(head_dim), causal) v   grouped-query heads (no bias on Wo)
 *       h = rmsnorm(x) * post_attention_norm
 *       dense layer:  x += down(silu(gate h) ⊙ up h)
 *       MoE layer:    x += down_sh(silu(gate_sh h) ⊙ up_sh h)      the shared experts, unweighted
 *                     s = sigmoid(W_router h)                       (expert_gating_func 2; 1: softmax)
 *                     sel = s + exp_probs_b                         chooses, never weighs
 *                     groups: a group's score is the sum of its two largest sel; the experts of
 *                             the expert_group_used_count best of expert_group_count groups
 *                     the top-k of sel among them; w_k = s_k / Σ s (expert_weights_norm) ·
 *                             expert_weights_scale
 *                     x += Σ_k w_k · down_k(silu(gate_k h) ⊙ up_k h)
 *   logits = W_out · (rmsnorm(x) * output_norm)
 *
 * The last nextn_predict_layers of block_count are NextN (multi-token prediction) layers:
 * their tensors are checked like a layer's plus nextn.eh_proj [2 n_embd, n_embd],
 * nextn.enorm, nextn.hnorm (and the optional nextn.embed_tokens, shared_head_head,
 * shared_head_norm), and never run (n_layer counts the others; the placement keeps them in the
 * mapped file).
 *
 * Shapes (ne order): attn_q [n_embd, n_head*head_dim] + bias; attn_k/v [n_embd,
 * n_head_kv*head_dim] + bias; attn_output [n_head*head_dim, n_embd]; attn_q/k_norm [head_dim];
 * the FFNs (dense, shared and routed experts, router, selection bias): moe_ffn.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"

typedef struct glm_layer {
    tm_weight attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, post_norm;
    tm_ffn_layer ffn; /* dense, or shared and routed experts (moe_ffn.c) */
} glm_layer;

typedef struct glm_weights {
    tm_weight token_embd, output_norm, output;
    glm_layer *layers;
    tm_moe_router_params router;
    bool qk_norm;
} glm_weights;

typedef struct glm_acts {
    tm_moe_acts m; /* first: model_moe_acts_create */
    tm_ffn_acts ffn;
} glm_acts;

/* Layer l's tensors (a NextN layer's too: the same shapes). */
static tm_status glm_layer_bind(tm_model *m, uint32_t l, void *layer) {
    const glm_weights *w = m->weights;
    glm_layer *L = layer;
    const tm_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, D = c->head_dim, Q = (int64_t)c->n_head * D,
                  KV = (int64_t)c->n_head_kv * D;
    char name[96];
    tm_status st;
#define BIND(field, suffix, nd, ...)                                                               \
    (snprintf(name, sizeof(name), "blk.%u." suffix, l),                                            \
     model_weight_bind(m, name, nd, (int64_t[]){__VA_ARGS__}, &L->field))
#define BIND_OPT(field, suffix, nd, ...)                                                           \
    (snprintf(name, sizeof(name), "blk.%u." suffix, l),                                            \
     model_weight_bind_optional(m, name, nd, (int64_t[]){__VA_ARGS__}, &L->field))
    if ((st = BIND(attn_norm, "attn_norm.weight", 1, E)) ||
        (st = BIND(wq, "attn_q.weight", 2, E, Q)) || (st = BIND(bq, "attn_q.bias", 1, Q)) ||
        (st = BIND(wk, "attn_k.weight", 2, E, KV)) || (st = BIND(bk, "attn_k.bias", 1, KV)) ||
        (st = BIND(wv, "attn_v.weight", 2, E, KV)) || (st = BIND(bv, "attn_v.bias", 1, KV)) ||
        (st = BIND(wo, "attn_output.weight", 2, Q, E)) ||
        (st = BIND(post_norm, "post_attention_norm.weight", 1, E)) ||
        (st = BIND_OPT(q_norm, "attn_q_norm.weight", 1, D)) ||
        (st = BIND_OPT(k_norm, "attn_k_norm.weight", 1, D)))
        return st;
    /* the QK norm: every layer or none (HF's use_qk_norm), q and k together */
    if (!L->q_norm.data != !w->qk_norm || !L->k_norm.data != !w->qk_norm)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: layer %u has %s attn_q_norm and %s attn_k_norm, layer 0 %s "
                            "(blk.%u.attn_q_norm.weight, blk.%u.attn_k_norm.weight: both in every "
                            "layer or in none)",
                            m->file->path, l, L->q_norm.data ? "an" : "no",
                            L->k_norm.data ? "an" : "no", w->qk_norm ? "both" : "neither", l, l);
    if ((st = model_ffn_bind(m, l, true, &L->ffn))) return st;
#undef BIND
#undef BIND_OPT
    const tm_weight *f32[] = {&L->attn_norm, &L->bq,     &L->bk,    &L->bv,
                              &L->post_norm, &L->q_norm, &L->k_norm};
    for (size_t i = 0; i < sizeof(f32) / sizeof(f32[0]); i++)
        if ((st = model_weight_f32(m, f32[i]))) return st;
    return TM_OK;
}

static tm_status glm_load(tm_model *m) {
    tm_model_config *c = &m->cfg;
    uint32_t n_block;
    tm_status st = model_hparams_load(m);
    if (st || (st = model_nextn_split(m, &n_block))) return st;
    glm_weights *w = calloc(1, sizeof(*w));
    if (!w || !(w->layers = calloc(c->n_layer, sizeof(glm_layer)))) {
        free(w);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    m->weights = w;
    w->qk_norm = gguf_file_find_tensor(m->file, "blk.0.attn_q_norm.weight") != NULL;
    if ((st = model_io_bind(m, &w->token_embd, &w->output_norm, &w->output)) ||
        (st = model_layers_bind(m, n_block, w->layers, sizeof(glm_layer), glm_layer_bind)))
        return st;
    return model_ffn_router_load(m, &w->router);
}

static void glm_unload(tm_model *m) {
    glm_weights *w = m->weights;
    free(w->layers);
    free(w);
    m->weights = NULL;
}

static tm_status glm_state_create(tm_context *ctx) {
    const tm_model_config *c = &ctx->model->cfg;
    const glm_weights *w = ctx->model->weights;
    tm_exec *e = ctx->exec;
    glm_acts *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    ctx->state = s;
    tm_status st;
    if ((st = model_moe_acts_create(ctx, &s->m)) || (st = model_ffn_acts_create(ctx, &s->ffn)))
        return st;
    tm_tier_layer *tl = calloc(c->n_layer, sizeof(*tl));
    if (!tl) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->n_layer && st == TM_OK; l++) {
        const glm_layer *L = &w->layers[l];
        const tm_weight *qkv[] = {&L->wq, &L->wk, &L->wv}; /* stacked on the GPU at decode */
        if ((st = exec_weight_group(e, 3, qkv)) == TM_OK) st = model_ffn_setup(e, &L->ffn, &tl[l]);
    }
    if (st == TM_OK) st = model_moe_state_finish(ctx, tl, &w->router, NULL, NULL, NULL);
    free(tl);
    return st;
}

static void glm_state_free(tm_context *ctx) {
    free(ctx->state);
    ctx->state = NULL;
}

#define DO MODEL_DO

static tm_status glm_layer_forward(tm_context *ctx, uint32_t l, int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const glm_weights *w = ctx->model->weights;
    const glm_layer *L = &w->layers[l];
    glm_acts *a = ctx->state;
    tm_moe_acts *s = &a->m;
    tm_exec *e = ctx->exec;
    const float eps = c->rms_eps;
    const tm_attn_desc attn = {.n_head = c->n_head,
                               .n_head_kv = c->n_head_kv,
                               .head_dim = c->head_dim,
                               .scale = 1.0f / sqrtf((float)c->head_dim),
                               .rms_eps = eps,
                               .rope_base = c->rope_base,
                               .q_norm = w->qk_norm ? &L->q_norm : NULL,
                               .k_norm = w->qk_norm ? &L->k_norm : NULL,
                               .n_rot = c->n_rot};

    /* attention */
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm(e, &s->h, &s->x, &L->attn_norm, eps)); /* h = rmsnorm(x) * attn_norm */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul_n(e, 3, (tm_act *const[]){&s->q, &s->k, &s->v},
                     (const tm_weight *const[]){&L->wq, &L->wk, &L->wv}, &s->h));
    DO(exec_add_bias(e, &s->q, &L->bq)); /* q, k, v = W h + b */
    DO(exec_add_bias(e, &s->k, &L->bk));
    DO(exec_add_bias(e, &s->v, &L->bv));
    DO(exec_part(e, TM_PROF_ATTENTION));
    DO(exec_attention(e, l, &attn, &s->q, &s->k, &s->v, &s->att)); /* [QK norm], partial RoPE */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul(e, &s->attn_out, &L->wo, &s->att));
    DO(exec_emit(e, "attn_out", (int)l, &s->attn_out, n_tok));

    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_add_rmsnorm(e, &s->x, &s->attn_out, &s->h, &L->post_norm, eps)); /* x += Wo att;
                                                    h = rmsnorm(x) * post_attention_norm */
    return model_ffn_forward(ctx, l, &L->ffn, &a->ffn, s, n_tok); /* the header's FFN part */
}

static tm_status glm_forward(tm_context *ctx, int64_t n_tok, bool all_logits) {
    const tm_model_config *c = &ctx->model->cfg;
    const glm_weights *w = ctx->model->weights;
    glm_acts *a = ctx->state;
    tm_exec *e = ctx->exec;

    DO(exec_embed(e, &a->m.x, &w->token_embd)); /* x = token_embd[tok] */
    for (uint32_t l = 0; l < c->n_layer; l++) DO(glm_layer_forward(ctx, l, n_tok));
    DO(model_logits_forward(ctx, &a->m, &w->output_norm, &w->output, n_tok, all_logits));
    return TM_OK;
}

const tm_arch tm_arch_glm4moe = {
    .name = "glm4moe",
    .load = glm_load,
    .unload = glm_unload,
    .state_create = glm_state_create,
    .state_free = glm_state_free,
    .forward = glm_forward,
};
