/* The reference's Mixtral (arch llama with experts), OLMoE, GLM-4-MoE and DeepSeek-V3 (see
 * ref_forward.h): written from HF transformers' modeling_mixtral.py,
 * modeling_olmoe.py and modeling_glm4_moe.py for the tensors as llama.cpp's
 * converter stores them (docs/converter-notes.md). One token a step at
 * position p, x the residual stream, eps the file's RMS eps:
 *
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = W_q h [+ b_q], W_k h [+ b_k], W_v h [+ b_v]            (biases: glm4moe)
 *   olmoe: q = rmsnorm(q) * q_norm, k = rmsnorm(k) * k_norm over the whole projection
 *   glm4moe with attn_q_norm: q_h, k_h = rmsnorm(q_h) * q_norm, rmsnorm(k_h) * k_norm per head
 *   RoPE at angle p·base^(-2i/n_rot): mixtral adjacent pairs (2i, 2i + 1) of the whole head
 *     (the converter permuted HF's rows into that order); olmoe, glm4moe NeoX pairs (i,
 *     i + n_rot/2) of the first n_rot values (glm4moe: rope.dimension_count)
 *   attn_out = W_o softmax(q kᵀ / sqrt(head_dim)) v, causal, GQA;  x += attn_out
 *   h = rmsnorm(x) * ffn_norm (glm4moe: post_attention_norm)
 *   glm4moe's leading dense layers: dense_out = down(silu(gate h) ⊙ up h); x += dense_out
 *   other layers:
 *     r = W_router h;  s = softmax(r) (mixtral, olmoe) or sigmoid(r) (glm4moe)
 *     sel = s + exp_probs_b (glm4moe);  groups (glm4moe): a group's score is the sum of its
 *       two largest sel, the n_group_used best kept (ties to the lower), the rest -inf
 *     ids = the k largest sel (ties to the lower id);  w = s[ids], / Σ w when renormalised
 *       (mixtral; glm4moe's expert_weights_norm), × expert_weights_scale (glm4moe)
 *     ffn_out = Σ_k w_k down_k(silu(gate_k h) ⊙ up_k h)
 *     shexp_out = down_sh(silu(gate_sh h) ⊙ up_sh h) (glm4moe, unweighted)
 *     x += ffn_out + shexp_out
 * deepseek2: glm4moe's FFNs and router (its post-attention norm named ffn_norm; gating absent:
 * softmax) behind MLA (ref_mla.c) instead of the attention above.
 * A glm4moe or deepseek2 file's NextN layers (the last nextn_predict_layers of block_count) are
 * not run.
 * Test code only: nothing here is shared with src/. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_internal.h"

tm_status ref_moe_config_load(const tm_gguf_file *f, ref_model *m, const char *a) {
    m->interleaved = m->arch == REF_ARCH_MIXTRAL;
    m->norm_topk = m->arch == REF_ARCH_MIXTRAL;
    m->scale = 1;
    const int ds = m->arch == REF_ARCH_DEEPSEEK2;
    if (m->arch != REF_ARCH_GLM4MOE && !ds) return TM_OK;
    int n_dense = 0, n_shexp = 0, gating = ds ? 1 : 2, nextn = 0;
    m->n_group = m->n_group_used = 1;
    tm_status st;
    if ((st = ref_key(f, a, "feed_forward_length", &m->n_ff_dense, NULL, 0)) ||
        (st = ref_key(f, a, "leading_dense_block_count", &n_dense, NULL, 1)) ||
        (st = ref_key(f, a, "expert_shared_count", &n_shexp, NULL, 1)) ||
        (st = ref_key(f, a, "expert_group_count", &m->n_group, NULL, 1)) ||
        (st = ref_key(f, a, "expert_group_used_count", &m->n_group_used, NULL, 1)) ||
        (st = ref_key(f, a, "expert_gating_func", &gating, NULL, 1)) ||
        (st = ref_key(f, a, "expert_weights_scale", NULL, &m->scale, 1)) ||
        (st = ref_key(f, a, "nextn_predict_layers", &nextn, NULL, 1)))
        return st;
    char key[128];
    snprintf(key, sizeof(key), "%s.expert_weights_norm", a);
    bool norm = false;
    if (gguf_file_find_kv(f, key) && (st = gguf_file_get_bool(f, key, &norm)))
        return tm_error_wrap(st, "%s", f->path);
    m->norm_topk = norm, m->sigmoid = gating == 2;
    m->n_ff_shexp = m->n_ff * n_shexp;
    m->n_layer -= nextn; /* the NextN layers are not run */
    if (m->n_layer < 1 || n_dense >= m->n_layer || m->n_group < 1 || m->n_expert % m->n_group ||
        m->n_group_used < 1 || m->n_group_used > m->n_group || (gating != 1 && gating != 2))
        return tm_error_set(TM_ERR_FORMAT, "%s: inconsistent glm4moe hyper-parameters", f->path);
    for (int l = 0; l < m->n_layer; l++) m->layers[l].dense = l < n_dense;
    return ds ? ref_mla_config_load(f, m, a) : TM_OK;
}

