/* The reference's qwen3next and qwen35moe (see ref_forward.h): written from
 * HF transformers' modeling_qwen3_next.py and modeling_qwen3_5_moe.py, for
 * the tensors as llama.cpp's converter stores them (norm gains as they
 * multiply, HF's 1 added; ssm_a = -exp(A_log); conv1d [C][K]; qwen3next's
 * in_proj_qkvz split into attn_qkv and attn_gate; qwen35moe's value heads
 * tiled). One token a step, x the residual stream, eps the file's RMS eps:
 *
 *   h = rmsnorm(x) * attn_norm
 *   linear attention (layers the key <arch>.attention.recurrent_layers marks, or else those
 *   with (l + 1) % full_attention_interval != 0):
 *     c = W_qkv h  (q: n_k heads of k_dim, k: n_k heads of k_dim, v: n_v heads of v_dim)
 *     z = W_gate h (n_v heads of v_dim)
 *     b, a per value head: qwen3next's ssm_ba rows per key head g: b of its value heads
 *       g r .. g r + r - 1 (r = n_v / n_k), then their a; qwen35moe's ssm_beta, ssm_alpha
 *     c = silu(Σ_j conv[ch][j] c_{p - K + 1 + j}[ch]) per channel ch, c_{<0} = 0 (the state
 *       keeps the K - 1 previous inputs)
 *     q, k = q / sqrt(|q|² + 1e-6) / sqrt(k_dim), k / sqrt(|k|² + 1e-6) per key head (HF l2norm)
 *     per value head h, its key head kh = h / r (qwen3next, grouped) or h % n_k (qwen35moe,
 *     tiled): β = sigmoid(b_h), g = ssm_a_h · softplus(a_h + dt_bias_h),
 *       S = e^g S;  δ = β (v_h - Sᵀ k_kh);  S += k_kh ⊗ δ;  o_h = Sᵀ q_kh     (S [k_dim][v_dim])
 *     lin_core = o;  y_h = o_h / sqrt(mean(o_h²) + eps) * ssm_norm * silu(z_h)
 *     attn_out = W_ssm_out y
 *   gated full attention (the other layers):
 *     per head [q; gate] = W_q h;  k, v = W_k h, W_v h
 *     q, k = rope(rmsnorm(q) * q_norm), rope(rmsnorm(k) * k_norm) per head, NeoX pairs over the
 *       first n_rot values (qwen35moe's mrope sections all see the same text position)
 *     attn_out = W_o (softmax(q kᵀ / sqrt(head_dim)) v ⊙ sigmoid(gate)), causal, GQA
 *   x += attn_out;  h = rmsnorm(x) * post_attention_norm
 *   shexp_out = sigmoid(ffn_gate_inp_shexp · h) · down_shexp(silu(gate_shexp h) ⊙ up_shexp h)
 *   ffn_out = Σ_k p_k down_k(silu(gate_k h) ⊙ up_k h), p = softmax(W_router h) over all experts,
 *     the top k renormalised to sum 1 (ref_experts, as qwen3moe)
 *   x += ffn_out + shexp_out
 * softplus as torch's (threshold 20: x itself above it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_internal.h"

static double ref_sigmoid(double x) {
    return 1.0 / (1.0 + exp(-x));
}

static double ref_softplus(double x) {
    return x > 20.0 ? x : log1p(exp(x));
}

/* Which layers are linear attention: the bool array <arch>.attention.recurrent_layers when the
 * file has it, else all but every full_attention_interval-th. */
static tm_status ref_qnext_pattern(const tm_gguf_file *f, ref_model *m, const char *a) {
    char key[128];
    snprintf(key, sizeof(key), "%s.attention.recurrent_layers", a);
    if (gguf_file_find_kv(f, key)) {
        const tm_gguf_array *arr;
        tm_status st = gguf_file_get_array(f, key, &arr);
        if (st) return tm_error_wrap(st, "%s", f->path);
        if (arr->elem_type != TM_GGUF_TYPE_BOOL || arr->n != (uint64_t)m->n_layer)
            return tm_error_set(TM_ERR_FORMAT, "%s: key %s is an array of %llu %s, want %d bools",
                                f->path, key, (unsigned long long)arr->n,
                                gguf_value_type_name(arr->elem_type), m->n_layer);
        for (int l = 0; l < m->n_layer; l++)
            m->layers[l].linear = ((const uint8_t *)arr->data)[l] != 0;
        return TM_OK;
    }
    int interval = 0;
    tm_status st = ref_key(f, a, "full_attention_interval", &interval, NULL, 0);
    if (st) return st;
    if (interval < 1)
        return tm_error_set(TM_ERR_FORMAT, "%s: %s.full_attention_interval is %d", f->path, a,
                            interval);
    for (int l = 0; l < m->n_layer; l++) m->layers[l].linear = (l + 1) % interval != 0;
    return TM_OK;
}

