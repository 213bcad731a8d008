/* The executor: runs an architecture's ops where their weights live, and
 * moves activations only where the side changes (docs/executor.md).
 *
 * An architecture file describes a step as a sequence of ops on activations
 * (tm_act) and weights (tm_weight). Each weight has one home, CPU or GPU,
 * given by the placement (src/tier/placement.h) as one byte per tensor of the
 * file. An op with a matrix weight runs at that weight's home; RMSNorm runs at
 * its gain vector's home; attention at its layer's KV cache. Before an op the
 * executor makes the op's inputs valid on its side (a copy, and on the way to
 * the host a synchronisation, only when they are not); after it, the outputs
 * are valid on that side only.
 *
 * Steps: model_decode runs the architecture's forward through exec_step. A
 * decode step whose ops are all on the GPU is captured once as a CUDA graph and
 * replayed; host work inside it is recorded as tasks (the embedding lookup
 * before the launch, the tier's CPU-lane hand-offs after it). Other steps run
 * eagerly. Shapes: an activation is [rows][n] row-major, float or int32;
 * rows = the context's batch; a step uses its first n_tok rows. */
#ifndef TM_EXEC_EXEC_H
#define TM_EXEC_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "gguf/gguf.h"
#include "moe/moe.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tm_dev { TM_DEV_CPU = 0, TM_DEV_GPU = 1 } tm_dev;
/* GPUs an executor can hold (spans of layers a GPU: tm_placement's TM_MAX_GPUS). */
#define EXEC_MAX_GPUS 8
#define TM_DEV_COUNT  2
extern const char *const tm_dev_names[TM_DEV_COUNT]; /* "CPU", "CUDA0" (the -ot names) */

/* A weight tensor bound from the file. ne[0] is the row length. */
typedef struct tm_weight {
    const char *name; /* points into the file's tensor table (not NUL-terminated: use len) */
    uint32_t name_len;
    int32_t id; /* index of the tensor in the file: placement and device copies go by it */
    tm_type type;
    uint32_t n_dims;
    int64_t ne[4];
    size_t row_bytes; /* bytes of one row of ne[0] values */
    const uint8_t *data;
} tm_weight;

/* One activation tensor: [rows][n] floats (or int32 when is_int). */
typedef struct tm_act {
    const char *name;
    int64_t n, rows;
    bool is_int;
    void *host;    /* pinned when the context uses a GPU */
    void *dev;     /* the values on the device this step: dev_own, or (the outputs of a
                       stacked group at decode) a slice of the group's buffer */
    void *dev_own; /* the act's device buffer of dev_rows rows on the GPU ops run on now
                      (dev_gpu[that GPU]; NULL without a GPU) */
    int64_t dev_rows;
    void *dev_gpu[EXEC_MAX_GPUS]; /* its buffer on each of the executor's GPUs */
    const void *cross;            /* non-NULL: the device values are on GPU cross_gpu, here,
                                     not yet on the GPU ops run on (a span boundary) */
    int cross_gpu;
    unsigned valid; /* bit (1 << tm_dev): the current values are there */
} tm_act;

/* Called with every named intermediate of a forward pass (tests compare them
 * with a reference layer by layer). data is [n_tok][n] floats, or int32 ids
 * when is_int. layer is -1 for tensors outside the layers. */
typedef void (*tm_tensor_cb)(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                             int64_t n, bool is_int);

/* Where a step's time went, by part of the architecture (--profile). */
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

