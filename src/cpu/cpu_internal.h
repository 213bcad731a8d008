/* Internal to src/cpu: the kernel tables each ISA file fills, and helpers
 * shared by the kernel files. Not for use outside src/cpu. */
#ifndef TM_CPU_CPU_INTERNAL_H
#define TM_CPU_CPU_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "cpu/cpu.h"

/* y[t * ldy + r] = dot(W row r, xq row t) for r in [r0, r1), t in [0, n_tok). */
typedef void (*cpu_gemm_fn)(int64_t k, const void *w, size_t w_row_bytes, int64_t r0, int64_t r1,
                            const void *xq, size_t xq_row_bytes, int64_t n_tok, float *y,
                            int64_t ldy);
/* Quantize one row of k floats into the partner type of a weight type. */
typedef void (*cpu_act_fn)(const float *x, void *xq, int64_t k);

/* Kernel for wtype at one ISA level, or NULL where that file has none (the
 * dispatcher then falls back to the next lower level). */
cpu_gemm_fn cpu_gemm_ref_get(tm_type wtype);
cpu_gemm_fn cpu_gemm_avx2_get(tm_type wtype);
cpu_gemm_fn cpu_gemm_avx512_get(tm_type wtype);
cpu_gemm_fn cpu_gemm_amx_get(tm_type wtype);
/* The grid i-quants (iq2_xxs ... iq1_m), reached from the getters above. */
cpu_gemm_fn cpu_gemm_ref_iq_get(tm_type wtype);
cpu_gemm_fn cpu_gemm_iq_avx2_get(tm_type wtype);
cpu_gemm_fn cpu_gemm_iq_avx512_get(tm_type wtype);
/* The iq1 grid as the SIMD kernels' unsigned bytes 8 (g + 1) + 2 (cpu_gemm_iq_grid.c);
 * cpu_iq1_grid_init fills it once (the iq kernel getters call it). */
extern uint64_t cpu_iq1_grid_u[2048];
void cpu_iq1_grid_init(void);
/* The low-bit types q4_1 q5_0 q5_1 iq4_nl q2_K q3_K iq4_xs tq1_0 tq2_0, reached
 * from the getters above (cpu_gemm_ref_lowbit.c, cpu_gemm_lowbit_avx2.c,
 * cpu_gemm_lowbit_avx512.c); NULL for other types. */
cpu_gemm_fn cpu_gemm_ref_lowbit_get(tm_type wtype);
cpu_gemm_fn cpu_gemm_lowbit_avx2_get(tm_type wtype);
cpu_gemm_fn cpu_gemm_lowbit_avx512_get(tm_type wtype);
/* The AMX-BF16 kernel for q4_K/q5_K (NULL for other types, without AMX-BF16
 * and AVX512-BF16, or with TIERMOE_AMX_BF16=0); cpu_gemm_amx_get prefers it. */
cpu_gemm_fn cpu_gemm_amx_bf16_get(tm_type wtype);
/* The low-bit types' weights for the AMX-INT8 kernel (cpu_gemm_amx_lowbit.c): the
 * values per sub-block (16, 32 or 256; 0 for a type without an AMX kernel),
 * whether the type has a min of one factor a sub-block (mv times the sub-block's
 * activation sum) or, q2_K, one per 16 values (pair_mins), and a row of k
 * weights unpacked to signed int8 in dst with the factors of sub-block s in
 * sv[16 s] and mv[16 s] (mv: types with a min; q2_K's dmin), and for q2_K block
 * b's int16 mins m_2p | m_2p+1 << 16 in mp[16 (8 b + p)]. */
int cpu_amx_lowbit_width(tm_type t);
bool cpu_amx_lowbit_has_min(tm_type t);
bool cpu_amx_lowbit_pair_mins(tm_type t);
void cpu_amx_lowbit_unpack(tm_type t, int64_t k, const void *row, uint8_t *dst, float *sv,
                           float *mv, int32_t *mp);
/* Smallest n_tok for which the AMX kernel is worth its tile setup. */
int64_t cpu_gemm_amx_min_tokens(void);

/* Activation quantizers by partner type (TM_TYPE_Q8_K, TM_TYPE_Q8_0, TM_TYPE_F32). */
cpu_act_fn cpu_act_get(tm_type act_type, tm_cpu_level level);
void cpu_act_ref_q8_k(const float *x, void *xq, int64_t k);
void cpu_act_ref_q8_0(const float *x, void *xq, int64_t k);

/* The element-wise and attention ops may use AVX2, FMA and F16C (cpu_ops.c). */
bool cpu_ops_simd(void);

/* AMX palette 1: ldtilecfg's 64-byte block. cpu_amx_configure loads a
 * configuration of tiles 0-7 (rows, bytes per row) on this thread. */
typedef struct cpu_amx_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} cpu_amx_tilecfg;
void cpu_amx_configure(const uint8_t rows[8], const uint16_t colsb[8]);

/* Asks the kernel for AMX tile state (Linux arch_prctl); true when granted. */
bool cpu_amx_request(void);

/* ---- small helpers shared by the kernel files ---- */

/* q4_K / q5_K: 6-bit scale and min of sub-block j (ggml's get_scale_min_k4). */
static inline void cpu_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* All 8 scales then all 8 mins of a q4_K/q5_K block as bytes (ggml's utmp trick). */
static inline void cpu_k4_unpack_scales(const uint8_t *scales, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, scales, 12);
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = uaux;
    u[0] &= kmask1;
    /* now bytes 0..7 are the scales, 8..15 the mins */
    memcpy(out, u, 16);
}

#if defined(__x86_64__)
#include <immintrin.h>
/* AVX2 with FMA and F16C: the level every AVX2 kernel and op of src/cpu targets. */
#define TM_AVX2 __attribute__((target("avx2,fma,f16c")))

/* Sum of the 8 lanes: (v0 + v4 + v2 + v6) + (v1 + v5 + v3 + v7). */
TM_AVX2 static inline float cpu_hsum8_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp for x <= 0 (Cephes' polynomial, about 1 ulp); 0 below -87. */
TM_AVX2 static inline __m256 cpu_exp_neg_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_GE_OQ); /* also clears -inf and NaN */
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), zero_mask);
}

#endif

/* mxfp4: e2m1 codes doubled, and the E8M0 exponent halved to match. */
extern const int8_t cpu_mxfp4_values[16];
static inline float cpu_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
