/* Type-specialised decode dot products: the fast path of mmvq.cu and
 * moe_grouped.cu for q4_K, q8_0, mxfp4, f32, f16 and bf16 rows (the other
 * types, and rows not aligned as below, take the generic per-row code of
 * mmvq.cuh).
 *
 * One warp computes R rows against the same activations, so every x value it
 * loads serves R rows, and a "step" of the warp covers a fixed piece of k:
 *   type   step (values)    lane's share per row             weight loads per lane
 *   q4_K   2 blocks (512)   8 qs bytes (16 values) of 1 block 8 B + the 16-byte header
 *   q8_0   4 blocks (128)   4 qs bytes (4 values)             2 x 2 B + the 2-byte scale
 *   mxfp4  16 blocks (512)  8 qs bytes (16 values) of 1 block 3 x 4 B (2 if aligned) + 1 B
 *   f32    128              4 values                          16 B
 *   f16    128              4 values                          8 B
 * Lanes are laid over a step so that a warp's activation loads are whole
 * 128-byte lines (q8_0, floats), 64-byte halves (q4_K) or half of each of
 * two 32-byte sectors per block (mxfp4: the lane's next load reads the other
 * halves), and its weight loads are contiguous. A warp may process only every
 * ksplit-th step (the launcher sums the warps of a row group) so small
 * matrices still spread over the whole GPU; U steps are loaded before any is
 * multiplied, so each lane has U * R independent weight loads in flight.
 *
 * Integers become floats without I2F (a quarter-rate instruction): a byte
 * placed in a float's mantissa with a fixed exponent (PRMT) is exact. q4_K
 * nibbles become f = 0.5 + q/32, so Σ q·x = 32·Σ f·x - 16·Σ x, and a
 * sub-block's Σ (d·sc·q - dmin·m)·x = 32·d·sc·Σ f·x - (16·d·sc + dmin·m)·Σ x:
 * one FFMA per value, the Σ x shared by the warp's rows. q8_0 values are
 * exact (2^23 + 128 + q) - (2^23 + 128) and the block scale multiplies the
 * block's sum. mxfp4 nibbles (sign in bit 3, magnitude index in bits 0-2)
 * are PRMT selectors into the table of magnitudes {0,1,2,3,4,6,8,12}; a
 * selector with bit 3 set gives the selected byte's sign, 0 for these bytes,
 * so a lookup with four nibbles yields the positive values' magnitudes (0 for
 * the negative ones), one with bit 3 flipped the negative ones', and
 * 128 + pos - neg is the byte 128 + v of each of the four values: from there
 * as q8_0, the block's 2^(e-128) times its sum. All are the reference math of
 * quant_ref*.c regrouped: the results differ from it by float rounding only
 * (a few ulps of Σ|w·x|). */
#ifndef TM_CUDA_MMVQ_FAST_CUH
#define TM_CUDA_MMVQ_FAST_CUH

#include "cuda/mmvq.cuh"

#define TM_FAST_WARPS 4 /* warps per block of the fast kernels */

static __host__ __device__ __forceinline__ int64_t tm_cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static __device__ __forceinline__ float tm_h2f(uint32_t bits) {
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xffffu)));
}

static __device__ __forceinline__ float4 tm_ldx(const float *p) {
    return __ldg((const float4 *)p);
}

static __device__ __forceinline__ float tm_dot4(float acc, float4 x, float a, float b, float c,
                                                float d) {
    return fmaf(d, x.w, fmaf(c, x.z, fmaf(b, x.y, fmaf(a, x.x, acc))));
}

/* 0.5 + b/256 for byte i of w (every byte < 128): exponent 0x3F, b in bits 16..22 */
#define TM_HALF_PLUS(w, i) __uint_as_float(__byte_perm((w), 0x3F000000u, 0x7044u | ((i) << 8)))
/* 2^23 + b for byte i of w */
#define TM_2P23_PLUS(w, i) __uint_as_float(__byte_perm((w), 0x4B000000u, 0x7440u | (i)))

template <int TYPE> struct tm_fast;

