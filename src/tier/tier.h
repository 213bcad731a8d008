/* The tiered MoE step: which lane computes each routed slot of a layer, and
 * the hand-offs between them (docs/executor.md).
 *
 *   x += Σ_k w_k · expert_k(h)      for the top-k experts of each token
 *
 * An expert of a layer is hot (in VRAM: the layer's whole expert tensors, or
 * one of its --moe-cache slots; computed by the GPU's grouped kernels) or cold
 * (in RAM, the mapped file; computed by the CPU lane, or, for the first
 * --moe-pcie cold slots of each decode token, by the GPU reading the expert
 * in place over PCIe: the PCIe lane). A device slot map
 * expert → slot | -1 per cached layer is applied by the router kernel, so the
 * hot lane reads experts through it and skips cold slots. Decode steps hand
 * the cold slots to the CPU lane through mapped pinned memory and flags (no
 * stream synchronisation; capturable in the decode graph); prompts split an
 * expert-major worklist into hot groups (tensor cores) and cold runs (the CPU
 * lane) that run at the same time.
 *
 * Knows no architecture: the architecture hands it the layer's router
 * logits, normed input and residual stream, the router's parameters and the
 * layer's expert tensors. */
#ifndef TM_TIER_TIER_H
#define TM_TIER_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "exec/exec.h"
#include "moe/moe.h"
#include "tier/cache_policy.h"
#include "tier/placement.h"
#include "tier/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_MOE_CACHE_AUTO (-1)
#define TM_MOE_PCIE_AUTO  0    /* tm_tier_params.pcie: a share of k from measured rates */
#define TM_MOE_PCIE_OFF   (-1) /* no PCIe lane */

/* --moe-fetch: how prompt steps compute the experts in RAM (besides the CPU
 * lane's balanced share). */
#define TM_MOE_FETCH_AUTO 0    /* copy when the batch routes to nearly every expert, else PCIe */
#define TM_MOE_FETCH_OFF  (-1) /* the CPU lane computes them all */
#define TM_MOE_FETCH_COPY 1    /* copied into VRAM (the fetch ring), then computed */
#define TM_MOE_FETCH_PCIE 2    /* the GPU reads the routed ones in place over PCIe */

/* --moe-ahead: experts a decode layer step copies ahead for the next layer. */
#define TM_MOE_AHEAD_AUTO                                                                          \
    0                         /* one into the slots of a cache that updates between requests;
                                  else none */
#define TM_MOE_AHEAD_OFF (-1) /* none */

/* --moe-cache-update: how the VRAM cache follows the routing. */
#define TM_MOE_UPDATE_BETWEEN 0   /* the updater between requests only (tier_cache_update) */
#define TM_MOE_UPDATE_FULL    1   /* admissions after every step (the cache policy) + the updater */
#define TM_MOE_UPDATE_OFF     2   /* the planned experts stay */
#define TM_MOE_UPDATE_RATE    0.1 /* share of a layer's slots the updater may exchange a request */

/* Which experts the VRAM cache holds, and how it changes while running. */
typedef struct tm_moe_cache_opts {
    /* (trace/trace.h and tier/plan.h types, by tag: plan.h includes this header) */
    const struct tm_trace_stats *learn; /* --moe-learn: observations to plan from and to seed
                                           the policies (NULL: none; the lowest ids) */
    const struct tm_plan *plan;         /* --moe-cache-plan: the experts of each layer (NULL: plan
                                   from learn and the budget at load) */
    int32_t weighting; /* --moe-cache-weighting: a tm_plan_weighting (plan made at load) */
    double curve;      /* its layer curve (0: TM_PLAN_CURVE_DEFAULT) */
    int32_t update;    /* TM_MOE_UPDATE_* */
    bool policy_set;   /* --moe-cache-policy given (else adaptive) */
    tm_cache_policy_kind policy;
    int32_t max_admit; /* uploads a layer a step (0: 1; < 0: no cap) */
} tm_moe_cache_opts;

/* One layer's experts as the architecture bound them. A layer without routed
 * experts (a leading dense layer: gate NULL) has no part in the tier. */
typedef struct tm_tier_layer {
    tm_moe_experts experts;                /* host view: the mapped file */
    const tm_weight *gate, *up, *down;     /* the tensors (placement, device copies) */
    const tm_weight *router, *router_bias; /* the same (NULL: none): an f32 router the
                                              executor holds in VRAM serves --moe-ahead */
    const tm_weight *sel_bias;     /* [n_expert] f32: the router's selection bias of this layer
                                  (tm_moe_router_params.sel_bias; NULL: none) */
    const tm_weight *expert_scale; /* [n_expert] f32: its per-expert weight factors
                                      (tm_moe_router_params.expert_scale; NULL: none) */
} tm_tier_layer;

