/* Device-side dot products of one quantized weight row with up to
 * TM_CUDA_MMVQ_MAX_TOK f32 activation rows; used by mmvq.cu (one warp per
 * output row) and moe_grouped.cu (one warp per expert row).
 *
 * A row is cut into "parts": a piece of one block that one lane dequantizes
 * from a single 16-byte read where the layout allows it (q4_K, q5_K, f16,
 * bf16, f32), into registers, then multiplies with the matching activations:
 *   type   values/block  parts/block  values/part  weight bytes read per part
 *   q4_K   256           8            32           16 qs (+ 4 scale bytes, d, dmin)
 *   q5_K   256           8            32           16 qs + 16 qh
 *   q6_K   256           8            32           8 + 8 ql, 8 qh
 *   q8_0   32            2            16           16
 *   q4_0   32            1            32           16
 *   mxfp4  32            1            32           16
 *   f16/bf16 (8 values)  -            8            16
 *   f32    (8 values)    -            8            32
 *   the low-bit types (dequant_lowbit.cuh): units of 8 values, see tm_lb_row
 * Lanes take consecutive parts, so a warp reads consecutive bytes of the row
 * (coalesced), and each lane has several independent parts in flight.
 *
 * The dequantization is the reference math of src/quant/quant_ref.c and
 * quant_ref_k.c (same scale products); the compiler may fuse d*q - m into an
 * FMA, which moves the last bit of a weight, well inside the f32 tolerance
 * (the low-bit decoders are exact: no FMA).
 * Activations are not requantised: the result is an f32 dot of the
 * dequantized weights. */
#ifndef TM_CUDA_MMVQ_CUH
#define TM_CUDA_MMVQ_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda/cuda_args.h"
#include "cuda/cuda_common.cuh"
#include "cuda/dequant_lowbit.cuh"
#include "quant/quant.h"

/* ---- small loads ---- */

static __device__ __forceinline__ float tm_bf16_to_f32(uint32_t bits) {
    return __uint_as_float(bits << 16);
}

/* 16 bytes as four little-endian words; one 16-byte load when aligned. */
static __device__ __forceinline__ void tm_ld16(uint32_t *w, const uint8_t *p, bool vec16) {
    if (vec16) {
        const uint4 v = __ldg((const uint4 *)p);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[i] = (uint32_t)p[4 * i] | ((uint32_t)p[4 * i + 1] << 8) |
                   ((uint32_t)p[4 * i + 2] << 16) | ((uint32_t)p[4 * i + 3] << 24);
    }
}

static __device__ __forceinline__ uint32_t tm_byte(const uint32_t *w, int i) {
    return (w[i >> 2] >> (8 * (i & 3))) & 0xffu;
}

/* acc[t] += Σ_{i<n} v[i] · x[t*xs + i]; x 16-byte aligned, n a multiple of 4. */
static __device__ __forceinline__ void tm_dot_run(float *acc, const float *v, int n, const float *x,
                                                  int64_t xs, int n_tok) {
#pragma unroll
    for (int t = 0; t < TM_CUDA_MMVQ_MAX_TOK; t++) {
        if (t < n_tok) {
            const float4 *xp = (const float4 *)(x + t * xs);
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < n / 4; i++) {
                const float4 a = xp[i];
                s += v[4 * i] * a.x + v[4 * i + 1] * a.y + v[4 * i + 2] * a.z + v[4 * i + 3] * a.w;
            }
            acc[t] += s;
        }
    }
}

/* ---- K-quant scales (get_scale_min_k4 of quant_ref_k.c) ---- */

static __device__ __forceinline__ void tm_scale_min_k4(int j, const uint8_t *q, float *sc,
                                                       float *m) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---- one part per type; bp is the block, xb the activations of the block ---- */

/* q4_K part p = (group g = p/2, half h = p%2): qs[32g+16h .. +16); low nibbles
 * are values 64g+16h+i of sub-block 2g, high nibbles 64g+32+16h+i of 2g+1. */
static __device__ __forceinline__ void tm_part_q4_k(float *acc, const uint8_t *bp, int p,
                                                    bool vec16, const float *xb, int64_t xs,
                                                    int n_tok) {
    const int g = p >> 1, h = p & 1;
    uint32_t q[4];
    tm_ld16(q, bp + 16 + 32 * g + 16 * h, vec16);
    const float d = tm_ld_f16(bp), dmin = tm_ld_f16(bp + 2);
    float sc0, m0, sc1, m1;
    tm_scale_min_k4(2 * g, bp + 4, &sc0, &m0);
    tm_scale_min_k4(2 * g + 1, bp + 4, &sc1, &m1);
    const float d1 = d * sc0, mm1 = dmin * m0, d2 = d * sc1, mm2 = dmin * m1;
    float lo[16], hi[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t b = tm_byte(q, i);
        lo[i] = d1 * (float)(b & 0x0f) - mm1;
        hi[i] = d2 * (float)(b >> 4) - mm2;
    }
    tm_dot_run(acc, lo, 16, xb + 64 * g + 16 * h, xs, n_tok);
    tm_dot_run(acc, hi, 16, xb + 64 * g + 32 + 16 * h, xs, n_tok);
}