/* The scales and mins of sub-blocks 2g and 2g+1 of the q4_K block whose
 * header is h (get_scale_min_k4), as byte pairs: sub-block 2g's in the low
 * byte. Shared by the f32 and the 8-bit-activation (mmvq_q8x.cuh) products. */
static __device__ __forceinline__ void tm_q4k_scale_pairs(uint4 h, int g, uint32_t *scp,
                                                          uint32_t *mp) {
    const int sh = 16 * (g & 1);
    if (g < 2) {
        *scp = (h.y >> sh) & 0x3F3Fu;
        *mp = (h.z >> sh) & 0x3F3Fu;
    } else {
        const uint32_t t3 = h.w >> sh;
        *scp = (t3 & 0x0F0Fu) | ((h.y >> (sh + 2)) & 0x3030u);
        *mp = ((t3 >> 4) & 0x0F0Fu) | ((h.z >> (sh + 2)) & 0x3030u);
    }
}

/* ---- q4_K: half a warp per block; lane l = 4g + m (of 16) reads qs bytes
 * [8l, 8l+8): low nibbles are values 64g + 8m + i of sub-block 2g, high
 * nibbles values 64g + 32 + 8m + i of sub-block 2g + 1. ---- */
template <> struct tm_fast<TM_TYPE_Q4_K> {
    static constexpr int U = 2;
    template <int R> struct ld {
        uint2 q[R];
        uint4 h[R];
    };
    static __host__ __device__ int64_t steps(int64_t k) { return tm_cdiv(k / 256, 2); }
    template <int R>
    static __device__ __forceinline__ void load(ld<R> &L, const uint8_t *const *rp, int64_t s,
                                                int64_t k, int lane) {
        const int64_t blk = 2 * s + (lane >> 4);
        const bool ok = blk < k / 256;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *bp = rp[r] + blk * 144;
            L.h[r] = ok ? __ldg((const uint4 *)bp) : make_uint4(0, 0, 0, 0);
            L.q[r] = ok ? __ldg((const uint2 *)(bp + 16 + 8 * (lane & 15))) : make_uint2(0, 0);
        }
    }
    template <int NT, int R>
    static __device__ __forceinline__ void dot(float (&acc)[R][NT], const ld<R> &L, int64_t s,
                                               int64_t k, const float *x, int64_t xs, int n_tok,
                                               int lane) {
        const int64_t blk = 2 * s + (lane >> 4);
        if (blk >= k / 256) return;
        const int l = lane & 15, g = l >> 2;
        float a0[R], b0[R], a1[R], b1[R];
        uint32_t lo0[R], lo1[R], hi0[R], hi1[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 h = L.h[r];
            uint32_t scp, mp;
            tm_q4k_scale_pairs(h, g, &scp, &mp);
            const float d = tm_h2f(h.x), dmin = tm_h2f(h.x >> 16);
            const float sc0 = (float)(scp & 0xffu), sc1 = (float)(scp >> 8);
            const float m0 = (float)(mp & 0xffu), m1 = (float)(mp >> 8);
            a0[r] = 32.0f * d * sc0, a1[r] = 32.0f * d * sc1;
            b0[r] = fmaf(16.0f * d, sc0, dmin * m0), b1[r] = fmaf(16.0f * d, sc1, dmin * m1);
            /* nibble q as byte 8q (< 128): 0.5 + q/32 once placed */
            lo0[r] = (L.q[r].x << 3) & 0x78787878u, lo1[r] = (L.q[r].y << 3) & 0x78787878u;
            hi0[r] = (L.q[r].x >> 1) & 0x78787878u, hi1[r] = (L.q[r].y >> 1) & 0x78787878u;
        }
        const float *xb = x + blk * 256 + 64 * g + 8 * (l & 3);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n_tok) break;
            const float *xt = xb + t * xs;
            const float4 xl0 = tm_ldx(xt), xl1 = tm_ldx(xt + 4);
            const float4 xh0 = tm_ldx(xt + 32), xh1 = tm_ldx(xt + 36);
            const float sxl =
                ((xl0.x + xl0.y) + (xl0.z + xl0.w)) + ((xl1.x + xl1.y) + (xl1.z + xl1.w));
            const float sxh =
                ((xh0.x + xh0.y) + (xh0.z + xh0.w)) + ((xh1.x + xh1.y) + (xh1.z + xh1.w));
