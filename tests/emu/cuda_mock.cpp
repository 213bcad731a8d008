/* Host mock of the CUDA backend's C API (src/cuda/cuda.h) for
 * scripts/cuda_emu_check.sh: tests/test_cuda_ops.c links against it instead
 * of the real backend, so the harness's plumbing, references and tolerances
 * run on a machine without a GPU. The ops of router.cu, norm_rope.cu, ssm.cu,
 * mmvq_q8x.cu, mmvq_lbx.cu, moe_fetch.cu and attention.cu are not here: the script compiles those files themselves,
 * launchers and kernels, with each launch run on an emulated grid
 * (cuda_emu_extract.py, cuda_warp_shim.h). mmvq and the grouped experts call
 * the real device functions of src/cuda/mmvq.cuh and mmvq_fast.cuh lane by
 * lane, with the launchers' path choice, rows per warp and k split (the
 * kernels' loops and warp/block sums are mirrored here), the grouped 8-bit
 * path quantizing with the real quantizer. MOCK_FAST=1 skips the arithmetic
 * of the ops here (for the bench's code paths), MOCK_NODEV=1 makes the device
 * open fail. */
#include "cuda_warp_shim.h"
#include "cuda/attention.cuh"
#include "cuda/mla_tc.cuh"
#include "cuda/mmvq_lbx.cuh"
#include "cuda/moe_ext.cuh"
#include <chrono>
#include <stdlib.h>
#include <stdio.h>
struct tm_cuda_device { tm_cuda_device_info info; };
struct tm_cuda_pool { char *base; size_t size, used; };
struct tm_cuda_timer { std::chrono::steady_clock::time_point t0; };
static bool fast() { return getenv("MOCK_FAST") != nullptr; }
/* attention_tc.cu's tensor-core prompt path (mma.sync) is not emulated:
 * attention.cu gives every prompt to its f32 kernel */
bool tm_attn_tc_ok(const tm_attn_args &, bool) { return false; }
tm_status tm_attn_tc_launch(const tm_attn_args &, tm_cuda_stream) { return tm_error_set(TM_ERR_UNSUPPORTED, "emu: no tensor cores"); }
/* nor mla_tc.cu's: mla.cu gives every shape to its f32 kernel */
bool tm_mla_tc_ok(const tm_cuda_attn_params &, const void *, const void *, const void *) { return false; }
int64_t tm_mla_tc_splits(const tm_cuda_attn_params &, int64_t) { return 1; }
int64_t tm_mla_tc_scratch_floats(const tm_cuda_attn_params &, int64_t) { return 0; }
tm_status tm_mla_tc_launch(const tm_cuda_attn_params &, const float *, const void *, const int32_t *, int64_t, float *, float *, tm_cuda_stream) { return tm_error_set(TM_ERR_UNSUPPORTED, "emu: no tensor cores"); }
/* the real quantizer (mmvq_q8x.cu, compiled by the script) */
tm_status tm_q8x_quantize_n(const float *x, int64_t n, int8_t *q, float *d, cudaStream_t stream);
extern "C" {
/* the launch checks of the compiled .cu files: an emulated launch cannot fail */
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t) { return "no error"; }
tm_status cuda_device_open(int index, tm_cuda_device **out) {
    if (getenv("MOCK_NODEV")) return tm_error_set(TM_ERR_DEVICE, "mock: no device");
    *out = (tm_cuda_device *)calloc(1, sizeof(tm_cuda_device)); snprintf((*out)->info.name, 256, "mock"); (*out)->info.cc_major = 9; (*out)->info.l2_bytes = 50 << 20; return TM_OK; }
void cuda_device_close(tm_cuda_device *d) { free(d); }
const tm_cuda_device_info *cuda_device_info(const tm_cuda_device *d) { return &d->info; }
tm_cuda_stream cuda_device_stream(const tm_cuda_device *) { return nullptr; }
tm_status cuda_device_sync(tm_cuda_device *) { return TM_OK; }
tm_status cuda_pool_create(tm_cuda_device *, size_t bytes, tm_cuda_pool **out) {
    tm_cuda_pool *p = (tm_cuda_pool *)calloc(1, sizeof(*p)); p->base = (char *)aligned_alloc(256, bytes); p->size = bytes; *out = p; return TM_OK; }
