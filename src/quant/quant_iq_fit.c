/* Fitting a block to an i-quant grid: the scale search (see quant_iq_fit.h). */
#include "quant/quant_iq_fit.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "quant/quant_grids.h"
#include "quant/quant_ref_util.h"

typedef struct iq_kind {
    iq_grid_id grid;
    int sub;        /* values per sub-block scale */
    int sc_max;     /* largest sub-block scale code */
    int parity;     /* signs stored as 7 bits + even parity */
    int ternary;    /* iq1: value = grid + delta, no separate signs */
    int unit_delta; /* iq1_m: a delta sign per 8 values (iq1_s: per sub-block) */
    float top;      /* largest decoded magnitude in grid units */
    float m0, m1;   /* m(sc) = m0 + m1 * sc */
    float ratio[4]; /* candidate steps: max|x| / (top * ratio) */
    int nratio;
    int refine; /* least-squares steps after each candidate */
} iq_kind;

static const iq_kind g_kinds[IQ_KIND_COUNT] = {
    [IQ_KIND_2XXS] = {IQ_GRID_2XXS, 32, 15, 1, 0, 0, 43, 0.125f, 0.25f, {0.85f, 1.0f, 1.15f}, 3, 1},
    [IQ_KIND_2XS] = {IQ_GRID_2XS, 16, 15, 1, 0, 0, 43, 0.125f, 0.25f, {0.85f, 1.0f, 1.15f}, 3, 1},
    [IQ_KIND_2S] = {IQ_GRID_2S, 16, 15, 0, 0, 0, 43, 0.125f, 0.25f, {0.85f, 1.0f, 1.15f}, 3, 1},
    [IQ_KIND_3XXS] = {IQ_GRID_3XXS, 32, 15, 1, 0, 0, 62, 0.25f, 0.5f, {0.85f, 1.0f, 1.15f}, 3, 1},
    [IQ_KIND_3S] = {IQ_GRID_3S, 32, 15, 0, 0, 0, 15, 1.0f, 2.0f, {0.85f, 1.0f, 1.15f}, 3, 1},
    [IQ_KIND_1S] = {IQ_GRID_1S, 32, 7, 0, 1, 0, 1.125f, 1.0f, 2.0f, {1.3f, 1.6f, 1.9f}, 3, 2},
    [IQ_KIND_1M] = {IQ_GRID_1S, 16, 7, 0, 1, 1, 1.125f, 1.0f, 2.0f, {1.3f, 1.6f, 1.9f}, 3, 2},
};

float quant_iq_step(iq_kind_id kind, float d, int sc) {
    switch (kind) {
    case IQ_KIND_2XXS:
    case IQ_KIND_2XS:
    case IQ_KIND_2S:
        return d * (0.5f + (float)sc) * 0.25f;
    case IQ_KIND_3XXS:
        return d * (0.5f + (float)sc) * 0.5f;
    default:
        return d * (float)(1 + 2 * sc); /* iq3_s, iq1_s, iq1_m */
    }
}

/* ---- one group of 8 values at a given step ---- */

/* Signed grids: magnitudes from the grid, signs from x (one flipped where parity
 * needs it, where that costs least). Returns the squared error, or INFINITY when
 * it cannot be below `bound` (then u is not valid). */
