/* Scalar emulation of the AVX-512 and AMX intrinsics that src/cpu's kernels
 * use, written from Intel's definitions, so their lane and tile logic can be
 * checked on a machine without AVX-512/AMX (scripts/cpu_emu_check.sh). Not a
 * substitute for running test_cpu_gemm on real hardware: a shared
 * misreading of an instruction would pass here. Dev check only. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
typedef union {
    int8_t b[64];
    uint8_t ub[64];
    int16_t w[32];
    int32_t d[16];
    int64_t q[8];
    float f[16];
} E512;
#define __m512i E512
#define __m512  E512
#define EI      static inline
/* cpu_gemm_tile.h: no AVX-512 target attribute on the shared helpers */
#define TM_EMU512 1
EI E512 e_zero(void) {
    E512 r;
    memset(&r, 0, 64);
    return r;
}
#define _mm512_setzero_si512 e_zero
#define _mm512_setzero_ps    e_zero
EI E512 e_and(E512 a, E512 b) {
    for (int i = 0; i < 8; i++) a.q[i] &= b.q[i];
    return a;
}
#define _mm512_and_si512 e_and
EI E512 e_xor(E512 a, E512 b) {
    for (int i = 0; i < 8; i++) a.q[i] ^= b.q[i];
    return a;
}
#define _mm512_xor_si512 e_xor
EI E512 e_bc128(__m128i x) {
    E512 r;
    for (int l = 0; l < 4; l++) memcpy(r.b + 16 * l, &x, 16);
    return r;
}
#define _mm512_broadcast_i32x4 e_bc128
EI E512 e_bc256(__m256i x) {
    E512 r;
    memcpy(r.b, &x, 32);
    memcpy(r.b + 32, &x, 32);
    return r;
}
#define _mm512_broadcast_i64x4 e_bc256
EI E512 e_c256(__m256i x) {
    E512 r = e_zero();
    memcpy(r.b, &x, 32);
    return r;
}
#define _mm512_castsi256_si512 e_c256
EI E512 e_c256p(__m256 x) {
    E512 r = e_zero();
    memcpy(r.b, &x, 32);
    return r;
}
#define _mm512_castps256_ps512 e_c256p
EI E512 e_cvt(E512 a) {
    E512 r;
    for (int i = 0; i < 16; i++) r.f[i] = (float)a.d[i];
    return r;
}
#define _mm512_cvtepi32_ps e_cvt
EI E512 e_dpbusd(E512 s, E512 a, E512 b) {
    for (int i = 0; i < 16; i++) {
        int32_t t = 0;
        for (int e = 0; e < 4; e++) t += a.ub[4 * i + e] * b.b[4 * i + e];
        s.d[i] += t;
    }
    return s;
}
#define _mm512_dpbusd_epi32 e_dpbusd
EI E512 e_dpwssd(E512 s, E512 a, E512 b) {
    for (int i = 0; i < 16; i++)
        s.d[i] += a.w[2 * i] * b.w[2 * i] + a.w[2 * i + 1] * b.w[2 * i + 1];
    return s;
}
#define _mm512_dpwssd_epi32 e_dpwssd
EI E512 e_fmadd(E512 a, E512 b, E512 c) {
    for (int i = 0; i < 16; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]);
    return c;
}
#define _mm512_fmadd_ps e_fmadd
EI E512 e_fnmadd(E512 a, E512 b, E512 c) {
    for (int i = 0; i < 16; i++) c.f[i] = fmaf(-a.f[i], b.f[i], c.f[i]);
    return c;
}
#define _mm512_fnmadd_ps e_fnmadd
EI E512 e_gather(E512 idx, const void *base, int scale) {
    E512 r;
    for (int i = 0; i < 16; i++) memcpy(&r.d[i], (const char *)base + (int64_t)idx.d[i] * scale, 4);
    return r;
}
#define _mm512_i32gather_epi32 e_gather
EI E512 e_insf8(E512 a, __m256 x, int i) {
    memcpy(a.b + 32 * i, &x, 32);
    return a;
}
#define _mm512_insertf32x8 e_insf8
EI E512 e_ins4(E512 a, __m128i x, int i) {
    memcpy(a.b + 16 * i, &x, 16);
    return a;
}
#define _mm512_inserti32x4 e_ins4
EI E512 e_ins8(E512 a, __m256i x, int i) {
    memcpy(a.b + 32 * i, &x, 32);
    return a;
}
#define _mm512_inserti64x4 e_ins8
EI E512 e_ld(const void *p) {
    E512 r;
    memcpy(&r, p, 64);
    return r;
}
#define _mm512_load_ps     e_ld
#define _mm512_load_si512  e_ld
#define _mm512_loadu_ps    e_ld
#define _mm512_loadu_si512 e_ld
EI void e_st(void *p, E512 a) {
    memcpy(p, &a, 64);
}
#define _mm512_store_si512  e_st
#define _mm512_storeu_si512 e_st
#define _mm512_storeu_ps    e_st
EI E512 e_madd(E512 a, E512 b) {
    E512 r;
    for (int i = 0; i < 16; i++) r.d[i] = a.w[2 * i] * b.w[2 * i] + a.w[2 * i + 1] * b.w[2 * i + 1];
    return r;
}
#define _mm512_madd_epi16 e_madd
EI E512 e_maddubs(E512 a, E512 b) {
    E512 r;
    for (int i = 0; i < 32; i++) {
        int t = a.ub[2 * i] * b.b[2 * i] + a.ub[2 * i + 1] * b.b[2 * i + 1];
        r.w[i] = (int16_t)(t > 32767 ? 32767 : t < -32768 ? -32768 : t);
    }
    return r;
}
#define _mm512_maddubs_epi16 e_maddubs
EI E512 e_maskadd8(E512 src, uint64_t k, E512 a, E512 b) {
    for (int i = 0; i < 64; i++)
        if ((k >> i) & 1) src.b[i] = (int8_t)(a.b[i] + b.b[i]);
    return src;
}
#define _mm512_mask_add_epi8 e_maskadd8
EI void e_mstore(float *p, uint16_t k, E512 a) {
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) p[i] = a.f[i];
}
#define _mm512_mask_storeu_ps e_mstore
EI E512 e_mul(E512 a, E512 b) {
    for (int i = 0; i < 16; i++) a.f[i] *= b.f[i];
    return a;
}
#define _mm512_mul_ps e_mul
EI E512 e_mullo(E512 a, E512 b) {
    for (int i = 0; i < 16; i++) a.d[i] *= b.d[i];
    return a;
}
#define _mm512_mullo_epi32 e_mullo
EI float e_radd(E512 a) {
    float s = 0;
    for (int i = 0; i < 16; i++) s += a.f[i];
    return s;
}
#define _mm512_reduce_add_ps e_radd
EI E512 e_s1d(int v) {
    E512 r;
    for (int i = 0; i < 16; i++) r.d[i] = v;
    return r;
}
#define _mm512_set1_epi32 e_s1d
EI E512 e_s1b(char v) {
    E512 r;
    memset(r.b, v, 64);
    return r;
}
#define _mm512_set1_epi8 e_s1b
EI E512 e_s1f(float v) {
    E512 r;
    for (int i = 0; i < 16; i++) r.f[i] = v;
    return r;
}
#define _mm512_set1_ps e_s1f
EI E512 e_setrd(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8, int a9,
                int a10, int a11, int a12, int a13, int a14, int a15) {
    E512 r;
    int v[16] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15};
    memcpy(r.d, v, 64);
    return r;
}
#define _mm512_setr_epi32 e_setrd
EI E512 e_pshufb(E512 a, E512 c) {
    E512 r;
    for (int i = 0; i < 64; i++) {
        int l = i / 16;
        r.b[i] = (c.ub[i] & 0x80) ? 0 : a.b[16 * l + (c.ub[i] & 15)];
    }
    return r;
}
#define _mm512_shuffle_epi8 e_pshufb
EI E512 e_shufi64x2(E512 a, E512 b, int imm) {
    E512 r;
    for (int l = 0; l < 4; l++) {
        int s = (imm >> (2 * l)) & 3;
        memcpy(r.b + 16 * l, (l < 2 ? a.b : b.b) + 16 * s, 16);
    }
    return r;
}
#define _mm512_shuffle_i64x2 e_shufi64x2
EI E512 e_srli16(E512 a, int n) {
    for (int i = 0; i < 32; i++) a.w[i] = (int16_t)((uint16_t)a.w[i] >> n);
    return a;
}
#define _mm512_srli_epi16 e_srli16
EI E512 e_sub32(E512 a, E512 b) {
    for (int i = 0; i < 16; i++) a.d[i] -= b.d[i];
    return a;
}
#define _mm512_sub_epi32 e_sub32
EI uint64_t e_test8(E512 a, E512 b) {
    uint64_t k = 0;
    for (int i = 0; i < 64; i++)
        if (a.b[i] & b.b[i]) k |= 1ull << i;
    return k;
}
#define _mm512_test_epi8_mask e_test8
EI E512 e_or(E512 a, E512 b) {
    for (int i = 0; i < 8; i++) a.q[i] |= b.q[i];
    return a;
}
#define _mm512_or_si512 e_or
EI E512 e_s1w(short v) {
    E512 r;
    for (int i = 0; i < 32; i++) r.w[i] = v;
    return r;
}
#define _mm512_set1_epi16 e_s1w
EI E512 e_sllvw(E512 a, E512 c) {
    for (int i = 0; i < 32; i++)
        a.w[i] = (int16_t)((uint16_t)c.w[i] > 15 ? 0 : (uint16_t)((uint16_t)a.w[i] << c.w[i]));
    return a;
}
#define _mm512_sllv_epi16 e_sllvw
EI E512 e_srlvw(E512 a, E512 c) {
    for (int i = 0; i < 32; i++)
        a.w[i] = (int16_t)((uint16_t)c.w[i] > 15 ? 0 : (uint16_t)a.w[i] >> c.w[i]);
    return a;
}
#define _mm512_srlv_epi16 e_srlvw
EI E512 e_permw(E512 idx, E512 a) {
    E512 r;
    for (int i = 0; i < 32; i++) r.w[i] = a.w[idx.w[i] & 31];
    return r;
}
#define _mm512_permutexvar_epi16 e_permw
EI E512 e_unlo32(E512 a, E512 b) {
    E512 r;
    for (int l = 0; l < 4; l++) {
        r.d[4 * l] = a.d[4 * l];
        r.d[4 * l + 1] = b.d[4 * l];
        r.d[4 * l + 2] = a.d[4 * l + 1];
        r.d[4 * l + 3] = b.d[4 * l + 1];
    }
    return r;
}
#define _mm512_unpacklo_epi32 e_unlo32
EI E512 e_unhi32(E512 a, E512 b) {
    E512 r;
    for (int l = 0; l < 4; l++) {
        r.d[4 * l] = a.d[4 * l + 2];
        r.d[4 * l + 1] = b.d[4 * l + 2];
        r.d[4 * l + 2] = a.d[4 * l + 3];
        r.d[4 * l + 3] = b.d[4 * l + 3];
    }
    return r;
}
#define _mm512_unpackhi_epi32 e_unhi32
EI E512 e_unlo64(E512 a, E512 b) {
    E512 r;
    for (int l = 0; l < 4; l++) {
        r.q[2 * l] = a.q[2 * l];
        r.q[2 * l + 1] = b.q[2 * l];
    }
    return r;
}
#define _mm512_unpacklo_epi64 e_unlo64
EI E512 e_unhi64(E512 a, E512 b) {
    E512 r;
    for (int l = 0; l < 4; l++) {
        r.q[2 * l] = a.q[2 * l + 1];
        r.q[2 * l + 1] = b.q[2 * l + 1];
    }
    return r;
}
#define _mm512_unpackhi_epi64 e_unhi64
EI E512 e_p2v64(E512 a, E512 idx, E512 b) {
    E512 r;
    for (int i = 0; i < 8; i++) {
        int j = (int)(idx.q[i] & 15);
        r.q[i] = j < 8 ? a.q[j] : b.q[j - 8];
    }
    return r;
}
#define _mm512_permutex2var_epi64 e_p2v64
EI E512 e_setrq(long long a0, long long a1, long long a2, long long a3, long long a4, long long a5,
                long long a6, long long a7) {
    E512 r;
    long long v[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    memcpy(r.q, v, 64);
    return r;
}
#define _mm512_setr_epi64 e_setrq
#define __mmask64         uint64_t
#define __mmask16         uint16_t
/* bf16 (AMX-BF16 kernel) */
#define __m512bh E512
EI uint16_t e_bf16(float f) { /* round to nearest even; denormals to zero, as the hardware */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}
EI float e_bf16f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
EI E512 e_cvtne2(E512 a, E512 b) {
    E512 r;
    for (int i = 0; i < 16; i++)
        r.w[i] = (int16_t)e_bf16(b.f[i]), r.w[16 + i] = (int16_t)e_bf16(a.f[i]);
    return r;
}
#define _mm512_cvtne2ps_pbh e_cvtne2
EI E512 e_cvtu8_32(__m128i x) {
    uint8_t b[16];
    E512 r;
    memcpy(b, &x, 16);
    for (int i = 0; i < 16; i++) r.d[i] = b[i];
    return r;
}
#define _mm512_cvtepu8_epi32 e_cvtu8_32
EI E512 e_cvtu8_16(__m256i x) {
    uint8_t b[32];
    E512 r;
    memcpy(b, &x, 32);
    for (int i = 0; i < 32; i++) r.w[i] = b[i];
    return r;
}
#define _mm512_cvtepu8_epi16 e_cvtu8_16
EI E512 e_addf(E512 a, E512 b) {
    for (int i = 0; i < 16; i++) a.f[i] += b.f[i];
    return a;
}
#define _mm512_add_ps e_addf
EI E512 e_cvti8_32(__m128i x) {
    int8_t b[16];
    E512 r;
    memcpy(b, &x, 16);
    for (int i = 0; i < 16; i++) r.d[i] = b[i];
    return r;
}
#define _mm512_cvtepi8_epi32 e_cvti8_32
EI E512 e_shuf128(E512 a, E512 b, int imm) {
    E512 r;
    for (int l = 0; l < 4; l++)
        memcpy(r.b + 16 * l, (l < 2 ? a.b : b.b) + 16 * ((imm >> (2 * l)) & 3), 16);
    return r;
}
#define _mm512_shuffle_i32x4 e_shuf128
/* used by the decode kernels (k45_dec_micro, q80_dec_micro, mxfp4_dec_micro) */
EI E512 e_cvtph(__m256i x) {
    uint16_t h[16];
    E512 r;
    memcpy(h, &x, 32);
    for (int i = 0; i < 16; i++) r.f[i] = _cvtsh_ss(h[i]);
    return r;
}
#define _mm512_cvtph_ps e_cvtph
EI E512 e_permps(E512 idx, E512 a) {
    E512 r;
    for (int i = 0; i < 16; i++) r.f[i] = a.f[idx.d[i] & 15];
    return r;
}
#define _mm512_permutexvar_ps e_permps
EI E512 e_p2vps(E512 a, E512 idx, E512 b) {
    E512 r;
    for (int i = 0; i < 16; i++) {
        int j = idx.d[i] & 31;
        r.f[i] = j < 16 ? a.f[j] : b.f[j - 16];
    }
    return r;
}
#define _mm512_permutex2var_ps e_p2vps
EI E512 e_c128(__m128i x) {
    E512 r = e_zero();
    memcpy(r.b, &x, 16);
    return r;
}
#define _mm512_castsi128_si512 e_c128
EI E512 e_same(E512 a) {
    return a;
}
#define _mm512_castsi512_ps e_same
EI __m256i e_ext8(E512 a, int i) {
    __m256i r;
    memcpy(&r, a.b + 32 * i, 32);
    return r;
}
#define _mm512_extracti64x4_epi64 e_ext8
#define _mm512_castsi512_si256(a) e_ext8(a, 0)
EI E512 e_slli32(E512 a, unsigned n) {
    for (int i = 0; i < 16; i++) a.d[i] = n > 31 ? 0 : (int32_t)((uint32_t)a.d[i] << n);
    return a;
}
#define _mm512_slli_epi32 e_slli32
EI E512 e_sllv32(E512 a, E512 c) {
    for (int i = 0; i < 16; i++)
        a.d[i] = (uint32_t)c.d[i] > 31 ? 0 : (int32_t)((uint32_t)a.d[i] << c.d[i]);
    return a;
}
#define _mm512_sllv_epi32 e_sllv32
EI E512 e_blend32(__mmask16 k, E512 a, E512 b) {
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) a.d[i] = b.d[i];
    return a;
}
#define _mm512_mask_blend_epi32 e_blend32
EI __mmask16 e_cmpltu32(E512 a, E512 b) {
    __mmask16 k = 0;
    for (int i = 0; i < 16; i++)
        if ((uint32_t)a.d[i] < (uint32_t)b.d[i]) k |= (__mmask16)(1u << i);
    return k;
}
#define _mm512_cmplt_epu32_mask e_cmpltu32
EI E512 e_maskmov8(E512 src, __mmask64 k, E512 a) {
    for (int i = 0; i < 64; i++)
        if ((k >> i) & 1) src.b[i] = a.b[i];
    return src;
}
#define _mm512_mask_mov_epi8 e_maskmov8
EI int16_t e_sat16(int32_t v) {
    return (int16_t)(v > 32767 ? 32767 : v < -32768 ? -32768 : v);
}
EI E512 e_packs32(E512 a, E512 b) {
    E512 r;
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 4; i++) {
            r.w[8 * l + i] = e_sat16(a.d[4 * l + i]);
            r.w[8 * l + 4 + i] = e_sat16(b.d[4 * l + i]);
        }
    return r;
}
#define _mm512_packs_epi32 e_packs32
EI E512 e_shuf32(E512 a, int imm) {
    E512 r;
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 4; i++) r.d[4 * l + i] = a.d[4 * l + ((imm >> (2 * i)) & 3)];
    return r;
}
#define _mm512_shuffle_epi32 e_shuf32
/* AMX: tiles as arrays, config from the 64-byte block */
/* weak: one tile state shared by every emulated file (the kernels share cpu_amx_configure) */
__attribute__((weak)) uint8_t e_tile[8][1024];
__attribute__((weak)) int e_rows[8], e_colsb[8];
#undef _tile_loadconfig
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbssd
#undef _tile_release
#undef _tile_dpbf16ps
EI void e_tcfg(const void *c) {
    const uint8_t *p = c;
    for (int t = 0; t < 8; t++) {
        e_rows[t] = p[48 + t];
        e_colsb[t] = p[16 + 2 * t] | p[17 + 2 * t] << 8;
    }
}
#define _tile_loadconfig e_tcfg
#define _tile_loadd(t, base, stride)                                                               \
    do {                                                                                           \
        for (int r_ = 0; r_ < e_rows[t]; r_++)                                                     \
            memcpy(e_tile[t] + 64 * r_, (const char *)(base) + (long)(stride)*r_, e_colsb[t]);     \
    } while (0)
