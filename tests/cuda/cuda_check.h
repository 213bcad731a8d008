/* Shared pieces of the CUDA op harness (tests/test_cuda_ops.c and the
 * per-op check files tests/cuda/check_*.c linked into the same program):
 * the device and pool opened once per run, upload helpers, random inputs,
 * and the cmocka guards. Test code only. */
#ifndef TM_TESTS_CUDA_CHECK_H
#define TM_TESTS_CUDA_CHECK_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/rng.h"
#include "core/status.h"
#include "cuda/cuda.h"
#include "quant/quant.h"

#define U32 (1.0 / 16777216.0) /* float32 unit roundoff */

extern tm_cuda_device *g_dev; /* NULL when no usable device: tests skip */
extern tm_cuda_pool *g_pool;  /* 1.5 GiB; each test may cuda_pool_reset it */
extern char g_why[512];       /* why g_dev is NULL */

int cuda_check_setup(void **state);
int cuda_check_teardown(void **state);

#define NEED_DEVICE()                                                                              \
    do {                                                                                           \
        if (!g_dev) {                                                                              \
            printf("skipped: no CUDA device (%s)\n", g_why);                                       \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

#define CHECK(call)                                                                                \
    do {                                                                                           \
        tm_status st_ = (call);                                                                    \
        if (st_ != TM_OK) fail_msg("%s: %s", #call, tm_error_message());                           \
    } while (0)

void *dev_alloc(size_t bytes);                    /* from g_pool, 256-aligned */
void *dev_upload(const void *host, size_t bytes); /* dev_alloc + copy */
void *xmalloc(size_t n);                          /* malloc that fails the test */
void fill_normal(tm_rng *r, float *x, int64_t n, float scale);
/* `rows` random rows of `type` and k values, row_bytes apart (>= the row size:
 * padding exercises the unaligned-load paths); *deq gets the dequantized rows.
 * Quantized from normal values, except the low-bit types (check_lowbit_type):
 * random_lowbit_row's raw blocks with scales in a 64x range that keeps every
 * value under 2 in magnitude (like the quantized normal rows; the grouped
 * tensor-core products round h to f16, which must not overflow). */
uint8_t *random_matrix(tm_rng *r, tm_type type, int64_t rows, int64_t k, size_t row_bytes,
                       float **deq);

/* Every weight type the kernels read (src/cuda/cuda_args.h): the compute
 * types, then the low-bit ones. */
#define CHECK_N_TYPES 25
extern const tm_type check_types[CHECK_N_TYPES];
bool check_is_float(tm_type t); /* f32 f16 bf16 */
/* Row stride with at least `pad` extra bytes, a multiple of a float type's element. */
size_t check_row_stride(tm_type t, int64_t k, size_t pad);
/* f32 -> f16 bits, round to nearest even, past 65504 to inf (as __float2half_rn),
 * and its self-test (fails the test on a wrong answer). */
uint16_t check_half_bits(float f);
void check_half_selftest(void);

/* quant_row_dequantize of a row at any address (through an aligned copy: the
 * C dequantizers read the block structs, which need their alignment). */
void check_dequantize_row(tm_type type, const uint8_t *row, float *out, int64_t k);

/* q4_1 q5_0 q5_1 iq4_nl q2_K q3_K iq4_xs iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s
 * iq1_s iq1_m tq1_0 tq2_0: the types of src/cuda/dequant_lowbit.cuh. */
bool check_lowbit_type(tm_type t);
/* k values (whole blocks) of random bytes, with the blocks' f16 scales and mins
 * replaced by random finite f16 of exponent field min_exp..max_exp (0:
 * subnormal; 30: up to 65504, where most types' values overflow f16): every
 * code, index and sign pattern appears. */
void random_lowbit_row(tm_rng *r, tm_type type, uint8_t *row, int64_t k, int min_exp, int max_exp);

/* gpt-oss's experts for the grouped-expert checks: host biases of n_expert
 * experts (gate and up of std 4, so the clamps bite; down of std 1), the
 * extension that takes them to the device, and the clamped SwiGLU in double
 * with bounds on its slopes (|dh/dg| <= *dg, |dh/du| <= *du; the clamps only
 * shrink them). */
#define CHECK_OAI_ALPHA 1.702f
#define CHECK_OAI_LIMIT 7.0f
typedef struct check_oai_biases {
    int64_t n_expert;
    float *gate, *up, *down; /* [n_expert][n_ff] twice, [n_expert][n_embd] */
} check_oai_biases;
check_oai_biases check_oai_biases_make(tm_rng *r, int64_t n_expert, int64_t n_ff, int64_t n_embd);
void check_oai_biases_free(check_oai_biases *b);
tm_cuda_moe_ext check_oai_ext(const check_oai_biases *b, int64_t n_ff, int64_t n_embd);
double check_swiglu_oai(double g, double u, double *dg, double *du);

/* The per-op checks of tests/cuda/check_*.c (cmocka tests). */
void check_attention(void **state);
void check_attention_rows(void **state);
void check_dequant(void **state);
void check_fetch_ahead(void **state);
void check_gemm(void **state);
void check_gpus(void **state);
void check_lbx(void **state);
void check_model(void **state);
void check_ssm(void **state);
void check_ssm_gates(void **state);
void check_attn_partial_rope(void **state);
void check_mla(void **state);

#endif
