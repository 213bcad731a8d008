/* The tier's insides, shared by tier.c (setup, the VRAM cache) and
 * tier_step.c (the MoE step and its hand-offs). Private to src/tier. */
#ifndef TM_TIER_TIER_INTERNAL_H
#define TM_TIER_TIER_INTERNAL_H

#include "tier/tier.h"
#include "tier/tier_tune.h"

/* What the GPU hands the host for one layer of a decode step, up to
 * TM_CUDA_MMVQ_MAX_TOK tokens. */
typedef struct tier_inbox {
    float *h;     /* [max_tok][n_embd] */
    int32_t *ids; /* [max_tok][k] */
    float *w;     /* [max_tok][k] */
    /* [n_expert] the fetch buffer's map, or a cached layer's slot map, when the layer has
       copies ahead */
    int32_t *fetched;
    /* [max_tok] each token's slots the GPU left to the CPU (none in the step: the GPU does
       not wait for the answer) */
    int32_t *cpu_slots;
} tier_inbox;

/* Mapped pinned memory both sides read and write (cuda_host_alloc_mapped):
 * a decode step's hand-off to the CPU lane and back. Each layer has its own
 * inbox: a GPU that leaves no slots of layer l to the CPU goes on to layer
 * l + 1 without waiting for the host, which may still be reading layer l's.
 * One y serves every layer: the GPU copies it only after the layer's flag_y,
 * and the host writes the layers' answers in order. Flags per layer hold the
 * step number that last wrote them. */
typedef struct tier_mailbox {
    uint32_t *flag_h; /* [n_layer] GPU → host: the layer's inbox is filled */
    uint32_t *flag_y; /* [n_layer] host → GPU: y is there */
    uint32_t *err;    /* [n_layer] the GPU gave up waiting for the layer's answer */
    int32_t *share;   /* [1] host → GPU: the PCIe lane's decode share (tier_tune.c) */
    tier_inbox *in;   /* [n_layer] */
    float *y;         /* [max_tok][n_embd] host → GPU */
} tier_mailbox;

/* How a prompt step's cold experts (more than TM_CUDA_MMVQ_MAX_TOK tokens,
 * the residual stream on the GPU) are computed, besides the CPU lane's share. */
typedef enum tier_prompt_mode {
    TIER_PROMPT_CPU,   /* all on the CPU lane */
    TIER_PROMPT_PCIE,  /* the GPU's grouped GEMM reads the routed ones in place over PCIe */
    TIER_PROMPT_FETCH, /* copied ahead into the fetch ring, then the grouped GEMM */
    TIER_PROMPT_STORE, /* --ram-cache: the routed ones read into the store, copied from its
                          pinned slots into the fetch ring, then the grouped GEMM */
} tier_prompt_mode;

/* One expert upload into a cache slot (decided by the layer's policy). */
typedef struct tier_upload {
    uint32_t layer;
    int32_t slot, expert;
    uint32_t batch;  /* the step batch it was queued in */
    bool superseded; /* a later upload into the same slot: never used */
    bool exchange;   /* the updater's, not an admission */
} tier_upload;

#define TIER_UP_BATCHES 8 /* upload batches in flight before the host waits */

/* One fetch-ring chunk: experts list[first, first + n) of a layer's plan,
 * copied into ring buffer (index % n_bufs). */
typedef struct tier_chunk {
    uint32_t layer;
    int32_t first, n;
    bool failed; /* a copy could not be queued: its experts go to the CPU lane */
} tier_chunk;

/* The fetch lane of prompt steps (tier_fetch.c): a layer's cold experts are
 * copied from the pinned file pages into a ring of VRAM buffers on a copy
 * stream, ahead of the layer's routing (a big batch routes to nearly every
 * expert), and the compute stream runs the grouped GEMM over each buffer once
 * its copy is done. Buffer b's copy waits for the compute that last read it
 * (freed[b]); the compute waits for the copy (ready[b]). */
