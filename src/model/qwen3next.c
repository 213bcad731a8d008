/* Qwen3-Next (qwen3next: Qwen3-Next-80B-A3B) and Qwen3.5/3.6 MoE (qwen35moe)
 * as llama.cpp's converter stores them: hybrid models whose layers are
 * mostly linear attention (Gated DeltaNet), every full_attention_interval-th
 * one gated softmax attention, each followed by a MoE with a shared expert.
 * All norm gains are stored as they multiply (the converter adds HF's 1).
 *
 *   x = token_embd[tok]
 *   for each layer:
 *       h = rmsnorm(x) * attn_norm
 *       linear attention (layer l with (l + 1) % full_attention_interval != 0):
 *           qkv, z = W_qkv h, W_gate h                      qkv: q, k (n_k heads), v (n_v heads)
 *           b, a   = W_ba h (qwen3next: per key head its value heads' b, then a)
 *                  | W_beta h, W_alpha h (qwen35moe)
 *           qkv = silu(conv1d_causal(qkv, ssm_conv1d))     width ssm.conv_kernel, state per sequence
 *           q, k = l2norm(q) / sqrt(d_k), l2norm(k)          per head
 *           β = sigmoid(b),  g = ssm_a · softplus(a + ssm_dt.bias)
 *           per value head (its key head: h / (n_v/n_k) grouped (qwen3next), h % n_k tiled (qwen35moe)):
 *               S = e^g S;  S += k ⊗ β (v - Sᵀ k);  o = Sᵀ q       the state S [d_k][d_v] per sequence
 *           o = rmsnorm(o) * ssm_norm * silu(z)              per value head
 *           x += W_ssm_out o
 *       gated full attention (the others):
 *           q, gate = W_q h                                  per head: head_dim of q, then of gate
 *           k, v = W_k h, W_v h
 *           q, k = rope_neox(rmsnorm(q) * q_norm), rope_neox(rmsnorm(k) * k_norm)
 *                                                          the first rope.dimension_count values
 *           x += W_o (softmax(q kᵀ / sqrt(head_dim), causal) v ⊙ sigmoid(gate))
 *       h = rmsnorm(x) * post_attention_norm
 *       x += sigmoid(w_gate_shexp · h) · down_shexp(silu(gate_shexp h) ⊙ up_shexp h)   shared expert
 *       p = softmax(W_router h); the top-k experts, p renormalised to sum 1
 *       x += Σ_k p_k · down_k(silu(gate_k h) ⊙ up_k h)                                 routed experts
 *   logits = W_out · (rmsnorm(x) * output_norm)
 *
 * The shared expert is dense: it runs where its weights are, like attention;
 * the routed experts are the tier's (src/tier/tier.h). Linear attention's
 * states are the executor's (exec_ssm_setup): a prompt's end is checkpointed
 * and a sequence can be cut back only to there (exec_ssm_keep). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef struct qnext_layer {
    bool linear;
    tm_weight attn_norm, post_norm;
    /* linear attention */
    tm_weight wqkv, wgate, wba, wbeta, walpha, conv, ssm_a, ssm_dt, ssm_norm, ssm_out;
    /* full attention */
    tm_weight wq, wk, wv, wo, q_norm, k_norm;
    /* MoE */
    tm_weight router, gate_exps, up_exps, down_exps;
    tm_weight sh_gate_inp, sh_gate, sh_up, sh_down;
    tm_moe_experts experts;
} qnext_layer;

typedef struct qnext_weights {
    bool fused_ba; /* qwen3next: ssm_ba; qwen35moe: ssm_beta and ssm_alpha */
    tm_weight token_embd, output_norm, output;
    qnext_layer *layers;
    tm_moe_router_params router;
    tm_ssm_desc ssm; /* its weights unset: each layer's */
} qnext_weights;

/* The activations: the MoE decoder's, then linear attention's and the gates'. */
typedef struct qnext_acts {
    tm_moe_acts m; /* first: model_moe_* take the state as a tm_moe_acts */
    tm_act qkv, z, b, a, core, qg, gate, sh_g, sh_u, sh_s, sh_out;
} qnext_acts;

static bool qnext_has(const tm_model *m, uint32_t l, const char *suffix) {
    char name[96];
    snprintf(name, sizeof(name), "blk.%u.%s", l, suffix);
    return gguf_file_find_tensor(m->file, name) != NULL;
}

/* Which layers are linear attention (layers[l].linear): the key
 * attention.recurrent_layers (a bool a layer) when the file has it, else every
 * layer but each full_attention_interval-th. key: the key it went by. */