#pragma unroll
            for (int r = 0; r < R; r++) {
                float fl = tm_dot4(0.0f, xl0, TM_HALF_PLUS(lo0[r], 0), TM_HALF_PLUS(lo0[r], 1),
                                   TM_HALF_PLUS(lo0[r], 2), TM_HALF_PLUS(lo0[r], 3));
                fl = tm_dot4(fl, xl1, TM_HALF_PLUS(lo1[r], 0), TM_HALF_PLUS(lo1[r], 1),
                             TM_HALF_PLUS(lo1[r], 2), TM_HALF_PLUS(lo1[r], 3));
                float fh = tm_dot4(0.0f, xh0, TM_HALF_PLUS(hi0[r], 0), TM_HALF_PLUS(hi0[r], 1),
                                   TM_HALF_PLUS(hi0[r], 2), TM_HALF_PLUS(hi0[r], 3));
                fh = tm_dot4(fh, xh1, TM_HALF_PLUS(hi1[r], 0), TM_HALF_PLUS(hi1[r], 1),
                             TM_HALF_PLUS(hi1[r], 2), TM_HALF_PLUS(hi1[r], 3));
                float a = acc[r][t];
                a = fmaf(a0[r], fl, a);
                a = fmaf(-b0[r], sxl, a);
                a = fmaf(a1[r], fh, a);
                acc[r][t] = fmaf(-b1[r], sxh, a);
            }
        }
    }
};

/* ---- q8_0: a warp step is 4 blocks; lane l reads qs bytes [4j, 4j+4) of
 * block l/8 (j = l%8), i.e. values 4l..4l+3 of the step. 34-byte blocks are
 * only 2-byte aligned: 16-bit loads. ---- */
template <> struct tm_fast<TM_TYPE_Q8_0> {
    static constexpr int U = 4;
    template <int R> struct ld { uint32_t q[R], d[R]; };
    static __host__ __device__ int64_t steps(int64_t k) { return tm_cdiv(k / 32, 4); }
    template <int R>
    static __device__ __forceinline__ void load(ld<R> &L, const uint8_t *const *rp, int64_t s,
                                                int64_t k, int lane) {
        const int64_t blk = 4 * s + (lane >> 3);
        const bool ok = blk < k / 32;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const unsigned short *bp = (const unsigned short *)(rp[r] + blk * 34);
            const int j = lane & 7;
            L.q[r] =
                ok ? (uint32_t)__ldg(bp + 1 + 2 * j) | ((uint32_t)__ldg(bp + 2 + 2 * j) << 16) : 0u;
            L.d[r] = ok ? (uint32_t)__ldg(bp) : 0u;
        }
    }
    template <int NT, int R>
    static __device__ __forceinline__ void dot(float (&acc)[R][NT], const ld<R> &L, int64_t s,
                                               int64_t k, const float *x, int64_t xs, int n_tok,
                                               int lane) {
        if (4 * s + (lane >> 3) >= k / 32) return;
        const float *xb = x + 128 * s + 4 * lane;
        const float c = 8388736.0f; /* 2^23 + 128 */
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n_tok) break;
            const float4 xv = tm_ldx(xb + t * xs);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t u = L.q[r] ^ 0x80808080u; /* q + 128 per byte */
                const float v = tm_dot4(0.0f, xv, TM_2P23_PLUS(u, 0) - c, TM_2P23_PLUS(u, 1) - c,
                                        TM_2P23_PLUS(u, 2) - c, TM_2P23_PLUS(u, 3) - c);
                acc[r][t] = fmaf(tm_h2f(L.d[r]), v, acc[r][t]);
            }
        }
    }
};