/* Attention of one layer (exec_attention). */
typedef struct tm_attn_desc {
    int64_t n_head, n_head_kv, head_dim;
    float scale;                      /* softmax scale */
    float rms_eps;                    /* of the QK norms */
    float rope_base;                  /* NeoX RoPE */
    const tm_weight *q_norm, *k_norm; /* per-head gains (NULL: no QK norm) */
    const tm_weight *sinks;           /* [n_head] f32 logits in each softmax's denominator only
                                         (attention sinks; NULL: none) */
    int64_t window;                   /* sliding window: the query at p sees keys (p - window, p]
                                         (0: every key before it) */
    const float *rope_freq;           /* [head_dim / 2] inverse frequencies of a scaled RoPE
                                         (YaRN; NULL: rope_base^(-2i/head_dim)), the same in
                                         every layer */
    float rope_mscale;                /* cos and sin multiplied by it (YaRN; 0: 1) */
    int64_t n_rot;                    /* RoPE turns a head's first n_rot values (pairs i,
                                         i + n_rot/2; angles of width n_rot); 0: head_dim */
    bool rope_interleaved;            /* pairs (2i, 2i + 1), llama.cpp's "normal" RoPE
                                         (Mixtral's permuted q/k rows); else NeoX's. The
                                         whole head only (n_rot 0 or head_dim), or latent's
                                         RoPE part */
    bool v_norm; /* v rmsnorm'ed per head without a gain before it is stored (Gemma 4) */
    bool v_is_k; /* the value is k's projection as given, before its norm and RoPE (Gemma 4's
                    attention_k_eq_v): exec_attention's v is NULL */
    /* Latent attention (MLA decoded in the absorbed form): n_head_kv 1, its key
     * [latent (v_dim) ; RoPE key (n_rot)] = head_dim values, v_dim + n_rot = head_dim,
     * and the value the key's first v_dim values: the KV cache holds the key rows only.
     * RoPE turns the last n_rot values of each query head and of the key (rope_freq:
     * n_rot / 2 of them); k_norm (v_dim values) norms the latent; no q_norm. out is
     * [rows][n_head v_dim]. */
    bool latent;
    int64_t v_dim;
} tm_attn_desc;

/* A layer without attention (exec_attention_setup's window): no KV cache. */
#define EXEC_NO_ATTENTION (-1)
/* The largest head a value norm takes (tm_attn_desc.v_norm). */
#define EXEC_MAX_HEAD_DIM 512

/* Linear attention of one layer (Gated DeltaNet: exec_ssm_conv, exec_delta_rule).
 * The convolution runs over the C = 2 n_k_head k_dim + n_v_head v_dim channels
 * of q, k and v, in that order. */
typedef struct tm_ssm_desc {
    int64_t conv_k;               /* the convolution's width (2 .. 16) */
    int64_t n_k_head, n_v_head;   /* query/key heads, value heads (a multiple of n_k_head) */
    int64_t k_dim, v_dim;         /* their widths */
    bool v_tiled;                 /* value head h reads key head h % n_k_head (else h / (n_v_head
                                      / n_k_head), the heads grouped) */
    const tm_weight *conv;        /* [conv_k, C] f32 */
    const tm_weight *a, *dt_bias; /* [n_v_head] f32: A (= -exp(A_log)) and the step's bias */
} tm_ssm_desc;

typedef struct tm_exec tm_exec;

typedef struct tm_exec_params {
    tm_pool *pool;
    const tm_gguf_file *file;
    const uint8_t *tensor_dev; /* [file->n_tensors]: tm_dev of each tensor (copied) */
    /* the opened GPUs (the executor owns them from here): GPU tensors and layers on
     * gpus[tensor_gpu[i]], gpus[layer_gpu[l]]; n_gpus 0: none */
    tm_cuda_device *gpus[EXEC_MAX_GPUS];
    int n_gpus;
    const uint8_t *tensor_gpu; /* [file->n_tensors] (copied; NULL: every GPU tensor on 0) */
    const uint8_t *layer_gpu;  /* [n_layer of exec_attention_setup] (read there; NULL: 0) */
    int64_t n_batch;
    int64_t n_ctx;   /* positions of all sequences: n_ctx / n_seq each */
    int n_seq;       /* sequences with KV rows of their own (0: 1) */
    bool kv_full;    /* sliding-window layers keep every position too (no rings: the
                        comparison TIERMOE_KV_RING=0 asks for) */
    tm_type kv_type; /* TM_TYPE_F16 or TM_TYPE_F32 */
    bool precise;    /* CPU products in double from dequantized weights (test reference) */
    bool profile;    /* time every part: a synchronisation per part, no graph */
    bool graph;      /* capture decode steps whose ops are all on the GPU */
    tm_tensor_cb cb; /* named intermediates (NULL: none; no graph when set) */
    void *cb_ud;
} tm_exec_params;

/* ---- setup, in this order: create, acts / groups / attention, finalize ---- */

tm_status exec_create(const tm_exec_params *p, tm_exec **out);
void exec_free(tm_exec *e);

/* An activation of n values a row and the batch's rows (host buffer now, device
 * buffer at exec_finalize). dev_rows: rows of the device buffer (0: all); a
 * smaller one bounds a big output (logits): GPU products into it run in chunks
 * of dev_rows rows and leave the result on the host. */
tm_status exec_act_create(tm_exec *e, tm_act *a, const char *name, int64_t n, bool is_int,
                          int64_t dev_rows);
