/* The double-precision reference forward: see ref_forward.h. qwen3next and
 * qwen35moe's layers are ref_qwen3next.c's, mixtral, olmoe and glm4moe's
 * ref_moe_archs.c's; they use the attention, RoPE (over n_rot values) and
 * experts here.
 *
 * Per position p, x the residual stream (qwen3moe and gpt-oss; gpt-oss's
 * additions in brackets):
 *   x = token_embd[tok]
 *   per layer:
 *     h = x / sqrt(mean(x²) + eps) * attn_norm
 *     q, k, v = Wq h [+ bq], Wk h [+ bk], Wv h [+ bv]
 *     qwen3moe: q_h, k_h = rmsnorm(q_h) * q_norm, rmsnorm(k_h) * k_norm per head
 *     RoPE, NeoX pairs (i, i + d/2): angle p·inv_freq_i, cos and sin [times YaRN's mscale]
 *     att_h = Σ_j softmax_j(q_h·k_j / sqrt(d) [; exp(sink_h) in the denominator]) v_j over
 *             the keys j ≤ p [and j > p - window on sliding layers], k_j, v_j of KV head
 *             h / (n_head / n_head_kv)
 *     attn_out = Wo att [+ bo];  x += attn_out
 *     h = rmsnorm(x) * ffn_norm (gpt-oss: post_attention_norm)
 *     r = W_router h [+ b_router]
 *     qwen3moe: P = softmax(r) over all experts, the k largest, weights P / Σ_k P
 *     gpt-oss: the k largest r, weights softmax over those k
 *     qwen3moe: e(h) = down(silu(gate h) ⊙ up h)
 *     gpt-oss:  g = min(gate h + bg, 7), u = clamp(up h + bu, -7, 7),
 *               e(h) = down(g·sigmoid(1.702 g)·(u + 1)) + bd
 *     ffn_out = Σ_k w_k e_k(h);  x += ffn_out
 *   logits = W_out (rmsnorm(x) * output_norm)   (W_out = token_embd when output is absent)
 * YaRN (HF _compute_yarn_parameters, truncate false): f_i = base^(-2i/d), correction
 * dims c(β) = d ln(orig / (2πβ)) / (2 ln base), lo = max(c(β_fast), 0), hi = min(c(β_slow),
 * d - 1), ramp_i = clamp((i - lo) / (hi - lo), 0, 1), inv_freq_i = f_i / factor · ramp_i +
 * f_i · (1 - ramp_i), mscale = 0.1 ln(factor) + 1. */
#include "ref_forward.h"
#include "ref_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

#define REF_PI 3.14159265358979323846

/* ---- loading ---- */

/* The scalar reference dequantizers (quant_type.c's table holds quant_ref.h's functions). */
static tm_status ref_dequantize(const tm_gguf_tensor *t, float *dst, const char *path) {
    const tm_type_traits *tr = quant_type_traits(t->type);
    if (!tr || !tr->dequantize)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "%s: tensor '%.*s' has type %s (%u), which has no reference "
                            "dequantizer",
                            path, (int)t->name.len, t->name.data, quant_type_name(t->type),
                            t->type);
    tr->dequantize(t->data, dst, t->n_elements);
    return TM_OK;
}

tm_status ref_tensor(const tm_gguf_file *f, float **out, int64_t n, int optional, const char *fmt,
                     ...) {
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    *out = NULL;
    const tm_gguf_tensor *t = gguf_file_find_tensor(f, name);
    if (!t)
        return optional ? TM_OK
                        : tm_error_set(TM_ERR_FORMAT, "%s: missing tensor '%s'", f->path, name);
    if (t->n_elements != n)
        return tm_error_set(TM_ERR_FORMAT, "%s: tensor '%s' has %lld values, want %lld", f->path,
                            name, (long long)t->n_elements, (long long)n);
    if (!(*out = malloc((size_t)n * sizeof(float))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    return ref_dequantize(t, *out, f->path);
}

tm_status ref_key(const tm_gguf_file *f, const char *arch, const char *key, int *iout, double *fout,
                  int optional) {
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    if (optional && !gguf_file_find_kv(f, full)) return TM_OK;
    uint32_t u = 0;
    float v = 0;
    tm_status st = iout ? gguf_file_get_u32(f, full, &u) : gguf_file_get_f32(f, full, &v);
    if (st) return tm_error_wrap(st, "%s", f->path);
    if (u > (1u << 30)) return tm_error_set(TM_ERR_FORMAT, "%s: key %s is %u", f->path, full, u);
    if (iout) *iout = (int)u;
    if (fout) *fout = v;
    return TM_OK;
}

/* The decimal a float was rounded from, assuming the shortest one: the file holds the RMS eps
 * as a float, HF's config the decimal (1e-6, stored as 9.99999997e-07). Where a norm's mean
 * square is small (qwen3next's gated RMSNorm per value head) the float's 2.5e-15 shifts the
 * result by up to 1e-10 relative. */
double ref_float_decimal(double v) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof(buf), "%.*g", digits, v);
        if (strtof(buf, NULL) == (float)v) return strtod(buf, NULL);
    }
    return v;
}

