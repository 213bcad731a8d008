/* cuda_mla_prepare, cuda_mla_attention and cuda_copy_rows (src/cuda/mla.cu)
 * against a double-precision reference written here from the contract in
 * cuda.h (not from the CPU engine): the RoPE parts of the q heads and of the
 * key turned (interleaved pairs or NeoX, a base or a frequency table), the
 * latent RMS-normed with its gain, the key row stored; then per (token, head)
 * the softmax of scale · q · key over the sequence's keys up to the token's
 * position and the weighted sum of the keys' latents.
 *
 * A case writes the history (positions 0 .. pos0 - 1) with one prepare and the
 * batch with another, as rows of one sequence (pos0) or of two sequences
 * (row_pos / row_seq, the second sequence at other positions); cache rows not
 * written stay NaN, so a kernel that reads one fails. The reference reads the
 * rows back as stored (f16-rounded in an f16 cache). Tolerances: prepare
 * within (L + 16) u of the values' magnitude (a float sum of L squares, the
 * rotation); attention within (D + 64 + n) u · 4 of the largest |latent| (the
 * float dot of D products, the online softmax's rescales, the float sums over
 * n keys) — a wrong key, position, head or scale moves outputs by 1/n or more.
 * DeepSeek-V3's key (576) with an f16 cache and a multiple of 32 heads runs on tensor
 * cores (mla_tc.cu): q and the softmax weights p rounded to f16 move each p_j by a
 * relative 2^-11 (p's rounding) plus scale · 2^-11 · Σ_i |q_i k_ji| (q's, through exp),
 * and the output, a weighted mean, by twice the largest of those times the largest
 * |latent|: added, with a factor 2, to those cases' bound. Its cases: a decode of 3
 * tokens with the keys split over blocks (a tile a split), rows of two
 * sequences, and a prompt of 12 tokens (a block a token's 32 heads, all keys).
 * Also: cuda_copy_rows against memcpy, and the shapes the launchers refuse. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mla_case {
    int n_head, v_dim, n_rot, n_tok, pos0;
    tm_type kv;
    bool inter, table, rows;
} mla_case;

static const mla_case k_mla_cases[] = {
    {4, 32, 8, 7, 0, TM_TYPE_F32, true, true, false},     /* the tiny model's, from 0 */
    {4, 32, 8, 1, 40, TM_TYPE_F16, true, true, false},    /* a decode step */
    {3, 24, 8, 5, 37, TM_TYPE_F16, false, false, true},   /* NeoX, a base, two sequences */
    {16, 512, 64, 2, 70, TM_TYPE_F16, true, true, false}, /* DeepSeek-V3's widths */
    /* tensor cores (mla_tc.cu): split keys, two sequences, a prompt */
    {32, 512, 64, 3, 300, TM_TYPE_F16, true, true, false},
    {64, 512, 64, 4, 150, TM_TYPE_F16, true, true, true},
    {32, 512, 64, 12, 150, TM_TYPE_F16, true, true, false},
};

static double half_back(float f) {
    return (double)quant_f16_to_f32(check_half_bits(f));
}

/* The reference's RoPE of n_rot values x (double) at pos. */
static void ref_rope(const mla_case *c, const float *freq, double base, double *x, int64_t pos) {
    for (int i = 0; i < c->n_rot / 2; i++) {
        const double th =
            c->table ? (double)pos * freq[i] : (double)pos * pow(base, -2.0 * i / c->n_rot);
        const int e0 = c->inter ? 2 * i : i, e1 = c->inter ? 2 * i + 1 : i + c->n_rot / 2;
        const double a = x[e0], b = x[e1];
        x[e0] = a * cos(th) - b * sin(th), x[e1] = a * sin(th) + b * cos(th);
    }
}

