/* Nearest-grid-point search of the i-quant quantizers (see quant_iq_search.h). */
#include "quant/quant_iq_search.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "quant/quant_grids.h"

static iq_grid g_grids[IQ_GRID_COUNT];
static pthread_once_t g_grids_once = PTHREAD_ONCE_INIT;

/* Coordinate k of grid entry i, as the byte the format stores. */
static int grid_byte(iq_grid_id id, int i, int k) {
    switch (id) {
    case IQ_GRID_2XXS:
        return (int)((quant_grid_iq2_xxs[i] >> (8 * k)) & 0xff);
    case IQ_GRID_2XS:
        return (int)((quant_grid_iq2_xs[i] >> (8 * k)) & 0xff);
    case IQ_GRID_2S:
        return (int)((quant_grid_iq2_s[i] >> (8 * k)) & 0xff);
    case IQ_GRID_3XXS:
        return (int)((quant_grid_iq3_xxs[i] >> (8 * k)) & 0xff);
    case IQ_GRID_3S:
        return (int)((quant_grid_iq3_s[i] >> (8 * k)) & 0xff);
    case IQ_GRID_1S:
        return (int8_t)((quant_grid_iq1_s[i] >> (8 * k)) & 0xff);
    default:
        return 0;
    }
}

static void grid_build(iq_grid *g, iq_grid_id id, int size, int dims, int levels,
                       const float *level) {
    memset(g, 0, sizeof(*g));
    g->dims = dims;
    g->levels = levels;
    g->size = size;
    memcpy(g->level, level, (size_t)levels * sizeof(float));
    const int half = dims / 2, pair = dims == 8 ? levels : 1; /* dims 4: a "pair" is one level */
    uint8_t lo[IQ_MAX_GRID];
    for (int i = 0; i < size; i++) {
        for (int k = 0; k < dims; k++) {
            int b = grid_byte(id, i, k), l = 0;
            while (l < levels - 1 && (float)b != level[l]) l++; /* the grids hold only these */
            g->lev[i][k] = (uint8_t)l;
        }
        int c = 0;
        for (int k = half - 1; k >= 0; k--) c = c * levels + g->lev[i][k];
        lo[i] = (uint8_t)c;
    }
    /* counting sort of the entries by their first half */
    uint16_t count[IQ_MAX_COMBO + 1] = {0};
    int ncombo = 1;
    for (int k = 0; k < half; k++) ncombo *= levels;
    for (int i = 0; i < size; i++) count[lo[i] + 1]++;
    for (int c = 0; c < ncombo; c++) g->start[c + 1] = (uint16_t)(g->start[c] + count[c + 1]);
    uint16_t fill[IQ_MAX_COMBO];
    memcpy(fill, g->start, sizeof(fill));
    for (int i = 0; i < size; i++) {
        const int k = fill[lo[i]]++;
        const uint8_t *l = g->lev[i] + half;
        g->ha[k] = (uint8_t)(dims == 8 ? l[0] + pair * l[1] : l[0]);
        g->hb[k] = (uint8_t)(dims == 8 ? l[2] + pair * l[3] : l[1]);
        g->index[k] = (uint16_t)i;
    }
}

static void grids_init(void) {
    static const float l2[3] = {8, 25, 43};
    static const float l3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62};
    static const float l3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};
    static const float l1[3] = {-1, 0, 1};
    grid_build(&g_grids[IQ_GRID_2XXS], IQ_GRID_2XXS, 256, 8, 3, l2);
    grid_build(&g_grids[IQ_GRID_2XS], IQ_GRID_2XS, 512, 8, 3, l2);
    grid_build(&g_grids[IQ_GRID_2S], IQ_GRID_2S, 1024, 8, 3, l2);
    grid_build(&g_grids[IQ_GRID_3XXS], IQ_GRID_3XXS, 256, 4, 8, l3xxs);
    grid_build(&g_grids[IQ_GRID_3S], IQ_GRID_3S, 512, 4, 8, l3s);
    grid_build(&g_grids[IQ_GRID_1S], IQ_GRID_1S, 2048, 8, 3, l1);
}

const iq_grid *quant_iq_grid_get(iq_grid_id id) {
    pthread_once(&g_grids_once, grids_init);
    return &g_grids[id];
}

static inline float minf(float a, float b) {
    return a < b ? a : b;
}