/* The hyper-parameters, RoPE's frequencies (YaRN's for gpt-oss) and the windows. */
static tm_status ref_config_load(const tm_gguf_file *f, ref_model *m, const char *a) {
    tm_status st;
    double base = 0;
    if ((st = ref_key(f, a, "block_count", &m->n_layer, NULL, 0)) ||
        (st = ref_key(f, a, "embedding_length", &m->n_embd, NULL, 0)) ||
        (st = ref_key(f, a, "attention.head_count", &m->n_head, NULL, 0)) ||
        (st = ref_key(f, a, "attention.head_count_kv", &m->n_head_kv, NULL, 0)) ||
        (st = ref_key(f, a, "expert_count", &m->n_expert, NULL, 0)) ||
        (st = ref_key(f, a, "expert_used_count", &m->n_used, NULL, 0)) ||
        /* Mixtral's and OLMoE's experts are feed_forward_length wide */
        (st = ref_key(f, a,
                      m->arch == REF_ARCH_MIXTRAL || m->arch == REF_ARCH_OLMOE
                          ? "feed_forward_length"
                          : "expert_feed_forward_length",
                      &m->n_ff, NULL, 0)) ||
        (st = ref_key(f, a, "attention.layer_norm_rms_epsilon", NULL, &m->eps, 0)) ||
        (st = ref_key(f, a, "rope.freq_base", NULL, &base, 0)))
        return st;
    if (!m->n_head || !m->n_head_kv || m->n_head % m->n_head_kv || !m->n_layer || !m->n_embd ||
        !m->n_used || m->n_used > m->n_expert || !m->n_ff)
        return tm_error_set(TM_ERR_FORMAT, "%s: inconsistent hyper-parameters", f->path);
    m->eps = ref_float_decimal(m->eps);
    m->head_dim = m->n_embd / m->n_head;
    if ((st = ref_key(f, a, "attention.key_length", &m->head_dim, NULL, 1))) return st;
    m->n_rot = m->head_dim; /* qwen3next: partial RoPE over its first dimension_count values */
    const int glm = m->arch == REF_ARCH_GLM4MOE, ds = m->arch == REF_ARCH_DEEPSEEK2;
    if ((ref_arch_hybrid(m->arch) || glm || ds) &&
        (st = ref_key(f, a, "rope.dimension_count", &m->n_rot, NULL, glm)))
        return st;
    if (m->n_rot % 2 || m->n_rot < 2 || m->n_rot > m->head_dim)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: %d values rotated of a head of %d, want an even count <= the head",
                            f->path, m->n_rot, m->head_dim);
    const int half = m->n_rot / 2;
    if (!(m->inv_freq = malloc((size_t)half * sizeof(double))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    const double d = m->n_rot;
    for (int i = 0; i < half; i++) m->inv_freq[i] = pow(base, -2.0 * i / d);
    m->mscale = 1.0;
    if (ref_arch_hybrid(m->arch)) return ref_qnext_config_load(f, m, a);
    if (ref_arch_llmoe(m->arch)) return ref_moe_config_load(f, m, a);
    if (m->arch != REF_ARCH_GPTOSS) return TM_OK;
    double factor = 1, beta_fast = 32, beta_slow = 1;
    int orig = 0, window = 0;
    if ((st = ref_key(f, a, "rope.scaling.factor", NULL, &factor, 0)) ||
        (st = ref_key(f, a, "rope.scaling.original_context_length", &orig, NULL, 0)) ||
        (st = ref_key(f, a, "rope.scaling.yarn_beta_fast", NULL, &beta_fast, 1)) ||
        (st = ref_key(f, a, "rope.scaling.yarn_beta_slow", NULL, &beta_slow, 1)) ||
        (st = ref_key(f, a, "attention.sliding_window", &window, NULL, 0)))
        return st;
    double lo = d * log(orig / (beta_fast * 2 * REF_PI)) / (2 * log(base));
    double hi = d * log(orig / (beta_slow * 2 * REF_PI)) / (2 * log(base));
    lo = fmax(lo, 0), hi = fmin(hi, d - 1);
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        const double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
        m->inv_freq[i] = m->inv_freq[i] / factor * ramp + m->inv_freq[i] * (1 - ramp);
    }
    if (factor > 1) m->mscale = 0.1 * log(factor) + 1;
    for (int l = 0; l < m->n_layer; l++)
        m->layers[l].window = l % 2 == 0 ? window : 0; /* HF layer_types: even layers slide */
    return TM_OK;
}

