/* Quantized block types, bit-compatible with ggml's on-disk layouts.
 *
 * A tensor row of n values of type t is n / block_size(t) consecutive blocks
 * of type_size(t) bytes. Type ids are ggml's and append-only (they are stored
 * in GGUF files). Every id a GGUF file may carry has a size entry, so the
 * reader can validate any file; only the types below marked "compute" can be
 * dequantized, quantized and used by the kernels.
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

TM_STATIC_ASSERT(sizeof(tm_block_q4_0) == 18, "q4_0 block size");
TM_STATIC_ASSERT(sizeof(tm_block_q8_0) == 34, "q8_0 block size");
TM_STATIC_ASSERT(sizeof(tm_block_q4_k) == 144, "q4_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_q5_k) == 176, "q5_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_q6_k) == 210, "q6_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_q8_k) == 292, "q8_k block size");
TM_STATIC_ASSERT(sizeof(tm_block_mxfp4) == 17, "mxfp4 block size");

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
