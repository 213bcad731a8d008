/* Dense prompt-size products on tensor cores, and the cuBLAS handle.
 *
 * cuda_gemm: y [n_tok][rows] = W [rows][k] . x [n_tok][k]^T, any n_tok >= 1.
 *   1. x -> f16 into scratch (round to nearest even);
 *   2. for each chunk of at most TM_GEMM_CHUNK_BYTES of f16 weights
 *      (chunk_rows rows, a multiple of 64 unless the matrix is smaller):
 *      dequantize rows r0 .. r0+rc to f16 into scratch (dequant.cu), then one
 *      cublasGemmEx writes y[.][r0 .. r0+rc):
 *        C = y + r0 (column-major rc x n_tok, ldc = rows: column t is y[t])
 *        A = W chunk (column-major k x rc, lda = k), op T
 *        B = x f16   (column-major k x n_tok, ldb = k), op N
 *      f16 inputs, CUBLAS_COMPUTE_32F, f32 output.
 * f32 weights skip the f16 rounding: one cublasSgemm (full f32; TF32 stays
 * off, cuBLAS's default math), so the router's logits, and the experts it
 * picks, match the CPU's.
 * The chunks share one weight buffer: stream order serialises each chunk's
 * dequantization after the previous chunk's product.
 *
 * Scratch (cuda_gemm_scratch_bytes): [x f16: n_tok*k][pad to 256][W f16:
 * chunk_rows*k]. The output head of Qwen3 (151936 x 2048) takes 10 chunks of
 * 16384 rows, 64 MiB of weights each.
 *
 * cuda_gemm_heads: every head's product in one strided batched GEMM (batch = head): the
 * weights dequantized whole to f16 (DeepSeek-V3's attn_k_b: 128 x 512 x 128, 16 MiB),
 * x's rows converted to f16 whole (the carried values too: one contiguous conversion) in
 * chunks of tokens of at most TM_GEMM_HEADS_X_BYTES; head h's B is x f16 + h hx with
 * ldb ldx, its C y + h hy with ldc ldy. f32 weights: cublasSgemmStridedBatched on x as
 * it is. */
#include "cuda/dequant.cuh"
#include "cuda/gemm.cuh"

#include <stdlib.h>

#define TM_GEMM_CHUNK_BYTES ((size_t)64 << 20)

static size_t tm_align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* Rows per chunk: as many as fit TM_GEMM_CHUNK_BYTES of f16, a multiple of 64
 * (keeps y + r0 and the tiles aligned), at least 1, at most rows. */
static int64_t tm_gemm_chunk_rows(int64_t rows, int64_t k) {
    int64_t c = (int64_t)(TM_GEMM_CHUNK_BYTES / ((size_t)k * 2));
    if (c >= 64) c &= ~(int64_t)63;
    if (c < 1) c = 1;
    return c < rows ? c : rows;
}

extern "C" tm_status cuda_blas_create(tm_cuda_device *dev, tm_cuda_blas **out) {
    *out = NULL;
    TM_CUDA_TRY(cudaSetDevice(cuda_device_info(dev)->index));
    tm_cuda_blas *b = (tm_cuda_blas *)calloc(1, sizeof(*b));
    if (!b) return tm_error_set(TM_ERR_NOMEM, "cuda_blas_create: out of host memory");
    cublasStatus_t s = cublasCreate(&b->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return tm_error_set(TM_ERR_DEVICE, "cuda_blas_create: cublasCreate failed: %s (%d)",
                            cublasGetStatusString(s), (int)s);
    }
    cudaError_t e = cudaMalloc(&b->workspace, TM_BLAS_WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        cublasDestroy(b->handle);
        free(b);
        return tm_error_set(TM_ERR_DEVICE,
                            "cuda_blas_create: cannot allocate the %zu MiB cuBLAS workspace: %s",
                            TM_BLAS_WORKSPACE_BYTES >> 20, cudaGetErrorString(e));
    }
    tm_status st = tm_blas_bind("cuda_blas_create", b, cuda_device_stream(dev));
    if (st != TM_OK) {
        cuda_blas_free(b);
        return st;
    }
    *out = b;
    return TM_OK;
}

extern "C" void cuda_blas_free(tm_cuda_blas *b) {
    if (!b) return;
    if (b->handle) cublasDestroy(b->handle);
    if (b->workspace) cudaFree(b->workspace);
    free(b);
}

extern "C" size_t cuda_gemm_scratch_bytes(int64_t rows, int64_t k, int64_t n_tok) {
    if (rows <= 0 || k <= 0 || n_tok <= 0) return 0;
    return tm_align256((size_t)n_tok * k * 2) + (size_t)tm_gemm_chunk_rows(rows, k) * k * 2;
}

#define TM_GEMM_HEADS_X_BYTES ((size_t)16 << 20)

extern "C" size_t cuda_gemm_heads_scratch_bytes(tm_type type, int64_t in, int64_t out,
                                                int64_t n_head) {
    if (type == TM_TYPE_F32 || in <= 0 || out <= 0 || n_head <= 0) return 0;
    const size_t w = type == TM_TYPE_F16 ? 0 : (size_t)(n_head * out * in) * 2;
    return tm_align256(w) + TM_GEMM_HEADS_X_BYTES;
}