static tm_status ref_layer_load(const tm_gguf_file *f, ref_model *m, int l) {
    ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd, Q = (int64_t)m->n_head * m->head_dim,
                  KV = (int64_t)m->n_head_kv * m->head_dim, X = m->n_expert, F = m->n_ff;
    const int oss = m->arch == REF_ARCH_GPTOSS;
    tm_status st;
    if (ref_arch_hybrid(m->arch)) return ref_qnext_layer_load(f, m, l);
    if (ref_arch_llmoe(m->arch)) return ref_moe_layer_load(f, m, l);
    if (m->arch == REF_ARCH_GEMMA4) return ref_gemma4_layer_load(f, m, l);
    if ((st = ref_tensor(f, &L->attn_norm, E, 0, "blk.%d.attn_norm.weight", l)) ||
        (st = ref_tensor(f, &L->wq, E * Q, 0, "blk.%d.attn_q.weight", l)) ||
        (st = ref_tensor(f, &L->wk, E * KV, 0, "blk.%d.attn_k.weight", l)) ||
        (st = ref_tensor(f, &L->wv, E * KV, 0, "blk.%d.attn_v.weight", l)) ||
        (st = ref_tensor(f, &L->wo, Q * E, 0, "blk.%d.attn_output.weight", l)) ||
        (st = ref_tensor(f, &L->router, E * X, 0, "blk.%d.ffn_gate_inp.weight", l)) ||
        (st = ref_tensor(f, &L->gate, E * F * X, 0, "blk.%d.ffn_gate_exps.weight", l)) ||
        (st = ref_tensor(f, &L->up, E * F * X, 0, "blk.%d.ffn_up_exps.weight", l)) ||
        (st = ref_tensor(f, &L->down, F * E * X, 0, "blk.%d.ffn_down_exps.weight", l)))
        return st;
    if (!oss)
        return (st = ref_tensor(f, &L->q_norm, m->head_dim, 0, "blk.%d.attn_q_norm.weight", l)) ||
                       (st = ref_tensor(f, &L->k_norm, m->head_dim, 0, "blk.%d.attn_k_norm.weight",
                                        l)) ||
                       (st = ref_tensor(f, &L->ffn_norm, E, 0, "blk.%d.ffn_norm.weight", l))
                   ? st
                   : TM_OK;
    if ((st = ref_tensor(f, &L->bq, Q, 0, "blk.%d.attn_q.bias", l)) ||
        (st = ref_tensor(f, &L->bk, KV, 0, "blk.%d.attn_k.bias", l)) ||
        (st = ref_tensor(f, &L->bv, KV, 0, "blk.%d.attn_v.bias", l)) ||
        (st = ref_tensor(f, &L->bo, E, 0, "blk.%d.attn_output.bias", l)) ||
        (st = ref_tensor(f, &L->sinks, m->n_head, 0, "blk.%d.attn_sinks.weight", l)) ||
        (st = ref_tensor(f, &L->ffn_norm, E, 0, "blk.%d.post_attention_norm.weight", l)) ||
        (st = ref_tensor(f, &L->router_b, X, 0, "blk.%d.ffn_gate_inp.bias", l)) ||
        (st = ref_tensor(f, &L->gate_b, F * X, 0, "blk.%d.ffn_gate_exps.bias", l)) ||
        (st = ref_tensor(f, &L->up_b, F * X, 0, "blk.%d.ffn_up_exps.bias", l)) ||
        (st = ref_tensor(f, &L->down_b, E * X, 0, "blk.%d.ffn_down_exps.bias", l)))
        return st;
    return TM_OK;
}

