/* Where a MoE model's bytes are: expert tensors (`*_exps`, one slice per
 * expert, routed) versus everything else (attention, norms, router, shared
 * experts `*_shexp`, embeddings: used by every token). Architecture-neutral:
 * it relies only on llama.cpp's tensor naming, "blk.N.<name>_exps.weight"
 * with the expert index as the last dimension. The planner and the SSD tier
 * size caches from this. */
#ifndef TM_MODEL_LAYOUT_H
#define TM_MODEL_LAYOUT_H

#include <stdint.h>

#include "core/status.h"
#include "gguf/gguf.h"

typedef struct tm_model_layout {
    uint32_t n_layer;             /* 1 + the largest N of a "blk.N." tensor (0 if none) */
    uint32_t n_expert;            /* experts per MoE layer (0: not a MoE model) */
    uint32_t n_moe_layers;        /* layers that have expert tensors */
    uint64_t *layer_expert_bytes; /* [n_layer] bytes of all expert tensors of the layer */
    uint64_t expert_bytes;        /* all expert tensors */
    uint64_t other_bytes;         /* all other tensors */
    uint64_t max_expert_slice; /* bytes of one expert of one layer (gate+up+down), largest layer */
} tm_model_layout;

/* Scan the tensor table. Fails (naming the tensor) when expert tensors of
 * one file disagree on the expert count. */
tm_status model_layout_scan(const tm_gguf_file *f, tm_model_layout *out);
void model_layout_free(tm_model_layout *l);

/* Layer index of a "blk.N." tensor name, or -1. */
int64_t model_tensor_layer(const char *name, uint64_t len);
/* Whether the name is a routed-expert tensor ("_exps." in llama.cpp's naming). */
int model_tensor_is_expert(const char *name, uint64_t len);

#endif
