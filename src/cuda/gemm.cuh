/* The cuBLAS handle behind tm_cuda_blas, shared by gemm.cu (dense prompt
 * products) and moe_gemm.cu (grouped experts). Internal to src/cuda.
 *
 * cuBLAS is column-major. A row-major [R][C] array is the column-major C x R
 * matrix with leading dimension C, so every product here is written as
 *   Y^T (rows x n, ld rows) = op_T(W as k x rows, ld k) * (X^T as k x n, ld k)
 * i.e. transa = T, transb = N, m = rows, n = tokens, k = k: the "TN" layout,
 * where both operands are read along k (their contiguous dimension). */
#ifndef TM_CUDA_GEMM_CUH
#define TM_CUDA_GEMM_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include "cuda/cuda_common.cuh"

/* cuBLAS workspace: 32 MiB is what NVIDIA recommends for Hopper. */
#define TM_BLAS_WORKSPACE_BYTES ((size_t)32 << 20)

struct tm_cuda_blas {
    cublasHandle_t handle;
    void *workspace; /* TM_BLAS_WORKSPACE_BYTES, cudaMalloc'd at create */
};

/* Return TM_ERR_DEVICE naming the op, the shape and cuBLAS's message. */
#define TM_CUBLAS_TRY(op, m, n, k, call)                                                           \
    do {                                                                                           \
        cublasStatus_t tm_s_ = (call);                                                             \
        if (tm_s_ != CUBLAS_STATUS_SUCCESS)                                                        \
            return tm_error_set(TM_ERR_DEVICE, "%s: %s (m %lld, n %lld, k %lld) failed: %s (%d)",  \
                                op, #call, (long long)(m), (long long)(n), (long long)(k),         \
                                cublasGetStatusString(tm_s_), (int)tm_s_);                         \
    } while (0)

/* Bind the handle to `stream` for the next calls. cublasSetStream resets the
 * workspace to cuBLAS's default pool, so ours is set again after it. */
static inline tm_status tm_blas_bind(const char *op, tm_cuda_blas *b, cudaStream_t stream) {
    TM_CUBLAS_TRY(op, 0, 0, 0, cublasSetStream(b->handle, stream));
    TM_CUBLAS_TRY(op, 0, 0, 0,
                  cublasSetWorkspace(b->handle, b->workspace, TM_BLAS_WORKSPACE_BYTES));
    return TM_OK;
}

/* C (m x n, f32, ldc) = A^T B with A: k x m f16 (lda), B: k x n f16 (ldb), all
 * column-major; batch products strideA/B/C elements apart (batch 1: plain). */
static inline tm_status tm_blas_gemm_tn(const char *op, tm_cuda_blas *b, int64_t m, int64_t n,
                                        int64_t k, const __half *A, int64_t lda, long long sA,
                                        const __half *B, int64_t ldb, long long sB, float *C,
                                        int64_t ldc, long long sC, int64_t batch) {
    const float one = 1.0f, zero = 0.0f;
    if (m > 0x7fffffffLL || n > 0x7fffffffLL || k > 0x7fffffffLL || lda > 0x7fffffffLL ||
        ldb > 0x7fffffffLL || ldc > 0x7fffffffLL || batch > 0x7fffffffLL)
        return tm_error_set(TM_ERR_ARG, "%s: GEMM m %lld n %lld k %lld exceeds cuBLAS's int sizes",
                            op, (long long)m, (long long)n, (long long)k);
    if (batch == 1) {
        TM_CUBLAS_TRY(op, m, n, k,
                      cublasGemmEx(b->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k,
                                   &one, A, CUDA_R_16F, (int)lda, B, CUDA_R_16F, (int)ldb, &zero, C,
                                   CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        TM_CUBLAS_TRY(op, m, n, k,
                      cublasGemmStridedBatchedEx(b->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)m,
                                                 (int)n, (int)k, &one, A, CUDA_R_16F, (int)lda, sA,
                                                 B, CUDA_R_16F, (int)ldb, sB, &zero, C, CUDA_R_32F,
                                                 (int)ldc, sC, (int)batch, CUBLAS_COMPUTE_32F,
                                                 CUBLAS_GEMM_DEFAULT));
    }
    return TM_OK;
}

#endif