extern "C" tm_status cuda_gemm_heads(tm_cuda_blas *b, tm_type type, const void *w, size_t row_bytes,
                                     int64_t in, int64_t out, int64_t n_head, const float *x,
                                     int64_t ldx, int64_t hx, int64_t n_tok, float *y, int64_t ldy,
                                     int64_t hy, void *scratch, tm_cuda_stream stream) {
    static const char op[] = "cuda_gemm_heads";
    tm_status st = cuda_gemm_heads_args_check(b, type, w, row_bytes, in, out, n_head, x, ldx, hx,
                                              n_tok, y, ldy, hy, scratch);
    if (st != TM_OK) return st;
    if ((st = tm_blas_bind(op, b, stream)) != TM_OK) return st;
    if (type == TM_TYPE_F32) {
        const float one = 1.0f, zero = 0.0f;
        const int64_t lda = (int64_t)(row_bytes / 4);
        TM_CUBLAS_TRY(op, out, n_tok, in,
                      cublasSgemmStridedBatched(
                          b->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)n_tok, (int)in, &one,
                          (const float *)w, (int)lda, (long long)(out * lda), x, (int)ldx,
                          (long long)hx, &zero, y, (int)ldy, (long long)hy, (int)n_head));
        return TM_OK;
    }
    const __half *wh = (const __half *)w;
    int64_t lda = (int64_t)(row_bytes / 2);
    size_t w_bytes = 0;
    if (type != TM_TYPE_F16) { /* dequantized whole: its rows packed, in values each */
        w_bytes = tm_align256((size_t)(n_head * out * in) * 2);
        st = tm_dequant_f16_run(op, type, w, row_bytes, n_head * out, in, 0, NULL, 1,
                                (__half *)scratch, 0, stream);
        if (st != TM_OK) return st;
        wh = (const __half *)scratch, lda = in;
    }
    __half *xh = (__half *)((char *)scratch + w_bytes);
    int64_t chunk = (int64_t)(TM_GEMM_HEADS_X_BYTES / ((size_t)ldx * 2));
    if (chunk < 1)
        return tm_error_set(TM_ERR_ARG, "%s: an x row of %lld values exceeds the %zu MiB chunk", op,
                            (long long)ldx, TM_GEMM_HEADS_X_BYTES >> 20);
    for (int64_t t0 = 0; t0 < n_tok; t0 += chunk) {
        const int64_t tc = n_tok - t0 < chunk ? n_tok - t0 : chunk;
        if ((st = tm_f32_to_f16_run(op, x + t0 * ldx, tc * ldx, xh, stream)) != TM_OK) return st;
        st = tm_blas_gemm_tn(op, b, out, tc, in, wh, lda, (long long)(out * lda), xh, ldx,
                             (long long)hx, y + t0 * ldy, ldy, (long long)hy, n_head);
        if (st != TM_OK) return st;
    }
    return TM_OK;
}

extern "C" tm_status cuda_gemm(tm_cuda_blas *b, tm_type type, const void *w, size_t row_bytes,
                               int64_t rows, int64_t k, const float *x, int64_t n_tok, float *y,
                               void *scratch, tm_cuda_stream stream) {
    static const char op[] = "cuda_gemm";
    tm_status st = cuda_gemm_args_check(b, type, w, row_bytes, rows, k, x, n_tok, y, scratch);
    if (st != TM_OK) return st;
    if ((st = tm_blas_bind(op, b, stream)) != TM_OK) return st;
    if (type == TM_TYPE_F32) { /* f32 weights stay f32 (the router: top-k must match the CPU) */
        if (row_bytes / 4 > 0x7fffffffULL)
            return tm_error_set(TM_ERR_ARG, "%s: f32 row stride %zu bytes exceeds cuBLAS's int", op,
                                row_bytes);
        const float one = 1.0f, zero = 0.0f;
        TM_CUBLAS_TRY(op, rows, n_tok, k,
                      cublasSgemm(b->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n_tok,
                                  (int)k, &one, (const float *)w, (int)(row_bytes / 4), x, (int)k,
                                  &zero, y, (int)rows));
        return TM_OK;
    }
    __half *xh = (__half *)scratch;
    __half *wh = (__half *)((char *)scratch + tm_align256((size_t)n_tok * k * 2));
    const int64_t chunk = tm_gemm_chunk_rows(rows, k);
    if ((st = tm_f32_to_f16_run(op, x, n_tok * k, xh, stream)) != TM_OK) return st;
    const uint8_t *wb = (const uint8_t *)w;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t rc = rows - r0 < chunk ? rows - r0 : chunk;
        st = tm_dequant_f16_run(op, type, wb + (size_t)r0 * row_bytes, row_bytes, rc, k, 0, NULL, 1,
                                wh, 0, stream);
        if (st != TM_OK) return st;
        /* y^T[r0..r0+rc) = (W chunk)^T-as-stored . x^T: see gemm.cuh */
        st = tm_blas_gemm_tn(op, b, rc, n_tok, k, wh, k, 0, xh, k, 0, y + r0, rows, 0, 1);
        if (st != TM_OK) return st;
    }
    return TM_OK;
}