/* Weights multiplied with one input (attention's q, k, v): kept back to back
 * on the GPU when they share a home there and a type, so one launch covers them
 * at decode. */
tm_status exec_weight_group(tm_exec *e, int n, const tm_weight *const *ws);
/* A weight exec_matmul_heads takes (the GPU sizes its gather scratch by it). */
tm_status exec_weight_heads(tm_exec *e, const tm_weight *w);
/* Attention's shape (every layer's: sizes the KV caches and the scratch), where
 * each layer's KV cache lives and each layer's sliding window (window: [n_layer],
 * 0 or NULL: full attention; EXEC_NO_ATTENTION: none, no cache). A sequence's cache has rows of n_head_kv * head_dim
 * values: n_ctx / n_seq of them, one a position; a sliding layer's is a ring of
 * window + n_batch rows instead (position p at row p % rows: a step of up to
 * n_batch tokens is stored before its attention runs, and its first query still
 * needs the window before it), unless that is no smaller or kv_full is set.
 * Logs the caches' bytes (and what rings saved). */
tm_status exec_attention_setup(tm_exec *e, uint32_t n_layer, const uint8_t *layer_dev,
                               const tm_attn_desc *shape, const int64_t *window);
/* The same with a shape a layer (shapes: [n_layer]; Gemma 4's sliding and global layers
 * differ in head size and KV heads): each layer's KV rows are its n_head_kv * head_dim
 * values, exec_attention of a layer takes its own shape (and RoPE table: rope_freq, which
 * must outlive the executor; not copied), and the scratch fits the largest. The GPU does
 * not take such layers yet (exec_attention fails there naming the layer). */
tm_status exec_attention_setup_layers(tm_exec *e, uint32_t n_layer, const uint8_t *layer_dev,
                                      const tm_attn_desc *shapes, const int64_t *window);
/* Rows of one sequence in the KV cache of a layer with sliding window `window`
 * (0: full attention): a ring of window + n_batch rows when that is fewer than
 * the n_ctx_seq positions and kv_full is not set, else n_ctx_seq. */
int64_t exec_kv_rows(int64_t n_ctx_seq, int64_t n_batch, int64_t window, bool kv_full);
/* How many of the first n_keep positions of a sequence its caches still hold
 * after positions [0, n_written) were written (n_written: the most it ever
 * held since it was empty): n_keep, or 0 when a ring has overwritten keys that
 * position n_keep's window needs (a sequence cut back by more than about
 * n_batch positions: the keys before them can only be computed again from the
 * start). */
int64_t exec_kv_keep(const tm_exec *e, int64_t n_written, int64_t n_keep);
/* Rows of one sequence's ring in layer's KV cache (0: not a ring). */
int64_t exec_kv_ring(const tm_exec *e, uint32_t layer);
/* Linear attention's per-sequence state for the layers with ssm[l] set
 * (NULL: none): a conv state [conv_k - 1][C] and a delta-rule state [n_v_head]
 * [k_dim][v_dim] of f32 for each of the n_seq sequences, and as much again for
 * each sequence's checkpoint (exec_ssm_checkpoint). The states live on the CPU
 * (the GPU has no linear-attention kernels yet: those layers' recurrent ops
 * run there whatever the placement). Logs the bytes. */
tm_status exec_ssm_setup(tm_exec *e, uint32_t n_layer, const bool *ssm, const tm_ssm_desc *shape);
/* Bytes of one sequence's linear-attention state (0: none). */
size_t exec_ssm_seq_bytes(const tm_exec *e);
/* Copy sequence seq's states into its checkpoint, which then stands for
 * position pos (the end of a prompt). */
void exec_ssm_checkpoint(tm_exec *e, int seq, int64_t pos);
/* How many of the first n_keep of the n_past positions of sequence seq the
 * states can stand for: n_past when n_keep >= n_past (all of them), else its
 * checkpoint's position when that is <= n_keep, else 0 (a recurrent state
 * cannot be cut back: evaluate from the start). n_keep without linear
 * attention. */
int64_t exec_ssm_keep(const tm_exec *e, int seq, int64_t n_past, int64_t n_keep);
/* Make sequence seq's states stand for position keep (a result of
 * exec_ssm_keep): its checkpoint's copied back when keep is its position and
 * below n_past; nothing else (a step at position 0 clears them). */
void exec_ssm_rewind(tm_exec *e, int seq, int64_t n_past, int64_t keep);