tm_status ref_qnext_config_load(const tm_gguf_file *f, ref_model *m, const char *a) {
    tm_status st;
    int inner = 0;
    if ((st = ref_key(f, a, "ssm.conv_kernel", &m->conv_k, NULL, 0)) ||
        (st = ref_key(f, a, "ssm.state_size", &m->k_dim, NULL, 0)) ||
        (st = ref_key(f, a, "ssm.group_count", &m->n_k_head, NULL, 0)) ||
        (st = ref_key(f, a, "ssm.time_step_rank", &m->n_v_head, NULL, 0)) ||
        (st = ref_key(f, a, "ssm.inner_size", &inner, NULL, 0)) ||
        (st = ref_key(f, a, "expert_shared_feed_forward_length", &m->n_ff_shexp, NULL, 0)))
        return st;
    if (m->conv_k < 1 || !m->k_dim || !m->n_k_head || !m->n_v_head || m->n_v_head % m->n_k_head ||
        inner % m->n_v_head || !inner || !m->n_ff_shexp)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: linear attention's sizes (conv %d, %d key heads of %d, %d value "
                            "heads, inner %d, shared expert %d): want value heads a multiple of "
                            "key heads and inner a multiple of value heads",
                            f->path, m->conv_k, m->n_k_head, m->k_dim, m->n_v_head, inner,
                            m->n_ff_shexp);
    m->v_dim = inner / m->n_v_head;
    return ref_qnext_pattern(f, m, a);
}

tm_status ref_qnext_layer_load(const tm_gguf_file *f, ref_model *m, int l) {
    ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd, D = m->head_dim, Q = (int64_t)m->n_head * D,
                  KV = (int64_t)m->n_head_kv * D, X = m->n_expert, F = m->n_ff, FS = m->n_ff_shexp,
                  Hv = m->n_v_head, VD = Hv * m->v_dim,
                  C = 2 * (int64_t)m->n_k_head * m->k_dim + VD;
    tm_status st;
    if ((st = ref_tensor(f, &L->attn_norm, E, 0, "blk.%d.attn_norm.weight", l)) ||
        (st = ref_tensor(f, &L->ffn_norm, E, 0, "blk.%d.post_attention_norm.weight", l)) ||
        (st = ref_tensor(f, &L->router, E * X, 0, "blk.%d.ffn_gate_inp.weight", l)) ||
        (st = ref_tensor(f, &L->gate, E * F * X, 0, "blk.%d.ffn_gate_exps.weight", l)) ||
        (st = ref_tensor(f, &L->up, E * F * X, 0, "blk.%d.ffn_up_exps.weight", l)) ||
        (st = ref_tensor(f, &L->down, F * E * X, 0, "blk.%d.ffn_down_exps.weight", l)) ||
        (st = ref_tensor(f, &L->sh_gate_inp, E, 0, "blk.%d.ffn_gate_inp_shexp.weight", l)) ||
        (st = ref_tensor(f, &L->sh_gate, E * FS, 0, "blk.%d.ffn_gate_shexp.weight", l)) ||
        (st = ref_tensor(f, &L->sh_up, E * FS, 0, "blk.%d.ffn_up_shexp.weight", l)) ||
        (st = ref_tensor(f, &L->sh_down, FS * E, 0, "blk.%d.ffn_down_shexp.weight", l)))
        return st;
    if (!L->linear)
        return (st = ref_tensor(f, &L->wq, E * 2 * Q, 0, "blk.%d.attn_q.weight", l)) ||
                       (st = ref_tensor(f, &L->wk, E * KV, 0, "blk.%d.attn_k.weight", l)) ||
                       (st = ref_tensor(f, &L->wv, E * KV, 0, "blk.%d.attn_v.weight", l)) ||
                       (st = ref_tensor(f, &L->wo, Q * E, 0, "blk.%d.attn_output.weight", l)) ||
                       (st = ref_tensor(f, &L->q_norm, D, 0, "blk.%d.attn_q_norm.weight", l)) ||
                       (st = ref_tensor(f, &L->k_norm, D, 0, "blk.%d.attn_k_norm.weight", l))
                   ? st
                   : TM_OK;
    if ((st = ref_tensor(f, &L->wqkv, E * C, 0, "blk.%d.attn_qkv.weight", l)) ||
        (st = ref_tensor(f, &L->wz, E * VD, 0, "blk.%d.attn_gate.weight", l)) ||
        (st = ref_tensor(f, &L->conv, C * m->conv_k, 0, "blk.%d.ssm_conv1d.weight", l)) ||
        (st = ref_tensor(f, &L->ssm_a, Hv, 0, "blk.%d.ssm_a", l)) ||
        (st = ref_tensor(f, &L->ssm_dt, Hv, 0, "blk.%d.ssm_dt.bias", l)) ||
        (st = ref_tensor(f, &L->ssm_norm, m->v_dim, 0, "blk.%d.ssm_norm.weight", l)) ||
        (st = ref_tensor(f, &L->ssm_out, VD * E, 0, "blk.%d.ssm_out.weight", l)))
        return st;
    if (m->arch == REF_ARCH_QWEN3NEXT)
        return ref_tensor(f, &L->wba, E * 2 * Hv, 0, "blk.%d.ssm_ba.weight", l);
    if ((st = ref_tensor(f, &L->wbeta, E * Hv, 0, "blk.%d.ssm_beta.weight", l)) ||
        (st = ref_tensor(f, &L->walpha, E * Hv, 0, "blk.%d.ssm_alpha.weight", l)))
        return st;
    return TM_OK;
}

