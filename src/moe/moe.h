/* Mixture-of-Experts execution, independent of any architecture and tier.
 *
 * One MoE layer of a step:
 *   router logits ─ moe_router_select ─ ids + weights [n_tok][k]
 *   ─ moe_worklist_build ─ slots (token, expert, weight), token-major for
 *     decode or expert-major for prompts (all tokens of an expert together,
 *     so each expert's weights are read once per batch)
 *   ─ lanes compute their share of the slots ─ y[t] += Σ weight · expert(x[t])
 * Today there is the CPU lane; the GPU hot lane and the fetch lane take
 * other slots of the same worklist, and the merge adds their outputs.
 *
 * Experts are addressed through tm_moe_experts: per projection a base
 * pointer, the bytes from one expert to the next, and the bytes per row, so a
 * tier can point an expert at a cache slot without the lane knowing. */
#ifndef TM_MOE_MOE_H
#define TM_MOE_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "cpu/cpu.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- router ---- */

typedef enum tm_moe_gating {
    TM_MOE_GATING_SOFTMAX,      /* softmax over all experts, then top-k (Qwen3-MoE, Mixtral) */
    TM_MOE_GATING_SIGMOID,      /* sigmoid per expert, then top-k (DeepSeek-V3, GLM-4.5) */
    TM_MOE_GATING_SOFTMAX_TOPK, /* top-k of the logits, softmax over those k (gpt-oss) */
} tm_moe_gating;

/* One router, every family's options (docs/architecture.md, "Routing"):
 *   s_e   = score of expert e (softmax over all logits, sigmoid, or the logit itself)
 *   sel_e = s_e + sel_bias_e                  the bias chooses, it never weighs
 *   groups (n_group > 1): experts in n_group equal groups of consecutive ids; a
 *     group's score is the sum of its two largest sel; only the experts of the
 *     n_group_used best groups may be chosen (ties to the lower group)
 *   ids   = the k largest sel, best first (ties to the lower id)
 *   w_j   = s_ids[j] (SOFTMAX_TOPK: softmax over those k); / Σ_j w_j when
 *     norm_topk; × scale; × expert_scale[ids[j]] when given */
typedef struct tm_moe_router_params {
    tm_moe_gating gating;
    uint32_t n_expert, n_used;
    bool norm_topk; /* renormalise the k weights to sum 1 */
    float scale;    /* multiply the final weights (1 for most models) */
    /* group-limited top-k: 0 or 1 group is none; n_group divides n_expert into groups of
       2 or more, 1 <= n_group_used <= n_group and n_used <= n_group_used experts a group
       (moe_router_check) */
    uint32_t n_group, n_group_used;
    /* [n_expert] f32 added to the scores for the choice only (DeepSeek-V3 and GLM-4.5's
       e_score_correction_bias, llama.cpp's exp_probs_b); NULL: none. A layer's own: the
       tier sets it for each layer. */
    const float *sel_bias;
    /* [n_expert] f32: each chosen expert's weight times its own factor, last (Gemma 4's
       router.per_expert_scale, llama.cpp's ffn_down_exps.scale); NULL: none. A layer's
       own, as sel_bias. */
    const float *expert_scale;
} tm_moe_router_params;

/* Whether p describes a router moe_router_select can run; the message names
 * what (e.g. the file) and the count that is wrong. */
tm_status moe_router_check(const tm_moe_router_params *p, const char *what);

/* logits [n_tok][n_expert] → ids [n_tok][k] (best first) and weights [n_tok][k].
 * Ties go to the lower expert id. Tokens are spread over pool (NULL: this
 * thread); a token's result does not depend on how. */
void moe_router_select(tm_pool *pool, const tm_moe_router_params *p, const float *logits,
                       int64_t n_tok, int32_t *ids, float *weights);

/* ---- worklist ---- */

typedef enum tm_moe_phase {
    TM_MOE_PHASE_WARMUP, /* first call after load: touches weights, times nothing */
    TM_MOE_PHASE_PROMPT, /* prompt processing: expert-major */
    TM_MOE_PHASE_DECODE, /* generation: token-major */
} tm_moe_phase;

typedef struct tm_moe_slot {
    int32_t token; /* row of x / y in this step */
    int32_t expert;
    float weight;
} tm_moe_slot;

typedef struct tm_moe_worklist {
    int64_t n_tok;
    uint32_t n_expert, k;
    bool expert_major;
    int64_t n_slots;       /* n_tok * k */
    tm_moe_slot *slots;    /* expert-major: grouped by expert, tokens ascending */
    int64_t *expert_begin; /* [n_expert + 1]: slots of expert e are [begin[e], begin[e+1])
                              (expert-major) */
    int64_t cap_slots;     /* allocation sizes (reused across steps) */
    uint32_t cap_experts;
} tm_moe_worklist;

/* Build the slots of one layer step. Prompt and warm-up phases are
 * expert-major, decode is token-major (whatever the token count: the phase of
 * the call decides, never the count alone). Reuses the list's memory. */
