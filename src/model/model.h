/* Models: hyper-parameters and weights bound from a GGUF file, and contexts
 * (KV cache, scratch) that run the forward pass.
 *
 * Each architecture lives in one file (qwen3moe.c) that reads like the
 * model's math and fills a tm_arch table: load (hyper-parameters + weight
 * binding), state create/free, forward. Weights stay in the mapped file: the
 * CPU path never copies them. */
#ifndef TM_MODEL_MODEL_H
#define TM_MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "cpu/cpu.h"
#include "gguf/gguf.h"
#include "moe/moe.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight tensor bound from the file. ne[0] is the row length. */
typedef struct tm_weight {
    const char *name; /* points into the file's tensor table (not NUL-terminated there: use len) */
    uint32_t name_len;
    tm_type type;
    uint32_t n_dims;
    int64_t ne[4];
    size_t row_bytes; /* bytes of one row of ne[0] values */
    const uint8_t *data;
} tm_weight;

/* Hyper-parameters every architecture has. */
typedef struct tm_model_config {
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    uint32_t n_expert, n_expert_used, n_ff_exp;
    float rope_base, rms_eps;
} tm_model_config;

typedef struct tm_model tm_model;
typedef struct tm_context tm_context;

typedef struct tm_arch {
    const char *name; /* general.architecture */
    tm_status (*load)(tm_model *m);
    void (*unload)(tm_model *m);
    tm_status (*state_create)(tm_context *c);
    void (*state_free)(tm_context *c);
    /* Run n_tok tokens at positions n_past.. ; writes logits of the last token
     * (or of every token when all_logits) to c->logits. */
    tm_status (*forward)(tm_context *c, const int32_t *tokens, int64_t n_tok, tm_moe_phase phase,
                         bool all_logits);
} tm_arch;

struct tm_model {
    tm_gguf_file *file;
    const tm_arch *arch;
    tm_model_config cfg;
    void *weights;         /* the architecture's own weight struct */
    uint64_t n_params;     /* values in all tensors */
    uint64_t weight_bytes; /* bytes of all tensors */
};

/* Called with every named intermediate of a forward pass (tests compare them
 * with a reference layer by layer). data is [n_tok][n] floats, or int32 ids
 * when is_int. layer is -1 for tensors outside the layers. */
typedef void (*tm_tensor_cb)(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                             int64_t n, bool is_int);

#define TM_NGL_AUTO (-1)

typedef struct tm_context_params {
    int64_t n_ctx;    /* KV cache positions (0: min(4096, trained context)) */
    int64_t n_batch;  /* tokens per forward chunk of a prompt (0: 512) */
    int n_threads;    /* 0: physical cores */
    tm_type kv_type;  /* TM_TYPE_F16 (default) or TM_TYPE_F32 */
    bool precise;     /* double products from dequantized weights (test reference) */
    int n_gpu_layers; /* -ngl: the first n layers on the GPU (>= n_layer: all of them and the
                         output head); TM_NGL_AUTO: as many as fit, 0 without a GPU */
    bool profile;     /* time every part (GPU: events and a sync per part, no graph) */
    tm_tensor_cb cb;
    void *cb_ud;
} tm_context_params;

/* Where a context's time went, accumulated over its forward calls. */
typedef enum tm_prof_part {
    TM_PROF_EMBED,
    TM_PROF_NORM,
    TM_PROF_ATTN_PROJ,
    TM_PROF_ATTENTION,
    TM_PROF_ROUTER,
    TM_PROF_EXPERTS,
    TM_PROF_OUTPUT,
    TM_PROF_COUNT
} tm_prof_part;
extern const char *const tm_prof_part_names[TM_PROF_COUNT];

struct tm_context {
    tm_model *model;
    tm_context_params params;
    tm_pool *pool;
    int64_t n_ctx, n_past;
    /* KV cache: per layer [n_ctx][n_head_kv * head_dim] of kv_type */
    void **k_cache, **v_cache;
    float *logits; /* [n_batch][n_vocab] when all_logits, else [n_vocab] */
    int64_t n_logits_rows;
    void *state;      /* the architecture's scratch */
    int n_gpu_layers; /* layers on the GPU (resolved from params.n_gpu_layers) */
    bool gpu_output;  /* the output head runs on the GPU */
    uint64_t prof_ns[TM_PROF_COUNT];
    tm_moe_lane_stats lane_stats; /* the CPU lane's thread time, when profiling */
};

/* Open, validate and bind a model. Fails with a message naming the file and
 * the missing or mis-shaped tensor / key, or the unsupported architecture or type. */
tm_status model_load(const char *path, tm_model **out);
void model_free(tm_model *m);

tm_status model_context_create(tm_model *m, const tm_context_params *p, tm_context **out);
void model_context_free(tm_context *c);

/* Evaluate tokens at the context's current position, in chunks of n_batch,
 * and advance it. Logits of the last token end in c->logits (all tokens'
 * when all_logits; then n_tok must be <= n_batch). Fails when the context
 * would overflow or a token id is out of range. */
tm_status model_decode(tm_context *c, const int32_t *tokens, int64_t n_tok, tm_moe_phase phase,
                       bool all_logits);

/* Forget the cache (a new conversation). */
void model_context_reset(tm_context *c);
/* Keep only the first n_keep positions of the cache (n_keep <= n_past): a
 * conversation that shares a prefix with what was evaluated reuses it. */
void model_context_rewind(tm_context *c, int64_t n_keep);

/* ---- helpers for architecture files ---- */

/* Bind tensor `name` and check its shape (dims after n_dims must be 1). */
tm_status model_weight_bind(const tm_model *m, const char *name, uint32_t n_dims, const int64_t *ne,
                            tm_weight *w);
/* Same, but a missing tensor leaves w->data NULL and succeeds. */
tm_status model_weight_bind_optional(const tm_model *m, const char *name, uint32_t n_dims,
                                     const int64_t *ne, tm_weight *w);
tm_status model_key_u32(const tm_model *m, const char *arch_key, uint32_t *out);
tm_status model_key_f32(const tm_model *m, const char *arch_key, float *out);

/* y[t][r] = W·x[t] for n_tok rows of x (W: ne[1] rows of ne[0]); act: scratch
 * for quantized activations, at least model_matmul_scratch_bytes. */
void model_matmul(tm_context *c, const tm_weight *w, const float *x, int64_t n_tok, float *y,
                  void *act);
size_t model_matmul_scratch_bytes(const tm_weight *w, int64_t n_tok);

static inline void model_prof_add(tm_context *c, tm_prof_part part, uint64_t t0, uint64_t t1) {
    c->prof_ns[part] += t1 - t0;
}

#ifdef __cplusplus
}
#endif
#endif
