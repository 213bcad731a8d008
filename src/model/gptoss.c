/* gpt-oss (gpt-oss-20b, gpt-oss-120b) as llama.cpp's converter stores it.
 *
 *   x = token_embd[tok]
 *   for each layer l:
 *       h = rmsnorm(x) * attn_norm
 *       q, k, v = Wq h + bq, Wk h + bk, Wv h + bv
 *       q, k = rope_neox_yarn(q), rope_neox_yarn(k)       per head
 *       att = softmax_sink(q kᵀ / sqrt(head_dim))·v      grouped-query heads; the softmax's
 *             denominator also holds exp(attn_sinks[head]); even layers see only the last
 *             `sliding_window` positions (themselves included), odd layers every position
 *       x += Wo att + bo
 *       h = rmsnorm(x) * post_attention_norm
 *       r = W_router h + b_router; the top-k of r, p = softmax over those k
 *       x += Σ_k p_k · (down_k(act(gate_k h + bg_k, up_k h + bu_k)) + bd_k)
 *       act(g, u) = g' sigmoid(1.702 g') (u' + 1),  g' = min(g, 7),  u' = clamp(u, -7, 7)
 *   logits = W_out · (rmsnorm(x) * output_norm)
 *
 * RoPE (YaRN, as HF's _compute_yarn_parameters with gpt-oss's truncate: false):
 *   pair i of head_dim d: f_i = base^(-2i/d);  ramp_i = clamp((i - lo) / (hi - lo), 0, 1),
 *   lo, hi = d ln(orig_ctx / (2π β)) / (2 ln base) for β = beta_fast (32), beta_slow (1);
 *   inv_freq_i = f_i / factor · ramp_i + f_i · (1 - ramp_i); cos and sin times
 *   mscale = 0.1 ln(factor) + 1 (so q·k gains mscale²).
 *
 * Shapes (ne order, row length first): attn_q [n_embd, n_head*head_dim] (+ bias
 * [n_head*head_dim]); attn_k/v [n_embd, n_head_kv*head_dim]; attn_output
 * [n_head*head_dim, n_embd]; attn_sinks [n_head]; ffn_gate_inp [n_embd, n_expert]
 * (+ bias [n_expert]); ffn_gate/up_exps [n_embd, n_ff_exp, n_expert] (+ bias
 * [n_ff_exp, n_expert]); ffn_down_exps [n_ff_exp, n_embd, n_expert] (+ bias
 * [n_embd, n_expert]).
 *
 * Keys besides the common ones: attention.sliding_window (required),
 * rope.scaling.type ("yarn"), rope.scaling.factor,
 * rope.scaling.original_context_length, optionally rope.scaling.yarn_beta_fast
 * / _slow and attention.sliding_window_pattern (2 when present: the layer
 * pattern is fixed, as in llama.cpp and HF). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define GPTOSS_SWIGLU_ALPHA 1.702f /* HF GptOssConfig.swiglu_alpha */
#define GPTOSS_SWIGLU_LIMIT 7.0f   /* HF GptOssConfig.swiglu_limit */

typedef struct gptoss_layer {
    tm_weight attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, sinks;
    tm_weight ffn_norm, router, router_b, gate_exps, up_exps, down_exps, gate_b, up_b, down_b;
    tm_moe_experts experts;
} gptoss_layer;

typedef struct gptoss_weights {
    tm_weight token_embd, output_norm, output;
    gptoss_layer *layers;
    tm_moe_router_params router;
    float rope_freq[TM_MODEL_MAX_HEAD_DIM / 2]; /* YaRN inverse frequencies */
    float rope_mscale;
} gptoss_weights;

/* YaRN's inverse frequencies and attention factor (see the header comment). */
static tm_status gptoss_rope_load(tm_model *m, gptoss_weights *w) {
    const tm_model_config *c = &m->cfg;
    const char *path = m->file->path;
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", m->arch->name);
    tm_gguf_str type = {0};
    tm_status st;
    if ((st = gguf_file_get_str(m->file, key, &type)))
        return tm_error_wrap(st, "%s: gpt-oss needs YaRN RoPE", path);
    if (!gguf_str_eq(type, "yarn"))
        return tm_error_set(TM_ERR_UNSUPPORTED, "%s: key %s is '%.*s', gpt-oss uses 'yarn'", path,
                            key, (int)(type.len > 32 ? 32 : type.len), type.data);
    /* the numbers were read and checked with the other keys (model_hparams_load) */
    const double factor = c->rope_factor;
    model_rope_yarn(c->rope_base, factor, c->rope_orig_ctx, c->yarn_beta_fast, c->yarn_beta_slow,
                    c->head_dim, false, w->rope_freq);
    w->rope_mscale = factor > 1 ? (float)(0.1 * log(factor) + 1.0) : 1.0f;
    return TM_OK;
}