typedef struct tier_fetch {
    int32_t chunk_cap, n_bufs; /* experts a buffer holds; buffers */
    uint8_t *ring;             /* device: n_bufs buffers of buf_bytes */
    size_t buf_bytes, off_up, off_down;
    tm_cuda_event *ready, *freed; /* [n_bufs] */
    tm_cuda_event *prof;          /* --profile: [2 * n_prof] around copies and waits */
    int32_t n_prof;
    /* this step's plan (reset when the step number changes) */
    uint32_t seq;
    int32_t *list;   /* [n_layer][n_expert]: a planned layer's fetched experts, ascending */
    int32_t *n_list; /* [n_layer]: how many; -1 not planned */
    tier_chunk *chunks;
    int64_t n_chunks, cap_chunks, n_copied, n_computed;
    int32_t *first_chunk;                     /* [n_layer]: index of the layer's first chunk */
    tm_cuda_moe_item *items_host, *items_dev; /* [n_batch * k] the layer's fetched slots */
    bool warned;
} tier_fetch;

/* Decode steps' experts copied ahead (tier_ahead.c): layer l + 1's are
 * predicted and copied on a stream of their own while layer l runs, into
 * buffer (l + 1) % 2 (layer l computes from buffer l % 2 meanwhile). Each GPU
 * has its own, for its own layers (tm_tier.ahead[g]): its buffers, stream and
 * events, made with that GPU current. */
typedef struct tier_ahead {
    int32_t n_slots;      /* experts a layer step copies ahead */
    uint8_t *buf[2];      /* device: n_slots experts each (gates, then ups, then downs) */
    const float **router; /* [n_layer] device f32 [n_expert][n_embd]: the layer's router (NULL:
                             the layer is not a target) */
    const float **bias;   /* [n_layer] device [n_expert] or NULL */
    float *logits;        /* device [max_tok][n_expert]: the predicted routing */
    int32_t *ids;
    float *w;
    tm_cuda_moe_item *pred;  /* device [max_tok * k]: predicted slots through the slot map */
    tm_cuda_moe_item *items; /* device [max_tok * k]: the fetched lane's work list */
    int32_t *map[2];         /* device [n_expert]: what buffer i holds (slot or -1) */
    int32_t *list[2];        /* device [2 * n_slots]: {expert, slot} pairs */
    int32_t *split;          /* host [n_expert]: the host split's map, fetched experts hot */
    tm_cuda_stream stream;   /* the predictions and copies */
    tm_cuda_event fork;      /* the compute stream's h is ready */
    tm_cuda_event read;      /* the prediction has read h (the compute stream may overwrite it) */
    tm_cuda_event done[2];   /* buffer i's copies are done */
    int64_t for_layer;       /* the layer the queued copies are for (-1: none) */
    size_t bytes;            /* VRAM held */
    bool lru;                /* some cached layers take copies into their slots: their slot
                                maps live on the GPU, the host's refreshed after each step */
    int64_t n_cache_slots;
    int32_t *cache_state;      /* device: those layers' expert_in_dev, then their last_use_dev */
    int32_t *expert_in_host;   /* scratch for the refresh */
    uint32_t maps_lo, maps_hi; /* those layers' first and last: their rows of the GPU's maps */
    int32_t *maps_host;        /* scratch for the refresh: rows [maps_lo, maps_hi] */
} tier_ahead;

