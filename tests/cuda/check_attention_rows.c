/* cuda_attn_prepare and cuda_attention with rows of several sequences
 * (tm_cuda_attn_params.row_pos / row_seq: serve --parallel's decode steps)
 * against the same kernels run on each sequence alone, with the contiguous
 * interface (*pos0, the sequence's cache rows as a cache of their own).
 *
 * Sequences s = 0 .. n-1 own cache rows [s S, (s + 1) S) and hold histories of
 * different lengths (written alone). Then one step of rows:
 *   - one row a sequence, up to 8 rows (a decode step): each token's blocks
 *     are those of a launch of it alone (the same key splits for the same
 *     n_kv_max), so q, both caches and the outputs must equal the alone
 *     runs' bit for bit;
 *   - 12 rows, one sequence's 4 consecutive positions among them (a step
 *     larger than the split path's 8): the keys are not split, so outputs
 *     agree within float rounding (1e-5 of the largest output), q and the
 *     caches still bit for bit.
 * Every cache row outside the ones a step writes stays as it was (NaN bytes
 * in rows no one wrote).
 * Ring cases (a window given: sliding layers' caches, tm_cuda_attn_params.ring):
 * each sequence's S rows are a ring, its history runs several times around
 * it (written alone in launches of at most S - window + 1 tokens), and both
 * launches take a bound on positions, not rows (n_kv_max 4096). */
#ifdef TM_HAVE_CUDA
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

typedef struct rows_case {
    int32_t n_head, n_head_kv, d;
    tm_type kv;
    int n_seq;            /* sequences of S rows each */
    int32_t S;            /* rows a sequence */
    int n_rows;           /* rows of the step */
    const int8_t *seq_of; /* [n_rows]: the sequence of each row */
    int32_t window;       /* > 0: a sliding window, and the S rows are a ring */
} rows_case;

#define RING_POS 4096 /* n_kv_max of ring launches: positions, not rows */

static const int8_t k_dec5[] = {0, 1, 2, 3, 4};
static const int8_t k_dec8[] = {7, 6, 5, 4, 3, 2, 1, 0};
static const int8_t k_mix12[] = {3, 0, 0, 0, 0, 1, 2, 4, 5, 6, 7, 8};

static const rows_case k_rows_cases[] = {
    {32, 4, 128, TM_TYPE_F16, 5, 300, 5, k_dec5, 0},
    {32, 4, 128, TM_TYPE_F32, 8, 96, 8, k_dec8, 0},
    {6, 3, 64, TM_TYPE_F16, 9, 128, 12, k_mix12, 0},
    {2, 1, 6, TM_TYPE_F32, 9, 70, 12, k_mix12, 0},
    /* rings: gpt-oss's heads, decode steps; 12 rows with 4 of one sequence */
    {64, 8, 64, TM_TYPE_F16, 5, 40, 5, k_dec5, 24},
    {32, 4, 128, TM_TYPE_F32, 8, 32, 8, k_dec8, 20},
    {6, 3, 64, TM_TYPE_F16, 9, 40, 12, k_mix12, 24},
};

/* q after prepare, and attention's output, of rows [0, n) at positions pos.. of
 * a cache of S rows at kc/vc, alone (the contiguous interface). */
static void run_alone(const tm_cuda_attn_params *p0, int32_t S, float *q_d, const float *k_d,
                      const float *v_d, int32_t pos, int64_t n, uint8_t *kc, uint8_t *vc,
                      float *out_d, float *scratch_d, int32_t *pos_d) {
    tm_cuda_attn_params p = *p0;
    p.n_ctx = S, p.seq_rows = 0, p.row_pos = p.row_seq = NULL;
    const tm_cuda_stream st = cuda_device_stream(g_dev);
    CHECK(cuda_copy_to_device(g_dev, pos_d, &pos, 4));
    CHECK(cuda_attn_prepare(&p, q_d, k_d, v_d, NULL, NULL, pos_d, n, kc, vc, st));
    CHECK(cuda_attention(&p, q_d, kc, vc, pos_d, n, p.ring ? RING_POS : S, out_d, scratch_d, st));
    CHECK(cuda_device_sync(g_dev));
}