/* Upload what the GPU holds (its weights, every vector weight, the KV caches
 * and device activations) and size the scratch. Logs the upload. */
tm_status exec_finalize(tm_exec *e);

/* ---- steps ---- */

typedef tm_status (*tm_exec_forward_fn)(void *ud);
/* Run forward(ud) for n_tok tokens at positions pos.. (tokens: host array).
 * A decode step (phase decode, one token, no callback, not profiling) whose
 * forward was captured replays its graph; the first such step captures it
 * (a forward that runs a CPU op cannot be captured: it then runs eagerly, and
 * so do later steps). Waits for the GPU at the end: afterwards every act
 * fetched with exec_fetch is valid on the host. */
tm_status exec_step(tm_exec *e, const int32_t *tokens, int64_t n_tok, int64_t pos,
                    tm_moe_phase phase, tm_exec_forward_fn forward, void *ud);
/* A step whose rows may belong to several sequences (serve --parallel): row t
 * is at position pos[t] (< n_ctx / n_seq) of sequence seq[t] (< n_seq; each
 * sequence has KV rows of its own in every layer, exec_attention_setup; a row
 * sees only its sequence's keys, positions up to pos[t], and rows of one
 * sequence in one step are consecutive, in order). exec_step is the
 * one-sequence case (pos + t, sequence 0). A decode step (phase decode, up to
 * TM_CUDA_MMVQ_MAX_TOK rows, no callback, not profiling) replays a graph
 * captured for its row count; the GPU's attention reads each row's position
 * and sequence from device memory, so one graph serves any sequences at any
 * positions. */
tm_status exec_step_rows(tm_exec *e, const int32_t *tokens, int64_t n_tok, const int32_t *pos,
                         const int32_t *seq, tm_moe_phase phase, tm_exec_forward_fn forward,
                         void *ud);
/* Whether decode steps of one row replay a captured graph (after the first one). */
bool exec_graph_ready(const tm_exec *e);
/* Whether decode steps of n_rows rows do. */
bool exec_graph_ready_rows(const tm_exec *e, int64_t n_rows);
int64_t exec_n_tok(const tm_exec *e);
int64_t exec_n_batch(const tm_exec *e);
int64_t exec_pos(const tm_exec *e);
tm_moe_phase exec_phase(const tm_exec *e);
const int32_t *exec_tokens(const tm_exec *e);

/* ---- ops (the architecture's vocabulary); every op covers the step's n_tok rows ---- */

/* x[t] = embd[tokens[t]] (a row lookup on the host). */
tm_status exec_embed(tm_exec *e, tm_act *x, const tm_weight *embd);
/* y = rmsnorm(x) * w, at w's home. */
tm_status exec_rmsnorm(tm_exec *e, tm_act *y, tm_act *x, const tm_weight *w, float eps);
/* x += a; h = rmsnorm(x) * w, at w's home. */
tm_status exec_add_rmsnorm(tm_exec *e, tm_act *x, tm_act *a, tm_act *h, const tm_weight *w,
                           float eps);
/* y = W x, at W's home. */
tm_status exec_matmul(tm_exec *e, tm_act *y, const tm_weight *w, tm_act *x);
/* y rows [0, n) = W x rows [first, first + n) (the output head's last rows). */
tm_status exec_matmul_rows(tm_exec *e, tm_act *y, const tm_weight *w, tm_act *x, int64_t first,
                           int64_t n);
/* y_i = W_i x for the n matrices of a group (exec_weight_group), in one go. */
tm_status exec_matmul_n(tm_exec *e, int n, tm_act *const *ys, const tm_weight *const *ws,
                        tm_act *x);

/* y[t] += b for the step's rows, at b's home (a bias vector). */
tm_status exec_add_bias(tm_exec *e, tm_act *y, const tm_weight *b);

/* For layer l, at its KV cache's home: q, k = rope(rmsnorm(q|k) * gain) per head
 * (q in place; k is consumed), K and V rows stored at the step's positions, then
 * causal grouped-query attention of q over the cache into out (within the
 * layer's window, with its sinks, when the desc has them). Latent (the desc's
 * latent): k's latent normed, q's and k's RoPE parts turned, the K row stored,
 * v unused (NULL). */
tm_status exec_attention(tm_exec *e, uint32_t layer, const tm_attn_desc *a, tm_act *q, tm_act *k,
                         tm_act *v, tm_act *out);