/* ---- mxfp4: a warp step is 16 blocks; lane l reads qs bytes [8h, 8h+8) of
 * block l/2 (h = l%2): low nibbles are values 8h + i, high nibbles values
 * 16 + 8h + i. 17-byte blocks are only byte-aligned: a lane loads the 4-byte
 * words around its 8 bytes (the third only when they are not aligned: every
 * word read holds some of them) and funnel-shifts them, plus the block's
 * exponent byte. ---- */
template <> struct tm_fast<TM_TYPE_MXFP4> {
    static constexpr int U = 2;
    static constexpr int BLOCKS = 16; /* blocks of a step: two lanes per block */
    template <int R> struct ld { uint32_t q[R][2], e[R]; };
    static __host__ __device__ int64_t steps(int64_t k) { return tm_cdiv(k / 32, BLOCKS); }
    template <int R>
    static __device__ __forceinline__ void load(ld<R> &L, const uint8_t *const *rp, int64_t s,
                                                int64_t k, int lane) {
        const int64_t blk = BLOCKS * s + (lane >> 1);
        const bool ok = blk < k / 32;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *bp = rp[r] + blk * 17;
            const uintptr_t a = (uintptr_t)(bp + 1 + 8 * (lane & 1));
            const uint32_t *wp = (const uint32_t *)(a & ~(uintptr_t)3);
            const unsigned sh = (unsigned)(a & 3) * 8;
            const uint32_t w0 = ok ? __ldg(wp) : 0u, w1 = ok ? __ldg(wp + 1) : 0u;
            const uint32_t w2 = ok && sh ? __ldg(wp + 2) : 0u;
            L.q[r][0] = __funnelshift_r(w0, w1, sh);
            L.q[r][1] = __funnelshift_r(w1, w2, sh);
            L.e[r] = ok ? (uint32_t)__ldg(bp) : 0u;
        }
    }
    template <int NT, int R>
    static __device__ __forceinline__ void dot(float (&acc)[R][NT], const ld<R> &L, int64_t s,
                                               int64_t k, const float *x, int64_t xs, int n_tok,
                                               int lane) {
        const int64_t blk = BLOCKS * s + (lane >> 1);
        if (blk >= k / 32) return;
        const uint32_t t0 = 0x03020100u, t1 = 0x0C080604u; /* magnitudes of indices 0..7 */
        const float c = 8388736.0f;                        /* 2^23 + 128 */
        float v[R][16]; /* [i]: value 8h + i; [8 + i]: value 16 + 8h + i */
        float d[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            d[r] = tm_e8m0_half(L.e[r]);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint32_t qp = L.q[r][j], qn = qp ^ 0x88888888u;
#pragma unroll
                for (int g = 0; g < 2; g++) {
                    /* qs bytes 4j + 2g, 4j + 2g + 1: nibbles lo, hi, lo, hi */
                    const uint32_t sp = g ? qp >> 16 : qp, sn = g ? qn >> 16 : qn;
                    const uint32_t u = 0x80808080u + tm_prmt(t0, t1, sp) - tm_prmt(t0, t1, sn);
                    const int i = 4 * j + 2 * g;
                    v[r][i] = TM_2P23_PLUS(u, 0) - c;
                    v[r][8 + i] = TM_2P23_PLUS(u, 1) - c;
                    v[r][i + 1] = TM_2P23_PLUS(u, 2) - c;
                    v[r][9 + i] = TM_2P23_PLUS(u, 3) - c;
                }
            }
        }
        const float *xb = x + 32 * blk + 8 * (lane & 1);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n_tok) break;
            const float *xt = xb + t * xs;
            const float4 xl0 = tm_ldx(xt), xl1 = tm_ldx(xt + 4);
            const float4 xh0 = tm_ldx(xt + 16), xh1 = tm_ldx(xt + 20);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float *w = v[r];
                float sl = tm_dot4(0.0f, xl0, w[0], w[1], w[2], w[3]);
                sl = tm_dot4(sl, xl1, w[4], w[5], w[6], w[7]);
                float sh = tm_dot4(0.0f, xh0, w[8], w[9], w[10], w[11]);
                sh = tm_dot4(sh, xh1, w[12], w[13], w[14], w[15]);
                acc[r][t] = fmaf(d[r], sl + sh, acc[r][t]);
            }
        }
    }
};

