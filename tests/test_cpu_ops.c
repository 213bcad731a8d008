/* CPU ops against naive double-precision references on random shapes:
 * RMSNorm, RoPE (table form vs the angle formula), softmax, SwiGLU, top-k,
 * and causal attention over f32 and f16 KV caches, for prompt batches and for
 * single tokens whose keys are split into chunks (more than 256 positions),
 * with 1 and 3 threads; over ring caches (sliding windows: position p at row
 * p % ring) the same bits as over the full cache.
 *
 * Tolerances: float32 arithmetic on the values involved. RMSNorm, RoPE,
 * SwiGLU and softmax are a few float operations per element: 1e-5 relative.
 * Attention sums n_kv products of head_dim terms in float32 (error ~ sqrt(n)
 * u per sum) and, with an f16 cache, reads keys and values rounded to 11
 * significant bits: the reference sees the same rounded cache, so only float32
 * accumulation is left: |err| <= 1e-4 relative to the largest output. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "cpu/cpu_ops.h"

static tm_rng rng;

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * tm_rng_normal(&rng);
}

static void test_rmsnorm_rope_softmax_swiglu(void **state) {
    (void)state;
    float x[333], w[333], y[333];
    fill(x, 333, 2), fill(w, 333, 1);
    cpu_rmsnorm(y, x, w, 333, 1e-6f);
    double ss = 0;
    for (int i = 0; i < 333; i++) ss += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(ss / 333 + 1e-6);
    for (int i = 0; i < 333; i++)
        assert_true(fabs(y[i] - x[i] * r * w[i]) <= 1e-5 * fabs(x[i] * r * w[i]) + 1e-6);

    for (int64_t d = 2; d <= 256; d *= 2) {
        float c[128], s[128], h[256], h0[256];
        const int64_t pos = 40000 + d; /* large positions: angles need double precision */
        fill(h0, d, 1);
        memcpy(h, h0, sizeof(float) * (size_t)d);
        cpu_rope_table(c, s, d, pos, 1e6f);
        cpu_rope_neox_table(h, d, c, s);
        for (int64_t i = 0; i < d / 2; i++) {
            double th = (double)pos * pow(1e6, -2.0 * (double)i / (double)d);
            double a = h0[i], b = h0[i + d / 2];
            assert_true(fabs(h[i] - (a * cos(th) - b * sin(th))) < 1e-5);
            assert_true(fabs(h[i + d / 2] - (a * sin(th) + b * cos(th))) < 1e-5);
        }
        memcpy(h, h0, sizeof(float) * (size_t)d); /* adjacent pairs: llama.cpp's normal RoPE */
        cpu_rope_interleaved_table(h, d, c, s);
        for (int64_t i = 0; i < d / 2; i++) {
            double th = (double)pos * pow(1e6, -2.0 * (double)i / (double)d);
            double a = h0[2 * i], b = h0[2 * i + 1];
            assert_true(fabs(h[2 * i] - (a * cos(th) - b * sin(th))) < 1e-5);
            assert_true(fabs(h[2 * i + 1] - (a * sin(th) + b * cos(th))) < 1e-5);
        }
    }

    float z[77], p[77];
    fill(z, 77, 5);
    memcpy(p, z, sizeof(p));
    cpu_softmax(p, 77);
    double m = -1e30, sum = 0;
    for (int i = 0; i < 77; i++) m = z[i] > m ? z[i] : m;
    for (int i = 0; i < 77; i++) sum += exp(z[i] - m);
    for (int i = 0; i < 77; i++)
        assert_true(fabs(p[i] - exp(z[i] - m) / sum) <= 1e-5 * exp(z[i] - m) / sum + 1e-9);

    /* swiglu at the plain C and the SIMD level, with the exponential's edges */
    float g[101], u[101], o[101];
    fill(g, 101, 3), fill(u, 101, 1);
    const float edge[] = {0.0f,   -0.0f,  1e-30f,  -1e-30f, 87.0f, -87.0f, 88.5f,
                          -88.5f, 100.0f, -100.0f, -103.0f, 1e4f,  -1e4f};
    memcpy(g + 40, edge, sizeof(edge));
    const tm_cpu_level best = cpu_level_get();
    for (int level = 0; level < 2; level++) {
        cpu_level_set(level ? best : TM_CPU_SCALAR);
        cpu_swiglu(o, g, u, 101);
        /* the clamped SwiGLU against its formula in double (HF GptOssExperts._apply_gate) */
        float o2[101], u2[101]; /* up past both clamps */
        for (int i = 0; i < 101; i++) u2[i] = 12.0f * u[i];
        cpu_swiglu_oai(o2, g, u2, 101, 1.702f, 7.0f);
        for (int i = 0; i < 101; i++) {
            const double gc = g[i] > 7.0 ? 7.0 : g[i], uc = u2[i] < -7 ? -7 : u2[i] > 7 ? 7 : u2[i];
            const double want2 = gc / (1 + exp(-1.702 * gc)) * (uc + 1);
            if (!(fabs(o2[i] - want2) <= 1e-5 * (fabs(want2) + 1)))
                fail_msg("swiglu_oai: g %g u %g: %g, want %g", g[i], u2[i], o2[i], want2);
        }
        /* the GELU-tanh gate against HF's gelu_pytorch_tanh in double (Gemma 4's experts);
         * 1 + tanh cancels for large negative g: an absolute part of g u's rounding */
        float o3[101];
        cpu_geglu(o3, g, u, 101);
        for (int i = 0; i < 101; i++) {
            const double gx = g[i];
            const double want3 =
                0.5 * gx *
                (1 + tanh(sqrt(2 / 3.14159265358979323846) * (gx + 0.044715 * gx * gx * gx))) *
                u[i];
            if (!(fabs(o3[i] - want3) <= 1e-5 * fabs(want3) + 1e-7 * fabs(gx * u[i])))
                fail_msg("geglu: g %g u %g: %g, want %g", g[i], u[i], o3[i], want3);
        }
        for (int i = 0; i < 101; i++) {
            double want = g[i] / (1 + exp(-(double)g[i])) * u[i];
            if (fabs(o[i] - want) > 1e-5 * fabs(want) + 1e-30)
                fail_msg("swiglu level %d: g %g u %g: %g, want %g", level, g[i], u[i], o[i], want);
        }
    }
    cpu_level_set(best);

    int32_t idx[9];
    cpu_topk(z, 77, 9, idx);
    for (int j = 0; j < 9; j++) {
        int above = 0;
        for (int i = 0; i < 77; i++) above += z[i] > z[idx[j]];
        assert_int_equal(above, j);
    }
}

