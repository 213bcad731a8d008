/* The CPU lane: computes routed expert slots with the CPU kernels.
 *
 * Slots are taken in runs of one expert (a run is every token of that expert
 * in expert-major lists, a single slot in token-major ones). Three steps, the
 * products spread over the pool as (run, projection, row chunk) items so
 * eight experts of one decode token keep every core busy:
 *   1. G = gate·x, U = up·x     for each run's tokens (activations quantized once per
 *      token, then copied next to the other tokens of each run)
 *   2. H = act(G, U) quantized; O = down·H
 *      (H is made in pieces of 256 values by whichever thread finishes the
 *      last gate/up item of a piece, so no barrier waits between G, U and H;
 *      then the down items follow the gate/up items in the same pool step and
 *      each waits only for its own run's H: items are claimed in order, so
 *      every gate/up item was claimed, by a thread that never waits, before
 *      any down item, and the wait is almost always already over; with few
 *      runs, as in decode, a claimed down item is a ticket for any run whose
 *      H is made, so a slow run holds up only its own down items)
 *   3. y[token] += Σ weight · O[slot]   over the token's slots in worklist order
 * All of it is one pool job (cpu_pool_for_steps) with barriers between the
 * parts, so a decode layer wakes the pool once. Weights are read once per
 * run: once per batch for prompts. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/timing.h"
#include "cpu/cpu_ops.h"
#include "moe/moe.h"

/* Rows per work item: 128, doubled up to 256 while an item reads under 32 KB of
 * weights (short down rows); 256 for runs of 16 tokens or more, since a
 * prompt-sized call prepares its run's activations once (the AMX kernels'
 * tile layouts) and then sweeps its rows. Decode items of 64 q4_K rows (72
 * KB) beat 32 and 16 (fewer claims of the shared counter): device tg128
 * expert step 1773-1809 ms vs 1873-2068 (32) and 1990 (16). Longer items
 * stream longer (a thread's next item starts cold): CPU only, 30b-a3b, tg64,
 * two rounds on the H200 machine's 16 cores, 8 / 16 threads: 64 rows 23.7,
 * 25.5 / 37.5, 38.2 t/s; 128 rows 26.5, 24.5 / 40.8, 39.3; 256 rows 26.3, 26.8 /
 * 39.0, 38.0. TIERMOE_LANE_ROWS sets it, for tuning. */
#define LANE_ROW_CHUNK     128
#define LANE_ROW_CHUNK_MAX 256
#define LANE_ITEM_BYTES    (32 << 10)
#define LANE_H_PIECE       256 /* H values activated and quantized together: whole q8_K/q8_0 blocks */
#define LANE_TICKET_RUNS   16 /* down items go by ticket up to this many runs (decode) */

typedef struct lane_run {
    int64_t s0, s1; /* slots [s0, s1) of one expert, relative to the lane's first slot */
    int32_t expert;
} lane_run;

typedef struct lane_item {
    int32_t run;
    int32_t proj; /* 0 gate, 1 up, 2 down */
    int64_t r0, r1;
} lane_item;

enum { LANE_GATE, LANE_UP, LANE_DOWN, LANE_PROJ };

/* One thread's part times, a cache line (or more) of its own. */
typedef struct lane_clock {
    _Alignas(64) uint64_t ns[TM_LANE_PART_COUNT];
} lane_clock;

struct tm_moe_cpu_lane {
    /* scratch, grown on demand and kept between steps */
    lane_run *runs;
    lane_item *items;
    int64_t *tok_first; /* [n_tok + 1]: the slots of token t are tok_slots[tok_first[t] ..
                           tok_first[t + 1]) */
    int64_t *tok_slots;
    uint8_t *xq_tok[2]; /* activation rows per token, for gate and up (up unused when they share a
                           type) */
    uint8_t *
        xq[LANE_PROJ]; /* product inputs per slot: gathered x rows (gate, up), quantized H (down) */
    float *out[LANE_PROJ]; /* G, U [slots][n_ff]; O [slots][n_embd] */
    float *xf;             /* gathered f32 x (precise path) */
    atomic_int *pending;   /* per (run, H piece): gate/up items not yet done */
    atomic_int *ready;     /* per run: H pieces made */
    int64_t *down_first;   /* ticket mode, per run + 1: its first down item */
    atomic_int *down_next; /* ticket mode, per run: down items taken */
    size_t cap_pending, cap_ready, cap_down_first, cap_down_next, cap_runs, cap_items,
        cap_tok_first, cap_tok_slots, cap_xq_tok[2], cap_xq[LANE_PROJ], cap_out[LANE_PROJ], cap_xf;
    tm_moe_lane_stats *acc; /* profiling: where runs add their time */
    lane_clock *clocks;     /* profiling: per pool thread */
    int n_clocks;
};