tm_status ref_moe_layer_load(const tm_gguf_file *f, ref_model *m, int l) {
    ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd, D = m->head_dim, Q = (int64_t)m->n_head * D,
                  KV = (int64_t)m->n_head_kv * D, X = m->n_expert, F = m->n_ff, FD = m->n_ff_dense,
                  FS = m->n_ff_shexp;
    const int glm = m->arch == REF_ARCH_GLM4MOE, ds = m->arch == REF_ARCH_DEEPSEEK2;
    tm_status st;
    if (ds && ((st = ref_tensor(f, &L->attn_norm, E, 0, "blk.%d.attn_norm.weight", l)) ||
               (st = ref_tensor(f, &L->ffn_norm, E, 0, "blk.%d.ffn_norm.weight", l)) ||
               (st = ref_mla_layer_load(f, m, l))))
        return st;
    if (!ds && ((st = ref_tensor(f, &L->attn_norm, E, 0, "blk.%d.attn_norm.weight", l)) ||
                (st = ref_tensor(f, &L->wq, E * Q, 0, "blk.%d.attn_q.weight", l)) ||
                (st = ref_tensor(f, &L->wk, E * KV, 0, "blk.%d.attn_k.weight", l)) ||
                (st = ref_tensor(f, &L->wv, E * KV, 0, "blk.%d.attn_v.weight", l)) ||
                (st = ref_tensor(f, &L->wo, Q * E, 0, "blk.%d.attn_output.weight", l)) ||
                (st = ref_tensor(
                     f, &L->ffn_norm, E, 0,
                     glm ? "blk.%d.post_attention_norm.weight" : "blk.%d.ffn_norm.weight", l))))
        return st;
    if (m->arch == REF_ARCH_OLMOE &&
        ((st = ref_tensor(f, &L->q_norm, Q, 0, "blk.%d.attn_q_norm.weight", l)) ||
         (st = ref_tensor(f, &L->k_norm, KV, 0, "blk.%d.attn_k_norm.weight", l))))
        return st;
    if (glm && ((st = ref_tensor(f, &L->bq, Q, 0, "blk.%d.attn_q.bias", l)) ||
                (st = ref_tensor(f, &L->bk, KV, 0, "blk.%d.attn_k.bias", l)) ||
                (st = ref_tensor(f, &L->bv, KV, 0, "blk.%d.attn_v.bias", l)) ||
                (st = ref_tensor(f, &L->q_norm, D, 1, "blk.%d.attn_q_norm.weight", l)) ||
                (st = ref_tensor(f, &L->k_norm, D, 1, "blk.%d.attn_k_norm.weight", l))))
        return st;
    if (L->dense)
        return (st = ref_tensor(f, &L->dn_gate, FD * E, 0, "blk.%d.ffn_gate.weight", l)) ||
                       (st = ref_tensor(f, &L->dn_up, FD * E, 0, "blk.%d.ffn_up.weight", l)) ||
                       (st = ref_tensor(f, &L->dn_down, E * FD, 0, "blk.%d.ffn_down.weight", l))
                   ? st
                   : TM_OK;
    if ((st = ref_tensor(f, &L->router, E * X, 0, "blk.%d.ffn_gate_inp.weight", l)) ||
        (st = ref_tensor(f, &L->gate, E * F * X, 0, "blk.%d.ffn_gate_exps.weight", l)) ||
        (st = ref_tensor(f, &L->up, E * F * X, 0, "blk.%d.ffn_up_exps.weight", l)) ||
        (st = ref_tensor(f, &L->down, F * E * X, 0, "blk.%d.ffn_down_exps.weight", l)))
        return st;
    if ((glm || ds) && (st = ref_tensor(f, &L->sel_b, X, ds, "blk.%d.exp_probs_b.bias", l)))
        return st;
    if (FS && ((st = ref_tensor(f, &L->sh_gate, FS * E, 0, "blk.%d.ffn_gate_shexp.weight", l)) ||
               (st = ref_tensor(f, &L->sh_up, FS * E, 0, "blk.%d.ffn_up_shexp.weight", l)) ||
               (st = ref_tensor(f, &L->sh_down, E * FS, 0, "blk.%d.ffn_down_shexp.weight", l))))
        return st;
    return TM_OK;
}

