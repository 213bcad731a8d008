/* Activation quantization for the integer dot products.
 *
 * q8_K (partner of q4_K/q5_K/q6_K/q2_K/q3_K/iq4_xs/tq1_0/tq2_0 and the grid i-quants
 *   iq2_xxs ... iq1_m): per 256 values d = amax/127 (f32),
 *   q = round_half_even(x * (127/amax)), bsums[j] = sum of q[16j..16j+15].
 * q8_0 (partner of q8_0/q4_0/mxfp4/q4_1/q5_0/q5_1/iq4_nl): per 32 values d = amax/127, stored as
 *   f16; q = round_half_even(x * (1/d)) with d before f16 rounding.
 * f32 (partner of f32/f16/bf16): a copy.
 * The SIMD versions compute the same float expressions in the same order
 * (amax is order-free; the conversions round to nearest even like
 * nearbyintf), so every level produces identical bytes; the tests check it. */
#include <math.h>
#include <string.h>

#include "core/log.h"
#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TM_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#endif

static inline int8_t act_round(float v) {
    float r = nearbyintf(v);
    if (r > 127.f) r = 127.f;
    if (r < -127.f) r = -127.f;
    return (int8_t)r;
}

void cpu_act_ref_q8_k(const float *x, void *xq, int64_t k) {
    tm_block_q8_k *y = xq;
    for (int64_t b = 0; b < k / TM_QK_K; b++, x += TM_QK_K) {
        float amax = 0;
        for (int i = 0; i < TM_QK_K; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.f, id = amax > 0 ? 127.f / amax : 0.f;
        y[b].d = d;
        for (int i = 0; i < TM_QK_K; i++) y[b].qs[i] = act_round(x[i] * id);
        for (int j = 0; j < TM_QK_K / 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += y[b].qs[16 * j + i];
            y[b].bsums[j] = (int16_t)s;
        }
    }
}

void cpu_act_ref_q8_0(const float *x, void *xq, int64_t k) {
    tm_block_q8_0 *y = xq;
    for (int64_t b = 0; b < k / TM_QK8_0; b++, x += TM_QK8_0) {
        float amax = 0;
        for (int i = 0; i < TM_QK8_0; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
        y[b].d = quant_f32_to_f16(d);
        for (int i = 0; i < TM_QK8_0; i++) y[b].qs[i] = act_round(x[i] * id);
    }
}

static void act_f32(const float *x, void *xq, int64_t k) {
    memcpy(xq, x, (size_t)k * sizeof(float));
}

#if defined(__x86_64__)
/* 32 floats times id, rounded, to 32 int8 (the q8_0 block, or 1/8 of q8_K). */
TM_AVX2 static inline void act_avx2_q32(const float *x, __m256 id, int8_t *out) {
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 0), id));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    __m256i s01 = _mm256_packs_epi32(i0, i1), s23 = _mm256_packs_epi32(i2, i3);
    __m256i b = _mm256_packs_epi16(s01, s23);
    /* packs works per 128-bit lane: dwords come out as 0 2 4 6 1 3 5 7 */
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m256i lim = _mm256_set1_epi8(127);
    b = _mm256_max_epi8(_mm256_min_epi8(b, lim), _mm256_sub_epi8(_mm256_setzero_si256(), lim));
    _mm256_storeu_si256((__m256i *)out, b);
}

TM_AVX2 static inline float act_avx2_amax(const float *x, int n) {
    const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8)
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), mask));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

TM_AVX2 static void act_avx2_q8_k(const float *x, void *xq, int64_t k) {
    tm_block_q8_k *y = xq;
    for (int64_t b = 0; b < k / TM_QK_K; b++, x += TM_QK_K) {
        float amax = act_avx2_amax(x, TM_QK_K);
        float d = amax / 127.f, id = amax > 0 ? 127.f / amax : 0.f;
        y[b].d = d;
        __m256 vid = _mm256_set1_ps(id);
        for (int i = 0; i < TM_QK_K; i += 32) act_avx2_q32(x + i, vid, y[b].qs + i);
        const __m256i ones = _mm256_set1_epi16(1);
        for (int j = 0; j < TM_QK_K; j += 32) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(y[b].qs + j));
            __m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
            __m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
            /* madd: 8 pair sums per group; hadd twice leaves, per 128-bit lane, the
             * sums of 4 pairs: t[0], t[4] for the first group, t[1], t[5] for the second */
            __m256i s = _mm256_hadd_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
            s = _mm256_hadd_epi32(s, s);
            int32_t t[8];
            _mm256_storeu_si256((__m256i *)t, s);
            y[b].bsums[j / 16 + 0] = (int16_t)(t[0] + t[4]);
            y[b].bsums[j / 16 + 1] = (int16_t)(t[1] + t[5]);
        }
    }
}

