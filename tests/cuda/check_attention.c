/* cuda_attn_prepare and cuda_attention (src/cuda/attention.cu) against a
 * double-precision reference written here from the contract in cuda.h (not
 * from the CPU engine): RMSNorm per head with its weight, NeoX RoPE with
 * theta_i = pos * base^(-2i/d), the K/V store, and causal softmax attention
 * over grouped-query heads (head h reads KV head h / (n_head / n_head_kv)).
 *
 * A case fills both caches (plus a guard row past n_ctx) with NaN bytes,
 * writes the history rows 0 .. pos0-1 with one prepare and the batch rows
 * pos0 .. pos0+n_tok-1 with another; after each, q and the written rows are
 * compared and every other byte of the caches must be unchanged. Attention
 * then runs on the device's q and caches; the reference reads the same values
 * back (K/V as stored: f16-rounded when the cache is f16), so its tolerance
 * covers only the kernel's float32 arithmetic. Rows past the batch stay NaN:
 * a kernel that reads one, even with weight 0, fails.
 *
 * Tolerances, first-order worst-case bounds with u = 2^-24:
 *   prepare: the float sum of d squares is within d u relative, so the RMS
 *     scale is within (d/2 + 3) u; times x and w, then the rotation with
 *     float cos/sin (1 u each) and a possible FMA:
 *       |err| <= ((norm ? d : 0) + 8) u (|a| + |b|)
 *     for the pair (a, b) after the norm. f16 K rows add the half rounding,
 *     2^-11 |y| (2^-25 in the subnormal range). V rows must be exact: the
 *     float itself, or its round-to-nearest-even half, bit for bit.
 *   attention, per output o_i = Σ_j P_j v_ji (P: softmax of s_j over the
 *     row's n keys): a score is a float dot of d products and one scaling,
 *     |δs_j| <= (d + 3) u scale Σ_i |q_i k_ji|; each weight is further off by
 *     rounding s_j - m (u |s_j - m|, m the running max), expf (4 u) and every
 *     online or combine rescale it goes through (<= n/32 + 2 of them, 6 u
 *     each, plus u times the max's total rise, <= 3 u (s_max - s_min) with
 *     the rounding of s_j - m). Relative weight errors ε_j move o_i by
 *     Σ_j P_j ε_j |v_ji - o_i| (a common factor cancels). The float sums of
 *     p v and of p over n keys (per lane, warp, splits) add
 *     (n + 40) u (Σ_j P_j |v_ji| + |o_i|), the final scaling 4 u |o_i|.
 * The bounds are worst cases (errors grow like sqrt(n) in practice), yet a
 * wrong scale, one key past the causal limit, a wrong KV head or rope angle
 * moves outputs by about 1/n or more: hundreds of times these bounds.
 *
 * The tensor-core prompt path (attention_tc.cu; cuda.h says when it runs:
 * n_tok > 8, one sequence, f16 cache aligned, head_dim 64 or 128, not
 * precise) rounds q to f16 and the softmax weights P to f16 before P·V, with
 * f32 accumulation on the tensor cores. With u16 = 2^-11 (f16 unit roundoff;
 * below 2^-14 the spacing is fixed: 2^-25 absolute):
 *   - q: |q~_i - q_i| <= u16 |q_i| + 2^-25, so a score moves by
 *     scale (u16 Σ_i |q_i k_ji| + 2^-25 Σ_i |k_ji|), added to |δs_j|;
 *   - P: each weight p_j = exp(s_j - m) in (0, 1] (m the running max) is
 *     rounded, relative u16 or absolute 2^-25; the row sum adds the rounded
 *     weights, so both enter as weight errors: u16 more in ε_j, and
 *     2^-25 Σ_j |v_ji - o_i| (normalised: the sum is >= 1 at the final max,
 *     an earlier max only scales a weight down);
 *   - the f32 accumulation inside the tensor cores is not documented as
 *     round-to-nearest: its sums take 2u per addition (truncation, within an
 *     ulp) in the two f32 terms above.
 * First order in these errors (the f16 terms give ε_j of a few 1e-3, their
 * squares are far under the worst-case slack). These bounds are about
 * 2^-11 scale Σ|q k| (~5e-3 here): a lost fragment, tile, head or row still
 * moves outputs far past them, and one key too many or too few moves the first
 * tokens of a prompt from position 0 (a few keys each, checked every time) by
 * tens of times them. A prompt with `precise` set must meet the f32 bounds
 * (flag A_PREC).
 * Prompts over 256 tokens check every 7th token and the last 16 against the
 * reference (its cost grows as n_tok^2 d heads) and every output for NaN.
 *
 * gpt-oss's additions (flags A_WIN, A_SINK, A_YARN): a sliding window of
 * ATTN_WINDOW keys ((p - window, p]: it crosses tiles of 32), per-head sink
 * logits in the denominator only, and RoPE from a frequency table with cos
 * and sin scaled by mscale (the prepare bound grows by that factor). The
 * reference keeps the same formulas, over the window's keys, with the sink's
 * exp in the sum and in the max (its rise is in the rescale term).
 *
 * Ring caches (flag A_RING; a sliding layer's KV: tm_cuda_attn_params.ring):
 * the case's n_ctx is the ring's rows and position p lives at row p % n_ctx;
 * the history is written in launches of at most n_ctx - window + 1 tokens
 * (the contract's most), so it turns over the ring several times, and the
 * batch's keys wrap inside a 32- or 64-key tile. prepare's rows are checked at
 * p % n_ctx (nothing else changes), and the reference reads each key of a
 * query's window from its row: the same bounds. */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct head_cfg {
    int32_t n_head, n_head_kv, d;
    float base, scale; /* scale 0: 1/sqrt(d) */
} head_cfg;

