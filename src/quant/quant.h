/* Quantized block types, bit-compatible with ggml's on-disk layouts.
 *
 * A tensor row of n values of type t is n / block_size(t) consecutive blocks
 * of type_size(t) bytes. Type ids are ggml's and append-only (they are stored
 * in GGUF files). Every id a GGUF file may carry has a size entry, so the
 * reader can validate any file; the types below marked "compute" can be
 * dequantized, quantized and used by the kernels, and every type with a
 * dequantizer in the table (quant_type.c) can be read (quant_row_dequantize).
 *
 * The block structs are shared by C and CUDA, so this header sticks to the
 * common subset and checks sizes at compile time. */
#ifndef TM_QUANT_QUANT_H
#define TM_QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#define TM_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define TM_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

typedef enum tm_type {
    TM_TYPE_F32 = 0,  /* compute */
    TM_TYPE_F16 = 1,  /* compute */
    TM_TYPE_Q4_0 = 2, /* compute */
    TM_TYPE_Q4_1 = 3,
    TM_TYPE_Q5_0 = 6,
    TM_TYPE_Q5_1 = 7,
    TM_TYPE_Q8_0 = 8, /* compute */
    TM_TYPE_Q8_1 = 9,
    TM_TYPE_Q2_K = 10,
    TM_TYPE_Q3_K = 11,
    TM_TYPE_Q4_K = 12, /* compute */
    TM_TYPE_Q5_K = 13, /* compute */
    TM_TYPE_Q6_K = 14, /* compute */
    TM_TYPE_Q8_K = 15, /* activations only: the partner of the K-quant dot products */
    TM_TYPE_IQ2_XXS = 16,
    TM_TYPE_IQ2_XS = 17,
    TM_TYPE_IQ3_XXS = 18,
    TM_TYPE_IQ1_S = 19,
    TM_TYPE_IQ4_NL = 20,
    TM_TYPE_IQ3_S = 21,
    TM_TYPE_IQ2_S = 22,
    TM_TYPE_IQ4_XS = 23,
    TM_TYPE_I8 = 24,
    TM_TYPE_I16 = 25,
    TM_TYPE_I32 = 26,
    TM_TYPE_I64 = 27,
    TM_TYPE_F64 = 28,
    TM_TYPE_IQ1_M = 29,
    TM_TYPE_BF16 = 30, /* compute */
    TM_TYPE_TQ1_0 = 34,
    TM_TYPE_TQ2_0 = 35,
    TM_TYPE_MXFP4 = 39, /* compute */
    TM_TYPE_NVFP4 = 40,
    TM_TYPE_Q1_0 = 41,
    TM_TYPE_COUNT = 42,
} tm_type;

#define TM_QK4_0        32
#define TM_QK8_0        32
#define TM_QK_K         256
#define TM_QK_MXFP4     32
#define TM_K_SCALE_SIZE 12

typedef uint16_t tm_half; /* IEEE binary16 bits */
typedef uint16_t tm_bf16; /* bfloat16 bits */

typedef struct tm_block_q4_0 {
    tm_half d;
    uint8_t qs[TM_QK4_0 / 2]; /* low nibbles: values 0..15, high nibbles: 16..31 */
} tm_block_q4_0;

typedef struct tm_block_q8_0 {
    tm_half d;
    int8_t qs[TM_QK8_0];
} tm_block_q8_0;

/* 8 sub-blocks of 32 with 6-bit scales and mins packed in `scales`. */
typedef struct tm_block_q4_k {
    tm_half d;
    tm_half dmin;
    uint8_t scales[TM_K_SCALE_SIZE];
    uint8_t qs[TM_QK_K / 2];
} tm_block_q4_k;

typedef struct tm_block_q5_k {
    tm_half d;
    tm_half dmin;
    uint8_t scales[TM_K_SCALE_SIZE];
    uint8_t qh[TM_QK_K / 8];
    uint8_t qs[TM_QK_K / 2];
} tm_block_q5_k;

/* 16 sub-blocks of 16 with 8-bit scales. */
typedef struct tm_block_q6_k {
    uint8_t ql[TM_QK_K / 2];
    uint8_t qh[TM_QK_K / 4];
    int8_t scales[TM_QK_K / 16];
    tm_half d;
} tm_block_q6_k;

/* Activations for K-quant dot products: f32 scale, 256 int8, sums per 16. */
typedef struct tm_block_q8_k {
    float d;
    int8_t qs[TM_QK_K];
    int16_t bsums[TM_QK_K / 16];
} tm_block_q8_k;

/* OCP microscaling FP4: one E8M0 exponent, 32 E2M1 values (low nibbles first). */
typedef struct tm_block_mxfp4 {
    uint8_t e;
    uint8_t qs[TM_QK_MXFP4 / 2];
} tm_block_mxfp4;

