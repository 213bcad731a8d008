/* The low-bit types' weights for the AMX-INT8 kernel (cpu_gemm_amx.c): a row
 * unpacked to signed int8 values in the activations' order, and per sub-block
 * of 16, 32 or 256 values (cpu_amx_lowbit_width: one scaling each) the float
 * factors sv (the sub-block's scale) and, for types with a min, mv, so that
 *   weight i = sv[sub] * value_i - mv[sub] (q2_K: - mv[sub] * m_j)
 * and the kernel's sub-block sum is C * sv * d_x - mv * bsum * d_x. The values
 * come from the AVX-512/AVX2 kernels' own unpackers (cpu_gemm_lowbit.h,
 * cpu_gemm_iq.h), moved from their unsigned forms to signed ones:
 *   q2_K sc_j q (0..45), a block's scale d, min dmin with the int16 m_j apart
 *   q3_K -sc_j (q - 4) (-128..124: sc_j (q - 4) reaches 128), scale -d
 *   tq1_0 / tq2_0 code - 1, scale d (a block)
 *   iq4_xs / iq4_nl the non-linear values, 32 a scale (d sc_j / d)
 *   q4_1 / q5_1 q (0..15 / 0..31), scale d, min -m (the min adds)
 *   q5_0 q - 16
 *   iq2 / iq3 grid magnitudes with their signs, iq1 8 g + delta (-9..9), and
 *   the scale (c d) (2 s + 1) per 16 values (32 where the format has one
 *   multiplier per 32: iq2_xxs, iq3_xxs, iq3_s, iq1_s).
 * The other types' integer multipliers stay out of the int8 values, where
 * value times multiplier would overflow int8 (iq3: 62 * 31, iq4_xs: 127 * 32). */
#include "cpu/cpu_internal.h"

#if defined(__x86_64__)
#include "cpu/cpu_gemm_iq.h"
#include "cpu/cpu_gemm_lowbit.h"

#define AL_INLINE TM_AVX2 static inline __attribute__((always_inline))

/* Byte i of the result is byte i / 8 of m (each of the 4 bytes to 8 lanes). */
AL_INLINE __m256i al_spread(uint32_t m) {
    const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                         2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    return _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), idx);
}

/* -1 in byte i where bit i of m is set, else 1 (a sign for vpsignb). */
AL_INLINE __m256i al_signs(uint32_t m) {
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(al_spread(m), bits), bits);
    return _mm256_or_si256(neg, _mm256_set1_epi8(1));
}

/* q2_K q3_K iq4_xs tq1_0 tq2_0 (256-value blocks). */
AL_INLINE void al_lowbit256(int kind, int64_t nb, const uint8_t *row, uint8_t *dst, float *sv,
                            float *mv, int32_t *mp) {
    const size_t bsize = lb_block_bytes(kind);
    const __m256i off = _mm256_set1_epi8(kind == LB_Q3_K                        ? 4
                                         : kind == LB_TQ1_0 || kind == LB_TQ2_0 ? 1
                                                                                : 0);
    for (int64_t b = 0; b < nb; b++) {
        lb_row w;
        lb_row_load(kind, row + (size_t)b * bsize, &w);
        for (int c = 0; c < 8; c++) {
            __m256i v = _mm256_sub_epi8(lb_chunk(kind, &w, c), off);
            if (kind == LB_Q3_K || kind == LB_Q2_K) { /* sc_j q (q3_K -sc_j q), in int16 */
                const int neg = kind == LB_Q3_K ? -1 : 1;
                const __m256i lo =
                    _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                                       _mm256_set1_epi16((short)(neg * w.sc[2 * c])));
                const __m256i hi =
                    _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                                       _mm256_set1_epi16((short)(neg * w.sc[2 * c + 1])));
                v = _mm256_permute4x64_epi64(_mm256_packs_epi16(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
            }
            _mm256_storeu_si256((__m256i *)(dst + 256 * b + 32 * c), v);
        }
        if (kind == LB_Q2_K) { /* the 16 int16 mins as 8 pairs */
            int32_t pairs[8];
            _mm256_storeu_si256((__m256i *)pairs, w.aux);
            for (int p = 0; p < 8; p++) mp[16 * (8 * b + p)] = pairs[p];
            sv[16 * b] = w.d;
            mv[16 * b] = w.dmin;
        } else if (kind == LB_IQ4_XS) {
            for (int j = 0; j < 8; j++) sv[16 * (8 * b + j)] = w.d * (float)w.sc[j];
        } else { /* q3_K (its scales in the values, negated), tq1_0, tq2_0: one a block */
            sv[16 * b] = kind == LB_Q3_K ? -w.d : w.d;
        }
    }
}