typedef struct tm_tier_params {
    int64_t cache_mib; /* --moe-cache: 0 none, MiB, or TM_MOE_CACHE_AUTO (a plan: its size);
                          over several GPUs each GPU's (the layers of its spans) */
    int n_cache_gpu;   /* --moe-cache A,B over several GPUs: each GPU's MiB (0: cache_mib) */
    int64_t cache_mib_gpu[EXEC_MAX_GPUS];
    tm_moe_cache_opts cache;
    size_t reserve;        /* bytes TM_MOE_CACHE_AUTO leaves free */
    int32_t pcie;          /* --moe-pcie: cold slots per decode token the GPU reads from RAM
                             (TM_MOE_PCIE_AUTO, TM_MOE_PCIE_OFF, or 1..k) */
    int32_t fetch;         /* --moe-fetch: TM_MOE_FETCH_* */
    int32_t ahead;         /* --moe-ahead: TM_MOE_AHEAD_AUTO, TM_MOE_AHEAD_OFF or 1..k */
    tm_store_params store; /* --ram-cache (budget_mib 0: none): the SSD tier (store.h) */
} tm_tier_params;

/* Layers by where their experts are (the --profile table's rows). */
typedef enum tm_tier_class {
    TM_TIER_VRAM,   /* every expert in VRAM */
    TM_TIER_RAM,    /* every expert in RAM */
    TM_TIER_CACHED, /* in RAM, some in VRAM slots */
    TM_TIER_CLASS_COUNT
} tm_tier_class;
extern const char *const tm_tier_class_names[TM_TIER_CLASS_COUNT];

typedef struct tm_tier_stats {
    uint32_t layers;                            /* layers of the class */
    uint64_t calls;                             /* layer steps */
    uint64_t hot_slots, cold_slots;             /* routed slots by lane: GPU from VRAM, CPU */
    uint64_t pcie_slots;                        /* GPU from RAM over PCIe */
    uint64_t hot_bytes, cold_bytes, pcie_bytes; /* expert weight bytes those slots read */
    uint64_t hot_ns;                            /* GPU hot lane (--profile) */
    uint64_t pcie_ns;                           /* GPU PCIe lane (--profile) */
    uint64_t cold_ns;                           /* CPU lane, wall time */
    uint64_t cold_prep_ns; /* of it, decode: routing to worklist before the lane runs */
    uint64_t wait_ns;      /* host waiting for the GPU's hand-off */
    uint64_t gpu_wait_ns;  /* GPU waiting for the CPU lane, and its add (--profile) */
    uint64_t merge_ns;     /* prompts: the CPU's sum copied in and added (--profile) */
    /* prompts: RAM experts the GPU computed (fetch lane: copied to VRAM first, or read in
       place over PCIe) */
    uint64_t fetch_slots, fetch_experts;
    uint64_t fetch_bytes;    /* expert bytes copied or read over PCIe for them */
    uint64_t fetch_ns;       /* GPU time of their products (--profile) */
    uint64_t copy_ns;        /* copy engine time of the fetch ring (--profile) */
    uint64_t copy_wait_ns;   /* compute stream waiting for the ring's copies (--profile) */
    uint64_t fallback_slots; /* slots the CPU lane took because a copy failed */
    /* decode: the next layer's predicted cold experts copied to VRAM ahead (--moe-ahead) */
    uint64_t ahead_experts; /* experts copied */
    uint64_t ahead_used;    /* of those, routed to by the step */
    uint64_t ahead_slots;   /* routed slots the GPU computed from them */
    uint64_t ahead_bytes;   /* bytes copied */
    uint64_t ahead_ns;      /* GPU time of the prediction and the copies (--profile) */
    /* the VRAM cache while running */
    uint64_t admits;       /* experts uploaded after a step's routing (the policy) */
    uint64_t exchanges;    /* experts uploaded by the updater between requests */
    uint64_t upload_bytes; /* their bytes */
} tm_tier_stats;

typedef struct tm_tier tm_tier;

/* Set up every layer's lanes: the VRAM slots of --moe-cache (divided evenly
 * over the layers whose experts are in RAM, filled with each layer's most
 * selected experts, or the lowest ids), the hand-off mailbox, scratch. A
 * budget above the free VRAM is TM_ERR_DEVICE stating needed and free bytes;
 * without a GPU the cache is skipped with one line. Call after exec_finalize. */
tm_status tier_create(tm_exec *e, const tm_placement *pl, uint32_t n_layer,
                      const tm_tier_layer *layers, const tm_moe_router_params *router,
                      const tm_tier_params *p, tm_tier **out);
void tier_free(tm_tier *t);

/* The MoE step of layer l for the step's tokens: top-k of logits into ids and
 * w (written; for the callback), then x += Σ w · expert(h). When the executor
 * emits intermediates, the sum goes to ffn_out first (x += ffn_out after), so
 * it can be named; otherwise straight into x. x NULL: ffn_out = the sum, on the
 * side h is on (an architecture that norms it before adding: Gemma 4). */
tm_status tier_moe(tm_tier *t, uint32_t layer, tm_act *logits, tm_act *h, tm_act *ids, tm_act *w,
                   tm_act *x, tm_act *ffn_out);

