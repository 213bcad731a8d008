/* CPU element-wise and attention ops (see cpu_ops.h). */
#include "cpu/cpu_ops.h"
#include "cpu/cpu_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define TM_X86 1
#endif

void cpu_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    /* Four partial sums: deterministic, and fast without -ffast-math. */
    float s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += x[i + j] * x[i + j];
    for (; i < n; i++) s[0] += x[i] * x[i];
    const float scale = 1.0f / sqrtf((s[0] + s[1] + s[2] + s[3]) / (float)n + eps);
    if (w)
        for (i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
    else
        for (i = 0; i < n; i++) y[i] = x[i] * scale;
}

void cpu_rope_table(float *cos_out, float *sin_out, int64_t head_dim, int64_t pos, float base) {
    for (int64_t i = 0; i < head_dim / 2; i++) {
        /* Angles in double: at positions in the tens of thousands, float
         * angles lose the low bits that the rotation depends on. */
        double theta = (double)pos * pow((double)base, -2.0 * (double)i / (double)head_dim);
        cos_out[i] = (float)cos(theta);
        sin_out[i] = (float)sin(theta);
    }
}

void cpu_rope_table_freq(float *cos_out, float *sin_out, int64_t head_dim, int64_t pos,
                         const float *inv_freq, float mscale) {
    for (int64_t i = 0; i < head_dim / 2; i++) {
        double theta = (double)pos * (double)inv_freq[i]; /* in double: see cpu_rope_table */
        cos_out[i] = (float)(cos(theta) * mscale);
        sin_out[i] = (float)(sin(theta) * mscale);
    }
}

void cpu_rope_neox_table(float *x, int64_t head_dim, const float *cos_t, const float *sin_t) {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos_t[i] - b * sin_t[i];
        x[i + half] = a * sin_t[i] + b * cos_t[i];
    }
}

void cpu_rope_interleaved_table(float *x, int64_t head_dim, const float *cos_t,
                                const float *sin_t) {
    for (int64_t i = 0; i < head_dim / 2; i++) {
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * cos_t[i] - b * sin_t[i];
        x[2 * i + 1] = a * sin_t[i] + b * cos_t[i];
    }
}

void cpu_softmax(float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i] = expf(x[i] - m);
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

#ifdef TM_X86
/* silu(g) = g / (1 + e^-g), computed as g·(g < 0 ? e^g : 1) / (1 + e^-|g|) so
 * the exponential never overflows. */
TM_AVX2 static int64_t swiglu_avx2(float *h, const float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 t = cpu_exp_neg_avx2(_mm256_or_ps(x, neg)); /* e^-|x| */
        const __m256 num = _mm256_blendv_ps(_mm256_mul_ps(x, t), x,
                                            _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(one, t)),
                                              _mm256_loadu_ps(u + i)));
    }
    return i;
}
#endif

void cpu_swiglu(float *h, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
#ifdef TM_X86
    if (cpu_ops_simd()) i = swiglu_avx2(h, g, u, n);
#endif
    for (; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void cpu_swiglu_oai(float *h, const float *g, const float *u, int64_t n, float alpha, float limit) {
    for (int64_t i = 0; i < n; i++) {
        const float gc = g[i] > limit ? limit : g[i]; /* NaN stays NaN: no silent repair */
        const float uc = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
        h[i] = gc / (1.0f + expf(-alpha * gc)) * (uc + 1.0f);
    }
}

void cpu_geglu(float *h, const float *g, const float *u, int64_t n) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        h[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * u[i];
    }
}

void cpu_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void cpu_topk(const float *x, int64_t n, int64_t k, int32_t *idx) {
    /* Insertion into a sorted list of k: k is small (<= 32) next to n. */
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (m == k && !(x[i] > x[idx[k - 1]])) continue;
        int64_t j = m < k ? m++ : k - 1;
        while (j > 0 && x[idx[j - 1]] < x[i]) idx[j] = idx[j - 1], j--;
        idx[j] = (int32_t)i;
    }
}

/* ---- KV rows ---- */

#ifdef TM_X86
__attribute__((target("avx2,f16c"))) static void load_f16_avx2(float *dst, const tm_half *src,
                                                               int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = quant_f16_to_f32(src[i]);
}

__attribute__((target("avx2,f16c"))) static void store_f16_avx2(tm_half *dst, const float *src,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = quant_f32_to_f16(src[i]);
}
#endif

bool cpu_ops_simd(void) {
#ifdef TM_X86
    const tm_cpu_features *f = cpu_features();
    return f->avx2 && f->fma && f->f16c && cpu_level_get() >= TM_CPU_AVX2;
#else
    return 0;
#endif
}

void cpu_load_kv(float *dst, const void *src, tm_type kv_type, int64_t n) {
    if (kv_type == TM_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#ifdef TM_X86
    if (cpu_ops_simd()) {
        load_f16_avx2(dst, src, n);
        return;
    }
#endif
    const tm_half *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(h[i]);
}

void cpu_store_kv(void *dst, const float *src, tm_type kv_type, int64_t n) {
    if (kv_type == TM_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#ifdef TM_X86
    if (cpu_ops_simd()) {
        store_f16_avx2(dst, src, n);
        return;
    }
#endif
    tm_half *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = quant_f32_to_f16(src[i]);
}

/* ---- precise products ---- */

typedef struct precise_job {
    tm_type wtype;
    int64_t k, rows, n_tok;
    const uint8_t *w;
    size_t w_row_bytes;
    const float *x;
    float *y;
    float *rowbuf; /* one dequantized row per thread */
} precise_job;

static void precise_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const precise_job *j = ctx;
    float *row = j->rowbuf + ith * j->k;
    for (int64_t r = begin; r < end; r++) {
        quant_row_dequantize(j->wtype, j->w + r * j->w_row_bytes, row, j->k);
        for (int64_t t = 0; t < j->n_tok; t++) {
            const float *x = j->x + t * j->k;
            double acc = 0;
            for (int64_t i = 0; i < j->k; i++) acc += (double)row[i] * x[i];
            j->y[t * j->rows + r] = (float)acc;
        }
    }
}

tm_status cpu_matmul_precise(tm_pool *pool, tm_type wtype, int64_t k, int64_t rows, const void *w,
                             size_t w_row_bytes, const float *x, int64_t n_tok, float *y) {
    const int nth = pool ? cpu_pool_size(pool) : 1;
    precise_job j = {
        wtype, k, rows, n_tok, w, w_row_bytes, x, y, malloc((size_t)(nth * k) * sizeof(float))};
    if (!j.rowbuf) return tm_error_set(TM_ERR_NOMEM, "precise matmul: out of memory");
    tm_status st = quant_row_dequantize(wtype, w, j.rowbuf, k); /* checks type and k once */
    if (st == TM_OK) cpu_pool_for(pool, rows, 16, precise_task, &j);
    free(j.rowbuf);
    return st;
}
