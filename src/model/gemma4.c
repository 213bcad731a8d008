/* Gemma 4's Mixture-of-Experts text model (architecture `gemma4`, e.g.
 * gemma-4-26B-A4B) as llama.cpp's converter stores it; the math of
 * transformers' modeling_gemma4.py (Gemma4TextModel with enable_moe_block):
 *
 *   x = token_embd[tok] · sqrt(n_embd)
 *   for each layer l (sliding or global: attention.sliding_window_pattern):
 *       h = rmsnorm(x) * attn_norm
 *       q = Wq h, k = Wk h, v = Wv h   (a global layer without attn_v: v = k, K is V)
 *       q, k = rmsnorm(q) * q_norm, rmsnorm(k) * k_norm   per head
 *       v = rmsnorm(v)                                     per head, no gain
 *       q, k = rope_neox(q), rope_neox(k)  pairs (i, i + D/2) of the whole head at
 *              pos · base^(-2i/D): sliding layers D = key_length_swa, base freq_base_swa;
 *              global layers D = key_length, base freq_base, each angle / rope_freqs[i]
 *              (the converter's form of HF's proportional RoPE: 1 for the turned pairs,
 *              1e30 for the rest)
 *       a = Wo · softmax(q kᵀ, causal; sliding layers: the last sliding_window keys) v
 *              grouped-query heads, scale 1 (the QK norms stand for 1/sqrt(D)); a layer's
 *              own KV heads (attention.head_count_kv[l]) and head size
 *       x += rmsnorm(a) * post_attention_norm
 *       d  = down(gelu_tanh(gate h2) ⊙ up h2),  h2 = rmsnorm(x) * ffn_norm     the dense MLP
 *       r  = W_router (rmsnorm(x) * ffn_gate_inp.scale) · n_embd^-0.5          router logits
 *       p  = softmax(r); the top-k ids; w_k = p_k / Σ p · ffn_down_exps.scale[id_k]
 *       m  = Σ_k w_k · down_k(gelu_tanh(gate_k h3) ⊙ up_k h3), h3 = rmsnorm(x) * pre_ffw_norm_2
 *       x += rmsnorm(rmsnorm(d) * post_ffw_norm_1 + rmsnorm(m) * post_ffw_norm_2) * post_ffw_norm
 *       x *= layer_output_scale
 *   logits = cap · tanh(W_out (rmsnorm(x) * output_norm) / cap)   (cap: final_logit_softcapping;
 *            W_out token_embd's when the file has no output.weight)
 *
 * Every rmsnorm here multiplies by its weight as stored (Gemma 4's norms have no 1 + w; the
 * converter adds nothing). GELU is its tanh form (gelu_pytorch_tanh).
 *
 * Shapes (ne order; D, KV the layer's head size and KV heads): attn_q [n_embd, n_head D];
 * attn_k, attn_v [n_embd, KV D]; attn_output [n_head D, n_embd]; attn_q_norm, attn_k_norm
 * [D]; ffn_gate, ffn_up [n_embd, n_ff]; ffn_down [n_ff, n_embd]; ffn_gate_inp [n_embd,
 * n_expert] and .scale [n_embd]; ffn_gate_up_exps [n_embd, 2 n_ff_exp, n_expert] (gate rows,
 * then up rows); ffn_down_exps [n_ff_exp, n_embd, n_expert] and .scale [n_expert];
 * layer_output_scale [1]; the seven norms [n_embd]; rope_freqs [key_length / 2].
 *
 * Not run (refused by their keys): per-layer input embeddings and layers sharing KV (the
 * small dense E2B / E4B models), a double-wide MLP (an array feed_forward_length). A layer runs
 * where the placement puts it (exec_attention_setup_layers: each layer's own heads, KV heads
 * and RoPE table, on the CPU or the GPU). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"

typedef struct g4_layer {
    bool sliding, k_eq_v;
    int64_t n_head_kv, head_dim;
    float out_scale; /* layer_output_scale */
    tm_weight attn_norm, wq, wk, wv, wo, q_norm, k_norm, post_attn_norm;
    tm_weight ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffw_norm_1;
    tm_weight router, router_scale, expert_scale, pre_ffw_norm_2, gate_up_exps, down_exps;
    tm_weight post_ffw_norm_2, post_ffw_norm, out_scale_w;
    tm_moe_experts experts;
} g4_layer;