static tm_status qnext_pattern(const tm_model *m, qnext_layer *layers, char *key, size_t key_len) {
    const tm_model_config *c = &m->cfg;
    snprintf(key, key_len, "%s.attention.recurrent_layers", m->arch->name);
    if (!gguf_file_find_kv(m->file, key)) {
        snprintf(key, key_len, "%s.full_attention_interval", m->arch->name);
        for (uint32_t l = 0; l < c->n_layer; l++)
            layers[l].linear = (l + 1) % c->full_attn_interval != 0;
        return TM_OK;
    }
    const tm_gguf_array *a;
    tm_status st = gguf_file_get_array(m->file, key, &a);
    if (st) return st;
    if (a->elem_type != TM_GGUF_TYPE_BOOL || a->n != c->n_layer)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: key %s is an array of %llu %s, expected %u bools "
                            "(one a layer)",
                            m->file->path, key, (unsigned long long)a->n,
                            gguf_value_type_name(a->elem_type), c->n_layer);
    for (uint32_t l = 0; l < c->n_layer; l++) layers[l].linear = ((const uint8_t *)a->data)[l] != 0;
    return TM_OK;
}

static tm_status qnext_load(tm_model *m) {
    tm_model_config *c = &m->cfg;
    tm_status st = model_hparams_load(m);
    if (st) return st;
    const char *path = m->file->path;
    qnext_weights *w = calloc(1, sizeof(*w));
    if (!w || !(w->layers = calloc(c->n_layer, sizeof(qnext_layer)))) {
        free(w);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    m->weights = w;
    w->fused_ba = !strcmp(m->arch->name, "qwen3next");
    const int64_t E = c->n_embd, D = c->head_dim, Q = (int64_t)c->n_head * D,
                  KV = (int64_t)c->n_head_kv * D, Hk = c->ssm_group, Hv = c->ssm_dt_rank,
                  dk = c->ssm_state, dv = c->ssm_inner / c->ssm_dt_rank, CH = 2 * Hk * dk + Hv * dv,
                  K = c->ssm_conv, FS = c->n_ff_shexp;
    w->ssm = (tm_ssm_desc){.conv_k = K,
                           .n_k_head = Hk,
                           .n_v_head = Hv,
                           .k_dim = dk,
                           .v_dim = dv,
                           .v_tiled = !w->fused_ba};
    if ((st = model_io_bind(m, &w->token_embd, &w->output_norm, &w->output))) return st;
    if (!(m->window = calloc(c->n_layer, sizeof(int64_t))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");

    char pattern_key[96];
    if ((st = qnext_pattern(m, w->layers, pattern_key, sizeof(pattern_key)))) return st;

    for (uint32_t l = 0; l < c->n_layer; l++) {
        qnext_layer *L = &w->layers[l];
        char name[96];
        /* the layer pattern key against the tensors */
        const bool has_lin = qnext_has(m, l, "attn_qkv.weight"),
                   has_full = qnext_has(m, l, "attn_q.weight");
        if (has_lin == has_full || has_lin != L->linear)
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: layer %u has %s, but key %s makes it %s attention (linear: "
                                "blk.%u.attn_qkv.weight, full: blk.%u.attn_q.weight)",
                                path, l,
                                has_lin && has_full ? "both attn_qkv and attn_q"
                                : has_lin           ? "attn_qkv (linear attention)"
                                : has_full          ? "attn_q (full attention)"
                                                    : "neither attn_qkv nor attn_q",
                                pattern_key, L->linear ? "linear" : "full", l, l);
        m->window[l] = L->linear ? EXEC_NO_ATTENTION : 0;
#define BIND(field, suffix, nd, ...)                                                               \
    (snprintf(name, sizeof(name), "blk.%u." suffix, l),                                            \
     model_weight_bind(m, name, nd, (int64_t[]){__VA_ARGS__}, &L->field))
        if ((st = BIND(attn_norm, "attn_norm.weight", 1, E)) ||
            (st = BIND(post_norm, "post_attention_norm.weight", 1, E)))
            return st;
        if (L->linear) {
            if ((st = BIND(wqkv, "attn_qkv.weight", 2, E, CH)) ||
                (st = BIND(wgate, "attn_gate.weight", 2, E, Hv * dv)) ||
                (st = BIND(conv, "ssm_conv1d.weight", 2, K, CH)) ||
                (st = BIND(ssm_a, "ssm_a", 1, Hv)) || (st = BIND(ssm_dt, "ssm_dt.bias", 1, Hv)) ||
                (st = BIND(ssm_norm, "ssm_norm.weight", 1, dv)) ||
                (st = BIND(ssm_out, "ssm_out.weight", 2, Hv * dv, E)))
                return st;
            if (w->fused_ba ? (st = BIND(wba, "ssm_ba.weight", 2, E, 2 * Hv))
                            : ((st = BIND(wbeta, "ssm_beta.weight", 2, E, Hv)) ||
                               (st = BIND(walpha, "ssm_alpha.weight", 2, E, Hv))))
                return st;
            const tm_weight *f[] = {&L->conv, &L->ssm_a, &L->ssm_dt, &L->ssm_norm};
            for (size_t i = 0; i < 4; i++)
                if ((st = model_weight_f32(m, f[i]))) return st;
        } else {
            if ((st = BIND(wq, "attn_q.weight", 2, E, 2 * Q)) ||
                (st = BIND(wk, "attn_k.weight", 2, E, KV)) ||
                (st = BIND(wv, "attn_v.weight", 2, E, KV)) ||
                (st = BIND(wo, "attn_output.weight", 2, Q, E)) ||
                (st = BIND(q_norm, "attn_q_norm.weight", 1, D)) ||
                (st = BIND(k_norm, "attn_k_norm.weight", 1, D)) ||
                (st = model_weight_f32(m, &L->q_norm)) || (st = model_weight_f32(m, &L->k_norm)))
                return st;
        }
        if ((st = BIND(router, "ffn_gate_inp.weight", 2, E, c->n_expert)) ||
            (st = BIND(gate_exps, "ffn_gate_exps.weight", 3, E, c->n_ff_exp, c->n_expert)) ||
            (st = BIND(up_exps, "ffn_up_exps.weight", 3, E, c->n_ff_exp, c->n_expert)) ||
            (st = BIND(down_exps, "ffn_down_exps.weight", 3, c->n_ff_exp, E, c->n_expert)) ||
            (st = BIND(sh_gate_inp, "ffn_gate_inp_shexp.weight", 1, E)) ||
            (st = BIND(sh_gate, "ffn_gate_shexp.weight", 2, E, FS)) ||
            (st = BIND(sh_up, "ffn_up_shexp.weight", 2, E, FS)) ||
            (st = BIND(sh_down, "ffn_down_shexp.weight", 2, FS, E)) ||
            (st = model_weight_f32(m, &L->attn_norm)) || (st = model_weight_f32(m, &L->post_norm)))
            return st;
#undef BIND
        /* the shared expert's gate is one row: a product of one output */
        L->sh_gate_inp.n_dims = 2, L->sh_gate_inp.ne[1] = 1;
        L->experts = model_moe_experts(&L->gate_exps, &L->up_exps, &L->down_exps, &L->router);
    }
    w->router = (tm_moe_router_params){.gating = TM_MOE_GATING_SOFTMAX,
                                       .n_expert = c->n_expert,
                                       .n_used = c->n_expert_used,
                                       .norm_topk = true,
                                       .scale = 1.0f};
    return TM_OK;
}

static void qnext_unload(tm_model *m) {
    qnext_weights *w = m->weights;
    free(w->layers);
    free(w);
    m->weights = NULL;
}

static tm_status qnext_state_create(tm_context *ctx) {
    const tm_model_config *c = &ctx->model->cfg;
    const qnext_weights *w = ctx->model->weights;
    tm_exec *e = ctx->exec;
    qnext_acts *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    ctx->state = s;
    const int64_t Hv = w->ssm.n_v_head, dv = w->ssm.v_dim,
                  CH = 2 * w->ssm.n_k_head * w->ssm.k_dim + Hv * dv,
                  Q = (int64_t)c->n_head * c->head_dim;
    tm_status st;
    if ((st = model_moe_acts_create(ctx, &s->m)) ||
        (st = exec_act_create(e, &s->qkv, "qkv", CH, false, 0)) ||
        (st = exec_act_create(e, &s->z, "z", Hv * dv, false, 0)) ||
        (st = exec_act_create(e, &s->b, "ssm_b", w->fused_ba ? 2 * Hv : Hv, false, 0)) ||
        (!w->fused_ba && (st = exec_act_create(e, &s->a, "ssm_a", Hv, false, 0))) ||
        (st = exec_act_create(e, &s->core, "lin_core", Hv * dv, false, 0)) ||
        (st = exec_act_create(e, &s->qg, "q_gate", 2 * Q, false, 0)) ||
        (st = exec_act_create(e, &s->gate, "attn_gate", Q, false, 0)) ||
        (st = exec_act_create(e, &s->sh_g, "shexp_gate", c->n_ff_shexp, false, 0)) ||
        (st = exec_act_create(e, &s->sh_u, "shexp_up", c->n_ff_shexp, false, 0)) ||
        (st = exec_act_create(e, &s->sh_s, "shexp_scale", 1, false, 0)) ||
        (st = exec_act_create(e, &s->sh_out, "shexp_out", c->n_embd, false, 0)))
        return st;
    bool *ssm = calloc(c->n_layer, sizeof(bool));
    tm_tier_layer *tl = calloc(c->n_layer, sizeof(*tl));
    if (!ssm || !tl) st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->n_layer && st == TM_OK; l++) {
        const qnext_layer *L = &w->layers[l];
        ssm[l] = L->linear;
        tl[l] = (tm_tier_layer){.experts = L->experts,
                                .gate = &L->gate_exps,
                                .up = &L->up_exps,
                                .down = &L->down_exps,
                                .router = &L->router,
                                .router_bias = NULL};
        /* products of one input, stacked on the GPU at decode */
        const tm_weight *in[] = {&L->wqkv, &L->wgate}, *kv[] = {&L->wk, &L->wv},
                        *sh[] = {&L->sh_gate, &L->sh_up};
        st = L->linear ? exec_weight_group(e, 2, in) : exec_weight_group(e, 2, kv);
        if (st == TM_OK) st = exec_weight_group(e, 2, sh);
    }
    if (st == TM_OK) st = model_moe_state_finish(ctx, tl, &w->router, NULL, ssm, &w->ssm);
    free(ssm), free(tl);
    return st;
}

static void qnext_state_free(tm_context *ctx) {
    free(ctx->state);
    ctx->state = NULL;
}

#define DO MODEL_DO

/* o = W_ssm_out (rmsnorm(delta_rule(conv(W_qkv h))) * ssm_norm * silu(W_gate h)) */
static tm_status qnext_linear_attention(tm_context *ctx, uint32_t l, int64_t n_tok) {
    const qnext_weights *w = ctx->model->weights;
    const qnext_layer *L = &w->layers[l];
    qnext_acts *s = ctx->state;
    tm_exec *e = ctx->exec;
    tm_ssm_desc d = w->ssm;
    d.conv = &L->conv, d.a = &L->ssm_a, d.dt_bias = &L->ssm_dt;

    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul_n(e, 2, (tm_act *const[]){&s->qkv, &s->z},
                     (const tm_weight *const[]){&L->wqkv, &L->wgate}, &s->m.h)); /* qkv, z */
    if (w->fused_ba)
        DO(exec_matmul(e, &s->b, &L->wba, &s->m.h)); /* b and a, per key head */
    else
        DO(exec_matmul_n(e, 2, (tm_act *const[]){&s->b, &s->a},
                         (const tm_weight *const[]){&L->wbeta, &L->walpha}, &s->m.h));
    DO(exec_part(e, TM_PROF_ATTENTION));
    DO(exec_ssm_conv(e, l, &d, &s->qkv)); /* qkv = silu(conv1d(qkv)) */
    DO(exec_delta_rule(e, l, &d, &s->qkv, &s->b, w->fused_ba ? &s->b : &s->a, w->fused_ba,
                       &s->core)); /* the gated delta rule per value head */
    DO(exec_emit(e, "lin_core", (int)l, &s->core, n_tok));
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm_gated(e, &s->core, &s->z, &L->ssm_norm, ctx->model->cfg.rms_eps));
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul(e, &s->m.attn_out, &L->ssm_out, &s->core));
    return TM_OK;
}