/* ---- float rows: lane l takes values 4(32s + l) .. +3 (k % 4 == 0) ---- */
template <int TYPE> struct tm_fast_float {
    static constexpr int U = 4;
    template <int R> struct ld { uint4 v[R]; /* f32: 4 floats; f16/bf16: 4 halves in .x, .y */ };
    static __host__ __device__ int64_t steps(int64_t k) { return tm_cdiv(k / 4, 32); }
    template <int R>
    static __device__ __forceinline__ void load(ld<R> &L, const uint8_t *const *rp, int64_t s,
                                                int64_t k, int lane) {
        const int64_t c = 32 * s + lane;
        const bool ok = c < k / 4;
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (TYPE == TM_TYPE_F32) {
                L.v[r] = ok ? __ldg((const uint4 *)rp[r] + c) : make_uint4(0, 0, 0, 0);
            } else {
                const uint2 h = ok ? __ldg((const uint2 *)rp[r] + c) : make_uint2(0, 0);
                L.v[r] = make_uint4(h.x, h.y, 0, 0);
            }
        }
    }
    static __device__ __forceinline__ float half_f(uint32_t bits) {
        return TYPE == TM_TYPE_F16 ? tm_h2f(bits) : __uint_as_float(bits << 16);
    }
    template <int NT, int R>
    static __device__ __forceinline__ void dot(float (&acc)[R][NT], const ld<R> &L, int64_t s,
                                               int64_t k, const float *x, int64_t xs, int n_tok,
                                               int lane) {
        const int64_t c = 32 * s + lane;
        if (c >= k / 4) return;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n_tok) break;
            const float4 xv = tm_ldx(x + t * xs + 4 * c);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint4 v = L.v[r];
                if (TYPE == TM_TYPE_F32)
                    acc[r][t] = tm_dot4(acc[r][t], xv, __uint_as_float(v.x), __uint_as_float(v.y),
                                        __uint_as_float(v.z), __uint_as_float(v.w));
                else
                    acc[r][t] = tm_dot4(acc[r][t], xv, half_f(v.x & 0xffffu), half_f(v.x >> 16),
                                        half_f(v.y & 0xffffu), half_f(v.y >> 16));
            }
        }
    }
};
template <> struct tm_fast<TM_TYPE_F32> : tm_fast_float<TM_TYPE_F32> {};
template <> struct tm_fast<TM_TYPE_F16> : tm_fast_float<TM_TYPE_F16> {};
template <> struct tm_fast<TM_TYPE_BF16> : tm_fast_float<TM_TYPE_BF16> {};

/* This lane's share of rows rp[0..R) · x[t] (t < n_tok <= NT) over the steps
 * kpart, kpart + ksplit, ...; added to acc. No shuffles: the caller sums
 * over the warp (and over the ksplit warps). */
