/* Calibration: this machine's measured costs, from which the tier decides
 * per routed cold slot which lane computes the expert (docs/calibrate.md).
 *
 * A profile holds, for one machine (CPU model, GPU name, CPU lane threads)
 * and one expert shape and type (n_embd, n_ff, gate/up/down types):
 *   - host: the CPU's read bandwidth;
 *   - the CPU lane's time per expert at 1, 2, 4, ..., 512 tokens per expert
 *     (moe_cpu_lane_run over an expert-major worklist: weights read once a call);
 *   - with a GPU: host→GPU copy rates (pinned, pageable through the staging
 *     buffers of cuda_upload; one expert and a big copy), GPU→host pinned;
 *     the rate at which kernels read pinned host memory in place (the PCIe
 *     lane), alone and while the CPU lane runs, and the CPU lane's rate in both
 *     cases (the two share the memory bus); the GPU's time per expert from VRAM
 *     at the same token counts; the hand-off round trip (GPU signal → host →
 *     GPU wait).
 * Measured by calib_measure (calib_measure.c), kept as JSON (calib_json.c).
 *
 * A profile is refused for another shape or type (never rescaled by bytes:
 * the kernels' speed per byte differs between types and shapes, and a quick
 * measurement costs a few hundred milliseconds), for other CPU lane threads,
 * another CPU or another GPU. A model whose layers mix expert types
 * (llama.cpp's Q4_K_M keeps some down projections in q6_K) is measured and
 * keyed on its most common kind; its other layers are left out, and the tier
 * prices their experts by bytes (cost x their bytes / key.expert.bytes).
 *
 * Knows no architecture: it measures a layer's experts given as
 * tm_moe_experts, and the CUDA backend through src/cuda/cuda.h. */
#ifndef TM_TIER_CALIB_H
#define TM_TIER_CALIB_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "gguf/gguf.h"
#include "moe/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_CALIB_VERSION    1
#define TM_CALIB_MAX_POINTS 16
/* The tokens-per-expert points measured: 1, 2, 4, ..., 512. */
#define TM_CALIB_N_TOKENS 10
extern const int32_t tm_calib_tokens[TM_CALIB_N_TOKENS];

/* The expert shape and type a profile was measured on. */
typedef struct tm_calib_expert {
    int64_t n_embd, n_ff;
    tm_type gate_type, up_type, down_type;
    uint64_t bytes; /* gate + up + down of one expert */
} tm_calib_expert;

/* What a profile must match to be used. */
typedef struct tm_calib_key {
    char cpu[128];   /* CPU model (/proc/cpuinfo "model name") */
    char gpu[256];   /* GPU name (cuda_device_info); "" when measured without one */
    int32_t threads; /* CPU lane threads */
    tm_calib_expert expert;
} tm_calib_key;

/* Time per expert against tokens per expert: tokens strictly increasing
 * (>= 1), ns positive and non-decreasing (n = 0: not measured). */
typedef struct tm_calib_curve {
    int32_t n;
    int32_t tokens[TM_CALIB_MAX_POINTS];
    double ns[TM_CALIB_MAX_POINTS];
} tm_calib_curve;

/* Where the measurement's time went. */
typedef enum tm_calib_phase {
    TM_CALIB_PHASE_MEMBW,   /* the CPU's read bandwidth */
    TM_CALIB_PHASE_TOUCH,   /* the working set's pages read once */
    TM_CALIB_PHASE_CPU,     /* the CPU lane's curve */
    TM_CALIB_PHASE_COPY,    /* copy rates */
    TM_CALIB_PHASE_PCIE,    /* PCIe lane alone and with the CPU lane, setup included */
    TM_CALIB_PHASE_GPU,     /* the GPU's curve, upload included */
    TM_CALIB_PHASE_HANDOFF, /* hand-off round trips */
    TM_CALIB_PHASE_COUNT
} tm_calib_phase;
extern const char *const tm_calib_phase_names[TM_CALIB_PHASE_COUNT];

typedef struct tm_calib_copy {
    uint64_t expert_bytes, big_bytes;                 /* the two sizes copied */
    double h2d_pinned_expert_gbs, h2d_pinned_big_gbs; /* cuda_copy_async from pinned memory */
    double h2d_pageable_expert_gbs,
        h2d_pageable_big_gbs; /* cuda_upload from pageable memory (its pinned staging) */
    double d2h_pinned_big_gbs;
} tm_calib_copy;

