/* src/cuda/cuda.h for a build without nvcc: there is no GPU to open.
 * cuda_device_count reports none and cuda_device_open says why, so callers
 * take their CPU path; nothing past a failed open is ever called, and each
 * function that could be returns TM_ERR_UNSUPPORTED rather than pretending. */
#include <stdlib.h>

#include "cuda/cuda.h"

#define NONE tm_error_set(TM_ERR_UNSUPPORTED, "this build has no CUDA backend")

tm_status cuda_device_count(int *out) {
    *out = 0;
    return TM_OK;
}
tm_status cuda_device_open(int index, tm_cuda_device **out) {
    *out = NULL;
    return tm_error_set(TM_ERR_DEVICE,
                        "GPU %d: this build has no CUDA backend (rebuild where nvcc is found)",
                        index);
}
void cuda_device_close(tm_cuda_device *dev) {
    (void)dev;
}
const tm_cuda_device_info *cuda_device_info(const tm_cuda_device *dev) {
    (void)dev;
    return NULL;
}
tm_status cuda_device_memory(tm_cuda_device *dev, size_t *free_bytes, size_t *total_bytes) {
    (void)dev, (void)free_bytes, (void)total_bytes;
    return NONE;
}
tm_cuda_stream cuda_device_stream(const tm_cuda_device *dev) {
    (void)dev;
    return NULL;
}
tm_status cuda_device_sync(tm_cuda_device *dev) {
    (void)dev;
    return NONE;
}
tm_status cuda_pool_create(tm_cuda_device *dev, size_t bytes, tm_cuda_pool **out) {
    (void)dev, (void)bytes, *out = NULL;
    return NONE;
}
tm_status cuda_pool_alloc(tm_cuda_pool *pool, size_t bytes, size_t align, void **out) {
    (void)pool, (void)bytes, (void)align, *out = NULL;
    return NONE;
}
void cuda_pool_reset(tm_cuda_pool *pool) {
    (void)pool;
}
size_t cuda_pool_used(const tm_cuda_pool *pool) {
    (void)pool;
    return 0;
}
size_t cuda_pool_size(const tm_cuda_pool *pool) {
    (void)pool;
    return 0;
}
void cuda_pool_free(tm_cuda_pool *pool) {
    (void)pool;
}
tm_status cuda_host_alloc(size_t bytes, void **out) {
    (void)bytes, *out = NULL;
    return NONE;
}
tm_status cuda_host_alloc_mapped(size_t bytes, void **host, void **dev) {
    (void)bytes, *host = *dev = NULL;
    return NONE;
}
void cuda_host_free(void *p) {
    (void)p;
}
tm_status cuda_host_register(void *p, size_t bytes, bool read_only, void **dev) {
    (void)p, (void)bytes, (void)read_only, *dev = NULL;
    return NONE;
}
void cuda_host_unregister(void *p) {
    (void)p;
}
tm_status cuda_copy_to_device(tm_cuda_device *dev, void *dst, const void *src, size_t bytes) {
    (void)dev, (void)dst, (void)src, (void)bytes;
    return NONE;
}
tm_status cuda_copy_to_host(tm_cuda_device *dev, void *dst, const void *src, size_t bytes) {
    (void)dev, (void)dst, (void)src, (void)bytes;
    return NONE;
}
tm_status cuda_fill_bytes(tm_cuda_device *dev, void *dst, int byte, size_t bytes) {
    (void)dev, (void)dst, (void)byte, (void)bytes;
    return NONE;
}
tm_status cuda_copy_device(tm_cuda_device *dev, void *dst, const void *src, size_t bytes) {
    (void)dev, (void)dst, (void)src, (void)bytes;
    return NONE;
}
tm_status cuda_upload(tm_cuda_device *dev, void *dst, const void *src, size_t bytes,
                      double *bytes_per_s) {
    (void)dev, (void)dst, (void)src, (void)bytes, (void)bytes_per_s;
    return NONE;
}
tm_status cuda_timer_create(tm_cuda_device *dev, tm_cuda_timer **out) {
    (void)dev, *out = NULL;
    return NONE;
}
tm_status cuda_timer_start(tm_cuda_timer *t) {
    (void)t;
    return NONE;
}
tm_status cuda_timer_stop(tm_cuda_timer *t, float *ms) {
    (void)t, (void)ms;
    return NONE;
}
void cuda_timer_free(tm_cuda_timer *t) {
    (void)t;
}
tm_status cuda_copy_async(void *dst, const void *src, size_t bytes, tm_cuda_stream stream) {
    (void)dst, (void)src, (void)bytes, (void)stream;
    return NONE;
}
tm_status cuda_device_select(tm_cuda_device *dev) {
    (void)dev;
    return NONE;
}
tm_status cuda_device_peer_enable(tm_cuda_device *dev, tm_cuda_device *peer, bool *on) {
    (void)dev, (void)peer;
    *on = false;
    return NONE;
}
tm_status cuda_copy_peer_async(tm_cuda_device *dst_dev, void *dst, tm_cuda_device *src_dev,
                               const void *src, size_t bytes, tm_cuda_stream stream) {
    (void)dst_dev, (void)dst, (void)src_dev, (void)src, (void)bytes, (void)stream;
    return NONE;
}
tm_status cuda_fill_async(void *dst, int byte, size_t bytes, tm_cuda_stream stream) {
    (void)dst, (void)byte, (void)bytes, (void)stream;
    return NONE;
}
tm_status cuda_stream_sync(tm_cuda_stream stream) {
    (void)stream;
    return NONE;
}
tm_status cuda_stream_query(tm_cuda_stream stream, bool *idle) {
    (void)stream, *idle = true;
    return NONE;
}
tm_status cuda_graph_begin(tm_cuda_stream stream) {
    (void)stream;
    return NONE;
}
tm_status cuda_graph_end(tm_cuda_stream stream, bool keep, tm_cuda_graph **out) {
    (void)stream, (void)keep, *out = NULL;
    return NONE;
}
tm_status cuda_graph_launch(tm_cuda_graph *g, tm_cuda_stream stream) {
    (void)g, (void)stream;
    return NONE;
}
void cuda_graph_free(tm_cuda_graph *g) {
    (void)g;
}
tm_status cuda_event_create(tm_cuda_event *out) {
    *out = NULL;
    return NONE;
}
void cuda_event_free(tm_cuda_event e) {
    (void)e;
}
tm_status cuda_event_record(tm_cuda_event e, tm_cuda_stream stream) {
    (void)e, (void)stream;
    return NONE;
}
tm_status cuda_event_elapsed(tm_cuda_event a, tm_cuda_event b, float *ms) {
    (void)a, (void)b, (void)ms;
    return NONE;
}
tm_status cuda_stream_create(tm_cuda_stream *out) {
    *out = NULL;
    return NONE;
}
void cuda_stream_free(tm_cuda_stream stream) {
    (void)stream;
}
tm_status cuda_stream_wait_event(tm_cuda_stream stream, tm_cuda_event e) {
    (void)stream, (void)e;
    return NONE;
}
tm_status cuda_event_query(tm_cuda_event e, bool *done) {
    (void)e;
    *done = true;
    return NONE;
}
tm_status cuda_mmvq(tm_type type, const void *w, size_t row_bytes, int64_t rows, int64_t k,
                    const float *x, int64_t n_tok, float *y, tm_cuda_stream stream) {
    (void)type, (void)w, (void)row_bytes, (void)rows, (void)k, (void)x, (void)n_tok, (void)y,
        (void)stream;
    return NONE;
}
tm_status cuda_q8x_quantize(const float *x, int64_t k, int64_t n_tok, void *xq,
                            tm_cuda_stream stream) {
    (void)x, (void)k, (void)n_tok, (void)xq, (void)stream;
    return NONE;
}
tm_status cuda_mmvq_q8x(tm_type type, const void *w, size_t row_bytes, int64_t rows, int64_t k,
                        const void *xq, int64_t n_tok, float *y, tm_cuda_stream stream) {
    (void)type, (void)w, (void)row_bytes, (void)rows, (void)k, (void)xq, (void)n_tok, (void)y,
        (void)stream;
    return NONE;
}
tm_status cuda_moe_grouped(const tm_cuda_moe_params *p, const tm_cuda_moe_item *items,
                           int64_t n_items, const float *x, int64_t n_tok, float *y,
                           float *h_scratch, tm_cuda_stream stream) {
    (void)p, (void)items, (void)n_items, (void)x, (void)n_tok, (void)y, (void)h_scratch,
        (void)stream;
    return NONE;
}
tm_status cuda_router_select(const tm_cuda_router_params *p, const float *logits, int64_t n_tok,
                             int32_t *ids, float *weights, tm_cuda_moe_item *items,
                             tm_cuda_stream stream) {
    (void)p, (void)logits, (void)n_tok, (void)ids, (void)weights, (void)items, (void)stream;
    return NONE;
}
tm_status cuda_moe_fetch_ahead(const tm_cuda_moe_params *src, const tm_cuda_moe_params *dst,
                               const tm_cuda_moe_item *items, int64_t n_items, int32_t n_expert,
                               int32_t n_slots, int32_t *map, int32_t *list,
                               const tm_cuda_fetch_cache *cache, tm_cuda_stream stream) {
    (void)src, (void)dst, (void)items, (void)n_items, (void)n_expert, (void)n_slots, (void)map,
        (void)list, (void)cache, (void)stream;
    return NONE;
}
tm_status cuda_rmsnorm(float *y, const float *x, const float *w, int64_t n_rows, int64_t n,
                       float eps, tm_cuda_stream stream) {
    (void)y, (void)x, (void)w, (void)n_rows, (void)n, (void)eps, (void)stream;
    return NONE;
}
tm_status cuda_rope_neox(float *x, const int32_t *pos, int64_t n_tok, int64_t n_head,
                         int64_t head_dim, float base, tm_cuda_stream stream) {
    (void)x, (void)pos, (void)n_tok, (void)n_head, (void)head_dim, (void)base, (void)stream;
    return NONE;
}
tm_status cuda_add(float *y, const float *a, const float *b, int64_t n, tm_cuda_stream stream) {
    (void)y, (void)a, (void)b, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_add_bias(float *y, const float *b, int64_t n_rows, int64_t n,
                        tm_cuda_stream stream) {
    (void)y, (void)b, (void)n_rows, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_add_rmsnorm(float *x, const float *a, float *h, const float *w, int64_t n_rows,
                           int64_t n, float eps, tm_cuda_stream stream) {
    (void)x, (void)a, (void)h, (void)w, (void)n_rows, (void)n, (void)eps, (void)stream;
    return NONE;
}
tm_status cuda_attn_prepare(const tm_cuda_attn_params *p, float *q, const float *k, const float *v,
                            const float *q_norm, const float *k_norm, const int32_t *pos0,
                            int64_t n_tok, void *k_cache, void *v_cache, tm_cuda_stream stream) {
    (void)p, (void)q, (void)k, (void)v, (void)q_norm, (void)k_norm, (void)pos0, (void)n_tok,
        (void)k_cache, (void)v_cache, (void)stream;
    return NONE;
}
int64_t cuda_attention_scratch_floats(const tm_cuda_attn_params *p, int64_t n_tok,
                                      int64_t n_kv_max) {
    (void)p, (void)n_tok, (void)n_kv_max;
    return 0;
}
tm_status cuda_attention(const tm_cuda_attn_params *p, const float *q, const void *k_cache,
                         const void *v_cache, const int32_t *pos0, int64_t n_tok, int64_t n_kv_max,
                         float *out, float *scratch, tm_cuda_stream stream) {
    (void)p, (void)q, (void)k_cache, (void)v_cache, (void)pos0, (void)n_tok, (void)n_kv_max,
        (void)out, (void)scratch, (void)stream;
    return NONE;
}
tm_status cuda_blas_create(tm_cuda_device *dev, tm_cuda_blas **out) {
    (void)dev, *out = NULL;
    return NONE;
}
void cuda_blas_free(tm_cuda_blas *b) {
    (void)b;
}
tm_status cuda_dequantize_f16(tm_type type, const void *w, size_t row_bytes, int64_t rows,
                              int64_t k, void *out_f16, tm_cuda_stream stream) {
    (void)type, (void)w, (void)row_bytes, (void)rows, (void)k, (void)out_f16, (void)stream;
    return NONE;
}
size_t cuda_gemm_scratch_bytes(int64_t rows, int64_t k, int64_t n_tok) {
    (void)rows, (void)k, (void)n_tok;
    return 0;
}
size_t cuda_gemm_heads_scratch_bytes(tm_type type, int64_t in, int64_t out, int64_t n_head) {
    (void)type, (void)in, (void)out, (void)n_head;
    return 0;
}
tm_status cuda_gemm_heads(tm_cuda_blas *b, tm_type type, const void *w, size_t row_bytes,
                          int64_t in, int64_t out, int64_t n_head, const float *x, int64_t ldx,
                          int64_t hx, int64_t n_tok, float *y, int64_t ldy, int64_t hy,
                          void *scratch, tm_cuda_stream stream) {
    (void)b, (void)type, (void)w, (void)row_bytes, (void)in, (void)out, (void)n_head, (void)x,
        (void)ldx, (void)hx, (void)n_tok, (void)y, (void)ldy, (void)hy, (void)scratch, (void)stream;
    return NONE;
}
tm_status cuda_gemm(tm_cuda_blas *b, tm_type type, const void *w, size_t row_bytes, int64_t rows,
                    int64_t k, const float *x, int64_t n_tok, float *y, void *scratch,
                    tm_cuda_stream stream) {
    (void)b, (void)type, (void)w, (void)row_bytes, (void)rows, (void)k, (void)x, (void)n_tok,
        (void)y, (void)scratch, (void)stream;
    return NONE;
}
size_t cuda_moe_grouped_gemm_scratch_bytes(const tm_cuda_moe_params *p, int64_t n_items,
                                           int32_t n_groups) {
    (void)p, (void)n_items, (void)n_groups;
    return 0;
}
tm_status cuda_moe_grouped_gemm(tm_cuda_blas *b, const tm_cuda_moe_params *p,
                                const tm_cuda_moe_groups *g, const float *x, int64_t n_tok,
                                float *y, void *scratch, tm_cuda_stream stream) {
    (void)b, (void)p, (void)g, (void)x, (void)n_tok, (void)y, (void)scratch, (void)stream;
    return NONE;
}
tm_status cuda_signal_host(const tm_cuda_span *spans, int n_spans, uint32_t *flag,
                           const uint32_t *seq, tm_cuda_stream stream) {
    (void)spans, (void)n_spans, (void)flag, (void)seq, (void)stream;
    return NONE;
}
tm_status cuda_wait_host_unless(const int32_t *need, int32_t n_need, const uint32_t *flag,
                                const uint32_t *seq, uint64_t timeout_ns, uint32_t *err, float *x,
                                const float *add, int64_t n, tm_cuda_stream stream) {
    (void)need, (void)n_need, (void)flag, (void)seq, (void)timeout_ns, (void)err, (void)x,
        (void)add, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_wait_host(const uint32_t *flag, const uint32_t *seq, uint64_t timeout_ns,
                         uint32_t *err, float *x, const float *add, int64_t n,
                         tm_cuda_stream stream) {
    (void)flag, (void)seq, (void)timeout_ns, (void)err, (void)x, (void)add, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_ssm_conv(const tm_cuda_ssm_rows *rows, float *x, int64_t C, int32_t K,
                        const float *w, float *state, tm_cuda_stream stream) {
    (void)rows, (void)x, (void)C, (void)K, (void)w, (void)state, (void)stream;
    return NONE;
}
tm_status cuda_delta_rule(const tm_cuda_delta_params *p, const tm_cuda_ssm_rows *rows,
                          const float *qkv, const float *b, const float *a, float *state,
                          float *out, tm_cuda_stream stream) {
    (void)p, (void)rows, (void)qkv, (void)b, (void)a, (void)state, (void)out, (void)stream;
    return NONE;
}
tm_status cuda_rmsnorm_gated(float *x, const float *z, const float *w, int64_t n_rows,
                             int64_t n_per_row, int64_t n, float eps, tm_cuda_stream stream) {
    (void)x, (void)z, (void)w, (void)n_rows, (void)n_per_row, (void)n, (void)eps, (void)stream;
    return NONE;
}
tm_status cuda_unzip(const float *src, float *a, float *b, int64_t n_tok, int64_t n_group,
                     int64_t na, int64_t nb, tm_cuda_stream stream) {
    (void)src, (void)a, (void)b, (void)n_tok, (void)n_group, (void)na, (void)nb, (void)stream;
    return NONE;
}
tm_status cuda_swiglu(float *y, const float *g, const float *u, int64_t n, tm_cuda_stream stream) {
    (void)y, (void)g, (void)u, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_scale(float *x, float s, int64_t n, tm_cuda_stream stream) {
    (void)x, (void)s, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_softcap(float *x, float cap, int64_t n, tm_cuda_stream stream) {
    (void)x, (void)cap, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_geglu(float *y, const float *g, const float *u, int64_t n, tm_cuda_stream stream) {
    (void)y, (void)g, (void)u, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_gate_mul(float *y, const float *g, int64_t n, tm_cuda_stream stream) {
    (void)y, (void)g, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_gate_add(float *x, float *y, const float *s, int64_t n_rows, int64_t n,
                        tm_cuda_stream stream) {
    (void)x, (void)y, (void)s, (void)n_rows, (void)n, (void)stream;
    return NONE;
}
tm_status cuda_mla_prepare(const tm_cuda_attn_params *p, float *q, float *kv, const float *kv_norm,
                           const int32_t *pos0, int64_t n_tok, void *k_cache,
                           tm_cuda_stream stream) {
    (void)p, (void)q, (void)kv, (void)kv_norm, (void)pos0, (void)n_tok, (void)k_cache, (void)stream;
    return NONE;
}
int64_t cuda_mla_scratch_floats(const tm_cuda_attn_params *p, int64_t n_tok) {
    (void)p, (void)n_tok;
    return 0;
}
tm_status cuda_mla_attention(const tm_cuda_attn_params *p, const float *q, const void *k_cache,
                             const int32_t *pos0, int64_t n_tok, float *out, float *scratch,
                             tm_cuda_stream stream) {
    (void)p, (void)q, (void)k_cache, (void)pos0, (void)n_tok, (void)out, (void)scratch,
        (void)stream;
    return NONE;
}
tm_status cuda_copy_rows(float *dst, int64_t dst_ld, const float *src, int64_t src_ld, int64_t rows,
                         int64_t n, tm_cuda_stream stream) {
    (void)dst, (void)dst_ld, (void)src, (void)src_ld, (void)rows, (void)n, (void)stream;
    return NONE;
}
