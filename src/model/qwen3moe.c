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

/* Activations of one step, [n_batch][...], named as in the header comment. */
typedef struct qwen3moe_state {
    tm_act x, h;             /* residual stream, normed input */
    tm_act q, k, v, att;     /* [n_head*head_dim], [n_head_kv*head_dim] x 2, [n_head*head_dim] */
    tm_act attn_out;         /* [n_embd] */
    tm_act router_logits;    /* [n_expert] */
    tm_act topk_ids, topk_w; /* [k] */
    tm_act ffn_out;          /* [n_embd]: the experts' sum, when intermediates are named */
    tm_act logits;           /* [n_vocab] */
} qwen3moe_state;

/* Logits rows the GPU holds at a time (a whole batch's would be n_batch x n_vocab). */
#define QWEN3MOE_LOGIT_ROWS 64

static tm_status qwen3moe_load(tm_model *m) {
    tm_model_config *c = &m->cfg;
    tm_status st;
    if ((st = model_key_u32(m, "block_count", &c->n_layer)) ||
        (st = model_key_u32(m, "embedding_length", &c->n_embd)) ||
        (st = model_key_u32(m, "attention.head_count", &c->n_head)) ||
        (st = model_key_u32(m, "attention.head_count_kv", &c->n_head_kv)) ||
        (st = model_key_u32(m, "context_length", &c->n_ctx_train)) ||
        (st = model_key_u32(m, "expert_count", &c->n_expert)) ||
        (st = model_key_u32(m, "expert_used_count", &c->n_expert_used)) ||
        (st = model_key_u32(m, "expert_feed_forward_length", &c->n_ff_exp)) ||
        (st = model_key_f32(m, "attention.layer_norm_rms_epsilon", &c->rms_eps)) ||
        (st = model_key_f32(m, "rope.freq_base", &c->rope_base)))
        return st;
    c->head_dim = c->n_embd / (c->n_head ? c->n_head : 1);
    model_key_u32(m, "attention.key_length", &c->head_dim); /* optional: Qwen3 sets it explicitly */
    uint32_t v_len = c->head_dim;
    model_key_u32(m, "attention.value_length", &v_len);
    const char *path = m->file->path;
    if (!c->n_layer || !c->n_embd || !c->n_head || !c->n_head_kv || c->n_head % c->n_head_kv ||
        !c->head_dim || c->head_dim % 2 || v_len != c->head_dim)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: inconsistent attention shape (%u heads, %u kv heads, key length "
                            "%u, value length %u)",
                            path, c->n_head, c->n_head_kv, c->head_dim, v_len);
    if (!c->n_expert || c->n_expert > 1024 || !c->n_expert_used || c->n_expert_used > c->n_expert ||
        c->n_expert_used > 32 || !c->n_ff_exp)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: not a usable MoE shape (%u experts, %u used, ff %u)", path,
                            c->n_expert, c->n_expert_used, c->n_ff_exp);

    qwen3moe_weights *w = calloc(1, sizeof(*w));
    if (!w || !(w->layers = calloc(c->n_layer, sizeof(qwen3moe_layer)))) {
        free(w);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    m->weights = w;
    const int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim;
    const tm_gguf_tensor *te = gguf_file_find_tensor(m->file, "token_embd.weight");
    c->n_vocab = te && te->n_dims == 2 ? (uint32_t)te->ne[1] : 0;
    if ((st = model_weight_bind(m, "token_embd.weight", 2, (int64_t[]){E, c->n_vocab},
                                &w->token_embd)) ||
        (st = model_weight_bind(m, "output_norm.weight", 1, (int64_t[]){E}, &w->output_norm)) ||
        (st = model_weight_bind_optional(m, "output.weight", 2, (int64_t[]){E, c->n_vocab},
                                         &w->output)))
        return st;
    if (!w->output.data) w->output = w->token_embd; /* tied embeddings */
    if (w->output_norm.type != TM_TYPE_F32)
        return tm_error_set(TM_ERR_UNSUPPORTED, "%s: output_norm must be f32", path);

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
            if (norms[i]->type != TM_TYPE_F32)
                return tm_error_set(TM_ERR_UNSUPPORTED, "%s: norm tensor '%.*s' must be f32, is %s",
                                    path, (int)norms[i]->name_len, norms[i]->name,
                                    quant_type_name(norms[i]->type));
        L->experts = (tm_moe_experts){
            .n_embd = E,
            .n_ff = c->n_ff_exp,
            .act = TM_MOE_ACT_SWIGLU,
            .gate = {L->gate_exps.data, L->gate_exps.type, L->gate_exps.row_bytes * c->n_ff_exp,
                     L->gate_exps.row_bytes},
            .up = {L->up_exps.data, L->up_exps.type, L->up_exps.row_bytes * c->n_ff_exp,
                   L->up_exps.row_bytes},
            .down = {L->down_exps.data, L->down_exps.type, L->down_exps.row_bytes * (size_t)E,
                     L->down_exps.row_bytes},
        };
    }
    w->router =
        (tm_moe_router_params){TM_MOE_GATING_SOFTMAX, c->n_expert, c->n_expert_used, true, 1.0f};
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
    tm_exec *e = ctx->exec;
    const int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim, K = c->n_expert_used;
    qwen3moe_state *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    ctx->state = s;
    tm_status st;
    if ((st = exec_act_create(e, &s->x, "x", E, false, 0)) ||
        (st = exec_act_create(e, &s->h, "h", E, false, 0)) ||
        (st = exec_act_create(e, &s->q, "q", Q, false, 0)) ||
        (st = exec_act_create(e, &s->k, "k", KV, false, 0)) ||
        (st = exec_act_create(e, &s->v, "v", KV, false, 0)) ||
        (st = exec_act_create(e, &s->att, "att", Q, false, 0)) ||
        (st = exec_act_create(e, &s->attn_out, "attn_out", E, false, 0)) ||
        (st = exec_act_create(e, &s->router_logits, "router_logits", c->n_expert, false, 0)) ||
        (st = exec_act_create(e, &s->topk_ids, "topk_ids", K, true, 0)) ||
        (st = exec_act_create(e, &s->topk_w, "topk_weights", K, false, 0)) ||
        (st = exec_act_create(e, &s->ffn_out, "ffn_out", E, false, 0)) ||
        (st = exec_act_create(e, &s->logits, "logits", c->n_vocab, false, QWEN3MOE_LOGIT_ROWS)))
        return st;
    for (uint32_t l = 0; l < c->n_layer; l++) { /* q, k and v share their input */
        const qwen3moe_layer *L = &w->layers[l];
        if ((st = exec_weight_group(e, 3, (const tm_weight *const[]){&L->wq, &L->wk, &L->wv})))
            return st;
    }
    const tm_attn_desc shape = {c->n_head, c->n_head_kv, c->head_dim, 0, 0, 0, NULL, NULL};
    if ((st = exec_attention_setup(e, c->n_layer, ctx->placement.layer_dev, &shape)) ||
        (st = exec_finalize(e)))
        return st;
    ctx->logits = s->logits.host;

    tm_tier_layer *tl = calloc(c->n_layer, sizeof(*tl));
    if (!tl) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const qwen3moe_layer *L = &w->layers[l];
        tl[l] = (tm_tier_layer){L->experts, &L->gate_exps, &L->up_exps, &L->down_exps};
    }
    const tm_tier_params tp = {.cache_mib = ctx->params.moe_cache_mib,
                               .cache = ctx->params.moe_cache,
                               .reserve = (size_t)768 << 20,
                               .pcie = ctx->params.moe_pcie,
                               .fetch = ctx->params.moe_fetch,
                               .store = {.budget_mib = ctx->params.ram_cache_mib,
                                         .path = ctx->model->file->path,
                                         .map = ctx->model->file->map}};
    st = tier_create(e, &ctx->placement, c->n_layer, tl, &w->router, &tp, &ctx->tier);
    free(tl);
    return st;
}

