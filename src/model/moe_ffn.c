/* The FFN half of a layer of glm4moe and deepseek2 (model.h: tm_ffn_layer):
 *
 *   dense layer (l < leading_dense_block_count):  x += down(silu(gate h) ⊙ up h)
 *   MoE layer:  x += down_sh(silu(gate_sh h) ⊙ up_sh h)      the shared experts, unweighted
 *               x += Σ_k w_k · down_k(silu(gate_k h) ⊙ up_k h)  the routed experts, by the tier,
 *                                                              the router's ids and weights
 *
 * Shapes (ne order): ffn_gate/up [n_embd, feed_forward_length], ffn_down the reverse;
 * ffn_gate_inp [n_embd, n_expert]; exp_probs_b.bias [n_expert]; ffn_gate/up_exps [n_embd,
 * n_ff_exp, n_expert], ffn_down_exps [n_ff_exp, n_embd, n_expert]; ffn_gate/up_shexp [n_embd,
 * n_ff_exp · expert_shared_count], ffn_down_shexp the reverse. */
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"

tm_status model_nextn_split(tm_model *m, uint32_t *n_block) {
    tm_model_config *c = &m->cfg;
    *n_block = c->n_layer;
    c->n_layer = *n_block - c->n_nextn; /* the layers that run */
    if (c->n_dense >= c->n_layer)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: key %s.leading_dense_block_count is %u, expected fewer than the "
                            "%u layers that run (%s.block_count %u less %u NextN layers)",
                            m->file->path, m->arch->name, c->n_dense, c->n_layer, m->arch->name,
                            *n_block, c->n_nextn);
    return TM_OK;
}

tm_status model_layers_bind(tm_model *m, uint32_t n_block, void *layers, size_t size,
                            model_layer_bind_fn bind) {
    void *nextn = calloc(1, size); /* a NextN layer's: checked, then dropped */
    if (!nextn) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    tm_status st = TM_OK;
    for (uint32_t l = 0; l < n_block && st == TM_OK; l++) {
        if (l < m->cfg.n_layer)
            st = bind(m, l, (char *)layers + (size_t)l * size);
        else if ((st = bind(m, l, nextn)) == TM_OK)
            st = model_nextn_bind(m, l);
        else
            st = tm_error_wrap(st, "NextN layer %u (%s.nextn_predict_layers)", l, m->arch->name);
    }
    free(nextn);
    return st;
}

tm_status model_ffn_bind(const tm_model *m, uint32_t l, bool sel_bias_required, tm_ffn_layer *F) {
    const tm_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, X = c->n_expert, FE = c->n_ff_exp,
                  FS = (int64_t)c->n_ff_exp * c->n_shexp;
    char name[96];
    tm_status st;
#define BIND(field, suffix, nd, ...)                                                               \
    (snprintf(name, sizeof(name), "blk.%u." suffix, l),                                            \
     model_weight_bind(m, name, nd, (int64_t[]){__VA_ARGS__}, &F->field))
    F->dense = l < c->n_dense;
    if (F->dense)
        return (st = BIND(ffn_gate, "ffn_gate.weight", 2, E, c->n_ff)) ||
                       (st = BIND(ffn_up, "ffn_up.weight", 2, E, c->n_ff)) ||
                       (st = BIND(ffn_down, "ffn_down.weight", 2, c->n_ff, E))
                   ? st
                   : TM_OK;
    char bias[96];
    snprintf(bias, sizeof(bias), "blk.%u.exp_probs_b.bias", l);
    if ((st = BIND(router, "ffn_gate_inp.weight", 2, E, X)) ||
        (st = sel_bias_required
                  ? model_weight_bind(m, bias, 1, (int64_t[]){X}, &F->sel_bias)
                  : model_weight_bind_optional(m, bias, 1, (int64_t[]){X}, &F->sel_bias)) ||
        (st = BIND(gate_exps, "ffn_gate_exps.weight", 3, E, FE, X)) ||
        (st = BIND(up_exps, "ffn_up_exps.weight", 3, E, FE, X)) ||
        (st = BIND(down_exps, "ffn_down_exps.weight", 3, FE, E, X)))
        return st;
    if (c->n_shexp && ((st = BIND(sh_gate, "ffn_gate_shexp.weight", 2, E, FS)) ||
                       (st = BIND(sh_up, "ffn_up_shexp.weight", 2, E, FS)) ||
                       (st = BIND(sh_down, "ffn_down_shexp.weight", 2, FS, E))))
        return st;
#undef BIND
    F->experts = model_moe_experts(&F->gate_exps, &F->up_exps, &F->down_exps, &F->router);
    return model_weight_f32(m, &F->sel_bias);
}

