/* The argument contract of the CUDA op launchers (cuda.h), written once for
 * the implementations of it: the kernels' launchers (src/cuda/<op>.cu), the
 * host mock the CI runs (tests/mock/) and the emulator's (tests/emu/). Plain
 * C without a CUDA header (attention's checks are in attention_check.h). Each
 * check fails with TM_ERR_ARG naming the op and the argument, and what was
 * expected (TM_ERR_UNSUPPORTED for a weight type without a kernel). A launcher
 * makes its check before anything else, its early return for empty work
 * included, so a bad argument fails whether or not there is work. */
#ifndef TM_CUDA_CUDA_ARGS_H
#define TM_CUDA_CUDA_ARGS_H

#include "cuda/cuda.h"

#define TM_CUDA_INT_MAX 0x7fffffffLL /* a grid dimension's or a kernel's int */
/* Warps (rows) per block of cuda_moe_grouped's generic kernels: with at most
 * 65535 blocks in y, n_ff and n_embd are bounded by 65535 of these. */
#define TM_MOE_WARPS 4

/* The rows' block size of a weight type the kernels read (mmvq.cuh,
 * dequant.cu), and in *esz the alignment its rows need; 0: no kernel. */
static inline int64_t cuda_weight_block(tm_type type, size_t *esz) {
    *esz = 1;
    switch (type) {
    case TM_TYPE_F32:
        *esz = 4;
        return 1;
    case TM_TYPE_F16:
    case TM_TYPE_BF16:
        *esz = 2;
        return 1;
    case TM_TYPE_Q4_K:
    case TM_TYPE_Q5_K:
    case TM_TYPE_Q6_K:
    /* the low-bit types of dequant_lowbit.cuh */
    case TM_TYPE_Q2_K:
    case TM_TYPE_Q3_K:
    case TM_TYPE_IQ4_XS:
    case TM_TYPE_IQ2_XXS:
    case TM_TYPE_IQ2_XS:
    case TM_TYPE_IQ2_S:
    case TM_TYPE_IQ3_XXS:
    case TM_TYPE_IQ3_S:
    case TM_TYPE_IQ1_S:
    case TM_TYPE_IQ1_M:
    case TM_TYPE_TQ1_0:
    case TM_TYPE_TQ2_0:
        return 256;
    case TM_TYPE_Q8_0:
    case TM_TYPE_Q4_0:
    case TM_TYPE_MXFP4:
    case TM_TYPE_Q4_1:
    case TM_TYPE_Q5_0:
    case TM_TYPE_Q5_1:
    case TM_TYPE_IQ4_NL:
        return 32;
    default:
        return 0;
    }
}

/* Rows of `type` at w, row_bytes apart, of k values each. */
static inline tm_status cuda_weights_check(const char *op, tm_type type, const void *w,
                                           size_t row_bytes, int64_t k) {
    size_t esz;
    const int64_t bs = cuda_weight_block(type, &esz);
    if (!bs)
        return tm_error_set(TM_ERR_UNSUPPORTED, "%s: weight type %s has no CUDA kernel", op,
                            quant_type_name(type));
    if (k <= 0 || k % bs || k > TM_CUDA_INT_MAX)
        return tm_error_set(TM_ERR_ARG,
                            "%s: k = %lld is not a positive multiple of %s's block of %lld "
                            "below 2^31",
                            op, (long long)k, quant_type_name(type), (long long)bs);
    if (row_bytes < quant_row_size(type, k))
        return tm_error_set(TM_ERR_ARG, "%s: row stride %zu bytes < %zu bytes of a %s row of %lld",
                            op, row_bytes, quant_row_size(type, k), quant_type_name(type),
                            (long long)k);
    if (((uintptr_t)w | row_bytes) % esz)
        return tm_error_set(TM_ERR_ARG, "%s: %s rows (address and stride) must be %zu-byte aligned",
                            op, quant_type_name(type), esz);
    return TM_OK;
}