/* q5_K: as q4_K, plus the fifth bit: bit 2g (low) / 2g+1 (high) of qh[16h+i]. */
static __device__ __forceinline__ void tm_part_q5_k(float *acc, const uint8_t *bp, int p,
                                                    bool vec16, const float *xb, int64_t xs,
                                                    int n_tok) {
    const int g = p >> 1, h = p & 1;
    uint32_t q[4], qh[4];
    tm_ld16(q, bp + 48 + 32 * g + 16 * h, vec16);
    tm_ld16(qh, bp + 16 + 16 * h, vec16);
    const float d = tm_ld_f16(bp), dmin = tm_ld_f16(bp + 2);
    float sc0, m0, sc1, m1;
    tm_scale_min_k4(2 * g, bp + 4, &sc0, &m0);
    tm_scale_min_k4(2 * g + 1, bp + 4, &sc1, &m1);
    const float d1 = d * sc0, mm1 = dmin * m0, d2 = d * sc1, mm2 = dmin * m1;
    const uint32_t u1 = 1u << (2 * g), u2 = 2u << (2 * g);
    float lo[16], hi[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t b = tm_byte(q, i), bh = tm_byte(qh, i);
        lo[i] = d1 * (float)((b & 0x0f) + (bh & u1 ? 16 : 0)) - mm1;
        hi[i] = d2 * (float)((b >> 4) + (bh & u2 ? 16 : 0)) - mm2;
    }
    tm_dot_run(acc, lo, 16, xb + 64 * g + 16 * h, xs, n_tok);
    tm_dot_run(acc, hi, 16, xb + 64 * g + 32 + 16 * h, xs, n_tok);
}

/* q6_K part p = (half hh = p/4, l in [lq, lq+8) with lq = 8*(p%4)): values
 * 128hh + l + {0, 32, 64, 96} from ql[64hh+l], ql[64hh+32+l], qh[32hh+l];
 * scales[8hh + l/16 + {0,2,4,6}] (l/16 is the same for the 8 values). The
 * block is 210 bytes, so nothing in it is reliably 4-byte aligned: byte loads. */
static __device__ __forceinline__ void tm_part_q6_k(float *acc, const uint8_t *bp, int p,
                                                    const float *xb, int64_t xs, int n_tok) {
    const int hh = p >> 2, lq = 8 * (p & 3);
    const uint8_t *ql = bp + 64 * hh + lq, *qh = bp + 128 + 32 * hh + lq;
    const int8_t *sc = (const int8_t *)(bp + 192 + 8 * hh + (lq >> 4));
    const float d = tm_ld_f16(bp + 208);
    const float s1 = d * sc[0], s2 = d * sc[2], s3 = d * sc[4], s4 = d * sc[6];
    float v1[8], v2[8], v3[8], v4[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int a = ql[i], b = ql[i + 32], c = qh[i];
        v1[i] = s1 * (float)(((a & 0x0f) | (((c >> 0) & 3) << 4)) - 32);
        v2[i] = s2 * (float)(((b & 0x0f) | (((c >> 2) & 3) << 4)) - 32);
        v3[i] = s3 * (float)(((a >> 4) | (((c >> 4) & 3) << 4)) - 32);
        v4[i] = s4 * (float)(((b >> 4) | (((c >> 6) & 3) << 4)) - 32);
    }
    const float *x0 = xb + 128 * hh + lq;
    tm_dot_run(acc, v1, 8, x0, xs, n_tok);
    tm_dot_run(acc, v2, 8, x0 + 32, xs, n_tok);
    tm_dot_run(acc, v3, 8, x0 + 64, xs, n_tok);
    tm_dot_run(acc, v4, 8, x0 + 96, xs, n_tok);
}

/* q8_0 part p (0..1): qs[16p .. 16p+16). 34-byte blocks: byte loads. */
static __device__ __forceinline__ void tm_part_q8_0(float *acc, const uint8_t *bp, int p,
                                                    const float *xb, int64_t xs, int n_tok) {
    const float d = tm_ld_f16(bp);
    const int8_t *qs = (const int8_t *)(bp + 2 + 16 * p);
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = (float)qs[i] * d;
    tm_dot_run(acc, v, 16, xb + 16 * p, xs, n_tok);
}

