/* Dequantization of weight rows to f16 on the GPU: the per-type decoders and
 * the internal launchers shared by dequant.cu (cuda_dequantize_f16), gemm.cu
 * (row chunks of a dense matrix) and moe_gemm.cu (the experts of a layer).
 *
 * A thread makes one "unit" of 8 consecutive values of a row (16 bytes of f16,
 * one vector store). 8 consecutive values never cross a sub-block:
 *   type   block  unit j (value index in the row, j % 8 == 0)
 *   q4_K   256    group g = off/64, nibble half = off/32 % 2, bytes qs[32g + off%32 ..+8)
 *   q5_K   256    as q4_K, fifth bit from qh[off%32 ..+8), bit 2g + half
 *   q6_K   256    half hh = off/128, quarter qq = off/32 % 4, l = off%32:
 *                 ql[64hh + 32(qq%2) + l ..+8) (low nibble for qq < 2),
 *                 qh[32hh + l ..+8) bits 2qq..2qq+1, scale[8hh + l/16 + 2qq]
 *   q8_0 q4_0 mxfp4  32  values off..off+8 of the block (q4_0/mxfp4: low
 *                 nibbles hold 0..15, high nibbles 16..31)
 *   f16 bf16 f32  -   values j..j+8 (k not a multiple of 8: one value a thread)
 *   the low-bit types (q4_1 ... iq1_m, tq1_0, tq2_0): dequant_lowbit.cuh
 * (off = j % block). The block structs are those of src/quant/quant.h; the
 * scalar helpers are cuda_common.cuh's (tm_ld_f16) and mmvq.cuh's
 * (tm_scale_min_k4, tm_e8m0_half).
 *
 * Bit-exactness with quant_row_dequantize + round-to-nearest-even f16: the
 * float operations are those of src/quant/quant_ref*.c in the same order,
 * written with __fmul_rn / __fsub_rn so nvcc cannot contract d*q - m into an
 * FMA (the CPU reference is compiled with contraction off). */
#ifndef TM_CUDA_DEQUANT_CUH
#define TM_CUDA_DEQUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/cuda_args.h"
#include "cuda/mmvq.cuh"

#define TM_DQ_THREADS 256

/* E2M1 value doubled (ggml's kvalues_mxfp4) as an integer, so a zero code is
 * +0 like the CPU table (tm_mxfp4_value would give -0 for code 8). */
static __device__ __forceinline__ int tm_mxfp4_int(uint32_t nib) {
    const int m = (int)(nib & 7);
    const int a = m < 4 ? m : (m & 1 ? 6 : 4) << ((m - 4) >> 1);
    return nib & 8 ? -a : a;
}

