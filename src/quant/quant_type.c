/* The type table: sizes for every ggml type id, functions for the compute types. */
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "quant/quant_ref.h"

static const tm_type_traits type_traits[TM_TYPE_COUNT] = {
    [TM_TYPE_F32] = {"f32", 1, 4, quant_ref_dequantize_f32, quant_ref_quantize_f32},
    [TM_TYPE_F16] = {"f16", 1, 2, quant_ref_dequantize_f16, quant_ref_quantize_f16},
    [TM_TYPE_Q4_0] = {"q4_0", 32, 18, quant_ref_dequantize_q4_0, quant_ref_quantize_q4_0},
    [TM_TYPE_Q4_1] = {"q4_1", 32, 20, quant_ref_dequantize_q4_1, quant_ref_quantize_q4_1},
    [TM_TYPE_Q5_0] = {"q5_0", 32, 22, quant_ref_dequantize_q5_0, quant_ref_quantize_q5_0},
    [TM_TYPE_Q5_1] = {"q5_1", 32, 24, quant_ref_dequantize_q5_1, quant_ref_quantize_q5_1},
    [TM_TYPE_Q8_0] = {"q8_0", 32, 34, quant_ref_dequantize_q8_0, quant_ref_quantize_q8_0},
    [TM_TYPE_Q8_1] = {"q8_1", 32, 40, NULL, NULL},
    [TM_TYPE_Q2_K] = {"q2_K", 256, 84, quant_ref_dequantize_q2_k, quant_ref_quantize_q2_k},
    [TM_TYPE_Q3_K] = {"q3_K", 256, 110, quant_ref_dequantize_q3_k, quant_ref_quantize_q3_k},
    [TM_TYPE_Q4_K] = {"q4_K", 256, 144, quant_ref_dequantize_q4_k, quant_ref_quantize_q4_k},
    [TM_TYPE_Q5_K] = {"q5_K", 256, 176, quant_ref_dequantize_q5_k, quant_ref_quantize_q5_k},
    [TM_TYPE_Q6_K] = {"q6_K", 256, 210, quant_ref_dequantize_q6_k, quant_ref_quantize_q6_k},
    [TM_TYPE_Q8_K] = {"q8_K", 256, 292, quant_ref_dequantize_q8_k, quant_ref_quantize_q8_k},
    [TM_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, quant_ref_dequantize_iq2_xxs,
                         quant_ref_quantize_iq2_xxs},
    [TM_TYPE_IQ2_XS] = {"iq2_xs", 256, 74, quant_ref_dequantize_iq2_xs, quant_ref_quantize_iq2_xs},
    [TM_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, quant_ref_dequantize_iq3_xxs,
                         quant_ref_quantize_iq3_xxs},
    [TM_TYPE_IQ1_S] = {"iq1_s", 256, 50, quant_ref_dequantize_iq1_s, quant_ref_quantize_iq1_s},
    [TM_TYPE_IQ4_NL] = {"iq4_nl", 32, 18, quant_ref_dequantize_iq4_nl, quant_ref_quantize_iq4_nl},
    [TM_TYPE_IQ3_S] = {"iq3_s", 256, 110, quant_ref_dequantize_iq3_s, quant_ref_quantize_iq3_s},
    [TM_TYPE_IQ2_S] = {"iq2_s", 256, 82, quant_ref_dequantize_iq2_s, quant_ref_quantize_iq2_s},
    [TM_TYPE_IQ4_XS] = {"iq4_xs", 256, 136, quant_ref_dequantize_iq4_xs, quant_ref_quantize_iq4_xs},
    [TM_TYPE_I8] = {"i8", 1, 1, NULL, NULL},
    [TM_TYPE_I16] = {"i16", 1, 2, NULL, NULL},
    [TM_TYPE_I32] = {"i32", 1, 4, NULL, NULL},
    [TM_TYPE_I64] = {"i64", 1, 8, NULL, NULL},
    [TM_TYPE_F64] = {"f64", 1, 8, NULL, NULL},
    [TM_TYPE_IQ1_M] = {"iq1_m", 256, 56, quant_ref_dequantize_iq1_m, quant_ref_quantize_iq1_m},
    [TM_TYPE_BF16] = {"bf16", 1, 2, quant_ref_dequantize_bf16, quant_ref_quantize_bf16},
    [TM_TYPE_TQ1_0] = {"tq1_0", 256, 54, quant_ref_dequantize_tq1_0, quant_ref_quantize_tq1_0},
    [TM_TYPE_TQ2_0] = {"tq2_0", 256, 66, quant_ref_dequantize_tq2_0, quant_ref_quantize_tq2_0},
    [TM_TYPE_MXFP4] = {"mxfp4", 32, 17, quant_ref_dequantize_mxfp4, quant_ref_quantize_mxfp4},
    [TM_TYPE_NVFP4] = {"nvfp4", 64, 36, NULL, NULL},
    [TM_TYPE_Q1_0] = {"q1_0", 128, 18, NULL, NULL},
};