void ref_moe_layer_free(ref_layer *L) {
    free(L->dn_gate), free(L->dn_up), free(L->dn_down), free(L->sel_b);
    L->dn_gate = L->dn_up = L->dn_down = L->sel_b = NULL;
    ref_mla_layer_free(L);
}

tm_status ref_moe_seq_init(ref_seq *s) {
    const int64_t n = (int64_t)s->m->n_layer * s->m->n_embd;
    if (!(s->out.dense_out = calloc((size_t)n, sizeof(double))) ||
        !(s->out.shexp_out = calloc((size_t)n, sizeof(double))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    return s->m->arch == REF_ARCH_DEEPSEEK2 ? ref_mla_seq_init(s) : TM_OK;
}

void ref_moe_seq_free(ref_seq *s) {
    if (!ref_arch_llmoe(s->m->arch) && s->m->arch != REF_ARCH_GEMMA4) return;
    free(s->out.dense_out), free(s->out.shexp_out);
    s->out.dense_out = s->out.shexp_out = NULL;
    ref_mla_seq_free(s);
}

/* y = down(silu(gate h) ⊙ up h), F wide; s->ff_g, s->ff_u as scratch. */
static void ref_swiglu_ffn(ref_seq *s, const float *gate, const float *up, const float *down,
                           int64_t F, double *y) {
    const int64_t E = s->m->n_embd;
    ref_matvec(s->ff_g, gate, NULL, s->h, F, E);
    ref_matvec(s->ff_u, up, NULL, s->h, F, E);
    for (int64_t i = 0; i < F; i++) s->ff_g[i] = s->ff_g[i] / (1 + exp(-s->ff_g[i])) * s->ff_u[i];
    ref_matvec(y, down, NULL, s->ff_g, E, F);
}

/* Adjacent pairs (2i, 2i + 1) of a whole head at position p. */
static void ref_rope_interleaved(const ref_model *m, double *x, int64_t p) {
    for (int i = 0; i < m->head_dim / 2; i++) {
        const double ang = (double)p * m->inv_freq[i], c = cos(ang), sn = sin(ang);
        const double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * sn, x[2 * i + 1] = b * c + a * sn;
    }
}

/* The scores s and the selection scores sel (groups ruled out: -inf) of router logits r;
 * *group_gap: the last kept group's score less the first dropped one's (INFINITY: none). */
static void ref_moe_scores(const ref_model *m, int l, const double *r, double *s, double *sel,
                           double *group_gap) {
    const ref_layer *L = &m->layers[l];
    const int E = m->n_expert;
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < E; e++) mx = fmax(mx, r[e]);
    for (int e = 0; e < E; e++) {
        s[e] = m->sigmoid ? 1 / (1 + exp(-r[e])) : exp(r[e] - mx);
        sum += s[e];
    }
    for (int e = 0; !m->sigmoid && e < E; e++) s[e] /= sum;
    for (int e = 0; e < E; e++) sel[e] = s[e] + (L->sel_b ? L->sel_b[e] : 0);
    *group_gap = INFINITY;
    const int G = m->n_group, per = G > 0 ? E / G : E;
    if (G <= 1 || m->n_group_used >= G) return;
    double gs[64];
    int32_t keep[64], top[2];
    for (int g = 0; g < G; g++) {
        ref_topk(sel + g * per, per, 2, top);
        gs[g] = sel[g * per + top[0]] + sel[g * per + top[1]];
    }
    ref_topk(gs, G, G, keep); /* every group, best first */
    *group_gap = gs[keep[m->n_group_used - 1]] - gs[keep[m->n_group_used]];
    for (int j = m->n_group_used; j < G; j++)
        for (int i = 0; i < per; i++) sel[keep[j] * per + i] = -INFINITY;
}

double ref_moe_route_gap(const ref_model *m, int l, const double *r) {
    if (m->layers[l].dense) return INFINITY;
    if (!m->sigmoid && !m->layers[l].sel_b && m->n_group <= 1)
        return ref_route_gap(r, m->n_expert, m->n_used);
    const int E = m->n_expert, K = m->n_used;
    double s[1024], sel[1024], ggap, ss = 0;
    ref_moe_scores(m, l, r, s, sel, &ggap);
    int32_t ids[1024];
    ref_topk(sel, E, K + 1 <= E ? K + 1 : E, ids);
    const double sgap = K < E && isfinite(sel[ids[K]]) ? sel[ids[K - 1]] - sel[ids[K]] : INFINITY;
    for (int e = 0; e < E; e++) ss += r[e] * r[e];
    /* a logit error e moves a sigmoid by e/4 and a group's score of two by e/2 at most */
    return fmin(4 * sgap, 2 * ggap) / fmax(sqrt(ss / E), 1e-300);
}

/* ao = W_o attention(s->h) of mixtral, olmoe and glm4moe (s->h: the normed input). */
static void ref_moe_layer_attention(ref_seq *s, int l, double *ao) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int d = m->head_dim;
    const int64_t E = m->n_embd, Q = (int64_t)m->n_head * d, KV = (int64_t)m->n_head_kv * d;
    ref_matvec(s->q, L->wq, L->bq, s->h, Q, E);
    ref_matvec(s->kk, L->wk, L->bk, s->h, KV, E);
    ref_matvec(s->vv, L->wv, L->bv, s->h, KV, E);
    const int whole = m->arch == REF_ARCH_OLMOE; /* the norms span every head */
    if (whole) {
        ref_rmsnorm(s->q, s->q, L->q_norm, Q, m->eps);
        ref_rmsnorm(s->kk, s->kk, L->k_norm, KV, m->eps);
    }
    for (int h = 0; h < m->n_head + m->n_head_kv; h++) {
        double *x = h < m->n_head ? s->q + h * d : s->kk + (h - m->n_head) * d;
        const float *w = h < m->n_head ? L->q_norm : L->k_norm;
        if (w && !whole) ref_rmsnorm(x, x, w, d, m->eps);
        if (m->interleaved)
            ref_rope_interleaved(m, x, s->n_past);
        else
            ref_rope(m, x, s->n_past);
    }
    const int64_t at = ((int64_t)l * s->n_ctx + s->n_past) * KV;
    memcpy(s->k + at, s->kk, (size_t)KV * sizeof(double));
    memcpy(s->v + at, s->vv, (size_t)KV * sizeof(double));
    ref_attention(s, l);
    ref_matvec(ao, L->wo, NULL, s->att, E, Q);
}

