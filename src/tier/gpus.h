/* Which GPUs a context uses and how layers are split over them, from the
 * flags llama.cpp's users know (docs/flags.md, "Several GPUs"):
 *
 *   -dev CUDA0,CUDA1 | none   the GPUs, in the order their spans of layers run
 *                             (default: every GPU the driver reports)
 *   --split-mode layer|none   layer (default): each GPU runs a contiguous span
 *                             of layers; none: -mg's GPU alone
 *   --tensor-split a,b        the spans' proportions, one a GPU of -dev
 *                             (default: each GPU's free memory)
 *   -mg N                     the GPU of split-mode none (an index into -dev's list)
 *   --moe-cache A,B           each GPU's expert cache in MiB (one value: split
 *                             over the layers as before)
 *
 * Parsing checks the syntax and names the flag; gpus_resolve checks the
 * values against the GPUs present and names the flag and the GPU. Knows no
 * model and no CUDA: the caller gives the device count. */
#ifndef TM_TIER_GPUS_H
#define TM_TIER_GPUS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TM_MAX_GPUS, TM_SPLIT_LAYER and TM_SPLIT_NONE are the public header's. */

typedef struct tm_gpu_opts {
    bool dev_given;       /* -dev given (else every GPU present) */
    int n_dev;            /* its devices (0 with dev_given: -dev none) */
    int dev[TM_MAX_GPUS]; /* their CUDA indices, in -dev's order */
    int split_mode;       /* TM_SPLIT_LAYER or TM_SPLIT_NONE */
    int n_split;          /* --tensor-split's values (0: not given) */
    float split[TM_MAX_GPUS];
    int main_gpu; /* -mg (default 0) */
    int n_cache;  /* --moe-cache A,B's values (0: one value or none) */
    int64_t cache_mib[TM_MAX_GPUS];
} tm_gpu_opts;

/* -dev: "none", or CUDAn[,CUDAm...] (distinct, at most TM_MAX_GPUS). */
tm_status gpus_devices_parse(const char *flag, const char *spec, tm_gpu_opts *o);
/* --split-mode: layer or none (row: not supported, said so). */
tm_status gpus_split_mode_parse(const char *flag, const char *spec, tm_gpu_opts *o);
/* --tensor-split: a[,b...] proportions (finite, >= 0, not all 0); '/' separates too. */
tm_status gpus_split_parse(const char *flag, const char *spec, tm_gpu_opts *o);
/* -mg: an index into the GPU list (0 .. TM_MAX_GPUS - 1). */
tm_status gpus_main_parse(const char *flag, const char *spec, tm_gpu_opts *o);
/* --moe-cache with a ',': one MiB count a GPU (>= 0). */
tm_status gpus_cache_parse(const char *flag, const char *spec, tm_gpu_opts *o);

/* The GPUs a context uses, by CUDA index, in span order, from o and the n_avail
 * GPUs present: -dev's (each < n_avail) or every one; with split-mode none,
 * -mg's alone. Errors name the flag and the GPU: a -dev device not present,
 * -mg out of the list, --tensor-split's or --moe-cache's count not the GPUs'. */
tm_status gpus_resolve(const tm_gpu_opts *o, int n_avail, int *n_used, int used[TM_MAX_GPUS]);

/* Layers [0, n_layers) into n_gpu contiguous spans in proportion to prop
 * (>= 0, not all 0): GPU g runs layers [first[g], first[g + 1]); first has
 * n_gpu + 1 entries. llama.cpp's rule: layer l goes to the first GPU whose
 * cumulative share exceeds l / n_layers. */
void gpus_spans_make(int n_gpu, const float *prop, uint32_t n_layers, uint32_t *first);

#ifdef __cplusplus
}
#endif
#endif