#define _tile_stored(t, base, stride)                                                              \
    do {                                                                                           \
        for (int r_ = 0; r_ < e_rows[t]; r_++)                                                     \
            memcpy((char *)(base) + (long)(stride)*r_, e_tile[t] + 64 * r_, e_colsb[t]);           \
    } while (0)
#define _tile_zero(t)   memset(e_tile[t], 0, 1024)
#define _tile_release() ((void)0)
#define _tile_dpbssd(c, a, b)                                                                      \
    do {                                                                                           \
        int32_t *C_ = (int32_t *)e_tile[c];                                                        \
        const int8_t *A_ = (const int8_t *)e_tile[a], *B_ = (const int8_t *)e_tile[b];             \
        for (int m_ = 0; m_ < e_rows[a]; m_++)                                                     \
            for (int n_ = 0; n_ < e_colsb[c] / 4; n_++)                                            \
                for (int k_ = 0; k_ < e_colsb[a] / 4; k_++)                                        \
                    for (int e_ = 0; e_ < 4; e_++)                                                 \
                        C_[16 * m_ + n_] += A_[64 * m_ + 4 * k_ + e_] * B_[64 * k_ + 4 * n_ + e_]; \
    } while (0)
cpu_gemm_fn emu_avx512_get(tm_type wtype);
#define _tile_dpbf16ps(c, a, b)                                                                    \
    do {                                                                                           \
        float *C_ = (float *)e_tile[c];                                                            \
        const uint16_t *A_ = (const uint16_t *)e_tile[a], *B_ = (const uint16_t *)e_tile[b];       \
        for (int m_ = 0; m_ < e_rows[a]; m_++)                                                     \
            for (int n_ = 0; n_ < e_colsb[c] / 4; n_++)                                            \
                for (int k_ = 0; k_ < e_colsb[a] / 4; k_++)                                        \
                    C_[16 * m_ + n_] +=                                                            \
                        e_bf16f(A_[32 * m_ + 2 * k_]) * e_bf16f(B_[32 * k_ + 2 * n_]) +            \
                        e_bf16f(A_[32 * m_ + 2 * k_ + 1]) * e_bf16f(B_[32 * k_ + 2 * n_ + 1]);     \
    } while (0)
