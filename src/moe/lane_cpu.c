/* The CPU lane: computes routed expert slots with the CPU kernels.
 *
 * Slots are taken in runs of one expert (a run is every token of that expert
 * in expert-major lists, a single slot in token-major ones). Three steps, the
 * first two spread over the pool as (run, projection, row chunk) items so
 * eight experts of one decode token keep every core busy:
 *   1. G = gate·x, U = up·x     for each run's tokens (activations quantized once per token)
 *   2. H = act(G, U) quantized; O = down·H
 *   3. y[token] += weight · O[slot]
 * Weights are read once per run: once per batch for prompts. */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "moe/moe.h"

#define LANE_ROW_CHUNK 32 /* rows per work item */

typedef struct lane_run {
    int64_t s0, s1; /* slots [s0, s1) of one expert, relative to the lane's first slot */
    int32_t expert;
} lane_run;

typedef struct lane_item {
    int32_t run;
    int32_t proj; /* 0 gate, 1 up, 2 down */
    int64_t r0, r1;
} lane_item;

struct tm_moe_cpu_lane {
    /* scratch, grown on demand and kept between steps */
    lane_run *runs;
    lane_item *items;
    uint8_t *xq_gate, *xq_up; /* gathered activation rows per slot */
    uint8_t *hq;              /* quantized H rows per slot */
    float *g, *u, *o, *xf;    /* G, U [slots][n_ff]; O [slots][n_embd]; gathered f32 x (precise) */
    size_t cap_runs, cap_items, cap_xq_gate, cap_xq_up, cap_hq, cap_g, cap_u, cap_o, cap_xf;
};

tm_status moe_cpu_lane_create(tm_moe_cpu_lane **out) {
    *out = calloc(1, sizeof(**out));
    return *out ? TM_OK : tm_error_set(TM_ERR_NOMEM, "cpu lane: out of memory");
}

void moe_cpu_lane_free(tm_moe_cpu_lane *l) {
    if (!l) return;
    free(l->runs), free(l->items), free(l->xq_gate), free(l->xq_up), free(l->hq);
    free(l->g), free(l->u), free(l->o), free(l->xf);
    free(l);
}

static int lane_grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    void *q = realloc(*p, need);
    if (!q) return 0;
    *p = q, *cap = need;
    return 1;
}

typedef struct lane_job {
    const tm_moe_experts *ex;
    tm_moe_cpu_lane *l;
    const uint8_t *xq_up; /* the gate's rows when both projections share an activation type */
    size_t xq_gate_bytes, xq_up_bytes, hq_bytes; /* bytes per quantized row */
} lane_job;

static void lane_item_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_job *j = ctx;
    const tm_moe_experts *ex = j->ex;
    tm_moe_cpu_lane *l = j->l;
    for (int64_t i = begin; i < end; i++) {
        const lane_item *it = &l->items[i];
        const lane_run *run = &l->runs[it->run];
        const int64_t n = run->s1 - run->s0;
        const tm_moe_matrix *m = it->proj == 0 ? &ex->gate : it->proj == 1 ? &ex->up : &ex->down;
        const uint8_t *w = m->data + (size_t)run->expert * m->expert_stride;
        if (it->proj == 0)
            cpu_gemm(m->type, ex->n_embd, w, m->row_bytes, it->r0, it->r1,
                     l->xq_gate + run->s0 * j->xq_gate_bytes, j->xq_gate_bytes, n,
                     l->g + run->s0 * ex->n_ff, ex->n_ff);
        else if (it->proj == 1)
            cpu_gemm(m->type, ex->n_embd, w, m->row_bytes, it->r0, it->r1,
                     j->xq_up + run->s0 * j->xq_up_bytes, j->xq_up_bytes, n,
                     l->u + run->s0 * ex->n_ff, ex->n_ff);
        else
            cpu_gemm(m->type, ex->n_ff, w, m->row_bytes, it->r0, it->r1,
                     l->hq + run->s0 * j->hq_bytes, j->hq_bytes, n, l->o + run->s0 * ex->n_embd,
                     ex->n_embd);
    }
    (void)ith;
}