/* Naive attention in double over the cache as stored (f16 rows read back exactly):
 * keys (p - window, p] when a window is set, every key <= p otherwise; a sink
 * adds exp(sink) to the denominator only. */
static void attention_ref(const tm_attention_shape *s, const float *q, const float *kf,
                          const float *vf, double *out) {
    const int64_t d = s->head_dim, G = s->n_head / s->n_head_kv, kvd = s->n_head_kv * d;
    /* values: dv wide, in rows of their own or (v_in_k) the keys' first dv values */
    const int64_t dv = s->v_dim ? s->v_dim : d, vs = s->v_in_k ? d : dv, vrow = s->n_head_kv * vs;
    if (s->v_in_k) vf = kf;
    for (int64_t i = 0; i < s->n_tok; i++)
        for (int64_t h = 0; h < s->n_head; h++) {
            const int64_t n_kv = s->pos0 + i + 1, g = h / G;
            const int64_t t0 = s->window && n_kv > s->window ? n_kv - s->window : 0;
            double *sc = malloc(sizeof(double) * (size_t)n_kv), m = -1e300, z = 0;
            for (int64_t t = 0; t < t0; t++) sc[t] = 0;
            for (int64_t t = t0; t < n_kv; t++) {
                double acc = 0;
                for (int64_t e = 0; e < d; e++)
                    acc += (double)q[(i * s->n_head + h) * d + e] * kf[t * kvd + g * d + e];
                sc[t] = acc * s->scale;
                m = sc[t] > m ? sc[t] : m;
            }
            if (s->sinks) m = s->sinks[h] > m ? s->sinks[h] : m;
            for (int64_t t = t0; t < n_kv; t++) z += sc[t] = exp(sc[t] - m);
            if (s->sinks) z += exp(s->sinks[h] - m);
            for (int64_t e = 0; e < dv; e++) {
                double acc = 0;
                for (int64_t t = 0; t < n_kv; t++) acc += sc[t] * vf[t * vrow + g * vs + e];
                out[(i * s->n_head + h) * dv + e] = acc / z;
            }
            free(sc);
        }
}