void ref_qnext_layer_free(ref_layer *L) {
    float *all[] = {L->wqkv,        L->wz,      L->wba,    L->wbeta,    L->walpha,
                    L->conv,        L->ssm_a,   L->ssm_dt, L->ssm_norm, L->ssm_out,
                    L->sh_gate_inp, L->sh_gate, L->sh_up,  L->sh_down};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
}

tm_status ref_qnext_seq_init(ref_seq *s) {
    const ref_model *m = s->m;
    const int64_t L = m->n_layer, Hv = m->n_v_head, VD = Hv * m->v_dim,
                  C = 2 * (int64_t)m->n_k_head * m->k_dim + VD,
                  Q = (int64_t)m->n_head * m->head_dim;
    double **bufs[] = {
        &s->conv_state, &s->ssm_state,    &s->qkv,          &s->z, &s->b, &s->a, &s->ba, &s->delta,
        &s->gate,       &s->out.lin_core, &s->out.shexp_out};
    const int64_t sizes[] = {L * (m->conv_k - 1) * C,
                             L * Hv * m->k_dim * m->v_dim,
                             C,
                             VD,
                             Hv,
                             Hv,
                             2 * Hv,
                             m->v_dim,
                             2 * Q,
                             L * VD,
                             L * m->n_embd};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (!(*bufs[i] = calloc((size_t)sizes[i] ? (size_t)sizes[i] : 1, sizeof(double))))
            return tm_error_set(TM_ERR_NOMEM, "out of memory");
    return TM_OK;
}

void ref_qnext_seq_free(ref_seq *s) {
    double *bufs[] = {
        s->conv_state, s->ssm_state,    s->qkv,          s->z, s->b, s->a, s->ba, s->delta,
        s->gate,       s->out.lin_core, s->out.shexp_out};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
}

void ref_qnext_seq_clear(ref_seq *s) {
    const ref_model *m = s->m;
    const int64_t VD = (int64_t)m->n_v_head * m->v_dim,
                  C = 2 * (int64_t)m->n_k_head * m->k_dim + VD;
    memset(s->conv_state, 0, (size_t)(m->n_layer * (m->conv_k - 1) * C) * sizeof(double));
    memset(s->ssm_state, 0,
           (size_t)((int64_t)m->n_layer * m->n_v_head * m->k_dim * m->v_dim) * sizeof(double));
}

