/* Nearest-grid-point search of the i-quant quantizers (see quant_iq_search.h). */
#include "quant/quant_iq_search.h"

#include <float.h>
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

typedef struct search_state {
    const iq_grid *g;
    const float *c, *f;
    int L, half, want;
    float rest[IQ_MAX_DIMS / 2 + 1]; /* least cost of coordinates depth.. and the second half */
    float flip_lb;                   /* least flip anywhere (0 without flips) */
    int near[IQ_MAX_DIMS / 2];       /* cheapest level of each first-half coordinate */
    const float *pa, *pb, *fa, *fb;  /* second-half pair tables */
    float best[2];                   /* no flip, one flip */
    int best_k[2];
} search_state;

/* A node's children are cut once its cost reaches this. */
static inline float search_bar(const search_state *st) {
    const float e = st->best[0], o = st->best[1] - st->flip_lb;
    return st->want == IQ_WANT_PLAIN ? e : st->want == IQ_WANT_FLIP ? o : (e > o ? e : o);
}

static void search_leaf(search_state *st, int combo, float partial, float fmin) {
    const iq_grid *g = st->g;
    const float *pa = st->pa, *pb = st->pb;
    const int k0 = g->start[combo], k1 = g->start[combo + 1];
    float best = st->best[0];
    int best_k = st->best_k[0];
    if (st->want == IQ_WANT_PLAIN) { /* the common case, kept in registers */
        for (int k = k0; k < k1; k++) {
            const float v = partial + pa[g->ha[k]] + pb[g->hb[k]];
            if (v < best) {
                best = v;
                best_k = k;
            }
        }
        st->best[0] = best;
        st->best_k[0] = best_k;
        return;
    }
    const float *fa = st->fa, *fb = st->fb;
    float best_f = st->best[1];
    int best_fk = st->best_k[1];
    for (int k = k0; k < k1; k++) {
        const int a = g->ha[k], b = g->hb[k];
        const float v = partial + pa[a] + pb[b], w = v + minf(fmin, minf(fa[a], fb[b]));
        if (v < best) {
            best = v;
            best_k = k;
        }
        if (w < best_f) {
            best_f = w;
            best_fk = k;
        }
    }
    if (st->want & IQ_WANT_PLAIN) {
        st->best[0] = best;
        st->best_k[0] = best_k;
    }
    st->best[1] = best_f;
    st->best_k[1] = best_fk;
}

static void search_node(search_state *st, int depth, int combo, int mul, float partial, float fmin);

/* Level l of coordinate `depth`; 0 when it is cut (and so is every level further out). */
static inline int search_child(search_state *st, int depth, int combo, int mul, float partial,
                               float fmin, int l) {
    const float v = partial + st->c[depth * st->L + l];
    if (!(v + st->rest[depth + 1] < search_bar(st))) return 0;
    search_node(st, depth + 1, combo + l * mul, mul * st->L, v,
                st->f ? minf(fmin, st->f[depth * st->L + l]) : 0.0f);
    return 1;
}

static void search_node(search_state *st, int depth, int combo, int mul, float partial,
                        float fmin) {
    if (depth >= st->half || depth >= IQ_MAX_DIMS / 2) {
        search_leaf(st, combo, partial, fmin);
        return;
    }
    /* a coordinate's cost (x - step * level)^2 grows on both sides of its cheapest level, so
     * each side is walked outwards until a level is cut */
    const int m = st->near[depth];
    for (int l = m; l < st->L; l++)
        if (!search_child(st, depth, combo, mul, partial, fmin, l)) break;
    for (int l = m - 1; l >= 0; l--)
        if (!search_child(st, depth, combo, mul, partial, fmin, l)) break;
}

void quant_iq_grid_search(const iq_grid *g, const float *c, const float *f, int want, float bound,
                          iq_search_result *r) {
    search_state st;
    const int L = g->levels, half = g->dims / 2;
    float pa[IQ_MAX_LEVELS * IQ_MAX_LEVELS], pb[IQ_MAX_LEVELS * IQ_MAX_LEVELS];
    float fa[IQ_MAX_LEVELS * IQ_MAX_LEVELS], fb[IQ_MAX_LEVELS * IQ_MAX_LEVELS];
    st.g = g;
    st.c = c;
    st.f = f;
    st.L = L;
    st.half = half;
    st.want = f ? want : IQ_WANT_PLAIN;
    st.best[0] = st.best[1] = bound;
    st.best_k[0] = st.best_k[1] = -1;
    st.flip_lb = 0;
    float minc[IQ_MAX_DIMS];
    for (int i = 0; i < g->dims; i++) {
        int m = 0;
        for (int l = 1; l < L; l++)
            if (c[i * L + l] < c[i * L + m]) m = l;
        minc[i] = c[i * L + m];
        if (i < half) st.near[i] = m;
    }
    st.rest[half] = 0;
    for (int i = half; i < g->dims; i++) st.rest[half] += minc[i];
    for (int i = half - 1; i >= 0; i--) st.rest[i] = st.rest[i + 1] + minc[i];
    if (f) {
        st.flip_lb = FLT_MAX;
        for (int i = 0; i < g->dims * L; i++) st.flip_lb = minf(st.flip_lb, f[i]);
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
        st.pa = pa;
        st.pb = pb;
        st.fa = fa;
        st.fb = fb;
    } else { /* dims 4: the second half is two coordinates */
        st.pa = c + 2 * L;
        st.pb = c + 3 * L;
        st.fa = f ? f + 2 * L : NULL;
        st.fb = f ? f + 3 * L : NULL;
    }
    search_node(&st, 0, 0, 1, 0.0f, FLT_MAX);
    for (int w = 0; w < 2; w++) { /* none below the bound: index 0 at cost `bound` */
        r->cost[w] = st.best[w];
        r->index[w] = st.best_k[w] < 0 ? 0 : g->index[st.best_k[w]];
    }
}
