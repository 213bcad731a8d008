/* The synthetic-model writer's tensor list (synth.c) and the architectures
 * that build it elsewhere (synth_hybrid.c). Internal to src/model. */
#ifndef TM_MODEL_SYNTH_TENSOR_H
#define TM_MODEL_SYNTH_TENSOR_H

#include <stdio.h>

#include "model/synth.h"

/* Writing a file's keys: SYNTH_KV returns a failing call's status (a tm_status st
 * in scope); SYNTH_ARCH(fn, "suffix", ...) sets the key "<arch>.suffix" (a const
 * char *arch and a char key[] in scope). */
#define SYNTH_KV(call)                                                                             \
    if ((st = (call)) != TM_OK) return st
#define SYNTH_ARCH(fn, suffix, ...)                                                                \
    do {                                                                                           \
        snprintf(key, sizeof(key), "%s." suffix, arch);                                            \
        SYNTH_KV(fn(w, key, __VA_ARGS__));                                                         \
    } while (0)

typedef enum synth_init {
    INIT_ONES,
    INIT_NORMAL,
    INIT_EMBD,
    INIT_ROUTER,
    INIT_SSM_A,      /* -e^u, u uniform: linear attention's per-head decay rates */
    INIT_CONST,      /* every value std (a gain) */
    INIT_ROPE_FREQS, /* RoPE factors: 1 for the first std values, 1e30 (unturned) after */
} synth_init;

/* What a tensor is to the locality layout (synth_row_locality). */
typedef enum synth_role {
    ROLE_OTHER,
    ROLE_EMBD,
    ROLE_Q,
    ROLE_QG, /* gated attention's attn_q: per head head_dim rows of q, then of the gate */
    ROLE_K,
    ROLE_V,
    ROLE_O, /* any matrix whose rows are residual dims: attn_output, ssm_out */
    ROLE_QK_NORM,
    ROLE_ROUTER,
    ROLE_DOWN /* rows: experts x residual dims (the shared expert: one) */
} synth_role;

typedef struct synth_tensor {
    char name[64];
    tm_synth_kind kind; /* what picks its type (synth_types_pick) */
    tm_type type;
    uint32_t n_dims;
    int64_t ne[3];
    synth_init init;
    float std;
    const float *bias; /* INIT_ROUTER: this layer's n_expert biases */
    synth_role role;
    uint32_t layer;
    const tm_synth_locality *loc; /* NULL: locality 0, the tensor is as it always was */
} synth_tensor;

static inline void synth_tensor_set(synth_tensor *t, const char *name, tm_synth_kind kind,
                                    synth_init init, float std, uint32_t n_dims, int64_t ne0,
                                    int64_t ne1, int64_t ne2) {
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->kind = kind, t->type = TM_TYPE_F32, t->init = init, t->std = std, t->n_dims = n_dims,
    t->bias = NULL;
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2;
    t->role = ROLE_OTHER, t->layer = 0, t->loc = NULL;
}

/* Tensors a layer has at most (gemma4's sliding layers: 22; a NextN layer of glm4moe:
 * 23, counted as two), and the three outside the layers. */
#define SYNTH_MAX_TENSORS(c) (3 + 22 * ((size_t)(c)->n_layer + 2 * (size_t)(c)->n_nextn))

/* ---- qwen3next / qwen35moe (synth_hybrid.c) ---- */

bool synth_is_hybrid(const tm_synth_config *c);
/* Whether layer l is linear attention (the others gated full attention). */
bool synth_hybrid_linear(const tm_synth_config *c, uint32_t l);
/* The preset's hybrid fields, or false when `preset` is not a hybrid one. */
bool synth_hybrid_preset(tm_synth_config *c, const char *preset);
/* The hybrid dimensions against each other (the shared ones are checked by
 * synth_config_validate). */
tm_status synth_hybrid_validate(const tm_synth_config *c);

/* A dimension flag and its range: synth_dims_check refuses the first outside it,
 * naming the flag (and `what`, when not NULL). */
typedef struct synth_dim {
    const char *name;
    uint32_t v, lo, hi;
} synth_dim;
tm_status synth_dims_check(const synth_dim *dims, size_t n, const char *what);
/* The tensor list llama.cpp's converter writes, in its order; returns the count. */
uint32_t synth_hybrid_tensors(const tm_synth_config *c, const float *bias,
                              const tm_synth_locality *loc, synth_tensor *t);
/* The architecture's keys (those after general.*), as the converter writes them. */
tm_status synth_hybrid_metadata(const tm_synth_config *c, tm_gguf_writer *w);

/* ---- mixtral (arch llama), olmoe, glm4moe (synth_moe_archs.c): as the hybrids' ---- */

bool synth_is_moe_arch(const tm_synth_config *c);
bool synth_moe_arch_preset(tm_synth_config *c, const char *preset);
tm_status synth_moe_arch_validate(const tm_synth_config *c);
uint32_t synth_moe_arch_tensors(const tm_synth_config *c, const float *bias, synth_tensor *t);
tm_status synth_moe_arch_metadata(const tm_synth_config *c, tm_gguf_writer *w);

/* ---- gemma4 (synth_gemma4.c): as the hybrids' ---- */

bool synth_is_gemma4(const tm_synth_config *c);
bool synth_gemma4_preset(tm_synth_config *c, const char *preset);
tm_status synth_gemma4_validate(const tm_synth_config *c);
uint32_t synth_gemma4_tensors(const tm_synth_config *c, const float *bias, synth_tensor *t);
tm_status synth_gemma4_metadata(const tm_synth_config *c, tm_gguf_writer *w);

#endif