typedef struct tm_calib {
    tm_calib_key key;
    bool quick;                /* a short measurement (fewer points, one repetition) */
    char created[32];          /* UTC, ISO 8601 */
    char cpu_level[16];        /* the CPU kernels used (cpu_level_name) */
    double cpu_read_gbs;       /* cpu_read_bandwidth_gbs with the threads (0: not measured) */
    int32_t experts_per_call;  /* distinct experts each measured call computes */
    tm_calib_curve cpu_expert; /* the CPU lane */
    /* GPU: measured when key.gpu is set */
    tm_calib_copy copy;
    double pcie_read_gbs;            /* kernels reading registered host memory, alone */
    double pcie_read_concurrent_gbs; /* the same while the CPU lane runs */
    double cpu_lane_gbs;             /* the CPU lane's decode expert bytes/s, alone */
    double cpu_lane_concurrent_gbs;  /* the same while the GPU reads over PCIe */
    double handoff_round_trip_ns;    /* signal → host sees it → host answers → GPU goes on */
    tm_calib_curve gpu_expert;       /* the GPU from VRAM */
    double measure_s[TM_CALIB_PHASE_COUNT]; /* seconds each part took */
} tm_calib;

/* The median of v[0..n) (n >= 1; v is sorted in place: a handful of values). */
double calib_median(double *v, int n);

/* ---- costs the tier asks (all pure; ns are nanoseconds) ----
 * Times are per expert; a cost of something not measured (no GPU) is
 * INFINITY, so a comparison never picks it. */

/* The CPU lane computing one expert for n_tok tokens with the expert's
 * weights read once (an expert-major run; a token-major decode list of n
 * tokens reads the weights once per token: n * calib_cpu_expert_ns(c, 1)).
 * n_tok <= 0: 0. Exact at the measured points, linear between them, the last
 * segment's slope above them (proportional if that slope is 0), the first
 * point's value below it. Non-decreasing in n_tok. */
double calib_cpu_expert_ns(const tm_calib *c, int64_t n_tok);
/* The GPU computing one expert in VRAM for n_tok tokens (cuda_moe_grouped up
 * to TM_CUDA_MMVQ_MAX_TOK tokens, cuda_moe_grouped_gemm above), as above. */
double calib_gpu_expert_ns(const tm_calib *c, int64_t n_tok);
/* One host→GPU copy of `bytes` (pinned: cuda_copy_async from pinned or
 * registered memory; else cuda_upload from pageable memory). Exact at the
 * two measured sizes, linear between them, from an intercept (the latency
 * the two points imply, at least 0) below, at the big copy's rate above.
 * bytes 0: 0. Non-decreasing. */
double calib_copy_ns(const tm_calib *c, uint64_t bytes, bool pinned);
/* GB/s at which the GPU's kernels read experts in RAM in place, alone or
 * while the CPU lane runs; 0 without a GPU. */
double calib_pcie_read_gbs(const tm_calib *c, bool concurrent);
/* The decode PCIe lane's share of a token's cold slots, in 1/256 (as
 * tm_cuda_router_params.mapped_share_q8), such that the PCIe lane and the
 * CPU lane finish together at their concurrent rates:
 *   share = pcie / (pcie + cpu)   (rates in bytes/s; an expert costs both the same bytes)
 * rounded to the nearest 1/256. 0: no share (no GPU, nothing measured): the
 * tier must then turn the lane off (share 0 means "n_mapped each" to
 * tm_cuda_mapped_count). */
int32_t calib_pcie_share_q8(const tm_calib *c);
/* The CPU lane's share of a prompt layer's cold experts, in 1/256, when the
 * fetch lane copies the rest ahead (the copy engine is the bound): as many as
 * it computes while the rest are copied,
 *   share = copy / (copy + cpu) * TM_CALIB_FETCH_CPU_DAMP
 * (copy: one expert of expert_bytes, pinned; cpu: calib_cpu_expert_ns at
 * tokens_per_expert, rounded up). The damping: the CPU lane starts only when
 * the layer's routing reaches the host, while the copies run ahead (H200
 * machine, 30b-a3b, --cpu-moe pp512: 1,650 t/s with no share, 1,761 with
 * 0.2, 1,534 with 0.3, where the balance says 0.28). 0: no GPU. */
#define TM_CALIB_FETCH_CPU_DAMP 0.75
int32_t calib_fetch_cpu_share_q8(const tm_calib *c, uint64_t expert_bytes,
                                 double tokens_per_expert);