tm_status cuda_pool_alloc(tm_cuda_pool *pool, size_t bytes, size_t align, void **out) {
    if (!align) align = 256; uintptr_t base = (uintptr_t)pool->base; uintptr_t at = (base + pool->used + align - 1) & ~(uintptr_t)(align - 1);
    size_t off = at - base; if (off > pool->size || bytes > pool->size - off) return tm_error_set(TM_ERR_DEVICE, "mock pool full: %zu", bytes);
    pool->used = off + bytes; *out = pool->base + off; return TM_OK; }
void cuda_pool_reset(tm_cuda_pool *p) { p->used = 0; }
tm_status cuda_host_alloc_mapped(size_t bytes, void **host, void **dev) {
    *host = *dev = aligned_alloc(256, (bytes + 255) & ~(size_t)255); return *host ? TM_OK : tm_error_set(TM_ERR_NOMEM, "mock: %zu bytes", bytes); }
void cuda_host_free(void *p) { free(p); }
void cuda_pool_free(tm_cuda_pool *p) { if (p) { free(p->base); free(p); } }
tm_status cuda_copy_to_device(tm_cuda_device *, void *d, const void *s, size_t n) { memcpy(d, s, n); return TM_OK; }
tm_status cuda_copy_to_host(tm_cuda_device *, void *d, const void *s, size_t n) { memcpy(d, s, n); return TM_OK; }
tm_status cuda_fill_bytes(tm_cuda_device *, void *d, int b, size_t n) { memset(d, b, n); return TM_OK; }
tm_status cuda_copy_device(tm_cuda_device *, void *d, const void *s, size_t n) { if (!fast()) memcpy(d, s, n); return TM_OK; }
tm_status cuda_upload(tm_cuda_device *, void *d, const void *s, size_t n, double *r) { memcpy(d, s, n); *r = 1e10; return TM_OK; }
tm_status cuda_timer_create(tm_cuda_device *, tm_cuda_timer **out) { *out = new tm_cuda_timer; return TM_OK; }
tm_status cuda_timer_start(tm_cuda_timer *t) { t->t0 = std::chrono::steady_clock::now(); return TM_OK; }
tm_status cuda_timer_stop(tm_cuda_timer *t, float *ms) { *ms = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t->t0).count() + 1e-3f; return TM_OK; }
void cuda_timer_free(tm_cuda_timer *t) { delete t; }

