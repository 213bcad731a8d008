/* The reference's DeepSeek-V3 attention (arch deepseek2; see ref_forward.h), written
 * from HF transformers' modeling_deepseek_v3.py (DeepseekV3Attention) in its own,
 * expanded form, not the engine's absorbed one. One token at position p:
 *
 *   q = W_qb (rmsnorm(W_qa h) * q_a_norm)   (no q_lora_rank: W_q h)   [n_head][nope + rope]
 *   [c ; k_pe] = W_kva h;  c = rmsnorm(c) * kv_a_norm                   kv_lora, rope
 *   q_pe, k_pe turned at angle p·inv_freq_i, pairs (2i, 2i + 1) (HF rope_interleave; the
 *     converter keeps the rows), YaRN's inv_freq (truncate: floor / ceil of the range)
 *   the cache keeps c and k_pe of every position; for each head h and cached position t:
 *     k_t[h] = [W_kb[h]ᵀ c_t ; k_pe_t],  v_t[h] = W_vb[h] c_t     (HF's kv_b_proj, split by the
 *                                                                converter into k_b and v_b)
 *     att[h] = Σ_t softmax_t(q[h] · k_t[h] · scale) v_t[h]
 *   scale = (1 + yarn_log_multiplier · ln(factor))² / sqrt(nope + rope)  (HF: mscale_all_dim)
 *   attn_out = W_o att
 * Test code only: nothing here is shared with src/. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_internal.h"

#define REF_MLA_PI 3.14159265358979323846

tm_status ref_mla_config_load(const tm_gguf_file *f, ref_model *m, const char *a) {
    int key_mla = 0;
    m->q_lora = 0, m->v_head = 0;
    tm_status st;
    if ((st = ref_key(f, a, "attention.q_lora_rank", &m->q_lora, NULL, 1)) ||
        (st = ref_key(f, a, "attention.kv_lora_rank", &m->kv_lora, NULL, 0)) ||
        (st = ref_key(f, a, "attention.key_length_mla", &key_mla, NULL, 0)) ||
        (st = ref_key(f, a, "attention.value_length_mla", &m->v_head, NULL, 0)))
        return st;
    m->nope = key_mla - m->n_rot;
    if (m->n_head_kv != 1 || m->nope < 1 || m->kv_lora < 1 || m->v_head < 1 ||
        m->head_dim != m->kv_lora + m->n_rot)
        return tm_error_set(TM_ERR_FORMAT, "%s: inconsistent MLA hyper-parameters", f->path);
    /* YaRN, when the file says so */
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
    tm_gguf_str type = {0};
    if (gguf_file_find_kv(f, key) && (st = gguf_file_get_str(f, key, &type))) return st;
    double mscale = 1;
    if (type.len && gguf_str_eq(type, "yarn")) {
        double factor = 1, base = 0, beta_fast = 32, beta_slow = 1, log_mul = 0;
        int orig = 0;
        if ((st = ref_key(f, a, "rope.freq_base", NULL, &base, 0)) ||
            (st = ref_key(f, a, "rope.scaling.factor", NULL, &factor, 0)) ||
            (st = ref_key(f, a, "rope.scaling.original_context_length", &orig, NULL, 0)) ||
            (st = ref_key(f, a, "rope.scaling.yarn_beta_fast", NULL, &beta_fast, 1)) ||
            (st = ref_key(f, a, "rope.scaling.yarn_beta_slow", NULL, &beta_slow, 1)) ||
            (st = ref_key(f, a, "rope.scaling.yarn_log_multiplier", NULL, &log_mul, 1)))
            return st;
        const double d = m->n_rot;
        double lo = floor(d * log(orig / (beta_fast * 2 * REF_MLA_PI)) / (2 * log(base)));
        double hi = ceil(d * log(orig / (beta_slow * 2 * REF_MLA_PI)) / (2 * log(base)));
        lo = fmax(lo, 0), hi = fmin(hi, d - 1);
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < m->n_rot / 2; i++) {
            const double f0 = pow(base, -2.0 * i / d);
            const double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
            m->inv_freq[i] = f0 / factor * ramp + f0 * (1 - ramp);
        }
        /* the file's f32 of 0.1 · mscale_all_dim, as the decimal it was written from */
        char buf[32];
        for (int digits = 1; digits <= 9; digits++) {
            snprintf(buf, sizeof(buf), "%.*g", digits, log_mul);
            if (strtof(buf, NULL) == (float)log_mul) break;
        }
        log_mul = strtod(buf, NULL);
        if (factor > 1) mscale = 1 + log_mul * log(factor);
    }
    m->attn_scale = mscale * mscale / sqrt((double)key_mla);
    return TM_OK;
}