/* Per-head products with a 3-D weight w [in, out, n_head] (MLA's attn_k_b,
 * attn_v_b), at w's home (declared with exec_weight_heads before exec_finalize):
 * for each row t and head h < n_head,
 *   y[t][h ys + o]       = Σ_i W[h][o][i] x[t][h xs + i]   o < out
 *   y[t][h ys + out + j] = x[t][h xs + in + j]            j < n_pass (carried along:
 *                                                          MLA's RoPE part of the query)
 * with xs = x->n / n_head and ys = y->n / n_head. On the GPU a product a head over
 * the head's rows (gathered for a batch). */
tm_status exec_matmul_heads(tm_exec *e, tm_act *y, const tm_weight *w, tm_act *x, int64_t n_pass);

/* ---- linear attention and the gates around it (exec_ssm.c) ---- */

/* For layer l (exec_ssm_setup): qkv [rows][C] = silu(causal depthwise conv of
 * width conv_k over each sequence's positions, the rows before a step's from
 * its conv state), in place; the state takes the last conv_k - 1 inputs. A
 * sequence's state starts at zero at position 0. */
tm_status exec_ssm_conv(tm_exec *e, uint32_t layer, const tm_ssm_desc *d, tm_act *qkv);
/* For layer l, after exec_ssm_conv: q and k of qkv L2-normalised per head (q
 * also times 1/sqrt(k_dim)), β = sigmoid(b), g = A · softplus(a + dt_bias),
 * then the gated delta rule (cpu_ssm.h) of each value head from its
 * sequence's state into out [rows][n_v_head v_dim]. b and a: [rows][n_v_head]
 * each, or (ba_grouped, b == a) one [rows][2 n_v_head] in HF Qwen3-Next's
 * in_proj_ba order: per key head, its value heads' b, then their a. Prompts
 * run in chunks of matrix products, decode token by token. */
tm_status exec_delta_rule(tm_exec *e, uint32_t layer, const tm_ssm_desc *d, tm_act *qkv, tm_act *b,
                          tm_act *a, bool ba_grouped, tm_act *out);
/* x = rmsnorm(x) * w * silu(z) per group of w's n values, at w's home (CPU
 * when that side has no such op). */
tm_status exec_rmsnorm_gated(tm_exec *e, tm_act *x, tm_act *z, const tm_weight *w, float eps);
/* Split the rows of src, groups of a's then b's values (n_group groups each
 * way), into a and b: a[t][g] = src[t][g (na + nb) ..], b[t][g] likewise after it. */
tm_status exec_unzip(tm_exec *e, tm_act *src, int64_t n_group, tm_act *a, tm_act *b);
/* y = silu(g) * u. */
tm_status exec_swiglu(tm_exec *e, tm_act *y, tm_act *g, tm_act *u);
/* y *= sigmoid(g), value by value. */
tm_status exec_gate_mul(tm_exec *e, tm_act *y, tm_act *g);
/* y[t] *= sigmoid(s[t][0]), then x[t] += y[t] (a gated residual add; s has one
 * value a row). */
tm_status exec_gate_add(tm_exec *e, tm_act *x, tm_act *y, tm_act *s);
/* x += y, value by value (an unweighted residual add: GLM-4.5's shared expert). */
tm_status exec_add(tm_exec *e, tm_act *x, tm_act *y);

/* ---- element-wise ops (exec_ew.c): each runs where its input is (the GPU's kernels,
 * src/cuda/ew.cu, when it is on the GPU; else the CPU) ---- */

/* x *= s, value by value. */
tm_status exec_scale(tm_exec *e, tm_act *x, float s);
/* x = cap tanh(x / cap) for rows [0, n_rows) (a final logit soft-cap: Gemma's). */
tm_status exec_softcap(tm_exec *e, tm_act *x, int64_t n_rows, float cap);
/* Rows rows[0..n) of x to rows [0, n) (rows[i] >= i, increasing: a step's
 * rows picked for the output head), where x is. */
tm_status exec_rows_pick(tm_exec *e, tm_act *x, const int64_t *rows, int64_t n);
/* y = gelu_tanh(g) * u (cpu_geglu; y may be g or u). */
tm_status exec_geglu(tm_exec *e, tm_act *y, tm_act *g, tm_act *u);

/* The part of the architecture the next ops belong to (--profile). */
tm_status exec_part(tm_exec *e, tm_prof_part part);
/* Hand rows [0, n_rows) of a to the context's callback (nothing without one). */
tm_status exec_emit(tm_exec *e, const char *name, int layer, tm_act *a, int64_t n_rows);
/* Queue a's rows [0, n_rows) back to the host; valid there once exec_step returns. */
tm_status exec_fetch(tm_exec *e, tm_act *a, int64_t n_rows);
bool exec_emitting(const tm_exec *e);