tm_status ref_model_load(const char *path, ref_model **out) {
    *out = NULL;
    tm_gguf_file *f;
    tm_status st = gguf_file_open(path, &f);
    if (st) return st;
    tm_gguf_str arch = {0};
    ref_model *m = calloc(1, sizeof(*m));
    if (!m) {
        gguf_file_close(f);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    if ((st = gguf_file_get_str(f, "general.architecture", &arch))) goto done;
    static const char *const names[] = {"qwen3moe", "gpt-oss", "qwen3next", "qwen35moe", "llama",
                                        "olmoe",    "glm4moe", "deepseek2", "gemma4"};
    static const ref_arch archs[] = {REF_ARCH_QWEN3MOE,  REF_ARCH_GPTOSS,    REF_ARCH_QWEN3NEXT,
                                     REF_ARCH_QWEN35MOE, REF_ARCH_MIXTRAL,   REF_ARCH_OLMOE,
                                     REF_ARCH_GLM4MOE,   REF_ARCH_DEEPSEEK2, REF_ARCH_GEMMA4};
    const char *a = NULL;
    for (int i = 0; i < 9 && !a; i++)
        if (gguf_str_eq(arch, names[i])) a = names[i], m->arch = archs[i];
    if (!a) {
        st = tm_error_set(TM_ERR_UNSUPPORTED,
                          "%s: architecture '%.*s': the reference has "
                          "qwen3moe, gpt-oss, qwen3next, qwen35moe, llama, olmoe, glm4moe, "
                          "deepseek2 and gemma4",
                          path, (int)(arch.len > 32 ? 32 : arch.len), arch.data);
        goto done;
    }
    int layers = 0;
    if ((st = ref_key(f, a, "block_count", &layers, NULL, 0))) goto done;
    if (!(m->layers = calloc((size_t)layers ? (size_t)layers : 1, sizeof(ref_layer)))) {
        st = tm_error_set(TM_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = m->arch == REF_ARCH_GEMMA4 ? ref_gemma4_config_load(f, m, a)
                                         : ref_config_load(f, m, a)))
        goto done;
    const tm_gguf_tensor *embd = gguf_file_find_tensor(f, "token_embd.weight");
    if (!embd || embd->ne[0] != m->n_embd) {
        st = tm_error_set(TM_ERR_FORMAT, "%s: token_embd.weight missing or not %d wide", path,
                          m->n_embd);
        goto done;
    }
    m->n_vocab = (int)embd->ne[1];
    const int64_t EV = (int64_t)m->n_embd * m->n_vocab;
    if ((st = ref_tensor(f, &m->embd, EV, 0, "token_embd.weight")) ||
        (st = ref_tensor(f, &m->out_norm, m->n_embd, 0, "output_norm.weight")) ||
        (st = ref_tensor(f, &m->out, EV, m->arch != REF_ARCH_GPTOSS, "output.weight")))
        goto done;
    for (int l = 0; l < m->n_layer && !st; l++) st = ref_layer_load(f, m, l);
done:
    gguf_file_close(f);
    if (st)
        ref_model_free(m);
    else
        *out = m;
    return st;
}

void ref_model_free(ref_model *m) {
    if (!m) return;
    for (int l = 0; m->layers && l < m->n_layer; l++) {
        ref_layer *L = &m->layers[l];
        float *all[] = {L->attn_norm, L->wq,   L->wk, L->wv,   L->wo,     L->q_norm,   L->k_norm,
                        L->bq,        L->bk,   L->bv, L->bo,   L->sinks,  L->ffn_norm, L->router,
                        L->router_b,  L->gate, L->up, L->down, L->gate_b, L->up_b,     L->down_b};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
        ref_qnext_layer_free(L);
        ref_moe_layer_free(L);
        ref_gemma4_layer_free(L);
    }
    free(m->layers), free(m->inv_freq), free(m->inv_freq_swa), free(m->embd), free(m->out_norm),
        free(m->out);
    free(m);
}

/* ---- the math ---- */

void ref_matvec(double *y, const float *w, const float *b, const double *x, int64_t n_out,
                int64_t n_in) {
    for (int64_t o = 0; o < n_out; o++) {
        double s = 0;
        const float *row = w + o * n_in;
        for (int64_t i = 0; i < n_in; i++) s += (double)row[i] * x[i];
        y[o] = s + (b ? b[o] : 0.0);
    }
}

void ref_rmsnorm(double *y, const double *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

void ref_rope(const ref_model *m, double *x, int64_t p) {
    const int half = m->n_rot / 2;
    for (int i = 0; i < half; i++) {
        const double ang = (double)p * m->inv_freq[i];
        const double c = cos(ang) * m->mscale, s = sin(ang) * m->mscale;
        const double a = x[i], b = x[i + half];
        x[i] = a * c - b * s, x[i + half] = b * c + a * s;
    }
}

void ref_topk(const double *v, int n, int k, int32_t *ids) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= ids[i] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        ids[j] = best;
    }
}

