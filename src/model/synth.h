/* Synthetic random-weight models for tests and benchmarks (`tiermoe mkmodel`).
 *
 * Writes a qwen3moe GGUF with the tensor names, shapes and metadata keys that
 * llama.cpp's converter writes for Qwen3-MoE. Weights are random but scaled
 * so the model stays healthy: token identity dominates the residual stream
 * (embedding std 1, small attention-output and expert-down projections), so
 * the router spreads tokens over the experts the way a trained model does
 * instead of collapsing onto a few.
 *
 * Routing skew: qwen3moe has no router bias tensor, so the bias lives in the
 * weights. Every token embedding carries a constant value `beta` in one
 * "bias channel" (dimension 0); the router's column for that channel holds
 * b_e / beta, which adds b_e to expert e's logit for every token. The b_e are
 * calibrated (on simulated Gaussian router noise) so that expert selection
 * frequencies follow a Zipf law rank^-s, with a different ranking per layer.
 * s = 0 gives b = 0: uniform routing. An offset q turns the law into
 * Zipf–Mandelbrot, (rank + q)^-s: a flat head and a steep tail, as trained
 * routers have (q = 0: plain Zipf).
 *
 * Temporal locality (synth_routing.c): the first KV group of layer 0 is a
 * recency head. Its q and k read only the bias channel, so after QK-norm they
 * are the same vector for every token and q·k depends only on the distance
 * through RoPE; that vector is chosen so the attention weights decay as
 * exp(-distance / span). Its values carry a random projection of the token's
 * own embedding (its "topic"), and its output projection writes the average
 * into a reserved subspace T of the residual stream that no other weight
 * writes and that token embeddings leave empty. T travels unchanged through
 * the residual connections, and every layer's router reads it: a share
 * `locality` of each router logit's variance is a moving average over the
 * last tokens, the rest the token itself. Only the weights change: the file
 * is a plain qwen3moe GGUF, for random token ids as for text.
 * locality = 0 writes exactly the bytes of a build without it.
 *
 * gpt-oss (arch "gpt-oss": presets gpt-oss-20b, gpt-oss-120b, tiny-gpt-oss)
 * writes llama.cpp's gpt-oss layout instead: q/k/v/o, router and expert
 * biases (small random), attention sinks, post_attention_norm, the sliding
 * window and YaRN keys; the same scaling (the expert down projection scaled
 * for the clamped SwiGLU's output) and the same router-bias channel for the
 * skew. Locality is not calibrated for it (no QK norm, YaRN, sinks, windows):
 * refused.
 *
 * qwen3next and qwen35moe (presets qwen3-next-80b-a3b, qwen3.5-35b-a3b,
 * tiny-qwen3next, tiny-qwen35moe; synth_hybrid.c) write the layout of
 * llama.cpp's converter for Qwen3-Next and Qwen3.5/3.6 MoE: linear-attention
 * layers (attn_qkv, attn_gate, ssm_conv1d, ssm_a, ssm_dt, ssm_ba or
 * ssm_beta + ssm_alpha, ssm_norm, ssm_out) and every full_attn_interval-th
 * layer gated attention (attn_q of q and gate per head, QK norm, partial
 * RoPE), each with a sigmoid-gated shared expert beside the routed experts.
 * The linear attention's decay e^g, g = ssm_a softplus(alpha + dt), is
 * drawn in [0.3, 0.99] and beta = sigmoid(b) mostly in [0.25, 0.75], as in
 * trained models. Skew as for qwen3moe; the recency head of --locality is
 * the first KV group of the first full-attention layer (its gate held
 * open), and every writer of the residual (ssm_out, the shared expert's down
 * projection too) leaves the topic subspace empty.
 *
 * Mixtral (arch "llama"), OLMoE, GLM-4.5 ("glm4moe") and DeepSeek-V3 / Kimi K2
 * ("deepseek2"; presets mixtral-8x7b, olmoe-1b-7b, glm-4.5-air, glm-4.5,
 * deepseek-v3, kimi-k2 and their tiny-* test shapes; synth_moe_archs.c) write
 * their converter layouts: GLM's q/k/v and selection biases small random, its
 * dense layers and shared expert scaled as experts, its NextN layer's tensors
 * (never run); DeepSeek's MLA tensors (q_a, q_b, kv_a_mqa, k_b, v_b) scaled by
 * their inputs. Skew as for qwen3moe (a sigmoid router ranks as its logits); no
 * locality. */