/* The causal depthwise conv of this position's inputs c (C channels) with layer l's K - 1
 * previous ones, then silu; the state moves on by one. */
static void ref_qnext_conv(ref_seq *s, int l, double *c, int64_t C) {
    const ref_model *m = s->m;
    const int K = m->conv_k;
    const float *w = m->layers[l].conv;
    double *st = s->conv_state + (int64_t)l * (K - 1) * C; /* [K - 1][C], oldest first */
    for (int64_t ch = 0; ch < C; ch++) {
        double acc = (double)w[ch * K + K - 1] * c[ch];
        for (int j = 0; j < K - 1; j++) acc += (double)w[ch * K + j] * st[j * C + ch];
        for (int j = 0; j + 1 < K - 1; j++) st[j * C + ch] = st[(j + 1) * C + ch];
        if (K > 1) st[(int64_t)(K - 2) * C + ch] = c[ch];
        c[ch] = acc / (1.0 + exp(-acc));
    }
}

/* x / sqrt(|x|² + 1e-6) * scale, HF's l2norm (FLA's eps) */
static void ref_l2norm(double *x, int n, double scale) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss + 1e-6) * scale;
    for (int i = 0; i < n; i++) x[i] *= r;
}

/* Gated DeltaNet: attn_out = W_ssm_out (gated_rmsnorm(delta_rule(conv(W_qkv h)))). */
static void ref_qnext_linear(ref_seq *s, int l, double *attn_out) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int Hk = m->n_k_head, Hv = m->n_v_head, dk = m->k_dim, dv = m->v_dim, r = Hv / Hk;
    const int64_t E = m->n_embd, VD = (int64_t)Hv * dv, C = 2 * (int64_t)Hk * dk + VD;
    ref_matvec(s->qkv, L->wqkv, NULL, s->h, C, E);
    ref_matvec(s->z, L->wz, NULL, s->h, VD, E);
    if (L->wba) {
        double *ba = s->ba; /* [n_k][b of its r value heads, then their a] */
        ref_matvec(ba, L->wba, NULL, s->h, 2 * Hv, E);
        for (int g = 0; g < Hk; g++)
            for (int j = 0; j < r; j++)
                s->b[g * r + j] = ba[g * 2 * r + j], s->a[g * r + j] = ba[g * 2 * r + r + j];
    } else {
        ref_matvec(s->b, L->wbeta, NULL, s->h, Hv, E);
        ref_matvec(s->a, L->walpha, NULL, s->h, Hv, E);
    }
    ref_qnext_conv(s, l, s->qkv, C);
    double *q = s->qkv, *k = s->qkv + (int64_t)Hk * dk, *v = s->qkv + 2 * (int64_t)Hk * dk;
    for (int g = 0; g < Hk; g++) {
        ref_l2norm(q + g * dk, dk, 1.0 / sqrt((double)dk));
        ref_l2norm(k + g * dk, dk, 1.0);
    }
    double *core = s->out.lin_core + (int64_t)l * VD;
    for (int h = 0; h < Hv; h++) {
        const int kh = m->arch == REF_ARCH_QWEN3NEXT ? h / r : h % Hk;
        const double *qh = q + kh * dk, *kk = k + kh * dk, *vh = v + (int64_t)h * dv;
        const double beta = ref_sigmoid(s->b[h]);
        const double decay = exp((double)L->ssm_a[h] * ref_softplus(s->a[h] + L->ssm_dt[h]));
        double *S = s->ssm_state + ((int64_t)l * Hv + h) * dk * dv; /* [dk][dv] */
        double *o = core + (int64_t)h * dv, *delta = s->delta;
        for (int64_t i = 0; i < (int64_t)dk * dv; i++) S[i] *= decay;
        for (int j = 0; j < dv; j++) {
            double mem = 0; /* (Sᵀ k)_j */
            for (int i = 0; i < dk; i++) mem += S[i * dv + j] * kk[i];
            delta[j] = (vh[j] - mem) * beta;
        }
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) S[i * dv + j] += kk[i] * delta[j];
        for (int j = 0; j < dv; j++) {
            double acc = 0;
            for (int i = 0; i < dk; i++) acc += S[i * dv + j] * qh[i];
            o[j] = acc;
        }
    }
    /* the gated RMSNorm per value head, over z in place */
    for (int h = 0; h < Hv; h++) {
        const double *o = core + (int64_t)h * dv;
        double *y = s->z + (int64_t)h * dv;
        double ss = 0;
        for (int j = 0; j < dv; j++) ss += o[j] * o[j];
        const double rr = 1.0 / sqrt(ss / dv + m->eps);
        for (int j = 0; j < dv; j++) {
            const double zz = y[j];
            y[j] = o[j] * rr * L->ssm_norm[j] * (zz / (1.0 + exp(-zz)));
        }
    }
    ref_matvec(attn_out, L->ssm_out, NULL, s->z, E, VD);
}

