/* The executor's insides, shared by exec.c (setup, dispatch, steps),
 * exec_residency.c (where activations and ops live), exec_cpu.c and exec_gpu.c
 * (one op table each), exec_ssm.c and exec_ew.c. Private to src/exec. */
#ifndef TM_EXEC_EXEC_INTERNAL_H
#define TM_EXEC_EXEC_INTERNAL_H

#include "exec/exec.h"

/* A matrix as one side holds it: the mapped file on the CPU, a device copy on
 * the GPU; a stacked group is one matrix of all its rows. */
typedef struct exec_matrix {
    const void *data;
    tm_type type;
    size_t row_bytes;
    int64_t k, rows; /* rows of k values */
} exec_matrix;

/* Attention of one layer, with its gains resolved for the side that runs it. */
typedef struct exec_attn {
    const tm_attn_desc *d;
    const float *q_norm, *k_norm; /* NULL: none */
    const float *sinks;           /* NULL: none */
    void *k_cache, *v_cache;      /* the layer's, on that side */
    int64_t seq_rows;             /* rows of one sequence: sequence s's begin at s seq_rows */
    bool ring;                    /* position p at row p % seq_rows of its sequence's (else p) */
    const float *rope_freq;       /* the GPU's copy of d->rope_freq (the CPU reads d's) */
} exec_attn;

/* One side's ops on raw pointers (rows of the step; shapes as the public ops). */
typedef struct exec_ops {
    tm_status (*rmsnorm)(tm_exec *e, float *y, const float *x, const float *w, int64_t rows,
                         int64_t n, float eps);
    tm_status (*add_rmsnorm)(tm_exec *e, float *x, const float *a, float *h, const float *w,
                             int64_t rows, int64_t n, float eps);
    tm_status (*matmul)(tm_exec *e, const exec_matrix *m, const float *x, int64_t rows, float *y);
    tm_status (*matmul_n)(tm_exec *e, int n, const exec_matrix *ms, const float *x, int64_t rows,
                          float *const *ys);
    tm_status (*attention)(tm_exec *e, const exec_attn *a, float *q, float *k, const float *v,
                           float *out, int64_t rows);
    /* y[t] += b (NULL: the side has no such op yet) */
    tm_status (*add_bias)(tm_exec *e, float *y, const float *b, int64_t rows, int64_t n);
} exec_ops;

extern const exec_ops exec_cpu_ops, exec_gpu_ops;

typedef struct exec_group {
    int n;
    const tm_weight *ws[CPU_MATMUL_MAX];
    const void *stack; /* device: the n matrices back to back (NULL: not stacked) */
    float *out;        /* device: one row of all their outputs (decode) */
    int64_t rows;      /* rows of all n */
} exec_group;

/* One GPU's state: its device, stream and handles, its memory, and the copies
 * it holds (weights, the step's rows on the device, scratch). The executor has
 * one a GPU; the dispatcher sets e->cur to the GPU of the op's weight or layer
 * (exec_go) before the op bodies (exec_gpu.c) run, which read everything of their
 * GPU through e->cur (docs/executor.md, "Several GPUs"). */
typedef struct exec_gpu_state {
    tm_cuda_device *gpu; /* NULL: none */
    tm_cuda_stream stream;
    tm_cuda_blas *blas;
    tm_cuda_pool **pools;
    int n_pools, cap_pools;
    const void **wdev; /* [n_tensors]: device copy (NULL: none) */
    void *gpu_scratch; /* products on tensor cores */
    size_t gpu_scratch_bytes;
    float *gpu_attn;      /* attention scratch */
    float *gpu_heads;     /* [n_batch][heads_width]: a head's rows gathered, its product */
    void *gpu_q8x;        /* 8-bit activations of a decode product (cuda_q8x_quantize) */
    int32_t *step_dev;    /* [2 + 2 n_batch]: position, step number, rows' positions, sequences */
    float *rope_freq_dev; /* the device copy of rope_freq (GPU layers) */
    double upload_s, upload_bytes;
    tm_cuda_event done;       /* recorded when ops leave this GPU for another (spans) */
    tm_exec_peer_stats peer;  /* activations copied in from another GPU */
    tm_cuda_event peer_ev[2]; /* profiling: around each of those copies */
} exec_gpu_state;

typedef struct exec_task {
    tm_exec_task_fn fn;
    void *ud;
} exec_task;

