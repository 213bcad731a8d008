/* Models: hyper-parameters and weights bound from a GGUF file, and contexts
 * (placement, executor, tier) that run the forward pass.
 *
 * Each architecture lives in one file (qwen3moe.c) that reads like the
 * model's math and fills a tm_arch table: load (hyper-parameters + weight
 * binding), state create/free, forward. The forward is written once, on the
 * executor's ops (src/exec/exec.h) and the tier's MoE step (src/tier/tier.h):
 * the context's placement decides where each op runs. Weights stay in the
 * mapped file: the CPU never copies them. */
#ifndef TM_MODEL_MODEL_H
#define TM_MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "cpu/cpu.h"
#include "exec/exec.h"
#include "gguf/gguf.h"
#include "moe/moe.h"
#include "quant/quant.h"
#include "tier/gpus.h"
#include "tier/placement.h"
#include "tier/tier.h"
#include "trace/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hyper-parameters, read and checked by model_hparams_load (hparams.c). */
typedef struct tm_model_config {
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    uint32_t n_expert, n_expert_used, n_ff_exp;
    float rope_base, rms_eps;
    uint32_t v_head_dim, n_rot; /* checked equal to head_dim: the kernels assume it */
    /* gpt-oss: the even layers' sliding window and its layer pattern; YaRN */
    uint32_t window, window_pattern, rope_orig_ctx;
    float rope_factor, yarn_beta_fast, yarn_beta_slow;
    /* qwen3next, qwen35moe: linear attention (Gated DeltaNet) and the shared expert */
    uint32_t ssm_conv;           /* the convolution's width */
    uint32_t ssm_state;          /* a key head's width (ssm.state_size) */
    uint32_t ssm_group;          /* key heads (ssm.group_count) */
    uint32_t ssm_dt_rank;        /* value heads (ssm.time_step_rank) */
    uint32_t ssm_inner;          /* value heads x their width (ssm.inner_size) */
    uint32_t full_attn_interval; /* every n-th layer is full attention */
    uint32_t n_ff_shexp;         /* the shared expert's hidden width */
    /* glm4moe: leading dense layers, shared experts, the router's options, NextN */
    uint32_t n_ff;         /* a dense layer's FFN width (feed_forward_length) */
    uint32_t n_dense;      /* the first n_dense layers are dense (no experts) */
    uint32_t n_shexp;      /* shared experts (n_ff_exp wide each, run as one) */
    uint32_t n_group;      /* the router's expert groups (1: none) */
    uint32_t n_group_used; /* groups a token's experts come from */
    uint32_t gating_func;  /* llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid */
    float expert_scale;    /* the routed experts' weights times it (expert_weights_scale) */
    uint32_t n_nextn;      /* NextN (MTP) layers at the end of block_count: checked, not run;
                                n_layer excludes them */
    /* deepseek2: Multi-head Latent Attention (the glm4moe fields above serve it too) */
    uint32_t n_lora_q;       /* q's low rank (attention.q_lora_rank; 0: a plain attn_q) */
    uint32_t n_lora_kv;      /* the KV latent's width (attention.kv_lora_rank) */
    uint32_t head_dim_mla;   /* a query/key head: nope + RoPE (attention.key_length_mla) */
    uint32_t v_head_dim_mla; /* a value head (attention.value_length_mla) */
    float yarn_log_mul;      /* YaRN's softmax mscale = 1 + it · ln(factor) (0: 1) */
    /* gemma4: the sliding layers' own heads and RoPE (head_dim, n_rot, rope_base: the global
       layers'; the KV head counts a layer: gemma4.c), the final logit soft-cap */
    uint32_t head_dim_swa, v_head_dim_swa, n_rot_swa;
    float rope_base_swa;
    float logit_softcap;       /* logits = cap tanh(logits / cap) (0: none) */
    uint32_t n_embd_per_layer; /* per-layer input embeddings' width (0: none; the only kind run) */
    uint32_t n_kv_shared;      /* layers reusing an earlier layer's KV (0: none; likewise) */
} tm_model_config;

#define TM_MODEL_MAX_EXPERTS      1024
#define TM_MODEL_MAX_EXPERTS_USED 32
#define TM_MODEL_MAX_HEAD_DIM     512

typedef struct tm_model tm_model;
typedef struct tm_context tm_context;