/* The same attention over a ring of `ring` rows (position p at row p % ring, every
 * position written in order, so older keys were overwritten): the same bits as out. */
static void check_attention_ring(tm_pool *pool, tm_attention_shape s, int64_t ring, const float *q,
                                 const uint8_t *k, const uint8_t *v, const float *out,
                                 float *scratch) {
    const int64_t n_ctx = s.pos0 + s.n_tok, n_out = s.n_tok * s.n_head * s.head_dim;
    const size_t row = (size_t)(s.n_head_kv * s.head_dim) * (s.kv_type == TM_TYPE_F16 ? 2 : 4);
    uint8_t *kr = malloc((size_t)ring * row), *vr = malloc((size_t)ring * row);
    float *o = malloc(sizeof(float) * (size_t)n_out);
    memset(kr, 0xff, (size_t)ring * row), memset(vr, 0xff, (size_t)ring * row); /* NaN */
    for (int64_t t = 0; t < n_ctx; t++) {
        memcpy(kr + (size_t)(t % ring) * row, k + (size_t)t * row, row);
        memcpy(vr + (size_t)(t % ring) * row, v + (size_t)t * row, row);
    }
    s.ring = ring;
    cpu_attention(pool, &s, q, kr, vr, o, scratch);
    if (memcmp(o, out, sizeof(float) * (size_t)n_out))
        fail_msg("attention n_tok %lld pos0 %lld window %lld: a ring of %lld rows differs from "
                 "the full cache",
                 (long long)s.n_tok, (long long)s.pos0, (long long)s.window, (long long)ring);
    free(kr), free(vr), free(o);
}

/* ring > 0: also over a ring cache of that many rows (check_attention_ring). */
/* Batch invariance: the last 3 queries alone (a continuation over a cached
 * prefix) give the same bits as in the whole batch, at every level and with
 * windows and rings (measured: always). A single query (a decode step) takes
 * the split path (key chunks merged in double), whose float order differs even
 * within one chunk: it is checked against the reference only. */
static void attention_split_check(tm_pool *pool, const tm_attention_shape *s, const float *q,
                                  const void *k, const void *v, const float *out, int64_t n_ctx,
                                  int n_threads) {
    const int64_t row = s->n_head * s->head_dim, n = 3;
    if (s->n_tok <= n) return;
    tm_attention_shape p = *s;
    p.n_tok = n, p.pos0 = s->pos0 + s->n_tok - n;
    float *o = malloc(sizeof(float) * (size_t)(n * row));
    float *scr = malloc(sizeof(float) * (size_t)cpu_attention_scratch_floats(&p, n_ctx, n_threads));
    cpu_attention(pool, &p, q + (s->n_tok - n) * row, k, v, o, scr);
    for (int64_t i = 0; i < n * row; i++)
        if (o[i] != out[(s->n_tok - n) * row + i])
            fail_msg("attention level %s n_tok %lld pos0 %lld window %lld: query %lld value %lld "
                     "is %.9g in the batch, %.9g with the last %lld queries alone",
                     cpu_level_name(cpu_level_get()), (long long)s->n_tok, (long long)s->pos0,
                     (long long)s->window, (long long)(s->n_tok - n + i / row),
                     (long long)(i % row), out[(s->n_tok - n) * row + i], o[i], (long long)n);
    free(o), free(scr);
}

