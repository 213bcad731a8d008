/* Unpackers of the legacy, K, iq4 and ternary low-bit types to 8-bit values
 * (the contract: lbx_unit.cuh). Each reads its unit with 4-byte word loads
 * and turns four values at a time into bytes with word operations (shifts,
 * masks, byte permutes); scales and offsets are the reference dequantizer's
 * (dequant_lowbit.cuh), computed in float in its order.
 *
 * Small offsets are subtracted bytewise without borrows: for bytes v < 128,
 * (v + (128 - c)) ^ 0x80 is v - c as an int8 (tm_lbx_sub). */
#ifndef TM_CUDA_LBX_UNIT_K_CUH
#define TM_CUDA_LBX_UNIT_K_CUH

#include "cuda/lbx_unit.cuh"

/* ---- loads: p is even; A4: p is 4-byte aligned ---- */

/* The u16 at p: the aligned word that holds it. */
static __device__ __forceinline__ uint32_t tm_lbx_ld16(const uint8_t *p) {
    const uintptr_t a = (uintptr_t)p;
    return (__ldg((const uint32_t *)(a & ~(uintptr_t)3)) >> ((a & 2) * 8)) & 0xffffu;
}

/* w[i] = bytes [p + 4i, p + 4i + 4): the aligned words around them (one more
 * where p is 2 mod 4, every word read holding some of them), funnel-shifted. */