static void mla_case_run(tm_rng *r, const mla_case *c) {
    cuda_pool_reset(g_pool);
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    const int H = c->n_head, L = c->v_dim, D = L + c->n_rot, NT = c->n_tok;
    const int n_seq = c->rows ? 2 : 1, seq_rows = c->pos0 + NT + 3;
    const int64_t n_ctx = (int64_t)n_seq * seq_rows;
    const size_t esz = c->kv == TM_TYPE_F16 ? 2 : 4;
    const double base = 10000.0;
    float freq[64], norm[1024];
    for (int i = 0; i < c->n_rot / 2; i++) freq[i] = (float)pow(base, -2.0 * i / c->n_rot) / 3.0f;
    for (int i = 0; i < L; i++) norm[i] = 0.5f + (float)(i % 7) * 0.125f;
    const float *freq_d = dev_upload(freq, sizeof(freq)), *norm_d = dev_upload(norm, (size_t)L * 4);
    uint8_t *cache = xmalloc((size_t)n_ctx * D * esz);
    memset(cache, 0xff, (size_t)n_ctx * D * esz); /* NaN: rows never written */
    void *cache_d = dev_upload(cache, (size_t)n_ctx * D * esz);
    tm_cuda_attn_params p = {.n_head = H,
                             .n_head_kv = 1,
                             .head_dim = D,
                             .n_ctx = n_ctx,
                             .seq_rows = seq_rows,
                             .kv_type = c->kv,
                             .scale = 0.7f / sqrtf((float)D),
                             .rms_eps = 1e-6f,
                             .rope_base = (float)base,
                             .rope_freq = c->table ? freq_d : NULL,
                             .n_rot = c->n_rot,
                             .rope_interleaved = c->inter,
                             .latent = true,
                             .v_dim = L};
    /* every token of both steps: its sequence and position */
    const int n_all = c->pos0 + NT;
    int32_t *pos = xmalloc((size_t)n_all * 4), *seq = xmalloc((size_t)n_all * 4);
    for (int t = 0; t < n_all; t++) pos[t] = t, seq[t] = c->rows ? t % 2 : 0;
    if (c->rows) /* two sequences, each its own positions 0.. in order */
        for (int t = 0, k[2] = {0, 0}; t < n_all; t++) pos[t] = k[seq[t]]++;
    double *keys = xmalloc(sizeof(double) * (size_t)n_ctx * D); /* the reference's cache */
    float *q = xmalloc((size_t)NT * H * D * 4), *kv = xmalloc((size_t)n_all * D * 4);
    float *out = xmalloc((size_t)NT * H * L * 4), *qo = xmalloc((size_t)NT * H * D * 4);
    double *qref = xmalloc(sizeof(double) * (size_t)NT * H * D);
    fill_normal(r, kv, (int64_t)n_all * D, 1.0f);
    fill_normal(r, q, (int64_t)NT * H * D, 1.0f);
    for (int step = 0; step < 2; step++) { /* the history, then the batch */
        const int t0 = step ? c->pos0 : 0, n = step ? NT : c->pos0;
        if (!n) continue;
        int32_t p0 = pos[t0];
        int32_t *pos_d = dev_upload(pos + t0, (size_t)n * 4),
                *seq_d = dev_upload(seq + t0, (size_t)n * 4), *p0_d = dev_upload(&p0, 4);
        p.row_pos = c->rows ? pos_d : NULL, p.row_seq = c->rows ? seq_d : NULL;
        float *kv_d = dev_upload(kv + (size_t)t0 * D, (size_t)n * D * 4);
        float *qs = step ? q : xmalloc((size_t)n * H * D * 4);
        if (!step) fill_normal(r, qs, (int64_t)n * H * D, 1.0f);
        float *q_d = dev_upload(qs, (size_t)n * H * D * 4);
        CHECK(cuda_mla_prepare(&p, q_d, kv_d, norm_d, p0_d, n, cache_d, s));
        CHECK(cuda_device_sync(g_dev));
        /* the reference: q's RoPE parts, the key rows */
        for (int t = 0; t < n; t++) {
            const int64_t at = (int64_t)seq[t0 + t] * seq_rows + pos[t0 + t];
            double *row = keys + at * D, ss = 0;
            for (int i = 0; i < D; i++) row[i] = kv[(size_t)(t0 + t) * D + i];
            for (int i = 0; i < L; i++) ss += row[i] * row[i];
            for (int i = 0; i < L; i++) row[i] = row[i] / sqrt(ss / L + 1e-6) * norm[i];
            ref_rope(c, freq, base, row + L, pos[t0 + t]);
            if (c->kv == TM_TYPE_F16)
                for (int i = 0; i < D; i++) row[i] = half_back((float)row[i]);
            for (int h = 0; step && h < H; h++) {
                double *x = qref + ((size_t)t * H + h) * D;
                for (int i = 0; i < D; i++) x[i] = q[((size_t)t * H + h) * D + i];
                ref_rope(c, freq, base, x + L, pos[t0 + t]);
            }
        }
        if (step) {
            CHECK(cuda_copy_to_host(g_dev, qo, q_d, (size_t)NT * H * D * 4));
            double worst = 0;
            for (int64_t i = 0; i < (int64_t)NT * H * D; i++)
                worst = fmax(worst, fabs(qo[i] - qref[i]) / ((16 + L) * U32 * (fabs(qref[i]) + 4)));
            if (!(worst <= 1)) fail_msg("mla prepare: q off by %.3g of its bound", worst);
            float *out_d = dev_alloc((size_t)NT * H * L * 4);
            const int64_t nsc = cuda_mla_scratch_floats(&p, NT);
            float *sc_d = nsc ? dev_alloc((size_t)nsc * 4) : NULL;
            CHECK(cuda_mla_attention(&p, q_d, cache_d, p0_d, NT, out_d, sc_d, s));
            CHECK(cuda_device_sync(g_dev));
            CHECK(cuda_copy_to_host(g_dev, out, out_d, (size_t)NT * H * L * 4));
        } else {
            free(qs);
        }
    }
    /* the cache as stored, against the reference's rows */
    CHECK(cuda_copy_to_host(g_dev, cache, cache_d, (size_t)n_ctx * D * esz));
    double worst_k = 0;
    for (int t = 0; t < n_all; t++) {
        const int64_t at = (int64_t)seq[t] * seq_rows + pos[t];
        for (int i = 0; i < D; i++) {
            const double got = c->kv == TM_TYPE_F16
                                   ? (double)quant_f16_to_f32(((tm_half *)cache)[at * D + i])
                                   : ((float *)cache)[at * D + i];
            const double want = keys[at * D + i];
            const double tol = (L + 16) * U32 * (fabs(want) + 4) +
                               (c->kv == TM_TYPE_F16 ? fabs(want) / 1024 + 1e-7 : 0);
            worst_k = fmax(worst_k, fabs(got - want) / tol);
        }
    }
    if (!(worst_k <= 1)) fail_msg("mla prepare: a key off by %.3g of its bound", worst_k);
    double worst = 0;
    const bool tc = c->kv == TM_TYPE_F16 && D == 576 && H % 32 == 0; /* mla_tc.cu's shape */
    for (int t = 0; t < NT; t++) {
        const int64_t row0 = (int64_t)seq[c->pos0 + t] * seq_rows, n_kv = pos[c->pos0 + t] + 1;
        for (int h = 0; h < H; h++) {
            const double *qh = qref + ((size_t)t * H + h) * D;
            double mx = -INFINITY, z = 0, big = 0, qk_abs = 0;
            double *sc = xmalloc(sizeof(double) * (size_t)n_kv);
            for (int64_t j = 0; j < n_kv; j++) {
                double d = 0, da = 0;
                for (int i = 0; i < D; i++)
                    d += qh[i] * keys[(row0 + j) * D + i],
                        da += fabs(qh[i] * keys[(row0 + j) * D + i]);
                mx = fmax(mx, sc[j] = d * p.scale);
                qk_abs = fmax(qk_abs, da);
            }
            const double u16 = 1.0 / 2048, dp = u16 * (1 + p.scale * qk_abs); /* a p_j's */
            for (int64_t j = 0; j < n_kv; j++) z += sc[j] = exp(sc[j] - mx);
            for (int i = 0; i < L; i++) {
                double o = 0;
                for (int64_t j = 0; j < n_kv; j++) {
                    o += sc[j] / z * keys[(row0 + j) * D + i];
                    big = fmax(big, fabs(keys[(row0 + j) * D + i]));
                }
                const double got = out[((size_t)t * H + h) * L + i];
                worst = fmax(worst, fabs(got - o) / (4 * (D + 64 + n_kv) * U32 * (big + 1) +
                                                     (tc ? 2 * 2 * dp * big : 0)));
            }
            free(sc);
        }
    }
    if (!(worst <= 1)) fail_msg("mla attention: off by %.3g of its bound", worst);
    printf("mla H %2d latent %3d + rope %2d, %d tokens from %2d, %s%s%s%s%s: worst key %.3f, out "
           "%.3f of their bounds\n",
           H, L, c->n_rot, NT, c->pos0, tc ? "tensor cores, " : "",
           c->kv == TM_TYPE_F16 ? "f16" : "f32", c->inter ? ", interleaved" : ", NeoX",
           c->table ? ", table" : ", base", c->rows ? ", two sequences" : "", worst_k, worst);
    free(cache), free(pos), free(seq), free(keys), free(q), free(kv), free(out), free(qo);
    free(qref);
}

