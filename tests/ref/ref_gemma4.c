/* The reference's Gemma 4 MoE text model (arch gemma4; see ref_forward.h), written from
 * transformers 5.24's modeling_gemma4.py (Gemma4TextModel with enable_moe_block) for the
 * tensors as llama.cpp's converter stores them (docs/converter-notes.md). One token a step
 * at position p; x the residual stream; eps the file's RMS eps; every norm multiplies by its
 * weight as stored:
 *
 *   x = token_embd[tok] · sqrt(n_embd)
 *   per layer (sliding: sliding_window_pattern[l]; D, KV its head size and KV heads):
 *     h = rmsnorm(x) * attn_norm
 *     q = W_q h, k = W_k h, v = W_v h (a global layer without attn_v: v = k as projected)
 *     q_h = rmsnorm(q_h) * q_norm, k_h = rmsnorm(k_h) * k_norm, v_h = rmsnorm(v_h) per head
 *     RoPE, pairs (i, i + D/2), angle p·inv_freq_i: sliding base_swa^(-2i/D); global
 *       base^(-2i/D) / rope_freqs[i] (its proportional RoPE: 1e30 leaves a pair unturned)
 *     att_h = Σ_j softmax_j(q_h·k_j) v_j (scale 1) over j ≤ p, j > p - window when sliding
 *     attn_out = W_o att;  x += rmsnorm(attn_out) * post_attention_norm
 *     dense_out = down(gelu_tanh(gate h2) ⊙ up h2), h2 = rmsnorm(x) * ffn_norm
 *     r = W_router (rmsnorm(x) * ffn_gate_inp.scale) / sqrt(n_embd)
 *     P = softmax(r); ids = the k largest (ties to the lower id); w = P[ids] / Σ P[ids] ·
 *       ffn_down_exps.scale[ids]
 *     ffn_out = Σ_k w_k down_k(gelu_tanh(gate_k h3) ⊙ up_k h3), h3 = rmsnorm(x) * pre_ffw_norm_2,
 *       gate_k, up_k the first and second n_ff rows of expert k's ffn_gate_up_exps
 *     x += rmsnorm(rmsnorm(dense_out) * post_ffw_norm_1 + rmsnorm(ffn_out) * post_ffw_norm_2)
 *          * post_ffw_norm;  x *= layer_output_scale
 *   logits = cap tanh(W_out (rmsnorm(x) * output_norm) / cap)  (W_out: token_embd, tied)
 * Test code only: nothing here is shared with src/. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_internal.h"

#define REF_G4_PI 3.14159265358979323846

/* One count a layer of an array key (or one count for all). */
static tm_status ref_g4_layer_key(const tm_gguf_file *f, const char *key, int n_layer, int l,
                                  int *out) {
    const tm_gguf_kv *kv = gguf_file_find_kv(f, key);
    if (!kv) return tm_error_set(TM_ERR_FORMAT, "%s: missing key %s", f->path, key);
    if (kv->value.type == TM_GGUF_TYPE_ARRAY) {
        const tm_gguf_array *a = &kv->value.v.arr;
        if ((int64_t)a->n != n_layer)
            return tm_error_set(TM_ERR_FORMAT, "%s: key %s has %llu values", f->path, key,
                                (unsigned long long)a->n);
        *out = a->elem_type == TM_GGUF_TYPE_BOOL ? ((const uint8_t *)a->data)[l]
                                                 : (int)gguf_array_get_u32(a, (uint64_t)l);
        return TM_OK;
    }
    uint32_t u;
    tm_status st = gguf_file_get_u32(f, key, &u);
    if (st) return st;
    *out = (int)u;
    return TM_OK;
}