/* Items for projections [p0, p1] of every run. */
static int64_t lane_items_build(tm_moe_cpu_lane *l, int64_t n_runs, int p0, int p1, int64_t rows_gu,
                                int64_t rows_down) {
    int64_t n = 0;
    for (int64_t r = 0; r < n_runs; r++)
        for (int p = p0; p <= p1; p++) {
            const int64_t rows = p == 2 ? rows_down : rows_gu;
            for (int64_t r0 = 0; r0 < rows; r0 += LANE_ROW_CHUNK)
                l->items[n++] = (lane_item){(int32_t)r, p, r0, r0 + LANE_ROW_CHUNK < rows ? r0 + LANE_ROW_CHUNK : rows};
        }
    return n;
}

typedef struct lane_act_job {
    const tm_moe_experts *ex;
    tm_moe_cpu_lane *l;
    const tm_moe_slot *slots;
    const float *x;
    size_t xq_gate_bytes, xq_up_bytes, hq_bytes;
    int same_act; /* gate and up share activation rows */
} lane_act_job;

static void lane_gather_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_act_job *j = ctx;
    const int64_t E = j->ex->n_embd;
    for (int64_t s = begin; s < end; s++) {
        const float *x = j->x + (int64_t)j->slots[s].token * E;
        cpu_act_quantize(j->ex->gate.type, x, j->l->xq_gate + s * j->xq_gate_bytes, E);
        if (!j->same_act) cpu_act_quantize(j->ex->up.type, x, j->l->xq_up + s * j->xq_up_bytes, E);
    }
    (void)ith;
}

static void lane_swiglu_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_act_job *j = ctx;
    const int64_t F = j->ex->n_ff;
    tm_moe_cpu_lane *l = j->l;
    for (int64_t s = begin; s < end; s++) {
        float *g = l->g + s * F;
        cpu_swiglu(g, g, l->u + s * F, F);
        cpu_act_quantize(j->ex->down.type, g, l->hq + s * j->hq_bytes, F);
    }
    (void)ith;
}

/* Precise reference path: each run's products in double from dequantized rows. */
static tm_status lane_run_precise(tm_moe_cpu_lane *l, tm_pool *pool, const tm_moe_experts *ex,
                                  const tm_moe_slot *slots, int64_t n_runs, const float *x) {
    const int64_t E = ex->n_embd, F = ex->n_ff;
    for (int64_t r = 0; r < n_runs; r++) {
        const lane_run *run = &l->runs[r];
        const int64_t n = run->s1 - run->s0;
        for (int64_t s = run->s0; s < run->s1; s++)
            memcpy(l->xf + (s - run->s0) * E, x + (int64_t)slots[s].token * E, (size_t)E * sizeof(float));
        tm_status st;
        const size_t e = (size_t)run->expert;
        if ((st = cpu_matmul_precise(pool, ex->gate.type, E, F, ex->gate.data + e * ex->gate.expert_stride,
                                     ex->gate.row_bytes, l->xf, n, l->g + run->s0 * F)) ||
            (st = cpu_matmul_precise(pool, ex->up.type, E, F, ex->up.data + e * ex->up.expert_stride,
                                     ex->up.row_bytes, l->xf, n, l->u + run->s0 * F)))
            return st;
        for (int64_t s = run->s0; s < run->s1; s++) cpu_swiglu(l->g + s * F, l->g + s * F, l->u + s * F, F);
        if ((st = cpu_matmul_precise(pool, ex->down.type, F, E, ex->down.data + e * ex->down.expert_stride,
                                     ex->down.row_bytes, l->g + run->s0 * F, n, l->o + run->s0 * E)))
            return st;
    }
    return TM_OK;
}