const char *const tm_moe_lane_part_names[TM_LANE_PART_COUNT] = {
    "prep", "gate+up", "act", "wait", "down", "combine",
};

tm_status moe_cpu_lane_create(tm_moe_cpu_lane **out) {
    *out = calloc(1, sizeof(**out));
    return *out ? TM_OK : tm_error_set(TM_ERR_NOMEM, "cpu lane: out of memory");
}

void moe_cpu_lane_free(tm_moe_cpu_lane *l) {
    if (!l) return;
    free(l->runs), free(l->items), free(l->tok_first), free(l->tok_slots), free(l->xq_tok[0]),
        free(l->xq_tok[1]), free(l->xf);
    free(l->pending), free(l->ready), free(l->down_first), free(l->down_next), free(l->clocks);
    for (int p = 0; p < LANE_PROJ; p++) free(l->xq[p]), free(l->out[p]);
    free(l);
}

void moe_cpu_lane_profile(tm_moe_cpu_lane *l, tm_moe_lane_stats *acc) {
    l->acc = acc;
}

void moe_experts_act(const tm_moe_experts *ex, int32_t e, int64_t c0, int64_t c1, float *h,
                     float *g, float *u) {
    const int64_t n = c1 - c0, F = ex->n_ff;
    if (ex->gate_bias) cpu_axpy(g, 1.0f, ex->gate_bias + (int64_t)e * F + c0, n);
    if (ex->up_bias) cpu_axpy(u, 1.0f, ex->up_bias + (int64_t)e * F + c0, n);
    if (ex->act == TM_MOE_ACT_SWIGLU_OAI)
        cpu_swiglu_oai(h, g, u, n, ex->act_alpha, ex->act_limit);
    else if (ex->act == TM_MOE_ACT_GEGLU)
        cpu_geglu(h, g, u, n);
    else
        cpu_swiglu(h, g, u, n);
}

static int lane_grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    void *q = realloc(*p, need);
    if (!q) return 0;
    *p = q, *cap = need;
    return 1;
}

/* What every task of one lane step needs. */
typedef struct lane_step {
    const tm_moe_experts *ex;
    tm_moe_cpu_lane *l;
    const tm_moe_slot *slots;
    const float *x;
    float *y;
    const lane_item *items[2]; /* gate/up items, down items (right after them) */
    const tm_moe_matrix *m[LANE_PROJ];
    int64_t k[LANE_PROJ];       /* row length of each projection */
    int64_t rows[LANE_PROJ];    /* output rows of each projection */
    size_t xq_bytes[LANE_PROJ]; /* bytes of one quantized input row of each projection */
    int shared_act;             /* gate and up read the same activation rows */
    int64_t n_pieces; /* H pieces per slot when gate/up items make H; 0: a step of its own */
    int64_t n_runs;
    bool tickets;       /* a claimed down item stands for any untaken one (lane_down_pick) */
    lane_clock *clocks; /* per thread when profiling, else NULL */
} lane_step;

/* Profiling: adds the time since *t to thread ith's part and moves *t to now. */
static inline void lane_clock_add(const lane_step *st, int ith, tm_moe_lane_part part,
                                  uint64_t *t) {
    if (!st->clocks) return;
    const uint64_t now = tm_time_ns();
    st->clocks[ith].ns[part] += now - *t;
    *t = now;
}

static inline uint64_t lane_clock_now(const lane_step *st) {
    return st->clocks ? tm_time_ns() : 0;
}

/* H = act(G, U) for values [c0, c1) of slot s, quantized for the down product. */
static void lane_swiglu_piece(const lane_step *st, int64_t s, int64_t c0, int64_t c1) {
    const int64_t F = st->ex->n_ff;
    const tm_moe_cpu_lane *l = st->l;
    const tm_type t = st->m[LANE_DOWN]->type;
    float *g = l->out[LANE_GATE] + s * F + c0;
    moe_experts_act(st->ex, st->slots[s].expert, c0, c1, g, g, l->out[LANE_UP] + s * F + c0);
    cpu_act_quantize(t, g, l->xq[LANE_DOWN] + s * st->xq_bytes[LANE_DOWN] + cpu_act_row_size(t, c0),
                     c1 - c0);
}