#ifndef TM_MODEL_SYNTH_H
#define TM_MODEL_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

/* What a tensor is to the choice of its quant type (synth_mix.c). */
typedef enum tm_synth_kind {
    TM_SYNTH_F32, /* norms, router, biases, sinks: always f32 */
    TM_SYNTH_EMBD,
    TM_SYNTH_OUTPUT,
    TM_SYNTH_ATTN_Q,
    TM_SYNTH_ATTN_K,
    TM_SYNTH_ATTN_V,
    TM_SYNTH_ATTN_O,
    TM_SYNTH_ATTN_QKV, /* linear attention's fused q, k, v (attn_qkv) */
    TM_SYNTH_ATTN_LIN, /* its other matrices: attn_gate, ssm_ba / ssm_beta / ssm_alpha, ssm_out */
    TM_SYNTH_GATE_EXPS,
    TM_SYNTH_UP_EXPS,
    TM_SYNTH_DOWN_EXPS,
    TM_SYNTH_GATE_SHEXP, /* the shared expert (qwen3next, qwen35moe) */
    TM_SYNTH_UP_SHEXP,
    TM_SYNTH_DOWN_SHEXP,
} tm_synth_kind;

/* --tensor-type PATTERN=TYPE: tensors whose name the PCRE2 pattern matches
 * (anywhere, as llama-quantize's --tensor-type) get TYPE; the first rule that
 * matches wins. */
typedef struct tm_synth_tensor_type {
    const char *pattern;
    tm_type type;
} tm_synth_tensor_type;
#define TM_SYNTH_MAX_TENSOR_TYPES 32

typedef struct tm_synth_config {
    /* general.architecture: "qwen3moe" (NULL), "gpt-oss", "qwen3next", "qwen35moe", "llama"
     * (Mixtral), "olmoe", "glm4moe", "deepseek2" or "gemma4" */
    const char *arch;
    uint32_t window;        /* gpt-oss: attention.sliding_window of the even layers */
    float rope_factor;      /* gpt-oss: YaRN factor */
    uint32_t rope_orig_ctx; /* gpt-oss: YaRN original context */
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used, n_ff_exp, n_ff; /* n_ff: dense FFN length (metadata only) */
    uint32_t n_vocab, n_ctx;
    float rope_base, rms_eps;
    /* qwen3next / qwen35moe (the hybrid architectures): every full_attn_interval-th
     * layer gated full attention, the others linear attention (Gated DeltaNet) of
     * ssm_k_heads key heads of ssm_k_dim and ssm_v_heads value heads of ssm_v_dim,
     * a causal conv of width ssm_conv; RoPE on the first n_rot values of a head
     * (0: all); a shared expert of width n_ff_shexp beside the routed ones. */
    uint32_t full_attn_interval, n_rot, ssm_conv, ssm_k_heads, ssm_v_heads, ssm_k_dim, ssm_v_dim;
    uint32_t n_ff_shexp;
    /* glm4moe (synth_moe_archs.c): the first n_dense layers dense (n_ff wide), n_shexp shared
     * experts (n_ff_exp wide each), the router's groups (0 or 1: none) and scale, QK norms;
     * n_nextn NextN (MTP) layers after the n_layer others (block_count counts them). RoPE
     * on the first n_rot values of a head. */
    uint32_t n_dense, n_shexp, n_group, n_group_used, n_nextn;
    float expert_scale;
    bool qk_norm;
    /* deepseek2 (synth_moe_archs.c; glm4moe's fields above too): MLA with q's low rank
     * mla_q_lora, the KV latent mla_kv_lora, query/key heads of head_dim = nope + n_rot, value
     * heads of mla_v_head; YaRN (rope_factor over rope_orig_ctx, yarn_beta_fast / _slow,
     * yarn_log_mul = 0.1 mscale_all_dim; rope_factor 0: plain RoPE) */
    uint32_t mla_q_lora, mla_kv_lora, mla_v_head;
    float yarn_beta_fast, yarn_beta_slow, yarn_log_mul;
    bool ds_v2_router; /* DeepSeek-V2's router: softmax, no selection bias, not renormalised */
    /* gemma4 (synth_gemma4.c): every full_attn_interval-th layer (and the last) global, with
     * heads of head_dim, n_head_kv KV heads, n_rot of a head turned at rope_base, K as V when
     * k_eq_v; the others sliding (window), heads of head_dim_swa, n_head_kv_swa KV heads,
     * RoPE over the head at rope_base_swa; the final logit soft-cap (0: none) */
    uint32_t head_dim_swa, n_head_kv_swa;
    float rope_base_swa, logit_softcap;
    bool k_eq_v;
    /* Each tensor's type, first match: a tensor_types rule; the gate/up/down
     * field of its kind; its class (experts, attn, embd, output, shexp); the recipe
     * (mix). TM_TYPE_COUNT: unset (a preset sets the classes, synth_config_mix
     * unsets them). Norms and router are f32. */
    tm_type type_experts, type_attn, type_embd, type_output, type_shexp;
    tm_type type_gate_exps, type_up_exps, type_down_exps;
    const char *mix; /* --mix: a recipe of synth_mix_list (NULL: none) */
    tm_synth_tensor_type tensor_types[TM_SYNTH_MAX_TENSOR_TYPES];
    uint32_t n_tensor_types;
    uint64_t seed;
    double skew;          /* Zipf exponent of expert popularity; 0 = uniform */
    double skew_offset;   /* Zipf–Mandelbrot offset q: popularity ∝ (rank + q)^-skew */
    double locality;      /* share of router-logit variance that is the recent-token average */
    double locality_span; /* e-folding distance of the recency head's attention (tokens) */
    const char *routing;  /* routing profile named by --routing (metadata), or NULL */
    /* --fill repeat (speed benches only): each weight matrix (attention, experts,
     * output) holds fill_rows distinct random rows, quantized once and repeated
     * through it in a pseudo-random order; its first fill_rows rows are the ones
     * a normal file has. Token embeddings, norms, routers and the rows the
     * locality layout sets are made in full, so routing stays random. Same
     * tensors, types and sizes as a normal file; the weights repeat. 0: every
     * row its own (the default). */
    uint32_t fill_rows;
    int n_threads;          /* generation threads (0 = all cores) */
    const char *name;       /* general.name */
    const char *vocab_json; /* HF tokenizer.json to embed, or NULL for no vocabulary */
    int progress;           /* print progress and rate to stderr */
} tm_synth_config;