typedef struct tm_arch {
    const char *name; /* general.architecture */
    tm_status (*load)(tm_model *m);
    void (*unload)(tm_model *m);
    tm_status (*state_create)(tm_context *c);
    void (*state_free)(tm_context *c);
    /* One step of the executor's n_tok tokens (exec_step: tokens, positions,
     * phase); leaves the logits of the last token (or of every token when
     * all_logits) fetched into c->logits. */
    tm_status (*forward)(tm_context *c, int64_t n_tok, bool all_logits);
} tm_arch;

struct tm_model {
    tm_gguf_file *file;
    const tm_arch *arch;
    tm_model_config cfg;
    void *weights;         /* the architecture's own weight struct */
    int64_t *window;       /* [n_layer] each layer's sliding attention window, 0: full
                              attention (NULL: every layer full; set by the architecture) */
    uint64_t n_params;     /* values in all tensors */
    uint64_t weight_bytes; /* bytes of all tensors */
    void *api;             /* the public API's state (src/api/api.c; NULL otherwise) */
};

typedef struct tm_context_params {
    int64_t n_ctx;    /* KV cache positions of all sequences (0: min(4096, trained context)) */
    int n_seq;        /* sequences with their own KV range, n_ctx / n_seq positions each
                         (serve --parallel; 0: 1) */
    int64_t n_batch;  /* tokens per forward chunk of a prompt (0: 512) */
    bool kv_full;     /* sliding-window layers' KV caches n_ctx rows too, not rings of window +
                         n_batch (for comparison; so does TIERMOE_KV_RING=0) */
    int n_threads;    /* 0: physical cores */
    tm_type kv_type;  /* TM_TYPE_F16 (default) or TM_TYPE_F32 */
    bool precise;     /* double products from dequantized weights (test reference) */
    int n_gpu_layers; /* -ngl: the first n layers on the GPU (>= n_layer: all of them and the
                         output head); TM_NGL_AUTO: as many as fit, 0 without a GPU */
    bool cpu_moe;     /* --cpu-moe: every layer's experts in RAM */
    int n_cpu_moe;    /* --n-cpu-moe N: the experts of layers < N in RAM */
    const char *override_tensor; /* -ot PATTERN=CPU|CUDAn[,...] (placement.h) */
    tm_gpu_opts gpus;      /* -dev, --split-mode, --tensor-split, -mg, --moe-cache A,B (gpus.h; all
                         zero: CUDA0 alone, as before several GPUs ran) */
    int64_t moe_cache_mib; /* --moe-cache: VRAM for experts in RAM (TM_MOE_CACHE_AUTO) */
    tm_moe_cache_opts moe_cache; /* the cache's plan and updates (--moe-learn, --moe-cache-*) */
    int moe_pcie;  /* --moe-pcie: cold experts a decode token the GPU reads from RAM over PCIe
                     (0: TM_MOE_PCIE_AUTO, TM_MOE_PCIE_OFF, or N) */
    int moe_fetch; /* --moe-fetch: prompts' experts in RAM on the GPU (0: TM_MOE_FETCH_AUTO) */
    int moe_ahead; /* --moe-ahead: decode experts copied ahead a layer step (0: TM_MOE_AHEAD_AUTO,
                      TM_MOE_AHEAD_OFF, or N) */
    int64_t ram_cache_mib; /* --ram-cache: RAM for experts read from the file (the SSD tier; 0:
                              none, TM_RAM_CACHE_AUTO) */
    bool profile;          /* time every part (GPU: events and a sync per part, no graph) */
    tm_tensor_cb cb;
    void *cb_ud;
} tm_context_params;

struct tm_context {
    tm_model *model;
    tm_context_params params;
    tm_pool *pool;
    int64_t n_ctx; /* positions of one sequence (params.n_ctx / n_seq) */
    int n_seq;
    int64_t *seq_past;          /* [n_seq]: positions each sequence has evaluated */
    int64_t *seq_hi;            /* [n_seq]: the most positions each has written since it was
                                   empty (what its rings may have overwritten: model_seq_keep) */
    int32_t *row_pos, *row_seq; /* [n_batch]: a step's rows (exec_step_rows) */
    /* a step of several sequences' prompts (model_decode_batch): the rows whose
       logits the forward computes, into c->logits rows 0 .. n_pick (0: the last row,
       or all rows with all_logits) */
    int64_t *pick_rows;
    int64_t n_pick;
    float *logits; /* [n_batch][n_vocab] when all_logits, else [n_vocab] */
    int64_t n_logits_rows;
    tm_placement placement;
    tm_exec *exec;
    tm_tier *tier;
    void *state;      /* the architecture's activations */
    int n_gpu_layers; /* layers on the GPU (resolved from params.n_gpu_layers) */
    bool gpu_output;  /* the output head runs on the GPU */
    void *api;        /* the public API's state (src/api/api.c; NULL otherwise) */
};