static const head_cfg k_heads[] = {
    {32, 4, 128, 1e6f, 0},    /* Qwen3-30B-A3B */
    {6, 3, 64, 1e4f, 0},      /* odd head count */
    {4, 4, 80, 1e4f, 0.25f},  /* no grouping, another scale */
    {2, 1, 6, 1e4f, 0},       /* head_dim % 4 != 0: the scalar tile loads */
    {8, 2, 256, 1e6f, 0},     /* the largest head: over 48 KiB of shared memory */
    {64, 8, 64, 1.5e5f, 0},   /* gpt-oss-20b / 120b */
    {8, 8, 128, 1e6f, 0},     /* no grouping at 128: tensor cores, G = 1 */
    {16, 4, 64, 1e4f, 0},     /* tensor cores, G = 4 at 64 */
    {16, 2, 512, 1e6f, 1.0f}, /* Gemma 4's global heads: 16 dims a lane, scale 1 */
};

#define ATTN_WINDOW 40

enum {
    A_CTX = 1,     /* n_kv_max = n_ctx (a decode graph's launch), else pos0 + n_tok */
    A_NORM = 2,    /* q_norm / k_norm given, else NULL */
    A_MIS = 4,     /* cache bases 4 bytes off 16-byte alignment: no vector loads */
    A_WIN = 8,     /* sliding window of ATTN_WINDOW keys */
    A_SINK = 16,   /* sink logits per head */
    A_YARN = 32,   /* RoPE from a frequency table, cos/sin times mscale */
    A_PREC = 64,   /* precise: a prompt stays on the f32 kernel */
    A_RING = 128,  /* n_ctx rows as a ring (with A_WIN); A_CTX: n_kv_max RING_CTX */
    A_VNORM = 256, /* v_norm: each value head normed (no gain) before the store */
    A_KV = 512,    /* K as V: the value pointer is k's (stored as k was given) */
};

#define RING_CTX 4096 /* the positions a decode graph's launch with a ring covers */

typedef struct attn_case {
    int hc; /* k_heads index */
    tm_type kv;
    int32_t pos0;
    int64_t n_tok, n_ctx;
    int flags;
} attn_case;

#define F16 TM_TYPE_F16
#define F32 TM_TYPE_F32
/* n_tok > 8 takes the prompt path, 1..8 the split decode path (every count
 * appears); pos0 = 700 crosses 22 tiles of 32 keys. */
