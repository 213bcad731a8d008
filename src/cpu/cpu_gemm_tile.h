/* Tiling driver shared by the SIMD kernel files: walks rows [r0, r1) in
 * chunks that stay in cache, tokens in tiles of up to NT, rows in tiles of up
 * to NR, and calls a microkernel specialised for the exact tile size (so its
 * loops unroll and its accumulators live in registers). A microkernel
 *   static void NAME(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t)
 * computes y for rows r..r+nr-1 and tokens t..t+nt-1 over the whole of k;
 * it must be always_inline so each constant (nr, nt) gets its own copy. */
#ifndef TM_CPU_GEMM_TILE_H
#define TM_CPU_GEMM_TILE_H

#include "cpu/cpu_internal.h"

typedef struct tm_tile_args {
    int64_t k;
    const char *w;
    size_t wrb;
    const char *x;
    size_t xrb;
    float *y;
    int64_t ldy;
} tm_tile_args;

#define TM_TILE_CASE(micro, R, T)                                                                  \
    case (R)*16 + (T):                                                                             \
        micro(R, T, a, r, t);                                                                      \
        break;
#define TM_TILE_T1(m, R)  TM_TILE_CASE(m, R, 1)
#define TM_TILE_T2(m, R)  TM_TILE_T1(m, R) TM_TILE_CASE(m, R, 2)
#define TM_TILE_T3(m, R)  TM_TILE_T2(m, R) TM_TILE_CASE(m, R, 3)
#define TM_TILE_T4(m, R)  TM_TILE_T3(m, R) TM_TILE_CASE(m, R, 4)
#define TM_TILE_R1(m, NT) TM_TILE_T##NT(m, 1)
#define TM_TILE_R2(m, NT) TM_TILE_R1(m, NT) TM_TILE_T##NT(m, 2)
#define TM_TILE_R3(m, NT) TM_TILE_R2(m, NT) TM_TILE_T##NT(m, 3)
#define TM_TILE_R4(m, NT) TM_TILE_R3(m, NT) TM_TILE_T##NT(m, 4)

/* Defines `static void name(...)` (a cpu_gemm_fn) with tiles of NR x NT
 * (literal numbers 1..4) from microkernel `micro`, and rows chunked by RCHUNK. */
#define TM_DEFINE_GEMM(attr, name, micro, NR, NT, RCHUNK)                                          \
    attr static void name##_tile(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t) {    \
        switch (nr * 16 + nt) { TM_TILE_R##NR(micro, NT) default : break; }                        \
    }                                                                                              \
    attr static void name(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,            \
                          const void *xq, size_t xrb, int64_t n_tok, float *y, int64_t ldy) {      \
        tm_tile_args args = {k, (const char *)w, wrb, (const char *)xq, xrb, y, ldy};              \
        for (int64_t rb = r0; rb < r1; rb += (RCHUNK)) {                                           \
            int64_t re = rb + (RCHUNK) < r1 ? rb + (RCHUNK) : r1;                                  \
            for (int64_t t = 0; t < n_tok; t += (NT)) {                                            \
                int nt = (int)(n_tok - t < (NT) ? n_tok - t : (NT));                               \
                for (int64_t r = rb; r < re; r += (NR)) {                                          \
                    int nr = (int)(re - r < (NR) ? re - r : (NR));                                 \
                    name##_tile(nr, nt, &args, r, t);                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

/* Defines `static void name(...)` (a cpu_gemm_fn for one token) from a decode
 * microkernel `micro`
 *   static void MICRO(int nr, const tm_tile_args *a, int64_t r)
 * (rows r..r+nr-1, always_inline): rows in tiles of NR (literal), what is left
 * in tiles of 4, 2 and 1 (the CPU lane's row chunks are whole tiles, so mostly
 * tests see these). */
#define TM_DEFINE_GEMV(attr, name, micro, NR)                                                      \
    attr static void name(int64_t k, const void *w, size_t wrb, int64_t r0, int64_t r1,            \
                          const void *xq, size_t xrb, int64_t n_tok, float *y, int64_t ldy) {      \
        (void)n_tok, (void)xrb;                                                                    \
        const tm_tile_args args = {k, (const char *)w, wrb, (const char *)xq, 0, y, ldy};          \
        int64_t r = r0;                                                                            \
        for (; r + (NR) <= r1; r += (NR)) micro(NR, &args, r);                                     \
        if (r1 - r >= 4) micro(4, &args, r), r += 4;                                               \
        if (r1 - r >= 2) micro(2, &args, r), r += 2;                                               \
        if (r1 - r >= 1) micro(1, &args, r);                                                       \
    }

#if defined(__x86_64__)
/* Prefetch bytes [off, off + bytes) of row r + nr + i, the same row of the next
 * row tile: a tile reads nr rows at once, more streams than the hardware
 * prefetcher follows well when they come from RAM (experts in RAM). */
TM_AVX2 static inline __attribute__((always_inline)) void
cpu_tile_prefetch(const tm_tile_args *a, int64_t r, int nr, int i, size_t off, size_t bytes) {
    const char *p = a->w + (size_t)(r + nr + i) * a->wrb + off;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
    _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
}

/* Store an nr x nt tile of 8-lane accumulators: y[t + j][r + i] = sum of acc[i][j]
 * (every AVX2 tile kernel ends with it). */
TM_AVX2 static inline __attribute__((always_inline)) void
cpu_tile_store_avx2(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t, __m256 acc[4][4]) {
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++)
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) a->y[(t + j) * a->ldy + r + i] = cpu_hsum8_avx2(acc[i][j]);
}

/* The AVX-512 level of the gemm kernels (F, BW, VL, DQ, VNNI); none where
 * tests/emu/emu512.h stands in for the intrinsics (scripts/cpu_emu_check.sh). */
#ifdef TM_EMU512
#define TM_AVX512 TM_AVX2
#else
#define TM_AVX512                                                                                  \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#endif

/* The same for 16-lane accumulators (every AVX-512 tile kernel ends with it). */
TM_AVX512 static inline __attribute__((always_inline)) void
cpu_tile_store_avx512(int nr, int nt, const tm_tile_args *a, int64_t r, int64_t t,
                      __m512 acc[4][4]) {
#pragma GCC unroll 4
    for (int j = 0; j < nt; j++)
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++)
            a->y[(t + j) * a->ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}
#endif

#endif