template <int TYPE, int NT, int R>
static __device__ __forceinline__ void tm_fast_rows(float (&acc)[R][NT], const uint8_t *const *rp,
                                                    int64_t k, const float *x, int64_t xs,
                                                    int n_tok, int lane, int kpart, int ksplit) {
    typedef tm_fast<TYPE> T;
    constexpr int U = T::U;
    const int64_t ns = T::steps(k);
    for (int64_t s0 = kpart; s0 < ns; s0 += (int64_t)U * ksplit) {
        typename T::template ld<R> L[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            T::template load<R>(L[u], rp, s0 + (int64_t)u * ksplit, k, lane);
#pragma unroll
        for (int u = 0; u < U; u++)
            T::template dot<NT, R>(acc, L[u], s0 + (int64_t)u * ksplit, k, x, xs, n_tok, lane);
    }
}

/* The row group of warp `warp` in a block of the decode kernels (mmvq.cu,
 * mmvq_q8x.cu): rows r0.. of R, those past the end reading the last row (their
 * results are never written). */
template <int R>
static __device__ __forceinline__ int64_t tm_fast_group(const uint8_t *(&rp)[R], const uint8_t *w,
                                                        size_t row_bytes, int64_t rows, int warp,
                                                        int ksplit) {
    const int64_t r0 = ((int64_t)blockIdx.x * (TM_FAST_WARPS / ksplit) + warp / ksplit) * R;
#pragma unroll
    for (int r = 0; r < R; r++) rp[r] = w + (r0 + r < rows ? r0 + r : rows - 1) * row_bytes;
    return r0;
}

/* Sum each lane's acc over the warp, then over the ksplit warps of the row
 * group (through shared memory), and write y[t][r0 + r]. Every thread of the
 * block calls it (a barrier inside). */
template <int NT, int R>
static __device__ __forceinline__ void tm_fast_store(const float (&acc)[R][NT], int64_t r0,
                                                     int64_t rows, int n_tok, int warp, int lane,
                                                     int ksplit, float *y) {
    __shared__ float part[TM_FAST_WARPS][R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = tm_warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r][t] = v;
        }
    __syncthreads();
    if (warp % ksplit == 0 && lane < R * NT) {
        const int r = lane / NT, t = lane % NT;
        float v = 0.0f;
        for (int j = 0; j < ksplit; j++) v += part[warp + j][r][t];
        if (r0 + r < rows && t < n_tok) y[t * rows + r0 + r] = v;
    }
}

/* ---- host side: which matrices take the fast path, and how a launch splits ---- */

/* align: OR of the matrix's base address, row stride (and expert stride). */
static inline bool tm_fast_ok(tm_type type, uintptr_t align, int64_t k) {
    switch (type) {
    case TM_TYPE_Q4_K:
        return (align & 15) == 0; /* 144-byte blocks: header and qs loads 16/8 bytes */
    case TM_TYPE_Q8_0:
        return (align & 1) == 0;
    case TM_TYPE_MXFP4:
        return true; /* 4-byte loads around any byte address; k % 32 == 0 is checked before */
    case TM_TYPE_F32:
        return (align & 15) == 0 && k % 4 == 0;
    case TM_TYPE_F16:
    case TM_TYPE_BF16:
        return (align & 7) == 0 && k % 4 == 0;
    default:
        return false;
    }
}

static inline int64_t tm_fast_steps(tm_type type, int64_t k) {
    switch (type) {
    case TM_TYPE_Q4_K:
        return tm_fast<TM_TYPE_Q4_K>::steps(k);
    case TM_TYPE_Q8_0:
        return tm_fast<TM_TYPE_Q8_0>::steps(k);
    case TM_TYPE_MXFP4:
        return tm_fast<TM_TYPE_MXFP4>::steps(k);
    default:
        return tm_fast<TM_TYPE_F32>::steps(k);
    }
}

/* Warps per row group (1, 2 or 4, never more than the steps): enough warps
 * that a small matrix (k/v projections: 512 rows) still has 1000+ warps in
 * flight over the 100+ SMs, while large ones keep one warp per group. */
static inline int tm_fast_ksplit(int64_t groups, int64_t steps) {
    int ks = groups >= 2048 ? 1 : groups >= 1024 ? 2 : 4;
    while (ks > 1 && ks > steps) ks >>= 1;
    return ks;
}

/* Grouped experts (moe_grouped.cu): rows per warp of the fast kernels, and
 * which of its two kernels take the fast path (shared with tests/emu). */
#define TM_MOE_FAST_FF 2 /* n_ff rows of gate (and as many of up) per gate/up warp */
#define TM_MOE_FAST_E  4 /* n_embd rows per down warp */

/* Which kernels take the fast path: shared with the host mock (tests/emu). */
static inline bool tm_moe_fast_matrix(const tm_cuda_moe_matrix *m, int64_t k) {
    return tm_fast_ok(m->type, (uintptr_t)m->data | m->row_bytes | m->expert_stride, k);
}
static inline bool tm_moe_fast_gate_up(const tm_cuda_moe_params *p) {
    return p->gate.type == p->up.type && tm_moe_fast_matrix(&p->gate, p->n_embd) &&
           tm_moe_fast_matrix(&p->up, p->n_embd);
}

#endif