static const attn_case k_cases[] = {
    {0, F16, 0, 9, 1024, A_NORM},
    {0, F16, 0, 200, 1024, A_NORM},
    {0, F32, 700, 40, 1024, A_NORM},
    {0, F16, 0, 1, 4096, A_CTX | A_NORM},
    {0, F16, 700, 1, 1024, A_NORM},
    {0, F16, 700, 1, 4096, A_CTX | A_NORM},
    {0, F32, 5, 1, 4096, A_CTX | A_NORM}, /* all but one split exit */
    {0, F16, 33, 8, 1024, A_CTX | A_NORM},
    {0, F32, 100, 3, 1024, 0},
    {1, F32, 0, 3, 256, A_NORM},
    {1, F16, 0, 40, 256, 0},
    {1, F16, 300, 5, 1024, A_CTX | A_NORM},
    {1, F32, 64, 9, 256, A_NORM},
    {1, F16, 61, 5, 64, A_NORM}, /* runs past n_ctx: prepare stores 3 rows, no attention */
    {2, F16, 0, 1, 64, A_NORM},
    {2, F32, 31, 2, 1024, A_CTX},
    {2, F16, 700, 200, 1024, A_NORM},
    {2, F16, 50, 7, 1024, A_CTX | A_MIS},
    {3, F32, 0, 9, 64, A_NORM},
    {3, F16, 40, 4, 1024, A_CTX},
    {3, F32, 700, 1, 1024, A_CTX | A_NORM},
    {3, F16, 0, 200, 256, A_NORM},
    {4, F16, 0, 40, 256, A_NORM},
    {4, F32, 200, 6, 1024, A_CTX | A_NORM},
    {4, F16, 0, 3, 64, 0},
    {4, F32, 10, 9, 64, A_MIS},
    /* gpt-oss: prompt and decode (every split path) past the window */
    {5, F16, 0, 200, 1024, A_WIN | A_SINK | A_YARN},
    {5, F32, 500, 1, 4096, A_CTX | A_WIN | A_SINK | A_YARN},
    {5, F16, 130, 8, 1024, A_WIN | A_SINK | A_YARN},
    {5, F16, 20, 3, 1024, A_CTX | A_WIN | A_SINK}, /* the window starts at key 0 */
    {1, F32, 300, 5, 1024, A_CTX | A_WIN | A_NORM},
    {2, F16, 100, 200, 1024, A_WIN | A_YARN},
    {3, F32, 50, 9, 256, A_SINK},
    /* the tensor-core prompt path: G 1 / 4 / 8, head_dim 64 and 128, n_tok off
     * the 64-row and 64-key tiles, a history in the cache, long prompts */
    {6, F16, 0, 77, 256, 0},
    {6, F16, 300, 333, 1024, A_NORM},
    {6, F16, 0, 2100, 4096, A_NORM},
    {7, F16, 100, 500, 1024, A_NORM},
    {7, F16, 0, 130, 256, A_WIN | A_SINK},
    {0, F16, 1000, 1100, 4096, A_NORM},
    {0, F16, 0, 100, 1024, A_CTX | A_NORM},
    {5, F16, 0, 2048, 4096, A_WIN | A_SINK | A_YARN},
    {5, F16, 500, 300, 1024, A_WIN | A_SINK},
    {1, F16, 7, 61, 256, A_NORM},
    /* the f32 kernel for a prompt: precise, a misaligned cache */
    {0, F16, 0, 200, 1024, A_NORM | A_PREC},
    {5, F16, 30, 100, 1024, A_WIN | A_SINK | A_PREC},
    {1, F16, 10, 40, 256, A_NORM | A_MIS},
    /* ring caches (n_ctx: the ring's rows, at least ATTN_WINDOW + n_tok - 1): decode
     * (every split path, the smallest ring), prompts on both kernels with a tile that
     * wraps, a misaligned ring, and a ring the history has not filled yet */
    {5, F16, 200, 1, 41, A_CTX | A_WIN | A_SINK | A_YARN | A_RING},
    {5, F32, 333, 8, 47, A_WIN | A_SINK | A_YARN | A_RING},
    {5, F16, 300, 100, 140, A_WIN | A_SINK | A_YARN | A_RING},
    {5, F16, 200, 50, 89, A_WIN | A_SINK | A_PREC | A_RING},
    {7, F16, 77, 61, 100, A_WIN | A_SINK | A_RING},
    {6, F16, 500, 200, 239, A_WIN | A_NORM | A_RING},
    {0, F32, 150, 20, 64, A_WIN | A_NORM | A_RING},
    {2, F16, 90, 7, 50, A_CTX | A_WIN | A_MIS | A_RING},
    {1, F16, 10, 30, 80, A_WIN | A_NORM | A_RING},
    /* head_dim 512 (the f32 kernel's 16 dims a lane; prepare's 256 threads), the value norm
     * and K as V (Gemma 4's global layers), its proportional RoPE's table: prompts and
     * decode (split keys), f16 and f32 caches */
    {8, F16, 0, 9, 256, A_NORM | A_VNORM | A_KV},
    {8, F32, 40, 1, 256, A_NORM | A_VNORM | A_KV},
    {8, F32, 0, 12, 64, A_NORM | A_VNORM | A_KV | A_YARN},
    {8, F16, 700, 3, 1024, A_CTX | A_NORM | A_VNORM},
    {8, F16, 0, 100, 1024, A_NORM | A_VNORM | A_KV},
    {4, F16, 20, 5, 256, A_NORM | A_VNORM}, /* 256 with a value norm */
};

typedef struct attn_state {
    const attn_case *c;
    tm_cuda_attn_params p;
    int64_t kvw;                  /* values per cache row: n_head_kv * head_dim */
    size_t esz, bytes;            /* cache element size; bytes with the guard row */
    uint8_t *kc_d, *vc_d;         /* device caches */
    uint8_t *kc, *vc, *kc2, *vc2; /* host: what the caches must hold; read back */
    float *qw, *kw, *qw_d, *kw_d; /* norm weights (NULL without A_NORM) */
    int32_t *pos_d;
    double worst_prep, worst_k16; /* q and f32 rows; f16 K rows (with their rounding) */
    float *sinks, *freq;          /* host copies (NULL without A_SINK / A_YARN) */
} attn_state;