/* Gated full attention with partial RoPE: attn_out = W_o (attention ⊙ sigmoid(gate)). */
static void ref_qnext_full(ref_seq *s, int l, double *attn_out) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int d = m->head_dim;
    const int64_t E = m->n_embd, Q = (int64_t)m->n_head * d, KV = (int64_t)m->n_head_kv * d;
    ref_matvec(s->gate, L->wq, NULL, s->h, 2 * Q, E); /* per head: q (d), then gate (d) */
    ref_matvec(s->kk, L->wk, NULL, s->h, KV, E);
    ref_matvec(s->vv, L->wv, NULL, s->h, KV, E);
    for (int h = 0; h < m->n_head; h++) {
        double *qh = s->q + (int64_t)h * d;
        memcpy(qh, s->gate + (int64_t)h * 2 * d, (size_t)d * sizeof(double));
        ref_rmsnorm(qh, qh, L->q_norm, d, m->eps);
        ref_rope(m, qh, s->n_past);
    }
    for (int h = 0; h < m->n_head_kv; h++) {
        ref_rmsnorm(s->kk + h * d, s->kk + h * d, L->k_norm, d, m->eps);
        ref_rope(m, s->kk + h * d, s->n_past);
    }
    const int64_t at = ((int64_t)l * s->n_ctx + s->n_past) * KV;
    memcpy(s->k + at, s->kk, (size_t)KV * sizeof(double));
    memcpy(s->v + at, s->vv, (size_t)KV * sizeof(double));
    ref_attention(s, l);
    for (int h = 0; h < m->n_head; h++)
        for (int i = 0; i < d; i++)
            s->att[h * d + i] *= ref_sigmoid(s->gate[(int64_t)h * 2 * d + d + i]);
    ref_matvec(attn_out, L->wo, NULL, s->att, E, Q);
}

/* shexp_out = sigmoid(w · h) down(silu(gate h) ⊙ up h) */
static void ref_qnext_shared(ref_seq *s, int l, double *out) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd, FS = m->n_ff_shexp;
    ref_matvec(s->ff_g, L->sh_gate, NULL, s->h, FS, E);
    ref_matvec(s->ff_u, L->sh_up, NULL, s->h, FS, E);
    for (int64_t i = 0; i < FS; i++) s->ff_g[i] = s->ff_g[i] / (1 + exp(-s->ff_g[i])) * s->ff_u[i];
    ref_matvec(out, L->sh_down, NULL, s->ff_g, E, FS);
    double g;
    ref_matvec(&g, L->sh_gate_inp, NULL, s->h, 1, E);
    g = ref_sigmoid(g);
    for (int64_t i = 0; i < E; i++) out[i] *= g;
}

void ref_qnext_layer_step(ref_seq *s, int l) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd;
    double *ao = s->out.attn_out + (int64_t)l * E, *fo = s->out.ffn_out + (int64_t)l * E,
           *so = s->out.shexp_out + (int64_t)l * E;
    ref_rmsnorm(s->h, s->x, L->attn_norm, E, m->eps);
    if (L->linear)
        ref_qnext_linear(s, l, ao);
    else
        ref_qnext_full(s, l, ao);
    for (int64_t i = 0; i < E; i++) s->x[i] += ao[i];
    ref_rmsnorm(s->h, s->x, L->ffn_norm, E, m->eps);
    ref_qnext_shared(s, l, so);
    ref_experts(s, l, fo);
    for (int64_t i = 0; i < E; i++) s->x[i] += fo[i] + so[i];
    memcpy(s->out.x_out + (int64_t)l * E, s->x, (size_t)E * sizeof(double));
}