/* q4_0: one part per block; low nibbles values j, high nibbles 16+j. */
static __device__ __forceinline__ void tm_part_q4_0(float *acc, const uint8_t *bp, const float *xb,
                                                    int64_t xs, int n_tok) {
    const float d = tm_ld_f16(bp);
    const uint8_t *qs = bp + 2;
    float lo[16], hi[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        lo[i] = (float)((qs[i] & 0x0f) - 8) * d;
        hi[i] = (float)((qs[i] >> 4) - 8) * d;
    }
    tm_dot_run(acc, lo, 16, xb, xs, n_tok);
    tm_dot_run(acc, hi, 16, xb + 16, xs, n_tok);
}

/* mxfp4: e8m0 exponent halved like ggml (kvalues are doubled E2M1 values). */
static __device__ __forceinline__ float tm_e8m0_half(uint32_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    return __uint_as_float(bits);
}

static __device__ __forceinline__ float tm_mxfp4_value(uint32_t nib) {
    /* {0,1,2,3,4,6,8,12} with the sign in bit 3, as kvalues_mxfp4 */
    const uint32_t m = nib & 7;
    const float a = m < 4 ? (float)m : (float)((m & 1 ? 6 : 4) << ((m - 4) >> 1));
    return nib & 8 ? -a : a;
}

static __device__ __forceinline__ void tm_part_mxfp4(float *acc, const uint8_t *bp, const float *xb,
                                                     int64_t xs, int n_tok) {
    const float d = tm_e8m0_half(bp[0]);
    const uint8_t *qs = bp + 1;
    float lo[16], hi[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        lo[i] = tm_mxfp4_value(qs[i] & 0x0f) * d;
        hi[i] = tm_mxfp4_value(qs[i] >> 4) * d;
    }
    tm_dot_run(acc, lo, 16, xb, xs, n_tok);
    tm_dot_run(acc, hi, 16, xb + 16, xs, n_tok);
}

/* ---- float rows: 8 values a part when k % 8 == 0 and the row is 16-byte
 * aligned, else one value per lane step (still coalesced). ---- */

static __device__ __forceinline__ void tm_float_row(float *acc, int type, const uint8_t *row,
                                                    int64_t k, bool vec16, const float *x,
                                                    int64_t xs, int n_tok, int lane) {
    if (vec16 && (k & 7) == 0) {
        for (int64_t p = lane; p < k / 8; p += TM_CUDA_WARP) {
            float v[8];
            if (type == TM_TYPE_F32) {
                const float4 a = __ldg((const float4 *)(row + 32 * p));
                const float4 b = __ldg((const float4 *)(row + 32 * p + 16));
                v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
                v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
            } else {
                uint32_t w[4];
                tm_ld16(w, row + 16 * p, true);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const uint32_t hb = (w[i >> 1] >> (16 * (i & 1))) & 0xffffu;
                    v[i] = type == TM_TYPE_F16 ? __half2float(__ushort_as_half((unsigned short)hb))
                                               : tm_bf16_to_f32(hb);
                }
            }
            tm_dot_run(acc, v, 8, x + 8 * p, xs, n_tok);
        }
        return;
    }
    /* Scalar path: the launcher checked the row is aligned to the element size. */
    for (int64_t i = lane; i < k; i += TM_CUDA_WARP) {
        float v;
        if (type == TM_TYPE_F32)
            v = ((const float *)row)[i];
        else if (type == TM_TYPE_F16)
            v = __half2float(((const __half *)row)[i]);
        else
            v = tm_bf16_to_f32(((const unsigned short *)row)[i]);
#pragma unroll
        for (int t = 0; t < TM_CUDA_MMVQ_MAX_TOK; t++)
            if (t < n_tok) acc[t] += v * x[t * xs + i];
    }
}

/* ---- one row ---- */

/* Parts per block and values per block for the quantized types; 0 if not one. */
static __host__ __device__ __forceinline__ int tm_mmvq_parts(int type) {
    switch (type) {
    case TM_TYPE_Q4_K:
    case TM_TYPE_Q5_K:
    case TM_TYPE_Q6_K:
        return 8;
    case TM_TYPE_Q8_0:
        return 2;
    case TM_TYPE_Q4_0:
    case TM_TYPE_MXFP4:
        return 1;
    default:
        return 0;
    }
}