static tm_status gptoss_layer_bind(tm_model *m, uint32_t l, gptoss_layer *L) {
    const tm_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim, F = c->n_ff_exp, X = c->n_expert;
    char name[96];
    tm_status st;
#define BIND(field, suffix, nd, ...)                                                               \
    (snprintf(name, sizeof(name), "blk.%u." suffix, l),                                            \
     model_weight_bind(m, name, nd, (int64_t[]){__VA_ARGS__}, &L->field))
    if ((st = BIND(attn_norm, "attn_norm.weight", 1, E)) ||
        (st = BIND(wq, "attn_q.weight", 2, E, Q)) || (st = BIND(bq, "attn_q.bias", 1, Q)) ||
        (st = BIND(wk, "attn_k.weight", 2, E, KV)) || (st = BIND(bk, "attn_k.bias", 1, KV)) ||
        (st = BIND(wv, "attn_v.weight", 2, E, KV)) || (st = BIND(bv, "attn_v.bias", 1, KV)) ||
        (st = BIND(wo, "attn_output.weight", 2, Q, E)) ||
        (st = BIND(bo, "attn_output.bias", 1, E)) ||
        (st = BIND(sinks, "attn_sinks.weight", 1, c->n_head)) ||
        (st = BIND(ffn_norm, "post_attention_norm.weight", 1, E)) ||
        (st = BIND(router, "ffn_gate_inp.weight", 2, E, X)) ||
        (st = BIND(router_b, "ffn_gate_inp.bias", 1, X)) ||
        (st = BIND(gate_exps, "ffn_gate_exps.weight", 3, E, F, X)) ||
        (st = BIND(up_exps, "ffn_up_exps.weight", 3, E, F, X)) ||
        (st = BIND(down_exps, "ffn_down_exps.weight", 3, F, E, X)) ||
        (st = BIND(gate_b, "ffn_gate_exps.bias", 2, F, X)) ||
        (st = BIND(up_b, "ffn_up_exps.bias", 2, F, X)) ||
        (st = BIND(down_b, "ffn_down_exps.bias", 2, E, X)))
        return st;
#undef BIND
    const tm_weight *vectors[] = {&L->attn_norm, &L->bq,    &L->bk,       &L->bv,
                                  &L->bo,        &L->sinks, &L->ffn_norm, &L->router_b,
                                  &L->gate_b,    &L->up_b,  &L->down_b};
    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++)
        if ((st = model_weight_f32(m, vectors[i]))) return st;
    L->experts = model_moe_experts(&L->gate_exps, &L->up_exps, &L->down_exps, &L->router);
    L->experts.act = TM_MOE_ACT_SWIGLU_OAI;
    L->experts.act_alpha = GPTOSS_SWIGLU_ALPHA, L->experts.act_limit = GPTOSS_SWIGLU_LIMIT;
    L->experts.gate_bias = (const float *)L->gate_b.data;
    L->experts.up_bias = (const float *)L->up_b.data;
    L->experts.down_bias = (const float *)L->down_b.data;
    L->experts.router_bias = (const float *)L->router_b.data;
    return TM_OK;
}