/* q4_1 q5_0 q5_1 iq4_nl (32-value blocks). */
AL_INLINE void al_lowbit32(int kind, int64_t nb, const uint8_t *row, uint8_t *dst, float *sv,
                           float *mv) {
    const size_t bsize = lb_block_bytes(kind);
    for (int64_t b = 0; b < nb; b++) {
        float d, m;
        __m256i v = lb32_load(kind, row + (size_t)b * bsize, &d, &m);
        if (kind == LB_Q5_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
        _mm256_storeu_si256((__m256i *)(dst + 32 * b), v);
        sv[16 * b] = d;
        mv[16 * b] = -m;
    }
}

/* The grid i-quants. */
AL_INLINE void al_iq(tm_type t, int width, int64_t nb, const uint8_t *row, uint8_t *dst,
                     float *sv) {
    const size_t bsize = iq_block_bytes(t);
    const int iq1 = t == TM_TYPE_IQ1_S || t == TM_TYPE_IQ1_M;
    for (int64_t b = 0; b < nb; b++) {
        const void *blk = row + (size_t)b * bsize;
        uint16_t idx[64];
        if (t != TM_TYPE_IQ2_XXS && t != TM_TYPE_IQ3_XXS) iq_block_idx(t, blk, idx);
        uint32_t sg[8]; /* iq2/iq3: a group's 32 sign bits; iq1: its 4 runs' delta bytes */
        _mm256_storeu_si256((__m256i *)sg, iq1 ? iq1_block_delta(t, blk) : iq_block_signs(t, blk));
        int16_t m[16];
        _mm256_storeu_si256((__m256i *)m, iq_block_mults(t, blk));
        const float dc = iq_block_scale(t, blk);
        for (int g = 0; g < 8; g++) {
            __m256i v = iq_group_grid(t, blk, idx, g);
            v = iq1 ? _mm256_sub_epi8(_mm256_sub_epi8(v, al_spread(sg[g])), _mm256_set1_epi8(9))
                    : _mm256_sign_epi8(v, al_signs(sg[g]));
            _mm256_storeu_si256((__m256i *)(dst + 256 * b + 32 * g), v);
        }
        if (width == 16)
            for (int j = 0; j < 16; j++) sv[16 * (16 * b + j)] = dc * (float)m[j];
        else
            for (int j = 0; j < 8; j++) sv[16 * (8 * b + j)] = dc * (float)m[2 * j];
    }
}

int cpu_amx_lowbit_width(tm_type t) {
    switch (t) {
    case TM_TYPE_Q2_K:
    case TM_TYPE_Q3_K:
    case TM_TYPE_TQ1_0:
    case TM_TYPE_TQ2_0:
        return 256;
    case TM_TYPE_IQ2_XS:
    case TM_TYPE_IQ2_S:
    case TM_TYPE_IQ1_M:
        return 16;
    case TM_TYPE_IQ4_XS:
    case TM_TYPE_Q4_1:
    case TM_TYPE_Q5_0:
    case TM_TYPE_Q5_1:
    case TM_TYPE_IQ4_NL:
    case TM_TYPE_IQ2_XXS:
    case TM_TYPE_IQ3_XXS:
    case TM_TYPE_IQ3_S:
    case TM_TYPE_IQ1_S:
        return 32;
    default:
        return 0;
    }
}

bool cpu_amx_lowbit_has_min(tm_type t) {
    return t == TM_TYPE_Q4_1 || t == TM_TYPE_Q5_1;
}

bool cpu_amx_lowbit_pair_mins(tm_type t) {
    return t == TM_TYPE_Q2_K;
}

/* The lb_ kinds of cpu_gemm_lowbit.h by type: 256-value and 32-value blocks. */
#define AL_LB256(X)                                                                                \
    X(TM_TYPE_Q2_K, LB_Q2_K)                                                                       \
    X(TM_TYPE_Q3_K, LB_Q3_K)                                                                       \
    X(TM_TYPE_IQ4_XS, LB_IQ4_XS) X(TM_TYPE_TQ1_0, LB_TQ1_0) X(TM_TYPE_TQ2_0, LB_TQ2_0)
#define AL_LB32(X)                                                                                 \
    X(TM_TYPE_Q4_1, LB_Q4_1)                                                                       \
    X(TM_TYPE_Q5_0, LB_Q5_0) X(TM_TYPE_Q5_1, LB_Q5_1) X(TM_TYPE_IQ4_NL, LB_IQ4_NL)
#define AL_CASE256(type, kind)                                                                     \
    case type:                                                                                     \
        al_lowbit256(kind, k / TM_QK_K, row, dst, sv, mv, mp);                                     \
        break;
#define AL_CASE32(type, kind)                                                                      \
    case type:                                                                                     \
        al_lowbit32(kind, k / 32, row, dst, sv, mv);                                               \
        break;
#define AL_CASE_IQ(name, type)                                                                     \
    case type:                                                                                     \
        al_iq(type, cpu_amx_lowbit_width(type), k / TM_QK_K, row, dst, sv);                        \
        break;

/* Each case inlines its unpacker with a constant kind, so the kind's branches fold. */
TM_AVX2 void cpu_amx_lowbit_unpack(tm_type t, int64_t k, const void *rowv, uint8_t *dst, float *sv,
                                   float *mv, int32_t *mp) {
    const uint8_t *row = rowv;
    switch (t) {
        AL_LB256(AL_CASE256)
        AL_LB32(AL_CASE32)
        IQ_TYPES(AL_CASE_IQ)
    default:
        break;
    }
}
#else
int cpu_amx_lowbit_width(tm_type t) {
    (void)t;
    return 0;
}
bool cpu_amx_lowbit_has_min(tm_type t) {
    (void)t;
    return false;
}
bool cpu_amx_lowbit_pair_mins(tm_type t) {
    (void)t;
    return false;
}
void cpu_amx_lowbit_unpack(tm_type t, int64_t k, const void *row, uint8_t *dst, float *sv,
                           float *mv, int32_t *mp) {
    (void)t, (void)k, (void)row, (void)dst, (void)sv, (void)mv, (void)mp;
}
#endif