const tm_type_traits *quant_type_traits(uint32_t t) {
    if (t >= TM_TYPE_COUNT || !type_traits[t].name) return NULL;
    return &type_traits[t];
}

const char *quant_type_name(uint32_t t) {
    const tm_type_traits *tr = quant_type_traits(t);
    return tr ? tr->name : "?";
}

tm_status quant_type_from_name(const char *name, tm_type *out) {
    for (uint32_t t = 0; t < TM_TYPE_COUNT; t++) {
        if (type_traits[t].name && !strcasecmp(type_traits[t].name, name)) {
            *out = (tm_type)t;
            return TM_OK;
        }
    }
    /* the list follows the table, so it names every type one can quantize to */
    char list[256] = "";
    size_t len = 0;
    for (uint32_t t = 0; t < TM_TYPE_COUNT && len < sizeof(list); t++) {
        if (!quant_type_is_compute(t) || t == TM_TYPE_Q8_K) continue; /* q8_K: activations only */
        int w =
            snprintf(list + len, sizeof(list) - len, "%s%s", len ? " " : "", type_traits[t].name);
        if (w > 0) len += (size_t)w;
    }
    return tm_error_set(TM_ERR_ARG, "unknown quant type '%s' (expected one of %s)", name, list);
}

static tm_status quant_row_check(tm_type t, int64_t n, int want_quantize) {
    const tm_type_traits *tr = quant_type_traits((uint32_t)t);
    if (!tr) return tm_error_set(TM_ERR_UNSUPPORTED, "unknown tensor type id %u", (unsigned)t);
    if (want_quantize ? !tr->quantize : !tr->dequantize)
        return tm_error_set(TM_ERR_UNSUPPORTED, "tensor type %s is not supported for %s", tr->name,
                            want_quantize ? "quantization" : "dequantization");
    if (n < 0 || n % tr->block_size)
        return tm_error_set(TM_ERR_ARG,
                            "row of %lld values is not a multiple of %s's block size %lld",
                            (long long)n, tr->name, (long long)tr->block_size);
    return TM_OK;
}

tm_status quant_row_dequantize(tm_type t, const void *src, float *dst, int64_t n) {
    tm_status st = quant_row_check(t, n, 0);
    if (st == TM_OK) quant_type_traits((uint32_t)t)->dequantize(src, dst, n);
    return st;
}

tm_status quant_row_quantize(tm_type t, const float *src, void *dst, int64_t n) {
    tm_status st = quant_row_check(t, n, 1);
    if (st == TM_OK) quant_type_traits((uint32_t)t)->quantize(src, dst, n);
    return st;
}

/* ---- scalar conversions ----
 * Exact IEEE conversions, round to nearest even, checked exhaustively by
 * tests/test_quant.c and against numpy by the oracle test. NaNs: f16 -> f32
 * keeps the payload bits as they are (as numpy does); f32 -> f16 and
 * f32 -> bf16 return a quiet NaN with the payload's top bits (as x86's F16C
 * conversion and ggml's bf16 conversion do; numpy keeps signalling NaNs). */

float quant_f16_to_f32(tm_half h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf / nan */
    } else if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

tm_half quant_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan (keep nan quiet) */
        return (tm_half)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 | ((absx >> 13) & 0x3ff) : 0));
    if (absx >= 0x477ff000u) return (tm_half)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (absx < 0x38800000u) {                                 /* below the smallest normal */
        if (absx < 0x33000000u) return (tm_half)sign;         /* rounds to zero */
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (tm_half)(sign | r);
    }
    uint32_t r = absx - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t out = r >> 13, rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (out & 1))) out++;
    return (tm_half)(sign | out);
}

float quant_bf16_to_f32(tm_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

tm_bf16 quant_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (tm_bf16)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);                                           /* nearest even */
    return (tm_bf16)(x >> 16);
}