TM_AVX2 static void act_avx2_q8_0(const float *x, void *xq, int64_t k) {
    tm_block_q8_0 *y = xq;
    for (int64_t b = 0; b < k / TM_QK8_0; b++, x += TM_QK8_0) {
        float amax = act_avx2_amax(x, TM_QK8_0);
        float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
        y[b].d = quant_f32_to_f16(d);
        act_avx2_q32(x, _mm256_set1_ps(id), y[b].qs);
    }
}

TM_AVX512 static inline float act_avx512_amax(const float *x, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    return _mm512_reduce_max_ps(m);
}

/* 16 floats times id to 16 int8 (cvtsepi32 saturates; the clamp keeps -128 out). */
TM_AVX512 static inline __m128i act_avx512_q16(const float *x, __m512 id) {
    __m512i i = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), id));
    i = _mm512_max_epi32(_mm512_min_epi32(i, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    return _mm512_cvtepi32_epi8(i);
}

TM_AVX512 static void act_avx512_q8_k(const float *x, void *xq, int64_t k) {
    tm_block_q8_k *y = xq;
    for (int64_t b = 0; b < k / TM_QK_K; b++, x += TM_QK_K) {
        float amax = act_avx512_amax(x, TM_QK_K);
        float d = amax / 127.f, id = amax > 0 ? 127.f / amax : 0.f;
        y[b].d = d;
        __m512 vid = _mm512_set1_ps(id);
        for (int j = 0; j < TM_QK_K / 16; j++) {
            __m128i q = act_avx512_q16(x + 16 * j, vid);
            _mm_storeu_si128((__m128i *)(y[b].qs + 16 * j), q);
            y[b].bsums[j] = (int16_t)_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q));
        }
    }
}

TM_AVX512 static void act_avx512_q8_0(const float *x, void *xq, int64_t k) {
    tm_block_q8_0 *y = xq;
    for (int64_t b = 0; b < k / TM_QK8_0; b++, x += TM_QK8_0) {
        float amax = act_avx512_amax(x, TM_QK8_0);
        float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
        y[b].d = quant_f32_to_f16(d);
        __m512 vid = _mm512_set1_ps(id);
        _mm_storeu_si128((__m128i *)(y[b].qs + 0), act_avx512_q16(x, vid));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), act_avx512_q16(x + 16, vid));
    }
}
#endif

cpu_act_fn cpu_act_get(tm_type act_type, tm_cpu_level level) {
    switch (act_type) {
    case TM_TYPE_F32:
        return act_f32;
    case TM_TYPE_Q8_K:
#if defined(__x86_64__)
        if (level >= TM_CPU_AVX512) return act_avx512_q8_k;
        if (level >= TM_CPU_AVX2) return act_avx2_q8_k;
#endif
        return cpu_act_ref_q8_k;
    case TM_TYPE_Q8_0:
#if defined(__x86_64__)
        if (level >= TM_CPU_AVX512) return act_avx512_q8_0;
        if (level >= TM_CPU_AVX2) return act_avx2_q8_0;
#endif
        return cpu_act_ref_q8_0;
    default:
        return NULL;
    }
}

tm_type cpu_act_type(tm_type wtype) {
    switch (wtype) {
    case TM_TYPE_Q4_K:
    case TM_TYPE_Q5_K:
    case TM_TYPE_Q6_K:
    case TM_TYPE_IQ2_XXS:
    case TM_TYPE_IQ2_XS:
    case TM_TYPE_IQ2_S:
    case TM_TYPE_IQ3_XXS:
    case TM_TYPE_IQ3_S:
    case TM_TYPE_IQ1_S:
    case TM_TYPE_IQ1_M:
    case TM_TYPE_Q2_K:
    case TM_TYPE_Q3_K:
    case TM_TYPE_IQ4_XS:
    case TM_TYPE_TQ1_0:
    case TM_TYPE_TQ2_0:
        return TM_TYPE_Q8_K;
    case TM_TYPE_Q8_0:
    case TM_TYPE_Q4_0:
    case TM_TYPE_MXFP4:
    case TM_TYPE_Q4_1: /* the min term m * d_x * sum(q_x) is summed in the kernels */
    case TM_TYPE_Q5_0:
    case TM_TYPE_Q5_1:
    case TM_TYPE_IQ4_NL:
        return TM_TYPE_Q8_0;
    case TM_TYPE_F32:
    case TM_TYPE_F16:
    case TM_TYPE_BF16:
        return TM_TYPE_F32;
    default:
        return TM_TYPE_COUNT;
    }
}

size_t cpu_act_row_size(tm_type wtype, int64_t k) {
    tm_type a = cpu_act_type(wtype);
    if (a == TM_TYPE_COUNT) return 0;
    return quant_row_size(a, k);
}

void cpu_act_quantize(tm_type wtype, const float *x, void *xq, int64_t k) {
    cpu_act_fn fn = cpu_act_get(cpu_act_type(wtype), cpu_level_get());
    TM_ASSERT(fn != NULL);
    fn(x, xq, k);
}