/* o = W_o (attention(q, k, v) ⊙ sigmoid(gate)) */
static tm_status qnext_full_attention(tm_context *ctx, uint32_t l) {
    const tm_model_config *c = &ctx->model->cfg;
    const qnext_layer *L = &((const qnext_weights *)ctx->model->weights)->layers[l];
    qnext_acts *s = ctx->state;
    tm_exec *e = ctx->exec;
    const tm_attn_desc attn = {.n_head = c->n_head,
                               .n_head_kv = c->n_head_kv,
                               .head_dim = c->head_dim,
                               .scale = 1.0f / sqrtf((float)c->head_dim),
                               .rms_eps = c->rms_eps,
                               .rope_base = c->rope_base,
                               .q_norm = &L->q_norm,
                               .k_norm = &L->k_norm,
                               .n_rot = c->n_rot};

    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul(e, &s->qg, &L->wq, &s->m.h));
    DO(exec_unzip(e, &s->qg, c->n_head, &s->m.q, &s->gate)); /* per head: q, then its gate */
    DO(exec_matmul_n(e, 2, (tm_act *const[]){&s->m.k, &s->m.v},
                     (const tm_weight *const[]){&L->wk, &L->wv}, &s->m.h));
    DO(exec_part(e, TM_PROF_ATTENTION));
    DO(exec_attention(e, l, &attn, &s->m.q, &s->m.k, &s->m.v, &s->m.att));
    DO(exec_gate_mul(e, &s->m.att, &s->gate)); /* ⊙ sigmoid(gate) */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul(e, &s->m.attn_out, &L->wo, &s->m.att));
    return TM_OK;
}

