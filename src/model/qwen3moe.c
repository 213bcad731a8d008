/* Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B) as llama.cpp's converter stores it.
 *
 * x = token_embd[tok]
 * for each layer:
 *     h = rmsnorm(x) * attn_norm
 *     q, k, v = Wq h, Wk h, Wv h                    per head: rmsnorm(q) * q_norm, rmsnorm(k) *
 * k_norm q, k = rope_neox(q, pos), rope_neox(k, pos)    base = rope.freq_base x += Wo · softmax(q
 * kᵀ / sqrt(head_dim), causal) v     (grouped-query heads) h = rmsnorm(x) * ffn_norm p =
 * softmax(W_router h); top-k experts; weights renormalised to sum 1 x += Σ_k w_k ·
 * down_k(silu(gate_k h) * up_k h) logits = W_out · (rmsnorm(x) * output_norm)     (W_out =
 * token_embd when output is absent)
 *
 * Shapes (ne order, row length first): token_embd [n_embd, n_vocab];
 * attn_q [n_embd, n_head*head_dim]; attn_k/v [n_embd, n_head_kv*head_dim];
 * attn_output [n_head*head_dim, n_embd]; ffn_gate_inp [n_embd, n_expert];
 * ffn_gate/up_exps [n_embd, n_ff_exp, n_expert]; ffn_down_exps [n_ff_exp, n_embd, n_expert]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timing.h"
#include "cpu/cpu_ops.h"
#include "model/model.h"
#include "model/qwen3moe.h"

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

/* The q, k and v products of one layer (outputs in s; s NULL: sizes only). */
static void qwen3moe_qkv_descs(const qwen3moe_layer *L, const qwen3moe_state *s,
                               tm_matmul_desc out[3]) {
    const tm_weight *ws[3] = {&L->wq, &L->wk, &L->wv};
    float *ys[3] = {s ? s->q : NULL, s ? s->k : NULL, s ? s->v : NULL};
    for (int i = 0; i < 3; i++)
        out[i] = (tm_matmul_desc){ws[i]->type, ws[i]->ne[1], ws[i]->data, ws[i]->row_bytes, ys[i]};
}

/* q, k, v = Wq h, Wk h, Wv h: they share h, so one pool job covers all three. */
static void qwen3moe_qkv(tm_context *ctx, const qwen3moe_layer *L, int64_t n_tok) {
    qwen3moe_state *s = ctx->state;
    if (ctx->params.precise) {
        model_matmul(ctx, &L->wq, s->h, n_tok, s->q, s->act);
        model_matmul(ctx, &L->wk, s->h, n_tok, s->k, s->act);
        model_matmul(ctx, &L->wv, s->h, n_tok, s->v, s->act);
        return;
    }
    tm_matmul_desc qkv[3];
    qwen3moe_qkv_descs(L, s, qkv);
    cpu_matmul_multi(ctx->pool, 3, qkv, ctx->model->cfg.n_embd, s->h, n_tok, s->act);
}