typedef struct g4_weights {
    tm_weight token_embd, output_norm, output, rope_freqs;
    g4_layer *layers;
    float *rope_freq; /* [key_length / 2] the global layers' inverse frequencies */
    tm_moe_router_params router;
} g4_weights;

typedef struct g4_acts {
    tm_moe_acts m;                /* first (model_moe_acts_create): q, k, v, att global-sized */
    tm_act q_s, k_s, v_s, att_s;  /* the sliding layers' */
    tm_act h2, ff_g, ff_u, dense; /* the dense MLP's input, gate, up, output */
    tm_act d1, e2, hr;            /* normed MLP and experts' outputs, the router's input */
} g4_acts;

/* attention.head_count_kv: an array of one count a layer, or one count for all. */
static tm_status g4_kv_heads(tm_model *m, uint32_t l, int64_t *out) {
    char key[96];
    snprintf(key, sizeof(key), "%s.attention.head_count_kv", m->arch->name);
    const tm_gguf_kv *kv = gguf_file_find_kv(m->file, key);
    uint32_t v = 0;
    tm_status st = TM_OK;
    if (kv && kv->value.type == TM_GGUF_TYPE_ARRAY) {
        const tm_gguf_array *a = &kv->value.v.arr;
        if (a->n != m->cfg.n_layer || a->elem_type > TM_GGUF_TYPE_INT32) /* 8..32-bit ints */
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: key %s: an array of %llu, expected %u integers (one a layer)",
                                m->file->path, key, (unsigned long long)a->n, m->cfg.n_layer);
        v = gguf_array_get_u32(a, l);
    } else if ((st = gguf_file_get_u32(m->file, key, &v))) {
        return st;
    }
    if (v < 1 || m->cfg.n_head % v)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: key %s: layer %u has %u KV heads, expected a divisor of the %u "
                            "heads",
                            m->file->path, key, l, v, m->cfg.n_head);
    *out = v;
    return TM_OK;
}

/* attention.sliding_window_pattern: a bool a layer (true: sliding). */
static tm_status g4_sliding(tm_model *m, uint32_t l, bool *out) {
    char key[96];
    snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", m->arch->name);
    const tm_gguf_array *a;
    tm_status st = gguf_file_get_array(m->file, key, &a);
    if (st) return st;
    if (a->n != m->cfg.n_layer || a->elem_type != TM_GGUF_TYPE_BOOL)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: key %s: %llu values, expected %u bools (one a "
                            "layer)",
                            m->file->path, key, (unsigned long long)a->n, m->cfg.n_layer);
    *out = ((const uint8_t *)a->data)[l] != 0;
    return TM_OK;
}

