/* The f16 tensor-core pieces the flash-attention kernels share (attention_tc.cu,
 * mla_tc.cu): mma.sync m16n8k16 with f32 accumulation, ldmatrix loads from shared
 * memory, and one tile's online-softmax step over scores held in the accumulator
 * layout. Internal to src/cuda. */
#ifndef TM_CUDA_MMA_F16_CUH
#define TM_CUDA_MMA_F16_CUH
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

static __device__ __forceinline__ uint32_t tm_mma_pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

/* d += a·b, one m16n8k16 tile (row-major A, column-major B, f32 C/D). */
static __device__ __forceinline__ void tm_mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                                    uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 f16 matrices; lane l gives the address of row l % 8 of matrix l / 8. */
static __device__ __forceinline__ void tm_mma_ldsm4(uint32_t (&r)[4], const __half *p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

static __device__ __forceinline__ void tm_mma_ldsm4_t(uint32_t (&r)[4], const __half *p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* One key tile's online-softmax step for a lane's two rows a and b: s holds the tile's
 * base-2 scores in the accumulator layout (n-tile j, element e: row a for e < 2, else b;
 * -inf for keys outside a row), 4 lanes a row. Raises the running maxima m, returns P
 * in f16 packed as P·V's A fragments (k-step kk = keys 16kk.. is n-tiles 2kk, regs 0, 1,
 * and 2kk + 1, regs 2, 3), adds the rounded weights (the ones P·V uses) to the running
 * sums l after rescaling them, and rescales the NO accumulator tiles o. */
template <int NT, int NO>
static __device__ __forceinline__ void
tm_mma_softmax_step(const float (&s)[NT][4], float &m_a, float &m_b, float &l_a, float &l_b,
                    uint32_t (&pf)[NT / 2][4], float (&o)[NO][4]) {
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
        mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o2));
    }
    /* -inf - -inf would be NaN: a row with no key yet has nothing to rescale */
    const float al_a = m_a == -INFINITY ? 0.f : exp2f(m_a - mx_a);
    const float al_b = m_b == -INFINITY ? 0.f : exp2f(m_b - mx_b);
    m_a = mx_a, m_b = mx_b;
    float sa = 0.f, sb = 0.f;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float mx = e < 2 ? mx_a : mx_b;
            p[e] = s[j][e] == -INFINITY ? 0.f : exp2f(s[j][e] - mx);
        }
        const __half2 ha = __floats2half2_rn(p[0], p[1]), hb = __floats2half2_rn(p[2], p[3]);
        const float2 fa = __half22float2(ha), fb = __half22float2(hb);
        sa += fa.x + fa.y, sb += fb.x + fb.y;
        pf[j / 2][2 * (j & 1)] = *(const uint32_t *)&ha;
        pf[j / 2][2 * (j & 1) + 1] = *(const uint32_t *)&hb;
    }
    l_a = l_a * al_a + sa, l_b = l_b * al_b + sb;
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] *= al_a, o[n][1] *= al_a, o[n][2] *= al_b, o[n][3] *= al_b;
}
#endif
