/* DeepSeek-V2 / V3 / R1 and Kimi K2 (architecture `deepseek2`) as llama.cpp's
 * converter stores them: Multi-head Latent Attention (MLA), leading dense
 * layers, then MoE layers with shared experts and a router as glm4moe's.
 *
 *   x = token_embd[tok]
 *   for each layer l (the first leading_dense_block_count dense):
 *       h = rmsnorm(x) * attn_norm
 *       q = Wq_b (rmsnorm(Wq_a h) * q_a_norm)     [n_head][nope + rope]  (no q_lora_rank: Wq h)
 *       [c ; k_pe] = Wkv_a h                       c: kv_lora_rank, k_pe: rope (one, all heads)
 *       c = rmsnorm(c) * kv_a_norm                 the latent the cache keeps
 *       q_pe, k_pe = rope(q_pe), rope(k_pe)        interleaved pairs (2i, 2i + 1) as the converter
 *                                                  leaves them (HF rope_interleave), YaRN frequencies
 *       HF:  k_nope[h] = W_kb[h]ᵀ c,  v[h] = W_vb[h] c,  k[h] = [k_nope[h] ; k_pe]
 *            att[h] = softmax(q[h] · k[h] · scale, causal) · v[h]
 *       here, absorbed (the same sums in another order):
 *            q_lat[h] = W_kb[h] q_nope[h]          attn_k_b [nope, kv_lora, n_head]
 *            o_lat[h] = softmax([q_lat[h] ; q_pe[h]] · [c ; k_pe] · scale, causal) · c
 *                                                  one KV head of kv_lora + rope values whose
 *                                                  value is its first kv_lora values
 *            att[h] = W_vb[h] o_lat[h]             attn_v_b [kv_lora, v_head, n_head]
 *       scale = mscale² / sqrt(nope + rope),  mscale = 1 + yarn_log_multiplier · ln(factor)
 *                                                  (HF: yarn_get_mscale(factor, mscale_all_dim))
 *       x += Wo att
 *       h = rmsnorm(x) * ffn_norm
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
 * The KV cache holds, per position and layer, c and the turned k_pe: kv_lora + rope values
 * (DeepSeek-V3: 512 + 64 = 576), not 2 · n_head · head values. Every batch runs the absorbed
 * form (exec_attention's latent desc, exec_matmul_heads).
 *
 * YaRN (rope.scaling.type "yarn"; absent or "none": plain RoPE) over the rope values:
 * model_rope_yarn with HF's truncate (DeepSeek's default); the cos/sin factor is 1 (HF:
 * get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), and the file keeps only
 * mscale_all_dim, as yarn_log_multiplier = 0.1 · mscale_all_dim, as llama.cpp takes it).
 *
 * The last nextn_predict_layers of block_count are NextN layers: checked (a layer's tensors
 * and model_nextn_bind's), never run.
 *
 * Shapes (ne order): attn_q_a [n_embd, q_lora], attn_q_a_norm [q_lora], attn_q_b [q_lora,
 * n_head (nope + rope)] (or attn_q [n_embd, n_head (nope + rope)]); attn_kv_a_mqa [n_embd,
 * kv_lora + rope]; attn_kv_a_norm [kv_lora]; attn_k_b [nope, kv_lora, n_head]; attn_v_b
 * [kv_lora, v_head, n_head]; attn_output [n_head v_head, n_embd]; the FFNs as glm4moe's
 * (moe_ffn.c; ffn_norm for its post_attention_norm). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef struct ds_layer {
    tm_weight attn_norm, wq, wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b, wo, ffn_norm;
    tm_ffn_layer ffn; /* dense, or shared and routed experts (moe_ffn.c) */
} ds_layer;

typedef struct ds_weights {
    tm_weight token_embd, output_norm, output;
    ds_layer *layers;
    tm_moe_router_params router;
    float rope_freq[TM_MODEL_MAX_HEAD_DIM / 2]; /* YaRN's over the rope values */
    bool yarn;
    float scale; /* the softmax's */
} ds_weights;

typedef struct ds_acts {
    tm_moe_acts m;     /* first: model_moe_acts_create; its q is [c ; k_pe]-shaped per head
                             (q_lat, q_pe) and its k the layer's [c ; k_pe] */
    tm_act qa, qa_n;   /* q's low rank, normed */
    tm_act q_full;     /* [n_head][nope + rope] */
    tm_act o_lat, att; /* [n_head][kv_lora], [n_head][v_head] */
    tm_ffn_acts ffn;
} ds_acts;

