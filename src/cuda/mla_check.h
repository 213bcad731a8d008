/* The argument contract of the latent-attention launchers (cuda.h:
 * cuda_mla_prepare, cuda_mla_attention, cuda_copy_rows), written once for the
 * two implementations of it: the kernels' launchers (mla.cu) and the host
 * mock (tests/mock/). Plain C without a CUDA header. Each check fails with
 * TM_ERR_ARG naming the op and what was expected. */
#ifndef TM_CUDA_MLA_CHECK_H
#define TM_CUDA_MLA_CHECK_H

#include "cuda/cuda.h"

#define TM_CUDA_MLA_MAX_DIM 1024 /* a latent key's width: 4 values a thread of 256 */

/* The shape both latent ops take (n_tok > 0 or 0), and their pointers. */
static inline tm_status cuda_mla_check(const char *op, const tm_cuda_attn_params *p, int64_t n_tok,
                                       const void *q, const void *kv, const int32_t *pos0,
                                       const void *k_cache) {
    if (!p) return tm_error_set(TM_ERR_ARG, "%s: no params", op);
    if (!p->latent || p->n_head < 1 || p->n_head > 65535 || p->n_head_kv != 1 || p->v_dim < 1 ||
        p->n_rot < 2 || (p->n_rot & 1) || p->v_dim + p->n_rot != p->head_dim ||
        p->head_dim > TM_CUDA_MLA_MAX_DIM || p->n_ctx < 1 || p->n_ctx > 0x7fffffffLL ||
        p->seq_rows < 0 || p->seq_rows > p->n_ctx ||
        (p->kv_type != TM_TYPE_F16 && p->kv_type != TM_TYPE_F32) || p->ring || p->window ||
        p->sinks || n_tok < 0 || n_tok > 0x7fffffffLL)
        return tm_error_set(TM_ERR_ARG,
                            "%s: latent %d, %d heads / %d kv heads, key %d = latent %d + RoPE %d, "
                            "n_ctx %lld (%lld a sequence), kv type %d, ring %d, window %lld, "
                            "sinks %s, n_tok %lld (want latent, one kv head, key = latent + an "
                            "even RoPE part, at most %d, kv f16 or f32, no ring, window or sinks)",
                            op, (int)p->latent, p->n_head, p->n_head_kv, p->head_dim, p->v_dim,
                            p->n_rot, (long long)p->n_ctx, (long long)p->seq_rows, (int)p->kv_type,
                            (int)p->ring, (long long)p->window, p->sinks ? "set" : "none",
                            (long long)n_tok, TM_CUDA_MLA_MAX_DIM);
    if (n_tok && (!q || !kv || !k_cache || (!pos0 && !p->row_pos) || !p->row_pos != !p->row_seq))
        return tm_error_set(TM_ERR_ARG,
                            "%s: a NULL q/kv/out/pos0/cache pointer, or row_pos "
                            "without row_seq",
                            op);
    return TM_OK;
}

static inline tm_status cuda_copy_rows_check(const float *dst, int64_t dst_ld, const float *src,
                                             int64_t src_ld, int64_t rows, int64_t n) {
    if (rows < 0 || n < 0 || dst_ld < n || src_ld < n || (rows && n && (!dst || !src)))
        return tm_error_set(TM_ERR_ARG,
                            "cuda_copy_rows: %lld rows of %lld, lds %lld and %lld (want rows "
                            "and n >= 0, lds >= n, pointers)",
                            (long long)rows, (long long)n, (long long)dst_ld, (long long)src_ld);
    return TM_OK;
}

#endif