static float unit_fit_signed(const iq_kind *k, const iq_grid *g, const float *x, float s,
                             float bound, iq_unit *u) {
    const int L = g->levels;
    float a[8], c[8 * IQ_MAX_LEVELS], f[8 * IQ_MAX_LEVELS];
    unsigned neg = 0;
    for (int i = 0; i < 8; i++) {
        a[i] = fabsf(x[i]);
        neg |= (unsigned)(x[i] < 0) << i;
    }
    const int odd = k->parity && (__builtin_popcount(neg) & 1);
    for (int i = 0; i < 8; i++)
        for (int l = 0; l < L; l++) {
            const float q = s * g->level[l], e = a[i] - q;
            c[i * L + l] = e * e;
            f[i * L + l] = 4.0f * a[i] * q; /* (a + q)^2 - (a - q)^2 */
        }
    float cost;
    int flip_part = -1;
    if (g->dims == 8) {
        iq_search_result r;
        quant_iq_grid_search(g, c, odd ? f : NULL, odd ? IQ_WANT_FLIP : IQ_WANT_PLAIN, bound, &r);
        if (!(r.cost[odd] < bound)) return INFINITY;
        u->idx[0] = (uint16_t)r.index[odd];
        cost = r.cost[odd];
        u->idx[1] = 0;
        flip_part = odd ? 0 : -1;
    } else { /* two 4-value grid points share the 8 signs */
        float ce[2], co[2], bp = bound;
        int ie[2], io[2];
        for (int p = 0; p < 2; p++) {
            iq_search_result r;
            quant_iq_grid_search(g, c + 4 * p * L, odd ? f + 4 * p * L : NULL, IQ_WANT_BOTH, bp,
                                 &r);
            ie[p] = r.index[0];
            ce[p] = r.cost[0] < bp ? r.cost[0] : INFINITY; /* INFINITY: none below bp */
            io[p] = r.index[1];
            co[p] = odd && r.cost[1] < bp ? r.cost[1] : INFINITY;
            if (!(ce[0] < bound)) return INFINITY;
            bp = bound - ce[0]; /* what the second point may cost, flipped or not */
        }
        if (!odd) {
            cost = ce[0] + ce[1];
        } else if (ce[0] + co[1] <= co[0] + ce[1]) {
            cost = ce[0] + co[1];
            ie[1] = io[1];
            flip_part = 1;
        } else {
            cost = co[0] + ce[1];
            ie[0] = io[0];
            flip_part = 0;
        }
        if (!(cost < bound)) return INFINITY;
        u->idx[0] = (uint16_t)ie[0];
        u->idx[1] = (uint16_t)ie[1];
    }
    if (flip_part >= 0) { /* the coordinate whose flip the search priced */
        const int base = g->dims == 8 ? 0 : 4 * flip_part;
        const uint8_t *lev = g->lev[u->idx[g->dims == 8 ? 0 : flip_part]];
        int j = 0;
        for (int i = 1; i < g->dims; i++)
            if (f[(base + i) * L + lev[i]] < f[(base + j) * L + lev[j]]) j = i;
        neg ^= 1u << (base + j);
    }
    u->signs = (uint8_t)neg;
    u->neg_delta = 0;
    return cost;
}

/* iq1: values step * (grid + delta); returns the squared error, or INFINITY when it
 * cannot be below `bound`. */
static float unit_fit_ternary(const iq_grid *g, const float *x, float s, float delta, float bound,
                              iq_unit *u) {
    float c[8 * 3];
    for (int i = 0; i < 8; i++)
        for (int l = 0; l < 3; l++) {
            const float e = x[i] - s * (g->level[l] + delta);
            c[i * 3 + l] = e * e;
        }
    iq_search_result r;
    quant_iq_grid_search(g, c, NULL, IQ_WANT_PLAIN, bound, &r);
    u->idx[0] = (uint16_t)r.index[0];
    u->idx[1] = 0;
    u->signs = 0;
    u->neg_delta = delta < 0;
    return r.cost[0] < bound ? r.cost[0] : INFINITY;
}

/* ---- a sub-block at a given step ---- */

/* The squared error of a sub-block at step s, or INFINITY when it cannot be below
 * `bound` (then u is not valid): each group gets what is left of the bound, which
 * cuts most of its search when an alternative is already known. */
static float sub_fit_at(const iq_kind *k, const iq_grid *g, const float *x, float s, float bound,
                        iq_unit *u) {
    const int nu = k->sub / 8;
    float err = 0;
    if (!k->ternary) {
        for (int j = 0; j < nu && err < bound; j++)
            err += unit_fit_signed(k, g, x + 8 * j, s, bound - err, &u[j]);
    } else if (k->unit_delta) {
        for (int j = 0; j < nu && err < bound; j++) {
            iq_unit alt;
            const float ep = unit_fit_ternary(g, x + 8 * j, s, TM_IQ1_DELTA, bound - err, &u[j]);
            const float em =
                unit_fit_ternary(g, x + 8 * j, s, -TM_IQ1_DELTA, fminf(ep, bound - err), &alt);
            if (em < ep) u[j] = alt;
            err += em < ep ? em : ep;
        }
    } else { /* one delta for the sub-block: the second must beat the first in total */
        iq_unit alt[4];
        float ep = 0, em = 0;
        for (int j = 0; j < nu && ep < bound; j++)
            ep += unit_fit_ternary(g, x + 8 * j, s, TM_IQ1_DELTA, bound - ep, &u[j]);
        const float bm = fminf(ep, bound);
        for (int j = 0; j < nu && em < bm; j++)
            em += unit_fit_ternary(g, x + 8 * j, s, -TM_IQ1_DELTA, bm - em, &alt[j]);
        if (em < ep) memcpy(u, alt, (size_t)nu * sizeof(*u));
        err = em < ep ? em : ep;
    }
    return err < bound ? err : INFINITY;
}