/* --fill repeat's distinct rows per matrix unless --fill-rows says otherwise. */
#define SYNTH_FILL_ROWS_DEFAULT 256

/* Fill `cfg` from a preset: "tiny", "30b-a3b", "gpt-oss-20b", "gpt-oss-120b",
 * "tiny-gpt-oss", "qwen3-next-80b-a3b", "qwen3.5-35b-a3b" (alias
 * "qwen3.6-35b-a3b"), "tiny-qwen3next", "tiny-qwen35moe", "mixtral-8x7b",
 * "olmoe-1b-7b", "glm-4.5-air", "glm-4.5", "deepseek-v3", "kimi-k2", "tiny-mixtral",
 * "tiny-olmoe", "tiny-glm4moe", "tiny-deepseek-v3", "tiny-deepseek-v2-lite",
 * "gemma-4-26b-a4b" or "tiny-gemma-4". */
tm_status synth_config_preset(tm_synth_config *cfg, const char *preset);

/* ---- quant types per tensor (synth_mix.c) ---- */

/* A named recipe, like llama-quantize's ftypes (docs/quant.md has the tables). */
typedef struct tm_synth_mix_info {
    const char *name;    /* "Q4_K_M", "dynamic", ... */
    const char *summary; /* one line for --help */
} tm_synth_mix_info;
/* The recipes; *n gets how many. */
const tm_synth_mix_info *synth_mix_list(size_t *n);
/* --mix NAME (case-insensitive): the recipe picks every tensor's type, the
 * class types are unset so that --type-* flags given after it override the
 * recipe for their class. Fails naming the recipes otherwise. */
tm_status synth_config_mix(tm_synth_config *cfg, const char *name);
/* --tensor-type PATTERN=TYPE (split at the last '='): appends a rule; the
 * pattern is compiled when the model is checked (synth_config_validate). */
tm_status synth_config_tensor_type(tm_synth_config *cfg, const char *spec);

/* Check dimensions against each other and the quant types' block sizes. */
tm_status synth_config_validate(const tm_synth_config *cfg);

/* With vocab_json set: grow n_vocab to the vocabulary's size (a larger n_vocab
 * is kept: the token list is padded to it, as llama.cpp does up to
 * config.json's vocab_size). Fails naming the file when it cannot be imported. */
