/* Host emulation of CUDA device code for a check without a GPU
 * (scripts/cuda_emu_check.sh): g++ compiles the kernels' device code as host
 * code. A block's threads are fibers (ucontext) of the calling thread, run
 * round-robin: a shuffle or __syncthreads is a barrier that yields until every
 * live thread of the warp or block arrived, and a thread that returns leaves
 * its barriers. __shared__ variables are static (blocks run one at a time);
 * emu_launch runs a launch's blocks in order (tests/emu/cuda_emu_extract.py
 * turns each `kernel<<<...>>>(...)` of a .cu into one). Not a substitute for
 * running tests/test_cuda_ops on a GPU: a misreading of an intrinsic shared by
 * kernel and shim would pass here, and races are not found. */
#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <ucontext.h>
#include <functional>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#undef __shared__
#define __shared__ static
#undef __global__
#define __global__ static
#define __launch_bounds__(...)
struct emu_idx {
    unsigned x, y, z;
};
static emu_idx tl_tid, tl_bid, tl_bdim, tl_gdim;
#define threadIdx tl_tid
#define blockIdx  tl_bid
#define blockDim  tl_bdim
#define gridDim   tl_gdim
struct emu_bar {
    int expected, arrived;
    unsigned gen;
};
struct emu_fiber {
    ucontext_t ctx; /* its start */
    jmp_buf at;     /* where it yielded */
    bool started;
    emu_idx tid;
    int warp;
    bool done;
};
static ucontext_t g_sched;
static jmp_buf g_sched_at;
static std::vector<emu_fiber> g_fib;
static struct emu_stacks { /* the fibers' stacks, kept for the next block */
    std::vector<char *> v;
    ~emu_stacks() {
        for (char *p : v) free(p);
    }
} g_stacks;
static std::vector<emu_bar> g_warp_bar;
static emu_bar g_block_bar;
static int g_cur;
static const std::function<void()> *g_fn;
static float g_xf[64][32]; /* a warp's shuffle slots (at most 64 warps a block) */
static int g_xi[64][32];
static unsigned char *g_dyn_smem; /* the launch's dynamic shared memory */
static size_t g_dyn_size;
#define EMU_STACK (64 << 10)
/* Switches are _setjmp/_longjmp (no signal mask syscall, unlike swapcontext,
 * which only starts a fiber): a third of the run's time otherwise. */
static void emu_yield() {
    if (!_setjmp(g_fib[g_cur].at)) _longjmp(g_sched_at, 1);
}
static void emu_bar_wait(emu_bar &b) {
    const unsigned g = b.gen;
    if (++b.arrived >= b.expected) {
        b.arrived = 0, b.gen++;
        return;
    }
    while (b.gen == g) emu_yield();
}
static void emu_bar_leave(emu_bar &b) {
    if (--b.expected > 0 && b.arrived >= b.expected) b.arrived = 0, b.gen++;
}
static void emu_fiber_main() {
    (*g_fn)();
    emu_fiber &f = g_fib[g_cur];
    f.done = true;
    emu_bar_leave(g_warp_bar[f.warp]);
    emu_bar_leave(g_block_bar);
    _longjmp(g_sched_at, 1); /* never returns: the scheduler's frame is the live one */
}
/* Run fn as every thread of block `bid` of a launch (threads first..first+n-1
 * of a block of bdim). */
