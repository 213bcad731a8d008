/* Product dispatch: picks the kernel for a weight type at the current level
 * (AMX only when there are enough tokens to fill its tiles), falling back to
 * lower levels where a file has no kernel for the type; and cpu_matmul, the
 * whole-matrix convenience over the thread pool. */
#include "core/log.h"
#include "cpu/cpu_internal.h"

static cpu_gemm_fn cpu_gemm_pick(tm_type wtype, int64_t n_tok) {
    tm_cpu_level level = cpu_level_get();
    cpu_gemm_fn fn = NULL;
#if defined(__x86_64__)
    if (level >= TM_CPU_AMX && n_tok >= cpu_gemm_amx_min_tokens()) fn = cpu_gemm_amx_get(wtype);
    if (!fn && level >= TM_CPU_AVX512) fn = cpu_gemm_avx512_get(wtype);
    if (!fn && level >= TM_CPU_AVX2) fn = cpu_gemm_avx2_get(wtype);
#else
    (void)level;
    (void)n_tok;
#endif
    if (!fn) fn = cpu_gemm_ref_get(wtype);
    return fn;
}

bool cpu_gemm_supports(tm_type wtype) { return cpu_gemm_ref_get(wtype) != NULL; }

void cpu_gemm(tm_type wtype, int64_t k, const void *w, size_t w_row_bytes, int64_t r0, int64_t r1,
              const void *xq, size_t xq_row_bytes, int64_t n_tok, float *y, int64_t ldy) {
    if (r1 <= r0 || n_tok <= 0) return;
    cpu_gemm_fn fn = cpu_gemm_pick(wtype, n_tok);
    TM_ASSERT(fn != NULL);
    fn(k, w, w_row_bytes, r0, r1, xq, xq_row_bytes, n_tok, y, ldy);
}

typedef struct matmul_job {
    tm_type wtype;
    int64_t k, rows, n_tok;
    const void *w;
    size_t w_row_bytes, xq_row_bytes;
    const float *x;
    void *xq;
    float *y;
    cpu_gemm_fn fn;
    cpu_act_fn act;
} matmul_job;

static void matmul_quantize(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    matmul_job *j = ctx;
    for (int64_t t = b; t < e; t++) j->act(j->x + t * j->k, (char *)j->xq + (size_t)t * j->xq_row_bytes, j->k);
}

static void matmul_rows(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    matmul_job *j = ctx;
    j->fn(j->k, j->w, j->w_row_bytes, b, e, j->xq, j->xq_row_bytes, j->n_tok, j->y, j->rows);
}

void cpu_matmul(tm_pool *pool, tm_type wtype, int64_t k, int64_t rows, const void *w,
                size_t w_row_bytes, const float *x, int64_t n_tok, float *y, void *scratch) {
    if (rows <= 0 || n_tok <= 0) return;
    matmul_job j = {
        .wtype = wtype, .k = k, .rows = rows, .n_tok = n_tok, .w = w, .w_row_bytes = w_row_bytes,
        .xq_row_bytes = cpu_act_row_size(wtype, k), .x = x, .xq = scratch, .y = y,
        .fn = cpu_gemm_pick(wtype, n_tok), .act = cpu_act_get(cpu_act_type(wtype), cpu_level_get()),
    };
    TM_ASSERT(j.fn && j.act);
    int nth = cpu_pool_size(pool);
    if (n_tok >= 4 * nth) cpu_pool_for(pool, n_tok, (n_tok + nth - 1) / nth, matmul_quantize, &j);
    else matmul_quantize(&j, 0, n_tok, 0);
    /* Whole 16-row tiles, about 4 chunks per thread so uneven threads even out;
     * with many tokens at least 32 rows, since each chunk rereads the activations. */
    int64_t chunk = (rows + 4 * nth - 1) / (4 * nth);
    int64_t min_chunk = n_tok >= 16 ? 32 : 16;
    if (chunk < min_chunk) chunk = min_chunk;
    chunk = (chunk + 15) / 16 * 16;
    cpu_pool_for(pool, rows, chunk, matmul_rows, &j);
}