static tm_status qnext_layer_forward(tm_context *ctx, uint32_t l, int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const qnext_layer *L = &((const qnext_weights *)ctx->model->weights)->layers[l];
    qnext_acts *s = ctx->state;
    tm_exec *e = ctx->exec;
    const float eps = c->rms_eps;

    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm(e, &s->m.h, &s->m.x, &L->attn_norm, eps)); /* h = rmsnorm(x) * attn_norm */
    DO(L->linear ? qnext_linear_attention(ctx, l, n_tok) : qnext_full_attention(ctx, l));
    DO(exec_emit(e, "attn_out", (int)l, &s->m.attn_out, n_tok));

    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_add_rmsnorm(e, &s->m.x, &s->m.attn_out, &s->m.h, &L->post_norm,
                        eps)); /* x += attention; h = rmsnorm(x) * post_attention_norm */

    /* the shared expert: x += sigmoid(w · h) down(silu(gate h) ⊙ up h) */
    DO(exec_part(e, TM_PROF_EXPERTS));
    DO(exec_matmul_n(e, 2, (tm_act *const[]){&s->sh_g, &s->sh_u},
                     (const tm_weight *const[]){&L->sh_gate, &L->sh_up}, &s->m.h));
    DO(exec_swiglu(e, &s->sh_g, &s->sh_g, &s->sh_u));
    DO(exec_matmul(e, &s->sh_out, &L->sh_down, &s->sh_g));
    DO(exec_matmul(e, &s->sh_s, &L->sh_gate_inp, &s->m.h));
    DO(exec_gate_add(e, &s->m.x, &s->sh_out, &s->sh_s));
    DO(exec_emit(e, "shexp_out", (int)l, &s->sh_out, n_tok));

    /* the routed experts */
    DO(exec_part(e, TM_PROF_ROUTER));
    DO(exec_matmul(e, &s->m.router_logits, &L->router, &s->m.h)); /* W_router h */
    DO(exec_part(e, TM_PROF_EXPERTS));
    DO(tier_moe(ctx->tier, l, &s->m.router_logits, &s->m.h, &s->m.topk_ids, &s->m.topk_w, &s->m.x,
                &s->m.ffn_out)); /* x += Σ_k p_k · down_k(silu(gate_k h) ⊙ up_k h) */
    DO(model_moe_emit(ctx, l, &s->m, n_tok));
    return TM_OK;
}

static tm_status qnext_forward(tm_context *ctx, int64_t n_tok, bool all_logits) {
    const tm_model_config *c = &ctx->model->cfg;
    const qnext_weights *w = ctx->model->weights;
    qnext_acts *s = ctx->state;
    tm_exec *e = ctx->exec;

    DO(exec_embed(e, &s->m.x, &w->token_embd)); /* x = token_embd[tok] */
    for (uint32_t l = 0; l < c->n_layer; l++) DO(qnext_layer_forward(ctx, l, n_tok));
    DO(model_logits_forward(ctx, &s->m, &w->output_norm, &w->output, n_tok, all_logits));
    return TM_OK;
}

const tm_arch tm_arch_qwen3next = {
    .name = "qwen3next",
    .load = qnext_load,
    .unload = qnext_unload,
    .state_create = qnext_state_create,
    .state_free = qnext_state_free,
    .forward = qnext_forward,
};

const tm_arch tm_arch_qwen35moe = {
    .name = "qwen35moe",
    .load = qnext_load,
    .unload = qnext_unload,
    .state_create = qnext_state_create,
    .state_free = qnext_state_free,
    .forward = qnext_forward,
};