/* A captured decode step and its host tasks. */
typedef struct exec_graph {
    tm_cuda_graph *g;
    exec_task *pre, *post; /* recorded: before / after the launch */
    int n_pre, n_post, cap_pre, cap_post;
    tm_exec_peer_stats peer[EXEC_MAX_GPUS]; /* the peer copies it holds (a replay's) */
} exec_graph;

struct tm_exec {
    tm_exec_params p;
    uint8_t *tensor_dev; /* [n_tensors] */
    uint32_t n_tensors;

    /* activations and groups, as the architecture declared them */
    tm_act **acts;
    int n_acts, cap_acts;
    exec_group *groups;
    int n_groups, cap_groups;

    /* attention */
    uint32_t n_layer;
    uint8_t *layer_dev;
    tm_attn_desc attn_shape; /* its rope_freq points at rope_freq (the executor's copy) */
    float *rope_freq;        /* [head_dim / 2] of a scaled RoPE, or NULL */
    /* [n_layer] with a shape a layer: the device copy of each GPU layer's RoPE table
     * (layer_shape[l].rope_freq; layers with one table share its copy), else NULL */
    float **layer_rope_dev;
    void **k_cache, **v_cache; /* [n_layer], on the layer's side */
    int64_t n_ctx_seq;         /* positions of one sequence: n_ctx / n_seq */
    int64_t *window;           /* [n_layer] sliding windows (0: full attention) */
    int64_t *kv_rows;          /* [n_layer] rows of one sequence (n_ctx_seq, or a ring's) */
    size_t *kv_bytes;          /* [n_layer] of the layer's K (or V) cache, every sequence's */
    bool kv_latent;            /* latent attention: K rows only (no V cache) */
    tm_attn_desc *layer_shape; /* [n_layer] a shape a layer (exec_attention_setup_layers), or
                                  NULL: attn_shape in every layer */
    int64_t heads_width;       /* the widest in + out of a GPU exec_matmul_heads weight */
    size_t heads_gemm_bytes;   /* the largest cuda_gemm_heads scratch of one of them */

    /* CPU side */
    void *cpu_act; /* quantized activations of a product */
    size_t cpu_act_bytes;
    float *cpu_attn;            /* attention scratch */
    float *rope_cos, *rope_sin; /* [n_batch][head_dim / 2] for the step's positions */
    uint32_t rope_seq;          /* the step whose positions the table holds (0: none) */
    tm_attn_desc rope_of;       /* the RoPE it is for (base, head, n_rot, rope_freq, mscale):
                                   layers of another recompute it */

    /* GPU side: the state of the GPU the ops run on (cur->gpu NULL: none) */
    exec_gpu_state gpus[EXEC_MAX_GPUS];
    int n_gpus;
    exec_gpu_state *cur;
    uint8_t *tensor_gpu;    /* [n_tensors] the GPU of a GPU tensor (an index of gpus) */
    uint8_t *layer_gpu;     /* [n_layer] the GPU of a GPU layer */
    bool gpu_attn_f32;      /* prompts' attention in f32 too (precise, or TIERMOE_ATTN_TC=0) */
    int64_t gpu_q8x_k;      /* the longest row gpu_q8x holds (0: products keep f32 activations) */
    bool gpu_q8x_q4k;       /* q4_K matrices take them too (TIERMOE_MMVQ_Q8X=q4_K) */
    bool gpu_q8x_q8_0_only; /* low-bit matrices keep f32 (TIERMOE_MMVQ_Q8X=q8_0) */
    int32_t *step_host;     /* pinned, copied to each GPU's step_dev by each step */

    /* the step */
    const int32_t *tokens;
    int64_t n_tok, pos;
    int32_t *row_pos, *row_seq; /* [n_batch]: each row's position and sequence */
    int64_t seq0;               /* row_seq[0] */
    int64_t pos_max;            /* the largest row_pos */
    bool one_seq;               /* the rows are one sequence's: seq0, positions pos.. */
    tm_moe_phase phase;
    uint32_t seq;
    bool capturing, capture_failed;
    tm_act *embed_x; /* a captured step's embedding: done by a task before each launch */
    const tm_weight *embed_w;

    /* host tasks: pending (eager) or recorded (captured) */
    exec_task pending;
    exec_graph *rec;       /* the graph being captured or replayed */
    tm_status task_status; /* the first failure of a task this step, and its message */
    char task_msg[512];
    exec_task check; /* after each step */