template <int N, bool A4>
static __device__ __forceinline__ void tm_lbx_run(uint32_t (&w)[N], const uint8_t *p) {
    if (A4) {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = __ldg((const uint32_t *)p + i);
        return;
    }
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *wp = (const uint32_t *)(a & ~(uintptr_t)3);
    const unsigned sh = (unsigned)(a & 2) * 8;
    uint32_t v[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = __ldg(wp + i);
    v[N] = sh ? __ldg(wp + N) : 0u;
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

/* The same for bytes [p, p + 4N - 2) (a block of 4N - 2 bytes: the last
 * word's upper half is unspecified): N loads at either alignment. */
template <int N>
static __device__ __forceinline__ void tm_lbx_run_m2(uint32_t (&w)[N], const uint8_t *p) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *wp = (const uint32_t *)(a & ~(uintptr_t)3);
    const unsigned sh = (unsigned)(a & 2) * 8;
    uint32_t v[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = __ldg(wp + i);
    v[N] = 0u;
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

/* ---- value helpers ---- */

/* Bytes v - c (each byte of v below 128, c <= 128). */
static __device__ __forceinline__ uint32_t tm_lbx_sub(uint32_t v, uint32_t c) {
    return (v + (128u - c) * 0x01010101u) ^ 0x80808080u;
}

/* Bits 0..3 of x to bit 0 of bytes 0..3 (the copies x << 7i do not overlap). */
static __device__ __forceinline__ uint32_t tm_lbx_spread4(uint32_t x) {
    return ((x & 15u) * 0x00204081u) & 0x01010101u;
}

/* iq4_nl's values as bytes: entries 0-3, 4-7, 8-11, 12-15 of quant_iq4nl_values. */
#define TM_LBX_IQ4_T0 0xBFAD9881u /* -127 -104 -83 -65 */
#define TM_LBX_IQ4_T1 0xF6EADDCFu /* -49 -35 -22 -10 */
#define TM_LBX_IQ4_T2 0x26190D01u /* 1 13 25 38 */
#define TM_LBX_IQ4_T3 0x71594535u /* 53 69 89 113 */

/* The table values of the 8 nibbles of w: lo gets those of the low nibbles
 * (bytes 0..3 in order), hi those of the high nibbles. A lookup takes the
 * 3 low bits of 4 nibbles as byte selectors into entries 0-7 and 8-15; bit 3
 * picks one of the two (as llama.cpp's get_int_from_table_16). */
static __device__ __forceinline__ void tm_lbx_iq4(uint32_t w, uint32_t *lo, uint32_t *hi) {
    const uint32_t pick = 0x32103210u | ((w & 0x88888888u) >> 1);
    uint32_t t[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t s = w >> (16 * i);
        const uint32_t a = __byte_perm(TM_LBX_IQ4_T0, TM_LBX_IQ4_T1, s);
        const uint32_t b = __byte_perm(TM_LBX_IQ4_T2, TM_LBX_IQ4_T3, s);
        t[i] = __byte_perm(a, b, pick >> (16 * i)); /* nibbles 4i..4i+3 of w */
    }
    *lo = __byte_perm(t[0], t[1], 0x6420);
    *hi = __byte_perm(t[0], t[1], 0x7531);
}

/* ---- K types: 256-value blocks, unit j = values [32j, 32j + 32) ---- */

/* q2_K: scales[16] (scale low nibble, min high), qs[64], d, dmin. Value
 * 128 hh + 32 s + l is bits 2s..2s+1 of qs[32 hh + l]: unit j = (hh, s) takes
 * plane s of the 8 words qs[32 hh ..]. w = (d sc) q - dmin m. */
template <> struct tm_lbx<TM_TYPE_Q2_K> {
    static constexpr int BS = 256, BYTES = 84;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int j) {
        uint32_t qs[8];
        tm_lbx_run<8, true>(qs, bp + 16 + 32 * (j >> 2));
        const uint32_t sc = tm_lbx_ld16(bp + 2 * j);
        const uint32_t dm = __ldg((const uint32_t *)(bp + 80));
        const int s = 2 * (j & 3);
#pragma unroll
        for (int i = 0; i < 8; i++) w.q[i] = (int)((qs[i] >> s) & 0x03030303u);
        const float d = tm_lb_f16(dm), dmin = tm_lb_f16(dm >> 16);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t b = sc >> (8 * h);
            w.d[h] = d * (float)(b & 15u);
            w.m[h] = dmin * (float)((b >> 4) & 15u);
        }
    }
};

/* q3_K: hmask[32], qs[64], scales[12], d (110 bytes: blocks 2-byte aligned).
 * Unit j takes plane j & 3 of qs[32 (j >> 2) ..] and bit j of hmask[0..32)
 * (clear: the value is offset by -4); scales 2j, 2j + 1: low nibbles in bytes
 * 2j & 7 (high nibble for j >= 4), top bits in bytes 8 + (2j & 3) at bit
 * 2 (j >> 1); offset 32. w = (d (sc - 32)) q. */
template <> struct tm_lbx<TM_TYPE_Q3_K> {
    static constexpr int BS = 256, BYTES = 110;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int j) {
        uint32_t qs[8], hm[8];
        tm_lbx_run<8, false>(qs, bp + 32 + 32 * (j >> 2));
        tm_lbx_run<8, false>(hm, bp);
        const uint32_t lo = tm_lbx_ld16(bp + 96 + 2 * (j & 3)) >> (4 * (j >> 2));
        const uint32_t hi = tm_lbx_ld16(bp + 104 + 2 * (j & 1)) >> (2 * (j >> 1));
        const float d = tm_lb_f16(tm_lbx_ld16(bp + 108));
        const int s = 2 * (j & 3);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t v = ((qs[i] >> s) & 0x03030303u) | (((hm[i] >> j) << 2) & 0x04040404u);
            w.q[i] = (int)tm_lbx_sub(v, 4);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t ls = ((lo >> (8 * h)) & 15u) | (((hi >> (8 * h)) & 3u) << 4);
            w.d[h] = d * (float)((int)ls - 32);
            w.m[h] = 0.0f;
        }
    }
};

/* iq4_xs: d, scales_h (u16: 2 bits per 32 values), scales_l[4], then 8 runs
 * of 16 qs bytes as iq4_nl blocks: unit j is run j. w = (d (ls - 32)) value. */
