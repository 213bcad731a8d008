/* Product dispatch: picks the kernel for a weight type at the current level
 * (AMX only when there are enough tokens to fill its tiles), falling back to
 * lower levels where a file has no kernel for the type; and cpu_matmul /
 * cpu_matmul_multi, whole-matrix products over the thread pool. */
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

double cpu_gemm_error_rel(tm_type wtype, int64_t n_tok) {
    cpu_gemm_fn fn = cpu_gemm_pick(wtype, n_tok);
    return fn && fn == cpu_gemm_amx_bf16_get(wtype) ? 0x1p-8 + 0x1p-18 : 0;
}

bool cpu_gemm_supports(tm_type wtype) {
    return cpu_gemm_ref_get(wtype) != NULL;
}

void cpu_gemm(tm_type wtype, int64_t k, const void *w, size_t w_row_bytes, int64_t r0, int64_t r1,
              const void *xq, size_t xq_row_bytes, int64_t n_tok, float *y, int64_t ldy) {
    if (r1 <= r0 || n_tok <= 0) return;
    cpu_gemm_fn fn = cpu_gemm_pick(wtype, n_tok);
    TM_ASSERT(fn != NULL);
    fn(k, w, w_row_bytes, r0, r1, xq, xq_row_bytes, n_tok, y, ldy);
}

/* Several matrices over one input: x quantized once per distinct activation
 * type, then the row chunks of every matrix numbered one after another. */
typedef struct matmul_job {
    const tm_matmul_desc *mats;
    int n_mats, n_acts;
    int64_t k, n_tok, chunk, tok_chunk, n_tok_chunks;
    const float *x;
    cpu_gemm_fn fn[CPU_MATMUL_MAX];
    int act_of[CPU_MATMUL_MAX];     /* the quantized copy of x that matrix i reads */
    cpu_act_fn act[CPU_MATMUL_MAX]; /* per copy */
    uint8_t *xq[CPU_MATMUL_MAX];    /* per copy: n_tok rows */
    size_t xq_row_bytes[CPU_MATMUL_MAX];
    int64_t first_chunk[CPU_MATMUL_MAX +
                        1]; /* chunks of matrix i: [first_chunk[i], first_chunk[i + 1]) */
} matmul_job;

/* Distinct activation types of the matrices: act_of[i] names matrix i's, and
 * the return value is how many there are; sizes[a] is one row of type a. */
static int matmul_acts(int n_mats, const tm_matmul_desc *mats, int64_t k, int act_of[],
                       size_t sizes[]) {
    tm_type types[CPU_MATMUL_MAX];
    int n = 0;
    for (int i = 0; i < n_mats; i++) {
        tm_type t = cpu_act_type(mats[i].wtype);
        int a = 0;
        while (a < n && types[a] != t) a++;
        if (a == n) types[n] = t, sizes[n++] = cpu_act_row_size(mats[i].wtype, k);
        act_of[i] = a;
    }
    return n;
}

size_t cpu_matmul_multi_scratch_bytes(int n_mats, const tm_matmul_desc *mats, int64_t k,
                                      int64_t n_tok) {
    TM_ASSERT(n_mats >= 1 && n_mats <= CPU_MATMUL_MAX);
    int act_of[CPU_MATMUL_MAX];
    size_t sizes[CPU_MATMUL_MAX], total = 0;
    int n_acts = matmul_acts(n_mats, mats, k, act_of, sizes);
    for (int a = 0; a < n_acts; a++) total += (size_t)n_tok * sizes[a];
    return total;
}

static void matmul_quantize(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    matmul_job *j = ctx;
    for (int64_t i = b; i < e; i++) {
        const int64_t a = i / j->n_tok, t = i % j->n_tok;
        j->act[a](j->x + t * j->k, j->xq[a] + (size_t)t * j->xq_row_bytes[a], j->k);
    }
}