/* Weights as above, read against activations x the kernels load as float4. */
static inline tm_status cuda_matvec_check(const char *op, tm_type type, const void *w,
                                          size_t row_bytes, int64_t k, const float *x) {
    tm_status st = cuda_weights_check(op, type, w, row_bytes, k);
    if (st != TM_OK) return st;
    if ((uintptr_t)x & 15)
        return tm_error_set(TM_ERR_ARG, "%s: activations x must be 16-byte aligned", op);
    return TM_OK;
}

/* ---- mmvq.cu, mmvq_q8x.cu ---- */

/* A decode product's shape: 1..2^31-1 rows, 1..TM_CUDA_MMVQ_MAX_TOK tokens. */
static inline tm_status cuda_decode_shape_check(const char *op, int64_t rows, int64_t n_tok) {
    if (rows <= 0 || rows > TM_CUDA_INT_MAX || n_tok < 1 || n_tok > TM_CUDA_MMVQ_MAX_TOK)
        return tm_error_set(TM_ERR_ARG,
                            "%s: rows %lld, n_tok %lld (want 1..2^31-1 rows, 1..%d tokens)", op,
                            (long long)rows, (long long)n_tok, TM_CUDA_MMVQ_MAX_TOK);
    return TM_OK;
}

static inline tm_status cuda_mmvq_args_check(tm_type type, const void *w, size_t row_bytes,
                                             int64_t rows, int64_t k, const float *x,
                                             int64_t n_tok) {
    tm_status st = cuda_decode_shape_check("cuda_mmvq", rows, n_tok);
    if (st != TM_OK) return st;
    return cuda_matvec_check("cuda_mmvq", type, w, row_bytes, k, x);
}

static inline tm_status cuda_q8x_quantize_args_check(const float *x, int64_t k, int64_t n_tok,
                                                     const void *xq) {
    if (k <= 0 || k % 32 || n_tok < 1 || n_tok > TM_CUDA_MMVQ_MAX_TOK || !x || !xq ||
        ((uintptr_t)xq & 15))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_q8x_quantize: k %lld (want a positive multiple of 32), n_tok "
                            "%lld (want 1..%d), x %p, output xq %p (want 16-byte aligned)",
                            (long long)k, (long long)n_tok, TM_CUDA_MMVQ_MAX_TOK, (const void *)x,
                            xq);
    return TM_OK;
}

static inline tm_status cuda_mmvq_q8x_args_check(tm_type type, const void *w, size_t row_bytes,
                                                 int64_t rows, int64_t k, const void *xq,
                                                 int64_t n_tok) {
    tm_status st = cuda_decode_shape_check("cuda_mmvq_q8x", rows, n_tok);
    if (st != TM_OK) return st;
    if (!cuda_mmvq_q8x_ok(type, (uintptr_t)w | row_bytes, k) || ((uintptr_t)xq & 15) ||
        row_bytes < quant_row_size(type, k))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_mmvq_q8x: %s weights, k %lld, row stride %zu (want q8_0 with k "
                            "a multiple of 64 and rows 4-byte aligned, q4_K with k a multiple "
                            "of 256 and rows 16-byte aligned, or a low-bit type of "
                            "TM_CUDA_LBX_TYPES with whole blocks and rows aligned to 4 bytes "
                            "(2 where its block size is not a multiple of 4); rows no shorter "
                            "than the type's; activations xq 16-byte aligned)",
                            quant_type_name(type), (long long)k, row_bytes);
    return TM_OK;
}

/* ---- gemm.cu, dequant.cu ---- */

static inline tm_status cuda_gemm_args_check(const tm_cuda_blas *b, tm_type type, const void *w,
                                             size_t row_bytes, int64_t rows, int64_t k,
                                             const float *x, int64_t n_tok, const float *y,
                                             const void *scratch) {
    if (!b || rows <= 0 || n_tok <= 0 || rows > TM_CUDA_INT_MAX || n_tok > TM_CUDA_INT_MAX)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_gemm: rows %lld, n_tok %lld (want 1..2^31-1 each), handle %p",
                            (long long)rows, (long long)n_tok, (const void *)b);
    tm_status st = cuda_weights_check("cuda_gemm", type, w, row_bytes, k);
    if (st != TM_OK) return st;
    if (((uintptr_t)x & 3) || ((uintptr_t)y & 3) || ((uintptr_t)scratch & 15))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_gemm: x and y must be float-aligned, scratch 16-byte aligned");
    return TM_OK;
}