static tm_status g4_layer_bind(tm_model *m, uint32_t l, g4_layer *L) {
    const tm_model_config *c = &m->cfg;
    tm_status st;
    if ((st = g4_sliding(m, l, &L->sliding)) || (st = g4_kv_heads(m, l, &L->n_head_kv))) return st;
    const int64_t E = c->n_embd, D = L->sliding ? c->head_dim_swa : c->head_dim,
                  Q = (int64_t)c->n_head * D, KV = L->n_head_kv * D, FF = c->n_ff, F = c->n_ff_exp,
                  X = c->n_expert;
    L->head_dim = D;
    char name[96];
#define BIND(field, suffix, nd, ...)                                                               \
    (snprintf(name, sizeof(name), "blk.%u." suffix, l),                                            \
     model_weight_bind(m, name, nd, (int64_t[]){__VA_ARGS__}, &L->field))
    if ((st = BIND(attn_norm, "attn_norm.weight", 1, E)) ||
        (st = BIND(wq, "attn_q.weight", 2, E, Q)) || (st = BIND(wk, "attn_k.weight", 2, E, KV)) ||
        (st = BIND(wo, "attn_output.weight", 2, Q, E)) ||
        (st = BIND(q_norm, "attn_q_norm.weight", 1, D)) ||
        (st = BIND(k_norm, "attn_k_norm.weight", 1, D)) ||
        (st = BIND(post_attn_norm, "post_attention_norm.weight", 1, E)) ||
        (st = BIND(ffn_norm, "ffn_norm.weight", 1, E)) ||
        (st = BIND(ffn_gate, "ffn_gate.weight", 2, E, FF)) ||
        (st = BIND(ffn_up, "ffn_up.weight", 2, E, FF)) ||
        (st = BIND(ffn_down, "ffn_down.weight", 2, FF, E)) ||
        (st = BIND(post_ffw_norm_1, "post_ffw_norm_1.weight", 1, E)) ||
        (st = BIND(router, "ffn_gate_inp.weight", 2, E, X)) ||
        (st = BIND(router_scale, "ffn_gate_inp.scale", 1, E)) ||
        (st = BIND(expert_scale, "ffn_down_exps.scale", 1, X)) ||
        (st = BIND(pre_ffw_norm_2, "pre_ffw_norm_2.weight", 1, E)) ||
        (st = BIND(gate_up_exps, "ffn_gate_up_exps.weight", 3, E, 2 * F, X)) ||
        (st = BIND(down_exps, "ffn_down_exps.weight", 3, F, E, X)) ||
        (st = BIND(post_ffw_norm_2, "post_ffw_norm_2.weight", 1, E)) ||
        (st = BIND(post_ffw_norm, "post_ffw_norm.weight", 1, E)) ||
        (st = BIND(out_scale_w, "layer_output_scale.weight", 1, 1)))
        return st;
    /* a global layer without attn_v takes K as V (HF's attention_k_eq_v); a sliding one has it */
    snprintf(name, sizeof(name), "blk.%u.attn_v.weight", l);
    if (L->sliding ? (st = model_weight_bind(m, name, 2, (int64_t[]){E, KV}, &L->wv))
                   : (st = model_weight_bind_optional(m, name, 2, (int64_t[]){E, KV}, &L->wv)))
        return tm_error_wrap(st, "sliding layer %u (its value has a projection of its own): ", l);
    L->k_eq_v = !L->wv.data;
#undef BIND
    const tm_weight *f32[] = {&L->attn_norm,       &L->q_norm,        &L->k_norm,
                              &L->post_attn_norm,  &L->ffn_norm,      &L->post_ffw_norm_1,
                              &L->router_scale,    &L->expert_scale,  &L->pre_ffw_norm_2,
                              &L->post_ffw_norm_2, &L->post_ffw_norm, &L->out_scale_w};
    for (size_t i = 0; i < sizeof(f32) / sizeof(f32[0]); i++)
        if ((st = model_weight_f32(m, f32[i]))) return st;
    L->out_scale = *(const float *)L->out_scale_w.data;
    if (!isfinite(L->out_scale))
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: blk.%u.layer_output_scale.weight is %g, expected a "
                            "finite number",
                            m->file->path, l, (double)L->out_scale);
    /* the fused gate and up: expert e's gate rows, then its up rows */
    const tm_weight *gu = &L->gate_up_exps, *dn = &L->down_exps;
    const size_t stride = gu->row_bytes * (size_t)(2 * F);
    L->experts = (tm_moe_experts){
        .n_embd = E,
        .n_ff = F,
        .act = TM_MOE_ACT_GEGLU,
        .gate = {gu->data, gu->type, stride, gu->row_bytes},
        .up = {gu->data + gu->row_bytes * (size_t)F, gu->type, stride, gu->row_bytes},
        .down = {dn->data, dn->type, dn->row_bytes * (size_t)E, dn->row_bytes},
        /* the prediction of --moe-ahead (and the SSD tier's reads ahead): this router on the
           previous layer's experts' input, an approximation (the router reads its own norm
           of x, with the gains of ffn_gate_inp.scale; the ranking ignores its positive
           n_embd^-0.5) */
        .router = L->router.type == TM_TYPE_F32 ? (const float *)L->router.data : NULL,
    };
    return TM_OK;
}

