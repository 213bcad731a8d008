/* cuda_dequantize_f16 (src/cuda/dequant.cu: tm_dq8_f16, the decoders the
 * prompt GEMM and the fused expert kernels share) against
 * quant_row_dequantize rounded to f16 (round to nearest even,
 * check_half_bits), bit for bit: every type the kernels read, odd row
 * counts, padded rows, an unaligned output, nothing written past the end.
 * The low-bit types also on adversarial blocks: random bytes with f16 scales
 * from subnormal to 65504, so values overflow f16 too. Runs on the GPU and,
 * through the CUDA emulation (scripts/cuda_emu_check.sh), on the CPU. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct dequant_shape {
    int64_t rows, k;
    int64_t out_off; /* 1: the output 2 bytes off 16-byte alignment (scalar stores) */
    size_t pad;      /* extra bytes per weight row */
    int max_exp;     /* low-bit types: raw blocks of scale exponents 0..max_exp; 0: random_matrix */
} dequant_shape;

static int64_t dequant_case(tm_rng *r, tm_type type, const dequant_shape *c) {
    const int64_t rows = c->rows, k = c->k, n = rows * k;
    const size_t rb = check_row_stride(type, k, c->pad);
    float *deq;
    uint8_t *w;
    if (c->max_exp) {
        w = xmalloc((size_t)rows * rb), deq = xmalloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < rows; i++) {
            random_lowbit_row(r, type, w + i * rb, k, 0, c->max_exp);
            check_dequantize_row(type, w + i * rb, deq + i * k, k);
        }
    } else {
        w = random_matrix(r, type, rows, k, rb, &deq);
    }
    uint16_t *got = xmalloc((size_t)(n + 8) * 2);
    cuda_pool_reset(g_pool);
    const void *w_d = dev_upload(w, (size_t)rows * rb);
    uint16_t *o_d = (uint16_t *)dev_alloc((size_t)(n + 9) * 2) + c->out_off;
    /* NaN poison (0xffff), with 8 guard values past the end */
    CHECK(cuda_fill_bytes(g_dev, o_d, 0xff, (size_t)(n + 8) * 2));
    CHECK(cuda_dequantize_f16(type, w_d, rb, rows, k, o_d, cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, got, o_d, (size_t)(n + 8) * 2));
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n + 8; i++)
        if (got[i] != (i < n ? check_half_bits(deq[i]) : 0xffff)) {
            if (first < 0) first = i;
            bad++;
        }
    if (bad)
        fail_msg("dequant %s rows %lld k %lld pad %zu out+%lld%s: %lld of %lld values differ; "
                 "first %lld (row %lld col %lld): gpu 0x%04x, want 0x%04x (cpu %.9g)%s",
                 quant_type_name(type), (long long)rows, (long long)k, c->pad,
                 (long long)c->out_off, c->max_exp ? " (raw blocks)" : "", (long long)bad,
                 (long long)n, (long long)first, (long long)(first / k), (long long)(first % k),
                 got[first], first < n ? check_half_bits(deq[first]) : 0xffff,
                 first < n ? deq[first] : 0.0, first < n ? "" : " (past the end)");
    free(w), free(deq), free(got);
    return n;
}

void check_dequant(void **state) {
    (void)state;
    NEED_DEVICE();
    check_half_selftest();
    tm_rng r;
    tm_rng_seed(&r, 0xdea1);
    static const dequant_shape cases[] = {
        {1, 256, 0, 0, 0},    {7, 512, 0, 3, 0}, {33, 2048, 1, 0, 0},
        {1001, 768, 0, 5, 0}, {3, 256, 1, 1, 0},
    };
    static const dequant_shape odd[] = {{5, 6, 0, 0, 0}, {9, 100, 1, 2, 0}, {1, 1, 0, 0, 0}};
    /* scale exponents up to 30 (f16 overflow) and down to subnormals */
    static const dequant_shape raw[] = {{64, 256, 0, 0, 30}, {5, 1024, 1, 3, 30}};
    for (size_t ti = 0; ti < CHECK_N_TYPES; ti++) {
        const tm_type type = check_types[ti];
        int64_t values = 0;
        int n = 0;
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++, n++)
            values += dequant_case(&r, type, &cases[ci]);
        for (size_t ci = 0; check_is_float(type) && ci < sizeof(odd) / sizeof(odd[0]); ci++, n++)
            values += dequant_case(&r, type, &odd[ci]);
        for (size_t ci = 0; check_lowbit_type(type) && ci < sizeof(raw) / sizeof(raw[0]); ci++, n++)
            values += dequant_case(&r, type, &raw[ci]);
        printf("dequant %-7s: %d cases ok, %lld values bit-exact\n", quant_type_name(type), n,
               (long long)values);
    }
}

#endif /* TM_HAVE_CUDA */