template <> struct tm_lbx<TM_TYPE_IQ4_XS> {
    static constexpr int BS = 256, BYTES = 136;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int j) {
        uint32_t qs[4];
        tm_lbx_run<4, true>(qs, bp + 8 + 16 * j);
        const uint32_t h0 = __ldg((const uint32_t *)bp), sl = __ldg((const uint32_t *)bp + 1);
        const uint32_t ls = ((sl >> (4 * j)) & 15u) | (((h0 >> (16 + 2 * j)) & 3u) << 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo, hi;
            tm_lbx_iq4(qs[i], &lo, &hi);
            w.q[i] = (int)lo, w.q[4 + i] = (int)hi;
        }
        w.d[0] = w.d[1] = tm_lb_f16(h0) * (float)((int)ls - 32);
        w.m[0] = w.m[1] = 0.0f;
    }
};

/* ---- 32-value blocks: unit 0 is the block. Low nibbles are values 0..15,
 * high nibbles 16..31; q5's fifth bit of value i is bit i of qh. ---- */

/* The values of a legacy block from its qs words (and q5's qh), minus c. */
template <bool Q5>
static __device__ __forceinline__ void tm_lbx_legacy(tm_lbx_unit &w, const uint32_t (&qs)[4],
                                                     uint32_t qh, uint32_t c) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = qs[i] & 0x0F0F0F0Fu, hi = (qs[i] >> 4) & 0x0F0F0F0Fu;
        if (Q5) {
            lo |= tm_lbx_spread4(qh >> (4 * i)) << 4;
            hi |= tm_lbx_spread4(qh >> (16 + 4 * i)) << 4;
        }
        w.q[i] = (int)(c ? tm_lbx_sub(lo, c) : lo), w.q[4 + i] = (int)(c ? tm_lbx_sub(hi, c) : hi);
    }
}

/* q4_1: d, m, qs[16]. w = d q + m. */
template <> struct tm_lbx<TM_TYPE_Q4_1> {
    static constexpr int BS = 32, BYTES = 20;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int) {
        uint32_t dm[1], qs[4];
        tm_lbx_run<1, true>(dm, bp);
        tm_lbx_run<4, true>(qs, bp + 4);
        tm_lbx_legacy<false>(w, qs, 0u, 0u);
        w.d[0] = w.d[1] = tm_lb_f16(dm[0]);
        w.m[0] = w.m[1] = -tm_lb_f16(dm[0] >> 16);
    }
};

/* q5_0: d, qh[4], qs[16] (22 bytes: blocks 2-byte aligned). w = d (q - 16). */
template <> struct tm_lbx<TM_TYPE_Q5_0> {
    static constexpr int BS = 32, BYTES = 22;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int) {
        uint32_t b[6], qs[4];
        tm_lbx_run_m2<6>(b, bp);
#pragma unroll
        for (int i = 0; i < 4; i++) qs[i] = __funnelshift_r(b[1 + i], b[2 + i], 16);
        tm_lbx_legacy<true>(w, qs, (b[0] >> 16) | (b[1] << 16), 16u);
        w.d[0] = w.d[1] = tm_lb_f16(b[0]);
        w.m[0] = w.m[1] = 0.0f;
    }
};

/* q5_1: d, m, qh[4], qs[16]. w = d q + m. */
template <> struct tm_lbx<TM_TYPE_Q5_1> {
    static constexpr int BS = 32, BYTES = 24;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int) {
        uint32_t b[2], qs[4];
        tm_lbx_run<2, true>(b, bp);
        tm_lbx_run<4, true>(qs, bp + 8);
        tm_lbx_legacy<true>(w, qs, b[1], 0u);
        w.d[0] = w.d[1] = tm_lb_f16(b[0]);
        w.m[0] = w.m[1] = -tm_lb_f16(b[0] >> 16);
    }
};