/* What one search works with: the group's costs and the tables built from them. */
typedef struct search_tables {
    const iq_grid *g;
    const float *c, *f;              /* per-coordinate costs and flip extras (or NULL) */
    const float *pa, *pb, *fa, *fb;  /* second-half pair tables */
    float rest[IQ_MAX_DIMS / 2 + 1]; /* least cost of coordinates depth.. and the second half */
    float flip_lb;                   /* least flip anywhere (0 without flips) */
    uint8_t ord[IQ_MAX_DIMS / 2][IQ_MAX_LEVELS]; /* first-half levels, cheapest first */
} search_tables;

#define IQ_ALWAYS_INLINE inline __attribute__((always_inline))

/* A node is cut once its least possible cost reaches this (want is a constant at each
 * call site, so this folds to one comparison). */
static IQ_ALWAYS_INLINE float search_bar(int want, const float *best, float flip_lb) {
    const float o = best[1] - flip_lb;
    return want == IQ_WANT_PLAIN ? best[0] : want == IQ_WANT_FLIP ? o : best[0] > o ? best[0] : o;
}

/* The grid points whose first half is `combo`, at first-half cost `partial` (fmin: the
 * least flip among those coordinates). */
static IQ_ALWAYS_INLINE void search_leaf(const search_tables *t, int want, int combo, float partial,
                                         float fmin, float *best, int *best_k) {
    const iq_grid *g = t->g;
    const int k1 = g->start[combo + 1];
    for (int k = g->start[combo]; k < k1; k++) {
        const int a = g->ha[k], b = g->hb[k];
        const float v = partial + t->pa[a] + t->pb[b];
        if ((want & IQ_WANT_PLAIN) && v < best[0]) {
            best[0] = v;
            best_k[0] = k;
        }
        if (want & IQ_WANT_FLIP) {
            const float w = v + minf(fmin, minf(t->fa[a], t->fb[b]));
            if (w < best[1]) {
                best[1] = w;
                best_k[1] = k;
            }
        }
    }
}

/* Branch and bound over the first half's levels, cheapest first: once a level is cut,
 * every later one is too. 8-value grids: 4 coordinates of 3 levels. */
static IQ_ALWAYS_INLINE void search_dfs8(const search_tables *t, int want, float *best,
                                         int *best_k) {
    const float *c = t->c, *f = t->f;
    for (int j0 = 0; j0 < 3; j0++) {
        const int l0 = t->ord[0][j0];
        const float v0 = c[l0];
        if (!(v0 + t->rest[1] < search_bar(want, best, t->flip_lb))) break;
        const float f0 = want & IQ_WANT_FLIP ? f[l0] : 0.0f;
        for (int j1 = 0; j1 < 3; j1++) {
            const int l1 = t->ord[1][j1];
            const float v1 = v0 + c[3 + l1];
            if (!(v1 + t->rest[2] < search_bar(want, best, t->flip_lb))) break;
            const float f1 = want & IQ_WANT_FLIP ? minf(f0, f[3 + l1]) : 0.0f;
            for (int j2 = 0; j2 < 3; j2++) {
                const int l2 = t->ord[2][j2];
                const float v2 = v1 + c[6 + l2];
                if (!(v2 + t->rest[3] < search_bar(want, best, t->flip_lb))) break;
                const float f2 = want & IQ_WANT_FLIP ? minf(f1, f[6 + l2]) : 0.0f;
                for (int j3 = 0; j3 < 3; j3++) {
                    const int l3 = t->ord[3][j3];
                    const float v3 = v2 + c[9 + l3];
                    if (!(v3 + t->rest[4] < search_bar(want, best, t->flip_lb))) break;
                    const float f3 = want & IQ_WANT_FLIP ? minf(f2, f[9 + l3]) : 0.0f;
                    search_leaf(t, want, l0 + 3 * l1 + 9 * l2 + 27 * l3, v3, f3, best, best_k);
                }
            }
        }
    }
}