/* Layer l's tensors (a NextN layer's too). */
static tm_status ds_layer_bind(tm_model *m, uint32_t l, void *layer) {
    ds_layer *L = layer;
    const tm_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, H = c->n_head, DK = c->head_dim_mla, DV = c->v_head_dim_mla,
                  R = c->n_rot, NOPE = DK - R, KVL = c->n_lora_kv, QL = c->n_lora_q;
    char name[96];
    tm_status st;
#define BIND(field, suffix, nd, ...)                                                               \
    (snprintf(name, sizeof(name), "blk.%u." suffix, l),                                            \
     model_weight_bind(m, name, nd, (int64_t[]){__VA_ARGS__}, &L->field))
    if ((st = BIND(attn_norm, "attn_norm.weight", 1, E))) return st;
    if (QL) {
        if ((st = BIND(wq_a, "attn_q_a.weight", 2, E, QL)) ||
            (st = BIND(q_a_norm, "attn_q_a_norm.weight", 1, QL)) ||
            (st = BIND(wq_b, "attn_q_b.weight", 2, QL, H * DK)))
            return tm_error_wrap(st, "%s.attention.q_lora_rank %u", m->arch->name, c->n_lora_q);
    } else if ((st = BIND(wq, "attn_q.weight", 2, E, H * DK))) {
        return tm_error_wrap(st, "no %s.attention.q_lora_rank", m->arch->name);
    }
    if ((st = BIND(wkv_a, "attn_kv_a_mqa.weight", 2, E, KVL + R)) ||
        (st = BIND(kv_a_norm, "attn_kv_a_norm.weight", 1, KVL)) ||
        (st = BIND(wk_b, "attn_k_b.weight", 3, NOPE, KVL, H)) ||
        (st = BIND(wv_b, "attn_v_b.weight", 3, KVL, DV, H)))
        return tm_error_wrap(st,
                             "%s.attention.kv_lora_rank %u, key_length_mla %u, "
                             "value_length_mla %u, rope.dimension_count %u",
                             m->arch->name, c->n_lora_kv, c->head_dim_mla, c->v_head_dim_mla,
                             c->n_rot);
    if ((st = BIND(wo, "attn_output.weight", 2, H * DV, E)) ||
        (st = BIND(ffn_norm, "ffn_norm.weight", 1, E)))
        return st; /* the selection bias: DeepSeek-V3's sigmoid router has it (V2's softmax none) */
    if ((st = model_ffn_bind(m, l, c->gating_func != 1, &L->ffn))) return st;
#undef BIND
    const tm_weight *f32[] = {&L->attn_norm, &L->q_a_norm, &L->kv_a_norm, &L->ffn_norm};
    for (size_t i = 0; i < sizeof(f32) / sizeof(f32[0]); i++)
        if ((st = model_weight_f32(m, f32[i]))) return st;
    return TM_OK;
}

/* The MLA widths the keys give, and how they relate (beyond hparams.c's ranges). */
static tm_status ds_check_widths(const tm_model *m) {
    const tm_model_config *c = &m->cfg;
    const char *path = m->file->path, *a = m->arch->name;
    if (c->n_head_kv != 1)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: key %s.attention.head_count_kv is %u, expected 1 (MLA: one "
                            "latent KV head)",
                            path, a, c->n_head_kv);
    if (c->head_dim != c->n_lora_kv + c->n_rot)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: key %s.attention.key_length is %u, expected %s.attention."
                            "kv_lora_rank %u + %s.rope.dimension_count %u (the latent key)",
                            path, a, c->head_dim, a, c->n_lora_kv, a, c->n_rot);
    if (c->n_rot > TM_MODEL_MAX_HEAD_DIM)
        return tm_error_set(TM_ERR_FORMAT, "%s: key %s.rope.dimension_count is %u, at most %d",
                            path, a, c->n_rot, TM_MODEL_MAX_HEAD_DIM);
    return TM_OK;
}