/* Least-squares step for the chosen points: num / den with num = sum x v, den = sum v^2
 * (v the decoded value at step 1). */
static void sub_dot(const iq_kind *k, const iq_grid *g, const float *x, const iq_unit *u,
                    float *num, float *den) {
    float nm = 0, dn = 0;
    for (int j = 0; j < k->sub / 8; j++)
        for (int i = 0; i < 8; i++) {
            const int which = g->dims == 8 ? 0 : i / 4, coord = g->dims == 8 ? i : i % 4;
            float v = g->level[g->lev[u[j].idx[which]][coord]];
            if (k->ternary)
                v += u[j].neg_delta ? -TM_IQ1_DELTA : TM_IQ1_DELTA;
            else if ((u[j].signs >> i) & 1)
                v = -v;
            nm += x[8 * j + i] * v;
            dn += v * v;
        }
    *num = nm;
    *den = dn;
}

/* TIERMOE_IQ_SEARCH=fast: step 1 ranks the candidate steps by a proxy (each value at
 * its nearest level, no grid, no parity) instead of exact searches; steps 2-3 are
 * unchanged, so the stored points stay the best for their step. About 2-3x faster,
 * 1-4% more RMSE (docs/quant.md); for generating large synthetic models. */
#define IQ_FAST_CANDIDATES 5

static int g_fast;
static pthread_once_t g_fast_once = PTHREAD_ONCE_INIT;

static void iq_search_mode_read(void) {
    const char *e = getenv("TIERMOE_IQ_SEARCH");
    g_fast = e && !strcmp(e, "fast");
    if (e && !g_fast && strcmp(e, "exact"))
        tm_log_warn("TIERMOE_IQ_SEARCH=%s: expected fast or exact; using exact", e);
}

static int iq_search_fast(void) {
    pthread_once(&g_fast_once, iq_search_mode_read);
    return g_fast;
}

/* The proxy: every value at its nearest level, ignoring the grid and parity; its error,
 * and num / den for a least-squares step as sub_dot gives them. */
static float sub_proxy(const iq_kind *k, const iq_grid *g, const float *x, float s, float *num,
                       float *den) {
    const int L = g->levels;
    float err = 0, nm = 0, dn = 0;
    if (!k->ternary) {
        for (int i = 0; i < k->sub; i++) {
            const float a = fabsf(x[i]);
            float be = FLT_MAX, bl = 0;
            for (int l = 0; l < L; l++) {
                const float e = a - s * g->level[l];
                if (e * e < be) {
                    be = e * e;
                    bl = g->level[l];
                }
            }
            err += be;
            nm += a * bl;
            dn += bl * bl;
        }
    } else {
        const int span = k->unit_delta ? 8 : k->sub;
        for (int j0 = 0; j0 < k->sub; j0 += span) {
            float te[2] = {0, 0}, tn[2] = {0, 0}, td[2] = {0, 0};
            for (int dsign = 0; dsign < 2; dsign++) {
                const float delta = dsign ? -TM_IQ1_DELTA : TM_IQ1_DELTA;
                for (int i = j0; i < j0 + span; i++) {
                    float be = FLT_MAX, bl = 0;
                    for (int l = 0; l < 3; l++) {
                        const float e = x[i] - s * (g->level[l] + delta);
                        if (e * e < be) {
                            be = e * e;
                            bl = g->level[l] + delta;
                        }
                    }
                    te[dsign] += be;
                    tn[dsign] += x[i] * bl;
                    td[dsign] += bl * bl;
                }
            }
            const int w = te[1] < te[0];
            err += te[w];
            nm += tn[w];
            dn += td[w];
        }
    }
    *num = nm;
    *den = dn;
    return err;
}

