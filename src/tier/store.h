/* The expert store: the SSD tier's RAM residency cache (--ram-cache).
 *
 * Experts of the layers whose experts are in RAM are read from the model
 * file (each projection's slice at its absolute offset: its address in the
 * file's mapping minus the mapping's start) with store_io (O_DIRECT,
 * io_uring) into slots of RAM that the store owns, and the CPU lane reads
 * them there through per-expert address tables (tm_moe_matrix.expert_at),
 * never through the mapping: the page cache does not hold them, the budget
 * does. What is computed does not change, only where the bytes come from.
 *
 * Each layer has the same number of slots (the budget over the layers' slot
 * sizes), so reads for layer l + 1 never evict what layer l computes: a
 * layer step's slots [s0, s1) of the worklist are cut into chunks of
 * consecutive slots whose experts fit in the layer's slots (so the lane's
 * sums keep their order), and the reads of chunk c + 1 are in flight while
 * chunk c computes. Prompts' worklists are expert-major, so a cold start
 * reads the prompt's experts in expert order.
 *
 * Eviction: each expert (counted once, whatever tier holds it) has a score
 * of exponentially decayed uses (recency and frequency in one number, as
 * the VRAM cache's adaptive policy, cache_policy.h), halved every
 * TM_STORE_TURNOVERS * slots / k tokens; a miss takes an empty slot, else
 * the lowest scored expert that the rest of the step does not use, else
 * (a step with more experts than slots) the one the step uses farthest ahead
 * (Belady: the step's worklist is known), never one a chunk in flight holds.
 *
 * Prediction: while layer l computes, the experts that the routers of the next
 * TM_STORE_PREDICT_LAYERS layers name for layer l's input (decode steps), then
 * (one-token lag) those layer l + 1 used in its previous step, that are not
 * resident, are read on the spare queue depth in place of lower scored ones. */
#ifndef TM_TIER_STORE_H
#define TM_TIER_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "moe/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_RAM_CACHE_AUTO (-1)               /* --ram-cache auto */
#define TM_STORE_RESERVE  ((int64_t)2 << 30) /* RAM auto leaves to the rest, at least */
/* Experts a layer step may evict that it still uses, so that its first chunks
 * have reads in flight when every slot holds one of its experts (a prompt
 * step over a budget smaller than its experts): each costs a second read, so
 * a step reads at most this many more than the experts it lacked. */
#define TM_STORE_STAGE 8
/* Turnovers of a layer's slots until a use counts half in the eviction score
 * (the VRAM cache's adaptive policy takes TM_CACHE_TURNOVERS, 8: it must also
 * decide what to admit; the store reads every miss, and recency serves it best). */
#define TM_STORE_TURNOVERS 1
/* Layers after this one whose experts a decode step predicts with their routers
 * and reads ahead: with one, the next layer's reads finish during this layer's
 * wait and the drive idles while it computes. H200 machine, 30b-a3b, Qwen3 routing
 * profile, --ram-cache at half the experts, tg64 alternating in one call: 1 layer
 * 13.97 / 12.89 t/s, 2 layers 14.45 / 14.48, 3 layers 13.85 / 15.24; read ahead
 * used 99% / 98% / 98% (TIERMOE_STORE_PREDICT_LAYERS=N for comparisons). */
#define TM_STORE_PREDICT_LAYERS 2

typedef struct tm_store_params {
    int64_t budget_mib; /* --ram-cache: MiB, or TM_RAM_CACHE_AUTO (MemAvailable less a reserve) */
    const char *path;   /* the model file */
    const uint8_t *map; /* its mapping (experts are located by address - map) */
    int depth;          /* reads in flight (0: TM_STORE_IO_DEPTH) */
} tm_store_params;

typedef struct tm_store_stats {
    uint64_t steps;         /* layer steps */
    uint64_t tokens;        /* tokens of the first layer's steps */
    uint64_t routed;        /* distinct experts the steps asked for */
    uint64_t hits;          /* ... resident, or on their way, when the step began */
    uint64_t faults;        /* experts read because a step needed them */
    uint64_t prefetched;    /* experts read ahead (predicted, or one-token lag) */
    uint64_t prefetch_used; /* ... that a later step used */
    uint64_t pred_routed;   /* routed experts of steps whose experts were predicted */
    uint64_t pred_hits;     /* ... that the prediction named */
    uint64_t evictions;
    uint64_t bytes_read;  /* from the file, alignment included */
    uint64_t wait_ns;     /* the lane waiting for reads */
    int32_t max_resident; /* experts resident in one layer, at most */
} tm_store_stats;

typedef struct tm_store tm_store;

/* A store for the layers with in_store[l] set (layers[l]: their experts as
 * bound, pointing into p->map), n_expert experts, k routed a token. The
 * budget must give every such layer one slot; TM_ERR_ARG names the least. */
tm_status store_create(const tm_store_params *p, uint32_t n_layer, const tm_moe_experts *layers,
                       const bool *in_store, const tm_moe_router_params *router, tm_store **out);
void store_free(tm_store *s);

/* y += the experts of worklist slots [s0, s1) of layer l (in store), as
 * moe_cpu_lane_run does, reading what is not resident first. */
tm_status store_lane_run(tm_store *s, uint32_t l, tm_moe_cpu_lane *lane, tm_pool *pool,
                         const tm_moe_worklist *wl, int64_t s0, int64_t s1, const float *x,
                         float *y, bool precise);

/* What a run does with each chunk once its experts are resident: the CPU
 * lane computes it (store_lane_run), or the GPU copies the experts from the
 * slots and computes it there (the prompt fetch lane, tier_fetch.c). */
typedef struct tm_store_sink {
    /* Worklist slots [a, b) of the run's layer; ex: the layer's experts, their
       expert_at tables pointing at the store's copies. */
    tm_status (*run)(void *ud, const tm_moe_experts *ex, int64_t a, int64_t b);
    /* Return once nothing run queued still reads the slots (NULL: run has read
       them when it returns). Called before any slot a run read may be evicted. */
    tm_status (*settle)(void *ud);
    int32_t max_experts; /* experts a chunk holds at most (0: as many as fit) */
    void *ud;
} tm_store_sink;

/* The chunked run of store_lane_run with another sink. x: the layer's input
 * on the host for the next layer's prediction (NULL: none). */
tm_status store_run(tm_store *s, uint32_t l, tm_pool *pool, const tm_moe_worklist *wl, int64_t s0,
                    int64_t s1, const float *x, const tm_store_sink *sink);

/* The slots' memory (one span, for cuda_host_register). */
void *store_memory(const tm_store *s, size_t *bytes);

const tm_store_stats *store_stats(const tm_store *s);
int32_t store_slots(const tm_store *s); /* a layer's */
size_t store_bytes(const tm_store *s);  /* RAM the slots hold */
/* Experts of layer l resident now (tests). */
int32_t store_resident(const tm_store *s, uint32_t l);
bool store_uring(const tm_store *s);
bool store_direct(const tm_store *s);

#ifdef __cplusplus
}
#endif
#endif