typedef struct tier_layer {
    struct tm_tier *t;
    uint32_t index;
    int gpu_index; /* the executor's GPU of its experts (placement's experts_gpu) */
    bool on_gpu;   /* its MoE step works on that GPU (its experts or the layer there) */
    tm_tier_class cls;
    tm_moe_experts host;     /* RAM */
    tm_cuda_moe_ext ext;     /* the experts' activation and device biases, for every GPU lane */
    tm_cuda_moe_params gpu;  /* the hot experts: whole tensors (n_slots = n_expert) or slots */
    size_t expert_bytes;     /* gate + up + down of one expert */
    int32_t n_slots;         /* cache slots (cached layers) */
    int32_t *slot_of;        /* host [n_expert]: cache slot or -1 (cached layers; pinned) */
    int32_t *expert_in;      /* host [n_slots]: expert or -1 (an upload in flight) */
    int32_t *slot_of_dev;    /* device copy of slot_of */
    tm_cache_policy *policy; /* which experts the slots should hold (NULL: they stay) */
    tm_cuda_moe_params
        pcie;       /* the RAM experts at their pinned device addresses (n_slots 0: none) */
    int32_t n_pcie; /* the PCIe lane's cold slots per decode token */
    tm_cuda_moe_params ahead; /* the experts copied ahead, in the buffer (n_slots 0: none) */
    bool fetched_on;          /* this layer's decode step computes experts copied ahead */
    int32_t *expert_in_dev;   /* cached layers with copies ahead: device [n_slots] */
    uint32_t *last_use_dev;   /* device [n_slots]: the step that last used or filled a slot */
    int64_t cache_at;         /* their offset in tier_ahead.cache_state */
    uint64_t *seen; /* [n_expert]: routed slots so far (the CPU lane takes the least seen) */
    const float *router_dev, *router_bias_dev; /* the executor's f32 copies in VRAM (NULL: none) */
    const float *sel_bias, *sel_bias_dev;      /* the router's selection bias, host and device (the
                                             tier's copy; NULL: none) */
    const float *expert_scale, *expert_scale_dev; /* its per-expert weight factors, the same */
    bool moe; /* the layer has routed experts (else it has no part
                                             in the tier: a dense layer) */
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
    /* each GPU's buffers below over several GPUs (bufs[g]; the fields hold those of
       GPU bufs_gpu: tier_bufs_use) */
    struct tier_gpu_bufs {
        tm_cuda_moe_item *items_dev, *items_host;
        float *h_scratch, *y_dev, *y_host;
        void *gemm_scratch;
        int32_t *cpu_slots_dev, *cold_map_dev;
        struct tier_fetch *fetch;     /* its fetch ring (its layers' prompt copies) */
        tm_cuda_stream copy;          /* = copy_gpu[g] */
        tm_cuda_event pcie_done;      /* its in-place GEMM's */
        tm_cuda_moe_item *pcie_items; /* its PCIe lane's work list */
    } bufs[EXEC_MAX_GPUS];
    int n_bufs, bufs_gpu;
    tm_cuda_moe_item *items_dev, *items_host; /* [n_batch * k] */
    float *h_scratch;                         /* cuda_moe_grouped's, decode-sized */
    void *gemm_scratch;                       /* cuda_moe_grouped_gemm's */
    size_t gemm_scratch_bytes;
    size_t gemm_reserve;   /* the grouped GEMMs' scratch at its larger layout, before the cache
                            (--moe-cache auto leaves it free) */
    float *y_dev, *y_host; /* [n_batch][n_embd]: one lane's sum on its way to the other side */
    int32_t *group_slots;  /* host [n_expert] */
    int64_t *group_starts; /* host [n_expert + 1] */
    void *cache_mem;       /* the VRAM slots of every cached layer */
    size_t cache_bytes;
    struct tm_calib *calib;       /* this machine's calibration profile (NULL: none) */
    int32_t n_pcie;               /* the PCIe lane's slots per decode token, at most (0: none) */
    int32_t pcie_share_q8;        /* and its share of a token's cold slots (0: n_pcie each token) */
    tm_cuda_moe_item *pcie_items; /* device [max_tok * k]: its work list */
    int32_t *cold_map_dev;        /* device [n_expert] of -1: a RAM layer's slot map */
    int32_t *cpu_slots_dev;       /* device [max_tok]: the router's count of the CPU's slots */
    void **pin_host, **pin_dev;   /* [n_pins]: the registered spans */
    size_t *pin_bytes, pcie_pinned;
    int n_pins;
    tier_tune tune; /* the PCIe lane's share, tuned while decoding */
    /* --profile: hot lane, PCIe lane, wait, copies ahead (start, end), each GPU's (an event
       records only on its own GPU's streams); ev: the layer's GPU's (ev_gpu[bufs_gpu]) */
    tm_cuda_event ev_gpu[EXEC_MAX_GPUS][8], *ev;
    /* decode steps' experts copied ahead: each GPU's, for its own layers (NULL: none there) */
    tier_ahead *ahead[EXEC_MAX_GPUS];
    bool ahead_cached_only; /* --moe-ahead auto: only into cached layers' slots */

    /* prompt steps' cold experts (tier_fetch.c) */
    int32_t fetch_mode;      /* TM_MOE_FETCH_* */
    int32_t cpu_q8;          /* the CPU lane's share of a prompt layer's cold experts, 1/256 */
    bool cpu_q8_fixed;       /* TIERMOE_FETCH_CPU_SHARE: no balancing */
    tier_fetch *fetch;       /* the ring (NULL: none) */
    int32_t *lane_of;        /* host [n_expert]: this layer step's lane of each expert */
    uint8_t *cold_mark;      /* host [n_expert] scratch */
    int64_t (*by_count)[2];  /* host [n_expert] scratch: {tokens, expert} */
    tm_cuda_event pcie_done; /* after a prompt layer's in-place GEMM */

    tm_cuda_stream copy; /* uploads to VRAM beside the compute stream: the fetch ring, the cache */

    /* the VRAM cache while running (tier_cache.c) */
    int32_t update_mode; /* TM_MOE_UPDATE_* */
    tm_cache_policy_kind policy_kind;
    int32_t max_admit; /* the policies' (0: no cap) */
    bool upload_warned;
    int32_t *slot_maps;     /* pinned [n_layer][n_expert]: every cached layer's slot_of */
    int32_t *slot_maps_dev; /* their device copy (the router kernel reads them): GPU 0's */
    /* over several GPUs: each GPU's copy of the maps (a cached layer's slot_of_dev points
       into its GPU's), its layers' slots and the stream their uploads take ([0]: the
       fields above and t->copy) */
    int32_t *slot_maps_gpu[EXEC_MAX_GPUS];
    tm_cuda_stream copy_gpu[EXEC_MAX_GPUS];
    tm_cache_admit *admit; /* scratch [n_expert] */
    tier_upload *want;     /* decided during a step, queued after it */
    int64_t n_want, cap_want;
    tier_upload *pending; /* queued on the copy stream, not yet used */
    int64_t n_pending, cap_pending;
    /* batch b's uploads on GPU g are done: up_done[b % TIER_UP_BATCHES][g] */
    tm_cuda_event up_done[TIER_UP_BATCHES][EXEC_MAX_GPUS];
    uint32_t up_next, up_used; /* batches queued; batches used */

    tm_store *store;  /* --ram-cache: the CPU lane reads the experts in RAM from it */
    void *store_pin;  /* the store's slots, registered for the fetch ring's copies (NULL: not) */
    int64_t n_stored; /* prompt chunks copied from the store (their ring buffer: % n_bufs) */
    tm_tier_stats stats[TM_TIER_CLASS_COUNT];
    tm_tier_stats stats_gpu[EXEC_MAX_GPUS]; /* the routed slots by their layer's GPU (spans) */
    tm_moe_lane_stats lane_stats;
};