/* Wait until every H piece of run r is made (down items in the gate/up step). */
static void lane_wait_ready(const lane_step *st, int32_t r) {
    for (unsigned i = 0;
         atomic_load_explicit(&st->l->ready[r], memory_order_acquire) != st->n_pieces; i++)
        if (i > 64) sched_yield(); /* the maker may share this core */
}

/* Ticket mode (few runs: decode): take an untaken down item of a run whose H
 * is made. A run whose gate/up items are still running (a slow or
 * descheduled thread) then holds up only its own down items, never a thread
 * that could work on another run's. There are as many tickets as down items,
 * so a ticket always finds one. */
static const lane_item *lane_down_pick(const lane_step *st) {
    const tm_moe_cpu_lane *l = st->l;
    for (unsigned spin = 0;; spin++) {
        for (int64_t r = 0; r < st->n_runs; r++) {
            const int64_t n = l->down_first[r + 1] - l->down_first[r];
            if (atomic_load_explicit(&l->down_next[r], memory_order_relaxed) >= n ||
                atomic_load_explicit(&l->ready[r], memory_order_acquire) != st->n_pieces)
                continue;
            const int64_t i = atomic_fetch_add_explicit(&l->down_next[r], 1, memory_order_relaxed);
            if (i < n) return &st->items[1][l->down_first[r] + i];
        }
        if (spin > 64) sched_yield(); /* the makers may share this core */
    }
}

static void lane_items_run(const lane_step *st, const lane_item *items, int64_t begin, int64_t end,
                           int ith) {
    const tm_moe_cpu_lane *l = st->l;
    uint64_t t = lane_clock_now(st);
    for (int64_t i = begin; i < end; i++) {
        const lane_item *it = &items[i];
        if (it->proj == LANE_DOWN && st->n_pieces) {
            if (st->tickets)
                it = lane_down_pick(st);
            else
                lane_wait_ready(st, it->run);
            lane_clock_add(st, ith, TM_LANE_WAIT, &t);
        }
        const lane_run *run = &l->runs[it->run];
        const int p = it->proj, in = p == LANE_UP && st->shared_act ? LANE_GATE : p;
        const tm_moe_matrix *m = st->m[p];
        cpu_gemm(m->type, st->k[p], moe_matrix_expert(m, run->expert), m->row_bytes, it->r0, it->r1,
                 l->xq[in] + run->s0 * st->xq_bytes[in], st->xq_bytes[in], run->s1 - run->s0,
                 l->out[p] + run->s0 * st->rows[p], st->rows[p]);
        lane_clock_add(st, ith, p == LANE_DOWN ? TM_LANE_DOWN : TM_LANE_GATE_UP, &t);
        if (!st->n_pieces || p == LANE_DOWN) continue;
        /* the last gate/up item of an H piece makes that piece for the run's slots */
        const int64_t c = it->r0 / LANE_H_PIECE;
        if (atomic_fetch_sub_explicit(&l->pending[it->run * st->n_pieces + c], 1,
                                      memory_order_acq_rel) == 1) {
            for (int64_t s = run->s0; s < run->s1; s++)
                lane_swiglu_piece(st, s, c * LANE_H_PIECE, (c + 1) * LANE_H_PIECE);
            atomic_fetch_add_explicit(&l->ready[it->run], 1, memory_order_release);
            lane_clock_add(st, ith, TM_LANE_ACT, &t);
        }
    }
}

static void lane_gate_up_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_step *st = ctx;
    lane_items_run(st, st->items[0], begin, end, ith);
}

static void lane_down_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_step *st = ctx;
    lane_items_run(st, st->items[1], begin, end, ith);
}

/* LANE_ROW_CHUNK, or TIERMOE_LANE_ROWS (16..256, a power of two) for tuning. */
static int64_t lane_row_chunk_base(void) {
    static _Atomic int64_t cached; /* 0: not read yet */
    int64_t c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!c) {
        const char *e = getenv("TIERMOE_LANE_ROWS");
        const long v = e ? strtol(e, NULL, 10) : 0;
        c = v >= 16 && v <= LANE_ROW_CHUNK_MAX && !(v & (v - 1)) ? v : LANE_ROW_CHUNK;
        atomic_store_explicit(&cached, c, memory_order_relaxed);
    }
    return c;
}