static void check_attention_ws(tm_pool *pool, int n_threads, int64_t n_tok, int64_t pos0,
                               int64_t n_head, int64_t n_head_kv, int64_t d, tm_type kv_type,
                               int64_t window, bool sinks, int64_t ring) {
    const int64_t n_ctx = pos0 + n_tok, kvd = n_head_kv * d, esz = kv_type == TM_TYPE_F16 ? 2 : 4;
    tm_attention_shape s = {.n_tok = n_tok,
                            .pos0 = pos0,
                            .n_head = n_head,
                            .n_head_kv = n_head_kv,
                            .head_dim = d,
                            .scale = 1.0f / sqrtf((float)d),
                            .kv_type = kv_type,
                            .window = window};
    float sink[64];
    for (int64_t h = 0; h < n_head && h < 64; h++) sink[h] = (float)(h % 5) - 1.5f; /* -1.5..2.5 */
    if (sinks) s.sinks = sink;
    float *q = malloc(sizeof(float) * (size_t)(n_tok * n_head * d));
    float *kf = malloc(sizeof(float) * (size_t)(n_ctx * kvd)),
          *vf = malloc(sizeof(float) * (size_t)(n_ctx * kvd));
    uint8_t *k = malloc((size_t)(n_ctx * kvd * esz)), *v = malloc((size_t)(n_ctx * kvd * esz));
    float *out = malloc(sizeof(float) * (size_t)(n_tok * n_head * d));
    double *ref = malloc(sizeof(double) * (size_t)(n_tok * n_head * d));
    float *scratch =
        malloc(sizeof(float) * (size_t)cpu_attention_scratch_floats(&s, n_ctx, n_threads));
    fill(q, n_tok * n_head * d, 1), fill(kf, n_ctx * kvd, 1), fill(vf, n_ctx * kvd, 1);
    for (int64_t t = 0; t < n_ctx; t++) { /* store, then read back what the cache holds */
        cpu_store_kv(k + t * kvd * esz, kf + t * kvd, kv_type, kvd);
        cpu_store_kv(v + t * kvd * esz, vf + t * kvd, kv_type, kvd);
        cpu_load_kv(kf + t * kvd, k + t * kvd * esz, kv_type, kvd);
        cpu_load_kv(vf + t * kvd, v + t * kvd * esz, kv_type, kvd);
    }
    for (int64_t i = 0; i < n_tok * n_head * d; i++)
        out[i] = NAN; /* every output must be written */
    cpu_attention(pool, &s, q, k, v, out, scratch);
    const tm_cpu_level level = cpu_level_get();
    if (level > TM_CPU_AVX2) { /* the AVX-512 tiles sum as the AVX2 ones do: the same bits */
        float *out2 = malloc(sizeof(float) * (size_t)(n_tok * n_head * d));
        assert_int_equal(cpu_level_set(TM_CPU_AVX2), TM_OK);
        cpu_attention(pool, &s, q, k, v, out2, scratch);
        assert_int_equal(cpu_level_set(level), TM_OK);
        if (memcmp(out, out2, sizeof(float) * (size_t)(n_tok * n_head * d)))
            fail_msg("attention n_tok %lld pos0 %lld d %lld: level %d differs from AVX2",
                     (long long)n_tok, (long long)pos0, (long long)d, (int)level);
        free(out2);
    }
    attention_split_check(pool, &s, q, k, v, out, n_ctx, n_threads);
    attention_ref(&s, q, kf, vf, ref);
    double big = 0, worst = 0;
    for (int64_t i = 0; i < n_tok * n_head * d; i++) big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    for (int64_t i = 0; i < n_tok * n_head * d; i++) {
        assert_false(isnan(out[i]));
        worst = fabs(out[i] - ref[i]) > worst ? fabs(out[i] - ref[i]) : worst;
    }
    if (!(worst <= 1e-4 * big))
        fail_msg("attention n_tok %lld pos0 %lld heads %lld/%lld d %lld %s threads %d window "
                 "%lld sinks %d: max err %.3g of %.3g",
                 (long long)n_tok, (long long)pos0, (long long)n_head, (long long)n_head_kv,
                 (long long)d, kv_type == TM_TYPE_F16 ? "f16" : "f32", n_threads, (long long)window,
                 (int)sinks, worst, big);
    if (ring) check_attention_ring(pool, s, ring, q, k, v, out, scratch);
    free(q), free(kf), free(vf), free(k), free(v), free(out), free(ref), free(scratch);
}