void ref_moe_layer_step(ref_seq *s, int l) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int E1 = m->n_expert, K = m->n_used;
    const int64_t E = m->n_embd;
    ref_rmsnorm(s->h, s->x, L->attn_norm, E, m->eps);
    double *ao = s->out.attn_out + (int64_t)l * E, *fo = s->out.ffn_out + (int64_t)l * E;
    double *so = s->out.shexp_out + (int64_t)l * E, *dn = s->out.dense_out + (int64_t)l * E;
    if (m->arch == REF_ARCH_DEEPSEEK2)
        ref_mla_attention(s, l, ao);
    else
        ref_moe_layer_attention(s, l, ao);
    for (int64_t i = 0; i < E; i++) s->x[i] += ao[i];
    ref_rmsnorm(s->h, s->x, L->ffn_norm, E, m->eps);
    if (L->dense) {
        ref_swiglu_ffn(s, L->dn_gate, L->dn_up, L->dn_down, m->n_ff_dense, dn);
        for (int64_t i = 0; i < E; i++) s->x[i] += dn[i];
    } else {
        if (m->n_ff_shexp) ref_swiglu_ffn(s, L->sh_gate, L->sh_up, L->sh_down, m->n_ff_shexp, so);
        double *r = s->out.router_logits + (int64_t)l * E1, sc[1024], sel[1024], ggap, sum = 0;
        int32_t *ids = s->out.topk_ids + (int64_t)l * K;
        double *w = s->out.topk_w + (int64_t)l * K;
        ref_matvec(r, L->router, NULL, s->h, E1, E);
        ref_moe_scores(m, l, r, sc, sel, &ggap);
        ref_topk(sel, E1, K, ids);
        for (int j = 0; j < K; j++) sum += w[j] = sc[ids[j]];
        for (int j = 0; j < K; j++) w[j] = (m->norm_topk ? w[j] / sum : w[j]) * m->scale;
        ref_experts_sum(s, l, fo);
        for (int64_t i = 0; i < E; i++) s->x[i] += fo[i] + (m->n_ff_shexp ? so[i] : 0);
    }
    memcpy(s->out.x_out + (int64_t)l * E, s->x, (size_t)E * sizeof(double));
}
