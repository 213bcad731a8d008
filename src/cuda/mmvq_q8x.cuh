/* Decode products of q8_0 weights with 8-bit activations: integer dot
 * products (__dp4a: four int8 products and their sum in one instruction).
 *
 * The f32 path (mmvq_fast.cuh) turns each weight byte into a float and
 * multiplies it with an f32 activation: about 3.5 instructions per weight
 * byte, which made the q8_0 projections instruction-bound at 0.7 TB/s on the
 * H100. Here the activations are quantized once per product
 * (cuda_q8x_quantize: d = max|x|/127 per 32 values, q = round(x/d), as the
 * CPU's normal mode does) and a lane's 16 weight bytes meet 16 activation
 * bytes in four __dp4a; a block's integer sum is exact and is scaled once by
 * d_w · d_x.
 *
 * Layout of a warp step: 512 values (16 q8_0 blocks); lane l takes half h = l&1
 * of block 16s + l/2, i.e. 16 qs bytes. Blocks are 34 bytes, so those bytes
 * start 2 bytes past a 4-byte boundary in every other block: a lane reads the
 * aligned words around them (5 when misaligned, 4 otherwise) and funnel-shifts.
 * Rows need 4-byte alignment and k a multiple of 64 (an even number of blocks:
 * the last block's qs are then aligned and nothing past a row is read). */
#ifndef TM_CUDA_MMVQ_Q8X_CUH
#define TM_CUDA_MMVQ_Q8X_CUH

#include "cuda/mmvq_fast.cuh"

#define TM_Q8X_BLOCKS 16 /* q8_0 blocks of a warp step */

/* The quantized activations of cuda_q8x_quantize: [n_tok][k] int8 values,
 * then [n_tok][k/32] float scales. */
struct tm_q8x_view {
    const int8_t *q;
    const float *d;
    int64_t k;
};

static __host__ __device__ __forceinline__ tm_q8x_view tm_q8x_at(const void *xq, int64_t k,
                                                                 int64_t n_tok) {
    const int8_t *q = (const int8_t *)xq;
    return tm_q8x_view{q, (const float *)(q + n_tok * k), k};
}

/* One row's share of a step: 16 qs bytes as words, and the block's scale. */
struct tm_q8x_ld {
    uint32_t q[4];
    float d;
};

template <int R>
static __device__ __forceinline__ void tm_q8x_load(tm_q8x_ld (&L)[R], const uint8_t *const *rp,
                                                   int64_t s, int64_t nb, int lane) {
    const int64_t b = TM_Q8X_BLOCKS * s + (lane >> 1);
    const bool ok = b < nb;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t *p = rp[r] + b * 34 + 2 + 16 * (lane & 1);
        const uint32_t *wp = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
        const unsigned sh = (unsigned)((uintptr_t)p & 3) * 8; /* 0 or 16 */
        uint32_t w[5];
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = ok ? __ldg(wp + i) : 0u;
        w[4] = ok && sh ? __ldg(wp + 4) : 0u;
#pragma unroll
        for (int i = 0; i < 4; i++) L[r].q[i] = __funnelshift_r(w[i], w[i + 1], sh);
        L[r].d =
            ok ? __half2float(__ushort_as_half(__ldg((const unsigned short *)(rp[r] + b * 34))))
               : 0.0f;
    }
}

template <int NT, int R>
static __device__ __forceinline__ void tm_q8x_dot(float (&acc)[R][NT], const tm_q8x_ld (&L)[R],
                                                  int64_t s, int64_t nb, tm_q8x_view x, int n_tok,
                                                  int lane) {
    const int64_t b = TM_Q8X_BLOCKS * s + (lane >> 1);
    if (b >= nb) return;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n_tok) break;
        const int4 a = __ldg((const int4 *)(x.q + t * x.k + 32 * b + 16 * (lane & 1)));
        const float dx = __ldg(x.d + t * nb + b);
#pragma unroll
        for (int r = 0; r < R; r++) {
            int sum = __dp4a((int)L[r].q[0], a.x, 0);
            sum = __dp4a((int)L[r].q[1], a.y, sum);
            sum = __dp4a((int)L[r].q[2], a.z, sum);
            sum = __dp4a((int)L[r].q[3], a.w, sum);
            acc[r][t] = fmaf(L[r].d * dx, (float)sum, acc[r][t]);
        }
    }
}

/* This lane's share of rows rp[0..R) · x[t] over the steps kpart, kpart +
 * ksplit, ...; two steps' loads in flight before any is multiplied. */
template <int NT, int R>
static __device__ __forceinline__ void tm_q8x_rows(float (&acc)[R][NT], const uint8_t *const *rp,
                                                   tm_q8x_view x, int n_tok, int lane, int kpart,
                                                   int ksplit) {
    constexpr int U = 2;
    const int64_t nb = x.k / 32, ns = tm_cdiv(nb, TM_Q8X_BLOCKS);
    for (int64_t s0 = kpart; s0 < ns; s0 += (int64_t)U * ksplit) {
        tm_q8x_ld L[U][R];
#pragma unroll
        for (int u = 0; u < U; u++) tm_q8x_load<R>(L[u], rp, s0 + (int64_t)u * ksplit, nb, lane);
#pragma unroll
        for (int u = 0; u < U; u++)
            tm_q8x_dot<NT, R>(acc, L[u], s0 + (int64_t)u * ksplit, nb, x, n_tok, lane);
    }
}

