/* Exact nearest-grid-point search for the i-quant quantizers (quant_iq_*.c only).
 *
 * A grid point has D = 8 (or 4) coordinates, each one of L = 3 (or 8) levels,
 * and its cost is a sum of per-coordinate costs c[i][level] (the squared error
 * of each value at the current step). The search is a branch and bound over
 * the levels of the first D/2 coordinates, cheapest level first: a node is cut
 * when its partial cost plus the least possible cost of the remaining
 * coordinates reaches the best point found so far. The grid is indexed by the
 * level combination of its first half, so a leaf scans only the points that
 * share it, pricing their second half with two lookups in tables of pairs.
 * Exact, and it touches a few dozen nodes where brute force prices every point.
 *
 * Sign parity (iq2_xxs, iq2_xs, iq3_xxs): when a group must store one sign
 * against its value, the point costs min over coordinates j of cost +
 * f[j][level_j] (f >= 0: the extra error of value j with the wrong sign).
 * Flipping three is never cheaper than the cheapest single flip, so the search
 * adds the least flip over the point's coordinates. */
#ifndef TM_QUANT_QUANT_IQ_SEARCH_H
#define TM_QUANT_QUANT_IQ_SEARCH_H

#include <stdint.h>

#define IQ_MAX_DIMS   8
#define IQ_MAX_LEVELS 8
#define IQ_MAX_COMBO  81
#define IQ_MAX_GRID   2048

typedef struct iq_grid {
    int dims, levels, size;
    float level[IQ_MAX_LEVELS];               /* the level values (grid bytes), ascending */
    uint16_t start[IQ_MAX_COMBO + 1];         /* entries of first-half combination c */
    uint8_t ha[IQ_MAX_GRID], hb[IQ_MAX_GRID]; /* second half of each entry: two pair codes */
    uint16_t index[IQ_MAX_GRID];              /* grid index of each entry */
    uint8_t lev[IQ_MAX_GRID][IQ_MAX_DIMS];    /* level of each coordinate, by grid index */
} iq_grid;

typedef enum iq_grid_id {
    IQ_GRID_2XXS,
    IQ_GRID_2XS,
    IQ_GRID_2S,
    IQ_GRID_3XXS,
    IQ_GRID_3S,
    IQ_GRID_1S,
    IQ_GRID_COUNT,
} iq_grid_id;

/* The search tables of a grid (built once, thread-safe). */
const iq_grid *quant_iq_grid_get(iq_grid_id id);

/* What a search finds: the best point with signs as given, with exactly one flipped, or both. */
enum { IQ_WANT_PLAIN = 1, IQ_WANT_FLIP = 2, IQ_WANT_BOTH = 3 };

typedef struct iq_search_result {
    int index[2]; /* grid index: [0] signs as given, [1] one sign flipped */
    float cost[2];
} iq_search_result;

/* Least-cost grid points for per-coordinate costs c[i * levels + l]; f (same layout,
 * NULL when no flip is wanted) prices each value stored with the wrong sign. Only
 * points cheaper than `bound` count (FLT_MAX: any); where none is, the result is
 * index 0 at cost `bound`. */
void quant_iq_grid_search(const iq_grid *g, const float *c, const float *f, int want, float bound,
                          iq_search_result *r);

#endif