tm_status ref_gemma4_config_load(const tm_gguf_file *f, ref_model *m, const char *a) {
    tm_status st;
    double base = 0;
    int window = 0, hd_swa = 0;
    if ((st = ref_key(f, a, "block_count", &m->n_layer, NULL, 0)) ||
        (st = ref_key(f, a, "embedding_length", &m->n_embd, NULL, 0)) ||
        (st = ref_key(f, a, "attention.head_count", &m->n_head, NULL, 0)) ||
        (st = ref_key(f, a, "expert_count", &m->n_expert, NULL, 0)) ||
        (st = ref_key(f, a, "expert_used_count", &m->n_used, NULL, 0)) ||
        (st = ref_key(f, a, "expert_feed_forward_length", &m->n_ff, NULL, 0)) ||
        (st = ref_key(f, a, "feed_forward_length", &m->n_ff_dense, NULL, 0)) ||
        (st = ref_key(f, a, "attention.layer_norm_rms_epsilon", NULL, &m->eps, 0)) ||
        (st = ref_key(f, a, "rope.freq_base", NULL, &base, 0)) ||
        (st = ref_key(f, a, "rope.freq_base_swa", NULL, &m->base_swa, 0)) ||
        (st = ref_key(f, a, "attention.key_length", &m->head_dim, NULL, 0)) ||
        (st = ref_key(f, a, "attention.key_length_swa", &hd_swa, NULL, 0)) ||
        (st = ref_key(f, a, "attention.sliding_window", &window, NULL, 0)) ||
        (st = ref_key(f, a, "final_logit_softcapping", NULL, &m->softcap, 1)))
        return st;
    char kk[128], kp[128];
    snprintf(kk, sizeof(kk), "%s.attention.head_count_kv", a);
    snprintf(kp, sizeof(kp), "%s.attention.sliding_window_pattern", a);
    m->n_head_kv = 1;
    for (int l = 0; l < m->n_layer; l++) {
        ref_layer *L = &m->layers[l];
        int sliding = 0;
        if ((st = ref_g4_layer_key(f, kk, m->n_layer, l, &L->n_kv)) ||
            (st = ref_g4_layer_key(f, kp, m->n_layer, l, &sliding)))
            return st;
        L->global = !sliding;
        L->hd = sliding ? hd_swa : m->head_dim;
        L->window = sliding ? window : 0;
        if (L->n_kv < 1 || m->n_head % L->n_kv || L->hd < 2 || L->hd % 2)
            return tm_error_set(TM_ERR_FORMAT, "%s: layer %d: %d KV heads of %d", f->path, l,
                                L->n_kv, L->hd);
        if (L->n_kv > m->n_head_kv) m->n_head_kv = L->n_kv;
    }
    /* the KV cache's row: the widest layer's (head_dim is the largest head) */
    if (hd_swa > m->head_dim) m->head_dim = hd_swa;
    m->hd_swa = hd_swa;
    m->eps = ref_float_decimal(m->eps);
    m->embd_scale = sqrt((double)m->n_embd);
    m->n_rot = m->head_dim;
    /* the global layers' angles: base^(-2i/D) / rope_freqs[i] */
    int D = 0;
    for (int l = 0; l < m->n_layer; l++)
        if (m->layers[l].global) D = m->layers[l].hd;
    const int half = (D ? D : 2) / 2;
    float *factors = NULL;
    if (D && (st = ref_tensor(f, &factors, half, 1, "rope_freqs.weight"))) return st;
    if (!(m->inv_freq = malloc((size_t)half * sizeof(double))) ||
        !(m->inv_freq_swa = malloc((size_t)(hd_swa / 2 ? hd_swa / 2 : 1) * sizeof(double)))) {
        free(factors);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < half; i++)
        m->inv_freq[i] = pow(base, -2.0 * i / (D ? D : 2)) / (factors ? factors[i] : 1.0);
    for (int i = 0; i < hd_swa / 2; i++) m->inv_freq_swa[i] = pow(m->base_swa, -2.0 * i / hd_swa);
    free(factors);
    m->mscale = 1.0;
    (void)REF_G4_PI;
    return TM_OK;
}