static int64_t lane_row_chunk(const lane_step *st, int p, const lane_run *run) {
    if (run->s1 - run->s0 >= 16) return LANE_ROW_CHUNK_MAX;
    int64_t c = lane_row_chunk_base();
    while (c < LANE_ROW_CHUNK_MAX && (size_t)c * st->m[p]->row_bytes < LANE_ITEM_BYTES) c *= 2;
    return c;
}

/* Items for projections [p0, p1] of every run, written at items. */
static int64_t lane_items_build(const lane_step *st, lane_item *items, int64_t n_runs, int p0,
                                int p1) {
    int64_t n = 0;
    for (int64_t r = 0; r < n_runs; r++)
        for (int p = p0; p <= p1; p++)
            for (int64_t r0 = 0, c = lane_row_chunk(st, p, &st->l->runs[r]); r0 < st->rows[p];
                 r0 += c)
                items[n++] =
                    (lane_item){(int32_t)r, p, r0, r0 + c < st->rows[p] ? r0 + c : st->rows[p]};
    return n;
}

/* Quantize each token's row once for gate (and up, when its type differs). */
static void lane_quantize_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_step *st = ctx;
    const int64_t E = st->ex->n_embd;
    uint64_t t0 = lane_clock_now(st);
    for (int64_t t = begin; t < end; t++) {
        cpu_act_quantize(st->m[LANE_GATE]->type, st->x + t * E,
                         st->l->xq_tok[0] + t * st->xq_bytes[LANE_GATE], E);
        if (!st->shared_act)
            cpu_act_quantize(st->m[LANE_UP]->type, st->x + t * E,
                             st->l->xq_tok[1] + t * st->xq_bytes[LANE_UP], E);
    }
    lane_clock_add(st, ith, TM_LANE_PREP, &t0);
}

/* Copy each slot's token row next to the other rows of its run. */
static void lane_gather_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_step *st = ctx;
    uint64_t t0 = lane_clock_now(st);
    for (int64_t s = begin; s < end; s++)
        for (int p = LANE_GATE; p <= (st->shared_act ? LANE_GATE : LANE_UP); p++)
            memcpy(st->l->xq[p] + s * st->xq_bytes[p],
                   st->l->xq_tok[p] + (int64_t)st->slots[s].token * st->xq_bytes[p],
                   st->xq_bytes[p]);
    lane_clock_add(st, ith, TM_LANE_PREP, &t0);
}

static void lane_swiglu_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_step *st = ctx;
    uint64_t t0 = lane_clock_now(st);
    for (int64_t s = begin; s < end; s++) lane_swiglu_piece(st, s, 0, st->ex->n_ff);
    lane_clock_add(st, ith, TM_LANE_ACT, &t0);
}

/* y[t] += Σ weight · O[slot] over token t's slots, in slot order. */
static void lane_combine_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const lane_step *st = ctx;
    const tm_moe_cpu_lane *l = st->l;
    const int64_t E = st->ex->n_embd;
    uint64_t t0 = lane_clock_now(st);
    for (int64_t t = begin; t < end; t++)
        for (int64_t i = l->tok_first[t]; i < l->tok_first[t + 1]; i++) {
            const int64_t s = l->tok_slots[i];
            cpu_axpy(st->y + t * E, st->slots[s].weight, l->out[LANE_DOWN] + s * E, E);
            if (st->ex->down_bias)
                cpu_axpy(st->y + t * E, st->slots[s].weight,
                         st->ex->down_bias + (int64_t)st->slots[s].expert * E, E);
        }
    lane_clock_add(st, ith, TM_LANE_COMBINE, &t0);
}

/* Precise reference path: each run's products in double from dequantized rows. */
static tm_status lane_run_precise(tm_moe_cpu_lane *l, tm_pool *pool, const tm_moe_experts *ex,
                                  const tm_moe_slot *slots, int64_t n_runs, const float *x) {
    const int64_t E = ex->n_embd, F = ex->n_ff;
    for (int64_t r = 0; r < n_runs; r++) {
        const lane_run *run = &l->runs[r];
        const int64_t n = run->s1 - run->s0;
        for (int64_t s = run->s0; s < run->s1; s++)
            memcpy(l->xf + (s - run->s0) * E, x + (int64_t)slots[s].token * E,
                   (size_t)E * sizeof(float));
        tm_status st;
        float *g = l->out[LANE_GATE], *u = l->out[LANE_UP];
        if ((st = cpu_matmul_precise(pool, ex->gate.type, E, F,
                                     moe_matrix_expert(&ex->gate, run->expert), ex->gate.row_bytes,
                                     l->xf, n, g + run->s0 * F)) ||
            (st = cpu_matmul_precise(pool, ex->up.type, E, F,
                                     moe_matrix_expert(&ex->up, run->expert), ex->up.row_bytes,
                                     l->xf, n, u + run->s0 * F)))
            return st;
        for (int64_t s = run->s0; s < run->s1; s++)
            moe_experts_act(ex, run->expert, 0, F, g + s * F, g + s * F, u + s * F);
        if ((st = cpu_matmul_precise(pool, ex->down.type, F, E,
                                     moe_matrix_expert(&ex->down, run->expert), ex->down.row_bytes,
                                     g + run->s0 * F, n, l->out[LANE_DOWN] + run->s0 * E)))
            return st;
    }
    return TM_OK;
}