void ref_attention(ref_seq *s, int l) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int d = m->head_dim, group = m->n_head / m->n_head_kv;
    const int64_t KV = (int64_t)m->n_head_kv * d, p = s->n_past;
    const int64_t first = L->window && p - L->window + 1 > 0 ? p - L->window + 1 : 0;
    const double *kc = s->k + (int64_t)l * s->n_ctx * KV, *vc = s->v + (int64_t)l * s->n_ctx * KV;
    for (int h = 0; h < m->n_head; h++) {
        const double *q = s->q + (int64_t)h * d;
        const int64_t g = h / group;
        double mx = L->sinks ? L->sinks[h] : -INFINITY;
        for (int64_t j = first; j <= p; j++) {
            double dot = 0;
            for (int i = 0; i < d; i++) dot += q[i] * kc[j * KV + g * d + i];
            s->score[j] = dot / sqrt((double)d);
            mx = fmax(mx, s->score[j]);
        }
        double den = L->sinks ? exp(L->sinks[h] - mx) : 0;
        for (int64_t j = first; j <= p; j++) den += (s->score[j] = exp(s->score[j] - mx));
        double *o = s->att + (int64_t)h * d;
        for (int i = 0; i < d; i++) o[i] = 0;
        for (int64_t j = first; j <= p; j++)
            for (int i = 0; i < d; i++) o[i] += s->score[j] / den * vc[j * KV + g * d + i];
    }
}

void ref_experts(ref_seq *s, int l, double *ffn) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd;
    const int K = m->n_used;
    double *r = s->out.router_logits + (int64_t)l * m->n_expert;
    int32_t *ids = s->out.topk_ids + (int64_t)l * K;
    double *w = s->out.topk_w + (int64_t)l * K;
    ref_matvec(r, L->router, L->router_b, s->h, m->n_expert, E);
    ref_topk(r, m->n_expert, K, ids);
    /* qwen3moe: softmax over all, renormalised over the k; gpt-oss: softmax over the k. Both
       are exp(r_j - r_max) / Σ_k exp(r_k - r_max) over the selected k. */
    double sum = 0;
    for (int j = 0; j < K; j++) sum += (w[j] = exp(r[ids[j]] - r[ids[0]]));
    for (int j = 0; j < K; j++) w[j] /= sum;
    ref_experts_sum(s, l, ffn);
}

void ref_experts_sum(ref_seq *s, int l, double *ffn) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd, F = m->n_ff;
    const int K = m->n_used;
    const int32_t *ids = s->out.topk_ids + (int64_t)l * K;
    const double *w = s->out.topk_w + (int64_t)l * K;
    for (int64_t i = 0; i < E; i++) ffn[i] = 0;
    for (int j = 0; j < K; j++) {
        const int64_t x = ids[j];
        ref_matvec(s->ff_g, L->gate + x * F * E, L->gate_b ? L->gate_b + x * F : NULL, s->h, F, E);
        ref_matvec(s->ff_u, L->up + x * F * E, L->up_b ? L->up_b + x * F : NULL, s->h, F, E);
        for (int64_t i = 0; i < F; i++) {
            double g = s->ff_g[i], u = s->ff_u[i];
            if (m->arch == REF_ARCH_GPTOSS) {
                g = fmin(g, 7.0), u = fmax(fmin(u, 7.0), -7.0);
                s->ff_g[i] = g / (1 + exp(-1.702 * g)) * (u + 1);
            } else {
                s->ff_g[i] = g / (1 + exp(-g)) * u;
            }
        }
        ref_matvec(s->tmp, L->down + x * E * F, L->down_b ? L->down_b + x * E : NULL, s->ff_g, E,
                   F);
        for (int64_t i = 0; i < E; i++) ffn[i] += w[j] * s->tmp[i];
    }
}