/* ---- the low-bit types (layouts of the GGUF format; grids in quant_grids.h) ---- */

/* Legacy 32-value blocks: q = d * n + m (q4_1, q5_1) or d * (n - 16) (q5_0); the
 * fifth bit of value i is bit i of qh (little-endian u32). */
typedef struct tm_block_q4_1 {
    tm_half d, m;
    uint8_t qs[TM_QK4_0 / 2];
} tm_block_q4_1;

typedef struct tm_block_q5_0 {
    tm_half d;
    uint8_t qh[4];
    uint8_t qs[TM_QK4_0 / 2];
} tm_block_q5_0;

typedef struct tm_block_q5_1 {
    tm_half d, m;
    uint8_t qh[4];
    uint8_t qs[TM_QK4_0 / 2];
} tm_block_q5_1;

/* 16 sub-blocks of 16: 4-bit scale (low nibble) and min (high nibble) each. */
typedef struct tm_block_q2_k {
    uint8_t scales[TM_QK_K / 16];
    uint8_t qs[TM_QK_K / 4];
    tm_half d, dmin;
} tm_block_q2_k;

/* 16 sub-blocks of 16 with 6-bit signed scales (offset 32) packed in 12 bytes;
 * the third bit of a value is set in hmask when the value is NOT offset by -4. */
typedef struct tm_block_q3_k {
    uint8_t hmask[TM_QK_K / 8];
    uint8_t qs[TM_QK_K / 4];
    uint8_t scales[12];
    tm_half d;
} tm_block_q3_k;

/* Non-linear 4-bit: codes index quant_iq4nl_values. */
typedef struct tm_block_iq4_nl {
    tm_half d;
    uint8_t qs[TM_QK4_0 / 2];
} tm_block_iq4_nl;

/* 8 sub-blocks of 32, 6-bit scales (offset 32): low 4 bits in scales_l, high 2 in scales_h. */
typedef struct tm_block_iq4_xs {
    tm_half d;
    uint16_t scales_h;
    uint8_t scales_l[TM_QK_K / 64];
    uint8_t qs[TM_QK_K / 2];
} tm_block_iq4_xs;

/* Per 32 values two u32: 4 grid indices (bytes of the first), 4 x 7 sign bits and a
 * 4-bit scale (top of the second). */
typedef struct tm_block_iq2_xxs {
    tm_half d;
    uint16_t qs[TM_QK_K / 8];
} tm_block_iq2_xxs;

/* qs: 9-bit grid index | 7 sign bits << 9, per 8 values; 4-bit scales per 16 values. */
typedef struct tm_block_iq2_xs {
    tm_half d;
    uint16_t qs[TM_QK_K / 8];
    uint8_t scales[TM_QK_K / 32];
} tm_block_iq2_xs;

/* qs[0..31]: low 8 bits of 10-bit grid indices, qs[32..63]: 8 sign bits per 8 values;
 * qh: the top 2 bits of 4 indices a byte; 4-bit scales per 16 values. */
typedef struct tm_block_iq2_s {
    tm_half d;
    uint8_t qs[TM_QK_K / 4];
    uint8_t qh[TM_QK_K / 32];
    uint8_t scales[TM_QK_K / 32];
} tm_block_iq2_s;

/* qs[0..63]: grid indices of 4 values; then per 32 values a u32 of 4 x 7 sign bits
 * and a 4-bit scale. */
typedef struct tm_block_iq3_xxs {
    tm_half d;
    uint8_t qs[3 * TM_QK_K / 8];
} tm_block_iq3_xxs;

/* 9-bit grid indices of 4 values (low 8 in qs, 9th in qh), 8 sign bits per 8 values,
 * 4-bit scales per 32 values. */
typedef struct tm_block_iq3_s {
    tm_half d;
    uint8_t qs[TM_QK_K / 4];
    uint8_t qh[TM_QK_K / 32];
    uint8_t signs[TM_QK_K / 8];
    uint8_t scales[TM_QK_K / 64];
} tm_block_iq3_s;

/* 11-bit indices into the ternary grid per 8 values (low 8 in qs); qh per 32 values:
 * the top 3 bits of 4 indices, a 3-bit scale (bits 12-14) and the delta sign (bit 15). */
typedef struct tm_block_iq1_s {
    tm_half d;
    uint8_t qs[TM_QK_K / 8];
    uint16_t qh[TM_QK_K / 32];
} tm_block_iq1_s;

/* As iq1_s without d: qh holds per 8 values the top 3 index bits and a delta sign
 * bit (a nibble each); scales holds 3-bit scales per 16 values and, in the top
 * nibbles of its four u16, the f16 block scale. */
typedef struct tm_block_iq1_m {
    uint8_t qs[TM_QK_K / 8];
    uint8_t qh[TM_QK_K / 16];
    uint8_t scales[TM_QK_K / 32];
} tm_block_iq1_m;