    /* the decode graphs, by row count */
    exec_graph graphs[TM_CUDA_MMVQ_MAX_TOK + 1];
    bool graph_off;

    /* linear attention (exec_ssm.c): per layer, every sequence's states back to back */
    bool *ssm_layer;                   /* [n_layer] (NULL: no linear attention) */
    uint8_t *ssm_dev;                  /* [n_layer] the side of the layer's states (tm_dev) */
    tm_ssm_desc ssm_shape;             /* its weights unset */
    int64_t ssm_channels;              /* C of the convolution */
    float **conv_state, **delta_state; /* [n_layer] [n_seq][conv_k - 1][C], [n_seq][n_v][dk][dv] */
    float **conv_ckpt, **delta_ckpt;   /* the same at each sequence's checkpoint */
    int64_t *ckpt_pos;                 /* [n_seq] the checkpoints' positions (-1: none) */
    float *ssm_gates;                  /* [2][n_batch][n_v]: g, then beta */
    float *ssm_scratch;                /* cpu_delta_rule's */

    /* profiling */
    tm_prof_part part;
    uint64_t part_t0;
    uint64_t prof_ns[TM_PROF_COUNT];
    uint64_t n_steps, n_rows; /* since the executor was made */
};

/* Grow *p (elements of size `size`) to hold n. */
tm_status exec_grow(void **p, int *cap, int n, size_t size);

/* exec_gpu.c: device memory and uploads at exec_finalize. */
tm_status exec_gpu_finalize(tm_exec *e);
void exec_gpu_free(tm_exec *e);
/* exec_cpu.c: scratch at exec_finalize. */
tm_status exec_cpu_finalize(tm_exec *e);
void exec_cpu_free(tm_exec *e);
/* The step's rows, as the GPU's attention reads them (exec.h: exec_step_rows). */
static inline const int32_t *exec_row_pos_dev(const tm_exec *e) {
    return e->cur->step_dev + 2;
}
static inline const int32_t *exec_row_seq_dev(const tm_exec *e) {
    return e->cur->step_dev + 2 + e->p.n_batch;
}
/* Whether the GPU's attention takes the rows one by one (rows of several
 * sequences, and every decode step, whose graph serves any sequence). */
static inline bool exec_rows_apart(const tm_exec *e) {
    return !e->one_seq || e->phase == TM_MOE_PHASE_DECODE;
}
/* a's values on side d. */
static inline void *exec_at(const tm_act *a, tm_dev d) {
    return d == TM_DEV_GPU ? a->dev : a->host;
}
/* A captured step cannot wait for the stream or run CPU ops: mark the
 * capture failed and unwind (exec_step reruns the step eagerly). */
tm_status exec_not_capturable(tm_exec *e, const char *what);
/* exec_residency.c: check that side d can run an op now. */
tm_status exec_side(tm_exec *e, tm_dev d);
/* Check side d as exec_side, and for the GPU make the one of weight w (or of
 * layer l) the one ops run on (exec_gpu_use). */
tm_status exec_go(tm_exec *e, tm_dev d, const tm_weight *w);
tm_status exec_go_layer(tm_exec *e, tm_dev d, uint32_t l);
/* Make GPU g the one ops run on: its device current, its stream waiting for
 * the work queued on the one before, the activations' buffers its own (those
 * valid on the other GPU keep their values there until exec_act_to copies
 * them across). */
tm_status exec_gpu_use(tm_exec *e, int g);
/* A vector weight (f32) on side d (NULL for NULL). */
const float *exec_vector(const tm_exec *e, const tm_weight *w, tm_dev d);
/* exec_ssm.c */
void exec_ssm_free(tm_exec *e);
/* exec_matmul_heads's work on each side (x, y: that side's rows). */
tm_status exec_cpu_matmul_heads(tm_exec *e, const tm_weight *w, const float *x, int64_t xn,
                                float *y, int64_t yn, int64_t n_pass);
tm_status exec_gpu_matmul_heads(tm_exec *e, const tm_weight *w, const float *x, int64_t xn,
                                float *y, int64_t yn, int64_t n_pass);
/* The matrix of weight w (or of a group) on side d. */
exec_matrix exec_matrix_of(const tm_exec *e, const tm_weight *w, tm_dev d);

#endif