/* Where a context's time went (ns per tm_prof_part) and the CPU lane's
 * thread time (when profiling). */
const uint64_t *model_prof_ns(const tm_context *c);
const tm_moe_lane_stats *model_lane_stats(const tm_context *c);

/* Open, validate and bind a model. Fails with a message naming the file and
 * the missing or mis-shaped tensor / key, or the unsupported architecture or type. */
tm_status model_load(const char *path, tm_model **out);
void model_free(tm_model *m);

tm_status model_context_create(tm_model *m, const tm_context_params *p, tm_context **out);
void model_context_free(tm_context *c);

/* Evaluate tokens at sequence 0's current position, in chunks of n_batch,
 * and advance it. Logits of the last token end in c->logits (all tokens'
 * when all_logits; then n_tok must be <= n_batch). Fails when the sequence
 * would overflow or a token id is out of range. */
tm_status model_decode(tm_context *c, const int32_t *tokens, int64_t n_tok, tm_moe_phase phase,
                       bool all_logits);
/* The same for sequence seq (0 .. n_seq - 1), in its own KV range. */
tm_status model_decode_seq(tm_context *c, int seq, const int32_t *tokens, int64_t n_tok,
                           tm_moe_phase phase, bool all_logits);
/* One decode step of n rows (1 .. n_batch): row i appends tokens[i] to
 * sequence seqs[i] (distinct sequences). Row i's logits end in
 * c->logits + i * n_vocab. The same tokens and, within the products'
 * rounding, the same logits as decoding each sequence alone. */
tm_status model_decode_rows(tm_context *c, int64_t n, const int *seqs, const int32_t *tokens);
/* One prompt step of n rows (1 .. n_batch) of one or more sequences: row i
 * appends tokens[i] to sequence seqs[i]; a sequence's rows are consecutive
 * (one run a sequence, in order). Each row sees its own sequence's positions
 * up to its own, as model_decode_seq of each run alone (within the products'
 * rounding). Run r's last row's logits end in c->logits + r * n_vocab; each
 * run's end is its sequence's checkpoint (a prompt's end). *n_runs: the runs. */
tm_status model_decode_batch(tm_context *c, int64_t n, const int *seqs, const int32_t *tokens,
                             int64_t *n_runs);

/* Forget every sequence (a new conversation). */
void model_context_reset(tm_context *c);
/* How many of the first n_keep positions sequence seq can keep: n_keep (at
 * most what it holds), or 0 when a sliding layer's ring cache no longer has
 * the keys position n_keep's window needs (the sequence went on more than
 * about n_batch positions past n_keep: exec_kv_keep). */
int64_t model_seq_keep(const tm_context *c, int seq, int64_t n_keep);
/* Keep only the first model_seq_keep(c, seq, n_keep) positions of sequence
 * seq and return that: a conversation that shares a prefix with what was
 * evaluated reuses it. */
int64_t model_seq_rewind(tm_context *c, int seq, int64_t n_keep);
/* The same for sequence 0. */
int64_t model_context_rewind(tm_context *c, int64_t n_keep);

/* ---- helpers for architecture files ---- */

/* Bind tensor `name` and check its shape (dims after n_dims must be 1). */
tm_status model_weight_bind(const tm_model *m, const char *name, uint32_t n_dims, const int64_t *ne,
                            tm_weight *w);
/* Same, but a missing tensor leaves w->data NULL and succeeds. */
tm_status model_weight_bind_optional(const tm_model *m, const char *name, uint32_t n_dims,
                                     const int64_t *ne, tm_weight *w);
/* TM_OK when w is f32 (or an optional tensor the file lacks); else an error
 * naming the file, the tensor and its type (norms, biases and other vectors
 * the ops read as f32). */
