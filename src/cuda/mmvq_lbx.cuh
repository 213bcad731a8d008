/* Decode products of the low-bit weight types with 8-bit activations, for
 * every type with an unpacker (tm_lbx, lbx_unit.cuh; the list is
 * TM_CUDA_LBX_TYPES in cuda.h): the rows of cuda_mmvq_q8x (mmvq_lbx.cu) and of
 * the grouped experts' 8-bit path (moe_grouped.cu).
 *
 * Layout of a warp step: 32 consecutive units (1024 values) of each of the
 * warp's R rows, lane l unit 32s + l: a warp's weight loads cover contiguous
 * blocks (8 lanes a 256-value block, a lane a 32-value one) and its
 * activation loads 1024 contiguous bytes a token. A unit meets its 32
 * activation bytes in 8 __dp4a; for types with MIN, the two half sums of the
 * activations (__dp4a with 0x01010101) are computed once per token and shared
 * by the R rows. U steps' units are unpacked (their loads issued) before any
 * is multiplied. */
#ifndef TM_CUDA_MMVQ_LBX_CUH
#define TM_CUDA_MMVQ_LBX_CUH

#include "cuda/lbx_unit_iq.cuh"
#include "cuda/lbx_unit_k.cuh"
#include "cuda/mmvq_q8x.cuh"

/* acc[r][t] += unit un of row r · token t (the unit unpacked in W[r]). */
template <bool MIN, int NT, int R>
static __device__ __forceinline__ void tm_lbx_dot(float (&acc)[R][NT], const tm_lbx_unit (&W)[R],
                                                  tm_q8x_view x, int64_t un, int n_tok) {
    const int64_t nu = x.k / 32;
    const int ones = 0x01010101;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n_tok) break;
        const int4 *xp = (const int4 *)(x.q + t * x.k + 32 * un);
        const int4 a = __ldg(xp), b = __ldg(xp + 1);
        const float dx = __ldg(x.d + t * nu + un);
        float x0 = 0.0f, x1 = 0.0f;
        if (MIN) {
            x0 = (float)__dp4a(ones, a.w,
                               __dp4a(ones, a.z, __dp4a(ones, a.y, __dp4a(ones, a.x, 0))));
            x1 = (float)__dp4a(ones, b.w,
                               __dp4a(ones, b.z, __dp4a(ones, b.y, __dp4a(ones, b.x, 0))));
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int *q = W[r].q;
            const int s0 =
                __dp4a(q[3], a.w, __dp4a(q[2], a.z, __dp4a(q[1], a.y, __dp4a(q[0], a.x, 0))));
            const int s1 =
                __dp4a(q[7], b.w, __dp4a(q[6], b.z, __dp4a(q[5], b.y, __dp4a(q[4], b.x, 0))));
            float v = fmaf(W[r].d[0], (float)s0, W[r].d[1] * (float)s1);
            if (MIN) v = fmaf(-W[r].m[0], x0, fmaf(-W[r].m[1], x1, v));
            acc[r][t] = fmaf(dx, v, acc[r][t]);
        }
    }
}

/* This lane's share of rows rp[0..R) · x[t] over the steps kpart, kpart +
 * ksplit, ...; as tm_q8x_rows. With 4 rows, one step at a time (4 units'
 * loads in flight already; two would spill). */
template <int TYPE, int NT, int R>
static __device__ __forceinline__ void tm_lbx_rows(float (&acc)[R][NT], const uint8_t *const *rp,
                                                   tm_q8x_view x, int n_tok, int lane, int kpart,
                                                   int ksplit) {
    typedef tm_lbx<TYPE> T;
    constexpr int UPB = T::BS / 32, U = R >= 4 ? 1 : 2;
    const int64_t nu = x.k / 32, ns = tm_cdiv(nu, 32);
    for (int64_t s0 = kpart; s0 < ns; s0 += (int64_t)U * ksplit) {
        tm_lbx_unit W[U][R];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t un = (s0 + (int64_t)u * ksplit) * 32 + lane;
            if (un < nu)
#pragma unroll
                for (int r = 0; r < R; r++)
                    T::unit(W[u][r], rp[r] + (un / UPB) * T::BYTES, (int)(un % UPB));
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t un = (s0 + (int64_t)u * ksplit) * 32 + lane;
            if (un < nu) tm_lbx_dot<T::MIN, NT, R>(acc, W[u], x, un, n_tok);
        }
    }
}

/* Any weight type with 8-bit activations: q8_0, q4_K, or a low-bit one. */
template <int TYPE, int NT, int R>
static __device__ __forceinline__ void
tm_q8x_type_rows(float (&acc)[R][NT], const uint8_t *const *rp, tm_q8x_view x, int n_tok, int lane,
                 int kpart, int ksplit) {
    if constexpr (TYPE == TM_TYPE_Q8_0)
        tm_q8x_rows<NT, R>(acc, rp, x, n_tok, lane, kpart, ksplit);
    else if constexpr (TYPE == TM_TYPE_Q4_K)
        tm_q4kx_rows<NT, R>(acc, rp, x, n_tok, lane, kpart, ksplit);
    else
        tm_lbx_rows<TYPE, NT, R>(acc, rp, x, n_tok, lane, kpart, ksplit);
}

/* Warp steps of a row of k values (ksplit's bound). */
static inline int64_t tm_lbx_steps(int64_t k) {
    return tm_cdiv(k / 32, 32);
}

/* cuda_mmvq_q8x's kernel: a warp R rows (tm_fast_group), TM_FAST_WARPS warps a block. */
template <int TYPE, int NT, int R>
__global__ void __launch_bounds__(TM_FAST_WARPS *TM_CUDA_WARP)
    tm_mmvq_q8x_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows, tm_q8x_view x,
                       int n_tok, int ksplit, float *__restrict__ y) {
    const int lane = threadIdx.x & (TM_CUDA_WARP - 1), warp = threadIdx.x >> 5;
    const uint8_t *rp[R];
    const int64_t r0 = tm_fast_group<R>(rp, w, row_bytes, rows, warp, ksplit);
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    tm_q8x_type_rows<TYPE, NT, R>(acc, rp, x, n_tok, lane, warp % ksplit, ksplit);
    tm_fast_store<NT, R>(acc, r0, rows, n_tok, warp, lane, ksplit, y);
}

/* cuda_mmvq_q8x for a low-bit type of TM_CUDA_LBX_TYPES (mmvq_lbx.cu; the caller checked the
 * arguments). */
tm_status tm_mmvq_lbx(tm_type type, const uint8_t *w, size_t row_bytes, int64_t rows, int64_t k,
                      tm_q8x_view x, int n_tok, float *y, cudaStream_t stream);

#endif