tm_status moe_cpu_lane_run(tm_moe_cpu_lane *l, tm_pool *pool, const tm_moe_experts *ex,
                           const tm_moe_worklist *wl, int64_t s0, int64_t s1, const float *x,
                           float *y, bool precise) {
    const int64_t n = s1 - s0, E = ex->n_embd, F = ex->n_ff;
    if (n <= 0) return TM_OK;
    const tm_moe_slot *slots = wl->slots + s0;

    /* runs of equal experts */
    if (!lane_grow((void **)&l->runs, &l->cap_runs, (size_t)n * sizeof(lane_run)))
        return tm_error_set(TM_ERR_NOMEM, "cpu lane: out of memory");
    int64_t n_runs = 0;
    for (int64_t s = 0; s < n; s++) {
        if (n_runs && l->runs[n_runs - 1].expert == slots[s].expert && wl->expert_major) {
            l->runs[n_runs - 1].s1 = s + 1;
            continue;
        }
        l->runs[n_runs++] = (lane_run){s, s + 1, slots[s].expert};
    }

    lane_act_job aj = {
        .ex = ex, .l = l, .slots = slots, .x = x,
        .xq_gate_bytes = cpu_act_row_size(ex->gate.type, E),
        .xq_up_bytes = cpu_act_row_size(ex->up.type, E),
        .hq_bytes = cpu_act_row_size(ex->down.type, F),
        .same_act = cpu_act_type(ex->gate.type) == cpu_act_type(ex->up.type),
    };
    const int64_t items_max = n_runs * (2 * ((F + LANE_ROW_CHUNK - 1) / LANE_ROW_CHUNK) +
                                        (E + LANE_ROW_CHUNK - 1) / LANE_ROW_CHUNK);
    if (!lane_grow((void **)&l->g, &l->cap_g, (size_t)(n * F) * sizeof(float)) ||
        !lane_grow((void **)&l->u, &l->cap_u, (size_t)(n * F) * sizeof(float)) ||
        !lane_grow((void **)&l->o, &l->cap_o, (size_t)(n * E) * sizeof(float)) ||
        !lane_grow((void **)&l->items, &l->cap_items, (size_t)items_max * sizeof(lane_item)) ||
        !lane_grow((void **)&l->xq_gate, &l->cap_xq_gate, (size_t)n * aj.xq_gate_bytes) ||
        !lane_grow((void **)&l->xq_up, &l->cap_xq_up, (size_t)n * aj.xq_up_bytes) ||
        !lane_grow((void **)&l->hq, &l->cap_hq, (size_t)n * aj.hq_bytes) ||
        (precise && !lane_grow((void **)&l->xf, &l->cap_xf, (size_t)(n * E) * sizeof(float))))
        return tm_error_set(TM_ERR_NOMEM, "cpu lane: out of memory for %lld slots", (long long)n);
    if (precise) {
        tm_status st = lane_run_precise(l, pool, ex, slots, n_runs, x);
        if (st != TM_OK) return st;
    } else {
        lane_job j = {ex, l, aj.same_act ? l->xq_gate : l->xq_up,
                      aj.xq_gate_bytes, aj.same_act ? aj.xq_gate_bytes : aj.xq_up_bytes, aj.hq_bytes};
        cpu_pool_for(pool, n, 8, lane_gather_task, &aj);
        int64_t ni = lane_items_build(l, n_runs, 0, 1, F, E);
        cpu_pool_for(pool, ni, 1, lane_item_task, &j);
        cpu_pool_for(pool, n, 8, lane_swiglu_task, &aj);
        ni = lane_items_build(l, n_runs, 2, 2, F, E);
        cpu_pool_for(pool, ni, 1, lane_item_task, &j);
    }

    /* merge into y; slots of one token may sit anywhere, so this stays serial per slot */
    for (int64_t s = 0; s < n; s++)
        cpu_axpy(y + (int64_t)slots[s].token * E, slots[s].weight, l->o + s * E, E);
    return TM_OK;
}
