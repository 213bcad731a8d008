/* Host mock of the CUDA backend's C API (src/cuda/cuda.h) for
 * scripts/cuda_emu_check.sh: tests/test_cuda_ops.c links against it instead
 * of the real backend, so the harness's plumbing, references and tolerances
 * run on a machine without a GPU. mmvq and the grouped experts call the real
 * device functions of src/cuda/mmvq.cuh lane by lane (the kernels' loops are
 * mirrored here); the router runs the real kernel on an emulated warp;
 * RMSNorm/RoPE mirror their kernels. MOCK_FAST=1 skips the arithmetic (for
 * the bench's code paths), MOCK_NODEV=1 makes the device open fail. */
#include "cuda_warp_shim.h"
#include "router_kernel.cpp" /* extracted by the script: the kernel without its launcher */
#include "cuda/mmvq.cuh"
#include <chrono>
#include <stdlib.h>
#include <stdio.h>
struct tm_cuda_device { tm_cuda_device_info info; };
struct tm_cuda_pool { char *base; size_t size, used; };
struct tm_cuda_timer { std::chrono::steady_clock::time_point t0; };
static bool fast() { return getenv("MOCK_FAST") != nullptr; }
extern "C" {
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
tm_status cuda_mmvq(tm_type type, const void *w, size_t row_bytes, int64_t rows, int64_t k, const float *x, int64_t n_tok, float *y, tm_cuda_stream) {
    if (rows <= 0 || n_tok < 1 || n_tok > 8) return tm_error_set(TM_ERR_ARG, "mock mmvq args");
    bool v16; tm_status st = tm_mmvq_check("cuda_mmvq", type, w, row_bytes, k, x, &v16); if (st) return st;
    if (fast()) { y[0] = 1; y[n_tok * rows - 1] = 1; return TM_OK; }
    for (int64_t r = 0; r < rows; r++) { float o[8]; row_dot(type, (const uint8_t *)w + r * row_bytes, k, v16, x, k, (int)n_tok, o); for (int t = 0; t < n_tok; t++) y[t * rows + r] = o[t]; }
    return TM_OK;
}
int64_t cuda_moe_scratch_floats(const tm_cuda_moe_params *p, int64_t n) { return n * p->n_ff; }
tm_status cuda_moe_grouped(const tm_cuda_moe_params *p, const tm_cuda_moe_item *items, int64_t n, const float *x, int64_t n_tok, float *y, float *h, tm_cuda_stream) {
    bool a, b, c;
    tm_status st;
    if ((st = tm_mmvq_check("g", p->gate.type, p->gate.data, p->gate.row_bytes, p->n_embd, x, &a))) return st;
    if ((st = tm_mmvq_check("u", p->up.type, p->up.data, p->up.row_bytes, p->n_embd, x, &b))) return st;
    if ((st = tm_mmvq_check("d", p->down.type, p->down.data, p->down.row_bytes, p->n_ff, h, &c))) return st;
    if (fast()) return TM_OK;
    for (int64_t i = 0; i < n; i++) {
        tm_cuda_moe_item it = items[i];
        bool ok = it.slot >= 0 && it.slot < p->n_slots && it.token >= 0 && it.token < n_tok;
        for (int64_t r = 0; r < p->n_ff; r++) {
            if (!ok) { h[i * p->n_ff + r] = 0; continue; }
            float g, u;
            row_dot(p->gate.type, (const uint8_t *)p->gate.data + it.slot * p->gate.expert_stride + r * p->gate.row_bytes, p->n_embd, a, x + it.token * p->n_embd, p->n_embd, 1, &g);
            row_dot(p->up.type, (const uint8_t *)p->up.data + it.slot * p->up.expert_stride + r * p->up.row_bytes, p->n_embd, b, x + it.token * p->n_embd, p->n_embd, 1, &u);
            h[i * p->n_ff + r] = g / (1.0f + expf(-g)) * u;
        }
        if (!ok) continue;
        for (int64_t r = 0; r < p->n_embd; r++) {
            float o;
            row_dot(p->down.type, (const uint8_t *)p->down.data + it.slot * p->down.expert_stride + r * p->down.row_bytes, p->n_ff, c, h + i * p->n_ff, p->n_ff, 1, &o);
            y[it.token * p->n_embd + r] += it.weight * o;
        }
    }
    return TM_OK;
}
tm_status cuda_router_select(const tm_cuda_router_params *p, const float *l, int64_t T, int32_t *ids, float *w, tm_cuda_stream) {
    if (fast()) return TM_OK;
    for (int64_t t = 0; t < T; t++) emu_warp((unsigned)(t / 4), 0, (int)(t % 4), [&] { tm_router_kernel(*p, l, T, ids, w); });
    return TM_OK;
}
tm_status cuda_rmsnorm(float *y, const float *x, const float *w, int64_t R, int64_t n, float eps, tm_cuda_stream) {
    for (int64_t r = 0; r < R; r++) {
        float part[256] = {0};
        for (int th = 0; th < 256; th++) for (int64_t i = th; i < n; i += 256) part[th] += x[r * n + i] * x[r * n + i];
        float tot = 0; for (int th = 0; th < 256; th++) tot += part[th];
        float sc = 1.0f / sqrtf(tot / (float)n + eps);
        for (int64_t i = 0; i < n; i++) y[r * n + i] = w ? x[r * n + i] * sc * w[i] : x[r * n + i] * sc;
    }
    return TM_OK;
}
tm_status cuda_rope_neox(float *x, const int32_t *pos, int64_t T, int64_t H, int64_t D, float base, tm_cuda_stream) {
    int64_t half = D / 2;
    for (int64_t g = 0; g < T * H * half; g++) {
        int64_t i = g % half, th = g / half, t = th / H;
        double theta = (double)pos[t] * pow((double)base, -2.0 * (double)i / (double)D);
        float c = (float)cos(theta), s = (float)sin(theta); float *xh = x + th * D; float a = xh[i], b = xh[i + half];
        xh[i] = fmaf(a, c, -b * s); xh[i + half] = fmaf(a, s, b * c);
    }
    return TM_OK;
}
tm_status cuda_add(float *y, const float *a, const float *b, int64_t n, tm_cuda_stream) { for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; return TM_OK; }
}
