/* Host emulation of CUDA device code for a dev check without a GPU
 * (scripts/cuda_emu_check.sh): g++ compiles the kernels' device functions as
 * host code; one warp is 32 std::threads whose shuffles meet at a barrier.
 * Not a substitute for running tests/test_cuda_ops on a GPU: a misreading of
 * an intrinsic shared by kernel and shim would pass here. */
#include <math.h>
#include <string.h>
#include <barrier>
#include <thread>
#include <mutex>
#include <functional>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
struct emu_idx {
    unsigned x, y, z;
};
thread_local emu_idx tl_tid, tl_bid;
#define threadIdx tl_tid
#define blockIdx  tl_bid
static std::barrier<> *g_bar;
static float g_xf[32];
static int g_xi[32];
static int lane_now() {
    return (int)(tl_tid.x & 31);
}
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    int l = lane_now();
    g_bar->arrive_and_wait();
    g_xf[l] = v;
    g_bar->arrive_and_wait();
    float r = g_xf[l ^ o];
    g_bar->arrive_and_wait();
    return r;
}
static inline int __shfl_xor_sync(unsigned, int v, int o) {
    int l = lane_now();
    g_bar->arrive_and_wait();
    g_xi[l] = v;
    g_bar->arrive_and_wait();
    int r = g_xi[l ^ o];
    g_bar->arrive_and_wait();
    return r;
}
template <class T> static inline T __ldg(const T *p) {
    return *p;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* PRMT: byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {y:x} */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
/* PTX prmt.b32 (tm_prmt of mmvq_fast.cuh): as above, but bit 3 of a selector
 * nibble replicates the selected byte's sign bit over the result byte */
#define TM_CUDA_EMU_PRMT 1
static inline unsigned tm_prmt(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        const unsigned n = (s >> (4 * i)) & 15, b = (unsigned)(v >> (8 * (n & 7))) & 0xff;
        r |= (n & 8 ? (b & 0x80 ? 0xffu : 0u) : b) << (8 * i);
    }
    return r;
}
static inline unsigned __ballot_sync(unsigned, int pred) {
    int l = lane_now();
    g_bar->arrive_and_wait();
    g_xi[l] = pred != 0;
    g_bar->arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)g_xi[i] << i;
    g_bar->arrive_and_wait();
    return r;
}
static inline int __popc(unsigned v) {
    return __builtin_popcount(v);
}
/* one warp runs at a time: block-wide barriers have nothing to wait for */
static inline void __syncthreads() {}
/* IDP4A: four signed byte products of a and b, plus c */
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++)
        c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
/* SHF.R: the low word of {hi:lo} >> (s & 31) */
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    s &= 31;
    return s ? (lo >> s) | (hi << (32 - s)) : lo;
}
static std::mutex g_atomic;
static inline float atomicAdd(float *p, float v) {
    std::lock_guard<std::mutex> g(g_atomic);
    float o = *p;
    *p += v;
    return o;
}
/* run fn as warp `warp` of block (bx, by) */
static void emu_warp(unsigned bx, unsigned by, int warp, const std::function<void()> &fn) {
    std::barrier<> bar(32);
    g_bar = &bar;
    std::thread th[32];
    for (int l = 0; l < 32; l++)
        th[l] = std::thread([&, l] {
            tl_tid = {(unsigned)(32 * warp + l), 0, 0};
            tl_bid = {bx, by, 0};
            fn();
        });
    for (auto &t : th) t.join();
}