static float row_dot(int type, const uint8_t *row, int64_t k, bool v16, const float *x, int64_t xs, int nt, float *out) {
    float tot[8] = {0};
    for (int lane = 0; lane < 32; lane++) { float acc[8] = {0}; tm_mmvq_row_partial(type, row, k, v16, x, xs, nt, lane, acc); for (int t = 0; t < nt; t++) tot[t] += acc[t]; }
    for (int t = 0; t < nt; t++) out[t] = tot[t];
    return tot[0];
}
} /* extern "C": the fast path's helpers are templates */
/* Fast path: the kernels' row groups, k split and lanes, summed as the kernel does. */
template <int TYPE, int NT, int R>
static void fast_rows(const uint8_t *const *rp, int64_t k, const float *x, int64_t xs, int nt, int ks, float (&out)[R][NT]) {
    for (int r = 0; r < R; r++) for (int t = 0; t < NT; t++) out[r][t] = 0;
    for (int kp = 0; kp < ks; kp++) {
        float part[R][NT] = {};
        for (int lane = 0; lane < 32; lane++) { float acc[R][NT] = {}; tm_fast_rows<TYPE, NT, R>(acc, rp, k, x, xs, nt, lane, kp, ks); for (int r = 0; r < R; r++) for (int t = 0; t < NT; t++) part[r][t] += acc[r][t]; }
        for (int r = 0; r < R; r++) for (int t = 0; t < NT; t++) out[r][t] += part[r][t];
    }
}
template <int TYPE, int NT>
static void fast_mmvq(const uint8_t *w, size_t rb, int64_t rows, int64_t k, const float *x, int nt, float *y) {
    constexpr int R = NT <= 2 ? 4 : 2;
    const int64_t groups = tm_cdiv(rows, R);
    const int ks = tm_fast_ksplit(groups, tm_fast_steps((tm_type)TYPE, k));
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *rp[R];
        for (int r = 0; r < R; r++) rp[r] = w + (g * R + r < rows ? g * R + r : rows - 1) * rb;
        float o[R][NT];
        fast_rows<TYPE, NT, R>(rp, k, x, k, nt, ks, o);
        for (int r = 0; r < R; r++) for (int t = 0; t < nt; t++) if (g * R + r < rows) y[t * rows + g * R + r] = o[r][t];
    }
}
template <int TYPE>
static void fast_mmvq_nt(const uint8_t *w, size_t rb, int64_t rows, int64_t k, const float *x, int nt, float *y) {
    if (nt == 1) fast_mmvq<TYPE, 1>(w, rb, rows, k, x, nt, y);
    else if (nt == 2) fast_mmvq<TYPE, 2>(w, rb, rows, k, x, nt, y);
    else if (nt <= 4) fast_mmvq<TYPE, 4>(w, rb, rows, k, x, nt, y);
    else fast_mmvq<TYPE, 8>(w, rb, rows, k, x, nt, y);
}
/* fast gate/up for one item: h[r] over all n_ff rows, 2 rows of each per warp */
template <int TYPE>
static void fast_gate_up(const tm_cuda_moe_params *p, int32_t ex, const uint8_t *g, const uint8_t *u, const float *xt, float *h) {
    constexpr int F = TM_MOE_FAST_FF;
    for (int64_t r0 = 0; r0 < p->n_ff; r0 += F) {
        const uint8_t *rp[2 * F];
        for (int i = 0; i < F; i++) { int64_t r = r0 + i < p->n_ff ? r0 + i : p->n_ff - 1; rp[i] = g + r * p->gate.row_bytes; rp[F + i] = u + r * p->up.row_bytes; }
        float o[2 * F][1];
        fast_rows<TYPE, 1, 2 * F>(rp, p->n_embd, xt, p->n_embd, 1, 1, o);
        for (int i = 0; i < F; i++) if (r0 + i < p->n_ff) h[r0 + i] = tm_moe_ext_h(p->ext, ex, r0 + i, p->n_ff, o[i][0], o[F + i][0]);
    }
}
template <int TYPE>
static void fast_down(const tm_cuda_moe_params *p, int32_t ex, const uint8_t *d, const float *h, float wt, float *yt) {
    constexpr int E = TM_MOE_FAST_E;
    for (int64_t r0 = 0; r0 < p->n_embd; r0 += E) {
        const uint8_t *rp[E];
        for (int i = 0; i < E; i++) rp[i] = d + (r0 + i < p->n_embd ? r0 + i : p->n_embd - 1) * p->down.row_bytes;
        float o[E][1];
        fast_rows<TYPE, 1, E>(rp, p->n_ff, h, p->n_ff, 1, 1, o);
        for (int i = 0; i < E; i++) if (r0 + i < p->n_embd) yt[r0 + i] += wt * (o[i][0] + tm_moe_ext_down(p->ext, ex, r0 + i, p->n_embd));
    }
}
#define MOCK_FAST_SWITCH(type, F, ...) \
    switch (type) { case TM_TYPE_Q4_K: F<TM_TYPE_Q4_K>(__VA_ARGS__); break; case TM_TYPE_Q8_0: F<TM_TYPE_Q8_0>(__VA_ARGS__); break; \
    case TM_TYPE_MXFP4: F<TM_TYPE_MXFP4>(__VA_ARGS__); break; \
    case TM_TYPE_F32: F<TM_TYPE_F32>(__VA_ARGS__); break; case TM_TYPE_F16: F<TM_TYPE_F16>(__VA_ARGS__); break; default: F<TM_TYPE_BF16>(__VA_ARGS__); break; }