/* Ternary: 5 values a byte in base 3 (qs), 4 a byte (qh), then d. */
typedef struct tm_block_tq1_0 {
    uint8_t qs[(TM_QK_K - 4 * TM_QK_K / 64) / 5];
    uint8_t qh[TM_QK_K / 64];
    tm_half d;
} tm_block_tq1_0;

/* Ternary in 2 bits: code - 1. */
typedef struct tm_block_tq2_0 {
    uint8_t qs[TM_QK_K / 4];
    tm_half d;
} tm_block_tq2_0;

TM_STATIC_ASSERT(sizeof(tm_block_q4_0) == 18, "q4_0 block size");
TM_STATIC_ASSERT(sizeof(tm_block_q8_0) == 34, "q8_0 block size");
TM_STATIC_ASSERT(sizeof(tm_block_q4_k) == 144, "q4_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_q5_k) == 176, "q5_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_q6_k) == 210, "q6_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_q8_k) == 292, "q8_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_mxfp4) == 17, "mxfp4 block size");
TM_STATIC_ASSERT(sizeof(tm_block_q4_1) == 20, "q4_1 block size");
TM_STATIC_ASSERT(sizeof(tm_block_q5_0) == 22, "q5_0 block size");
TM_STATIC_ASSERT(sizeof(tm_block_q5_1) == 24, "q5_1 block size");
TM_STATIC_ASSERT(sizeof(tm_block_q2_k) == 84, "q2_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_q3_k) == 110, "q3_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq4_nl) == 18, "iq4_nl block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq4_xs) == 136, "iq4_xs block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq2_xxs) == 66, "iq2_xxs block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq2_xs) == 74, "iq2_xs block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq2_s) == 82, "iq2_s block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq3_xxs) == 98, "iq3_xxs block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq3_s) == 110, "iq3_s block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq1_s) == 50, "iq1_s block size");
TM_STATIC_ASSERT(sizeof(tm_block_iq1_m) == 56, "iq1_m block size");
TM_STATIC_ASSERT(sizeof(tm_block_tq1_0) == 54, "tq1_0 block size");
TM_STATIC_ASSERT(sizeof(tm_block_tq2_0) == 66, "tq2_0 block size");

/* Dequantize `n` values (a multiple of the block size) from `src` to `dst`. */
typedef void (*tm_dequantize_fn)(const void *src, float *dst, int64_t n);
/* Quantize `n` values (a multiple of the block size); one pass, fast enough for mkmodel. */
typedef void (*tm_quantize_fn)(const float *src, void *dst, int64_t n);

typedef struct tm_type_traits {
    const char *name;            /* "q4_K" etc., as ggml prints it; NULL for unused ids */
    int64_t block_size;          /* values per block */
    size_t type_size;            /* bytes per block */
    tm_dequantize_fn dequantize; /* NULL where not supported */
    tm_quantize_fn quantize;     /* NULL where not supported */
} tm_type_traits;

/* Traits for id `t`, or NULL when t is not a known ggml type id. */
const tm_type_traits *quant_type_traits(uint32_t t);

static inline int quant_type_is_known(uint32_t t) {
    return quant_type_traits(t) != NULL;
}
static inline int quant_type_is_compute(uint32_t t) {
    const tm_type_traits *tr = quant_type_traits(t);
    return tr && tr->dequantize && tr->quantize;
}

const char *quant_type_name(uint32_t t);                        /* "q4_K", or "?" when unknown */
tm_status quant_type_from_name(const char *name, tm_type *out); /* case-insensitive */

/* Bytes of a row of n values; n must be a multiple of the block size. */
static inline size_t quant_row_size(tm_type t, int64_t n) {
    const tm_type_traits *tr = quant_type_traits((uint32_t)t);
    return (size_t)(n / tr->block_size) * tr->type_size;
}

/* Whole-row helpers that check the type is supported and n fits the block. */
tm_status quant_row_dequantize(tm_type t, const void *src, float *dst, int64_t n);
tm_status quant_row_quantize(tm_type t, const float *src, void *dst, int64_t n);

/* 8-bit activations as the GPU's q8_0 decode products take them (cuda_q8x_quantize):
 * per 32 values of x (n a multiple of 32) d = max|x| / 127.0f, id = d ? 1.0f / d : 0,
 * q = x * id rounded to nearest even, all in float; q[n] and d[n / 32]. The kernel and
 * this agree bit for bit (the host mocks use it, test_cuda_ops compares against it). */
void quant_ref_quantize_q8x(const float *x, int64_t n, int8_t *q, float *d);

/* Scalar conversions (exact, round-to-nearest-even). */
float quant_f16_to_f32(tm_half h);
tm_half quant_f32_to_f16(float f);
float quant_bf16_to_f32(tm_bf16 h);
tm_bf16 quant_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif
#endif