/* The global layers' RoPE: base^(-2i/D) / rope_freqs[i] (absent: / 1). */
static tm_status g4_rope_load(tm_model *m, g4_weights *w) {
    const tm_model_config *c = &m->cfg;
    const int64_t half = c->head_dim / 2;
    tm_status st =
        model_weight_bind_optional(m, "rope_freqs.weight", 1, (int64_t[]){half}, &w->rope_freqs);
    if (st || (st = model_weight_f32(m, &w->rope_freqs))) return st;
    if (!(w->rope_freq = malloc((size_t)half * sizeof(float))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    const float *ff = (const float *)w->rope_freqs.data;
    for (int64_t i = 0; i < half; i++) {
        const double f = ff ? ff[i] : 1.0;
        if (!(f > 0) || !isfinite(f))
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: rope_freqs.weight[%lld] is %g, expected a "
                                "positive finite factor",
                                m->file->path, (long long)i, f);
        w->rope_freq[i] =
            (float)(pow((double)c->rope_base, -2.0 * (double)i / (double)c->head_dim) / f);
    }
    return TM_OK;
}

static tm_status g4_load(tm_model *m) {
    tm_model_config *c = &m->cfg;
    tm_status st = model_hparams_load(m);
    if (st) return st;
    g4_weights *w = calloc(1, sizeof(*w));
    if (!w || !(w->layers = calloc(c->n_layer, sizeof(g4_layer)))) {
        free(w);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    m->weights = w;
    if (!(m->window = calloc(c->n_layer, sizeof(int64_t))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    if ((st = model_io_bind(m, &w->token_embd, &w->output_norm, &w->output)) ||
        (st = g4_rope_load(m, w)))
        return st;
    bool any_global = false;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        g4_layer *L = &w->layers[l];
        if ((st = g4_layer_bind(m, l, L))) return st;
        m->window[l] = L->sliding ? c->window : 0; /* the KV caches are sized by it, too */
        if (!L->sliding) {
            /* the executor's acts q, k, v are the global layers' (one KV count among them) */
            if (any_global && L->n_head_kv != c->n_head_kv)
                return tm_error_set(TM_ERR_FORMAT,
                                    "%s: key %s.attention.head_count_kv: global layers with %u "
                                    "and %lld KV heads (expected one count)",
                                    m->file->path, m->arch->name, c->n_head_kv,
                                    (long long)L->n_head_kv);
            c->n_head_kv = (uint32_t)L->n_head_kv, any_global = true;
        }
    }
    if (!any_global) c->n_head_kv = (uint32_t)w->layers[0].n_head_kv;
    /* softmax, top-k, renormalised, each times its expert's factor (per layer: the tier) */
    w->router = (tm_moe_router_params){.gating = TM_MOE_GATING_SOFTMAX,
                                       .n_expert = c->n_expert,
                                       .n_used = c->n_expert_used,
                                       .norm_topk = true,
                                       .scale = 1.0f};
    char what[1024];
    snprintf(what, sizeof(what), "%s: keys %s.expert_*", m->file->path, m->arch->name);
    return moe_router_check(&w->router, what);
}

static void g4_unload(tm_model *m) {
    g4_weights *w = m->weights;
    free(w->layers);
    free(w->rope_freq);
    free(w);
    m->weights = NULL;
}

static tm_attn_desc g4_attn(const tm_model_config *c, const g4_weights *w, const g4_layer *L,
                            int64_t window) {
    return (tm_attn_desc){.n_head = c->n_head,
                          .n_head_kv = L->n_head_kv,
                          .head_dim = L->head_dim,
                          .scale = 1.0f,
                          .rms_eps = c->rms_eps,
                          .rope_base = L->sliding ? c->rope_base_swa : c->rope_base,
                          .q_norm = &L->q_norm,
                          .k_norm = &L->k_norm,
                          .window = window,
                          .rope_freq = L->sliding ? NULL : w->rope_freq,
                          .v_norm = true,
                          .v_is_k = L->k_eq_v};
}

static tm_status g4_state_create(tm_context *ctx) {
    const tm_model *m = ctx->model;
    const tm_model_config *c = &m->cfg;
    const g4_weights *w = m->weights;
    tm_exec *e = ctx->exec;
    g4_acts *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    ctx->state = s;
    const int64_t E = c->n_embd, Qs = (int64_t)c->n_head * c->head_dim_swa;
    int64_t KVs = 0;
    for (uint32_t l = 0; l < c->n_layer; l++)
        if (w->layers[l].sliding && w->layers[l].n_head_kv * c->head_dim_swa > KVs)
            KVs = w->layers[l].n_head_kv * c->head_dim_swa;
    tm_status st;
    if ((st = model_moe_acts_create(ctx, &s->m)) ||
        (st = exec_act_create(e, &s->q_s, "q_swa", Qs, false, 0)) ||
        (st = exec_act_create(e, &s->k_s, "k_swa", KVs ? KVs : 2, false, 0)) ||
        (st = exec_act_create(e, &s->v_s, "v_swa", KVs ? KVs : 2, false, 0)) ||
        (st = exec_act_create(e, &s->att_s, "att_swa", Qs, false, 0)) ||
        (st = exec_act_create(e, &s->h2, "ffn_in", E, false, 0)) ||
        (st = exec_act_create(e, &s->ff_g, "dense_gate", c->n_ff, false, 0)) ||
        (st = exec_act_create(e, &s->ff_u, "dense_up", c->n_ff, false, 0)) ||
        (st = exec_act_create(e, &s->dense, "dense_out", E, false, 0)) ||
        (st = exec_act_create(e, &s->d1, "dense_normed", E, false, 0)) ||
        (st = exec_act_create(e, &s->e2, "experts_normed", E, false, 0)) ||
        (st = exec_act_create(e, &s->hr, "router_in", E, false, 0)))
        return st;
    tm_tier_layer *tl = calloc(c->n_layer, sizeof(*tl));
    tm_attn_desc *shapes = calloc(c->n_layer, sizeof(*shapes));
    if (!tl || !shapes) st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->n_layer && st == TM_OK; l++) {
        const g4_layer *L = &w->layers[l];
        const tm_weight *qkv[] = {&L->wq, &L->wk, &L->wv}, *gu[] = {&L->ffn_gate, &L->ffn_up};
        if ((st = exec_weight_group(e, L->k_eq_v ? 2 : 3, qkv)) ||
            (st = exec_weight_group(e, 2, gu)))
            break;
        shapes[l] = g4_attn(c, w, L, m->window[l]);
        tl[l] = (tm_tier_layer){.experts = L->experts,
                                .gate = &L->gate_up_exps,
                                .up = &L->gate_up_exps,
                                .down = &L->down_exps,
                                .router = &L->router, /* a prediction: see g4_layer_bind */
                                .expert_scale = &L->expert_scale};
    }
    if (st == TM_OK && (st = exec_attention_setup_layers(e, c->n_layer, ctx->placement.layer_dev,
                                                         shapes, m->window)) == TM_OK)
        st = model_moe_state_finish_tier(ctx, tl, &w->router);
    free(tl);
    free(shapes);
    return st;
}

static void g4_state_free(tm_context *ctx) {
    free(ctx->state);
    ctx->state = NULL;
}

#define DO MODEL_DO

static tm_status g4_layer_forward(tm_context *ctx, uint32_t l, int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const g4_weights *w = ctx->model->weights;
    const g4_layer *L = &w->layers[l];
    g4_acts *a = ctx->state;
    tm_moe_acts *s = &a->m;
    tm_exec *e = ctx->exec;
    const float eps = c->rms_eps;
    const tm_attn_desc attn = g4_attn(c, w, L, ctx->model->window[l]);
    tm_act *q = L->sliding ? &a->q_s : &s->q, *k = L->sliding ? &a->k_s : &s->k,
           *v = L->sliding ? &a->v_s : &s->v, *att = L->sliding ? &a->att_s : &s->att;

    /* attention */
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm(e, &s->h, &s->x, &L->attn_norm, eps)); /* h = rmsnorm(x) * attn_norm */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    if (L->k_eq_v) /* q, k = W h; v is k */
        DO(exec_matmul_n(e, 2, (tm_act *const[]){q, k}, (const tm_weight *const[]){&L->wq, &L->wk},
                         &s->h));
    else
        DO(exec_matmul_n(e, 3, (tm_act *const[]){q, k, v},
                         (const tm_weight *const[]){&L->wq, &L->wk, &L->wv}, &s->h));
    DO(exec_part(e, TM_PROF_ATTENTION));
    DO(exec_attention(e, l, &attn, q, k, L->k_eq_v ? NULL : v, att)); /* QK norms, v norm, RoPE */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul(e, &s->attn_out, &L->wo, att));
    DO(exec_emit(e, "attn_out", (int)l, &s->attn_out, n_tok));
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm(e, &s->h, &s->attn_out, &L->post_attn_norm, eps));
    DO(exec_add_rmsnorm(e, &s->x, &s->h, &a->h2, &L->ffn_norm, eps)); /* x += rmsnorm(a) ...;
                                                                          h2 = rmsnorm(x) ... */
    /* the dense MLP */
    DO(exec_part(e, TM_PROF_EXPERTS));
    DO(exec_matmul_n(e, 2, (tm_act *const[]){&a->ff_g, &a->ff_u},
                     (const tm_weight *const[]){&L->ffn_gate, &L->ffn_up}, &a->h2));
    DO(exec_geglu(e, &a->ff_g, &a->ff_g, &a->ff_u));
    DO(exec_matmul(e, &a->dense, &L->ffn_down, &a->ff_g));
    DO(exec_emit(e, "dense_out", (int)l, &a->dense, n_tok));
    DO(exec_rmsnorm(e, &a->d1, &a->dense, &L->post_ffw_norm_1, eps));
    /* the router and the experts, on the residual before the MLP */
    DO(exec_part(e, TM_PROF_ROUTER));
    DO(exec_rmsnorm(e, &a->hr, &s->x, &L->router_scale, eps));
    DO(exec_matmul(e, &s->router_logits, &L->router, &a->hr));
    DO(exec_scale(e, &s->router_logits, 1.0f / sqrtf((float)c->n_embd)));
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm(e, &a->h2, &s->x, &L->pre_ffw_norm_2, eps));
    DO(exec_part(e, TM_PROF_EXPERTS));
    DO(tier_moe(ctx->tier, l, &s->router_logits, &a->h2, &s->topk_ids, &s->topk_w, NULL,
                &s->ffn_out)); /* ffn_out = Σ_k w_k · down_k(gelu_tanh(gate_k h3) ⊙ up_k h3) */
    DO(exec_emit(e, "router_logits", (int)l, &s->router_logits, n_tok));
    DO(exec_emit(e, "topk_ids", (int)l, &s->topk_ids, n_tok));
    DO(exec_emit(e, "topk_weights", (int)l, &s->topk_w, n_tok));
    DO(exec_emit(e, "ffn_out", (int)l, &s->ffn_out, n_tok));
    /* x += rmsnorm(d1 + rmsnorm(m) * post_ffw_norm_2) * post_ffw_norm; x *= layer scale */
    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm(e, &a->e2, &s->ffn_out, &L->post_ffw_norm_2, eps));
    DO(exec_add(e, &a->d1, &a->e2));
    DO(exec_rmsnorm(e, &s->h, &a->d1, &L->post_ffw_norm, eps));
    DO(exec_add(e, &s->x, &s->h));
    DO(exec_scale(e, &s->x, L->out_scale));
    DO(exec_emit(e, "x_out", (int)l, &s->x, n_tok));
    return TM_OK;
}