/* The curve's interpolation (calib_cpu_expert_ns' rule) for any curve. */
double calib_curve_ns(const tm_calib_curve *cv, int64_t n_tok);

/* ---- measuring ---- */

/* What to measure on. */
typedef struct tm_calib_source {
    tm_pool *pool;                /* the CPU lane's threads (NULL: this thread) */
    tm_cuda_device *gpu;          /* NULL: the CPU parts only */
    tm_cuda_blas *blas;           /* the GPU's cuBLAS handle (NULL: one of its own, made and freed
                                     here: creating one takes ~0.1 s) */
    const tm_moe_experts *layers; /* [n_layer] layers' experts (those of another shape or
                                     type than the most common are left out) */
    uint32_t n_layer, n_expert;   /* experts per layer */
    uint32_t n_used;              /* experts a token routes to: experts per measured call */
} tm_calib_source;

typedef struct tm_calib_opts {
    bool quick;         /* a few hundred ms: fewer points, one repetition, short runs */
    int32_t max_tokens; /* largest tokens-per-expert point (0: 512) */
    FILE *log;          /* the table, a row as each is measured (NULL: silent) */
} tm_calib_opts;

/* The experts of every layer of a GGUF file that has llama.cpp's
 * blk.N.ffn_{gate,up,down}_exps.weight tensors (gate and up [n_embd, n_ff,
 * n_expert], down [n_ff, n_embd, n_expert]), in layer order, pointing into
 * the file's mapping; layers without them (dense ones) are skipped. Fails
 * naming the tensor when shapes disagree, and when there are none.
 * *layers: free() it. */
tm_status calib_experts_from_gguf(const tm_gguf_file *f, tm_moe_experts **layers, uint32_t *n_layer,
                                  uint32_t *n_expert);
/* This machine's key for the source's experts: CPU model, GPU name, threads,
 * the most common expert shape and types (the first layer's on a tie).
 * Fails naming the layer on experts of no usable shape. */
tm_status calib_key_make(const tm_calib_source *src, tm_calib_key *out);
/* Measure everything the machine has (the GPU parts when src->gpu is set).
 * Leaves the GPU's stream idle and every allocation freed. */
tm_status calib_measure(const tm_calib_source *src, const tm_calib_opts *o, tm_calib *out);
/* A profile's table, as calib_measure prints it row by row (`tiermoe
 * calibrate --show FILE`). */
void calib_print(const tm_calib *c, FILE *out);

/* ---- files ---- */

/* $XDG_CACHE_HOME/tiermoe/calib-<cpu>--<gpu>--t<threads>--<n_embd>x<n_ff>-<types>.json
 * (XDG_CACHE_HOME unset or relative: ~/.cache). TM_ERR_ARG when neither it
 * nor HOME is set. */
tm_status calib_default_path(const tm_calib_key *key, char *buf, size_t n);
/* Write the profile as JSON: path.tmp.<pid>, then rename; makes the parent
 * directories. */
tm_status calib_write_json(const tm_calib *c, const char *path);
/* Read and validate a profile: TM_ERR_IO when it cannot be opened,
 * TM_ERR_FORMAT naming the file and field when malformed, TM_ERR_ARG naming
 * the file and key field when expect (may be NULL) differs. */
tm_status calib_read_json(const char *path, const tm_calib_key *expect, tm_calib *out);

/* The executor's entry: the profile at path (NULL: $TIERMOE_CALIB, else
 * calib_default_path) when it exists and matches this machine and shape;
 * otherwise a quick measurement (not saved to a file; kept for the process,
 * so later calls with the same key reuse it), with one log line saying why
 * and how long it took. *measured (may be NULL): measured by this call. A
 * GPU part that fails is measured again without the GPU. Fails only when the
 * measurement does. */
tm_status calib_load_or_measure(const tm_calib_source *src, const char *path, tm_calib *out,
                                bool *measured);

/* ---- the drive (calib_drive.c; tiermoe calibrate --drive) ---- */

typedef struct tm_calib_drive {
    int depth;
    size_t block;
    bool direct, uring; /* how it was read */
    double mbs, iops;
} tm_calib_drive;

/* Random reads of `block` bytes (a multiple of 4096) over the file at path,
 * `depth` in flight, for `seconds`: MB/s and reads/s into *out. */
tm_status calib_drive_measure(const char *path, int depth, size_t block, double seconds,
                              tm_calib_drive *out);

#ifdef __cplusplus
}
#endif
#endif