tm_status model_weight_f32(const tm_model *m, const tm_weight *w);

/* A layer's experts as the tier takes them: the three stacked tensors
 * (gate, up [n_embd, n_ff, n_expert], down [n_ff, n_embd, n_expert]) in the
 * mapped file, SwiGLU, the router's rows when they are f32. */
tm_moe_experts model_moe_experts(const tm_weight *gate, const tm_weight *up, const tm_weight *down,
                                 const tm_weight *router);

/* Read every numeric key of the model's architecture into m->cfg and check
 * it (finite, in range, consistent with the others: the tables in
 * hparams.c). Fails with a message naming the key (e.g.
 * qwen3moe.rope.freq_base), its value and what was expected. */
tm_status model_hparams_load(tm_model *m);
/* A NextN (multi-token prediction) layer's own tensors, besides a layer's (glm4moe,
 * deepseek2): nextn.eh_proj [2 n_embd, n_embd], nextn.enorm, nextn.hnorm [n_embd],
 * optionally nextn.embed_tokens, shared_head_head [n_embd, n_vocab], shared_head_norm. */
tm_status model_nextn_bind(tm_model *m, uint32_t l);
/* YaRN's inverse frequencies of a RoPE over dim values (HF's _compute_yarn_parameters):
 * f_i = base^(-2i/dim); lo, hi = dim ln(orig_ctx / (2π β)) / (2 ln base) for β =
 * beta_fast, beta_slow (floored / ceiled when truncate), clamped to [0, dim - 1];
 * ramp_i = clamp((i - lo) / (hi - lo), 0, 1); freq[i] = f_i / factor · ramp_i + f_i
 * (1 - ramp_i), for i < dim / 2. */
void model_rope_yarn(double base, double factor, double orig_ctx, double beta_fast,
                     double beta_slow, int64_t dim, bool truncate, float *freq);
/* token_embd, output_norm (f32) and output (token_embd's when absent: tied);
 * sets cfg.n_vocab from token_embd. */
tm_status model_io_bind(tm_model *m, tm_weight *embd, tm_weight *norm, tm_weight *out);
/* The rows of h (the output norm's, n_tok of the step) the output head takes:
 * h rows [*first, *first + *rows). A step of several sequences' runs
 * (model_decode_batch) moves each run's last row to the front first. */
tm_status model_logits_rows(tm_context *c, tm_act *h, int64_t n_tok, bool all_logits,
                            int64_t *first, int64_t *rows);

/* The activations of one step of a MoE decoder, [n_batch][...]: residual
 * stream, normed input, q, k, v, attention output before and after its
 * projection, router logits, top-k ids and weights, the experts' sum (when
 * intermediates are named), logits. */
typedef struct tm_moe_acts {
    tm_act x, h, q, k, v, att, attn_out, router_logits, topk_ids, topk_w, ffn_out, logits;
} tm_moe_acts;
/* The state of a MoE decoder context: its activations (c->state), each
 * layer's q, k, v weights grouped (qkv: [n_layer][3]), the KV caches (RoPE
 * from rope_freq's table when not NULL: tm_attn_desc), the executor
 * finalized, and the tier over the layers' experts (tl: [n_layer]). */
tm_status model_moe_state_create(tm_context *c, const tm_weight *const *qkv,
                                 const tm_tier_layer *tl, const tm_moe_router_params *router,
                                 const float *rope_freq);
/* The same in steps, for an architecture with activations of its own: its
 * state struct begins with a tm_moe_acts (c->state = s, made here); then it
 * creates its acts and weight groups; then the rest (attention setup with
 * the model's windows, linear attention's state when ssm is not NULL:
 * exec_ssm_setup, finalize, tier). */
tm_status model_moe_acts_create(tm_context *c, tm_moe_acts *s);
tm_status model_moe_state_finish(tm_context *c, const tm_tier_layer *tl,
                                 const tm_moe_router_params *router, const float *rope_freq,
                                 const bool *ssm, const tm_ssm_desc *ssm_shape);
/* The same with attention's shape given (latent attention: tm_attn_desc). */
tm_status model_moe_state_finish_attn(tm_context *c, const tm_tier_layer *tl,
                                      const tm_moe_router_params *router, const tm_attn_desc *shape,
                                      const bool *ssm, const tm_ssm_desc *ssm_shape);