/* Values j .. j+7 of a quantized or float row (j % 8 == 0) as f16. */
static __device__ __forceinline__ void tm_dq8_f16(int type, const uint8_t *row, int64_t j,
                                                  __half *o) {
    switch (type) {
    case TM_TYPE_Q4_K:
    case TM_TYPE_Q5_K: {
        const bool q5 = type == TM_TYPE_Q5_K;
        const uint8_t *bp = row + (j >> 8) * (q5 ? 176 : 144);
        const int off = (int)(j & 255), g = off >> 6, hi = (off >> 5) & 1, l = off & 31;
        const float d = tm_ld_f16(bp), dmin = tm_ld_f16(bp + 2);
        float sc, m;
        tm_scale_min_k4(2 * g + hi, bp + 4, &sc, &m);
        const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, m);
        const uint8_t *q = bp + (q5 ? 48 : 16) + 32 * g + l, *qh = bp + 16 + l;
        const uint32_t u = (hi ? 2u : 1u) << (2 * g);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int n = hi ? q[i] >> 4 : q[i] & 0x0f;
            if (q5 && (qh[i] & u)) n += 16;
            o[i] = __float2half_rn(__fsub_rn(__fmul_rn(d1, (float)n), m1));
        }
        break;
    }
    case TM_TYPE_Q6_K: {
        const uint8_t *bp = row + (j >> 8) * 210;
        const int off = (int)(j & 255), hh = off >> 7, qq = (off >> 5) & 3, l = off & 31;
        const uint8_t *ql = bp + 64 * hh + 32 * (qq & 1) + l, *qh = bp + 128 + 32 * hh + l;
        const int8_t sc = (int8_t)bp[192 + 8 * hh + (l >> 4) + 2 * qq];
        const float ds = __fmul_rn(tm_ld_f16(bp + 208), (float)sc); /* (d * sc) * q as the CPU */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int lo = qq >= 2 ? ql[i] >> 4 : ql[i] & 0x0f;
            const int q = (lo | (((qh[i] >> (2 * qq)) & 3) << 4)) - 32;
            o[i] = __float2half_rn(__fmul_rn(ds, (float)q));
        }
        break;
    }
    case TM_TYPE_Q8_0: {
        const uint8_t *bp = row + (j >> 5) * 34;
        const float d = tm_ld_f16(bp);
        const int8_t *qs = (const int8_t *)(bp + 2 + (j & 31));
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = __float2half_rn(__fmul_rn((float)qs[i], d));
        break;
    }
    case TM_TYPE_Q4_0:
    case TM_TYPE_MXFP4: {
        const bool mx = type == TM_TYPE_MXFP4;
        const uint8_t *bp = row + (j >> 5) * (mx ? 17 : 18);
        const int off = (int)(j & 31), hi = off >> 4;
        const float d = mx ? tm_e8m0_half(bp[0]) : tm_ld_f16(bp);
        const uint8_t *qs = bp + (mx ? 1 : 2) + (off & 15);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t n = hi ? qs[i] >> 4 : qs[i] & 0x0f;
            const int v = mx ? tm_mxfp4_int(n) : (int)n - 8;
            o[i] = __float2half_rn(__fmul_rn((float)v, d));
        }
        break;
    }
    case TM_TYPE_F16:
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = ((const __half *)row)[j + i]; /* exact: a copy */
        break;
    case TM_TYPE_BF16:
#pragma unroll
        for (int i = 0; i < 8; i++)
            o[i] = __float2half_rn(tm_bf16_to_f32(((const unsigned short *)row)[j + i]));
        break;
#define TM_DQ_LB_CASE(T, BS)                                                                       \
    case T: {                                                                                      \
        float f[8];                                                                                \
        tm_lb_dq8<T, BS>(row, j, f);                                                               \
        _Pragma("unroll") for (int i = 0; i < 8; i++) o[i] = __float2half_rn(f[i]);                \
        break;                                                                                     \
    }
        TM_LOWBIT_TYPES(TM_DQ_LB_CASE)
#undef TM_DQ_LB_CASE
    default: /* TM_TYPE_F32: the launchers reject every other type */
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = __float2half_rn(((const float *)row)[j + i]);
        break;
    }
}

/* One value of a float row (k not a multiple of 8). */
static __device__ __forceinline__ __half tm_dq1_f16(int type, const uint8_t *row, int64_t j) {
    if (type == TM_TYPE_F16) return ((const __half *)row)[j];
    if (type == TM_TYPE_BF16)
        return __float2half_rn(tm_bf16_to_f32(((const unsigned short *)row)[j]));
    return __float2half_rn(((const float *)row)[j]);
}

/* Dequantize `rows` rows of k values for each of n_groups groups:
 * group g reads rows at w + slots[g]*expert_stride (slots NULL: w itself) and
 * writes out + g*out_group_stride as [rows][k] f16. Arguments checked by the
 * caller (cuda_weights_check); n_groups <= 65535. */
tm_status tm_dequant_f16_run(const char *op, tm_type type, const void *w, size_t row_bytes,
                             int64_t rows, int64_t k, size_t expert_stride, const int32_t *slots,
                             int32_t n_groups, __half *out, int64_t out_group_stride,
                             cudaStream_t stream);

/* out[i] = f16(x[i]), round to nearest even, i < n. */
tm_status tm_f32_to_f16_run(const char *op, const float *x, int64_t n, __half *out,
                            cudaStream_t stream);

#endif
