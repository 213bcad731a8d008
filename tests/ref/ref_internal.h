/* What ref_forward.c and ref_qwen3next.c share: the sequence's state and the
 * plain double-precision pieces both architectures families use (loading a
 * tensor or a key, a product, RMSNorm, RoPE, causal attention over the KV
 * cache, the softmax router and its SwiGLU experts). Test code only. */
#ifndef TM_TESTS_REF_INTERNAL_H
#define TM_TESTS_REF_INTERNAL_H

#include <stdint.h>

#include "gguf/gguf.h"
#include "ref_forward.h"

struct ref_seq {
    const ref_model *m;
    int64_t n_ctx, n_past;
    double *k, *v; /* [n_layer][n_ctx][n_head_kv * head_dim] */
    double *x, *h, *q, *kk, *vv, *att, *score, *ff_g, *ff_u, *tmp;
    /* qwen3next / qwen35moe (NULL for the others) */
    double *conv_state; /* [n_layer][conv_k - 1][C]: the previous conv_k - 1 inputs, oldest first */
    double *ssm_state;  /* [n_layer][n_v][k_dim][v_dim]: the delta rule's S per value head */
    double *qkv, *z, *b, *a, *ba, *delta, *gate; /* one position's: see ref_qnext_seq_init */
    /* deepseek2 (k holds each position's [c ; k_pe]): q, q's low rank, k_nope and v of the
       cached positions for one head, the heads' outputs */
    double *mla_q, *mla_qa, *mla_kn, *mla_vt, *mla_att;
    double *g4_tmp; /* [n_embd] gemma4's scratch */
    ref_step_out out;
};

static inline int ref_arch_hybrid(ref_arch a) {
    return a == REF_ARCH_QWEN3NEXT || a == REF_ARCH_QWEN35MOE;
}

/* Mixtral, OLMoE, GLM-4-MoE, DeepSeek-V3: ref_moe_archs.c's layers. */
static inline int ref_arch_llmoe(ref_arch a) {
    return a == REF_ARCH_MIXTRAL || a == REF_ARCH_OLMOE || a == REF_ARCH_GLM4MOE ||
           a == REF_ARCH_DEEPSEEK2;
}

/* Tensor name (printf-style) with n elements, widened to floats; *out NULL when it is
 * absent and optional. */
tm_status ref_tensor(const tm_gguf_file *f, float **out, int64_t n, int optional, const char *fmt,
                     ...) __attribute__((format(printf, 5, 6)));
/* Key arch.key into *iout (a count) or *fout (a float); absent and optional: left alone. */
tm_status ref_key(const tm_gguf_file *f, const char *arch, const char *key, int *iout, double *fout,
                  int optional);

/* y[o] = Σ_i w[o][i] x[i] (+ b[o]) */
void ref_matvec(double *y, const float *w, const float *b, const double *x, int64_t n_out,
                int64_t n_in);
/* y = x / sqrt(mean(x²) + eps) * w (y may be x) */
void ref_rmsnorm(double *y, const double *x, const float *w, int64_t n, double eps);
/* NeoX pairs (i, i + n_rot/2) of a head at position p. */
void ref_rope(const ref_model *m, double *x, int64_t p);
/* s->att = causal attention of s->q over layer l's cached keys and values (position n_past
 * already stored). */
void ref_attention(ref_seq *s, int l);
/* ffn = Σ_k w_k e_k(s->h) for layer l's routing of s->h; fills the router's outputs. */
void ref_experts(ref_seq *s, int l, double *ffn);
/* ffn = Σ_k w_k e_k(s->h) for the ids and weights of layer l in s->out. */
void ref_experts_sum(ref_seq *s, int l, double *ffn);
/* The k largest of v[0..n), highest first, ties to the lower index. */
void ref_topk(const double *v, int n, int k, int32_t *ids);

/* ref_qwen3next.c: the hyper-parameters of linear attention, the shared expert and the layer
 * pattern; one layer's tensors; the buffers and states of a sequence; one layer's step. */
tm_status ref_qnext_config_load(const tm_gguf_file *f, ref_model *m, const char *arch);
tm_status ref_qnext_layer_load(const tm_gguf_file *f, ref_model *m, int l);
void ref_qnext_layer_free(ref_layer *L);
tm_status ref_qnext_seq_init(ref_seq *s);
void ref_qnext_seq_free(ref_seq *s);
void ref_qnext_seq_clear(ref_seq *s);
void ref_qnext_layer_step(ref_seq *s, int l);

/* ref_moe_archs.c: the same for mixtral, olmoe and glm4moe. */
tm_status ref_moe_config_load(const tm_gguf_file *f, ref_model *m, const char *arch);
tm_status ref_moe_layer_load(const tm_gguf_file *f, ref_model *m, int l);
void ref_moe_layer_free(ref_layer *L);
tm_status ref_moe_seq_init(ref_seq *s);
void ref_moe_seq_free(ref_seq *s);
void ref_moe_layer_step(ref_seq *s, int l);
double ref_moe_route_gap(const ref_model *m, int l, const double *r);

/* The decimal a float was rounded from (the file's RMS eps; ref_forward.c). */
double ref_float_decimal(double v);

/* ref_gemma4.c: gemma4's keys (arrays a layer), a layer's tensors, one layer's step (the
 * embedding's scale and the soft-cap: ref_seq_step). */
tm_status ref_gemma4_config_load(const tm_gguf_file *f, ref_model *m, const char *arch);
tm_status ref_gemma4_layer_load(const tm_gguf_file *f, ref_model *m, int l);
void ref_gemma4_layer_free(ref_layer *L);
void ref_gemma4_layer_step(ref_seq *s, int l);

/* ref_mla.c: deepseek2's attention (MLA): its keys and YaRN, a layer's tensors, a sequence's
 * buffers, one position's attention output (s->h the normed input). */
tm_status ref_mla_config_load(const tm_gguf_file *f, ref_model *m, const char *arch);
tm_status ref_mla_layer_load(const tm_gguf_file *f, ref_model *m, int l);
void ref_mla_layer_free(ref_layer *L);
tm_status ref_mla_seq_init(ref_seq *s);
void ref_mla_seq_free(ref_seq *s);
void ref_mla_attention(ref_seq *s, int l, double *attn_out);

#endif