tm_status model_ffn_router_load(const tm_model *m, tm_moe_router_params *r) {
    const tm_model_config *c = &m->cfg;
    bool norm = false; /* a bool key: absent, no renormalisation */
    char key[96];
    snprintf(key, sizeof(key), "%s.expert_weights_norm", m->arch->name);
    tm_status st;
    if (gguf_file_find_kv(m->file, key) && (st = gguf_file_get_bool(m->file, key, &norm)))
        return st;
    *r = (tm_moe_router_params){.gating = c->gating_func == 1 ? TM_MOE_GATING_SOFTMAX
                                                              : TM_MOE_GATING_SIGMOID,
                                .n_expert = c->n_expert,
                                .n_used = c->n_expert_used,
                                .norm_topk = norm,
                                .scale = c->expert_scale,
                                .n_group = c->n_group,
                                .n_group_used = c->n_group_used};
    char what[1024]; /* the file's path and the keys */
    snprintf(what, sizeof(what), "%s: keys %s.expert_*", m->file->path, m->arch->name);
    return moe_router_check(r, what);
}

tm_status model_ffn_acts_create(tm_context *ctx, tm_ffn_acts *a) {
    const tm_model_config *c = &ctx->model->cfg;
    tm_exec *e = ctx->exec;
    const int64_t FS = (int64_t)c->n_ff_exp * (c->n_shexp ? c->n_shexp : 1);
    tm_status st;
    if ((st = exec_act_create(e, &a->ff_g, "dense_gate", c->n_ff, false, 0)) ||
        (st = exec_act_create(e, &a->ff_u, "dense_up", c->n_ff, false, 0)) ||
        (st = exec_act_create(e, &a->sh_g, "shexp_gate", FS, false, 0)) ||
        (st = exec_act_create(e, &a->sh_u, "shexp_up", FS, false, 0)) ||
        (st = exec_act_create(e, &a->ff_out, "ff_out", c->n_embd, false, 0)))
        return st;
    return TM_OK;
}

tm_status model_ffn_setup(tm_exec *e, const tm_ffn_layer *F, tm_tier_layer *tl) {
    /* products of one input, stacked on the GPU at decode */
    const tm_weight *dn[] = {&F->ffn_gate, &F->ffn_up}, *sh[] = {&F->sh_gate, &F->sh_up};
    if (F->dense) return exec_weight_group(e, 2, dn); /* no part in the tier */
    tm_status st = F->sh_gate.data ? exec_weight_group(e, 2, sh) : TM_OK;
    *tl = (tm_tier_layer){.experts = F->experts,
                          .gate = &F->gate_exps,
                          .up = &F->up_exps,
                          .down = &F->down_exps,
                          .router = &F->router,
                          .sel_bias = F->sel_bias.data ? &F->sel_bias : NULL};
    return st;
}

#define DO MODEL_DO

/* y = down(silu(gate h) ⊙ up h): a dense FFN (a dense layer's, or the shared experts') */
static tm_status ffn_swiglu(tm_exec *e, const tm_weight *gate, const tm_weight *up,
                            const tm_weight *down, tm_act *g, tm_act *u, tm_act *h, tm_act *y) {
    DO(exec_matmul_n(e, 2, (tm_act *const[]){g, u}, (const tm_weight *const[]){gate, up}, h));
    DO(exec_swiglu(e, g, g, u));
    DO(exec_matmul(e, y, down, g));
    return TM_OK;
}

tm_status model_ffn_forward(tm_context *ctx, uint32_t l, const tm_ffn_layer *F, tm_ffn_acts *a,
                            tm_moe_acts *s, int64_t n_tok) {
    tm_exec *e = ctx->exec;
    DO(exec_part(e, TM_PROF_EXPERTS));
    if (F->dense) { /* x += down(silu(gate h) ⊙ up h) */
        DO(ffn_swiglu(e, &F->ffn_gate, &F->ffn_up, &F->ffn_down, &a->ff_g, &a->ff_u, &s->h,
                      &a->ff_out));
        DO(exec_add(e, &s->x, &a->ff_out));
        DO(exec_emit(e, "dense_out", (int)l, &a->ff_out, n_tok));
        DO(exec_emit(e, "x_out", (int)l, &s->x, n_tok));
        return TM_OK;
    }
    if (F->sh_gate.data) { /* x += down_sh(silu(gate_sh h) ⊙ up_sh h), unweighted */
        DO(ffn_swiglu(e, &F->sh_gate, &F->sh_up, &F->sh_down, &a->sh_g, &a->sh_u, &s->h,
                      &a->ff_out));
        DO(exec_add(e, &s->x, &a->ff_out));
        DO(exec_emit(e, "shexp_out", (int)l, &a->ff_out, n_tok));
    }
    DO(exec_part(e, TM_PROF_ROUTER));
    DO(exec_matmul(e, &s->router_logits, &F->router, &s->h)); /* W_router h */
    DO(exec_part(e, TM_PROF_EXPERTS));
    DO(tier_moe(ctx->tier, l, &s->router_logits, &s->h, &s->topk_ids, &s->topk_w, &s->x,
                &s->ffn_out)); /* x += Σ_k w_k · down_k(silu(gate_k h) ⊙ up_k h) */
    DO(model_moe_emit(ctx, l, s, n_tok));
    return TM_OK;
}