static void qwen3moe_state_free(tm_context *ctx) {
    free(ctx->state);
    ctx->state = NULL;
}

#define DO(call)                                                                                   \
    do {                                                                                           \
        tm_status st_ = (call);                                                                    \
        if (st_ != TM_OK) return st_;                                                              \
    } while (0)

static tm_status qwen3moe_layer_forward(tm_context *ctx, uint32_t l, int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const qwen3moe_layer *L = &((const qwen3moe_weights *)ctx->model->weights)->layers[l];
    qwen3moe_state *s = ctx->state;
    tm_exec *e = ctx->exec;
    const float eps = c->rms_eps;
    const tm_attn_desc attn = {
        c->n_head, c->n_head_kv, c->head_dim, 1.0f / sqrtf((float)c->head_dim),
        eps,       c->rope_base, &L->q_norm,  &L->k_norm};

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
    if (exec_emitting(e)) {
        DO(exec_emit(e, "router_logits", (int)l, &s->router_logits, n_tok));
        DO(exec_emit(e, "topk_ids", (int)l, &s->topk_ids, n_tok));
        DO(exec_emit(e, "topk_weights", (int)l, &s->topk_w, n_tok));
        DO(exec_emit(e, "ffn_out", (int)l, &s->ffn_out, n_tok));
        DO(exec_emit(e, "x_out", (int)l, &s->x, n_tok));
    }
    return TM_OK;
}

static tm_status qwen3moe_forward(tm_context *ctx, int64_t n_tok, bool all_logits) {
    const tm_model_config *c = &ctx->model->cfg;
    const qwen3moe_weights *w = ctx->model->weights;
    qwen3moe_state *s = ctx->state;
    tm_exec *e = ctx->exec;

    DO(exec_embed(e, &s->x, &w->token_embd)); /* x = token_embd[tok] */
    for (uint32_t l = 0; l < c->n_layer; l++) DO(qwen3moe_layer_forward(ctx, l, n_tok));

    /* logits = W_out · (rmsnorm(x) * output_norm), of the last token or of all */
    const int64_t first = all_logits ? 0 : n_tok - 1;
    DO(exec_part(e, TM_PROF_OUTPUT));
    DO(exec_rmsnorm(e, &s->h, &s->x, &w->output_norm, c->rms_eps));
    DO(exec_matmul_rows(e, &s->logits, &w->output, &s->h, first, n_tok - first));
    DO(exec_fetch(e, &s->logits, n_tok - first));
    DO(exec_emit(e, "logits", -1, &s->logits, n_tok - first));
    return TM_OK;
}

const tm_arch tm_arch_qwen3moe = {
    .name = "qwen3moe",
    .load = qwen3moe_load,
    .unload = qwen3moe_unload,
    .state_create = qwen3moe_state_create,
    .state_free = qwen3moe_state_free,
    .forward = qwen3moe_forward,
};