tm_status moe_cpu_lane_run(tm_moe_cpu_lane *l, tm_pool *pool, const tm_moe_experts *ex,
                           const tm_moe_worklist *wl, int64_t s0, int64_t s1, const float *x,
                           float *y, bool precise) {
    const int64_t n = s1 - s0, E = ex->n_embd, F = ex->n_ff, n_tok = wl->n_tok;
    if (n <= 0) return TM_OK;
    const uint64_t t_start = l->acc ? tm_time_ns() : 0;
    const tm_moe_slot *slots = wl->slots + s0;
    const int nth = cpu_pool_size(pool);
    if (l->acc && l->n_clocks < nth) {
        lane_clock *c = aligned_alloc(_Alignof(lane_clock), (size_t)nth * sizeof(lane_clock));
        if (!c) return tm_error_set(TM_ERR_NOMEM, "cpu lane: out of memory for %d clocks", nth);
        free(l->clocks);
        l->clocks = c, l->n_clocks = nth;
    }

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

    lane_step st = {
        .ex = ex,
        .l = l,
        .slots = slots,
        .x = x,
        .y = y,
        .m = {&ex->gate, &ex->up, &ex->down},
        .k = {E, E, F},
        .rows = {F, F, E},
        .xq_bytes = {cpu_act_row_size(ex->gate.type, E), cpu_act_row_size(ex->up.type, E),
                     cpu_act_row_size(ex->down.type, F)},
        .shared_act = cpu_act_type(ex->gate.type) == cpu_act_type(ex->up.type),
        .clocks = l->acc && !precise ? l->clocks : NULL,
    };
    if (st.clocks) memset(st.clocks, 0, (size_t)nth * sizeof(lane_clock));
    int64_t items_max = 0; /* items are at least lane_row_chunk_base() rows */
    const int64_t chunk_min = lane_row_chunk_base();
    for (int p = 0; p < LANE_PROJ; p++)
        items_max += n_runs * ((st.rows[p] + chunk_min - 1) / chunk_min);
    int ok = lane_grow((void **)&l->items, &l->cap_items, (size_t)items_max * sizeof(lane_item));
    for (int p = 0; ok && p < LANE_PROJ; p++)
        ok = lane_grow((void **)&l->out[p], &l->cap_out[p],
                       (size_t)(n * st.rows[p]) * sizeof(float)) &&
             (p == LANE_UP && st.shared_act
                  ? 1
                  : lane_grow((void **)&l->xq[p], &l->cap_xq[p], (size_t)n * st.xq_bytes[p]));
    for (int p = 0; ok && p < (st.shared_act ? 1 : 2); p++)
        ok = lane_grow((void **)&l->xq_tok[p], &l->cap_xq_tok[p], (size_t)n_tok * st.xq_bytes[p]);
    ok = ok &&
         lane_grow((void **)&l->tok_first, &l->cap_tok_first,
                   (size_t)(n_tok + 1) * sizeof(int64_t)) &&
         lane_grow((void **)&l->tok_slots, &l->cap_tok_slots, (size_t)n * sizeof(int64_t));
    /* H in pieces when the pieces split the quantized row and the items the pieces */
    if (F % LANE_H_PIECE == 0 && LANE_H_PIECE % LANE_ROW_CHUNK_MAX == 0 &&
        cpu_act_row_size(ex->down.type, F) ==
            (size_t)(F / LANE_H_PIECE) * cpu_act_row_size(ex->down.type, LANE_H_PIECE))
        st.n_pieces = F / LANE_H_PIECE;
    ok = ok &&
         lane_grow((void **)&l->pending, &l->cap_pending,
                   (size_t)(n_runs * st.n_pieces) * sizeof(atomic_int)) &&
         lane_grow((void **)&l->ready, &l->cap_ready, (size_t)n_runs * sizeof(atomic_int)) &&
         lane_grow((void **)&l->down_first, &l->cap_down_first,
                   (size_t)(n_runs + 1) * sizeof(int64_t)) &&
         lane_grow((void **)&l->down_next, &l->cap_down_next, (size_t)n_runs * sizeof(atomic_int));
    if (ok && precise) ok = lane_grow((void **)&l->xf, &l->cap_xf, (size_t)(n * E) * sizeof(float));
    if (!ok)
        return tm_error_set(TM_ERR_NOMEM, "cpu lane: out of memory for %lld slots", (long long)n);

    /* each token's slots in slot order (a counting sort), for the merge into y */
    memset(l->tok_first, 0, (size_t)(n_tok + 1) * sizeof(int64_t));
    for (int64_t s = 0; s < n; s++) l->tok_first[slots[s].token + 1]++;
    for (int64_t t = 0; t < n_tok; t++) l->tok_first[t + 1] += l->tok_first[t];
    for (int64_t s = 0; s < n; s++) l->tok_slots[l->tok_first[slots[s].token]++] = s;
    for (int64_t t = n_tok; t > 0; t--)
        l->tok_first[t] = l->tok_first[t - 1]; /* the fill moved each start to the next */
    l->tok_first[0] = 0;

    if (precise) {
        tm_status rc = lane_run_precise(l, pool, ex, slots, n_runs, x);
        if (rc != TM_OK) return rc;
        cpu_pool_for(pool, n_tok, 1, lane_combine_task, &st);
        return TM_OK;
    }
    lane_item *items = l->items;
    const int64_t n_gate_up = lane_items_build(&st, items, n_runs, LANE_GATE, LANE_UP);
    const int64_t n_down = lane_items_build(&st, items + n_gate_up, n_runs, LANE_DOWN, LANE_DOWN);
    st.items[0] = items, st.items[1] = items + n_gate_up;
    st.n_runs = n_runs;
    st.tickets = st.n_pieces && n_runs <= LANE_TICKET_RUNS;
    l->down_first[0] = 0;
    for (int64_t r = 0; r < n_runs; r++) {
        const int64_t c = lane_row_chunk(&st, LANE_DOWN, &l->runs[r]);
        l->down_first[r + 1] = l->down_first[r] + (st.rows[LANE_DOWN] + c - 1) / c;
        atomic_init(&l->ready[r], 0);
        atomic_init(&l->down_next[r], 0);
    }
    for (int64_t i = 0; i < n_runs * st.n_pieces; i++) { /* gate and up items of a piece */
        const lane_run *run = &l->runs[i / st.n_pieces];
        atomic_init(&l->pending[i], (int)(LANE_H_PIECE / lane_row_chunk(&st, LANE_GATE, run) +
                                          LANE_H_PIECE / lane_row_chunk(&st, LANE_UP, run)));
    }
    /* a decode step (one token, k slots) quantizes, gathers and merges on this
     * thread: cheaper than a barrier */
    const bool decode = n_tok == 1 && n <= 16;
    if (decode) lane_quantize_task(&st, 0, 1, 0), lane_gather_task(&st, 0, n, 0);
    const tm_pool_step steps[] = {
        {lane_quantize_task, decode ? 0 : n_tok, 4}, /* x rows quantized once per token */
        {lane_gather_task, decode ? 0 : n, 16},      /* ... and copied to their runs */
        {lane_gate_up_task, n_gate_up + (st.n_pieces ? n_down : 0),
         1}, /* down too when H comes in pieces */
        {lane_swiglu_task, st.n_pieces ? 0 : n, 1},
        {lane_down_task, st.n_pieces ? 0 : n_down, 1},
        {lane_combine_task, decode ? 0 : n_tok, 1},
    };
    cpu_pool_for_steps(pool, (int)(sizeof(steps) / sizeof(steps[0])), steps, &st);
    if (decode) lane_combine_task(&st, 0, 1, 0);
    if (st.clocks) {
        for (int i = 0; i < nth; i++)
            for (int p = 0; p < TM_LANE_PART_COUNT; p++) l->acc->ns[p] += st.clocks[i].ns[p];
        l->acc->thread_ns += (tm_time_ns() - t_start) * (uint64_t)nth;
    }
    return TM_OK;
}