/* RoPE: plain, or YaRN over the rope values; the softmax scale with YaRN's mscale. */
static tm_status ds_rope_load(tm_model *m, ds_weights *w) {
    const tm_model_config *c = &m->cfg;
    const char *path = m->file->path;
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", m->arch->name);
    tm_gguf_str type = {0};
    tm_status st;
    if (gguf_file_find_kv(m->file, key) && (st = gguf_file_get_str(m->file, key, &type))) return st;
    w->yarn = type.len && gguf_str_eq(type, "yarn");
    if (type.len && !w->yarn && !gguf_str_eq(type, "none"))
        return tm_error_set(TM_ERR_UNSUPPORTED, "%s: key %s is '%.*s', expected 'yarn' or 'none'",
                            path, key, (int)(type.len > 32 ? 32 : type.len), type.data);
    double mscale = 1;
    if (w->yarn) {
        static const char *const need[] = {"rope.scaling.factor",
                                           "rope.scaling.original_context_length"};
        for (size_t i = 0; i < 2; i++) {
            snprintf(key, sizeof(key), "%s.%s", m->arch->name, need[i]);
            if (!gguf_file_find_kv(m->file, key))
                return tm_error_set(TM_ERR_FORMAT, "%s: missing key %s (YaRN RoPE)", path, key);
        }
        model_rope_yarn(c->rope_base, c->rope_factor, c->rope_orig_ctx, c->yarn_beta_fast,
                        c->yarn_beta_slow, c->n_rot, true, w->rope_freq);
        if (c->rope_factor > 1) mscale = 1.0 + c->yarn_log_mul * log(c->rope_factor);
    }
    w->scale = (float)(mscale * mscale / sqrt((double)c->head_dim_mla));
    return TM_OK;
}

static tm_status ds_load(tm_model *m) {
    tm_model_config *c = &m->cfg;
    const char *path = m->file->path;
    if (gguf_file_find_tensor(m->file, "blk.0.attn_kv_b.weight") &&
        !gguf_file_find_tensor(m->file, "blk.0.attn_k_b.weight"))
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "%s: tensor 'blk.0.attn_kv_b.weight' without attn_k_b / attn_v_b: "
                            "written by an older converter (convert it again with a current "
                            "llama.cpp, which splits kv_b)",
                            path);
    uint32_t n_block;
    tm_status st = model_hparams_load(m);
    if (st || (st = ds_check_widths(m)) || (st = model_nextn_split(m, &n_block))) return st;
    ds_weights *w = calloc(1, sizeof(*w));
    if (!w || !(w->layers = calloc(c->n_layer, sizeof(ds_layer)))) {
        free(w);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    m->weights = w;
    if ((st = model_io_bind(m, &w->token_embd, &w->output_norm, &w->output)) ||
        (st = ds_rope_load(m, w)) ||
        (st = model_layers_bind(m, n_block, w->layers, sizeof(ds_layer), ds_layer_bind)))
        return st;
    return model_ffn_router_load(m, &w->router); /* absent norm: V2's none */
}

static void ds_unload(tm_model *m) {
    ds_weights *w = m->weights;
    free(w->layers);
    free(w);
    m->weights = NULL;
}

/* Latent attention's shape: one KV head of kv_lora + rope values, the value its latent. */
static tm_attn_desc ds_attn_desc(const tm_model_config *c, const ds_weights *w) {
    return (tm_attn_desc){.n_head = c->n_head,
                          .n_head_kv = 1,
                          .head_dim = (int64_t)c->n_lora_kv + c->n_rot,
                          .v_dim = c->n_lora_kv,
                          .latent = true,
                          .n_rot = c->n_rot,
                          .rope_interleaved = true,
                          .rope_base = c->rope_base,
                          .rope_freq = w->yarn ? w->rope_freq : NULL,
                          .scale = w->scale,
                          .rms_eps = c->rms_eps};
}

static tm_status ds_state_create(tm_context *ctx) {
    const tm_model_config *c = &ctx->model->cfg;
    const ds_weights *w = ctx->model->weights;
    tm_exec *e = ctx->exec;
    ds_acts *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    ctx->state = s;
    const int64_t H = c->n_head, QL = c->n_lora_q ? c->n_lora_q : 1;
    tm_status st;
    if ((st = model_moe_acts_create(ctx, &s->m)) ||
        (st = exec_act_create(e, &s->qa, "q_a", QL, false, 0)) ||
        (st = exec_act_create(e, &s->qa_n, "q_a_norm", QL, false, 0)) ||
        (st = exec_act_create(e, &s->q_full, "q_full", H * c->head_dim_mla, false, 0)) ||
        (st = exec_act_create(e, &s->o_lat, "o_lat", H * c->n_lora_kv, false, 0)) ||
        (st = exec_act_create(e, &s->att, "att_heads", H * c->v_head_dim_mla, false, 0)) ||
        (st = model_ffn_acts_create(ctx, &s->ffn)))
        return st;
    tm_tier_layer *tl = calloc(c->n_layer, sizeof(*tl));
    if (!tl) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->n_layer && st == TM_OK; l++) {
        const ds_layer *L = &w->layers[l];
        /* q's and the latent's products of one input, stacked on the GPU at decode */
        const tm_weight *qkv[] = {c->n_lora_q ? &L->wq_a : &L->wq, &L->wkv_a};
        if ((st = exec_weight_group(e, 2, qkv)) || (st = exec_weight_heads(e, &L->wk_b)) ||
            (st = exec_weight_heads(e, &L->wv_b)))
            break;
        st = model_ffn_setup(e, &L->ffn, &tl[l]);
    }
    const tm_attn_desc shape = ds_attn_desc(c, w);
    if (st == TM_OK) st = model_moe_state_finish_attn(ctx, tl, &w->router, &shape, NULL, NULL);
    free(tl);
    return st;
}