static void ref_layer_step(ref_seq *s, int l) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int d = m->head_dim;
    const int64_t E = m->n_embd, Q = (int64_t)m->n_head * d, KV = (int64_t)m->n_head_kv * d;
    ref_rmsnorm(s->h, s->x, L->attn_norm, E, m->eps);
    ref_matvec(s->q, L->wq, L->bq, s->h, Q, E);
    ref_matvec(s->kk, L->wk, L->bk, s->h, KV, E);
    ref_matvec(s->vv, L->wv, L->bv, s->h, KV, E);
    for (int h = 0; h < m->n_head; h++) {
        if (L->q_norm) ref_rmsnorm(s->q + h * d, s->q + h * d, L->q_norm, d, m->eps);
        ref_rope(m, s->q + h * d, s->n_past);
    }
    for (int h = 0; h < m->n_head_kv; h++) {
        if (L->k_norm) ref_rmsnorm(s->kk + h * d, s->kk + h * d, L->k_norm, d, m->eps);
        ref_rope(m, s->kk + h * d, s->n_past);
    }
    const int64_t at = ((int64_t)l * s->n_ctx + s->n_past) * KV;
    memcpy(s->k + at, s->kk, (size_t)KV * sizeof(double));
    memcpy(s->v + at, s->vv, (size_t)KV * sizeof(double));
    ref_attention(s, l);
    double *ao = s->out.attn_out + (int64_t)l * E, *fo = s->out.ffn_out + (int64_t)l * E;
    ref_matvec(ao, L->wo, L->bo, s->att, E, Q);
    for (int64_t i = 0; i < E; i++) s->x[i] += ao[i];
    ref_rmsnorm(s->h, s->x, L->ffn_norm, E, m->eps);
    ref_experts(s, l, fo);
    for (int64_t i = 0; i < E; i++) s->x[i] += fo[i];
    memcpy(s->out.x_out + (int64_t)l * E, s->x, (size_t)E * sizeof(double));
}

tm_status ref_seq_step(ref_seq *s, int32_t token) {
    const ref_model *m = s->m;
    if (token < 0 || token >= m->n_vocab)
        return tm_error_set(TM_ERR_ARG, "reference: token %d out of [0, %d)", token, m->n_vocab);
    if (s->n_past >= s->n_ctx)
        return tm_error_set(TM_ERR_ARG, "reference: the sequence holds %lld positions",
                            (long long)s->n_ctx);
    const int64_t E = m->n_embd;
    const double es = m->embd_scale ? m->embd_scale : 1.0; /* gemma4: sqrt(n_embd) */
    for (int64_t i = 0; i < E; i++) s->x[i] = m->embd[(int64_t)token * E + i] * es;
    for (int l = 0; l < m->n_layer; l++)
        if (ref_arch_hybrid(m->arch))
            ref_qnext_layer_step(s, l);
        else if (ref_arch_llmoe(m->arch))
            ref_moe_layer_step(s, l);
        else if (m->arch == REF_ARCH_GEMMA4)
            ref_gemma4_layer_step(s, l);
        else
            ref_layer_step(s, l);
    ref_rmsnorm(s->h, s->x, m->out_norm, E, m->eps);
    ref_matvec(s->out.logits, m->out ? m->out : m->embd, NULL, s->h, m->n_vocab, E);
    for (int64_t i = 0; m->softcap > 0 && i < m->n_vocab; i++) /* gemma4's soft-cap */
        s->out.logits[i] = m->softcap * tanh(s->out.logits[i] / m->softcap);
    s->n_past++;
    return TM_OK;
}