/* 4-value grids: 2 coordinates of 8 levels. */
static IQ_ALWAYS_INLINE void search_dfs4(const search_tables *t, int want, float *best,
                                         int *best_k) {
    const float *c = t->c, *f = t->f;
    for (int j0 = 0; j0 < 8; j0++) {
        const int l0 = t->ord[0][j0];
        const float v0 = c[l0];
        if (!(v0 + t->rest[1] < search_bar(want, best, t->flip_lb))) break;
        const float f0 = want & IQ_WANT_FLIP ? f[l0] : 0.0f;
        for (int j1 = 0; j1 < 8; j1++) {
            const int l1 = t->ord[1][j1];
            const float v1 = v0 + c[8 + l1];
            if (!(v1 + t->rest[2] < search_bar(want, best, t->flip_lb))) break;
            const float f1 = want & IQ_WANT_FLIP ? minf(f0, f[8 + l1]) : 0.0f;
            search_leaf(t, want, l0 + 8 * l1, v1, f1, best, best_k);
        }
    }
}

void quant_iq_grid_search(const iq_grid *g, const float *c, const float *f, int want, float bound,
                          iq_search_result *r) {
    search_tables t;
    const int L = g->levels, half = g->dims / 2;
    float pa[IQ_MAX_LEVELS * IQ_MAX_LEVELS], pb[IQ_MAX_LEVELS * IQ_MAX_LEVELS];
    float fa[IQ_MAX_LEVELS * IQ_MAX_LEVELS], fb[IQ_MAX_LEVELS * IQ_MAX_LEVELS];
    t.g = g;
    t.c = c;
    t.f = f;
    if (!f) want = IQ_WANT_PLAIN;
    float best[2] = {bound, bound};
    int best_k[2] = {-1, -1};
    t.flip_lb = 0;
    float minc[IQ_MAX_DIMS];
    for (int i = 0; i < g->dims; i++) {
        const float *ci = c + i * L;
        int m = 0;
        for (int l = 1; l < L; l++)
            if (ci[l] < ci[m]) m = l;
        minc[i] = ci[m];
        if (i < half) {
            /* (x - step * level)^2 grows on both sides of its cheapest level: merge the sides */
            uint8_t *o = t.ord[i];
            int lo = m - 1, hi = m + 1;
            o[0] = (uint8_t)m;
            for (int j = 1; j < L; j++)
                o[j] = (uint8_t)(hi < L && (lo < 0 || ci[hi] <= ci[lo]) ? hi++ : lo--);
        }
    }
    t.rest[half] = 0;
    for (int i = half; i < g->dims; i++) t.rest[half] += minc[i];
    for (int i = half - 1; i >= 0; i--) t.rest[i] = t.rest[i + 1] + minc[i];
    if (f) {
        t.flip_lb = FLT_MAX;
        for (int i = 0; i < g->dims * L; i++) t.flip_lb = minf(t.flip_lb, f[i]);
    }
    if (g->dims == 8) { /* the second half as two pairs of coordinates */
        for (int l1 = 0; l1 < L; l1++)
            for (int l0 = 0; l0 < L; l0++) {
                const int q = l0 + L * l1;
                pa[q] = c[4 * L + l0] + c[5 * L + l1];
                pb[q] = c[6 * L + l0] + c[7 * L + l1];
                if (f) {
                    fa[q] = minf(f[4 * L + l0], f[5 * L + l1]);
                    fb[q] = minf(f[6 * L + l0], f[7 * L + l1]);
                }
            }
        t.pa = pa;
        t.pb = pb;
        t.fa = fa;
        t.fb = fb;
        if (want == IQ_WANT_PLAIN)
            search_dfs8(&t, IQ_WANT_PLAIN, best, best_k);
        else if (want == IQ_WANT_FLIP)
            search_dfs8(&t, IQ_WANT_FLIP, best, best_k);
        else
            search_dfs8(&t, IQ_WANT_BOTH, best, best_k);
    } else { /* dims 4: the second half is two coordinates */
        t.pa = c + 2 * L;
        t.pb = c + 3 * L;
        t.fa = f ? f + 2 * L : NULL;
        t.fb = f ? f + 3 * L : NULL;
        if (want == IQ_WANT_PLAIN)
            search_dfs4(&t, IQ_WANT_PLAIN, best, best_k);
        else if (want == IQ_WANT_FLIP)
            search_dfs4(&t, IQ_WANT_FLIP, best, best_k);
        else
            search_dfs4(&t, IQ_WANT_BOTH, best, best_k);
    }
    for (int w = 0; w < 2; w++) { /* none below the bound: index 0 at cost `bound` */
        r->cost[w] = best[w];
        r->index[w] = best_k[w] < 0 ? 0 : g->index[best_k[w]];
    }
}
