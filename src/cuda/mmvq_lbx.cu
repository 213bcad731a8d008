/* cuda_mmvq_q8x for the low-bit types (mmvq_lbx.cuh): a warp computes R = 4
 * rows against 1, 2, 4 or 8 tokens, TM_FAST_WARPS warps a block split rows
 * or the k steps of a row group (tm_fast_ksplit), as mmvq_q8x.cu. Its own
 * translation unit: one instantiation per type and token count, compiled
 * beside mmvq_q8x.cu. */
#include "cuda/mmvq_lbx.cuh"

template <int TYPE>
static void tm_mmvq_lbx_launch(dim3 grid, dim3 block, cudaStream_t s, const uint8_t *w,
                               size_t row_bytes, int64_t rows, tm_q8x_view x, int nt, int ks,
                               float *y) {
    if (nt == 1)
        tm_mmvq_q8x_kernel<TYPE, 1, 4><<<grid, block, 0, s>>>(w, row_bytes, rows, x, nt, ks, y);
    else if (nt == 2)
        tm_mmvq_q8x_kernel<TYPE, 2, 4><<<grid, block, 0, s>>>(w, row_bytes, rows, x, nt, ks, y);
    else if (nt <= 4)
        tm_mmvq_q8x_kernel<TYPE, 4, 4><<<grid, block, 0, s>>>(w, row_bytes, rows, x, nt, ks, y);
    else
        tm_mmvq_q8x_kernel<TYPE, 8, 4><<<grid, block, 0, s>>>(w, row_bytes, rows, x, nt, ks, y);
}

tm_status tm_mmvq_lbx(tm_type type, const uint8_t *w, size_t row_bytes, int64_t rows, int64_t k,
                      tm_q8x_view x, int n_tok, float *y, cudaStream_t stream) {
    const int64_t groups = tm_cdiv(rows, 4);
    const int ks = tm_fast_ksplit(groups, tm_lbx_steps(k));
    const dim3 grid((unsigned)tm_cdiv(groups, TM_FAST_WARPS / ks)),
        block(TM_FAST_WARPS * TM_CUDA_WARP);
    switch (type) {
#define TM_LBX_CASE(T)                                                                             \
    case T:                                                                                        \
        tm_mmvq_lbx_launch<T>(grid, block, stream, w, row_bytes, rows, x, n_tok, ks, y);           \
        break;
        TM_CUDA_LBX_TYPES(TM_LBX_CASE)
#undef TM_LBX_CASE
    default:
        return tm_error_set(TM_ERR_UNSUPPORTED, "cuda_mmvq_q8x: no 8-bit path for %s weights",
                            quant_type_name(type));
    }
    return tm_cuda_launch_check("cuda_mmvq_q8x", rows, k, n_tok);
}