/* cuda_gemm_heads's shapes: each head's x and y spans inside its row, heads apart. */
static inline tm_status cuda_gemm_heads_args_check(const tm_cuda_blas *b, tm_type type,
                                                   const void *w, size_t row_bytes, int64_t in,
                                                   int64_t out, int64_t n_head, const float *x,
                                                   int64_t ldx, int64_t hx, int64_t n_tok,
                                                   const float *y, int64_t ldy, int64_t hy,
                                                   const void *scratch) {
    if (!b || in < 1 || out < 1 || n_head < 1 || n_tok < 1 || hx < in || hy < out ||
        ldx < (n_head - 1) * hx + in || ldy < (n_head - 1) * hy + out || !x || !y ||
        n_head * out > TM_CUDA_INT_MAX || n_tok > TM_CUDA_INT_MAX || ldx > TM_CUDA_INT_MAX ||
        ldy > TM_CUDA_INT_MAX)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_gemm_heads: %lld heads of [%lld -> %lld], %lld tokens, x rows "
                            "%lld apart (heads %lld), y rows %lld apart (heads %lld) (want each "
                            "head's span inside its row, sizes within cuBLAS's int), handle %p",
                            (long long)n_head, (long long)in, (long long)out, (long long)n_tok,
                            (long long)ldx, (long long)hx, (long long)ldy, (long long)hy,
                            (const void *)b);
    tm_status st = cuda_weights_check("cuda_gemm_heads", type, w, row_bytes, in);
    if (st != TM_OK) return st;
    if (((uintptr_t)x & 3) || ((uintptr_t)y & 3) || ((uintptr_t)scratch & 15) ||
        (type != TM_TYPE_F32 && !scratch))
        return tm_error_set(TM_ERR_ARG, "cuda_gemm_heads: x and y must be float-aligned, "
                                        "scratch given and 16-byte aligned");
    return TM_OK;
}

static inline tm_status cuda_dequantize_f16_args_check(tm_type type, const void *w,
                                                       size_t row_bytes, int64_t rows, int64_t k,
                                                       const void *out_f16) {
    if (rows <= 0 || rows > TM_CUDA_INT_MAX)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_dequantize_f16: rows %lld x k %lld (want 1..2^31-1 rows)",
                            (long long)rows, (long long)k);
    tm_status st = cuda_weights_check("cuda_dequantize_f16", type, w, row_bytes, k);
    if (st != TM_OK) return st;
    if ((uintptr_t)out_f16 & 1)
        return tm_error_set(TM_ERR_ARG, "cuda_dequantize_f16: output must be 2-byte aligned");
    return TM_OK;
}

/* ---- the experts: moe_grouped.cu, moe_gemm.cu, moe_fetch.cu ---- */

static inline tm_status cuda_moe_ext_check(const char *op, const tm_cuda_moe_ext *x) {
    if (x->act != TM_CUDA_MOE_SWIGLU && x->act != TM_CUDA_MOE_SWIGLU_OAI &&
        x->act != TM_CUDA_MOE_GEGLU)
        return tm_error_set(TM_ERR_ARG, "%s: unknown expert activation ext.act %d", op,
                            (int)x->act);
    if ((x->gate_bias || x->up_bias || x->down_bias) && x->n_expert <= 0)
        return tm_error_set(TM_ERR_ARG, "%s: expert biases for ext.n_expert %d experts", op,
                            x->n_expert);
    return TM_OK;
}

/* Experts of `rows` rows of k each, expert_stride apart (x: the activations
 * the decode kernels read, NULL: not read that way). */