tm_status ref_gemma4_layer_load(const tm_gguf_file *f, ref_model *m, int l) {
    ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd, D = L->hd, Q = (int64_t)m->n_head * D, KV = (int64_t)L->n_kv * D,
                  X = m->n_expert, F = m->n_ff, FD = m->n_ff_dense;
    tm_status st;
    float *gu = NULL;
    if ((st = ref_tensor(f, &L->attn_norm, E, 0, "blk.%d.attn_norm.weight", l)) ||
        (st = ref_tensor(f, &L->wq, E * Q, 0, "blk.%d.attn_q.weight", l)) ||
        (st = ref_tensor(f, &L->wk, E * KV, 0, "blk.%d.attn_k.weight", l)) ||
        (st = ref_tensor(f, &L->wv, E * KV, L->global, "blk.%d.attn_v.weight", l)) ||
        (st = ref_tensor(f, &L->wo, Q * E, 0, "blk.%d.attn_output.weight", l)) ||
        (st = ref_tensor(f, &L->q_norm, D, 0, "blk.%d.attn_q_norm.weight", l)) ||
        (st = ref_tensor(f, &L->k_norm, D, 0, "blk.%d.attn_k_norm.weight", l)) ||
        (st = ref_tensor(f, &L->post_attn_norm, E, 0, "blk.%d.post_attention_norm.weight", l)) ||
        (st = ref_tensor(f, &L->ffn_norm, E, 0, "blk.%d.ffn_norm.weight", l)) ||
        (st = ref_tensor(f, &L->dn_gate, FD * E, 0, "blk.%d.ffn_gate.weight", l)) ||
        (st = ref_tensor(f, &L->dn_up, FD * E, 0, "blk.%d.ffn_up.weight", l)) ||
        (st = ref_tensor(f, &L->dn_down, E * FD, 0, "blk.%d.ffn_down.weight", l)) ||
        (st = ref_tensor(f, &L->post_ffw_norm_1, E, 0, "blk.%d.post_ffw_norm_1.weight", l)) ||
        (st = ref_tensor(f, &L->router, E * X, 0, "blk.%d.ffn_gate_inp.weight", l)) ||
        (st = ref_tensor(f, &L->router_scale, E, 0, "blk.%d.ffn_gate_inp.scale", l)) ||
        (st = ref_tensor(f, &L->expert_scale, X, 0, "blk.%d.ffn_down_exps.scale", l)) ||
        (st = ref_tensor(f, &L->pre_ffw_norm_2, E, 0, "blk.%d.pre_ffw_norm_2.weight", l)) ||
        (st = ref_tensor(f, &gu, E * 2 * F * X, 0, "blk.%d.ffn_gate_up_exps.weight", l)) ||
        (st = ref_tensor(f, &L->down, F * E * X, 0, "blk.%d.ffn_down_exps.weight", l)) ||
        (st = ref_tensor(f, &L->post_ffw_norm_2, E, 0, "blk.%d.post_ffw_norm_2.weight", l)) ||
        (st = ref_tensor(f, &L->post_ffw_norm, E, 0, "blk.%d.post_ffw_norm.weight", l))) {
        free(gu);
        return st;
    }
    float *scale = NULL;
    if ((st = ref_tensor(f, &scale, 1, 0, "blk.%d.layer_output_scale.weight", l))) {
        free(gu);
        return st;
    }
    L->out_scale = scale[0];
    free(scale);
    /* HF's gate_up_proj.chunk(2): an expert's first F rows the gate, the next F the up */
    if (!(L->gate = malloc((size_t)(X * F * E) * sizeof(float))) ||
        !(L->up = malloc((size_t)(X * F * E) * sizeof(float)))) {
        free(gu);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    for (int64_t x = 0; x < X; x++) {
        memcpy(L->gate + x * F * E, gu + x * 2 * F * E, (size_t)(F * E) * sizeof(float));
        memcpy(L->up + x * F * E, gu + (x * 2 + 1) * F * E, (size_t)(F * E) * sizeof(float));
    }
    free(gu);
    return TM_OK;
}

void ref_gemma4_layer_free(ref_layer *L) {
    float *all[] = {L->post_attn_norm, L->post_ffw_norm_1, L->post_ffw_norm_2, L->pre_ffw_norm_2,
                    L->post_ffw_norm,  L->router_scale,    L->expert_scale};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
    L->post_attn_norm = L->post_ffw_norm_1 = L->post_ffw_norm_2 = L->pre_ffw_norm_2 =
        L->post_ffw_norm = L->router_scale = L->expert_scale = NULL;
}

static double ref_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / REF_G4_PI) * (x + 0.044715 * x * x * x)));
}

/* y = down(gelu_tanh(gate in) ⊙ up in), F wide ([F][E], [F][E], [E][F]). */
static void ref_g4_ffn(ref_seq *s, const float *gate, const float *up, const float *down, int64_t F,
                       const double *in, double *y) {
    const int64_t E = s->m->n_embd;
    ref_matvec(s->ff_g, gate, NULL, in, F, E);
    ref_matvec(s->ff_u, up, NULL, in, F, E);
    for (int64_t i = 0; i < F; i++) s->ff_g[i] = ref_gelu_tanh(s->ff_g[i]) * s->ff_u[i];
    ref_matvec(y, down, NULL, s->ff_g, E, F);
}

/* NeoX pairs (i, i + d/2) of a whole head at position p with angles p·inv[i]. */
static void ref_g4_rope(double *x, int d, const double *inv, int64_t p) {
    for (int i = 0; i < d / 2; i++) {
        const double ang = (double)p * inv[i], c = cos(ang), sn = sin(ang);
        const double a = x[i], b = x[i + d / 2];
        x[i] = a * c - b * sn, x[i + d / 2] = b * c + a * sn;
    }
}

/* y = x / sqrt(mean(x²) + eps), no weight */
static void ref_g4_norm(double *y, const double *x, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r;
}

