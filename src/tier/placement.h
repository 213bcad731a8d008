/* Placement: where each tensor of a model lives, CPU (the mapped file) or a GPU,
 * from the flags users know from llama.cpp (docs/executor.md, docs/flags.md):
 *
 *   -ngl N          layers < N on the GPU; N >= n_layer also the output head;
 *                   TM_NGL_AUTO: as many as fit the GPU budget (every GPU's);
 *                   with several GPUs the layers < N are split into contiguous
 *                   spans, one a GPU in order, by the params' proportions
 *                   (--tensor-split; default each GPU's budget), and the
 *                   output head goes to the last span's GPU
 *   --cpu-moe       every layer's expert tensors on the CPU
 *   --n-cpu-moe N   the expert tensors of layers < N on the CPU
 *   -ot P=D[,P=D]   tensors whose name matches the PCRE2 pattern P (searched, not
 *                   anchored) on D = CPU or CUDAn (a GPU of the list: its CUDA
 *                   index); first match wins; before the
 *                   patterns --cpu-moe / --n-cpu-moe stand for
 *
 * Rules beyond the flags: a tensor's layer is N of its "blk.N." prefix; its
 * default home is its layer's (-ngl). output.weight and output_norm.weight go
 * to the GPU when every layer does; token_embd.weight stays on the CPU (the
 * embedding is a row lookup on the host) unless it doubles as the output head
 * (no output.weight), then it follows the head. A layer's expert tensors
 * (names with "_exps" or "_chexps") live together: if the overrides split
 * them, all of the layer's go to the CPU, with a warning. A layer's attention
 * and KV cache live at the layer's -ngl home. Tensors of layers at or past
 * n_layer (a NextN layer the model loads but does not run) stay on the CPU.
 *
 * Knows tensor names (the GGUF convention), no architecture. */
#ifndef TM_TIER_PLACEMENT_H
#define TM_TIER_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "exec/exec.h"
#include "gguf/gguf.h"
#include "tier/gpus.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_NGL_AUTO (-1)

typedef struct tm_placement_params {
    int n_gpu_layers;      /* -ngl: >= 0, or TM_NGL_AUTO */
    bool cpu_moe;          /* --cpu-moe */
    int n_cpu_moe;         /* --n-cpu-moe N (0: none) */
    const char *overrides; /* -ot: "PATTERN=DEV[,PATTERN=DEV...]", several -ot joined by ','
                              (NULL or "": none) */
    int n_gpu;             /* GPUs: placement_make's gpu[0 .. n_gpu) (0: one, gpu[0]) */
    const int *gpu_cuda;   /* [n_gpu] each one's CUDA index, what -ot's CUDAn names (NULL: 0,
                              1, ...) */
    const float *split;    /* [n_gpu] the spans' proportions (NULL: each GPU's budget) */
} tm_placement_params;

/* What the GPU offers. */
typedef struct tm_placement_gpu {
    bool usable;        /* a GPU was opened */
    const char *why;    /* when not: why (named in errors and in the CPU-only line) */
    size_t budget;      /* bytes the weights and KV caches may take (free VRAM less a reserve) */
    size_t fixed_bytes; /* bytes any GPU use takes besides (activations, scratch) */
    size_t kv_bytes_per_layer;    /* one layer's K and V caches */
    const size_t *kv_bytes_layer; /* [n_layer] each layer's, where they differ (sliding
                                     layers' rings); NULL: kv_bytes_per_layer each */
} tm_placement_gpu;

typedef struct tm_placement {
    uint32_t n_tensors, n_layer;
    uint8_t *tensor_dev;  /* [n_tensors] tm_dev of each tensor of the file */
    uint8_t *layer_dev;   /* [n_layer] the layer's home: attention and its KV cache */
    uint8_t *experts_dev; /* [n_layer] where the layer's expert tensors live */
    int n_gpu_layers;     /* resolved -ngl (0..n_layer) */
    bool output_gpu;      /* the output head on the GPU */
    bool any_gpu;         /* some tensor or KV cache is on the GPU */
    size_t gpu_bytes;     /* bytes of the tensors on the GPU (all GPUs) */
    /* Several GPUs: which one, for what tm_dev puts on TM_DEV_GPU (0 .. n_gpu - 1: an
       index into the params' GPU list; 0 elsewhere) */
    int n_gpu;                            /* the GPU list's length (1 with one or none) */
    uint8_t *tensor_gpu;                  /* [n_tensors] */
    uint8_t *layer_gpu;                   /* [n_layer] attention and its KV cache */
    uint8_t *experts_gpu;                 /* [n_layer] the layer's expert tensors */
    int output_gpu_index;                 /* the output head's (the last span's GPU) */
    uint32_t span_first[TM_MAX_GPUS + 1]; /* GPU g's default span: layers [span_first[g],
                                             span_first[g + 1]) (-ot may move tensors) */
    size_t gpu_bytes_each[TM_MAX_GPUS];   /* bytes of the tensors on each GPU */
    int n_gpu_used;                       /* GPUs holding a tensor or a KV cache */
} tm_placement;

/* Place every tensor of f (a model of n_layer layers) over gpu[0 .. max(1,
 * p->n_gpu)). Errors name the flag: an -ot item without '=', an invalid regular
 * expression (PCRE2's message and offset), an unknown device, a CUDAn not in
 * the GPU list; a request for the GPU (-ngl N > 0, -ot ...=CUDA0)
 * when gpu->usable is false; -ngl N > 0 whose tensors do not fit gpu->budget
 * is left to the allocation, which names needed and free bytes. Warns (log) on
 * a pattern that matches no tensor and on a split expert triple. Without a
 * usable GPU, TM_NGL_AUTO and the expert flags give CPU only, with one info
 * line saying so. */
tm_status placement_make(const tm_gguf_file *f, uint32_t n_layer, const tm_placement_params *p,
                         const tm_placement_gpu *gpu, tm_placement *out);
void placement_free(tm_placement *pl);

/* Check -ot's syntax (items, patterns, devices) without a model: the CLI calls
 * it while parsing flags. flag names the flag in messages ("-ot"). */
tm_status placement_overrides_check(const char *flag, const char *spec);

/* The layer of a tensor name ("blk.12.attn_q.weight" → 12), or -1. */
int placement_tensor_layer(const char *name, size_t len);
/* Whether a tensor name is one of a layer's expert tensors. */
bool placement_tensor_is_expert(const char *name, size_t len);

#ifdef __cplusplus
}
#endif
#endif