tm_status ref_seq_create(const ref_model *m, int64_t n_ctx, ref_seq **out) {
    *out = NULL;
    ref_seq *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    s->m = m, s->n_ctx = n_ctx;
    const int64_t L = m->n_layer, E = m->n_embd, Q = (int64_t)m->n_head * m->head_dim,
                  KV = (int64_t)m->n_head_kv * m->head_dim,
                  big0 = E > m->n_ff ? (E > m->n_ff_shexp ? E : m->n_ff_shexp)
                                     : (m->n_ff > m->n_ff_shexp ? m->n_ff : m->n_ff_shexp),
                  big = big0 > m->n_ff_dense ? big0 : m->n_ff_dense;
    double **bufs[] = {&s->k,
                       &s->v,
                       &s->x,
                       &s->h,
                       &s->q,
                       &s->kk,
                       &s->vv,
                       &s->att,
                       &s->score,
                       &s->ff_g,
                       &s->ff_u,
                       &s->tmp,
                       &s->out.logits,
                       &s->out.attn_out,
                       &s->out.router_logits,
                       &s->out.topk_w,
                       &s->out.ffn_out,
                       &s->out.x_out,
                       &s->g4_tmp};
    const int64_t sizes[] = {L * n_ctx * KV,
                             L * n_ctx * KV,
                             E,
                             E,
                             Q,
                             KV,
                             KV,
                             Q,
                             n_ctx,
                             big,
                             big,
                             big,
                             m->n_vocab,
                             L * E,
                             L * m->n_expert,
                             L * m->n_used,
                             L * E,
                             L * E,
                             E};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (!(*bufs[i] = calloc((size_t)sizes[i] ? (size_t)sizes[i] : 1, sizeof(double)))) {
            ref_seq_free(s);
            return tm_error_set(TM_ERR_NOMEM, "out of memory");
        }
    if (!(s->out.topk_ids = calloc((size_t)(L * m->n_used), sizeof(int32_t)))) {
        ref_seq_free(s);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    tm_status st = ref_arch_hybrid(m->arch) ? ref_qnext_seq_init(s)
                   : ref_arch_llmoe(m->arch) || m->arch == REF_ARCH_GEMMA4
                       ? ref_moe_seq_init(s) /* dense_out too */
                       : TM_OK;
    if (st) {
        ref_seq_free(s);
        return st;
    }
    *out = s;
    return TM_OK;
}

void ref_seq_free(ref_seq *s) {
    if (!s) return;
    double *bufs[] = {s->k,
                      s->v,
                      s->x,
                      s->h,
                      s->q,
                      s->kk,
                      s->vv,
                      s->att,
                      s->score,
                      s->ff_g,
                      s->ff_u,
                      s->tmp,
                      s->out.logits,
                      s->out.attn_out,
                      s->out.router_logits,
                      s->out.topk_w,
                      s->out.ffn_out,
                      s->out.x_out,
                      s->g4_tmp};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    free(s->out.topk_ids);
    ref_moe_seq_free(s); /* first: it takes shexp_out, which ref_qnext_seq_free frees too */
    ref_qnext_seq_free(s);
    free(s);
}

const ref_step_out *ref_seq_out(const ref_seq *s) {
    return &s->out;
}

tm_status ref_seq_rewind(ref_seq *s, int64_t n_past) {
    if (n_past < 0)
        return tm_error_set(TM_ERR_ARG, "reference: rewind to position %lld", (long long)n_past);
    if (n_past >= s->n_past) return TM_OK;
    if (ref_arch_hybrid(s->m->arch)) {
        /* S_p folds every position before p in: no S_p for p < n_past is kept */
        if (n_past)
            return tm_error_set(TM_ERR_UNSUPPORTED,
                                "reference: rewind to position %lld of %lld: a linear-attention "
                                "state holds only the latest position; only a rewind to 0 "
                                "(a cleared state) is possible",
                                (long long)n_past, (long long)s->n_past);
        ref_qnext_seq_clear(s);
    }
    s->n_past = n_past;
    return TM_OK;
}

double ref_route_gap(const double *r, int n_expert, int k) {
    if (k >= n_expert) return INFINITY;
    double kth = INFINITY, next = -INFINITY, ss = 0; /* the k-th largest and the one below */
    for (int e = 0; e < n_expert; e++) {
        int above = 0; /* values ranked before e (ties to the lower id) */
        for (int f = 0; f < n_expert; f++) above += r[f] > r[e] || (r[f] == r[e] && f < e);
        if (above == k - 1) kth = r[e];
        if (above == k) next = r[e];
        ss += r[e] * r[e];
    }
    return (kth - next) / fmax(sqrt(ss / n_expert), 1e-300);
}

double ref_layer_route_gap(const ref_model *m, int l, const double *r) {
    return ref_arch_llmoe(m->arch) ? ref_moe_route_gap(m, l, r)
                                   : ref_route_gap(r, m->n_expert, m->n_used);
}

double ref_step_route_gap(const ref_model *m, const ref_step_out *o) {
    double worst = INFINITY;
    for (int l = 0; l < m->n_layer; l++)
        worst = fmin(worst, ref_layer_route_gap(m, l, o->router_logits + (int64_t)l * m->n_expert));
    return worst;
}