static double rows_run_case(tm_rng *r, const rows_case *c) {
    tm_cuda_attn_params p = {.n_head = c->n_head,
                             .n_head_kv = c->n_head_kv,
                             .head_dim = c->d,
                             .n_ctx = (int64_t)c->n_seq * c->S,
                             .kv_type = c->kv,
                             .scale = 1.0f / sqrtf((float)c->d),
                             .rms_eps = 1e-6f,
                             .rope_base = 1e6f,
                             .window = c->window,
                             .ring = c->window > 0};
    const int64_t H = c->n_head, d = c->d, kvw = (int64_t)c->n_head_kv * d, n = c->n_rows;
    const size_t esz = c->kv == TM_TYPE_F16 ? 2 : 4, row_b = (size_t)kvw * esz;
    const size_t cache_b = (size_t)p.n_ctx * row_b;
    cuda_pool_reset(g_pool);
    uint8_t *kc[2], *vc[2]; /* [0]: rows of several sequences, [1]: each alone */
    for (int i = 0; i < 2; i++) {
        kc[i] = dev_alloc(cache_b), vc[i] = dev_alloc(cache_b);
        CHECK(cuda_fill_bytes(g_dev, kc[i], 0xff, cache_b));
        CHECK(cuda_fill_bytes(g_dev, vc[i], 0xff, cache_b));
    }
    int32_t *pos_d = dev_alloc(4);
    const size_t scratch_f = (size_t)(n * H * (d + 2)) * 256; /* the most splits of n rows */
    float *scratch_d = dev_alloc(scratch_f * 4);

    /* histories of different lengths, written alone into both copies */
    int32_t len[16], row_pos[16], row_seq[16];
    for (int s = 0; s < c->n_seq; s++) {
        /* a ring's history goes around it a few times */
        len[s] = (int32_t)(tm_rng_u64(r) % (uint64_t)(p.ring ? 300 : c->S - 8));
        if (s == 0) len[s] = 0; /* a sequence's first token */
        if (!len[s]) continue;
        const int64_t nq = len[s] * H * d, nk = len[s] * kvw;
        float *q = xmalloc((size_t)nq * 4), *k = xmalloc((size_t)nk * 4),
              *v = xmalloc((size_t)nk * 4);
        fill_normal(r, q, nq, 1.5f), fill_normal(r, k, nk, 1.5f), fill_normal(r, v, nk, 1.0f);
        float *qd = dev_upload(q, (size_t)nq * 4), *kd = dev_upload(k, (size_t)nk * 4);
        float *vd = dev_upload(v, (size_t)nk * 4), *od = dev_alloc((size_t)nq * 4);
        const int32_t most = p.ring ? c->S - c->window + 1 : len[s]; /* a launch's tokens */
        for (int32_t p0 = 0; p0 < len[s]; p0 += most) {
            const int32_t m = len[s] - p0 < most ? len[s] - p0 : most;
            for (int i = 0; i < 2; i++)
                run_alone(&p, c->S, qd + p0 * H * d, kd + p0 * kvw, vd + p0 * kvw, p0, m,
                          kc[i] + (size_t)s * c->S * row_b, vc[i] + (size_t)s * c->S * row_b,
                          od + p0 * H * d, scratch_d, pos_d);
        }
        free(q), free(k), free(v);
    }
    /* the step's rows: a sequence's rows consecutive, at its next positions */
    int32_t next[16];
    memcpy(next, len, sizeof(next));
    for (int64_t t = 0; t < n; t++) {
        const int s = c->seq_of[t];
        row_pos[t] = next[s]++, row_seq[t] = s;
    }
    const int64_t nq = n * H * d, nk = n * kvw;
    float *q = xmalloc((size_t)nq * 4), *k = xmalloc((size_t)nk * 4), *v = xmalloc((size_t)nk * 4);
    fill_normal(r, q, nq, 1.5f), fill_normal(r, k, nk, 1.5f), fill_normal(r, v, nk, 1.0f);
    const float *kd = dev_upload(k, (size_t)nk * 4), *vd = dev_upload(v, (size_t)nk * 4);
    float *q_rows = dev_upload(q, (size_t)nq * 4), *q_alone = dev_upload(q, (size_t)nq * 4);
    float *o_rows = dev_alloc((size_t)nq * 4), *o_alone = dev_alloc((size_t)nq * 4);
    /* alone: each run of one sequence's rows */
    for (int64_t t0 = 0, t1; t0 < n; t0 = t1) {
        for (t1 = t0 + 1; t1 < n && c->seq_of[t1] == c->seq_of[t0]; t1++) {
        }
        const size_t base = (size_t)row_seq[t0] * c->S * row_b;
        run_alone(&p, c->S, q_alone + t0 * H * d, kd + t0 * kvw, vd + t0 * kvw, row_pos[t0],
                  t1 - t0, kc[1] + base, vc[1] + base, o_alone + t0 * H * d, scratch_d, pos_d);
    }
    /* rows of several sequences in one launch each */
    int32_t *rp_d = dev_upload(row_pos, (size_t)n * 4), *rs_d = dev_upload(row_seq, (size_t)n * 4);
    tm_cuda_attn_params pr = p;
    pr.row_pos = rp_d, pr.row_seq = rs_d, pr.seq_rows = c->S;
    const tm_cuda_stream st = cuda_device_stream(g_dev);
    CHECK(cuda_attn_prepare(&pr, q_rows, kd, vd, NULL, NULL, NULL, n, kc[0], vc[0], st));
    CHECK(cuda_attention(&pr, q_rows, kc[0], vc[0], NULL, n, p.ring ? RING_POS : c->S, o_rows,
                         scratch_d, st));
    CHECK(cuda_device_sync(g_dev));

    float *a = xmalloc((size_t)nq * 4), *b = xmalloc((size_t)nq * 4);
    uint8_t *ca = xmalloc(cache_b), *cb = xmalloc(cache_b);
    CHECK(cuda_copy_to_host(g_dev, a, q_rows, (size_t)nq * 4));
    CHECK(cuda_copy_to_host(g_dev, b, q_alone, (size_t)nq * 4));
    if (memcmp(a, b, (size_t)nq * 4)) fail_msg("rows: q after prepare differs from alone");
    for (int i = 0; i < 2; i++) {
        CHECK(cuda_copy_to_host(g_dev, ca, i ? vc[0] : kc[0], cache_b));
        CHECK(cuda_copy_to_host(g_dev, cb, i ? vc[1] : kc[1], cache_b));
        for (int64_t row = 0; row < p.n_ctx; row++)
            if (memcmp(ca + row * row_b, cb + row * row_b, row_b))
                fail_msg("rows: %s cache row %lld (sequence %lld) differs from alone",
                         i ? "V" : "K", (long long)row, (long long)(row / c->S));
    }
    CHECK(cuda_copy_to_host(g_dev, a, o_rows, (size_t)nq * 4));
    CHECK(cuda_copy_to_host(g_dev, b, o_alone, (size_t)nq * 4));
    double worst = 0, big = 0;
    for (int64_t i = 0; i < nq; i++) big = fmax(big, fabs(b[i]));
    const bool exact = n <= 8;
    for (int64_t i = 0; i < nq; i++) {
        const double err = fabs((double)a[i] - b[i]);
        if (!(err <= (exact ? 0 : 1e-5 * big)))
            fail_msg("rows: output %lld (row %lld, sequence %d at %d) is %.9g, alone %.9g",
                     (long long)i, (long long)(i / (H * d)), c->seq_of[i / (H * d)],
                     row_pos[i / (H * d)], a[i], b[i]);
        worst = fmax(worst, err / (big > 0 ? big : 1));
    }
    free(q), free(k), free(v), free(a), free(b), free(ca), free(cb);
    return worst;
}

void check_attention_rows(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0x5e95);
    for (size_t i = 0; i < sizeof(k_rows_cases) / sizeof(k_rows_cases[0]); i++) {
        const rows_case *c = &k_rows_cases[i];
        const double w = rows_run_case(&r, c);
        printf("attention rows %d/%d/%d %s: %d rows of %d sequences%s as alone (%s, worst %.3g)\n",
               c->n_head, c->n_head_kv, c->d, c->kv == TM_TYPE_F16 ? "f16" : "f32", c->n_rows,
               c->n_seq, c->window ? " (rings)" : "", c->n_rows <= 8 ? "bit for bit" : "unsplit",
               w);
    }
}

#endif /* TM_HAVE_CUDA */
