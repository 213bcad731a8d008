/* The argument contract of the attention launchers (cuda.h: cuda_attn_prepare,
 * cuda_attention), written once for the two implementations of it: the
 * kernels' launchers (attention.cu) and the host mock (tests/mock/). Plain C
 * without a CUDA header. Each check fails with TM_ERR_ARG naming op and what
 * was expected. */
#ifndef TM_CUDA_ATTENTION_CHECK_H
#define TM_CUDA_ATTENTION_CHECK_H

#include "cuda/cuda.h"

#define TM_CUDA_ATTN_MAX_DIM 512 /* head_dim limit: 16 dims per lane of a warp */

/* The shape both ops take: heads, cache rows and type, a launch's tokens, and
 * a ring's room for the keys the launch's rows see. */
static inline tm_status cuda_attn_shape_check(const char *op, const tm_cuda_attn_params *p,
                                              int64_t n_tok) {
    if (!p) return tm_error_set(TM_ERR_ARG, "%s: no params", op);
    if (p->n_head < 1 || p->n_head_kv < 1 || p->n_head % p->n_head_kv ||
        p->n_head + 2 * (int64_t)p->n_head_kv > 65535 || p->head_dim < 2 ||
        p->head_dim > TM_CUDA_ATTN_MAX_DIM || (p->head_dim & 1) || p->n_ctx < 1 ||
        p->n_ctx > 0x7fffffffLL || (p->kv_type != TM_TYPE_F16 && p->kv_type != TM_TYPE_F32) ||
        n_tok < 0 || n_tok > 0x7fffffffLL || p->latent)
        return tm_error_set(
            TM_ERR_ARG,
            "%s: %d heads / %d kv heads of %d, n_ctx %lld, kv type %d, n_tok %lld%s "
            "(want n_head %% n_head_kv == 0, head_dim even <= %d, kv f16 or f32)",
            op, p->n_head, p->n_head_kv, p->head_dim, (long long)p->n_ctx, (int)p->kv_type,
            (long long)n_tok, p->latent ? ", latent (cuda_mla_*)" : "", TM_CUDA_ATTN_MAX_DIM);
    const int64_t seq_rows = p->seq_rows ? p->seq_rows : p->n_ctx;
    if (p->seq_rows < 0 || p->seq_rows > p->n_ctx ||
        (p->ring && (p->window < 1 || p->window + (n_tok > 1 ? n_tok : 1) - 1 > seq_rows)))
        return tm_error_set(TM_ERR_ARG,
                            "%s: %lld rows a sequence of %lld, ring %d, window %lld, n_tok %lld "
                            "(want seq_rows <= n_ctx; a ring needs a window and window + n_tok - "
                            "1 <= seq_rows)",
                            op, (long long)p->seq_rows, (long long)p->n_ctx, (int)p->ring,
                            (long long)p->window, (long long)n_tok);
    return TM_OK;
}

/* cuda_attn_prepare's pointers (n_tok > 0). */
static inline tm_status cuda_attn_prepare_check(const tm_cuda_attn_params *p, const float *q,
                                                const float *k, const float *v, const int32_t *pos0,
                                                const void *k_cache, const void *v_cache) {
    if (!q || !k || !v || (!pos0 && !p->row_pos) || !k_cache || !v_cache ||
        !p->row_pos != !p->row_seq)
        return tm_error_set(TM_ERR_ARG,
                            "cuda_attn_prepare: a NULL q/k/v/pos0/cache pointer, or row_pos "
                            "without row_seq");
    if (p->n_rot < 0 || p->n_rot > p->head_dim || (p->n_rot & 1) ||
        ((p->rope_freq || p->rope_interleaved) && p->n_rot && p->n_rot != p->head_dim))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_attn_prepare: n_rot %d of head_dim %d%s (want even, <= "
                            "head_dim, 0: head_dim; a rope_freq table or interleaved pairs "
                            "rotate the whole head)",
                            p->n_rot, p->head_dim,
                            p->rope_freq          ? " with rope_freq"
                            : p->rope_interleaved ? " interleaved"
                                                  : "");
    return TM_OK;
}

/* cuda_attention's bound on the keys and its pointers (n_tok > 0). */
static inline tm_status cuda_attention_check(const tm_cuda_attn_params *p, int64_t n_tok,
                                             int64_t n_kv_max, const float *q, const void *k_cache,
                                             const void *v_cache, const int32_t *pos0,
                                             const float *out) {
    if (n_kv_max < (p->row_pos ? 1 : n_tok) || (!p->ring && n_kv_max > p->n_ctx))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_attention: n_kv_max %lld (want n_tok %lld <= n_kv_max <= n_ctx "
                            "%lld, unless a ring)",
                            (long long)n_kv_max, (long long)n_tok, (long long)p->n_ctx);
    if (!q || !k_cache || !v_cache || (!pos0 && !p->row_pos) || !out || !p->row_pos != !p->row_seq)
        return tm_error_set(TM_ERR_ARG, "cuda_attention: a NULL q/cache/pos0/out pointer, or "
                                        "row_pos without row_seq");
    return TM_OK;
}

#endif