/* The fields above from GPU g's buffers, or into them. */
static inline void tier_bufs_save(tm_tier *t, int g) {
    t->bufs[g] = (struct tier_gpu_bufs){
        t->items_dev,     t->items_host,   t->h_scratch, t->y_dev, t->y_host,    t->gemm_scratch,
        t->cpu_slots_dev, t->cold_map_dev, t->fetch,     t->copy,  t->pcie_done, t->pcie_items};
}

static inline void tier_bufs_load(tm_tier *t, int g) {
    const struct tier_gpu_bufs *b = &t->bufs[g];
    t->items_dev = b->items_dev, t->items_host = b->items_host, t->h_scratch = b->h_scratch;
    t->y_dev = b->y_dev, t->y_host = b->y_host, t->gemm_scratch = b->gemm_scratch;
    t->cpu_slots_dev = b->cpu_slots_dev, t->cold_map_dev = b->cold_map_dev;
    t->fetch = b->fetch, t->copy = b->copy, t->pcie_done = b->pcie_done;
    t->pcie_items = b->pcie_items;
    t->ev = t->ev_gpu[g], t->bufs_gpu = g;
}

/* The lanes' GPU times (--profile), on each layer's GPU with its events. */
static inline bool tier_profiling(const tm_tier *t) {
    return exec_profiling(t->e);
}

/* The router's parameters for layer L (its selection bias). */
static inline tm_moe_router_params tier_router(const tm_tier *t, const tier_layer *L) {
    tm_moe_router_params p = t->router;
    p.sel_bias = L->sel_bias;
    p.expert_scale = L->expert_scale;
    return p;
}