static inline tm_status cuda_moe_matrix_check(const char *name, const tm_cuda_moe_matrix *m,
                                              int64_t rows, int64_t k, const float *x) {
    tm_status st = x ? cuda_matvec_check(name, m->type, m->data, m->row_bytes, k, x)
                     : cuda_weights_check(name, m->type, m->data, m->row_bytes, k);
    if (st != TM_OK) return st;
    if (m->expert_stride < (size_t)rows * m->row_bytes)
        return tm_error_set(TM_ERR_ARG, "%s: expert stride %zu < %lld rows x %zu bytes", name,
                            m->expert_stride, (long long)rows, m->row_bytes);
    return TM_OK;
}

static inline tm_status cuda_moe_grouped_args_check(const tm_cuda_moe_params *p, int64_t n_items,
                                                    const float *x, int64_t n_tok,
                                                    const float *h_scratch) {
    static const char op[] = "cuda_moe_grouped";
    if (!p || n_items < 0 || n_items > TM_CUDA_INT_MAX || p->n_embd <= 0 || p->n_ff <= 0 ||
        n_tok <= 0 || n_tok > TM_CUDA_INT_MAX || p->n_slots <= 0)
        return tm_error_set(TM_ERR_ARG,
                            "%s: %lld items, n_embd %lld, n_ff %lld, n_tok %lld, %d slots (want "
                            "0..2^31-1 items, the rest positive)",
                            op, (long long)n_items, p ? (long long)p->n_embd : -1LL,
                            p ? (long long)p->n_ff : -1LL, (long long)n_tok, p ? p->n_slots : -1);
    if ((p->n_ff + TM_MOE_WARPS - 1) / TM_MOE_WARPS > 65535 ||
        (p->n_embd + TM_MOE_WARPS - 1) / TM_MOE_WARPS > 65535)
        return tm_error_set(TM_ERR_ARG, "%s: n_embd %lld / n_ff %lld too large for the grid", op,
                            (long long)p->n_embd, (long long)p->n_ff);
    tm_status st = cuda_moe_ext_check(op, &p->ext);
    if (st != TM_OK) return st;
    if ((st = cuda_moe_matrix_check("cuda_moe_grouped gate", &p->gate, p->n_ff, p->n_embd, x)) ||
        (st = cuda_moe_matrix_check("cuda_moe_grouped up", &p->up, p->n_ff, p->n_embd, x)) ||
        (st = cuda_moe_matrix_check("cuda_moe_grouped down", &p->down, p->n_embd, p->n_ff,
                                    h_scratch)))
        return st;
    /* the kernels read activations as float4: rows of x and h must stay aligned */
    if ((p->n_embd & 3) || (p->n_ff & 3))
        return tm_error_set(TM_ERR_ARG, "%s: n_embd %lld and n_ff %lld must be multiples of 4", op,
                            (long long)p->n_embd, (long long)p->n_ff);
    return TM_OK;
}