tm_status ref_mla_layer_load(const tm_gguf_file *f, ref_model *m, int l) {
    ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd, H = m->n_head, DK = m->nope + m->n_rot, C = m->kv_lora;
    tm_status st;
    if (m->q_lora) {
        if ((st = ref_tensor(f, &L->wq_a, E * m->q_lora, 0, "blk.%d.attn_q_a.weight", l)) ||
            (st = ref_tensor(f, &L->q_a_norm, m->q_lora, 0, "blk.%d.attn_q_a_norm.weight", l)) ||
            (st = ref_tensor(f, &L->wq, m->q_lora * H * DK, 0, "blk.%d.attn_q_b.weight", l)))
            return st;
    } else if ((st = ref_tensor(f, &L->wq, E * H * DK, 0, "blk.%d.attn_q.weight", l))) {
        return st;
    }
    if ((st = ref_tensor(f, &L->wkv_a, E * (C + m->n_rot), 0, "blk.%d.attn_kv_a_mqa.weight", l)) ||
        (st = ref_tensor(f, &L->kv_a_norm, C, 0, "blk.%d.attn_kv_a_norm.weight", l)) ||
        (st = ref_tensor(f, &L->wkb, H * C * m->nope, 0, "blk.%d.attn_k_b.weight", l)) ||
        (st = ref_tensor(f, &L->wvb, H * m->v_head * C, 0, "blk.%d.attn_v_b.weight", l)) ||
        (st = ref_tensor(f, &L->wo, H * m->v_head * E, 0, "blk.%d.attn_output.weight", l)))
        return st;
    return TM_OK;
}

void ref_mla_layer_free(ref_layer *L) {
    free(L->wq_a), free(L->q_a_norm), free(L->wkv_a), free(L->kv_a_norm), free(L->wkb),
        free(L->wvb);
    L->wq_a = L->q_a_norm = L->wkv_a = L->kv_a_norm = L->wkb = L->wvb = NULL;
}

/* Pairs (2i, 2i + 1) of n values at position p. */
static void ref_mla_rope(const ref_model *m, double *x, int64_t p) {
    for (int i = 0; i < m->n_rot / 2; i++) {
        const double ang = (double)p * m->inv_freq[i], c = cos(ang), sn = sin(ang);
        const double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * sn, x[2 * i + 1] = b * c + a * sn;
    }
}

tm_status ref_mla_seq_init(ref_seq *s) {
    const ref_model *m = s->m;
    const int64_t H = m->n_head, DK = m->nope + m->n_rot;
    if (!(s->mla_q = malloc(sizeof(double) * (size_t)(H * DK))) ||
        !(s->mla_qa = malloc(sizeof(double) * (size_t)(m->q_lora ? m->q_lora : 1))) ||
        !(s->mla_kn = malloc(sizeof(double) * (size_t)(s->n_ctx * m->nope))) ||
        !(s->mla_vt = malloc(sizeof(double) * (size_t)(s->n_ctx * m->v_head))) ||
        !(s->mla_att = malloc(sizeof(double) * (size_t)(H * m->v_head))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    return TM_OK;
}

void ref_mla_seq_free(ref_seq *s) {
    free(s->mla_q), free(s->mla_qa), free(s->mla_kn), free(s->mla_vt), free(s->mla_att);
    s->mla_q = s->mla_qa = s->mla_kn = s->mla_vt = s->mla_att = NULL;
}

void ref_mla_attention(ref_seq *s, int l, double *attn_out) {
    const ref_model *m = s->m;
    const ref_layer *L = &m->layers[l];
    const int64_t E = m->n_embd, H = m->n_head, R = m->n_rot, N = m->nope, DK = N + R,
                  C = m->kv_lora, DV = m->v_head, T = s->n_past + 1;
    double *q = s->mla_q, *qa = s->mla_qa, *kn = s->mla_kn, *vt = s->mla_vt, *sc = s->score,
           *att = s->mla_att;
    memset(att, 0, sizeof(double) * (size_t)(H * DV));
    if (m->q_lora) {
        ref_matvec(qa, L->wq_a, NULL, s->h, m->q_lora, E);
        ref_rmsnorm(qa, qa, L->q_a_norm, m->q_lora, m->eps);
        ref_matvec(q, L->wq, NULL, qa, H * DK, m->q_lora);
    } else {
        ref_matvec(q, L->wq, NULL, s->h, H * DK, E);
    }
    /* this position's latent and RoPE key into the cache */
    double *kv = s->k + ((int64_t)l * s->n_ctx + s->n_past) * (C + R);
    ref_matvec(kv, L->wkv_a, NULL, s->h, C + R, E);
    ref_rmsnorm(kv, kv, L->kv_a_norm, C, m->eps);
    ref_mla_rope(m, kv + C, s->n_past);
    for (int64_t h = 0; h < H; h++) ref_mla_rope(m, q + h * DK + N, s->n_past);
    for (int64_t h = 0; h < H; h++) {
        const float *kb = L->wkb + h * C * N, *vb = L->wvb + h * DV * C;
        double mx = -INFINITY, z = 0;
        for (int64_t t = 0; t < T; t++) {
            const double *ct = s->k + ((int64_t)l * s->n_ctx + t) * (C + R);
            for (int64_t i = 0; i < N; i++) { /* k_nope = W_kbᵀ c: kb is [C][N] */
                double acc = 0;
                for (int64_t c = 0; c < C; c++) acc += (double)kb[c * N + i] * ct[c];
                kn[t * N + i] = acc;
            }
            ref_matvec(vt + t * DV, vb, NULL, ct, DV, C); /* v = W_vb c: vb is [DV][C] */
            double dot = 0;
            for (int64_t i = 0; i < N; i++) dot += q[h * DK + i] * kn[t * N + i];
            for (int64_t j = 0; j < R; j++) dot += q[h * DK + N + j] * ct[C + j];
            sc[t] = dot * m->attn_scale;
            mx = fmax(mx, sc[t]);
        }
        for (int64_t t = 0; t < T; t++) z += sc[t] = exp(sc[t] - mx);
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < DV; j++) att[h * DV + j] += sc[t] / z * vt[t * DV + j];
    }
    ref_matvec(attn_out, L->wo, NULL, att, E, H * DV);
}