/* The router kernel's parameters for layer L, items through slot_map. */
static inline tm_cuda_router_params tier_router_gpu(const tm_tier *t, const tier_layer *L,
                                                    const int32_t *slot_map) {
    return (tm_cuda_router_params){.gating = (tm_cuda_gating)t->router.gating,
                                   .n_expert = (int32_t)t->n_expert,
                                   .n_used = (int32_t)t->k,
                                   .norm_topk = t->router.norm_topk,
                                   .scale = t->router.scale,
                                   .sel_bias = L->sel_bias_dev,
                                   .n_group = (int32_t)t->router.n_group,
                                   .n_group_used = (int32_t)t->router.n_group_used,
                                   .slot_map = slot_map,
                                   .expert_scale = L->expert_scale_dev};
}

/* Bytes of one expert's slice of matrix p (0 gate, 1 up, 2 down): its rows. Fewer than
 * its expert stride in a fused gate_up's views (gemma4: an expert's gate rows, then its up
 * rows): copies read these bytes, never a stride, so the up view's last expert ends with the
 * tensor. */
static inline size_t tier_slice_bytes(const tm_moe_experts *ex, int p) {
    const tm_moe_matrix *m = p == 0 ? &ex->gate : p == 1 ? &ex->up : &ex->down;
    return (size_t)(p < 2 ? ex->n_ff : ex->n_embd) * m->row_bytes;
}

/* Whether prompts may copy layer L's experts in RAM into the fetch ring: from
 * the pinned file pages (the PCIe lane's), or from the store's pinned slots. */
static inline bool tier_ring_layer(const tm_tier *t, const tier_layer *L) {
    return L->pcie.n_slots > 0 || (t->store_pin && L->cls != TM_TIER_VRAM);
}

/* The copies ahead of layer L's GPU, which its decode step queues and reads (NULL: none
 * there). */
static inline tier_ahead *tier_ahead_of(const tm_tier *t, const tier_layer *L) {
    return t->ahead[L->gpu_index];
}

/* ---- tier_cache.c ---- */

/* The slots of every layer whose experts are in RAM, from the plan, filled;
 * the policies. */
tm_status tier_cache_create(tm_tier *t, const tm_tier_params *p);
void tier_cache_free(tm_tier *t);
/* A step's routing of a cached layer (ids [n_tok][k] on the host): its
 * policy's admissions are queued after the step. */
void tier_cache_observe(tm_tier *t, tier_layer *L, const int32_t *ids, int64_t n_tok);
/* After a step: use the uploads that are done, queue the step's. */
tm_status tier_cache_apply(tm_tier *t);

/* ---- tier_fetch.c ---- */

/* The groups (runs of one expert) of items[a, b) into t->group_slots/starts,
 * slots from the items; sl[a, b) expert-major (at most n_expert runs). */
int32_t tier_groups(tm_tier *t, const tm_cuda_moe_item *items, const tm_moe_slot *sl, int64_t a,
                    int64_t b);
tm_status tier_fetch_create(tm_tier *t, const tm_tier_params *p);
/* Another GPU's ring (the current GPU's, into t->fetch) of the first's shape. */
tm_status tier_fetch_ring_add(tm_tier *t, const struct tier_fetch *like);
void tier_fetch_ring_free(struct tier_fetch *f);
/* The grouped GEMM's parameters for layer L's experts in ring buffer buf. */
tm_cuda_moe_params tier_ring_params(const tm_tier *t, const tier_layer *L, uint8_t *buf,
                                    int32_t n_slots);
void tier_fetch_free(tm_tier *t);
/* The mode of this prompt step for layer L (n_tok tokens). */
tier_prompt_mode tier_prompt_mode_of(const tm_tier *t, const tier_layer *L, int64_t n_tok);
/* Before layer L's routing in a TIER_PROMPT_FETCH step: start a new plan on
 * a new step, plan L if not yet, and queue what copies the ring allows. */
tm_status tier_fetch_begin(tm_tier *t, tier_layer *L);
/* After L's routing: plan the next layer (next: its index, or -1) so its
 * copies start while L computes. */