/* ---- for the tier (src/tier): the lower half of the executor ---- */

tm_pool *exec_pool(tm_exec *e);
bool exec_precise(const tm_exec *e);
bool exec_profiling(const tm_exec *e);
bool exec_capturing(const tm_exec *e);
tm_cuda_device *exec_gpu(tm_exec *e); /* NULL without a GPU */
/* Make the executor's GPU the calling thread's current device (cuda_device_select; TM_OK
 * without a GPU): entries that may run on another thread than the one that made the
 * context (a step, the cache's updates) call it before they launch. */
tm_status exec_select(tm_exec *e);
/* GPUs the executor holds (1 with none), the one ops run on now, and making GPU g
 * the one ops run on (its device current, its stream after the other's work; the
 * tier's MoE step of a layer on g). */
int exec_gpu_count(const tm_exec *e);
/* GPU g's CUDA device number (-1: no such GPU). */
int exec_gpu_device(const tm_exec *e, int g);
int exec_gpu_index(const tm_exec *e);
tm_status exec_gpu_set(tm_exec *e, int g);
tm_cuda_stream exec_stream(tm_exec *e);
/* Without waiting: *idle = every GPU's stream has finished what was queued (a replayed
 * graph over several GPUs runs on the first's). A failed stream is an error. */
tm_status exec_streams_query(tm_exec *e, bool *idle);
tm_cuda_blas *exec_blas(tm_exec *e);
tm_dev exec_weight_home(const tm_exec *e, const tm_weight *w);
const void *exec_weight_dev(const tm_exec *e, const tm_weight *w); /* NULL: not on the GPU */
/* Device memory for the context's lifetime (its own allocation). */
tm_status exec_dev_alloc(tm_exec *e, size_t bytes, void **out);
/* Make rows [0, n_rows) of a valid on d (copy when they are not; to the host
 * this also waits for the stream, which a captured step cannot do). */
tm_status exec_act_to(tm_exec *e, tm_act *a, tm_dev d, int64_t n_rows);
/* a was just written on d (by work queued there): valid there only. */
void exec_act_wrote(tm_act *a, tm_dev d);
static inline bool exec_act_on(const tm_act *a, tm_dev d) {
    return (a->valid >> d) & 1u;
}
/* The step's number on the device (int32 pos, uint32 step number, then the
 * rows' positions and sequences) and on the host. */
const uint32_t *exec_step_seq_dev(const tm_exec *e);
uint32_t exec_step_seq(const tm_exec *e);
/* Host work that must run after the GPU work queued so far has been queued
 * (it may wait for that work's signal) and before the step ends: recorded into
 * a captured step (run after each launch), else run before the next task is
 * queued or the stream is waited for (so the GPU work queued after it is
 * already in flight while it runs), or at once when profiling. fn's status
 * fails the step. ud must outlive the context. */
typedef tm_status (*tm_exec_task_fn)(void *ud);
tm_status exec_host_task(tm_exec *e, tm_exec_task_fn fn, void *ud);
/* Run pending host tasks and wait for the stream. */
tm_status exec_sync(tm_exec *e);
/* fn(ud) runs after every step's final wait (the tier reads what the GPU
 * reported of its hand-offs); an error fails the step. One check. */
void exec_step_check(tm_exec *e, tm_exec_task_fn fn, void *ud);
/* Time (ns) the executor's parts took since the context was made. */
const uint64_t *exec_prof_ns(const tm_exec *e);
/* The activations copied into a GPU from another at span boundaries (exec_act_to's
 * peer copies) since the executor was made: counted on every step (a replayed
 * graph adds what its capture queued), timed only while profiling (events around
 * each copy on the receiving GPU's stream; profiling steps run eagerly). */
typedef struct tm_exec_peer_stats {
    uint64_t copies, bytes, ns;
} tm_exec_peer_stats;
/* GPU g's (0 .. exec_gpu_count - 1; zero for another g). */
tm_exec_peer_stats exec_peer_stats(const tm_exec *e, int g);
/* The steps and their rows since the executor was made. */
void exec_step_counts(const tm_exec *e, uint64_t *steps, uint64_t *rows);

#ifdef __cplusplus
}
#endif
#endif