static inline tm_status cuda_moe_grouped_gemm_args_check(const tm_cuda_blas *b,
                                                         const tm_cuda_moe_params *p,
                                                         const tm_cuda_moe_groups *g,
                                                         const float *x, int64_t n_tok,
                                                         const float *y, const void *scratch) {
    static const char op[] = "cuda_moe_grouped_gemm";
    if (!b || !p || !g || g->n_groups < 0 || p->n_embd <= 0 || p->n_ff <= 0 || n_tok <= 0 ||
        n_tok > TM_CUDA_INT_MAX || p->n_slots <= 0 || p->n_embd > TM_CUDA_INT_MAX ||
        p->n_ff > 0x3fffffffLL)
        return tm_error_set(TM_ERR_ARG,
                            "%s: %d groups, n_embd %lld, n_ff %lld (want <= 2^30 - 1), n_tok "
                            "%lld, %d slots, handle %p",
                            op, g ? g->n_groups : -1, p ? (long long)p->n_embd : -1LL,
                            p ? (long long)p->n_ff : -1LL, (long long)n_tok, p ? p->n_slots : -1,
                            (const void *)b);
    tm_status st = cuda_moe_ext_check(op, &p->ext);
    if (st != TM_OK) return st;
    const tm_cuda_moe_matrix *m[3] = {&p->gate, &p->up, &p->down};
    static const char *const names[3] = {"cuda_moe_grouped_gemm gate", "cuda_moe_grouped_gemm up",
                                         "cuda_moe_grouped_gemm down"};
    for (int i = 0; i < 3; i++) {
        const int64_t rows = i < 2 ? p->n_ff : p->n_embd, k = i < 2 ? p->n_embd : p->n_ff;
        if ((st = cuda_moe_matrix_check(names[i], m[i], rows, k, NULL)) != TM_OK) return st;
        /* every expert's start aligned like the first */
        if ((st = cuda_weights_check(names[i], m[i]->type,
                                     (const char *)m[i]->data + m[i]->expert_stride,
                                     m[i]->row_bytes, k)) != TM_OK)
            return st;
    }
    if (((uintptr_t)x & 3) || ((uintptr_t)y & 3) || ((uintptr_t)scratch & 255))
        return tm_error_set(TM_ERR_ARG, "%s: x, y must be float-aligned, scratch 256-aligned", op);
    const int32_t n = g->n_groups;
    if (n > 0 && (!g->starts || !g->slots))
        return tm_error_set(TM_ERR_ARG, "%s: %d groups without starts or slots", op, n);
    if (n > 0 && (g->starts[0] < 0 || g->starts[n] > TM_CUDA_INT_MAX))
        return tm_error_set(TM_ERR_ARG, "%s: item range [%lld, %lld) outside [0, 2^31)", op,
                            (long long)g->starts[0], (long long)g->starts[n]);
    for (int32_t i = 0; i < n; i++)
        if (g->starts[i + 1] < g->starts[i])
            return tm_error_set(TM_ERR_ARG, "%s: group %d: starts %lld > next start %lld", op, i,
                                (long long)g->starts[i], (long long)g->starts[i + 1]);
    return TM_OK;
}

static inline tm_status cuda_moe_fetch_ahead_args_check(
    const tm_cuda_moe_params *src, const tm_cuda_moe_params *dst, int64_t n_items, int32_t n_expert,
    int32_t n_slots, const int32_t *map, const int32_t *list, const tm_cuda_fetch_cache *cache) {
    static const char op[] = "cuda_moe_fetch_ahead";
    if (n_expert < 1 || n_expert > TM_CUDA_ROUTER_MAX_EXPERT || n_slots < 1 ||
        n_slots > TM_CUDA_FETCH_AHEAD_MAX || n_items < 0 || n_items > TM_CUDA_INT_MAX || !list)
        return tm_error_set(TM_ERR_ARG,
                            "%s: %d experts, %d slots, %lld items, list %p (want 1..%d experts, "
                            "1..%d slots, a list)",
                            op, n_expert, n_slots, (long long)n_items, (const void *)list,
                            TM_CUDA_ROUTER_MAX_EXPERT, TM_CUDA_FETCH_AHEAD_MAX);
    if (cache ? cache->n_slots < 1 || cache->n_slots > TM_CUDA_ROUTER_MAX_EXPERT ||
                    !cache->slot_map || !cache->expert_in || !cache->last_use || !cache->seq
              : !map)
        return tm_error_set(TM_ERR_ARG, "%s: %s", op,
                            cache ? "a cache of 1..512 slots with its slot_map, expert_in, "
                                    "last_use and seq"
                                  : "a buffer needs its map");
    const tm_cuda_moe_matrix *s[3] = {&src->gate, &src->up, &src->down};
    const tm_cuda_moe_matrix *d[3] = {&dst->gate, &dst->up, &dst->down};
    const int64_t rows[3] = {src->n_ff, src->n_ff, src->n_embd};
    for (int m = 0; m < 3; m++) {
        const size_t bytes = (size_t)rows[m] * s[m]->row_bytes;
        if (((uintptr_t)s[m]->data | (uintptr_t)d[m]->data | s[m]->expert_stride |
             d[m]->expert_stride | bytes) &
                15 ||
            s[m]->type != d[m]->type || s[m]->row_bytes != d[m]->row_bytes ||
            bytes > d[m]->expert_stride)
            return tm_error_set(TM_ERR_ARG,
                                "%s: matrix %d (gate, up, down): addresses, strides and sizes "
                                "must be multiples of 16 bytes and the types and rows alike",
                                op, m);
    }
    return TM_OK;
}