static void check_attention(tm_pool *pool, int n_threads, int64_t n_tok, int64_t pos0,
                            int64_t n_head, int64_t n_head_kv, int64_t d, tm_type kv_type) {
    check_attention_ws(pool, n_threads, n_tok, pos0, n_head, n_head_kv, d, kv_type, 0, false, 0);
}

/* Latent attention (MLA's absorbed form): one KV head whose key rows are dk wide
 * and whose value is each key's first dv values (v_in_k: no V rows); against the
 * double reference, AVX-512 against AVX2 bit for bit. */
static void check_attention_latent(tm_pool *pool, int n_threads, int64_t n_tok, int64_t pos0,
                                   int64_t n_head, int64_t dk, int64_t dv, tm_type kv_type) {
    const int64_t n_ctx = pos0 + n_tok, esz = kv_type == TM_TYPE_F16 ? 2 : 4,
                  n_out = n_tok * n_head * dv;
    const tm_attention_shape s = {.n_tok = n_tok,
                                  .pos0 = pos0,
                                  .n_head = n_head,
                                  .n_head_kv = 1,
                                  .head_dim = dk,
                                  .v_dim = dv,
                                  .v_in_k = true,
                                  .scale = 0.7f / sqrtf((float)dk),
                                  .kv_type = kv_type};
    float *q = malloc(sizeof(float) * (size_t)(n_tok * n_head * dk));
    float *kf = malloc(sizeof(float) * (size_t)(n_ctx * dk));
    uint8_t *k = malloc((size_t)(n_ctx * dk * esz));
    float *out = malloc(sizeof(float) * (size_t)n_out),
          *out2 = malloc(sizeof(float) * (size_t)n_out);
    double *ref = malloc(sizeof(double) * (size_t)n_out);
    float *scratch =
        malloc(sizeof(float) * (size_t)cpu_attention_scratch_floats(&s, n_ctx, n_threads));
    fill(q, n_tok * n_head * dk, 1), fill(kf, n_ctx * dk, 1);
    for (int64_t t = 0; t < n_ctx; t++) {
        cpu_store_kv(k + t * dk * esz, kf + t * dk, kv_type, dk);
        cpu_load_kv(kf + t * dk, k + t * dk * esz, kv_type, dk);
    }
    for (int64_t i = 0; i < n_out; i++) out[i] = NAN;
    cpu_attention(pool, &s, q, k, NULL, out, scratch);
    const tm_cpu_level level = cpu_level_get();
    if (level > TM_CPU_AVX2) {
        assert_int_equal(cpu_level_set(TM_CPU_AVX2), TM_OK);
        cpu_attention(pool, &s, q, k, NULL, out2, scratch);
        assert_int_equal(cpu_level_set(level), TM_OK);
        if (memcmp(out, out2, sizeof(float) * (size_t)n_out))
            fail_msg("latent attention dk %lld dv %lld: level %d differs from AVX2", (long long)dk,
                     (long long)dv, (int)level);
    }
    attention_ref(&s, q, kf, NULL, ref);
    double big = 0, worst = 0;
    for (int64_t i = 0; i < n_out; i++) big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    for (int64_t i = 0; i < n_out; i++) {
        assert_false(isnan(out[i]));
        worst = fabs(out[i] - ref[i]) > worst ? fabs(out[i] - ref[i]) : worst;
    }
    if (!(worst <= 1e-4 * big))
        fail_msg("latent attention n_tok %lld pos0 %lld heads %lld dk %lld dv %lld %s level %d "
                 "threads %d: max err %.3g of %.3g",
                 (long long)n_tok, (long long)pos0, (long long)n_head, (long long)dk, (long long)dv,
                 kv_type == TM_TYPE_F16 ? "f16" : "f32", (int)level, n_threads, worst, big);
    free(q), free(kf), free(k), free(out), free(out2), free(ref), free(scratch);
}