static tm_status qwen3moe_state_create(tm_context *ctx) {
    const tm_model_config *c = &ctx->model->cfg;
    const qwen3moe_weights *w = ctx->model->weights;
    const int64_t B = ctx->params.n_batch, E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim;
    qwen3moe_state *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    ctx->state = s;
    /* activation scratch: the largest quantized input of any product */
    size_t act = model_matmul_scratch_bytes(&w->output, B);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const qwen3moe_layer *L = &w->layers[l];
        const tm_weight *ws[] = {&L->wo, &L->router};
        for (size_t i = 0; i < 2; i++) {
            size_t b = model_matmul_scratch_bytes(ws[i], B);
            act = b > act ? b : act;
        }
        tm_matmul_desc qkv[3];
        qwen3moe_qkv_descs(L, NULL, qkv);
        size_t b = cpu_matmul_multi_scratch_bytes(3, qkv, E, B);
        act = b > act ? b : act;
    }
    tm_attention_shape as = {B, 0, c->n_head, c->n_head_kv, c->head_dim, 0, ctx->params.kv_type};
    const int nth = cpu_pool_size(ctx->pool);
    if (!(s->x = malloc(B * E * sizeof(float))) || !(s->h = malloc(B * E * sizeof(float))) ||
        !(s->q = malloc(B * Q * sizeof(float))) || !(s->k = malloc(B * KV * sizeof(float))) ||
        !(s->v = malloc(B * KV * sizeof(float))) || !(s->att = malloc(B * Q * sizeof(float))) ||
        !(s->attn_out = malloc(B * E * sizeof(float))) ||
        !(s->router_logits = malloc(B * c->n_expert * sizeof(float))) ||
        !(s->topk_ids = malloc(B * c->n_expert_used * sizeof(int32_t))) ||
        !(s->topk_w = malloc(B * c->n_expert_used * sizeof(float))) ||
        !(s->moe_out = malloc(B * E * sizeof(float))) || !(s->act = malloc(act)) ||
        !(s->rope_cos = malloc(B * c->head_dim / 2 * sizeof(float))) ||
        !(s->rope_sin = malloc(B * c->head_dim / 2 * sizeof(float))) ||
        !(s->attn_scratch =
              malloc((size_t)cpu_attention_scratch_floats(&as, ctx->n_ctx, nth) * sizeof(float))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory for activations of a %lld-token batch",
                            (long long)B);
    tm_status st = moe_cpu_lane_create(&s->lane);
    if (st != TM_OK) return st;
    if (ctx->params.profile) moe_cpu_lane_profile(s->lane, &ctx->lane_stats);
    return ctx->params.n_gpu_layers ? qwen3moe_gpu_create(ctx) : TM_OK;
}

static void qwen3moe_state_free(tm_context *ctx) {
    qwen3moe_state *s = ctx->state;
    qwen3moe_gpu_free(ctx);
    free(s->x), free(s->h), free(s->q), free(s->k), free(s->v), free(s->att), free(s->attn_out);
    free(s->router_logits), free(s->topk_ids), free(s->topk_w), free(s->moe_out), free(s->act);
    free(s->attn_scratch), free(s->rope_cos), free(s->rope_sin);
    moe_worklist_free(&s->wl);
    moe_cpu_lane_free(s->lane);
    free(s);
    ctx->state = NULL;
}

static void emit(tm_context *ctx, const char *name, int layer, const void *data, int64_t n_tok,
                 int64_t n, bool is_int) {
    if (ctx->params.cb) ctx->params.cb(ctx->params.cb_ud, name, layer, data, n_tok, n, is_int);
}

/* Per-token work of a layer, spread over the pool for prompt batches: the
 * residual add and rmsnorm of the residual stream, or q/k head norms + RoPE +
 * KV store. */
typedef struct qwen3moe_token_job {
    tm_context *ctx;
    const qwen3moe_layer *L;
    uint32_t layer;
    const float *norm_w;   /* residual job: h = rmsnorm(x) * norm_w after the add (NULL: no norm) */
    const float *residual; /* residual job: x += residual first (NULL: none) */
    bool qk;               /* the q/k job instead */
} qwen3moe_token_job;