/* ---- router.cu ---- */

static inline tm_status cuda_router_select_args_check(const tm_cuda_router_params *p,
                                                      int64_t n_tok) {
    static const char op[] = "cuda_router_select";
    if (!p || p->n_expert < 1 || p->n_expert > TM_CUDA_ROUTER_MAX_EXPERT || p->n_used < 1 ||
        p->n_used > TM_CUDA_ROUTER_MAX_USED || p->n_used > p->n_expert)
        return tm_error_set(TM_ERR_ARG, "%s: %d experts, %d used (want 1..%d experts, 1..%d used)",
                            op, p ? p->n_expert : -1, p ? p->n_used : -1, TM_CUDA_ROUTER_MAX_EXPERT,
                            TM_CUDA_ROUTER_MAX_USED);
    if (p->gating != TM_CUDA_GATING_SOFTMAX && p->gating != TM_CUDA_GATING_SIGMOID &&
        p->gating != TM_CUDA_GATING_SOFTMAX_TOPK)
        return tm_error_set(TM_ERR_ARG, "%s: unknown gating %d", op, (int)p->gating);
    if (p->n_group > 1 &&
        (p->n_group > TM_CUDA_ROUTER_MAX_GROUP || p->n_expert % p->n_group ||
         p->n_expert / p->n_group < 2 || p->n_group_used < 1 || p->n_group_used > p->n_group ||
         p->n_used > p->n_group_used * (p->n_expert / p->n_group)))
        return tm_error_set(TM_ERR_ARG,
                            "%s: %d experts in %d groups, %d groups used, %d experts used (want "
                            "at most %d equal groups of 2 or more, 1..groups used, room for "
                            "the experts used)",
                            op, p->n_expert, p->n_group, p->n_group_used, p->n_used,
                            TM_CUDA_ROUTER_MAX_GROUP);
    if (p->mapped &&
        (!p->slot_map || p->n_mapped < 0 || p->mapped_share_q8 < 0 || p->mapped_share_q8 > 256))
        return tm_error_set(TM_ERR_ARG,
                            "%s: a mapped work list needs a slot_map, n_mapped >= 0 and "
                            "mapped_share_q8 in [0, 256] (got %d, %d)",
                            op, p->n_mapped, p->mapped_share_q8);
    if (p->fetched && !p->fetch_map)
        return tm_error_set(TM_ERR_ARG, "%s: a fetched work list needs a fetch_map", op);
    if (n_tok < 0 || n_tok > TM_CUDA_INT_MAX)
        return tm_error_set(TM_ERR_ARG, "%s: n_tok %lld (want 0..2^31-1)", op, (long long)n_tok);
    return TM_OK;
}

/* ---- norm_rope.cu ---- */

/* cuda_rmsnorm and cuda_add_rmsnorm (op): a block a row. */
static inline tm_status cuda_rmsnorm_args_check(const char *op, int64_t n_rows, int64_t n) {
    if (n_rows <= 0 || n <= 0 || n_rows > TM_CUDA_INT_MAX || n > TM_CUDA_INT_MAX)
        return tm_error_set(TM_ERR_ARG, "%s: n_rows %lld of n %lld (want 1..2^31-1 each)", op,
                            (long long)n_rows, (long long)n);
    return TM_OK;
}

static inline tm_status cuda_rope_neox_args_check(int64_t n_tok, int64_t n_head, int64_t head_dim) {
    if (n_tok <= 0 || n_head <= 0 || head_dim <= 0 || (head_dim & 1))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_rope_neox: %lld tokens, %lld heads of head_dim %lld (want "
                            "positive counts, head_dim even)",
                            (long long)n_tok, (long long)n_head, (long long)head_dim);
    return TM_OK;
}