void check_mla(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng rng;
    tm_rng_seed(&rng, 35);
    for (size_t i = 0; i < sizeof(k_mla_cases) / sizeof(k_mla_cases[0]); i++)
        mla_case_run(&rng, &k_mla_cases[i]);
    /* cuda_copy_rows: 5 rows of 7 from rows 11 apart into rows 9 apart */
    cuda_pool_reset(g_pool);
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    float src[5 * 11], dst[5 * 9], want[5 * 9];
    fill_normal(&rng, src, 5 * 11, 1.0f);
    for (int i = 0; i < 5 * 9; i++) dst[i] = want[i] = -1.0f;
    for (int r = 0; r < 5; r++) memcpy(want + r * 9 + 1, src + r * 11 + 2, 7 * 4);
    float *src_d = dev_upload(src, sizeof(src)), *dst_d = dev_upload(dst, sizeof(dst));
    CHECK(cuda_copy_rows(dst_d + 1, 9, src_d + 2, 11, 5, 7, s));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, dst, dst_d, sizeof(dst)));
    if (memcmp(dst, want, sizeof(dst))) fail_msg("cuda_copy_rows: rows differ from memcpy's");
    /* refused: not latent, two KV heads, a key that is not latent + RoPE, odd RoPE */
    tm_cuda_attn_params p = {.n_head = 4,
                             .n_head_kv = 1,
                             .head_dim = 40,
                             .n_ctx = 8,
                             .kv_type = TM_TYPE_F32,
                             .n_rot = 8,
                             .latent = true,
                             .v_dim = 32};
    const int32_t *pos_d = dev_alloc(4);
    void *c_d = dev_alloc(8 * 40 * 4);
    float *q_d = dev_alloc(4 * 40 * 4);
    CHECK(cuda_mla_prepare(&p, q_d, q_d, NULL, pos_d, 0, c_d, s));
    tm_cuda_attn_params bad[4] = {p, p, p, p};
    bad[0].latent = false, bad[1].n_head_kv = 2, bad[2].v_dim = 30, bad[3].n_rot = 7;
    for (int i = 0; i < 4; i++)
        if (cuda_mla_prepare(&bad[i], q_d, q_d, NULL, pos_d, 1, c_d, s) != TM_ERR_ARG ||
            cuda_mla_attention(&bad[i], q_d, c_d, pos_d, 1, q_d, NULL, s) != TM_ERR_ARG)
            fail_msg("latent shape %d accepted", i);
    if (cuda_attn_prepare(&p, q_d, q_d, q_d, NULL, NULL, pos_d, 1, c_d, c_d, s) != TM_ERR_ARG)
        fail_msg("cuda_attn_prepare took a latent shape");
    tm_error_clear();
}

#endif /* TM_HAVE_CUDA */