/* The last step of both, for an architecture that set its attention up itself
 * (exec_attention_setup_layers: gemma4): finalize, the tier. */
tm_status model_moe_state_finish_tier(tm_context *c, const tm_tier_layer *tl,
                                      const tm_moe_router_params *router);
void model_moe_state_free(tm_context *c);
/* Hand layer l's MoE intermediates to the callback (router_logits, topk_ids,
 * topk_weights, ffn_out, x_out). */
tm_status model_moe_emit(tm_context *c, uint32_t l, tm_moe_acts *s, int64_t n_tok);
/* logits = out · (rmsnorm(x) * norm) of the last token or of all (or of each run's
 * last: model_logits_rows), fetched to the host. */
tm_status model_logits_forward(tm_context *c, tm_moe_acts *s, const tm_weight *norm,
                               const tm_weight *out, int64_t n_tok, bool all_logits);

/* ---- the FFN half of glm4moe's and deepseek2's layers (moe_ffn.c) ---- */

/* A leading dense layer's FFN, or a MoE layer's router, selection bias, routed experts
 * (the tier's) and shared experts (n_shexp of them run as one; none: sh_gate.data NULL). */
typedef struct tm_ffn_layer {
    bool dense;
    tm_weight ffn_gate, ffn_up, ffn_down; /* dense layers */
    tm_weight router, sel_bias, gate_exps, up_exps, down_exps, sh_gate, sh_up, sh_down;
    tm_moe_experts experts;
} tm_ffn_layer;
typedef struct tm_ffn_acts {
    tm_act ff_g, ff_u, sh_g, sh_u, ff_out;
} tm_ffn_acts;
/* cfg.n_layer from block_count to the layers that run (less cfg.n_nextn NextN layers, at
 * the end); *n_block gets block_count. The leading dense layers must be fewer. */
tm_status model_nextn_split(tm_model *m, uint32_t *n_block);
/* bind(m, l, layers + l size) for each layer that runs, then for each NextN layer into a
 * scratch layer (dropped) followed by model_nextn_bind; an error names the NextN layer. */
typedef tm_status (*model_layer_bind_fn)(tm_model *m, uint32_t l, void *layer);
tm_status model_layers_bind(tm_model *m, uint32_t n_block, void *layers, size_t size,
                            model_layer_bind_fn bind);
/* Layer l's FFN tensors (dense when l < cfg.n_dense), shapes from cfg (n_ff, n_ff_exp,
 * n_shexp, n_expert); exp_probs_b.bias optional unless sel_bias_required, and f32. */
tm_status model_ffn_bind(const tm_model *m, uint32_t l, bool sel_bias_required, tm_ffn_layer *F);
/* The router of cfg's gating_func, n_group(_used), expert_scale and the bool key
 * <arch>.expert_weights_norm (absent: false), checked (moe_router_check). */
tm_status model_ffn_router_load(const tm_model *m, tm_moe_router_params *r);
tm_status model_ffn_acts_create(tm_context *ctx, tm_ffn_acts *a);
/* The layer's weight groups (gate and up of one input) and, for a MoE layer, its part in
 * the tier (tl; left alone for a dense layer: no part). */
tm_status model_ffn_setup(tm_exec *e, const tm_ffn_layer *F, tm_tier_layer *tl);
/* x += FFN(h) of layer l (s->h the normed input), with its intermediates emitted
 * (dense_out and x_out; shexp_out and model_moe_emit's). */
tm_status model_ffn_forward(tm_context *ctx, uint32_t l, const tm_ffn_layer *F, tm_ffn_acts *a,
                            tm_moe_acts *s, int64_t n_tok);

#define MODEL_DO(call)                                                                             \
    do {                                                                                           \
        tm_status st_ = (call);                                                                    \
        if (st_ != TM_OK) return st_;                                                              \
    } while (0)

/* ---- the expert usage tracer of a loaded model (model_trace.c) ---- */
/* The tracer's shape of a model: its arch name and expert counts. */
void model_trace_shape(const tm_model *m, tm_trace_shape *shape);
/* trace_create with the model's shape and synthetic routing label. */
tm_status model_trace_create(const tm_trace_config *cfg, const tm_model *m, tm_trace **out);

#ifdef __cplusplus
}
#endif
#endif