static inline tm_status cuda_add_args_check(int64_t n) {
    if (n < 0) return tm_error_set(TM_ERR_ARG, "cuda_add: n = %lld (want >= 0)", (long long)n);
    return TM_OK;
}

static inline tm_status cuda_add_bias_args_check(int64_t n_rows, int64_t n) {
    if (n_rows < 0 || n <= 0)
        return tm_error_set(TM_ERR_ARG, "cuda_add_bias: n_rows %lld of n %lld (want n >= 1)",
                            (long long)n_rows, (long long)n);
    return TM_OK;
}

/* ---- ssm.cu ---- */

static inline tm_status cuda_ssm_rows_check(const char *op, const tm_cuda_ssm_rows *r) {
    if (!r || r->n_tok < 0 || r->n_tok > TM_CUDA_INT_MAX || r->n_seq < 1 ||
        (r->n_tok > 0 && (!r->row_pos || !r->row_seq)))
        return tm_error_set(TM_ERR_ARG,
                            "%s: rows %p of n_tok %lld, n_seq %d (want 0..2^31-1 rows with their "
                            "row_pos and row_seq, n_seq >= 1)",
                            op, (const void *)r, r ? (long long)r->n_tok : -1LL, r ? r->n_seq : -1);
    return TM_OK;
}

/* A block of 128 channels in grid y: C below 65535 * 128. */
static inline tm_status cuda_ssm_conv_args_check(const tm_cuda_ssm_rows *r, const float *x,
                                                 int64_t C, int32_t K, const float *w,
                                                 const float *state) {
    tm_status st = cuda_ssm_rows_check("cuda_ssm_conv", r);
    if (st != TM_OK) return st;
    if (C < 1 || C > 65535LL * 128 || K < 2 || K > TM_CUDA_SSM_MAX_CONV || !x || !w || !state)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_ssm_conv: C %lld channels, conv width K %d, x %p, w %p, state "
                            "%p (want 1..%lld channels, K 2..%d, the pointers)",
                            (long long)C, K, (const void *)x, (const void *)w, (const void *)state,
                            65535LL * 128, TM_CUDA_SSM_MAX_CONV);
    return TM_OK;
}

static inline tm_status cuda_delta_rule_args_check(const tm_cuda_delta_params *p,
                                                   const tm_cuda_ssm_rows *r, const float *qkv,
                                                   const float *b, const float *a,
                                                   const float *state, const float *out) {
    static const char op[] = "cuda_delta_rule";
    tm_status st = cuda_ssm_rows_check(op, r);
    if (st != TM_OK) return st;
    if (!p || p->n_k_head < 1 || p->n_v_head < 1 || p->n_v_head % p->n_k_head ||
        p->n_v_head > 65535 ||
        (p->k_dim != 16 && p->k_dim != 32 && p->k_dim != 64 && p->k_dim != 128 &&
         p->k_dim != 256) ||
        p->v_dim < 1 || p->v_dim > TM_CUDA_DELTA_MAX_V)
        return tm_error_set(TM_ERR_ARG,
                            "%s: %d key heads, %d value heads, k_dim %d, v_dim %d (want value "
                            "heads a multiple of the key heads, at most 65535; k_dim 16, 32, 64, "
                            "128 or 256; v_dim 1..%d)",
                            op, p ? p->n_k_head : -1, p ? p->n_v_head : -1, p ? p->k_dim : -1,
                            p ? p->v_dim : -1, TM_CUDA_DELTA_MAX_V);
    if (!qkv || !b || !state || !out || !p->A || !p->dt_bias || (p->ba_grouped ? a && a != b : !a))
        return tm_error_set(TM_ERR_ARG,
                            "%s: a NULL qkv/b/state/out/A/dt_bias, or a %s (ba_grouped %d: a "
                            "must be %s)",
                            op, p->ba_grouped ? "separate a" : "missing a", (int)p->ba_grouped,
                            p->ba_grouped ? "NULL or b" : "given");
    return TM_OK;
}