static void matmul_rows(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    matmul_job *j = ctx;
    for (int64_t item = b; item < e; item++) {
        const int64_t c = item / j->n_tok_chunks, t0 = item % j->n_tok_chunks * j->tok_chunk;
        const int64_t nt = t0 + j->tok_chunk < j->n_tok ? j->tok_chunk : j->n_tok - t0;
        int i = 0;
        while (c >= j->first_chunk[i + 1]) i++;
        const tm_matmul_desc *m = &j->mats[i];
        const int64_t r0 = (c - j->first_chunk[i]) * j->chunk;
        const int64_t r1 = r0 + j->chunk < m->rows ? r0 + j->chunk : m->rows;
        const int a = j->act_of[i];
        j->fn[i](j->k, m->w, m->w_row_bytes, r0, r1, j->xq[a] + (size_t)t0 * j->xq_row_bytes[a],
                 j->xq_row_bytes[a], nt, m->y + t0 * m->rows, m->rows);
    }
}

void cpu_matmul_multi(tm_pool *pool, int n_mats, const tm_matmul_desc *mats, int64_t k,
                      const float *x, int64_t n_tok, void *scratch) {
    TM_ASSERT(n_mats >= 1 && n_mats <= CPU_MATMUL_MAX);
    if (n_tok <= 0) return;
    matmul_job j = {.mats = mats, .n_mats = n_mats, .k = k, .n_tok = n_tok, .x = x};
    j.n_acts = matmul_acts(n_mats, mats, k, j.act_of, j.xq_row_bytes);
    uint8_t *xq = scratch;
    for (int a = 0; a < j.n_acts; a++) j.xq[a] = xq, xq += (size_t)n_tok * j.xq_row_bytes[a];
    int64_t rows = 0;
    for (int i = 0; i < n_mats; i++) {
        j.fn[i] = cpu_gemm_pick(mats[i].wtype, n_tok);
        j.act[j.act_of[i]] = cpu_act_get(cpu_act_type(mats[i].wtype), cpu_level_get());
        TM_ASSERT(j.fn[i] && j.act[j.act_of[i]]);
        rows += mats[i].rows;
    }
    if (rows <= 0) return;
    const int nth = cpu_pool_size(pool);
    const int64_t n_quant = j.n_acts * n_tok;
    if (n_tok >= 4 * nth)
        cpu_pool_for(pool, n_quant, (n_quant + nth - 1) / nth, matmul_quantize, &j);
    else
        matmul_quantize(&j, 0, n_quant, 0);
    /* About 4 chunks per thread over all matrices so uneven threads even out.
     * With many tokens whole 16-row tiles (AMX) and at least 32 rows, since
     * each chunk rereads the activations; with few, 8-row steps, so a small
     * matrix (the router, 128 rows) still reaches 16 threads. */
    int64_t chunk = (rows + 4 * nth - 1) / (4 * nth);
    const int64_t min_chunk = n_tok >= 16 ? 32 : 8, step = n_tok >= 16 ? 16 : 8;
    if (chunk < min_chunk) chunk = min_chunk;
    j.chunk = (chunk + step - 1) / step * step;
    for (int i = 0; i < n_mats; i++)
        j.first_chunk[i + 1] = j.first_chunk[i] + (mats[i].rows + j.chunk - 1) / j.chunk;
    /* Few rows (the router) give few chunks: split long batches by tokens too, in
     * whole 16-token tiles. Decided by the shape alone, so a token's kernel never
     * depends on the thread count. */
    j.tok_chunk = rows < 1024 && n_tok > 64 ? 64 : n_tok;
    j.n_tok_chunks = (n_tok + j.tok_chunk - 1) / j.tok_chunk;
    cpu_pool_for(pool, j.first_chunk[n_mats] * j.n_tok_chunks, 1, matmul_rows, &j);
}

void cpu_matmul(tm_pool *pool, tm_type wtype, int64_t k, int64_t rows, const void *w,
                size_t w_row_bytes, const float *x, int64_t n_tok, float *y, void *scratch) {
    if (rows <= 0) return;
    const tm_matmul_desc m = {wtype, rows, w, w_row_bytes, y};
    cpu_matmul_multi(pool, 1, &m, k, x, n_tok, scratch);
}
