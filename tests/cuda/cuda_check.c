/* Shared pieces of the CUDA op harness: see cuda_check.h. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tm_cuda_device *g_dev;
tm_cuda_pool *g_pool;
char g_why[512] = "built without CUDA";

int cuda_check_setup(void **state) {
    (void)state;
    if (cuda_device_open(0, &g_dev) != TM_OK) {
        snprintf(g_why, sizeof(g_why), "%s", tm_error_message());
        g_dev = NULL;
        return 0;
    }
    const tm_cuda_device_info *in = cuda_device_info(g_dev);
    printf("device: %s, cc %d.%d, %d SMs, L2 %.0f MiB, driver %d, runtime %d\n", in->name,
           in->cc_major, in->cc_minor, in->sm_count, in->l2_bytes / 1048576.0, in->driver_version,
           in->runtime_version);
    /* 1.5 GiB: the bench's rotating weight sets (~0.9 GiB) plus the checks */
    if (cuda_pool_create(g_dev, (size_t)1536 << 20, &g_pool) != TM_OK) {
        snprintf(g_why, sizeof(g_why), "%s", tm_error_message());
        cuda_device_close(g_dev);
        g_dev = NULL;
    }
    return 0;
}

int cuda_check_teardown(void **state) {
    (void)state;
    cuda_pool_free(g_pool);
    cuda_device_close(g_dev);
    return 0;
}

void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CHECK(cuda_pool_alloc(g_pool, bytes, 256, &p));
    return p;
}