/* A row of low-bit type TYPE (dequant_lowbit.cuh): lane l takes the units of
 * 8 values l, l + 32, ..., decoded to f32 and dotted with x. Generic and not
 * tuned: a lane reads 2-5 weight bytes a unit, byte by byte. */
template <int TYPE, int BS>
static __device__ __forceinline__ void tm_lb_row(float *acc, const uint8_t *row, int64_t k,
                                                 const float *x, int64_t xs, int n_tok, int lane) {
#pragma unroll 2
    for (int64_t u = lane; u < k / 8; u += TM_CUDA_WARP) {
        float v[8];
        tm_lb_dq8<TYPE, BS>(row, 8 * u, v);
        tm_dot_run(acc, v, 8, x + 8 * u, xs, n_tok);
    }
}

/* This lane's share of row · x[t] for t < n_tok, added to acc[t]; the caller
 * sums acc over the warp. x: [n_tok][xs] floats, 16-byte aligned, xs % 4 == 0
 * for the quantized types. vec16: row and row stride are 16-byte aligned. */
static __device__ __forceinline__ void tm_mmvq_row_partial(int type, const uint8_t *row, int64_t k,
                                                           bool vec16, const float *x, int64_t xs,
                                                           int n_tok, int lane, float *acc) {
    if (type == TM_TYPE_F32 || type == TM_TYPE_F16 || type == TM_TYPE_BF16) {
        tm_float_row(acc, type, row, k, vec16, x, xs, n_tok, lane);
        return;
    }
    switch (type) {
#define TM_MMVQ_LB_CASE(T, BS)                                                                     \
    case T:                                                                                        \
        tm_lb_row<T, BS>(acc, row, k, x, xs, n_tok, lane);                                         \
        return;
        TM_LOWBIT_TYPES(TM_MMVQ_LB_CASE)
#undef TM_MMVQ_LB_CASE
    default:
        break;
    }
    const int P = tm_mmvq_parts(type);
    const int64_t bs =
        (type == TM_TYPE_Q4_K || type == TM_TYPE_Q5_K || type == TM_TYPE_Q6_K) ? 256 : 32;
    const int64_t tsz = type == TM_TYPE_Q4_K   ? 144
                        : type == TM_TYPE_Q5_K ? 176
                        : type == TM_TYPE_Q6_K ? 210
                        : type == TM_TYPE_Q8_0 ? 34
                        : type == TM_TYPE_Q4_0 ? 18
                                               : 17;
    const int64_t nparts = (k / bs) * P;
    /* The switch is outside the loop: the type is uniform over the grid. */
    switch (type) {
    case TM_TYPE_Q4_K:
#pragma unroll 2
        for (int64_t i = lane; i < nparts; i += TM_CUDA_WARP)
            tm_part_q4_k(acc, row + (i >> 3) * tsz, (int)(i & 7), vec16, x + (i >> 3) * bs, xs,
                         n_tok);
        break;
    case TM_TYPE_Q5_K:
#pragma unroll 2
        for (int64_t i = lane; i < nparts; i += TM_CUDA_WARP)
            tm_part_q5_k(acc, row + (i >> 3) * tsz, (int)(i & 7), vec16, x + (i >> 3) * bs, xs,
                         n_tok);
        break;
    case TM_TYPE_Q6_K:
#pragma unroll 2
        for (int64_t i = lane; i < nparts; i += TM_CUDA_WARP)
            tm_part_q6_k(acc, row + (i >> 3) * tsz, (int)(i & 7), x + (i >> 3) * bs, xs, n_tok);
        break;
    case TM_TYPE_Q8_0:
#pragma unroll 2
        for (int64_t i = lane; i < nparts; i += TM_CUDA_WARP)
            tm_part_q8_0(acc, row + (i >> 1) * tsz, (int)(i & 1), x + (i >> 1) * bs, xs, n_tok);
        break;
    case TM_TYPE_Q4_0:
#pragma unroll 2
        for (int64_t i = lane; i < nparts; i += TM_CUDA_WARP)
            tm_part_q4_0(acc, row + i * tsz, x + i * bs, xs, n_tok);
        break;
    case TM_TYPE_MXFP4:
#pragma unroll 2
        for (int64_t i = lane; i < nparts; i += TM_CUDA_WARP)
            tm_part_mxfp4(acc, row + i * tsz, x + i * bs, xs, n_tok);
        break;
    default:
        break; /* launchers reject other types */
    }
}

/* Whether 16-byte weight loads are safe for rows at w, row_bytes apart (the
 * arguments checked by cuda_args.h). */
static inline bool tm_mmvq_vec16(const void *w, size_t row_bytes) {
    return (((uintptr_t)w | row_bytes) & 15) == 0;
}

#endif