void ref_gemma4_layer_step(ref_seq *s, int l) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int d = L->hd, K = m->n_used, X = m->n_expert;
    const int64_t E = m->n_embd, Q = (int64_t)m->n_head * d, KV = (int64_t)L->n_kv * d,
                  row = (int64_t)m->n_head_kv * m->head_dim, p = s->n_past;
    const double *inv = L->global ? m->inv_freq : m->inv_freq_swa;
    double *ao = s->out.attn_out + (int64_t)l * E, *fo = s->out.ffn_out + (int64_t)l * E;
    double *dn = s->out.dense_out + (int64_t)l * E, *t = s->tmp;
    /* attention */
    ref_rmsnorm(s->h, s->x, L->attn_norm, E, m->eps);
    ref_matvec(s->q, L->wq, NULL, s->h, Q, E);
    ref_matvec(s->kk, L->wk, NULL, s->h, KV, E);
    if (L->wv)
        ref_matvec(s->vv, L->wv, NULL, s->h, KV, E);
    else
        memcpy(s->vv, s->kk, (size_t)KV * sizeof(double)); /* K as V, before k's norm */
    for (int h = 0; h < m->n_head; h++) {
        ref_rmsnorm(s->q + h * d, s->q + h * d, L->q_norm, d, m->eps);
        ref_g4_rope(s->q + h * d, d, inv, p);
    }
    for (int h = 0; h < L->n_kv; h++) {
        ref_rmsnorm(s->kk + h * d, s->kk + h * d, L->k_norm, d, m->eps);
        ref_g4_rope(s->kk + h * d, d, inv, p);
        ref_g4_norm(s->vv + h * d, s->vv + h * d, d, m->eps);
    }
    double *kc = s->k + (int64_t)l * s->n_ctx * row, *vc = s->v + (int64_t)l * s->n_ctx * row;
    memcpy(kc + p * row, s->kk, (size_t)KV * sizeof(double));
    memcpy(vc + p * row, s->vv, (size_t)KV * sizeof(double));
    const int64_t first = L->window && p - L->window + 1 > 0 ? p - L->window + 1 : 0;
    const int group = m->n_head / L->n_kv;
    for (int h = 0; h < m->n_head; h++) {
        const double *q = s->q + (int64_t)h * d;
        const int64_t g = h / group;
        double mx = -INFINITY, den = 0;
        for (int64_t j = first; j <= p; j++) {
            double dot = 0;
            for (int i = 0; i < d; i++) dot += q[i] * kc[j * row + g * d + i];
            mx = fmax(mx, s->score[j] = dot);
        }
        for (int64_t j = first; j <= p; j++) den += (s->score[j] = exp(s->score[j] - mx));
        double *o = s->att + (int64_t)h * d;
        for (int i = 0; i < d; i++) o[i] = 0;
        for (int64_t j = first; j <= p; j++)
            for (int i = 0; i < d; i++) o[i] += s->score[j] / den * vc[j * row + g * d + i];
    }
    ref_matvec(ao, L->wo, NULL, s->att, E, Q);
    ref_rmsnorm(t, ao, L->post_attn_norm, E, m->eps);
    for (int64_t i = 0; i < E; i++) s->x[i] += t[i];
    /* the dense MLP */
    ref_rmsnorm(s->h, s->x, L->ffn_norm, E, m->eps);
    ref_g4_ffn(s, L->dn_gate, L->dn_up, L->dn_down, m->n_ff_dense, s->h, dn);
    /* the router and the experts, on the residual */
    double *r = s->out.router_logits + (int64_t)l * X, *w = s->out.topk_w + (int64_t)l * K;
    int32_t *ids = s->out.topk_ids + (int64_t)l * K;
    ref_rmsnorm(s->h, s->x, L->router_scale, E, m->eps);
    ref_matvec(r, L->router, NULL, s->h, X, E);
    for (int e = 0; e < X; e++) r[e] /= sqrt((double)E);
    ref_topk(r, X, K, ids); /* softmax keeps the order of the logits */
    double sum = 0;
    for (int j = 0; j < K; j++) sum += (w[j] = exp(r[ids[j]] - r[ids[0]]));
    for (int j = 0; j < K; j++) w[j] = w[j] / sum * L->expert_scale[ids[j]];
    ref_rmsnorm(s->h, s->x, L->pre_ffw_norm_2, E, m->eps);
    for (int64_t i = 0; i < E; i++) fo[i] = 0;
    for (int j = 0; j < K; j++) {
        const int64_t x = ids[j], F = m->n_ff;
        ref_g4_ffn(s, L->gate + x * F * E, L->up + x * F * E, L->down + x * E * F, F, s->h, t);
        for (int64_t i = 0; i < E; i++) fo[i] += w[j] * t[i];
    }
    /* x += rmsnorm(rmsnorm(d) * n1 + rmsnorm(m) * n2) * n;  x *= layer_output_scale */
    double *a = s->g4_tmp;
    ref_rmsnorm(a, dn, L->post_ffw_norm_1, E, m->eps);
    ref_rmsnorm(t, fo, L->post_ffw_norm_2, E, m->eps);
    for (int64_t i = 0; i < E; i++) a[i] += t[i];
    ref_rmsnorm(t, a, L->post_ffw_norm, E, m->eps);
    for (int64_t i = 0; i < E; i++) s->x[i] = (s->x[i] + t[i]) * L->out_scale;
    memcpy(s->out.x_out + (int64_t)l * E, s->x, (size_t)E * sizeof(double));
}