tm_status synth_config_apply_vocab(tm_synth_config *c);

/* Total bytes the file will have (approximately: metadata not counted). */
uint64_t synth_config_tensor_bytes(const tm_synth_config *cfg);

/* Write the model to `path` (atomically: temp file, then rename). */
tm_status synth_model_write(const tm_synth_config *cfg, const char *path);

/* Router biases per layer [n_layer][n_expert] for the configured skew (what
 * the writer bakes into the weights; tests use it to check the law). */
tm_status synth_router_biases(const tm_synth_config *cfg, float *bias);

/* ---- routing (synth_routing.c) ---- */

/* Expected selection frequency of each expert (sums to n_expert_used), in the
 * same order as synth_router_biases' layer 0 ranking before permutation:
 * target[r] ∝ (r + 1 + q)^-s for popularity rank r, none above 0.9. */
void synth_zipf_targets(uint32_t n_expert, uint32_t k, double s, double q, double *target);

/* Set skew, skew_offset, locality, locality_span and routing from a profile:
 * "uniform" (all 0) or "qwen3-30b-a3b" (calibrated on the 30b-a3b shape to the
 * statistics of synth_qwen3_targets). Fails naming the profile otherwise. */
tm_status synth_routing_profile(tm_synth_config *cfg, const char *name);

/* Published routing statistics of Qwen3-30B-A3B that the qwen3-30b-a3b profile
 * is calibrated to (shares in [0, 1]; docs/mkmodel.md). */
typedef struct tm_routing_targets {
    double top_half;   /* slots covered by the top 50% of a layer's experts */
    double top1;       /* slots of a layer's most used expert */
    double reuse_prev; /* a token's experts also used by the previous token */
    double reuse_win;  /* ... used by at least one of the previous 8 tokens */
    uint32_t win;      /* that 8 */
} tm_routing_targets;
extern const tm_routing_targets synth_qwen3_targets;

/* How the recency head and the topic subspace are laid out (locality > 0). */
#define SYNTH_LOC_MAX_HEAD_DIM 1024
typedef struct tm_synth_locality {
    uint32_t t0, t_len;     /* the topic subspace T: residual dims [t0, t0 + t_len) */
    uint32_t n_tok_dims;    /* dims that carry token identity: all but the bias channel and T */
    uint32_t layer;         /* layer whose first KV group is the recency head */
    uint32_t n_q_heads;     /* query heads of that group (they share its k and v) */
    float qk_gain;          /* attn_q_norm / attn_k_norm of that layer: sharpens the kernel */
    float out_gain;         /* attn_output: the head's dim j -> residual dim t0 + j */
    float v_std;            /* attn_v rows of the group: std on the token dims */
    float router_tok_std;   /* router rows: std on the token dims (variance 1 - locality) */
    float router_topic_std; /* router rows: std on T (variance locality) */
    float router_full_std;  /* router rows of layers before `layer` (T is empty there) */
    uint32_t n_rot;         /* RoPE's dims of a head (its first ones) */
    double height;          /* q·k / sqrt(head_dim) at distance 0 */
    double n_eff;           /* tokens the head averages over: (sum w)^2 / sum w^2 */
    float qk[SYNTH_LOC_MAX_HEAD_DIM]; /* the q (= k) of every token before RoPE, rms 1 */
} tm_synth_locality;

/* The layout for cfg (cfg->locality > 0, validated). */
void synth_locality_plan(const tm_synth_config *cfg, tm_synth_locality *loc);

/* The recency head's attention logit at distance `lag` (what RoPE makes of
 * q = k = loc->qk): tests and docs compare it with exp(-lag / span). */
double synth_locality_score(const tm_synth_config *cfg, const tm_synth_locality *loc, uint32_t lag);

/* A one-line description of a synthetic model's routing from its GGUF
 * metadata ("qwen3-30b-a3b: skew 4.2, offset 70, locality 0.7, span 9",
 * "uniform", "custom: skew 0.6"); false (out = "") when the file was not made
 * by mkmodel (or f is NULL). */
bool synth_routing_label(const tm_gguf_file *f, char *out, size_t n);

/* Print "synthetic routing: LABEL" to out when f was made by mkmodel, so
 * numbers measured on it are not mistaken for a trained model's, and a line
 * saying its weights repeat when it was made with --fill repeat. */
void synth_routing_print(const tm_gguf_file *f, FILE *out);

#endif
