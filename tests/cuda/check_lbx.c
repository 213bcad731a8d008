/* The 8-bit unpackers of the low-bit types (src/cuda/lbx_unit*.cuh) against
 * the f32 decoders: for every unit of random raw blocks, d[h] * q - m[h] must
 * equal, bit for bit, both tm_lb<TYPE>::dq8 on the GPU and
 * quant_row_dequantize (the gguf package's values): d[h] * q - m[h] is the
 * reference's float operations in its order (for the grid i-quants, one
 * rounded product, lbx_unit_iq.cuh), and m is +0 for the types without MIN.
 * Every type of TM_CUDA_LBX_TYPES. Blocks are packed (alternating 4-byte
 * alignment for sizes of 2 mod 4) and padded by the alignment the type's
 * rows need (2 or 4 bytes) from an address that far off 4, with
 * f16 scales from subnormal to 65504 and in a moderate range. 4096 blocks a
 * case: every grid index (at most 2048 a type, each drawn 64 times on
 * average), sign byte and scale code appears with near certainty. Runs on
 * the GPU and, through the CUDA emulation (scripts/cuda_emu_check.sh), on
 * the CPU. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_lbx.h"

#define LBX_BLOCKS 4096

typedef struct lbx_case {
    bool
        padded; /* the first block `align` bytes off a 256-byte boundary, `align` extra bytes a block */
    int min_exp, max_exp;
} lbx_case;

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void lbx_case_run(tm_rng *r, tm_type type, bool min, const lbx_case *c) {
    const tm_type_traits *tr = quant_type_traits((uint32_t)type);
    const int64_t bs = tr->block_size, nb = LBX_BLOCKS, upb = bs / 32;
    const size_t align = c->padded ? (tr->type_size % 4 ? 2 : 4) : 0;
    const size_t stride = tr->type_size + align, bytes = align + (size_t)nb * stride;
    uint8_t *w = xmalloc(bytes);
    float *ref = xmalloc((size_t)(nb * bs) * sizeof(float));
    float *dq = xmalloc((size_t)(nb * bs) * sizeof(float));
    check_lbx_unit *un = xmalloc((size_t)(nb * upb) * sizeof(check_lbx_unit));
    memset(w, 0x5a, bytes);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *bp = w + align + (size_t)b * stride;
        random_lowbit_row(r, type, bp, bs, c->min_exp, c->max_exp);
        check_dequantize_row(type, bp, ref + b * bs, bs);
    }
    cuda_pool_reset(g_pool);
    const uint8_t *w_d = dev_upload(w, bytes);
    check_lbx_unit *un_d = dev_alloc((size_t)(nb * upb) * sizeof(check_lbx_unit));
    float *dq_d = dev_alloc((size_t)(nb * bs) * sizeof(float));
    CHECK(check_lbx_units(type, w_d + align, stride, nb, un_d, dq_d, cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, un, un_d, (size_t)(nb * upb) * sizeof(check_lbx_unit)));
    CHECK(cuda_copy_to_host(g_dev, dq, dq_d, (size_t)(nb * bs) * sizeof(float)));
    int64_t bad = 0, first = -1;
    for (int64_t u = 0; u < nb * upb; u++)
        for (int i = 0; i < 32; i++) {
            const int h = i / 16;
            const int q = (int8_t)(un[u].q[i / 4] >> (8 * (i % 4)));
            const float v = un[u].d[h] * (float)q - un[u].m[h];
            const int64_t at = u * 32 + i;
            if (f32_bits(v) != f32_bits(ref[at]) || f32_bits(v) != f32_bits(dq[at]) ||
                (!min && f32_bits(un[u].m[h]) != 0)) {
                if (first < 0) first = at;
                bad++;
            }
        }
    if (bad) {
        const check_lbx_unit *f = &un[first / 32];
        const int i = (int)(first % 32), h = i / 16;
        fail_msg("lbx %s off %zu pad %zu exp %d..%d: %lld of %lld values differ; first: block "
                 "%lld value %lld: q %d d %.9g m %.9g gives %.9g, want %.9g (dq8 %.9g)",
                 quant_type_name(type), align, align, c->min_exp, c->max_exp, (long long)bad,
                 (long long)(nb * bs), (long long)(first / bs), (long long)(first % bs),
                 (int8_t)(f->q[i / 4] >> (8 * (i % 4))), f->d[h], f->m[h],
                 f->d[h] * (float)(int8_t)(f->q[i / 4] >> (8 * (i % 4))) - f->m[h], ref[first],
                 dq[first]);
    }
    free(w), free(ref), free(dq), free(un);
}

void check_lbx(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0x1b8);
    /* scale exponents 0..30: subnormal to 65504; 10..20 moderate */
    static const lbx_case cases[] = {{false, 0, 30}, {true, 0, 30}, {false, 10, 20}};
    for (size_t ti = 0; ti < CHECK_N_TYPES; ti++) {
        const tm_type type = check_types[ti];
        bool min;
        if (!check_lbx_has(type, &min)) continue;
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
            lbx_case_run(&r, type, min, &cases[ci]);
        printf("lbx %-7s: %zu cases of %d blocks, every unit bit-exact\n", quant_type_name(type),
               sizeof(cases) / sizeof(cases[0]), LBX_BLOCKS);
    }
}

#endif /* TM_HAVE_CUDA */