static void qwen3moe_token_task(void *ud, int64_t begin, int64_t end, int ith) {
    const qwen3moe_token_job *j = ud;
    tm_context *ctx = j->ctx;
    const tm_model_config *c = &ctx->model->cfg;
    qwen3moe_state *s = ctx->state;
    const int64_t E = c->n_embd, D = c->head_dim, Q = (int64_t)c->n_head * D,
                  KV = (int64_t)c->n_head_kv * D;
    const size_t kv_row = (size_t)KV * (ctx->params.kv_type == TM_TYPE_F16 ? 2 : 4);
    for (int64_t t = begin; t < end; t++) {
        if (!j->qk) {
            if (j->residual) cpu_axpy(s->x + t * E, 1.0f, j->residual + t * E, E);
            if (j->norm_w) cpu_rmsnorm(s->h + t * E, s->x + t * E, j->norm_w, E, c->rms_eps);
            continue;
        }
        const float *cs = s->rope_cos + t * (D / 2), *sn = s->rope_sin + t * (D / 2);
        for (int64_t h = 0; h < c->n_head; h++) {
            float *q = s->q + t * Q + h * D;
            cpu_rmsnorm(q, q, (const float *)j->L->q_norm.data, D, c->rms_eps);
            cpu_rope_neox_table(q, D, cs, sn);
        }
        for (int64_t h = 0; h < c->n_head_kv; h++) {
            float *k = s->k + t * KV + h * D;
            cpu_rmsnorm(k, k, (const float *)j->L->k_norm.data, D, c->rms_eps);
            cpu_rope_neox_table(k, D, cs, sn);
        }
        const int64_t pos = ctx->n_past + t;
        cpu_store_kv((uint8_t *)ctx->k_cache[j->layer] + (size_t)pos * kv_row, s->k + t * KV,
                     ctx->params.kv_type, KV);
        cpu_store_kv((uint8_t *)ctx->v_cache[j->layer] + (size_t)pos * kv_row, s->v + t * KV,
                     ctx->params.kv_type, KV);
    }
    (void)ith;
}

static void qwen3moe_tokens_run(tm_context *ctx, qwen3moe_token_job *j, int64_t n_tok) {
    if (n_tok == 1)
        qwen3moe_token_task(j, 0, 1, 0); /* not worth waking the pool */
    else
        cpu_pool_for(ctx->pool, n_tok, 1, qwen3moe_token_task, j);
}

