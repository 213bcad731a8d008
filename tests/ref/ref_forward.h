/* An independent double-precision forward pass of the architectures the
 * placement matrix runs (qwen3moe and gpt-oss), for tests: the reference the
 * engine's placements are compared with; of the hybrid qwen3next and
 * qwen35moe (Gated DeltaNet linear attention and gated full attention, a
 * sigmoid-gated shared expert: tests/ref/ref_qwen3next.c); and of Mixtral
 * (arch llama), OLMoE and GLM-4-MoE (tests/ref/ref_moe_archs.c: interleaved
 * RoPE, q/k norms over the whole projection, dense layers, shared experts, the
 * sigmoid router with a selection bias and groups) and DeepSeek-V3 (arch deepseek2: the same
 * behind Multi-head Latent Attention, in HF's expanded form: tests/ref/ref_mla.c).
 *
 * Independent: it shares no code with src/moe, src/cpu, src/exec, src/tier or
 * src/model. It reads the file with the GGUF reader (src/gguf) and widens the
 * weights with the scalar dequantizers of src/quant/quant_ref.h (checked bit
 * for bit against the gguf python package by test_quant_oracle); everything
 * else (RMSNorm, RoPE and YaRN, attention with sinks and sliding windows, the
 * routers, top-k, both SwiGLUs) is written here again from the models' math
 * (tests/ref/qwen3moe_ref.py, HF's modeling_gpt_oss.py; docs/gptoss.md;
 * HF's modeling_qwen3_next.py and modeling_qwen3_5_moe.py) as
 * plain loops in double. Weights are kept as floats (a dequantized value is a
 * float exactly), products and sums are double, the KV cache and the linear
 * layers' conv and delta-rule states are double.
 *
 * One sequence, one token a step (a causal pass over all tokens gives the
 * same values as any batching); after each step the sequence's ref_step_out
 * holds the position's logits and every layer's intermediates under the
 * golden-dump names (docs/golden-format.md). test_ref_forward checks it
 * against the HF goldens of tests/data. Test code only. */
#ifndef TM_TESTS_REF_FORWARD_H
#define TM_TESTS_REF_FORWARD_H

#include <stdint.h>

#include "core/status.h"

typedef enum ref_arch {
    REF_ARCH_QWEN3MOE,
    REF_ARCH_GPTOSS,
    REF_ARCH_QWEN3NEXT, /* value heads grouped: head h uses key head h / (n_v / n_k) */
    REF_ARCH_QWEN35MOE, /* value heads tiled: head h uses key head h % n_k */
    REF_ARCH_MIXTRAL,   /* arch llama with experts */
    REF_ARCH_OLMOE,
    REF_ARCH_GLM4MOE,
    REF_ARCH_DEEPSEEK2, /* glm4moe's FFNs and router behind MLA (tests/ref/ref_mla.c) */
    REF_ARCH_GEMMA4,    /* Gemma 4's MoE form (tests/ref/ref_gemma4.c) */
} ref_arch;

/* One layer's weights, row-major as the file's ne order ([out][in]); NULL
 * where the architecture has none. */
typedef struct ref_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *bq, *bk, *bv, *bo, *sinks;
    float *ffn_norm, *router, *router_b; /* ffn_norm: qwen3next's post_attention_norm */
    float *gate, *up, *down;       /* [n_expert][n_ff][n_embd], ... [n_expert][n_embd][n_ff] */
    float *gate_b, *up_b, *down_b; /* [n_expert][n_ff], ... [n_expert][n_embd] */
    int64_t window;                /* keys a query sees (itself included); 0: all */
    /* qwen3next / qwen35moe: linear attention (Gated DeltaNet) on the layers marked linear
       (wq then holds per head its q and its gate), and the shared expert on all */
    int linear;
    float *wqkv, *wz;          /* [C][n_embd], [n_v * v_dim][n_embd]; C = 2 n_k k_dim + n_v v_dim */
    float *wba;                /* qwen3next: [n_k][b of its n_v/n_k value heads, then a][n_embd] */
    float *wbeta, *walpha;     /* qwen35moe: [n_v][n_embd] each */
    float *conv;               /* [C][conv_k] */
    float *ssm_a, *ssm_dt;     /* [n_v]: -exp(A_log) and dt_bias */
    float *ssm_norm, *ssm_out; /* [v_dim], [n_embd][n_v * v_dim] */
    float *sh_gate_inp;        /* [n_embd] */
    float *sh_gate, *sh_up, *sh_down; /* [n_ff_shexp][n_embd] twice, [n_embd][n_ff_shexp] */
    /* glm4moe: a leading dense layer's FFN, the router's selection bias */
    int dense;
    float *dn_gate, *dn_up, *dn_down; /* [n_ff_dense][n_embd] twice, [n_embd][n_ff_dense] */
    float *sel_b;                     /* [n_expert] exp_probs_b */
    /* deepseek2: MLA (wq is attn_q_b, or attn_q without q_lora_rank) */
    float *wq_a, *q_a_norm;   /* [q_lora][n_embd], [q_lora] */
    float *wkv_a, *kv_a_norm; /* [kv_lora + n_rot][n_embd], [kv_lora] */
    float *wkb, *wvb;         /* [n_head][kv_lora][nope], [n_head][v_head][kv_lora] */
    /* gemma4: the layer's KV heads and head size, global (else sliding: window), its norms
       around the blocks, the router's input scale and per-expert factors, the layer scale
       (wv NULL: K as V; dn_*: the dense MLP beside the experts) */
    int n_kv, hd, global;
    float *post_attn_norm, *post_ffw_norm_1, *post_ffw_norm_2, *pre_ffw_norm_2, *post_ffw_norm;
    float *router_scale, *expert_scale;
    double out_scale;
} ref_layer;

