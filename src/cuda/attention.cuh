/* What the two attention kernels of src/cuda share (never C files): the
 * launch arguments, the key-range and softmax-end helpers, and the prompt
 * path on tensor cores (attention_tc.cu) that attention.cu's cuda_attention
 * hands a prompt to when tm_attn_tc_ok says it can. */
#ifndef TM_CUDA_ATTENTION_CUH
#define TM_CUDA_ATTENTION_CUH

#include <math.h>

#include "cuda/cuda_common.cuh"

#define TM_ATTN_SPLIT_TOK 8 /* n_tok up to this: split the keys (decode) */
#define TM_ATTN_LOG2E     1.4426950408889634f

/* Everything a launch fixes; passed by value (frozen in a captured graph). */
typedef struct tm_attn_args {
    const float *q;
    const void *k, *v;
    const int32_t *pos0;
    const int32_t *row_pos, *row_seq; /* rows of several sequences (NULL: one) */
    float *out, *rec;
    int32_t n_head, n_head_kv, group, d, dp, ds;
    int64_t n_tok, n_kv_max;
    int64_t seq_rows; /* rows of one sequence */
    int64_t ring;     /* 0, or seq_rows: position p at row p % ring of its sequence's */
    int32_t n_split, f16, vec;
    int32_t row_blocks; /* rows of several sequences: blocks of one token's heads */
    float scale;
    int64_t window;     /* 0: none */
    const float *sinks; /* [n_head] or NULL */
} tm_attn_args;

/* The first key a token at position p sees (0 without a window). */
static __device__ __forceinline__ int64_t tm_attn_first_key(const tm_attn_args &a, int64_t p) {
    if (!a.window) return 0;
    const int64_t lo = p + 1 - a.window;
    return lo > 0 ? lo : 0;
}

/* out = acc / l with the sink's exp in the denominator: the factor for acc.
 * log2: m is in base-2 units (scores times log2(e), as the tensor-core
 * kernel keeps them), so the sink is scaled alike and exp is exp2. */
static __device__ __forceinline__ float tm_attn_inv(const tm_attn_args &a, int64_t h, float m,
                                                    float l, bool log2 = false) {
    if (!a.sinks) return l > 0.f ? 1.f / l : 0.f;
    const float sk = log2 ? a.sinks[h] * TM_ATTN_LOG2E : a.sinks[h], mx = fmaxf(m, sk);
    const float f = m == -INFINITY ? 0.f : log2 ? exp2f(m - mx) : expf(m - mx);
    return f / (l * f + (log2 ? exp2f(sk - mx) : expf(sk - mx)));
}

/* Keys a batch of n_tok tokens from pos0 sees: pos0 + n_tok, kept within what
 * the launch was sized for (and a sequence's rows, unless they are a ring). */
static __device__ __forceinline__ int64_t tm_attn_n_kv(const tm_attn_args &a, int64_t pos0,
                                                       int64_t n_tok) {
    int64_t n = pos0 + n_tok;
    const int64_t cap = a.ring || a.n_kv_max < a.seq_rows ? a.n_kv_max : a.seq_rows;
    return n < 0 ? 0 : n > cap ? cap : n;
}

/* A ring's wrap point for a block whose keys start at k_lo: k_lo rounded down to
 * a multiple of the ring (one division a block; 0 without a ring). */
static __device__ __forceinline__ int64_t tm_attn_wrap(const tm_attn_args &a, int64_t k_lo) {
    return a.ring ? k_lo - k_lo % a.ring : 0;
}

/* The row (of its sequence's) of key position kp, for a block whose keys span at
 * most the ring from its wrap point's block start: kp, or kp % ring by one compare. */
static __device__ __forceinline__ int64_t tm_attn_row(const tm_attn_args &a, int64_t kp,
                                                      int64_t wrap) {
    if (!a.ring) return kp;
    const int64_t r = kp - wrap;
    return r < a.ring ? r : r - a.ring;
}

/* Whether the tensor-core prompt kernel takes this launch: a prompt
 * (n_tok > TM_ATTN_SPLIT_TOK) of one sequence, an f16 cache with 16-byte
 * aligned bases, head_dim 64 or 128, q 8-byte aligned, not precise. */
bool tm_attn_tc_ok(const tm_attn_args &a, bool precise);
/* Launch it (grid, shared memory); the caller checks the launch. */
tm_status tm_attn_tc_launch(const tm_attn_args &a, tm_cuda_stream stream);

#endif
