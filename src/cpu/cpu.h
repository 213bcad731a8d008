/* CPU backend: feature detection, the thread pool, and the quantized matrix
 * products every CPU path uses.
 *
 * Products are y = W·x where W is a row-major quantized matrix (rows of `k`
 * values of type wtype, `w_row_bytes` apart; ne[0] of the GGUF tensor is k)
 * and x is a batch of activation rows. Activations are first quantized per
 * row into the weight type's partner type (cpu_act_type: q8_K for K-quants
 * and the grid i-quants, q8_0 for q8_0/q4_0/mxfp4, f32 for float weights) so
 * the inner loops are integer dot products. Kernels know nothing of models;
 * the caller splits work over threads (rows for decode, token x row tiles for
 * prompts). */
#ifndef TM_CPU_CPU_H
#define TM_CPU_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- features (cpuid, read once) ---- */

typedef struct tm_cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool avxvnni;
    bool amx_tile, amx_int8, amx_bf16; /* usable: the OS granted the tile state */
} tm_cpu_features;

const tm_cpu_features *cpu_features(void);
int cpu_physical_cores(void);          /* default thread count */
const char *cpu_features_string(void); /* "AVX2 FMA AVX512 VNNI AMX" for logs and bench */

/* Force a kernel level for tests and comparisons: "scalar", "avx2", "avx512"
 * ("vnni" and "avx512vnni" are aliases: the level needs VNNI), "amx" (capped at
 * what the CPU has). Also read from TIERMOE_CPU_LEVEL. */
typedef enum tm_cpu_level { TM_CPU_SCALAR, TM_CPU_AVX2, TM_CPU_AVX512, TM_CPU_AMX } tm_cpu_level;
tm_cpu_level cpu_level_get(void);
tm_status cpu_level_set(tm_cpu_level level); /* TM_ERR_UNSUPPORTED above the CPU's best */
const char *cpu_level_name(tm_cpu_level level);
tm_status cpu_level_parse(const char *name, tm_cpu_level *out); /* a name above; TM_ERR_ARG */

/* ---- thread pool ----
 * A fixed set of workers that run one job at a time; the calling thread takes
 * part as thread 0. Jobs are split either statically (fn gets ith/nth) or by
 * chunks taken from a shared counter (work stealing for uneven work). */

typedef struct tm_pool tm_pool;

tm_status cpu_pool_create(int n_threads, tm_pool **out);
void cpu_pool_free(tm_pool *pool);
int cpu_pool_size(const tm_pool *pool);

typedef void (*tm_pool_fn)(void *ctx, int ith, int nth);
/* Run fn(ctx, ith, nth) on every thread; returns when all have finished. */
void cpu_pool_run(tm_pool *pool, tm_pool_fn fn, void *ctx);

typedef void (*tm_pool_range_fn)(void *ctx, int64_t begin, int64_t end, int ith);
/* Run fn over [0, n) in chunks of `chunk` items taken dynamically. */
void cpu_pool_for(tm_pool *pool, int64_t n, int64_t chunk, tm_pool_range_fn fn, void *ctx);

/* Steps that depend on each other as one pool job: every thread takes chunks
 * of step i (like cpu_pool_for) until none are left, then waits at a barrier
 * for all threads before step i + 1. One wake-up instead of one per step.
 * At most 8 steps. */
typedef struct tm_pool_step {
    tm_pool_range_fn fn;
    int64_t n, chunk; /* items [0, n) in chunks of `chunk`; n = 0 skips the step */
} tm_pool_step;
void cpu_pool_for_steps(tm_pool *pool, int n_steps, const tm_pool_step *steps, void *ctx);

/* ---- activations ---- */

tm_type cpu_act_type(tm_type wtype);               /* partner type of a weight type */
size_t cpu_act_row_size(tm_type wtype, int64_t k); /* bytes of one quantized activation row */
/* Quantize one activation row of k floats for products with wtype weights. */
void cpu_act_quantize(tm_type wtype, const float *x, void *xq, int64_t k);

/* ---- products ----
 * For rows r in [r0, r1) and tokens t in [0, n_tok):
 *   y[t * ldy + r] = dot(W row r, x row t)
 * xq holds n_tok activation rows quantized with cpu_act_quantize, each
 * xq_row_bytes apart. Safe to call concurrently on disjoint row ranges. */
void cpu_gemm(tm_type wtype, int64_t k, const void *w, size_t w_row_bytes, int64_t r0, int64_t r1,
              const void *xq, size_t xq_row_bytes, int64_t n_tok, float *y, int64_t ldy);

/* Whether cpu_gemm supports this weight type on this machine. */
bool cpu_gemm_supports(tm_type wtype);

/* Rounding a kernel adds beyond the exact integer block sums of the quantized
 * activations, per product, relative to |w x|: 0 for the integer kernels,
 * 2^-8 + 2^-18 where the AMX-BF16 kernel takes wtype at this n_tok (it rounds
 * weights and activations to bf16). For error bounds in tests. */
double cpu_gemm_error_rel(tm_type wtype, int64_t n_tok);

/* Convenience for whole matrices: quantizes x (n_tok rows of k floats) into
 * scratch, splits rows over the pool and writes y[n_tok][rows]. scratch must
 * hold n_tok * cpu_act_row_size(wtype, k) bytes. */
void cpu_matmul(tm_pool *pool, tm_type wtype, int64_t k, int64_t rows, const void *w,
                size_t w_row_bytes, const float *x, int64_t n_tok, float *y, void *scratch);

/* Several products of one input, as one pool job: y_i = W_i·x for each
 * matrix (e.g. attention q, k and v). x is quantized once per distinct
 * activation type and the row chunks of all matrices are split over the pool
 * together, so small matrices do not each pay a wake-up. Results equal
 * cpu_matmul per matrix bit for bit. At most CPU_MATMUL_MAX matrices. */
#define CPU_MATMUL_MAX 8
typedef struct tm_matmul_desc {
    tm_type wtype;
    int64_t rows;
    const void *w;
    size_t w_row_bytes;
    float *y; /* [n_tok][rows] */
} tm_matmul_desc;

/* Scratch bytes cpu_matmul_multi needs for these matrices, rows of k, n_tok tokens. */
size_t cpu_matmul_multi_scratch_bytes(int n_mats, const tm_matmul_desc *mats, int64_t k,
                                      int64_t n_tok);
void cpu_matmul_multi(tm_pool *pool, int n_mats, const tm_matmul_desc *mats, int64_t k,
                      const float *x, int64_t n_tok, void *scratch);

/* Best-of-5 read bandwidth in GB/s over a buffer of `bytes` with the pool's threads. */
double cpu_read_bandwidth_gbs(tm_pool *pool, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