static tm_status gptoss_load(tm_model *m) {
    tm_model_config *c = &m->cfg;
    tm_status st = model_hparams_load(m); /* the window and YaRN keys, too */
    if (st) return st;

    gptoss_weights *w = calloc(1, sizeof(*w));
    if (!w || !(w->layers = calloc(c->n_layer, sizeof(gptoss_layer)))) {
        free(w);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    m->weights = w;
    if (!(m->window = calloc(c->n_layer, sizeof(int64_t))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    if ((st = gptoss_rope_load(m, w))) return st;
    if (!gguf_file_find_tensor(m->file, "output.weight")) /* gpt-oss never ties them */
        return tm_error_set(TM_ERR_FORMAT, "%s: missing tensor 'output.weight'", m->file->path);
    if ((st = model_io_bind(m, &w->token_embd, &w->output_norm, &w->output))) return st;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        if ((st = gptoss_layer_bind(m, l, &w->layers[l]))) return st;
        m->window[l] = l % 2 == 0 ? c->window : 0; /* the KV caches are sized by it, too */
    }
    /* softmax over the k largest logits: the weights sum to 1 already */
    w->router = (tm_moe_router_params){.gating = TM_MOE_GATING_SOFTMAX_TOPK,
                                       .n_expert = c->n_expert,
                                       .n_used = c->n_expert_used,
                                       .norm_topk = false,
                                       .scale = 1.0f};
    return TM_OK;
}

static void gptoss_unload(tm_model *m) {
    gptoss_weights *w = m->weights;
    free(w->layers);
    free(w);
    m->weights = NULL;
}

static tm_status gptoss_state_create(tm_context *ctx) {
    const tm_model_config *c = &ctx->model->cfg;
    gptoss_weights *w = ctx->model->weights;
    const tm_weight **qkv = calloc((size_t)c->n_layer * 3, sizeof(*qkv));
    tm_tier_layer *tl = calloc(c->n_layer, sizeof(*tl));
    tm_status st = TM_OK;
    if (!qkv || !tl) st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->n_layer && st == TM_OK; l++) {
        const gptoss_layer *L = &w->layers[l];
        qkv[3 * l] = &L->wq, qkv[3 * l + 1] = &L->wk, qkv[3 * l + 2] = &L->wv;
        tl[l] = (tm_tier_layer){.experts = L->experts,
                                .gate = &L->gate_exps,
                                .up = &L->up_exps,
                                .down = &L->down_exps,
                                .router = &L->router,
                                .router_bias = &L->router_b};
    }
    if (st == TM_OK) st = model_moe_state_create(ctx, qkv, tl, &w->router, w->rope_freq);
    free(qkv), free(tl);
    return st;
}

#define DO MODEL_DO

static tm_status gptoss_layer_forward(tm_context *ctx, uint32_t l, int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const gptoss_weights *w = ctx->model->weights;
    const gptoss_layer *L = &w->layers[l];
    tm_moe_acts *s = ctx->state;
    tm_exec *e = ctx->exec;
    const float eps = c->rms_eps;
    const tm_attn_desc attn = {.n_head = c->n_head,
                               .n_head_kv = c->n_head_kv,
                               .head_dim = c->head_dim,
                               .scale = 1.0f / sqrtf((float)c->head_dim),
                               .rope_base = c->rope_base,
                               .sinks = &L->sinks,
                               .window = ctx->model->window[l],
                               .rope_freq = w->rope_freq,
                               .rope_mscale = w->rope_mscale};

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
    DO(exec_attention(e, l, &attn, &s->q, &s->k, &s->v, &s->att)); /* YaRN RoPE, sinks, window */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul(e, &s->attn_out, &L->wo, &s->att));
    DO(exec_add_bias(e, &s->attn_out, &L->bo)); /* Wo att + bo */
    DO(exec_emit(e, "attn_out", (int)l, &s->attn_out, n_tok));

    /* mixture of experts */
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_add_rmsnorm(e, &s->x, &s->attn_out, &s->h, &L->ffn_norm, eps)); /* x += ...;
                                                h = rmsnorm(x) * post_attention_norm */
    DO(exec_part(e, TM_PROF_ROUTER));
    DO(exec_matmul(e, &s->router_logits, &L->router, &s->h));
    DO(exec_add_bias(e, &s->router_logits, &L->router_b)); /* W_router h + b_router */
    DO(exec_part(e, TM_PROF_EXPERTS));
    DO(tier_moe(ctx->tier, l, &s->router_logits, &s->h, &s->topk_ids, &s->topk_w, &s->x,
                &s->ffn_out)); /* x += Σ_k p_k · (down_k(act(gate_k h + bg, up_k h + bu)) + bd) */
    DO(model_moe_emit(ctx, l, s, n_tok));
    return TM_OK;
}

static tm_status gptoss_forward(tm_context *ctx, int64_t n_tok, bool all_logits) {
    const tm_model_config *c = &ctx->model->cfg;
    const gptoss_weights *w = ctx->model->weights;
    tm_moe_acts *s = ctx->state;
    tm_exec *e = ctx->exec;

    DO(exec_embed(e, &s->x, &w->token_embd)); /* x = token_embd[tok] */
    for (uint32_t l = 0; l < c->n_layer; l++) DO(gptoss_layer_forward(ctx, l, n_tok));

    /* logits = W_out · (rmsnorm(x) * output_norm), of the last token or of all */
    DO(model_logits_forward(ctx, s, &w->output_norm, &w->output, n_tok, all_logits));
    return TM_OK;
}

const tm_arch tm_arch_gptoss = {
    .name = "gpt-oss",
    .load = gptoss_load,
    .unload = gptoss_unload,
    .state_create = gptoss_state_create,
    .state_free = model_moe_state_free,
    .forward = gptoss_forward,
};