void *dev_upload(const void *host, size_t bytes) {
    void *p = dev_alloc(bytes);
    CHECK(cuda_copy_to_device(g_dev, p, host, bytes));
    return p;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

void fill_normal(tm_rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * tm_rng_normal(r);
}

check_oai_biases check_oai_biases_make(tm_rng *r, int64_t n_expert, int64_t n_ff, int64_t n_embd) {
    check_oai_biases b = {n_expert, xmalloc((size_t)(n_expert * n_ff) * sizeof(float)),
                          xmalloc((size_t)(n_expert * n_ff) * sizeof(float)),
                          xmalloc((size_t)(n_expert * n_embd) * sizeof(float))};
    fill_normal(r, b.gate, n_expert * n_ff, 4.0f), fill_normal(r, b.up, n_expert * n_ff, 4.0f);
    fill_normal(r, b.down, n_expert * n_embd, 1.0f);
    return b;
}

void check_oai_biases_free(check_oai_biases *b) {
    free(b->gate), free(b->up), free(b->down);
}

tm_cuda_moe_ext check_oai_ext(const check_oai_biases *b, int64_t n_ff, int64_t n_embd) {
    return (tm_cuda_moe_ext){TM_CUDA_MOE_SWIGLU_OAI,
                             CHECK_OAI_ALPHA,
                             CHECK_OAI_LIMIT,
                             dev_upload(b->gate, (size_t)(b->n_expert * n_ff) * sizeof(float)),
                             dev_upload(b->up, (size_t)(b->n_expert * n_ff) * sizeof(float)),
                             dev_upload(b->down, (size_t)(b->n_expert * n_embd) * sizeof(float)),
                             (int32_t)b->n_expert};
}

double check_swiglu_oai(double g, double u, double *dg, double *du) {
    const double a = CHECK_OAI_ALPHA, lim = CHECK_OAI_LIMIT;
    const double gc = fmin(g, lim), uc = fmax(-lim, fmin(u, lim));
    *dg = (1 + a * fabs(gc) / 4) * fabs(uc + 1), *du = fabs(gc);
    return gc / (1.0 + exp(-a * gc)) * (uc + 1);
}

const tm_type check_types[CHECK_N_TYPES] = {
    TM_TYPE_Q4_K,   TM_TYPE_Q5_K,    TM_TYPE_Q6_K,   TM_TYPE_Q8_0,  TM_TYPE_Q4_0,
    TM_TYPE_MXFP4,  TM_TYPE_F16,     TM_TYPE_BF16,   TM_TYPE_F32,   TM_TYPE_Q4_1,
    TM_TYPE_Q5_0,   TM_TYPE_Q5_1,    TM_TYPE_IQ4_NL, TM_TYPE_Q2_K,  TM_TYPE_Q3_K,
    TM_TYPE_IQ4_XS, TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XS, TM_TYPE_IQ2_S, TM_TYPE_IQ3_XXS,
    TM_TYPE_IQ3_S,  TM_TYPE_IQ1_S,   TM_TYPE_IQ1_M,  TM_TYPE_TQ1_0, TM_TYPE_TQ2_0,
};

bool check_is_float(tm_type t) {
    return t == TM_TYPE_F32 || t == TM_TYPE_F16 || t == TM_TYPE_BF16;
}

size_t check_row_stride(tm_type t, int64_t k, size_t pad) {
    const size_t e = t == TM_TYPE_F32 ? 4 : check_is_float(t) ? 2 : 1;
    return quant_row_size(t, k) + (pad + e - 1) / e * e;
}

uint16_t check_half_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: inf */
    if (ax < 0x38800000u) /* below 2^-14: steps of 2^-24; the scaling is exact */
        return (uint16_t)(sign | (uint32_t)nearbyintf(fabsf(f) * 16777216.0f));
    uint32_t h = ((ax >> 23) - 112) << 10 | ((ax >> 13) & 0x3ffu);
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

void check_half_selftest(void) {
    static const struct {
        float f;
        uint16_t h;
    } t[] = {
        {1.0f, 0x3c00},       {-2.0f, 0xc000},       {0x1.002p0f, 0x3c00}, /* tie: to even */
        {0x1.006p0f, 0x3c02}, {0x1.0021p0f, 0x3c01}, {65519.0f, 0x7bff},
        {65520.0f, 0x7c00},   {0x1p-24f, 0x0001},    {0x1p-25f, 0x0000},     /* tie: to even */
        {0x1.8p-24f, 0x0002}, {0x1p-14f, 0x0400},    {0x1.ffcp-15f, 0x0400}, /* tie up to normal */
        {-0.0f, 0x8000},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (check_half_bits(t[i].f) != t[i].h)
            fail_msg("check_half_bits(%a) = 0x%04x, want 0x%04x", (double)t[i].f,
                     check_half_bits(t[i].f), t[i].h);
}

/* Byte offsets of the f16 fields (scales, mins) in a block of a low-bit type,
 * -1 after the last; NULL: not a low-bit type. iq1_m's scale is spread over
 * the top nibbles of its last four u16 (written apart). */
static const int *lowbit_f16_fields(tm_type t) {
    static const int at0[] = {0, -1}, at02[] = {0, 2, -1}, q2k[] = {80, 82, -1}, q3k[] = {108, -1},
                     tq1[] = {52, -1}, tq2[] = {64, -1}, none[] = {-1};
    switch (t) {
    case TM_TYPE_Q4_1:
    case TM_TYPE_Q5_1:
        return at02;
    case TM_TYPE_Q5_0:
    case TM_TYPE_IQ4_NL:
    case TM_TYPE_IQ4_XS:
    case TM_TYPE_IQ2_XXS:
    case TM_TYPE_IQ2_XS:
    case TM_TYPE_IQ2_S:
    case TM_TYPE_IQ3_XXS:
    case TM_TYPE_IQ3_S:
    case TM_TYPE_IQ1_S:
        return at0;
    case TM_TYPE_Q2_K:
        return q2k;
    case TM_TYPE_Q3_K:
        return q3k;
    case TM_TYPE_TQ1_0:
        return tq1;
    case TM_TYPE_TQ2_0:
        return tq2;
    case TM_TYPE_IQ1_M:
        return none;
    default:
        return NULL;
    }
}

bool check_lowbit_type(tm_type t) {
    return lowbit_f16_fields(t) != NULL;
}

/* A random finite f16: random sign and mantissa, exponent field min_exp..max_exp. */
static uint16_t random_f16(tm_rng *r, int min_exp, int max_exp) {
    const uint64_t u = tm_rng_u64(r), span = (uint64_t)(max_exp - min_exp + 1);
    return (uint16_t)((u & 0x83ffu) | (uint32_t)(min_exp + (int)((u >> 16) % span)) << 10);
}

/* The exponent field below which a scale keeps the type's values under 2 in
 * magnitude: |value| <= M |d| with M the type's largest multiple of its scale
 * (mins counted: q4_1 15 + 15, q2_K 3 * 15 + 15; iq4_xs 32 * 127; iq2 15.5 / 4 * 43;
 * iq3_xxs 15.5 / 2 * 62; iq3_s 31 * 15; iq1 15 * 1.125), and |d| < 2^(field - 14). */
static int lowbit_exp_moderate(tm_type t) {
    int m;
    switch (t) {
    case TM_TYPE_TQ1_0:
    case TM_TYPE_TQ2_0:
        m = 1;
        break;
    case TM_TYPE_Q5_0:
    case TM_TYPE_IQ1_S:
    case TM_TYPE_IQ1_M:
        m = 17;
        break;
    case TM_TYPE_Q4_1:
        m = 30;
        break;
    case TM_TYPE_Q5_1:
        m = 46;
        break;
    case TM_TYPE_Q2_K:
        m = 60;
        break;
    case TM_TYPE_IQ4_NL:
    case TM_TYPE_Q3_K:
        m = 128;
        break;
    case TM_TYPE_IQ2_XXS:
    case TM_TYPE_IQ2_XS:
    case TM_TYPE_IQ2_S:
        m = 167;
        break;
    case TM_TYPE_IQ3_XXS:
    case TM_TYPE_IQ3_S:
        m = 480;
        break;
    default: /* iq4_xs */
        m = 4064;
        break;
    }
    int e = 15; /* 2^(e - 14) * m <= 2 */
    while ((1 << (15 - e)) < m) e--;
    return e;
}

void random_lowbit_row(tm_rng *r, tm_type type, uint8_t *row, int64_t k, int min_exp, int max_exp) {
    const tm_type_traits *tr = quant_type_traits((uint32_t)type);
    const int *f16 = lowbit_f16_fields(type);
    assert_non_null(f16);
    const size_t bsz = tr->type_size;
    for (int64_t b = 0; b < k / tr->block_size; b++) {
        uint8_t *bp = row + (size_t)b * bsz;
        for (size_t i = 0; i < bsz; i++) bp[i] = (uint8_t)tm_rng_u64(r);
        for (const int *o = f16; *o >= 0; o++) {
            const uint16_t h = random_f16(r, min_exp, max_exp);
            bp[*o] = (uint8_t)h, bp[*o + 1] = (uint8_t)(h >> 8);
        }
        if (type == TM_TYPE_IQ1_M) /* nibble i of the scale: top nibble of u16 i at 48 */
            for (int i = 0, h = random_f16(r, min_exp, max_exp); i < 4; i++)
                bp[49 + 2 * i] = (uint8_t)((bp[49 + 2 * i] & 0x0f) | ((h >> (4 * i)) & 0x0f) << 4);
    }
}

void check_dequantize_row(tm_type type, const uint8_t *row, float *out, int64_t k) {
    const size_t bytes = quant_row_size(type, k);
    void *copy = xmalloc(bytes);
    memcpy(copy, row, bytes);
    CHECK(quant_row_dequantize(type, copy, out, k));
    free(copy);
}

uint8_t *random_matrix(tm_rng *r, tm_type type, int64_t rows, int64_t k, size_t row_bytes,
                       float **deq) {
    uint8_t *w = xmalloc((size_t)rows * row_bytes);
    memset(w, 0x5a, (size_t)rows * row_bytes);
    float *src = xmalloc((size_t)k * sizeof(float));
    float *d = xmalloc((size_t)rows * k * sizeof(float));
    void *q = xmalloc(quant_row_size(type, k));
    for (int64_t i = 0; i < rows; i++) {
        if (check_lowbit_type(type)) {
            const int e = lowbit_exp_moderate(type);
            random_lowbit_row(r, type, w + i * row_bytes, k, e > 6 ? e - 6 : 0, e);
        } else {
            fill_normal(r, src, k, 0.5f);
            CHECK(quant_row_quantize(type, src, q, k)); /* aligned, then to any address */
            memcpy(w + i * row_bytes, q, quant_row_size(type, k));
        }
        check_dequantize_row(type, w + i * row_bytes, d + i * k, k);
    }
    free(src), free(q);
    *deq = d;
    return w;
}

#endif /* TM_HAVE_CUDA */