tm_status moe_worklist_build(tm_moe_worklist *wl, const int32_t *ids, const float *weights,
                             int64_t n_tok, uint32_t n_expert, uint32_t k, tm_moe_phase phase);
void moe_worklist_free(tm_moe_worklist *wl);

/* ---- experts ---- */

typedef enum tm_moe_activation {
    TM_MOE_ACT_SWIGLU,     /* silu(gate) * up */
    TM_MOE_ACT_SWIGLU_OAI, /* g = min(gate, limit), u = clamp(up, +-limit):
                              g sigmoid(alpha g) (u + 1)   (gpt-oss) */
    TM_MOE_ACT_GEGLU,      /* gelu_tanh(gate) * up (Gemma 4: cpu_geglu) */
} tm_moe_activation;

typedef struct tm_moe_matrix {
    const uint8_t *data; /* expert 0 */
    tm_type type;
    size_t expert_stride; /* bytes from one expert to the next */
    size_t row_bytes;
    /* [n_expert]: where each expert's rows are, when they are not at data +
       e * expert_stride (the SSD tier's RAM cache; NULL: they are) */
    const uint8_t *const *expert_at;
} tm_moe_matrix;

/* The rows of expert e of m. */
static inline const uint8_t *moe_matrix_expert(const tm_moe_matrix *m, int32_t e) {
    return m->expert_at ? m->expert_at[e] : m->data + (size_t)e * m->expert_stride;
}

typedef struct tm_moe_experts {
    int64_t n_embd, n_ff;
    tm_moe_matrix gate, up; /* n_ff rows of n_embd */
    tm_moe_matrix down;     /* n_embd rows of n_ff */
    tm_moe_activation act;
    float act_alpha, act_limit; /* TM_MOE_ACT_SWIGLU_OAI's constants */
    /* Per-expert biases added to each product's output (NULL: none): gate and
     * up [n_expert][n_ff], down [n_expert][n_embd], f32 on the host. Small
     * next to the experts: every lane keeps them resident. */
    const float *gate_bias, *up_bias, *down_bias;
    /* This layer's router [n_expert][n_embd] and bias ([n_expert] or NULL), f32 on
     * the host, for predicting its experts from the previous layer's input (the
     * SSD tier reads them ahead); NULL: no prediction. sel_bias: the router's
     * selection bias ([n_expert] or NULL, tm_moe_router_params.sel_bias), which
     * the prediction chooses with as the router does. */
    const float *router, *router_bias, *sel_bias;
} tm_moe_experts;

/* H = act(G + gate_bias, U + up_bias) for values [c0, c1) of expert e's row
 * (G may be H: in place; G and U get their biases added). */
void moe_experts_act(const tm_moe_experts *ex, int32_t e, int64_t c0, int64_t c1, float *h,
                     float *g, float *u);

/* ---- CPU lane ---- */

typedef struct tm_moe_cpu_lane tm_moe_cpu_lane;

tm_status moe_cpu_lane_create(tm_moe_cpu_lane **out);
void moe_cpu_lane_free(tm_moe_cpu_lane *lane);

/* Where a CPU lane's thread time went, summed over its threads (ns). What no
 * part claims of threads x wall (idle) is waiting: pool wake-up, barriers,
 * uneven items, a descheduled thread. */
typedef enum tm_moe_lane_part {
    TM_LANE_PREP,    /* activations quantized and gathered to their runs */
    TM_LANE_GATE_UP, /* gate and up products */
    TM_LANE_ACT,     /* H = act(G, U), quantized */
    TM_LANE_WAIT,    /* down items waiting for their run's H */
    TM_LANE_DOWN,    /* down products */
    TM_LANE_COMBINE, /* weighted sums into y */
    TM_LANE_PART_COUNT
} tm_moe_lane_part;
extern const char *const tm_moe_lane_part_names[TM_LANE_PART_COUNT];
typedef struct tm_moe_lane_stats {
    uint64_t ns[TM_LANE_PART_COUNT];
    uint64_t thread_ns; /* threads x wall time of the runs */
} tm_moe_lane_stats;

/* Each later run adds its time to *acc (NULL: no timing, the default). */
void moe_cpu_lane_profile(tm_moe_cpu_lane *lane, tm_moe_lane_stats *acc);

/* y[t] += Σ_{slots s of token t} s.weight · down(act(gate·x[t], up·x[t])) over
 * the worklist's slots [s0, s1). x, y: [n_tok][n_embd]. When precise is set,
 * products use dequantized weights in double (the test reference path). */
tm_status moe_cpu_lane_run(tm_moe_cpu_lane *lane, tm_pool *pool, const tm_moe_experts *ex,
                           const tm_moe_worklist *wl, int64_t s0, int64_t s1, const float *x,
                           float *y, bool precise);

#ifdef __cplusplus
}
#endif
#endif