/* Best continuous step of a sub-block and its curvature (0, 0 for all zeros). */
static void sub_fit_free(const iq_kind *k, const iq_grid *g, const float *x, float *s_best,
                         float *w_best) {
    float amax = 0;
    for (int i = 0; i < k->sub; i++) amax = fmaxf(amax, fabsf(x[i]));
    *s_best = 0;
    *w_best = 0;
    if (!(amax > 0)) return;
    float best = FLT_MAX;
    iq_unit u[4];
    if (iq_search_fast()) { /* the proxy ranks the candidates: no grid search at all */
        for (int r = 0; r < IQ_FAST_CANDIDATES; r++) {
            const float t = (float)r / (IQ_FAST_CANDIDATES - 1);
            float s = amax / (k->top * (k->ratio[0] + t * (k->ratio[k->nratio - 1] - k->ratio[0])));
            float num, den, err = sub_proxy(k, g, x, s, &num, &den);
            const float w = den;
            if (num > 0 && den > 0) { /* one least-squares step on the proxy's levels */
                const float s2 = num / den, err2 = sub_proxy(k, g, x, s2, &num, &den);
                if (err2 < err) {
                    err = err2;
                    s = s2;
                }
            }
            if (err < best) {
                best = err;
                *s_best = s;
                *w_best = w;
            }
        }
        return;
    }
    for (int r = 0; r < k->nratio; r++) {
        float s = amax / (k->top * k->ratio[r]), num, den;
        float err = sub_fit_at(k, g, x, s, FLT_MAX, u);
        sub_dot(k, g, x, u, &num, &den);
        const float w = den;
        for (int it = 0; it < k->refine && num > 0 && den > 0; it++) {
            const float s2 = num / den, err2 = sub_fit_at(k, g, x, s2, err, u);
            if (!(err2 < err)) break; /* a fixed point: the least-squares step of its own points */
            err = err2;
            s = s2;
            sub_dot(k, g, x, u, &num, &den);
        }
        if (err < best) {
            best = err;
            *s_best = s;
            *w_best = w;
        }
    }
}

/* The sub-block code whose m(sc) is nearest below t (clamped to the code range). */
static int sc_floor(const iq_kind *k, float t) {
    const float q = quant_clampf((t - k->m0) / k->m1, 0.0f, (float)k->sc_max);
    return (int)q;
}

void quant_iq_fit_block(iq_kind_id kind, const float *x_in, iq_block_fit *out) {
    const iq_kind *k = &g_kinds[kind];
    const iq_grid *g = quant_iq_grid_get(k->grid);
    const int nsub = TM_QK_K / k->sub;
    float x[TM_QK_K], s[TM_QK_K / 16], w[TM_QK_K / 16];
    for (int i = 0; i < TM_QK_K; i++) /* NaN reads as 0 */
        x[i] = x_in[i] == x_in[i] ? quant_clampf(x_in[i], -1e15f, 1e15f) : 0.0f;
    memset(out, 0, sizeof(*out));
    float smax = 0;
    for (int j = 0; j < nsub; j++) {
        sub_fit_free(k, g, x + j * k->sub, &s[j], &w[j]);
        smax = fmaxf(smax, s[j]);
    }
    if (!(smax > 0)) return; /* all zeros: d = 0 decodes to zeros */
    /* d: least growth of the summed error when each step moves to its rounded code */
    const float mtop = k->m0 + k->m1 * (float)k->sc_max, base = smax / mtop;
    float dbest = base, ebest = FLT_MAX;
    for (int t = -2; t < 16; t++) {
        const float dc = base * (1.0f - 0.0125f * (float)t);
        float e = 0;
        for (int j = 0; j < nsub; j++) {
            const int lo = sc_floor(k, s[j] / dc), hi = lo < k->sc_max ? lo + 1 : lo;
            const float dl = dc * (k->m0 + k->m1 * (float)lo) - s[j];
            const float dh = dc * (k->m0 + k->m1 * (float)hi) - s[j];
            e += w[j] * fminf(dl * dl, dh * dh);
        }
        if (e < ebest) {
            ebest = e;
            dbest = dc;
        }
    }
    out->d = quant_f16_sat(dbest);
    const float d = quant_f16_to_f32(out->d);
    if (!(d > 0)) { /* below the smallest half: zeros are the closest we can store */
        out->d = 0;
        return;
    }
    for (int j = 0; j < nsub; j++) {
        const int lo = sc_floor(k, s[j] / d), hi = lo < k->sc_max ? lo + 1 : lo;
        iq_unit *u = &out->u[j * k->sub / 8], alt[4];
        float err = sub_fit_at(k, g, x + j * k->sub, quant_iq_step(kind, d, lo), FLT_MAX, u);
        out->sc[j] = (uint8_t)lo;
        if (hi != lo &&
            sub_fit_at(k, g, x + j * k->sub, quant_iq_step(kind, d, hi), err, alt) < err) {
            memcpy(u, alt, (size_t)(k->sub / 8) * sizeof(*u));
            out->sc[j] = (uint8_t)hi;
        }
    }
}