extern "C" {
tm_status cuda_mmvq(tm_type type, const void *w, size_t row_bytes, int64_t rows, int64_t k, const float *x, int64_t n_tok, float *y, tm_cuda_stream) {
    tm_status st = cuda_mmvq_args_check(type, w, row_bytes, rows, k, x, n_tok); if (st) return st;
    const bool v16 = tm_mmvq_vec16(w, row_bytes);
    if (fast()) { y[0] = 1; y[n_tok * rows - 1] = 1; return TM_OK; }
    if (tm_fast_ok(type, (uintptr_t)w | row_bytes, k)) { MOCK_FAST_SWITCH(type, fast_mmvq_nt, (const uint8_t *)w, row_bytes, rows, k, x, (int)n_tok, y); return TM_OK; }
    for (int64_t r = 0; r < rows; r++) { float o[8]; row_dot(type, (const uint8_t *)w + r * row_bytes, k, v16, x, k, (int)n_tok, o); for (int t = 0; t < n_tok; t++) y[t * rows + r] = o[t]; }
    return TM_OK;
}
} /* extern "C" */
/* Call f.operator()<T>() for an 8-bit path type T of the grouped experts (q4_K, TM_CUDA_LBX_TYPES). */
template <class F> static void q8x_type_call(int type, F &&f) {
    switch (type) {
    case TM_TYPE_Q4_K: f.template operator()<TM_TYPE_Q4_K>(); break;
#define MOCK_LBX_CASE(T) case T: f.template operator()<T>(); break;
    TM_CUDA_LBX_TYPES(MOCK_LBX_CASE)
#undef MOCK_LBX_CASE
    default: abort();
    }
}
/* The fast kernels' 8-bit rows rp[0..R) · v, one warp, summed over lanes as tm_warp_sum. */
template <int TYPE, int R>
static void q8x_warp_rows(const uint8_t *const *rp, tm_q8x_view v, float (&o)[R]) {
    for (int j = 0; j < R; j++) o[j] = 0;
    for (int lane = 0; lane < 32; lane++) { float acc[R][1] = {}; tm_q8x_type_rows<TYPE, 1, R>(acc, rp, v, 1, lane, 0, 1); for (int j = 0; j < R; j++) o[j] += acc[j][0]; }
}
extern "C" {
/* The launcher's kernels one after the other: gate/up of every item into h (8-bit where
 * cuda_moe_q8x_gate_up says, x quantized with the real quantizer), h quantized where
 * cuda_moe_q8x_down says, then down of every item. */
tm_status cuda_moe_grouped(const tm_cuda_moe_params *p, const tm_cuda_moe_item *items, int64_t n, const float *x, int64_t n_tok, float *y, float *h, tm_cuda_stream) {
    tm_status st = cuda_moe_grouped_args_check(p, n, x, n_tok, h); if (st || !n) return st;
    const bool a = tm_mmvq_vec16(p->gate.data, p->gate.row_bytes | p->gate.expert_stride), b = tm_mmvq_vec16(p->up.data, p->up.row_bytes | p->up.expert_stride),
               c = tm_mmvq_vec16(p->down.data, p->down.row_bytes | p->down.expert_stride);
    if (fast()) return TM_OK;
    const bool qgu = cuda_moe_q8x_gate_up(p, n, n_tok), qd = cuda_moe_q8x_down(p, n, n_tok);
    const tm_cuda_moe_q8x_scratch q = cuda_moe_q8x_scratch(p, n, n_tok, h);
    if (qgu && (st = tm_q8x_quantize_n(x, n_tok * p->n_embd, q.xq, q.xd, nullptr))) return st;
    constexpr int F = TM_MOE_FAST_FF, E = TM_MOE_FAST_E;
    const bool fgu = tm_moe_fast_gate_up(p), fd = tm_moe_fast_matrix(&p->down, p->n_ff);
    for (int64_t i = 0; i < n; i++) {
        const tm_cuda_moe_item it = items[i];
        const bool ok = tm_moe_item_valid(it, p->n_slots, n_tok, p->ext);
        const uint8_t *gb = (const uint8_t *)p->gate.data + it.slot * p->gate.expert_stride, *ub = (const uint8_t *)p->up.data + it.slot * p->up.expert_stride;
        if (!ok) { for (int64_t r = 0; r < p->n_ff; r++) h[i * p->n_ff + r] = 0; continue; }
        if (qgu) {
            const tm_q8x_view xv = {q.xq + it.token * p->n_embd, q.xd + it.token * (p->n_embd / 32), p->n_embd};
            for (int64_t r0 = 0; r0 < p->n_ff; r0 += F) {
                const uint8_t *rp[2 * F];
                for (int j = 0; j < F; j++) { int64_t r = r0 + j < p->n_ff ? r0 + j : p->n_ff - 1; rp[j] = gb + r * p->gate.row_bytes; rp[F + j] = ub + r * p->up.row_bytes; }
                float o[2 * F];
                q8x_type_call(p->gate.type, [&]<int T>() { q8x_warp_rows<T, 2 * F>(rp, xv, o); });
                for (int j = 0; j < F; j++) if (r0 + j < p->n_ff) h[i * p->n_ff + r0 + j] = tm_moe_ext_h(p->ext, it.expert, r0 + j, p->n_ff, o[j], o[F + j]);
            }
            continue;
        }
        if (fgu) { MOCK_FAST_SWITCH(p->gate.type, fast_gate_up, p, it.expert, gb, ub, x + it.token * p->n_embd, h + i * p->n_ff) continue; }
        for (int64_t r = 0; r < p->n_ff; r++) {
            float g, u;
            row_dot(p->gate.type, gb + r * p->gate.row_bytes, p->n_embd, a, x + it.token * p->n_embd, p->n_embd, 1, &g);
            row_dot(p->up.type, ub + r * p->up.row_bytes, p->n_embd, b, x + it.token * p->n_embd, p->n_embd, 1, &u);
            h[i * p->n_ff + r] = tm_moe_ext_h(p->ext, it.expert, r, p->n_ff, g, u);
        }
    }
    if (qd && (st = tm_q8x_quantize_n(h, n * p->n_ff, q.hq, q.hd, nullptr))) return st;
    for (int64_t i = 0; i < n; i++) {
        const tm_cuda_moe_item it = items[i];
        if (!tm_moe_item_valid(it, p->n_slots, n_tok, p->ext)) continue;
        const uint8_t *db = (const uint8_t *)p->down.data + it.slot * p->down.expert_stride;
        float *yt = y + it.token * p->n_embd;
        if (qd) {
            const tm_q8x_view hv = {q.hq + i * p->n_ff, q.hd + i * (p->n_ff / 32), p->n_ff};
            for (int64_t r0 = 0; r0 < p->n_embd; r0 += E) {
                const uint8_t *rp[E];
                for (int j = 0; j < E; j++) rp[j] = db + (r0 + j < p->n_embd ? r0 + j : p->n_embd - 1) * p->down.row_bytes;
                float o[E];
                q8x_type_call(p->down.type, [&]<int T>() { q8x_warp_rows<T, E>(rp, hv, o); });
                for (int j = 0; j < E; j++) if (r0 + j < p->n_embd) yt[r0 + j] += it.weight * (o[j] + tm_moe_ext_down(p->ext, it.expert, r0 + j, p->n_embd));
            }
            continue;
        }
        if (fd) { MOCK_FAST_SWITCH(p->down.type, fast_down, p, it.expert, db, h + i * p->n_ff, it.weight, yt); continue; }
        for (int64_t r = 0; r < p->n_embd; r++) {
            float o;
            row_dot(p->down.type, db + r * p->down.row_bytes, p->n_ff, c, h + i * p->n_ff, p->n_ff, 1, &o);
            yt[r] += it.weight * (o + tm_moe_ext_down(p->ext, it.expert, r, p->n_embd));
        }
    }
    return TM_OK;
}
}