tm_status tier_fetch_plan_next(tm_tier *t, int64_t next);
/* Fill t->lane_of for layer L's step (TIER_LANE_*), from its plan (FETCH), or
 * for PCIE: the routed cold experts, the CPU lane taking its share of those
 * with the fewest tokens (wl expert-major). */
void tier_prompt_lanes(tm_tier *t, tier_layer *L, tier_prompt_mode mode, const tm_moe_worklist *wl);
/* Queue the GPU's part of RAM experts for slots sl[0, n) (lane TIER_LANE_GPU,
 * expert-major, ascending; sl inside t->wl.slots): the ring's chunks, the
 * store's chunks (read, then copied into the ring; the host waits for the
 * reads) or the in-place GEMM (then t->pcie_done is recorded); y += their sums. */
tm_status tier_prompt_gpu(tm_tier *t, tier_layer *L, tier_prompt_mode mode, const tm_moe_slot *sl,
                          int64_t n, const float *h, float *y);
/* After the CPU lane's share: move the share toward both finishing together
 * (the GPU's part still running: the CPU takes more next time). */
tm_status tier_prompt_balance(tm_tier *t, tier_prompt_mode mode);

enum { TIER_LANE_CPU = 0, TIER_LANE_GPU = 1, TIER_LANE_HOT = 2 };

/* ---- tier_tune.c (tier_tune.h: the search) ---- */

/* Starts tuning when the PCIe lane's decode share is automatic. */
void tier_tune_init(tm_tier *t);
/* After each step: time it (one-row decode steps), move to the next candidate. */
void tier_tune_step(tm_tier *t);

/* ---- tier_ahead.c ---- */

/* Each GPU's buffers and routers for --moe-ahead, for its own layers (after the PCIe
 * lane pinned the experts in RAM). A layer's copies are queued only by the layer before
 * it on the same GPU: the first layer of each GPU's span gets none. */
tm_status tier_ahead_create(tm_tier *t, const tm_tier_params *p);
void tier_ahead_free(tm_tier *t);
/* At the start of layer L's decode step on stream s (L's GPU's): whether copies
 * were queued for L (by the layer before it); if so, s waits for them (the join).
 * Copies of L's GPU queued for another layer are stale: waited for and dropped. */
tm_status tier_ahead_join(tm_tier *t, const tier_layer *L, tm_cuda_stream s, bool *ready);
/* Before the compute stream s overwrites the h given to tier_ahead_queue:
 * wait until the prediction has read it (when one was queued). */
tm_status tier_ahead_release(tm_tier *t, const tier_layer *L, tm_cuda_stream s);
/* The map of the buffer that holds layer L's copies (device [n_expert]). */
const int32_t *tier_ahead_map(const tm_tier *t, const tier_layer *L);
/* Fork from stream s (h of layer L is there: device [n_tok][n_embd]): on the
 * stream of L's GPU's copies ahead, predict layer L + 1's experts and copy its
 * chosen cold ones into the other buffer. Nothing when L + 1 is not a target of
 * the same GPU. */
tm_status tier_ahead_queue(tm_tier *t, const tier_layer *L, const float *h, int64_t n_tok,
                           tm_cuda_stream s);
/* The host split's map of layer L's decode step whose experts were copied
 * ahead: slot_of (NULL: all cold) with the experts fetched (the buffer's map)
 * hot, or for a cached layer fetched is the GPU's slot map, the truth. Counts
 * the experts copied, routed and their slots into L's class; *n_slots gets the
 * routed slots of the experts copied in this step. */
const int32_t *tier_ahead_split(tm_tier *t, const tier_layer *L, const int32_t *slot_of,
                                const int32_t *fetched, const int32_t *ids, int64_t n_ids,
                                int64_t *n_slots);
/* After a step: the host's slot maps and slot contents from each GPU's (cached
 * layers whose slots take copies ahead: their rows from their GPU's copy of the
 * maps), the changed slots counted as admits. */
tm_status tier_ahead_refresh(tm_tier *t);
/* After the host changed layer L's slots: their contents to the GPU's state. */
tm_status tier_ahead_push(tm_tier *t, const tier_layer *L);

#endif