static inline tm_status cuda_rmsnorm_gated_args_check(const float *x, const float *z,
                                                      const float *w, int64_t n_rows,
                                                      int64_t n_per_row, int64_t n) {
    if (n_rows < 0 || n < 1 || n_per_row < n || n_per_row % n || n_rows > TM_CUDA_INT_MAX ||
        n_per_row > TM_CUDA_INT_MAX || !x || !z || !w)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_rmsnorm_gated: %lld rows of %lld in groups of n %lld (want "
                            "rows >= 0, n >= 1 dividing the row, x, z and w given)",
                            (long long)n_rows, (long long)n_per_row, (long long)n);
    return TM_OK;
}

static inline tm_status cuda_unzip_args_check(const float *src, const float *a, const float *b,
                                              int64_t n_tok, int64_t n_group, int64_t na,
                                              int64_t nb) {
    if (n_tok < 0 || n_group < 1 || na < 0 || nb < 0 || na + nb < 1 ||
        n_group * (na + nb) > TM_CUDA_INT_MAX || !src || !a || !b)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_unzip: %lld rows of %lld groups of %lld + %lld values (want "
                            "n_tok >= 0, groups >= 1, na, nb >= 0, not both 0, and the pointers)",
                            (long long)n_tok, (long long)n_group, (long long)na, (long long)nb);
    return TM_OK;
}

/* cuda_swiglu and cuda_gate_mul (op): n values. */
static inline tm_status cuda_gate_args_check(const char *op, int64_t n) {
    if (n < 0) return tm_error_set(TM_ERR_ARG, "%s: n = %lld (want >= 0)", op, (long long)n);
    return TM_OK;
}

/* cuda_scale, cuda_softcap (cap > 0) and cuda_geglu (op): n values. */
static inline tm_status cuda_ew_args_check(const char *op, int64_t n, float cap) {
    if (n < 0 || !(cap > 0.0f))
        return tm_error_set(TM_ERR_ARG, "%s: n = %lld, cap %g (want n >= 0, cap > 0)", op,
                            (long long)n, (double)cap);
    return TM_OK;
}

static inline tm_status cuda_gate_add_args_check(int64_t n_rows, int64_t n) {
    if (n_rows < 0 || n < 1)
        return tm_error_set(TM_ERR_ARG, "cuda_gate_add: n_rows %lld of n %lld (want n >= 1)",
                            (long long)n_rows, (long long)n);
    return TM_OK;
}

/* ---- handoff.cu ---- */

static inline tm_status cuda_signal_host_args_check(const tm_cuda_span *spans, int n_spans) {
    if (n_spans < 0 || n_spans > TM_CUDA_SIGNAL_SPANS || (n_spans > 0 && !spans))
        return tm_error_set(TM_ERR_ARG, "cuda_signal_host: n_spans %d (want 0..%d spans)", n_spans,
                            TM_CUDA_SIGNAL_SPANS);
    for (int s = 0; s < n_spans; s++)
        if (spans[s].bytes < 0 || spans[s].bytes % 4 || ((uintptr_t)spans[s].dst & 3) ||
            ((uintptr_t)spans[s].src & 3))
            return tm_error_set(TM_ERR_ARG,
                                "cuda_signal_host: span %d of %lld bytes is not whole aligned "
                                "32-bit words",
                                s, (long long)spans[s].bytes);
    return TM_OK;
}

static inline tm_status cuda_wait_host_args_check(const int32_t *need, int32_t n_need,
                                                  const float *x, const float *add, int64_t n) {
    if (n < 0 || (n > 0 && (!x || !add)) || n_need < 0 || (n_need > 0 && !need))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_wait_host: n %lld values to add (x %p, add %p), n_need %d "
                            "(need %p)",
                            (long long)n, (const void *)x, (const void *)add, n_need,
                            (const void *)need);
    return TM_OK;
}

#endif