static inline int64_t tm_q8x_steps(int64_t k) {
    return tm_cdiv(k / 32, TM_Q8X_BLOCKS);
}

/* ---- q4_K weights with 8-bit activations. The lane layout of
 * tm_fast<TM_TYPE_Q4_K> (half a warp a 256-value block; lane l = 4g + m of
 * 16 holds qs bytes [8l, 8l+8): values 64g + 8m + i of sub-block 2g in their
 * low nibbles, 64g + 32 + 8m + i of sub-block 2g + 1 in the high ones), and
 * its loads. A q8x block of 32 activations is one q4_K sub-block, so a
 * sub-block's Σ (d·sc·q - dmin·m)·x becomes d_x·(d·sc·Σ q·x_q - dmin·m·Σ x_q):
 * the nibbles masked into bytes meet the activation bytes in __dp4a, and
 * Σ x_q is a __dp4a with ones that the warp's rows share. ---- */
typedef tm_fast<TM_TYPE_Q4_K> tm_q4k;

template <int NT, int R>
static __device__ __forceinline__ void tm_q4kx_dot(float (&acc)[R][NT], const tm_q4k::ld<R> &L,
                                                   int64_t s, tm_q8x_view x, int n_tok, int lane) {
    const int64_t blk = 2 * s + (lane >> 4), nb = x.k / 32;
    if (blk >= x.k / 256) return;
    const int l = lane & 15, g = l >> 2;
    float dsc0[R], dm0[R], dsc1[R], dm1[R];
    int lo0[R], lo1[R], hi0[R], hi1[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint4 h = L.h[r];
        uint32_t scp, mp;
        tm_q4k_scale_pairs(h, g, &scp, &mp);
        const float d = tm_h2f(h.x), dmin = tm_h2f(h.x >> 16);
        dsc0[r] = d * (float)(scp & 0xffu), dsc1[r] = d * (float)(scp >> 8);
        dm0[r] = dmin * (float)(mp & 0xffu), dm1[r] = dmin * (float)(mp >> 8);
        lo0[r] = (int)(L.q[r].x & 0x0F0F0F0Fu), lo1[r] = (int)(L.q[r].y & 0x0F0F0F0Fu);
        hi0[r] = (int)((L.q[r].x >> 4) & 0x0F0F0F0Fu),
        hi1[r] = (int)((L.q[r].y >> 4) & 0x0F0F0F0Fu);
    }
    const int64_t b = blk * 8 + 2 * g; /* the q8x block of the low values; b + 1 the high */
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n_tok) break;
        const int8_t *xt = x.q + t * x.k + blk * 256 + 64 * g + 8 * (l & 3);
        const int2 ql = __ldg((const int2 *)xt), qh = __ldg((const int2 *)(xt + 32));
        const float dl = __ldg(x.d + t * nb + b), dh = __ldg(x.d + t * nb + b + 1);
        const float sl = (float)__dp4a(0x01010101, ql.y, __dp4a(0x01010101, ql.x, 0));
        const float shi = (float)__dp4a(0x01010101, qh.y, __dp4a(0x01010101, qh.x, 0));
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int il = __dp4a(lo1[r], ql.y, __dp4a(lo0[r], ql.x, 0));
            const int ih = __dp4a(hi1[r], qh.y, __dp4a(hi0[r], qh.x, 0));
            float a = acc[r][t];
            a = fmaf(dl, fmaf(dsc0[r], (float)il, -dm0[r] * sl), a);
            acc[r][t] = fmaf(dh, fmaf(dsc1[r], (float)ih, -dm1[r] * shi), a);
        }
    }
}

/* This lane's share of q4_K rows rp[0..R) · x[t], as tm_q8x_rows. */
template <int NT, int R>
static __device__ __forceinline__ void tm_q4kx_rows(float (&acc)[R][NT], const uint8_t *const *rp,
                                                    tm_q8x_view x, int n_tok, int lane, int kpart,
                                                    int ksplit) {
    constexpr int U = tm_q4k::U;
    const int64_t ns = tm_q4k::steps(x.k);
    for (int64_t s0 = kpart; s0 < ns; s0 += (int64_t)U * ksplit) {
        tm_q4k::ld<R> L[U];
#pragma unroll
        for (int u = 0; u < U; u++) tm_q4k::load<R>(L[u], rp, s0 + (int64_t)u * ksplit, x.k, lane);
#pragma unroll
        for (int u = 0; u < U; u++)
            tm_q4kx_dot<NT, R>(acc, L[u], s0 + (int64_t)u * ksplit, x, n_tok, lane);
    }
}

#ifdef __CUDACC__
/* Quantize n values (n a multiple of 32) as cuda_q8x_quantize: q [n] int8, d [n/32]. */
tm_status tm_q8x_quantize_n(const float *x, int64_t n, int8_t *q, float *d, cudaStream_t stream);
#endif

#endif
