/* The tensor-core path of latent attention (mla_tc.cu), which cuda_mla_attention
 * (mla.cu) hands DeepSeek-V3's shape to when tm_mla_tc_ok says it can. Internal to
 * src/cuda. */
#ifndef TM_CUDA_MLA_TC_CUH
#define TM_CUDA_MLA_TC_CUH
#include "cuda/cuda.h"

/* Tokens up to this many split their keys over blocks (decode); more run a block a
 * 32 heads of a token over all its keys. */
#define TM_MLA_TC_SPLIT_TOK 8

bool tm_mla_tc_ok(const tm_cuda_attn_params &p, const void *q, const void *k_cache,
                  const void *out);
/* The key splits of n_tok tokens (1: none), and the records' floats they need. */
int64_t tm_mla_tc_splits(const tm_cuda_attn_params &p, int64_t n_tok);
int64_t tm_mla_tc_scratch_floats(const tm_cuda_attn_params &p, int64_t n_tok);
tm_status tm_mla_tc_launch(const tm_cuda_attn_params &p, const float *q, const void *k_cache,
                           const int32_t *pos0, int64_t n_tok, float *out, float *scratch,
                           tm_cuda_stream stream);
#endif