/* iq4_nl: d, qs[16] (18 bytes) as q4_0, codes into the non-linear table. w = d value. */
template <> struct tm_lbx<TM_TYPE_IQ4_NL> {
    static constexpr int BS = 32, BYTES = 18;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int) {
        uint32_t b[5];
        tm_lbx_run_m2<5>(b, bp);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo, hi;
            tm_lbx_iq4(__funnelshift_r(b[i], b[i + 1], 16), &lo, &hi);
            w.q[i] = (int)lo, w.q[4 + i] = (int)hi;
        }
        w.d[0] = w.d[1] = tm_lb_f16(b[0]);
        w.m[0] = w.m[1] = 0.0f;
    }
};

/* ---- ternary types ---- */

/* tq2_0: qs[64] as q2_K's planes holding code + 1, then d (66 bytes). w = d (code - 1). */
template <> struct tm_lbx<TM_TYPE_TQ2_0> {
    static constexpr int BS = 256, BYTES = 66;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int j) {
        uint32_t qs[8];
        tm_lbx_run<8, false>(qs, bp + 32 * (j >> 2));
        const int s = 2 * (j & 3);
#pragma unroll
        for (int i = 0; i < 8; i++) w.q[i] = (int)tm_lbx_sub((qs[i] >> s) & 0x03030303u, 1);
        w.d[0] = w.d[1] = tm_lb_f16(tm_lbx_ld16(bp + 64));
        w.m[0] = w.m[1] = 0.0f;
    }
};

static __device__ __forceinline__ uint32_t tm_lbx_pow3(int n) {
    return n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u;
}

/* The base-3 digits of the 4 bytes of w times pw (dequant_lowbit.cuh's tq1_0:
 * ((b pw mod 256) 3) >> 8), minus 1: even and odd bytes in 16-bit lanes, where
 * b pw <= 255 * 81 and 3 (b pw mod 256) stay under 2^16. */
static __device__ __forceinline__ uint32_t tm_lbx_trits(uint32_t w, uint32_t pw) {
    const uint32_t e = ((w & 0x00FF00FFu) * pw) & 0x00FF00FFu;
    const uint32_t o = (((w >> 8) & 0x00FF00FFu) * pw) & 0x00FF00FFu;
    const uint32_t de = ((e * 3u) >> 8) & 0x00030003u, dodd = ((o * 3u) >> 8) & 0x00030003u;
    return tm_lbx_sub(de | (dodd << 8), 1);
}

/* tq1_0: qs[48], qh[4], d (54 bytes). Units 0..4 are qs[0..32) times 3^j; unit
 * 5 qs[32..48) times 1 then 3, unit 6 times 9 then 27, unit 7 times 81 then qh
 * times 1, 3, 9, 27 (4 values each). w = d (digit - 1). */
template <> struct tm_lbx<TM_TYPE_TQ1_0> {
    static constexpr int BS = 256, BYTES = 54;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(tm_lbx_unit &w, const uint8_t *bp, int j) {
        const bool lo = j < 5;
        uint32_t a[4], b[4], qh[1];
        tm_lbx_run<4, false>(a, bp + (lo ? 0 : 32));
        tm_lbx_run<4, false>(b, bp + (lo ? 16 : 32));
        tm_lbx_run<1, false>(qh, bp + 48);
        const uint32_t pa = tm_lbx_pow3(lo ? j : 2 * (j - 5)),
                       pb = tm_lbx_pow3(lo ? j : 2 * (j - 5) + 1);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w.q[i] = (int)tm_lbx_trits(a[i], pa);
            w.q[4 + i] =
                (int)(j == 7 ? tm_lbx_trits(qh[0], tm_lbx_pow3(i)) : tm_lbx_trits(b[i], pb));
        }
        w.d[0] = w.d[1] = tm_lb_f16(tm_lbx_ld16(bp + 52));
        w.m[0] = w.m[1] = 0.0f;
    }
};

#endif
