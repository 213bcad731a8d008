/* Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B) as llama.cpp's converter stores it.
 *
 *   x = token_embd[tok]
 *   for each layer:
 *       h = rmsnorm(x) * attn_norm
 *       q, k, v = Wq h, Wk h, Wv h
 *       q, k = rope_neox(rmsnorm(q) * q_norm), rope_neox(rmsnorm(k) * k_norm)   per head,
 *                                                          base = rope.freq_base
 *       x += Wo · softmax(q kᵀ / sqrt(head_dim), causal) v   grouped-query heads
 *       h = rmsnorm(x) * ffn_norm
 *       p = softmax(W_router h); the top-k experts, their p renormalised to sum 1
 *       x += Σ_k p_k · down_k(silu(gate_k h) ⊙ up_k h)
 *   logits = W_out · (rmsnorm(x) * output_norm)           W_out = token_embd when output is absent
 *
 * Shapes (ne order, row length first): token_embd [n_embd, n_vocab];
 * attn_q [n_embd, n_head*head_dim]; attn_k/v [n_embd, n_head_kv*head_dim];
 * attn_output [n_head*head_dim, n_embd]; ffn_gate_inp [n_embd, n_expert];
 * ffn_gate/up_exps [n_embd, n_ff_exp, n_expert]; ffn_down_exps [n_ff_exp, n_embd, n_expert].
 *
 * The forward below is the whole model for every placement: each op runs where
 * its weights live (src/exec/exec.h), the MoE step is the tier's
 * (src/tier/tier.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static tm_status qwen3moe_load(tm_model *m) {
    tm_model_config *c = &m->cfg;
    tm_status st = model_hparams_load(m);
    if (st) return st;

    qwen3moe_weights *w = calloc(1, sizeof(*w));
    if (!w || !(w->layers = calloc(c->n_layer, sizeof(qwen3moe_layer)))) {
        free(w);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    m->weights = w;
    const int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim;
    if ((st = model_io_bind(m, &w->token_embd, &w->output_norm, &w->output))) return st;

    for (uint32_t l = 0; l < c->n_layer; l++) {
        qwen3moe_layer *L = &w->layers[l];
        char name[96];
#define BIND(field, suffix, nd, ...)                                                               \
    (snprintf(name, sizeof(name), "blk.%u." suffix ".weight", l),                                  \
     model_weight_bind(m, name, nd, (int64_t[]){__VA_ARGS__}, &L->field))
        if ((st = BIND(attn_norm, "attn_norm", 1, E)) || (st = BIND(wq, "attn_q", 2, E, Q)) ||
            (st = BIND(wk, "attn_k", 2, E, KV)) || (st = BIND(wv, "attn_v", 2, E, KV)) ||
            (st = BIND(wo, "attn_output", 2, Q, E)) ||
            (st = BIND(q_norm, "attn_q_norm", 1, c->head_dim)) ||
            (st = BIND(k_norm, "attn_k_norm", 1, c->head_dim)) ||
            (st = BIND(ffn_norm, "ffn_norm", 1, E)) ||
            (st = BIND(router, "ffn_gate_inp", 2, E, c->n_expert)) ||
            (st = BIND(gate_exps, "ffn_gate_exps", 3, E, c->n_ff_exp, c->n_expert)) ||
            (st = BIND(up_exps, "ffn_up_exps", 3, E, c->n_ff_exp, c->n_expert)) ||
            (st = BIND(down_exps, "ffn_down_exps", 3, c->n_ff_exp, E, c->n_expert)))
            return st;
#undef BIND
        const tm_weight *norms[] = {&L->attn_norm, &L->q_norm, &L->k_norm, &L->ffn_norm};
        for (size_t i = 0; i < 4; i++)
            if ((st = model_weight_f32(m, norms[i]))) return st;
        L->experts = model_moe_experts(&L->gate_exps, &L->up_exps, &L->down_exps, &L->router);
    }
    w->router = (tm_moe_router_params){.gating = TM_MOE_GATING_SOFTMAX,
                                       .n_expert = c->n_expert,
                                       .n_used = c->n_expert_used,
                                       .norm_topk = true,
                                       .scale = 1.0f};
    return TM_OK;
}

static void qwen3moe_unload(tm_model *m) {
    qwen3moe_weights *w = m->weights;
    free(w->layers);
    free(w);
    m->weights = NULL;
}

static tm_status qwen3moe_state_create(tm_context *ctx) {
    const tm_model_config *c = &ctx->model->cfg;
    qwen3moe_weights *w = ctx->model->weights;
    const tm_weight **qkv = calloc((size_t)c->n_layer * 3, sizeof(*qkv));
    tm_tier_layer *tl = calloc(c->n_layer, sizeof(*tl));
    tm_status st = TM_OK;
    if (!qkv || !tl) st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->n_layer && st == TM_OK; l++) {
        const qwen3moe_layer *L = &w->layers[l];
        qkv[3 * l] = &L->wq, qkv[3 * l + 1] = &L->wk, qkv[3 * l + 2] = &L->wv;
        tl[l] = (tm_tier_layer){.experts = L->experts,
                                .gate = &L->gate_exps,
                                .up = &L->up_exps,
                                .down = &L->down_exps,
                                .router = &L->router,
                                .router_bias = NULL};
    }
    if (st == TM_OK) st = model_moe_state_create(ctx, qkv, tl, &w->router, NULL);
    free(qkv), free(tl);
    return st;
}

#define DO MODEL_DO

static tm_status qwen3moe_layer_forward(tm_context *ctx, uint32_t l, int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const qwen3moe_layer *L = &((const qwen3moe_weights *)ctx->model->weights)->layers[l];
    tm_moe_acts *s = ctx->state;
    tm_exec *e = ctx->exec;
    const float eps = c->rms_eps;
    const tm_attn_desc attn = {.n_head = c->n_head,
                               .n_head_kv = c->n_head_kv,
                               .head_dim = c->head_dim,
                               .scale = 1.0f / sqrtf((float)c->head_dim),
                               .rms_eps = eps,
                               .rope_base = c->rope_base,
                               .q_norm = &L->q_norm,
                               .k_norm = &L->k_norm};

    /* attention */
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm(e, &s->h, &s->x, &L->attn_norm, eps)); /* h = rmsnorm(x) * attn_norm */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul_n(e, 3, (tm_act *const[]){&s->q, &s->k, &s->v},
                     (const tm_weight *const[]){&L->wq, &L->wk, &L->wv}, &s->h)); /* q, k, v */
    DO(exec_part(e, TM_PROF_ATTENTION));
    DO(exec_attention(e, l, &attn, &s->q, &s->k, &s->v, &s->att)); /* QK-norm, RoPE, softmax */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul(e, &s->attn_out, &L->wo, &s->att));
    DO(exec_emit(e, "attn_out", (int)l, &s->attn_out, n_tok));

    /* mixture of experts */
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_add_rmsnorm(e, &s->x, &s->attn_out, &s->h, &L->ffn_norm, eps)); /* x += Wo att;
                                                                              h = rmsnorm(x) * ffn_norm */
    DO(exec_part(e, TM_PROF_ROUTER));
    DO(exec_matmul(e, &s->router_logits, &L->router, &s->h)); /* W_router h */
    DO(exec_part(e, TM_PROF_EXPERTS));
    DO(tier_moe(ctx->tier, l, &s->router_logits, &s->h, &s->topk_ids, &s->topk_w, &s->x,
                &s->ffn_out)); /* x += Σ_k p_k · down_k(silu(gate_k h) ⊙ up_k h) */
    DO(model_moe_emit(ctx, l, s, n_tok));
    return TM_OK;
}

static tm_status qwen3moe_forward(tm_context *ctx, int64_t n_tok, bool all_logits) {
    const tm_model_config *c = &ctx->model->cfg;
    const qwen3moe_weights *w = ctx->model->weights;
    tm_moe_acts *s = ctx->state;
    tm_exec *e = ctx->exec;

    DO(exec_embed(e, &s->x, &w->token_embd)); /* x = token_embd[tok] */
    for (uint32_t l = 0; l < c->n_layer; l++) DO(qwen3moe_layer_forward(ctx, l, n_tok));

    /* logits = W_out · (rmsnorm(x) * output_norm), of the last token or of all */
    DO(model_logits_forward(ctx, s, &w->output_norm, &w->output, n_tok, all_logits));
    return TM_OK;
}

const tm_arch tm_arch_qwen3moe = {
    .name = "qwen3moe",
    .load = qwen3moe_load,
    .unload = qwen3moe_unload,
    .state_create = qwen3moe_state_create,
    .state_free = model_moe_state_free,
    .forward = qwen3moe_forward,
};