static tm_status g4_forward(tm_context *ctx, int64_t n_tok, bool all_logits) {
    const tm_model_config *c = &ctx->model->cfg;
    const g4_weights *w = ctx->model->weights;
    g4_acts *a = ctx->state;
    tm_moe_acts *s = &a->m;
    tm_exec *e = ctx->exec;

    DO(exec_part(e, TM_PROF_EMBED));
    DO(exec_embed(e, &s->x, &w->token_embd)); /* x = token_embd[tok] · sqrt(n_embd) */
    DO(exec_scale(e, &s->x, sqrtf((float)c->n_embd)));
    for (uint32_t l = 0; l < c->n_layer; l++) DO(g4_layer_forward(ctx, l, n_tok));
    /* logits = cap tanh(W_out (rmsnorm(x) * output_norm) / cap) */
    int64_t first, rows;
    DO(exec_part(e, TM_PROF_OUTPUT));
    DO(exec_rmsnorm(e, &s->h, &s->x, &w->output_norm, c->rms_eps));
    DO(model_logits_rows(ctx, &s->h, n_tok, all_logits, &first, &rows));
    DO(exec_matmul_rows(e, &s->logits, &w->output, &s->h, first, rows));
    if (c->logit_softcap > 0) DO(exec_softcap(e, &s->logits, rows, c->logit_softcap));
    DO(exec_fetch(e, &s->logits, rows));
    DO(exec_emit(e, "logits", -1, &s->logits, rows));
    return TM_OK;
}

const tm_arch tm_arch_gemma4 = {
    .name = "gemma4",
    .load = g4_load,
    .unload = g4_unload,
    .state_create = g4_state_create,
    .state_free = g4_state_free,
    .forward = g4_forward,
};