static tm_status qwen3moe_forward(tm_context *ctx, const int32_t *tokens, int64_t n_tok,
                                  tm_moe_phase phase, bool all_logits) {
    const tm_model_config *c = &ctx->model->cfg;
    const qwen3moe_weights *w = ctx->model->weights;
    qwen3moe_state *s = ctx->state;
    const int64_t E = c->n_embd, D = c->head_dim, H = c->n_head, HKV = c->n_head_kv;
    const int64_t pos0 = ctx->n_past;
    const tm_type kv_type = ctx->params.kv_type;
    uint64_t t0 = tm_time_ns(), t1 = t0;
    tm_status st;

    for (int64_t t = 0; t < n_tok;
         t++) /* RoPE angles of this chunk, shared by every layer and head */
        cpu_rope_table(s->rope_cos + t * (D / 2), s->rope_sin + t * (D / 2), D, pos0 + t,
                       c->rope_base);

    if (ctx->n_gpu_layers) { /* the first layers (and maybe the output) on the GPU */
        if ((st = qwen3moe_gpu_forward(ctx, tokens, n_tok, all_logits, s->x))) return st;
        if (ctx->gpu_output) return TM_OK;
    } else {
        for (int64_t t = 0; t < n_tok; t++) /* x = token_embd[tok] */
            quant_row_dequantize(w->token_embd.type,
                                 w->token_embd.data + (size_t)tokens[t] * w->token_embd.row_bytes,
                                 s->x + t * E, E);
        model_prof_add(ctx, TM_PROF_EMBED, t0, t1 = tm_time_ns());
    }

    for (uint32_t l = (uint32_t)ctx->n_gpu_layers; l < c->n_layer; l++) {
        const qwen3moe_layer *L = &w->layers[l];

        /* attention */
        t0 = tm_time_ns();
        qwen3moe_token_job norm_job = {ctx, L, l, (const float *)L->attn_norm.data, NULL, false};
        qwen3moe_tokens_run(ctx, &norm_job, n_tok);
        model_prof_add(ctx, TM_PROF_NORM, t0, t1 = tm_time_ns());
        qwen3moe_qkv(ctx, L, n_tok);
        model_prof_add(ctx, TM_PROF_ATTN_PROJ, t1, t0 = tm_time_ns());
        qwen3moe_token_job qk_job = {ctx, L, l, NULL, NULL, true};
        qwen3moe_tokens_run(ctx, &qk_job, n_tok);
        model_prof_add(ctx, TM_PROF_NORM, t0, t1 = tm_time_ns());
        tm_attention_shape as = {n_tok, pos0, H, HKV, D, 1.0f / sqrtf((float)D), kv_type};
        cpu_attention(ctx->pool, &as, s->q, ctx->k_cache[l], ctx->v_cache[l], s->att,
                      s->attn_scratch);
        model_prof_add(ctx, TM_PROF_ATTENTION, t1, t0 = tm_time_ns());
        model_matmul(ctx, &L->wo, s->att, n_tok, s->attn_out, s->act);
        model_prof_add(ctx, TM_PROF_ATTN_PROJ, t0, t1 = tm_time_ns());
        emit(ctx, "attn_out", (int)l, s->attn_out, n_tok, E, false);

        /* mixture of experts */
        qwen3moe_token_job ffn_norm_job = {ctx,         L,    l, (const float *)L->ffn_norm.data,
                                           s->attn_out, false};
        qwen3moe_tokens_run(ctx, &ffn_norm_job,
                            n_tok); /* x += attn_out; h = rmsnorm(x) * ffn_norm */
        model_prof_add(ctx, TM_PROF_NORM, t1, t0 = tm_time_ns());
        model_matmul(ctx, &L->router, s->h, n_tok, s->router_logits, s->act);
        moe_router_select(ctx->pool, &w->router, s->router_logits, n_tok, s->topk_ids, s->topk_w);
        if ((st = moe_worklist_build(&s->wl, s->topk_ids, s->topk_w, n_tok, c->n_expert,
                                     c->n_expert_used, phase)))
            return st;
        model_prof_add(ctx, TM_PROF_ROUTER, t0, t1 = tm_time_ns());
        emit(ctx, "router_logits", (int)l, s->router_logits, n_tok, c->n_expert, false);
        emit(ctx, "topk_ids", (int)l, s->topk_ids, n_tok, c->n_expert_used, true);
        emit(ctx, "topk_weights", (int)l, s->topk_w, n_tok, c->n_expert_used, false);
        memset(s->moe_out, 0, (size_t)(n_tok * E) * sizeof(float));
        if ((st = moe_cpu_lane_run(s->lane, ctx->pool, &L->experts, &s->wl, 0, s->wl.n_slots, s->h,
                                   s->moe_out, ctx->params.precise)))
            return st;
        qwen3moe_token_job residual_job = {ctx, L, l, NULL, s->moe_out, false};
        qwen3moe_tokens_run(ctx, &residual_job, n_tok); /* x += moe_out */
        model_prof_add(ctx, TM_PROF_EXPERTS, t1, t0 = tm_time_ns());
        emit(ctx, "ffn_out", (int)l, s->moe_out, n_tok, E, false);
        emit(ctx, "x_out", (int)l, s->x, n_tok, E, false);
    }

    /* output: logits of the last token, or of all */
    t0 = tm_time_ns();
    const int64_t first = all_logits ? 0 : n_tok - 1, n_out = n_tok - first;
    for (int64_t t = first; t < n_tok; t++)
        cpu_rmsnorm(s->h + (t - first) * E, s->x + t * E, (const float *)w->output_norm.data, E,
                    c->rms_eps);
    model_matmul(ctx, &w->output, s->h, n_out, ctx->logits, s->act);
    model_prof_add(ctx, TM_PROF_OUTPUT, t0, tm_time_ns());
    emit(ctx, "logits", -1, ctx->logits, n_out, c->n_vocab, false);
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