const tm_tier_stats *tier_stats(const tm_tier *t); /* [TM_TIER_CLASS_COUNT] */
/* The same counts by the GPU of each layer's MoE step (*n GPUs, 0 without one; their
 * layers, calls, slots by lane with their bytes, and the lanes' times), of the layers
 * whose step works on a GPU (tier_layer_gpu). */
const tm_tier_stats *tier_stats_gpu(const tm_tier *t, int *n);
/* The GPU (an executor index) whose lanes serve layer's routed experts and whose VRAM
 * holds them or their cache slots: its experts' GPU, else its layer's; -1 when neither
 * is on a GPU, or the layer has no routed experts. */
int tier_layer_gpu(const tm_tier *t, uint32_t layer);
/* The SSD tier's counters (NULL: no --ram-cache). */
const tm_store_stats *tier_store_stats(const tm_tier *t);
const tm_moe_lane_stats *tier_lane_stats(const tm_tier *t);
tm_tier_class tier_layer_class(const tm_tier *t, uint32_t layer);

/* ---- the VRAM cache (writable between steps) ---- */

/* Between requests: exchange up to rate * slots of each cached layer's
 * weakest experts for better ones (the policies' decayed scores), uploaded
 * in the background and used once there. Nothing with --moe-cache-update off. */
tm_status tier_cache_update(tm_tier *t, double rate);
/* Wait for every upload in flight and use it (tests; before reading the cache). */
tm_status tier_cache_settle(tm_tier *t);
int32_t tier_cache_slots(const tm_tier *t, uint32_t layer);
/* GPU g's share of the cache: its layers (tier_layer_gpu) with slots, their slots and
 * the VRAM those hold. */
void tier_cache_gpu(const tm_tier *t, int g, uint32_t *layers, uint64_t *slots, uint64_t *bytes);
/* The slot expert e of layer l is served from: its id for a layer wholly in
 * VRAM, a cache slot, or -1 (cold). */
int32_t tier_slot_of(const tm_tier *t, uint32_t layer, int32_t expert);
/* The tracer's residency callback (tm_trace_resident_fn; tier: a tm_tier *):
 * whether tier_slot_of finds the expert in VRAM or a cache slot. */
bool tier_expert_resident(void *tier, uint32_t layer, int32_t expert);
/* Put expert e of layer l into cache slot s (its old expert becomes cold). */
tm_status tier_cache_set(tm_tier *t, uint32_t layer, int32_t slot, int32_t expert);
size_t tier_cache_bytes(const tm_tier *t);

/* ---- pieces, exposed for tests ---- */
/* Reorder a worklist's slots by lane, each lane's in their previous order (an
 * expert's run stays whole): the CPU's cold slots, then the PCIe lane's (the
 * first tm_cuda_mapped_count(cold slots of the token, n_mapped, share_q8)
 * cold slots of each token; a token-major worklist), then the hot ones
 * (slot_of[expert] >= 0; slot_of NULL: none hot). Returns the CPU's count;
 * *n_pcie gets the PCIe lane's. tmp: room for wl->n_slots slots. */
int64_t tier_worklist_split(tm_moe_worklist *wl, const int32_t *slot_of, int32_t n_mapped,
                            int32_t share_q8, tm_moe_slot *tmp, int64_t *n_pcie);
/* Slots [0, n) of a token-major worklist grouped by expert (stably: tokens in
 * order within an expert) and the list marked expert-major, so that the CPU
 * lane reads an expert several rows of a decode step share once (decode steps
 * of several sequences; after tier_worklist_split, whose per-token rule needs
 * the token-major order). */
void tier_worklist_group(tm_moe_worklist *wl, int64_t n);
/* The PCIe lane's slots of a decode token whose experts are all cold (0: none). */
int32_t tier_pcie_slots(const tm_tier *t);
/* How many PCIe lane shares decode steps have timed (tier_tune.c; 0: not tuning). */
int32_t tier_tune_timed(const tm_tier *t);
/* The bytes the PCIe lane pinned (the RAM experts' spans of the file). */
size_t tier_pcie_bytes(const tm_tier *t);
/* VRAM the decode steps' copies ahead hold (0: none). */
size_t tier_ahead_bytes(const tm_tier *t);
/* VRAM the fetch ring holds (0: none). */
size_t tier_fetch_bytes(const tm_tier *t);
/* The grouped GEMMs' scratch for n_items routed slots of experts n_embd x n_ff out of
 * n_expert, at its larger layout whatever the types (float matrices size the dequantize
 * path): what a batch of n_items / k tokens may take (0 without experts). */
size_t tier_gemm_scratch_bound(int64_t n_embd, int64_t n_ff, uint32_t n_expert, int64_t n_items);
/* The CPU lane's current share of a prompt layer's experts in RAM (0..1). */
double tier_prompt_cpu_share(const tm_tier *t);
/* Stable partition of an expert-major worklist's slots by lane_of[expert]
 * (0, 1, 2): counts[i] gets each lane's slots. tmp: room for wl->n_slots. */
void tier_worklist_partition(tm_moe_worklist *wl, const int32_t *lane_of, tm_moe_slot *tmp,
                             int64_t counts[3]);

#ifdef __cplusplus
}
#endif
#endif