static void test_attention(void **state) {
    (void)state;
    const tm_cpu_level best = cpu_level_get();
    /* the plain C tiles, the AVX2 ones, then the best level's (AVX-512 where there) */
    for (int level = TM_CPU_SCALAR; level <= (int)best; level++) {
        if (level != TM_CPU_SCALAR && level != TM_CPU_AVX2 && level != (int)best) continue;
        assert_int_equal(cpu_level_set((tm_cpu_level)level), TM_OK);
        for (int nt = 1; nt <= 3; nt += 2) {
            tm_pool *pool;
            assert_int_equal(cpu_pool_create(nt, &pool), TM_OK);
            for (int kv = 0; kv < 2; kv++) {
                tm_type t = kv ? TM_TYPE_F16 : TM_TYPE_F32;
                check_attention(pool, nt, 7, 0, 4, 2, 64, t); /* prompt from the start */
                check_attention(pool, nt, 5, 11, 8, 1, 32,
                                t); /* prompt after a cached prefix, MQA */
                check_attention(pool, nt, 1, 0, 4, 4, 128, t);  /* first decode token */
                check_attention(pool, nt, 1, 300, 8, 2, 64, t); /* decode split over key chunks */
                check_attention(pool, nt, 1, 700, 4, 2, 16, t); /* uneven last chunk */
                check_attention(pool, nt, 33, 260, 6, 3, 8, t); /* prompt past a chunk's worth */
                /* Qwen3-30B-A3B's layout (G = 8, d = 128): 2 query blocks of 16, the
                 * second seeing a partial key block */
                check_attention(pool, nt, 29, 70, 16, 2, 128, t);
                /* G = 3: row tiles of 4 span queries at different causal limits; d = 40
                 * ends in half a 16-column step */
                check_attention(pool, nt, 19, 50, 9, 3, 40, t);
                /* sliding windows and sinks (gpt-oss): a window inside one key block, one
                 * across blocks, a decode split whose window starts mid-chunk, a window
                 * longer than the context, and sinks alone */
                check_attention_ws(pool, nt, 20, 0, 4, 2, 32, t, 8, true, 0);
                check_attention_ws(pool, nt, 29, 70, 16, 2, 64, t, 40, true, 0);
                check_attention_ws(pool, nt, 1, 300, 8, 2, 64, t, 128, true, 0);
                check_attention_ws(pool, nt, 1, 5, 4, 2, 64, t, 128, false, 0);
                check_attention_ws(pool, nt, 7, 3, 4, 2, 16, t, 0, true, 0);
                /* the same over ring caches (sliding layers' KV): the smallest ring
                 * (window + n_tok - 1), a key block wrapping mid-block, a ring smaller
                 * than a key block, decode past several turns, a ring not yet wrapped */
                check_attention_ws(pool, nt, 20, 100, 4, 2, 32, t, 8, true, 27);
                check_attention_ws(pool, nt, 29, 170, 16, 2, 64, t, 40, true, 69);
                check_attention_ws(pool, nt, 13, 301, 6, 3, 16, t, 16, false, 29);
                check_attention_ws(pool, nt, 1, 700, 8, 2, 64, t, 128, true, 144);
                check_attention_ws(pool, nt, 1, 333, 4, 2, 64, t, 5, true, 5);
                check_attention_ws(pool, nt, 11, 2, 4, 2, 16, t, 8, true, 24);
                /* latent (MLA): the tiny model's, a decode split over key chunks,
                 * DeepSeek-V3's widths, widths not of 8 (plain C) */
                check_attention_latent(pool, nt, 7, 0, 4, 40, 32, t);
                check_attention_latent(pool, nt, 1, 300, 8, 48, 32, t);
                check_attention_latent(pool, nt, 6, 70, 16, 576, 512, t);
                check_attention_latent(pool, nt, 1, 130, 16, 576, 512, t);
                check_attention_latent(pool, nt, 9, 3, 3, 20, 12, t);
            }
            cpu_pool_free(pool);
        }
    }
    cpu_level_set(best);
}

int main(void) {
    tm_rng_seed(&rng, 2024);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_rope_softmax_swiglu),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