static double cache_at(const attn_state *s, const uint8_t *cache, int64_t i) {
    if (s->p.kv_type == TM_TYPE_F32) {
        float f;
        memcpy(&f, cache + i * 4, 4);
        return f;
    }
    tm_half h;
    memcpy(&h, cache + i * 2, 2);
    return quant_f16_to_f32(h);
}

/* One head row x at position pos: RMSNorm with w (none when NULL), then NeoX
 * RoPE; tol[i] is the prepare bound of the top comment. */
static void ref_head(const attn_state *s, const float *x, const float *w, int64_t pos, double *y,
                     double *tol) {
    const int32_t d = s->p.head_dim, half = d / 2;
    double sc = 1;
    if (w) {
        double ss = 0;
        for (int32_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
        sc = 1 / sqrt(ss / d + (double)s->p.rms_eps);
    }
    for (int32_t i = 0; i < half; i++) {
        const double a = x[i] * sc * (w ? w[i] : 1), b = x[i + half] * sc * (w ? w[i + half] : 1);
        const double th = s->freq ? (double)pos * s->freq[i]
                                  : (double)pos * pow((double)s->p.rope_base, -2.0 * i / d);
        const double ms = s->freq ? s->p.rope_mscale : 1.0;
        y[i] = (a * cos(th) - b * sin(th)) * ms;
        y[i + half] = (a * sin(th) + b * cos(th)) * ms;
        tol[i] = tol[i + half] = ((w ? d : 0) + 8) * U32 * ms * (fabs(a) + fabs(b)) + 1e-30;
    }
}

/* cuda_attn_prepare on n fresh random tokens at position pos; checks q, the
 * rows written and that nothing else changed. *q_d / *q: the rotated q on the
 * device and read back. */
static void prep_check(attn_state *s, tm_rng *r, int32_t pos, int64_t n, float **q_d, float **q) {
    const int64_t H = s->p.n_head, d = s->p.head_dim, kvw = s->kvw, nq = n * H * d, nk = n * kvw;
    const bool f16 = s->p.kv_type == TM_TYPE_F16;
    float *qi = xmalloc((size_t)nq * 4), *k = xmalloc((size_t)nk * 4), *v = xmalloc((size_t)nk * 4);
    float *qo = xmalloc((size_t)nq * 4);
    fill_normal(r, qi, nq, 1.5f);
    fill_normal(r, k, nk, 1.5f);
    fill_normal(r, v, nk, 1.0f);
    float *qd = dev_upload(qi, (size_t)nq * 4);
    const float *kd = dev_upload(k, (size_t)nk * 4), *vd = dev_upload(v, (size_t)nk * 4);
    if (s->c->flags & A_KV) vd = kd, memcpy(v, k, (size_t)nk * 4); /* K as V */
    CHECK(cuda_copy_to_device(g_dev, s->pos_d, &pos, 4));
    CHECK(cuda_attn_prepare(&s->p, qd, kd, vd, s->qw_d, s->kw_d, s->pos_d, n, s->kc_d, s->vc_d,
                            cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, qo, qd, (size_t)nq * 4));
    CHECK(cuda_copy_to_host(g_dev, s->kc2, s->kc_d, s->bytes));
    CHECK(cuda_copy_to_host(g_dev, s->vc2, s->vc_d, s->bytes));

    double *y = xmalloc((size_t)d * 8), *tol = xmalloc((size_t)d * 8);
    for (int64_t t = 0; t < n; t++) {
        for (int64_t h = 0; h < H; h++) {
            ref_head(s, qi + (t * H + h) * d, s->qw, pos + t, y, tol);
            for (int64_t i = 0; i < d; i++) {
                const double err = fabs(qo[(t * H + h) * d + i] - y[i]);
                if (!(err <= tol[i]))
                    fail_msg("attn_prepare d %lld pos %lld: q[%lld][%lld][%lld] = %.9g, ref %.9g, "
                             "tol %.3g",
                             (long long)d, (long long)(pos + t), (long long)t, (long long)h,
                             (long long)i, qo[(t * H + h) * d + i], y[i], tol[i]);
                s->worst_prep = fmax(s->worst_prep, err / tol[i]);
            }
        }
        const int64_t row = s->p.ring ? (pos + t) % s->p.n_ctx : pos + t;
        if (row >= s->p.n_ctx) continue; /* not stored: the guard row stays NaN */
        for (int64_t g = 0; g < s->p.n_head_kv; g++) {
            ref_head(s, k + t * kvw + g * d, s->kw, pos + t, y, tol);
            for (int64_t i = 0; i < d; i++) {
                const double got = cache_at(s, s->kc2, row * kvw + g * d + i);
                const double lim = tol[i] + (f16 ? 0x1p-11 * (fabs(y[i]) + tol[i]) + 0x1p-25 : 0);
                const double err = fabs(got - y[i]);
                if (!(err <= lim))
                    fail_msg("attn_prepare %s d %lld: k cache row %lld head %lld [%lld] = %.9g, "
                             "ref %.9g, tol %.3g",
                             f16 ? "f16" : "f32", (long long)d, (long long)row, (long long)g,
                             (long long)i, got, y[i], lim);
                if (f16)
                    s->worst_k16 = fmax(s->worst_k16, err / lim);
                else
                    s->worst_prep = fmax(s->worst_prep, err / lim);
            }
        }
        /* normed: within a bound (f16: half a step, 2^-25 below 2^-14 where steps are even) */
        for (int64_t i = 0; s->p.v_norm && i < kvw; i++) {
            const float *vh = v + t * kvw + i / d * d;
            double ss = 0;
            for (int64_t j = 0; j < d; j++) ss += (double)vh[j] * vh[j];
            const double want = v[t * kvw + i] / sqrt(ss / d + (double)s->p.rms_eps);
            const double got = cache_at(s, s->vc2, row * kvw + i);
            const double lim =
                (d + 8) * U32 * fabs(want) + (f16 ? 0x1p-11 * fabs(want) + 0x1p-25 : 0) + 1e-30;
            if (!(fabs(got - want) <= lim))
                fail_msg("attn_prepare %s d %lld: normed v cache row %lld [%lld] = %.9g, ref "
                         "%.9g, tol %.3g",
                         f16 ? "f16" : "f32", (long long)d, (long long)row, (long long)i, got, want,
                         lim);
            s->worst_prep = fmax(s->worst_prep, fabs(got - want) / lim);
        }
        for (int64_t i = 0; !s->p.v_norm && i < kvw; i++) {
            const float x = v[t * kvw + i];
            tm_half h;
            memcpy(&h, s->vc2 + (row * kvw + i) * 2, 2);
            const bool same =
                f16 ? h == quant_f32_to_f16(x) : cache_at(s, s->vc2, row * kvw + i) == x;
            if (!same)
                fail_msg("attn_prepare %s: v cache row %lld [%lld] = %.9g, want %.9g",
                         f16 ? "f16" : "f32", (long long)row, (long long)i,
                         cache_at(s, s->vc2, row * kvw + i), x);
        }
        const size_t rb = (size_t)kvw * s->esz;
        memcpy(s->kc + row * rb, s->kc2 + row * rb, rb);
        memcpy(s->vc + row * rb, s->vc2 + row * rb, rb);
    }
    for (size_t i = 0; i < s->bytes; i++)
        if (s->kc[i] != s->kc2[i] || s->vc[i] != s->vc2[i])
            fail_msg("attn_prepare at %d, %lld tokens, n_ctx %lld: %s cache row %lld changed", pos,
                     (long long)n, (long long)s->p.n_ctx, s->kc[i] != s->kc2[i] ? "k" : "v",
                     (long long)(i / ((size_t)kvw * s->esz)));
    free(qi), free(k), free(v), free(y), free(tol);
    *q_d = qd, *q = qo;
}

/* Whether cuda.h's contract puts this launch on tensor cores. */
static bool attn_tc(const attn_state *s, int64_t n_tok) {
    const int32_t d = s->p.head_dim;
    return n_tok > 8 && s->p.kv_type == TM_TYPE_F16 && (d == 64 || d == 128) && !s->p.precise &&
           !(s->c->flags & A_MIS);
}

/* cuda_attention for the batch at pos0 (q rotated on the device, q its copy);
 * returns the worst |err| / tol. */
static double attn_check(const attn_state *s, const float *q_d, const float *q, int32_t pos0,
                         int64_t n_tok) {
    const int64_t H = s->p.n_head, G = H / s->p.n_head_kv, d = s->p.head_dim, kvw = s->kvw;
    const bool tc = attn_tc(s, n_tok);
    const double ua = tc ? 2 * U32 : U32, u16 = tc ? 0x1p-11 : 0, a16 = tc ? 0x1p-25 : 0;
    const int64_t n_kv = pos0 + n_tok,
                  n_kv_max = s->c->flags & A_CTX ? (s->p.ring ? RING_CTX : s->p.n_ctx) : n_kv;
    const int64_t n_out = n_tok * H * d,
                  n_scr = cuda_attention_scratch_floats(&s->p, n_tok, n_kv_max);
    float *scr = NULL;
    if (n_scr > 0) {
        scr = dev_alloc((size_t)n_scr * 4);
        CHECK(cuda_fill_bytes(g_dev, scr, 0xff, (size_t)n_scr * 4));
    }
    float *out_d = dev_alloc((size_t)n_out * 4), *out = xmalloc((size_t)n_out * 4);
    CHECK(cuda_fill_bytes(g_dev, out_d, 0xff, (size_t)n_out * 4)); /* NaN: unwritten fails */
    CHECK(cuda_attention(&s->p, q_d, s->kc_d, s->vc_d, s->pos_d, n_tok, n_kv_max, out_d, scr,
                         cuda_device_stream(g_dev)));
    CHECK(cuda_device_sync(g_dev));
    CHECK(cuda_copy_to_host(g_dev, out, out_d, (size_t)n_out * 4));

    /* keys by position (a ring's from row p % rows: the windows' keys are still there) */
    double *K = xmalloc((size_t)(n_kv * kvw) * 8), *V = xmalloc((size_t)(n_kv * kvw) * 8);
    for (int64_t j = 0; j < n_kv; j++) {
        const int64_t row = s->p.ring ? j % s->p.n_ctx : j;
        for (int64_t i = 0; i < kvw; i++)
            K[j * kvw + i] = cache_at(s, s->kc, row * kvw + i),
                        V[j * kvw + i] = cache_at(s, s->vc, row * kvw + i);
    }
    double *sc = xmalloc((size_t)n_kv * 8), *E = xmalloc((size_t)n_kv * 8),
           *P = xmalloc((size_t)n_kv * 8);
    const double scale = s->p.scale;
    double worst = 0;
    for (int64_t i = 0; i < n_out; i++)
        if (!isfinite(out[i]))
            fail_msg("attention %d/%d/%lld pos0 %d n_tok %lld: out[%lld] = %g (unwritten?)",
                     s->p.n_head, s->p.n_head_kv, (long long)d, pos0, (long long)n_tok,
                     (long long)i, out[i]);
    for (int64_t t = 0; t < n_tok; t++) {
        if (n_tok > 256 && t % 7 && t < n_tok - 16) continue; /* sampled: the top comment */
        for (int64_t h = 0; h < H; h++) {
            const int64_t nk = pos0 + t + 1, g = h / G;
            const int64_t j0 = s->p.window && nk > s->p.window ? nk - s->p.window : 0;
            const float *qr = q + (t * H + h) * d;
            double smax = -INFINITY, smin = INFINITY, sum = 0;
            for (int64_t j = j0; j < nk; j++) {
                const double *kr = K + j * kvw + g * d;
                double dot = 0, mag = 0, kmag = 0;
                for (int64_t i = 0; i < d; i++)
                    dot += qr[i] * kr[i], mag += fabs(qr[i] * kr[i]), kmag += fabs(kr[i]);
                sc[j] = scale * dot;
                E[j] = scale * ((double)(d + 3) * ua * mag + u16 * mag + a16 * kmag);
                smax = fmax(smax, sc[j]), smin = fmin(smin, sc[j]);
            }
            if (s->sinks) smax = fmax(smax, s->sinks[h]), smin = fmin(smin, s->sinks[h]);
            for (int64_t j = j0; j < nk; j++) sum += P[j] = exp(sc[j] - smax);
            if (s->sinks) sum += exp(s->sinks[h] - smax); /* the denominator only */
            const double resc = (double)(10 + 6 * (nk / 32 + 2)) * U32 + 3 * U32 * (smax - smin);
            for (int64_t j = j0; j < nk; j++)
                P[j] /= sum, E[j] += U32 * (smax - sc[j]) + resc + u16;
            for (int64_t i = 0; i < d; i++) {
                const double *vc = V + g * d + i;
                double o = 0, a = 0, b = 0, dev = 0;
                for (int64_t j = j0; j < nk; j++) o += P[j] * vc[j * kvw];
                for (int64_t j = j0; j < nk; j++) {
                    const double dv = fabs(vc[j * kvw] - o);
                    a += P[j] * E[j] * dv, b += P[j] * fabs(vc[j * kvw]), dev += dv;
                }
                const double tol = a + (double)(nk + 40) * ua * (b + fabs(o)) + 4 * U32 * fabs(o) +
                                   a16 * dev + 1e-30;
                const float got = out[(t * H + h) * d + i];
                const double err = fabs(got - o);
                if (!(err <= tol))
                    fail_msg("attention %d/%d/%lld %s%s pos0 %d n_tok %lld n_kv_max %lld: out[%lld]"
                             "[%lld][%lld] = %.9g, ref %.9g, tol %.3g",
                             s->p.n_head, s->p.n_head_kv, (long long)d,
                             s->p.kv_type == TM_TYPE_F16 ? "f16" : "f32", tc ? " tensor cores" : "",
                             pos0, (long long)n_tok, (long long)n_kv_max, (long long)t,
                             (long long)h, (long long)i, got, o, tol);
                worst = fmax(worst, err / tol);
            }
        }
    }
    free(out), free(K), free(V), free(sc), free(E), free(P);
    return worst;
}

/* w: worst |err|/tol of attention on the f32 kernel, then prepare's q and
 * f32 rows, its f16 k rows, attention on tensor cores. */
static void attn_run_case(tm_rng *r, const attn_case *c, double w[4]) {
    const head_cfg *hc = &k_heads[c->hc];
    attn_state s;
    memset(&s, 0, sizeof(s));
    s.c = c;
    s.p.n_head = hc->n_head, s.p.n_head_kv = hc->n_head_kv, s.p.head_dim = hc->d;
    s.p.n_ctx = c->n_ctx, s.p.kv_type = c->kv, s.p.rms_eps = 1e-6f, s.p.rope_base = hc->base;
    s.p.scale = hc->scale > 0 ? hc->scale : 1.0f / sqrtf((float)hc->d);
    s.kvw = (int64_t)hc->n_head_kv * hc->d, s.esz = c->kv == TM_TYPE_F16 ? 2 : 4;
    s.bytes = (size_t)((c->n_ctx + 1) * s.kvw) * s.esz;

    cuda_pool_reset(g_pool);
    const size_t off = c->flags & A_MIS ? 4 : 0;
    s.kc_d = (uint8_t *)dev_alloc(s.bytes + off) + off;
    s.vc_d = (uint8_t *)dev_alloc(s.bytes + off) + off;
    CHECK(cuda_fill_bytes(g_dev, s.kc_d, 0xff, s.bytes));
    CHECK(cuda_fill_bytes(g_dev, s.vc_d, 0xff, s.bytes));
    s.kc = xmalloc(s.bytes), s.vc = xmalloc(s.bytes), s.kc2 = xmalloc(s.bytes);
    s.vc2 = xmalloc(s.bytes);
    memset(s.kc, 0xff, s.bytes), memset(s.vc, 0xff, s.bytes);
    if (c->flags & A_NORM) {
        s.qw = xmalloc((size_t)hc->d * 4), s.kw = xmalloc((size_t)hc->d * 4);
        fill_normal(r, s.qw, hc->d, 0.5f);
        fill_normal(r, s.kw, hc->d, 0.5f);
        for (int32_t i = 0; i < hc->d; i++) s.qw[i] += 1.0f, s.kw[i] += 1.5f;
        s.qw_d = dev_upload(s.qw, (size_t)hc->d * 4), s.kw_d = dev_upload(s.kw, (size_t)hc->d * 4);
    }
    s.pos_d = dev_alloc(4);
    s.p.precise = (c->flags & A_PREC) != 0;
    if (c->flags & A_WIN) s.p.window = ATTN_WINDOW;
    s.p.ring = (c->flags & A_RING) != 0;
    s.p.v_norm = (c->flags & A_VNORM) != 0;
    if (c->flags & A_SINK) { /* of the scores' size: a real share of the softmax */
        s.sinks = xmalloc((size_t)hc->n_head * 4);
        fill_normal(r, s.sinks, hc->n_head, 2.0f);
        s.p.sinks = dev_upload(s.sinks, (size_t)hc->n_head * 4);
    }
    if (c->flags & A_YARN) { /* any table: the contract is theta_i = pos * freq[i] */
        s.freq = xmalloc((size_t)(hc->d / 2) * 4);
        for (int32_t i = 0; i < hc->d / 2; i++)
            s.freq[i] = (float)(pow(hc->base, -2.0 * i / hc->d) / (i < hc->d / 8 ? 1 : 32));
        s.p.rope_freq = dev_upload(s.freq, (size_t)(hc->d / 2) * 4);
        s.p.rope_mscale = 1.3466f; /* 0.1 ln 32 + 1 */
    }

    float *q_d, *q;
    /* the history, written as one earlier batch (a ring's in the largest batches it takes) */
    const int64_t most = s.p.ring ? c->n_ctx - ATTN_WINDOW + 1 : c->pos0;
    for (int32_t p0 = 0; p0 < c->pos0; p0 += (int32_t)most) {
        prep_check(&s, r, p0, c->pos0 - p0 < most ? c->pos0 - p0 : most, &q_d, &q);
        free(q);
    }
    prep_check(&s, r, c->pos0, c->n_tok, &q_d, &q);
    if (s.p.ring || c->pos0 + c->n_tok <= c->n_ctx) {
        const int k = attn_tc(&s, c->n_tok) ? 3 : 0;
        w[k] = fmax(w[k], attn_check(&s, q_d, q, c->pos0, c->n_tok));
    }
    w[1] = fmax(w[1], s.worst_prep), w[2] = fmax(w[2], s.worst_k16);
    free(q), free(s.kc), free(s.vc), free(s.kc2), free(s.vc2), free(s.qw), free(s.kw);
    free(s.sinks), free(s.freq);
}

static void expect_arg(tm_status st, const char *what) {
    if (st != TM_ERR_ARG)
        fail_msg("attention with %s: got %s, want TM_ERR_ARG", what, tm_status_name(st));
    if (!strstr(tm_error_message(), "cuda_att"))
        fail_msg("attention with %s: message '%s' names no op", what, tm_error_message());
}

/* What the launchers must refuse (before launching anything). */
static void attn_bad_args(void) {
    const tm_cuda_stream st = cuda_device_stream(g_dev);
    cuda_pool_reset(g_pool);
    float *b = dev_alloc((size_t)4 << 20); /* room for every buffer below, were it used */
    CHECK(cuda_fill_bytes(g_dev, b, 0, (size_t)4 << 20));
    const int32_t *pos = (const int32_t *)b; /* *pos0 = 0 */
    const tm_cuda_attn_params ok = {.n_head = 32,
                                    .n_head_kv = 4,
                                    .head_dim = 128,
                                    .n_ctx = 1024,
                                    .kv_type = F16,
                                    .scale = 0.088f,
                                    .rms_eps = 1e-6f,
                                    .rope_base = 1e6f};
    static const struct {
        int32_t n_head_kv, d;
        tm_type kv;
        const char *what;
    } bad[] = {
        {5, 128, F16, "n_head % n_head_kv != 0"}, {4, 63, F16, "an odd head_dim"},
        {4, 514, F16, "head_dim > 512"},          {4, 0, F16, "head_dim 0"},
        {4, 128, TM_TYPE_BF16, "a bf16 cache"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tm_cuda_attn_params p = ok;
        p.n_head_kv = bad[i].n_head_kv, p.head_dim = bad[i].d, p.kv_type = bad[i].kv;
        expect_arg(cuda_attn_prepare(&p, b, b, b, NULL, NULL, pos, 2, b, b, st), bad[i].what);
        expect_arg(cuda_attention(&p, b, b, b, pos, 2, 2, b, b, st), bad[i].what);
        assert_int_equal(cuda_attention_scratch_floats(&p, 1, 1024), 0);
    }
    expect_arg(cuda_attention(&ok, b, b, b, pos, 4, 3, b, b, st), "n_kv_max < n_tok");
    expect_arg(cuda_attention(&ok, b, b, b, pos, 1, 1025, b, b, st), "n_kv_max > n_ctx");
    assert_true(cuda_attention_scratch_floats(&ok, 1, 1024) > 0); /* decode splits the keys */
    expect_arg(cuda_attention(&ok, b, b, b, pos, 1, 1024, b, NULL, st), "no scratch for splits");
    tm_cuda_attn_params ring = ok;
    ring.ring = true;
    expect_arg(cuda_attention(&ring, b, b, b, pos, 2, 2, b, b, st), "a ring without a window");
    ring.window = 1000, ring.n_ctx = 1024;
    expect_arg(cuda_attention(&ring, b, b, b, pos, 30, 30, b, b, st), "a ring short of the keys");
    expect_arg(cuda_attn_prepare(&ring, b, b, b, NULL, NULL, pos, 30, b, b, st),
               "a ring short of the keys");
    ring.seq_rows = 2048;
    expect_arg(cuda_attention(&ring, b, b, b, pos, 1, 1, b, b, st), "seq_rows > n_ctx");
    CHECK(cuda_device_sync(g_dev)); /* nothing was launched that failed */
}

/* A case's query-key pairs over its heads. TM_CUDA_ATTN_WORK=n runs only the
 * cases of at most n (scripts/cuda_emu_check.sh: the kernels emulated on the
 * CPU, where the long prompts would take hours). */
static int64_t attn_work(const attn_case *c) {
    return c->n_tok * (c->pos0 + c->n_tok) * k_heads[c->hc].n_head;
}

void check_attention(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0xa77e);
    const char *lim = getenv("TM_CUDA_ATTN_WORK");
    const int64_t max_work = lim ? atoll(lim) : INT64_MAX;
    for (int hc = 0; hc < (int)(sizeof(k_heads) / sizeof(k_heads[0])); hc++) {
        int n = 0, skipped = 0;
        double w[4] = {0, 0, 0, 0};
        for (size_t i = 0; i < sizeof(k_cases) / sizeof(k_cases[0]); i++) {
            if (k_cases[i].hc != hc) continue;
            if (attn_work(&k_cases[i]) > max_work)
                skipped++;
            else
                attn_run_case(&r, &k_cases[i], w), n++;
        }
        printf("attention %d/%d/%d: %d cases ok (%d over TM_CUDA_ATTN_WORK), worst |err|/tol %.3g "
               "f32 kernel, %.3g tensor cores (prepare: q and f32 rows %.3g, f16 k rows %.3g)\n",
               k_heads[hc].n_head, k_heads[hc].n_head_kv, k_heads[hc].d, n, skipped, w[0], w[3],
               w[1], w[2]);
    }
    attn_bad_args();
    printf("attention: bad arguments refused\n");
}

#endif /* TM_HAVE_CUDA */