static void ds_state_free(tm_context *ctx) {
    free(ctx->state);
    ctx->state = NULL;
}

#define DO MODEL_DO

/* x += Wo · MLA(h) (the header comment's attention, absorbed). */
static tm_status ds_attention(tm_context *ctx, uint32_t l) {
    const tm_model_config *c = &ctx->model->cfg;
    const ds_weights *w = ctx->model->weights;
    const ds_layer *L = &w->layers[l];
    ds_acts *a = ctx->state;
    tm_moe_acts *s = &a->m;
    tm_exec *e = ctx->exec;
    tm_attn_desc attn = ds_attn_desc(c, w);
    attn.k_norm = &L->kv_a_norm;

    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    if (c->n_lora_q) { /* q = Wq_b (rmsnorm(Wq_a h) * q_a_norm); [c ; k_pe] = Wkv_a h */
        DO(exec_matmul_n(e, 2, (tm_act *const[]){&a->qa, &s->k},
                         (const tm_weight *const[]){&L->wq_a, &L->wkv_a}, &s->h));
        DO(exec_rmsnorm(e, &a->qa_n, &a->qa, &L->q_a_norm, c->rms_eps));
        DO(exec_matmul(e, &a->q_full, &L->wq_b, &a->qa_n));
    } else { /* q = Wq h */
        DO(exec_matmul_n(e, 2, (tm_act *const[]){&a->q_full, &s->k},
                         (const tm_weight *const[]){&L->wq, &L->wkv_a}, &s->h));
    }
    DO(exec_matmul_heads(e, &s->q, &L->wk_b, &a->q_full, c->n_rot)); /* [q_lat ; q_pe] */
    DO(exec_part(e, TM_PROF_ATTENTION));
    DO(exec_attention(e, l, &attn, &s->q, &s->k, NULL, &a->o_lat)); /* norm c, RoPE, cache */
    DO(exec_part(e, TM_PROF_ATTN_PROJ));
    DO(exec_matmul_heads(e, &a->att, &L->wv_b, &a->o_lat, 0)); /* att[h] = W_vb[h] o_lat[h] */
    DO(exec_matmul(e, &s->attn_out, &L->wo, &a->att));
    return TM_OK;
}

static tm_status ds_layer_forward(tm_context *ctx, uint32_t l, int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const ds_weights *w = ctx->model->weights;
    const ds_layer *L = &w->layers[l];
    ds_acts *a = ctx->state;
    tm_moe_acts *s = &a->m;
    tm_exec *e = ctx->exec;
    const float eps = c->rms_eps;

    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_rmsnorm(e, &s->h, &s->x, &L->attn_norm, eps)); /* h = rmsnorm(x) * attn_norm */
    DO(ds_attention(ctx, l));
    DO(exec_emit(e, "attn_out", (int)l, &s->attn_out, n_tok));

    DO(exec_part(e, TM_PROF_NORM));
    DO(exec_add_rmsnorm(e, &s->x, &s->attn_out, &s->h, &L->ffn_norm, eps)); /* x += Wo att;
                                                              h = rmsnorm(x) * ffn_norm */
    return model_ffn_forward(ctx, l, &L->ffn, &a->ffn, s, n_tok); /* the header's FFN part */
}

static tm_status ds_forward(tm_context *ctx, int64_t n_tok, bool all_logits) {
    const tm_model_config *c = &ctx->model->cfg;
    const ds_weights *w = ctx->model->weights;
    ds_acts *a = ctx->state;
    tm_exec *e = ctx->exec;

    DO(exec_embed(e, &a->m.x, &w->token_embd)); /* x = token_embd[tok] */
    for (uint32_t l = 0; l < c->n_layer; l++) DO(ds_layer_forward(ctx, l, n_tok));
    DO(model_logits_forward(ctx, &a->m, &w->output_norm, &w->output, n_tok, all_logits));
    return TM_OK;
}

const tm_arch tm_arch_deepseek2 = {
    .name = "deepseek2",
    .load = ds_load,
    .unload = ds_unload,
    .state_create = ds_state_create,
    .state_free = ds_state_free,
    .forward = ds_forward,
};