typedef struct ref_model {
    ref_arch arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_vocab, n_expert, n_used, n_ff;
    int n_rot; /* the first n_rot values of a head are rotated (head_dim but for the hybrids) */
    /* qwen3next / qwen35moe: linear attention's sizes and the shared expert's width */
    int conv_k, n_k_head, n_v_head, k_dim, v_dim, n_ff_shexp;
    /* mixtral, olmoe, glm4moe: the router (sigmoid: 1, else softmax; groups; renormalised;
       scaled), RoPE's pairs, dense layers' width */
    int sigmoid, n_group, n_group_used, norm_topk, interleaved, n_ff_dense;
    double scale;
    /* deepseek2: MLA's ranks and widths (head_dim: kv_lora + n_rot, the cached values of a
       position; n_head_kv 1) and the softmax's scale */
    int q_lora, kv_lora, nope, v_head;
    double attn_scale;
    double eps;
    double *inv_freq; /* [n_rot / 2]: RoPE's (YaRN's for gpt-oss; gemma4: the global layers') */
    /* gemma4: the sliding layers' head and RoPE, the embeddings' scale, the logit soft-cap
       (0: none); n_head_kv and head_dim the largest of the layers' (the KV cache's row) */
    int hd_swa;
    double *inv_freq_swa, base_swa, embd_scale, softcap;
    double mscale; /* YaRN's factor on cos and sin (1 without) */
    float *embd, *out_norm, *out;
    ref_layer *layers;
} ref_model;

/* What one step computed, for its position. */
typedef struct ref_step_out {
    double *logits;        /* [n_vocab] */
    double *attn_out;      /* [n_layer][n_embd], before the residual add */
    double *router_logits; /* [n_layer][n_expert] (with gpt-oss's bias) */
    int32_t *topk_ids;     /* [n_layer][n_used], highest first, ties to the lower id */
    double *topk_w;        /* [n_layer][n_used] */
    double *ffn_out;       /* [n_layer][n_embd] */
    double *x_out;         /* [n_layer][n_embd] */
    /* qwen3next / qwen35moe only (NULL for the others): */
    double *lin_core;  /* [n_layer][n_v * v_dim]: the delta rule's output before the gated
                          RMSNorm, in the file's value-head order; 0 on full-attention layers */
    double *shexp_out; /* [n_layer][n_embd]: the shared expert times its sigmoid gate (glm4moe:
                          the shared experts, unweighted) */
    double *dense_out; /* glm4moe: [n_layer][n_embd] a dense layer's FFN output */
} ref_step_out;

typedef struct ref_seq ref_seq;

/* Load a qwen3moe, gpt-oss, qwen3next, qwen35moe, llama (with experts), olmoe or
 * glm4moe GGUF: an error names the file and the key, tensor or type it could not take. */
tm_status ref_model_load(const char *path, ref_model **out);
void ref_model_free(ref_model *m);

/* A sequence of at most n_ctx positions, from position 0. */
tm_status ref_seq_create(const ref_model *m, int64_t n_ctx, ref_seq **out);
void ref_seq_free(ref_seq *s);
/* Evaluate token at the next position; the results are in ref_seq_out(s). */
tm_status ref_seq_step(ref_seq *s, int32_t token);
const ref_step_out *ref_seq_out(const ref_seq *s);
/* The smallest gap over layers between the step's k-th and (k+1)-th router logits, each
 * relative to the RMS of its layer's router logits: where it is below twice an
 * implementation's router-logit error (in the same unit), its routing may differ.
 * (ref_layer_route_gap per layer.) */
double ref_step_route_gap(const ref_model *m, const ref_step_out *o);
/* Layer l's gap for its router logits r, in the same unit: ref_route_gap, or for a sigmoid
 * router with a selection bias and groups (glm4moe) the least of 4x the gap between the k-th
 * and (k+1)-th selection score of the kept groups and 2x the gap between the last kept and
 * the first dropped group's score (a logit error e moves a sigmoid by e/4 at most, a group's
 * score of two by e/2), over the RMS of r; INFINITY for a dense layer (no router). */
double ref_layer_route_gap(const ref_model *m, int l, const double *r);
/* The same for one layer's n_expert router logits r and k experts used. */
double ref_route_gap(const double *r, int n_expert, int k);
/* Forget the positions from n_past on (the next step evaluates position n_past); n_past at or
 * past the sequence's end leaves it alone. A linear-attention layer's state (qwen3next,
 * qwen35moe) holds only the latest position, folded into it: such a sequence can go back to 0
 * (the states cleared) but to no other position, which is an error (TM_ERR_UNSUPPORTED) that
 * leaves the sequence as it was. */
tm_status ref_seq_rewind(ref_seq *s, int64_t n_past);

#endif