static void emu_block(emu_idx gdim, emu_idx bdim, emu_idx bid, unsigned first, unsigned n,
                      const std::function<void()> &fn) {
    const unsigned warps = (first % 32 + n + 31) / 32;
    if (warps > 64) {
        fprintf(stderr, "emu: %u warps a block (at most 64)\n", warps);
        abort();
    }
    g_fib.assign(n, emu_fiber{});
    g_warp_bar.assign(warps, emu_bar{0, 0, 0});
    g_block_bar = emu_bar{(int)n, 0, 0};
    while (g_stacks.v.size() < n) g_stacks.v.push_back((char *)malloc(EMU_STACK));
    g_fn = &fn, tl_gdim = gdim, tl_bdim = bdim, tl_bid = bid;
    for (unsigned i = 0; i < n; i++) {
        const unsigned t = first + i;
        emu_fiber &f = g_fib[i];
        f.tid = {t % bdim.x, t / bdim.x % bdim.y, t / (bdim.x * bdim.y)};
        f.warp = (int)(t / 32 - first / 32);
        g_warp_bar[f.warp].expected++;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = g_stacks.v[i];
        f.ctx.uc_stack.ss_size = EMU_STACK;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, emu_fiber_main, 0);
    }
    for (bool live = true; live;) {
        live = false;
        for (unsigned i = 0; i < n; i++) {
            if (g_fib[i].done) continue;
            g_cur = (int)i, tl_tid = g_fib[i].tid;
            if (!_setjmp(g_sched_at)) {
                if (g_fib[i].started) _longjmp(g_fib[i].at, 1);
                g_fib[i].started = true;
                swapcontext(&g_sched, &g_fib[i].ctx);
            }
            live |= !g_fib[i].done;
        }
    }
}
/* A launch: every block of grid, in order. */
static void emu_launch(const std::function<void()> &fn, dim3 grid, dim3 block, size_t smem = 0,
                       cudaStream_t = 0) {
    if (getenv("MOCK_FAST")) return; /* the bench's code paths only */
    std::vector<unsigned char> dyn(smem + 16);
    g_dyn_smem = dyn.data(), g_dyn_size = smem;
    const emu_idx gd = {grid.x, grid.y, grid.z}, bd = {block.x, block.y, block.z};
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++)
                emu_block(gd, bd, {x, y, z}, 0, block.x * block.y * block.z, fn);
    g_dyn_smem = nullptr;
}
/* run fn as warp `warp` of block (bx, by) of 32 * (warp + 1) threads */
static void emu_warp(unsigned bx, unsigned by, int warp, const std::function<void()> &fn) {
    const unsigned n = 32 * (unsigned)(warp + 1);
    emu_block({bx + 1, by + 1, 1}, {n, 1, 1}, {bx, by, 0}, 32 * (unsigned)warp, 32, fn);
}
static int lane_now() {
    return (int)(tl_tid.x & 31);
}
static int warp_now() {
    return g_fib[g_cur].warp;
}
/* a warp's exchange: every live lane writes, then reads lane src (or l ^ src) */
template <class T> static inline T emu_shfl(T (&slots)[64][32], T v, int src, bool by_xor) {
    const int l = lane_now(), w = warp_now();
    slots[w][l] = v;
    emu_bar_wait(g_warp_bar[w]);
    const T r = slots[w][(by_xor ? l ^ src : src) & 31];
    emu_bar_wait(g_warp_bar[w]); /* every read done before the next write */
    return r;
}
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    return emu_shfl(g_xf, v, o, true);
}
static inline int __shfl_xor_sync(unsigned, int v, int o) {
    return emu_shfl(g_xi, v, o, true);
}
static inline float __shfl_sync(unsigned, float v, int s) {
    return emu_shfl(g_xf, v, s, false);
}
static inline int __shfl_sync(unsigned, int v, int s) {
    return emu_shfl(g_xi, v, s, false);
}
static inline void __syncthreads() {
    emu_bar_wait(g_block_bar);
}
/* an emulated launch has no shared memory limit to raise */
template <class F> static inline cudaError_t cudaFuncSetAttribute(F *, cudaFuncAttribute, int) {
    return cudaSuccess;
}
/* single IEEE operations, rounded to nearest (never contracted: the script's
 * g++ targets x86-64 without FMA) */
static inline float __fmul_rn(float a, float b) {
    return a * b;
}
static inline float __fadd_rn(float a, float b) {
    return a + b;
}
static inline float __fsub_rn(float a, float b) {
    return a - b;
}
/* cvt.rni: to the nearest integer, ties to even (the default rounding mode) */
static inline int __float2int_rn(float x) {
    return (int)nearbyintf(x);
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
    const int l = lane_now(), w = warp_now();
    g_xi[w][l] = pred != 0;
    emu_bar_wait(g_warp_bar[w]);
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)g_xi[w][i] << i;
    emu_bar_wait(g_warp_bar[w]);
    return r;
}
static inline int __popc(unsigned v) {
    return __builtin_popcount(v);
}
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
static inline float atomicAdd(float *p, float v) { /* one thread runs at a time */
    const float o = *p;
    *p += v;
    return o;
}