/* the low-bit kernels (cpu_gemm_lowbit_avx512.c, cpu_gemm_iq_avx512.c) */
EI E512 e_setq(long long a7, long long a6, long long a5, long long a4, long long a3, long long a2,
               long long a1, long long a0) {
    return e_setrq(a0, a1, a2, a3, a4, a5, a6, a7);
}
#define _mm512_set_epi64 e_setq
EI E512 e_s1q(long long v) {
    return e_setrq(v, v, v, v, v, v, v, v);
}
#define _mm512_set1_epi64 e_s1q
EI E512 e_add8(E512 a, E512 b) {
    for (int i = 0; i < 64; i++) a.b[i] = (int8_t)(a.b[i] + b.b[i]);
    return a;
}
#define _mm512_add_epi8 e_add8
EI E512 e_sub8(E512 a, E512 b) { /* vpsubb: wraps */
    for (int i = 0; i < 64; i++) a.b[i] = (int8_t)(a.b[i] - b.b[i]);
    return a;
}
#define _mm512_sub_epi8 e_sub8
EI E512 e_masksub8(E512 src, __mmask64 k, E512 a, E512 b) {
    for (int i = 0; i < 64; i++) b.b[i] = (int8_t)-b.b[i];
    return e_maskadd8(src, k, a, b);
}
#define _mm512_mask_sub_epi8 e_masksub8
EI E512 e_blend8(__mmask64 k, E512 a, E512 b) {
    return e_maskmov8(a, k, b);
}
#define _mm512_mask_blend_epi8 e_blend8
EI __mmask64 e_movepi8(E512 a) {
    __mmask64 k = 0;
    for (int i = 0; i < 64; i++)
        if (a.b[i] < 0) k |= (__mmask64)1 << i;
    return k;
}
#define _mm512_movepi8_mask e_movepi8
EI E512 e_abs8(E512 a) { /* -128 stays -128 (0x80 as unsigned: 128) */
    for (int i = 0; i < 64; i++) a.b[i] = (int8_t)(a.b[i] < 0 ? -a.b[i] : a.b[i]);
    return a;
}
#define _mm512_abs_epi8 e_abs8
EI E512 e_slli16(E512 a, unsigned n) {
    for (int i = 0; i < 32; i++) a.w[i] = n > 15 ? 0 : (int16_t)((uint16_t)a.w[i] << n);
    return a;
}
#define _mm512_slli_epi16      e_slli16
#define _mm512_zextsi256_si512 e_c256
