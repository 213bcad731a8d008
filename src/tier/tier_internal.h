/* The tier's insides, shared by tier.c (setup, the VRAM cache) and
 * tier_step.c (the MoE step and its hand-offs). Private to src/tier. */
#ifndef TM_TIER_TIER_INTERNAL_H
#define TM_TIER_TIER_INTERNAL_H

#include "tier/tier.h"

/* Mapped pinned memory both sides read and write (cuda_host_alloc_mapped):
 * a decode step's hand-off to the CPU lane and back, up to
 * TM_CUDA_MMVQ_MAX_TOK tokens. One mailbox serves every layer: the GPU cannot
 * publish layer l + 1 before it has layer l's answer. Flags per layer hold the
 * step number that last wrote them. */
typedef struct tier_mailbox {
    uint32_t *flag_h; /* [n_layer] GPU → host: h, ids, w of the layer are there */
    uint32_t *flag_y; /* [n_layer] host → GPU: y is there */
    uint32_t *err;    /* [n_layer] the GPU gave up waiting for the layer's answer */
    float *h;         /* [max_tok][n_embd] */
    int32_t *ids;     /* [max_tok][k] */
    float *w;         /* [max_tok][k] */
    float *y;         /* [max_tok][n_embd] */
} tier_mailbox;

typedef struct tier_layer {
    struct tm_tier *t;
    uint32_t index;
    tm_tier_class cls;
    tm_moe_experts host;    /* RAM */
    tm_cuda_moe_params gpu; /* the hot experts: whole tensors (n_slots = n_expert) or slots */
    size_t expert_bytes;    /* gate + up + down of one expert */
    int32_t n_slots;        /* cache slots (cached layers) */
    int32_t *slot_of;       /* host [n_expert]: cache slot or -1 (cached layers) */
    int32_t *expert_in;     /* host [n_slots]: expert or -1 */
    int32_t *slot_of_dev;   /* device copy of slot_of */
    tm_cuda_moe_params
        pcie;       /* the RAM experts at their pinned device addresses (n_slots 0: none) */
    int32_t n_pcie; /* the PCIe lane's cold slots per decode token */
} tier_layer;

struct tm_tier {
    tm_exec *e;
    uint32_t n_layer, n_expert, k;
    int64_t n_embd, n_ff;
    tm_moe_router_params router;
    tier_layer *layers;
    tm_moe_cpu_lane *lane;
    tm_moe_worklist wl;
    tm_moe_slot *split_tmp;
    int64_t cap_split;

    /* GPU */
    bool gpu;
    tier_mailbox mb, mb_dev; /* host and device addresses of the same memory */
    void *mb_host_base;
    uint64_t timeout_ns;
    tm_cuda_moe_item *items_dev, *items_host; /* [n_batch * k] */
    float *h_scratch;                         /* cuda_moe_grouped's, decode-sized */
    void *gemm_scratch;                       /* cuda_moe_grouped_gemm's */
    size_t gemm_scratch_bytes;
    float *y_dev, *y_host; /* [n_batch][n_embd]: one lane's sum on its way to the other side */
    int32_t *group_slots;  /* host [n_expert] */
    int64_t *group_starts; /* host [n_expert + 1] */
    void *cache_mem;       /* the VRAM slots of every cached layer */
    size_t cache_bytes;
    int32_t n_pcie;               /* the PCIe lane's slots per decode token, at most (0: none) */
    int32_t pcie_share_q8;        /* and its share of a token's cold slots (0: n_pcie each token) */
    tm_cuda_moe_item *pcie_items; /* device [max_tok * k]: its work list */
    int32_t *cold_map_dev;        /* device [n_expert] of -1: a RAM layer's slot map */
    void **pin_host, **pin_dev;   /* [n_pins]: the registered spans */
    size_t *pin_bytes, pcie_pinned;
    int n_pins;
    tm_cuda_event ev[6]; /* --profile: hot lane, PCIe lane, wait (start, end each) */

    tm_tier_stats stats[TM_TIER_CLASS_COUNT];
    tm_moe_lane_stats lane_stats;
};

/* Which rows of a cached layer's slot arrays hold expert e's slices. */
tm_status tier_cache_upload(tm_tier *t, tier_layer *L, int32_t slot, int32_t expert);

#endif
