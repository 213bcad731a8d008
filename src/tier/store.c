/* The expert store (store.h): slots, chunked lane runs, eviction, and reads
 * ahead: the next layers' experts predicted by their routers applied to this
 * layer's input (decode steps), then the next layer's experts of the previous
 * step (one-token lag). */
#include "tier/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/log.h"
#include "core/timing.h"
#include "cpu/cpu.h"
#include "cpu/cpu_ops.h"
#include "tier/cache_policy.h"
#include "tier/store_io.h"

#define A ((uint64_t)TM_STORE_ALIGN)

typedef struct store_layer {
    bool on;
    tm_moe_experts ex;          /* the bound experts, expert_at pointing at the tables below */
    uint64_t file_off[3];       /* expert 0 of gate, up, down */
    size_t stride[3], piece[3]; /* bytes from one expert to the next; a slot's room for one */
    size_t len[3]; /* bytes of an expert's rows (less than the stride when gate and up are one
                      tensor, Gemma 4's ffn_gate_up_exps: each view reads its half) */
    size_t slot_bytes;
    uint8_t *base;         /* n_slots slots */
    const uint8_t **at[3]; /* [n_expert]: a resident expert's rows, else NULL */
    int32_t *slot_of;      /* [n_expert] */
    int32_t *expert_in;    /* [n_slots]: -1 empty */
    uint64_t *pin;         /* [n_slots]: the last chunk that uses the slot */
    uint64_t *seq;         /* [n_slots]: its last read */
    bool *ahead;           /* [n_slots]: read ahead, not yet used */
    double *score;         /* [n_expert]: decayed uses at stamp */
    double *stamp;         /* [n_expert]: clock of score */
    uint32_t *mark;        /* [n_expert]: the step that last counted it */
    int64_t *first, *last; /* [n_expert]: its first and last slot in that step */
    int32_t *prev, n_prev; /* the experts of the previous step, in order of first use */
    int32_t *pred, n_pred; /* the experts predicted for the next step (none: n_pred 0) */
    uint32_t *pred_at;     /* [n_expert]: the prediction (pred_serial) that named it */
    uint32_t pred_serial;
    double clock; /* tokens of this layer's steps */
    int32_t resident;
    int32_t staged; /* experts this step evicted that it still uses (read again later) */
} store_layer;

struct tm_store {
    uint32_t n_layer, n_expert, k;
    store_layer *layers;
    int32_t n_slots;
    double half_life;
    tm_store_io *io;
    void *mem;
    size_t mem_bytes;
    uint64_t chunk_id;
    uint32_t step;
    int32_t stage;    /* TM_STORE_STAGE (TIERMOE_STORE_STAGE for comparisons) */
    uint32_t predict; /* TM_STORE_PREDICT_LAYERS (TIERMOE_STORE_PREDICT_LAYERS) */
    int64_t first_layer;
    tm_store_stats stats;
    /* the next-layer prediction's scratch (NULL: no layer has a router) */
    float *pred_logits;          /* [STORE_PREDICT_TOK][n_expert] */
    void *pred_xq;               /* the activations as cpu_matmul quantizes them */
    int32_t *pred_ids;           /* [STORE_PREDICT_TOK][k] */
    float *pred_w;               /* [STORE_PREDICT_TOK][k] */
    tm_moe_router_params router; /* the model's; each layer's selection bias its own */
};

#define STORE_PREDICT_TOK 8 /* steps of up to this many tokens (decode) predict */

static uint64_t align_up(uint64_t v) {
    return (v + A - 1) & ~(A - 1);
}

static double store_score(const tm_store *s, const store_layer *L, int32_t e) {
    return L->score[e] * exp2((L->stamp[e] - L->clock) / s->half_life);
}

static void store_use(const tm_store *s, store_layer *L, int32_t e, double uses) {
    L->score[e] = store_score(s, L, e) + uses, L->stamp[e] = L->clock;
}

/* Queue the reads of expert e into slot j of layer L. */
static tm_status store_fill(tm_store *s, store_layer *L, int32_t j, int32_t e) {
    const int32_t old = L->expert_in[j];
    if (old >= 0) {
        for (int p = 0; p < 3; p++) L->at[p][old] = NULL;
        L->slot_of[old] = -1;
        L->resident--;
        s->stats.evictions++;
    }
    L->expert_in[j] = -1;
    uint8_t *dst = L->base + (size_t)j * L->slot_bytes;
    tm_status st;
    for (int p = 0; p < 3; p++) {
        const uint64_t o = L->file_off[p] + (uint64_t)e * L->stride[p];
        const uint64_t a0 = o & ~(A - 1), a1 = align_up(o + L->len[p]);
        for (uint64_t c = a0; c < a1; c += TM_STORE_IO_CHUNK) {
            const uint64_t len = a1 - c < TM_STORE_IO_CHUNK ? a1 - c : TM_STORE_IO_CHUNK;
            const uint64_t end = o + L->len[p]; /* the bytes that must exist */
            const size_t need = end > c ? (size_t)(end - c < len ? end - c : len) : 0;
            if ((st = store_io_read(s->io, c, (size_t)len, need, dst + (c - a0), &L->seq[j])))
                return st;
        }
        L->at[p][e] = dst + (o - a0);
        dst += L->piece[p];
        s->stats.bytes_read += a1 - a0;
    }
    L->expert_in[j] = e, L->slot_of[e] = j;
    if (++L->resident > s->stats.max_resident) s->stats.max_resident = L->resident;
    return TM_OK;
}

/* A slot for a read at worklist slot `at` of the step: empty, else the
 * lowest scored expert the rest of the step does not use, else (the budget
 * is smaller than the step's experts) the one whose next use is farthest
 * (Belady; *live true), of those no chunk from `running` on holds and whose
 * read is done; a slot being read is waited for when no other will do
 * (*out -1: none). */
static tm_status store_victim(tm_store *s, store_layer *L, uint64_t running, int64_t at,
                              int32_t *out, bool *live) {
    *live = false;
    for (;;) {
        int32_t best = -1, far = -1;
        double best_score = INFINITY;
        int64_t far_at = -1;
        uint64_t reading = 0;
        for (int32_t j = 0; j < s->n_slots; j++) {
            if (L->pin[j] >= running) continue;
            if (!store_io_done(s->io, L->seq[j])) {
                reading = L->seq[j] > reading ? L->seq[j] : reading;
                continue;
            }
            const int32_t e = L->expert_in[j];
            if (e < 0) {
                *out = j;
                return TM_OK;
            }
            if (L->mark[e] == s->step && L->last[e] >= at) { /* used later in this step */
                const int64_t next = L->first[e] >= at ? L->first[e] : L->last[e];
                if (next > far_at) far = j, far_at = next;
                continue;
            }
            const double sc = store_score(s, L, e);
            if (sc < best_score || (sc == best_score && L->stamp[e] < L->stamp[L->expert_in[best]]))
                best = j, best_score = sc;
        }
        if (best < 0) best = far, *live = far >= 0;
        if (best >= 0 || !reading) {
            *out = best;
            return TM_OK;
        }
        tm_status st = store_io_wait(s->io, reading);
        if (st != TM_OK) return st;
    }
}

/* Chunk `id`: slots [i, *end) of sl whose experts are resident or get a slot
 * (reads queued); *ready: the last read they wait for. */
static tm_status store_form(tm_store *s, store_layer *L, const tm_moe_slot *sl, int64_t i,
                            int64_t n, uint64_t id, uint64_t running, int32_t max_experts,
                            int64_t *end, uint64_t *ready) {
    tm_status st;
    int64_t j = i;
    int32_t n_experts = 0; /* runs of one expert: its experts, in an expert-major worklist */
    for (; j < n; j++) {
        const int32_t e = sl[j].expert;
        if ((j == i || e != sl[j - 1].expert) && max_experts && ++n_experts > max_experts) break;
        int32_t slot = L->slot_of[e];
        if (slot < 0) {
            bool live;
            if ((st = store_victim(s, L, running, j, &slot, &live))) return st;
            if (slot < 0) break;
            /* past TM_STORE_STAGE a chunk ends rather than evict an expert the step uses
               later, and waits for the slots its predecessors free; only a chunk that
               nothing runs beside and that is still empty must go on */
            if (live && L->staged >= s->stage && (j > i || id != running)) break;
            L->staged += live;
            if ((st = store_fill(s, L, slot, e))) return st;
            s->stats.faults++;
        }
        if (L->ahead[slot]) L->ahead[slot] = false, s->stats.prefetch_used++;
        L->pin[slot] = id;
        if (L->seq[slot] > *ready) *ready = L->seq[slot];
    }
    *end = j;
    return TM_OK;
}

/* Whether the current prediction for L names e. */
static bool store_predicted(const store_layer *L, int32_t e) {
    return L->n_pred && L->pred_at[e] == L->pred_serial;
}

/* Read ahead, on the spare queue depth, the experts layer l is predicted to
 * use in its next step, then those it used in its previous step (one-token
 * lag), that are not resident. A predicted expert takes the slot of any
 * expert not predicted; a lag expert only that of a lower scored one. */
static tm_status store_prefetch(tm_store *s, uint32_t l) {
    if (l >= s->n_layer || !s->layers[l].on) return TM_OK;
    store_layer *L = &s->layers[l];
    tm_status st;
    for (int32_t i = 0; i < L->n_pred + L->n_prev; i++) {
        if (store_io_depth(s->io) - store_io_in_flight(s->io) < 3) break; /* 3 reads an expert */
        const bool predicted = i < L->n_pred;
        const int32_t e = predicted ? L->pred[i] : L->prev[i - L->n_pred];
        if (L->slot_of[e] >= 0) continue;
        int32_t j;
        bool live;
        if ((st = store_victim(s, L, s->chunk_id + 1, 0, &j, &live))) return st;
        if (j < 0) break;
        const int32_t old = L->expert_in[j];
        if (old >= 0 && store_predicted(L, old)) break; /* never one predicted for another */
        if (!predicted && old >= 0 && store_score(s, L, old) >= store_score(s, L, e)) continue;
        if ((st = store_fill(s, L, j, e)) || (st = store_io_submit(s->io))) return st;
        L->ahead[j] = true;
        s->stats.prefetched++;
    }
    return TM_OK;
}

/* Predict layer t's experts of this step from the input x (n_tok rows) of a
 * layer before it: what t's router chooses from its logits for that input
 * (the residual stream changes little from one layer to the next), with its
 * gating, selection bias and groups. */
static tm_status store_predict(tm_store *s, uint32_t t, tm_pool *pool, const float *x,
                               int64_t n_tok) {
    if (t >= s->n_layer || !s->pred_logits || n_tok > STORE_PREDICT_TOK) return TM_OK;
    store_layer *N = &s->layers[t];
    N->n_pred = 0;
    if (!N->on || !N->ex.router) return TM_OK;
    const int64_t E = s->n_expert, d = N->ex.n_embd;
    cpu_matmul(pool, TM_TYPE_F32, d, E, N->ex.router, (size_t)d * sizeof(float), x, n_tok,
               s->pred_logits, s->pred_xq);
    N->pred_serial++;
    if (N->ex.router_bias)
        for (int64_t i = 0; i < n_tok; i++)
            for (int64_t e = 0; e < E; e++) s->pred_logits[i * E + e] += N->ex.router_bias[e];
    tm_moe_router_params rp = s->router;
    rp.sel_bias = N->ex.sel_bias;
    moe_router_select(NULL, &rp, s->pred_logits, n_tok, s->pred_ids, s->pred_w);
    for (int64_t i = 0; i < n_tok * (int64_t)s->k; i++) {
        const int32_t e = s->pred_ids[i];
        if (N->pred_at[e] != N->pred_serial)
            N->pred_at[e] = N->pred_serial, N->pred[N->n_pred++] = e;
    }
    return TM_OK;
}

/* The reads ahead of layer l's step: the next s->predict layers' experts as their
 * routers name them for this layer's input x (decode steps; layer l + 1's again
 * from its own input next), then their one-token lag; without x, layer l + 1's lag. */
static tm_status store_read_ahead(tm_store *s, uint32_t l, tm_pool *pool, int64_t n_tok,
                                  const float *x) {
    tm_status st = TM_OK;
    const uint32_t n = x && n_tok <= STORE_PREDICT_TOK ? s->predict : 1;
    for (uint32_t j = 1; j <= n && st == TM_OK; j++) {
        if (x) st = store_predict(s, l + j, pool, x, n_tok);
        if (st == TM_OK) st = store_prefetch(s, l + j);
    }
    return st;
}

/* Count the step's uses of each expert (scores, hits) and remember the
 * step's experts for the next prefetch. */
static void store_count(tm_store *s, store_layer *L, const tm_moe_slot *sl, int64_t s0,
                        int64_t s1) {
    s->step++;
    L->staged = 0;
    for (int64_t i = s0; i < s1; i++) {
        const int32_t e = sl[i].expert;
        L->last[e] = i;
        if (L->mark[e] != s->step) {
            L->mark[e] = s->step, L->first[e] = i;
            L->prev[L->n_prev++] = e;
            s->stats.routed++;
            s->stats.hits += L->slot_of[e] >= 0;
            if (L->n_pred) s->stats.pred_routed++, s->stats.pred_hits += store_predicted(L, e);
        }
        store_use(s, L, e, 1.0);
    }
    L->n_pred = 0; /* a prediction serves one step */
}

/* A sink's wait (none: its runs read the slots before they return). */
static tm_status store_settle(const tm_store_sink *k) {
    return k->settle ? k->settle(k->ud) : TM_OK;
}

tm_status store_run(tm_store *s, uint32_t l, tm_pool *pool, const tm_moe_worklist *wl, int64_t s0,
                    int64_t s1, const float *x, const tm_store_sink *k) {
    if (l >= s->n_layer || !s->layers[l].on)
        return tm_error_set(TM_ERR_ARG, "expert store: layer %u is not in the store", l);
    store_layer *L = &s->layers[l];
    const tm_moe_slot *sl = wl->slots;
    const int32_t max = k->max_experts;
    s->stats.steps++;
    if ((int64_t)l == s->first_layer) s->stats.tokens += (uint64_t)wl->n_tok;
    L->clock += (double)wl->n_tok;
    L->n_prev = 0;
    store_count(s, L, sl, s0, s1);
    tm_status st;
    uint64_t id = ++s->chunk_id, ready = 0;
    int64_t cur = s0, end = s0;
    if ((st = store_form(s, L, sl, cur, s1, id, id, max, &end, &ready))) return st;
    bool prefetched = false;
    while (cur < s1) {
        if (end == cur)
            return tm_error_set(TM_ERR_ARG,
                                "expert store: layer %u has no free slot (every slot in use)", l);
        /* the next chunk's reads go out before this one computes; the chunks before
           this one lose their pins, so what the sink queued for them must be done */
        uint64_t next_id = 0, next_ready = 0;
        int64_t next_end = end;
        if (end < s1) {
            next_id = ++s->chunk_id;
            if ((st = store_settle(k)) ||
                (st = store_form(s, L, sl, end, s1, next_id, id, max, &next_end, &next_ready)))
                return st;
        }
        if ((st = store_io_submit(s->io))) return st;
        if (!prefetched && (st = store_read_ahead(s, l, pool, wl->n_tok, x))) return st;
        prefetched = true;
        const uint64_t t0 = tm_time_ns();
        if ((st = store_io_wait(s->io, ready))) return st;
        s->stats.wait_ns += tm_time_ns() - t0;
        if ((st = k->run(k->ud, &L->ex, cur, end))) return st;
        cur = end;
        if (cur >= s1) break;
        if (next_end > end) {
            id = next_id, end = next_end, ready = next_ready;
        } else { /* the next chunk had no room while this one held its slots */
            id = ++s->chunk_id, ready = 0;
            if ((st = store_settle(k)) ||
                (st = store_form(s, L, sl, cur, s1, id, id, max, &end, &ready)))
                return st;
        }
    }
    /* the next run (of this layer or, reading ahead, of the one before) may evict */
    return store_settle(k);
}

typedef struct store_cpu_sink {
    tm_moe_cpu_lane *lane;
    tm_pool *pool;
    const tm_moe_worklist *wl;
    const float *x;
    float *y;
    bool precise;
} store_cpu_sink;

static tm_status store_cpu_run(void *ud, const tm_moe_experts *ex, int64_t a, int64_t b) {
    const store_cpu_sink *c = ud;
    return moe_cpu_lane_run(c->lane, c->pool, ex, c->wl, a, b, c->x, c->y, c->precise);
}

tm_status store_lane_run(tm_store *s, uint32_t l, tm_moe_cpu_lane *lane, tm_pool *pool,
                         const tm_moe_worklist *wl, int64_t s0, int64_t s1, const float *x,
                         float *y, bool precise) {
    store_cpu_sink c = {lane, pool, wl, x, y, precise};
    const tm_store_sink k = {.run = store_cpu_run, .ud = &c};
    return store_run(s, l, pool, wl, s0, s1, x, &k);
}

/* RAM the kernel says is available (MemAvailable), 0 when unknown. */
static int64_t store_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return (int64_t)kb << 10;
}

static tm_status store_layer_init(tm_store *s, store_layer *L, const tm_moe_experts *ex,
                                  const uint8_t *map) {
    L->on = true, L->ex = *ex;
    const tm_moe_matrix *m[3] = {&ex->gate, &ex->up, &ex->down};
    L->slot_bytes = 0;
    for (int p = 0; p < 3; p++) {
        L->file_off[p] = (uint64_t)(m[p]->data - map);
        L->stride[p] = m[p]->expert_stride;
        L->len[p] = (size_t)(p < 2 ? ex->n_ff : ex->n_embd) * m[p]->row_bytes;
        L->piece[p] = (size_t)align_up(L->len[p]) + A; /* the slack of an unaligned start */
        L->slot_bytes += L->piece[p];
        if (!(L->at[p] = calloc(s->n_expert, sizeof(uint8_t *))))
            return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    L->ex.gate.expert_at = L->at[0], L->ex.up.expert_at = L->at[1];
    L->ex.down.expert_at = L->at[2];
    if (!(L->slot_of = malloc(s->n_expert * sizeof(int32_t))) ||
        !(L->score = calloc(s->n_expert, sizeof(double))) ||
        !(L->stamp = calloc(s->n_expert, sizeof(double))) ||
        !(L->mark = calloc(s->n_expert, sizeof(uint32_t))) ||
        !(L->first = calloc(s->n_expert, sizeof(int64_t))) ||
        !(L->last = calloc(s->n_expert, sizeof(int64_t))) ||
        !(L->prev = malloc(s->n_expert * sizeof(int32_t))) ||
        !(L->pred = malloc(s->n_expert * sizeof(int32_t))) ||
        !(L->pred_at = calloc(s->n_expert, sizeof(uint32_t))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    memset(L->slot_of, 0xff, s->n_expert * sizeof(int32_t));
    return TM_OK;
}

static tm_status store_slots_init(tm_store *s, store_layer *L, uint8_t *base) {
    L->base = base;
    const size_t n = (size_t)s->n_slots;
    if (!(L->expert_in = malloc(n * sizeof(int32_t))) || !(L->pin = calloc(n, sizeof(uint64_t))) ||
        !(L->seq = calloc(n, sizeof(uint64_t))) || !(L->ahead = calloc(n, sizeof(bool))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    memset(L->expert_in, 0xff, n * sizeof(int32_t));
    return TM_OK;
}

tm_status store_create(const tm_store_params *p, uint32_t n_layer, const tm_moe_experts *layers,
                       const bool *in_store, const tm_moe_router_params *router, tm_store **out) {
    const uint32_t n_expert = router->n_expert, k = router->n_used;
    *out = NULL;
    tm_store *s = calloc(1, sizeof(*s));
    if (!s || !(s->layers = calloc(n_layer, sizeof(*s->layers)))) {
        free(s);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    s->n_layer = n_layer, s->n_expert = n_expert, s->k = k, s->first_layer = -1;
    s->router = *router;
    tm_status st = TM_OK;
    size_t per_slot = 0, all = 0; /* one slot in every layer; every expert */
    for (uint32_t l = 0; l < n_layer && st == TM_OK; l++) {
        if (!in_store[l]) continue;
        if (s->first_layer < 0) s->first_layer = l;
        st = store_layer_init(s, &s->layers[l], &layers[l], p->map);
        per_slot += s->layers[l].slot_bytes;
    }
    if (st == TM_OK && !per_slot)
        st = tm_error_set(TM_ERR_ARG, "--ram-cache: no layer's experts are in RAM");
    all = per_slot * n_expert;
    int64_t budget = p->budget_mib << 20;
    if (st == TM_OK && p->budget_mib == TM_RAM_CACHE_AUTO) {
        const int64_t avail = store_mem_available(),
                      reserve = avail / 10 > TM_STORE_RESERVE ? avail / 10 : TM_STORE_RESERVE;
        budget = avail - reserve;
    }
    if (st == TM_OK && budget < (int64_t)per_slot)
        st = tm_error_set(TM_ERR_ARG,
                          "--ram-cache %lld MiB holds no expert per layer: at least %.0f MiB "
                          "(one expert in each of the layers' slots, alignment included)",
                          (long long)(budget >> 20), per_slot / 1048576.0 + 1);
    if (st == TM_OK) {
        s->n_slots =
            (int32_t)((uint64_t)budget / per_slot > n_expert ? n_expert
                                                             : (uint64_t)budget / per_slot);
        /* a use counts half after one turnover of the layer's slots (slots / k tokens):
           recency more than frequency. Development machine, 8 layers of 128 experts, top 8,
           bench tg256, experts read a token (faulted + read ahead) at 17 / 33 / 66 slots a
           layer, 8 turnovers (the VRAM cache policy's) against one: Qwen3 routing profile
           22.1 / 12.7 / 4.7 against 19.9 / 10.7 / 4.6; uniform routing 55.2 / 46.7 / 29.8
           against 55.5 / 47.6 / 30.8 (TIERMOE_STORE_HALF_LIFE=T: T tokens) */
        s->half_life = TM_STORE_TURNOVERS * s->n_slots / (k ? k : 1);
        if (s->half_life < 1) s->half_life = 1;
        const char *hl = getenv("TIERMOE_STORE_HALF_LIFE");
        if (hl && atof(hl) > 0) s->half_life = atof(hl);
        s->mem_bytes = per_slot * (size_t)s->n_slots;
        s->mem =
            mmap(NULL, s->mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s->mem == MAP_FAILED) {
            s->mem = NULL;
            st = tm_error_set(TM_ERR_NOMEM, "--ram-cache: cannot map %zu bytes", s->mem_bytes);
        }
    }
    uint8_t *base = s->mem;
    for (uint32_t l = 0; l < n_layer && st == TM_OK; l++) {
        if (!in_store[l]) continue;
        st = store_slots_init(s, &s->layers[l], base);
        base += s->layers[l].slot_bytes * (size_t)s->n_slots;
    }
    const char *stage = getenv("TIERMOE_STORE_STAGE"); /* a large one: the greedy chunks */
    s->stage = stage && atoi(stage) > 0 ? atoi(stage) : TM_STORE_STAGE;
    const char *pl = getenv("TIERMOE_STORE_PREDICT_LAYERS");
    s->predict = pl && atoi(pl) > 0 ? (uint32_t)atoi(pl) : TM_STORE_PREDICT_LAYERS;
    /* a layer after the first with a router: predict its experts (TIERMOE_STORE_PREDICT=0:
       the one-token lag alone, for comparisons) */
    const char *env = getenv("TIERMOE_STORE_PREDICT");
    bool predict = false;
    int64_t d = 0;
    for (uint32_t l = 1; l < n_layer; l++)
        if (in_store[l] && layers[l].router && !(env && !strcmp(env, "0")))
            predict = true, d = layers[l].n_embd;
    if (st == TM_OK && predict &&
        (!(s->pred_logits = malloc((size_t)STORE_PREDICT_TOK * n_expert * sizeof(float))) ||
         !(s->pred_xq = malloc((size_t)STORE_PREDICT_TOK * cpu_act_row_size(TM_TYPE_F32, d))) ||
         !(s->pred_ids = malloc((size_t)STORE_PREDICT_TOK * (k ? k : 1) * sizeof(int32_t))) ||
         !(s->pred_w = malloc((size_t)STORE_PREDICT_TOK * (k ? k : 1) * sizeof(float)))))
        st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    const tm_store_io_params iop = {.depth = p->depth};
    if (st == TM_OK) st = store_io_open(p->path, &iop, &s->io);
    if (st != TM_OK) {
        store_free(s);
        return st;
    }
    tm_log_info("--ram-cache: %d of %u experts a layer (%.2f of %.2f GiB), read %s%s at queue "
                "depth %d",
                s->n_slots, n_expert, s->mem_bytes / 1073741824.0, all / 1073741824.0,
                store_io_direct(s->io) ? "with O_DIRECT" : "through the page cache",
                store_io_uring(s->io) ? " through io_uring" : " with pread", store_io_depth(s->io));
    if (s->n_slots < (int32_t)k)
        tm_log_warn("--ram-cache: %d slots a layer, fewer than the %u experts a token uses: "
                    "every step rereads experts",
                    s->n_slots, k);
    *out = s;
    return TM_OK;
}

void store_free(tm_store *s) {
    if (!s) return;
    store_io_close(s->io); /* no read may land in freed slots */
    for (uint32_t l = 0; s->layers && l < s->n_layer; l++) {
        store_layer *L = &s->layers[l];
        for (int p = 0; p < 3; p++) free(L->at[p]);
        free(L->slot_of), free(L->expert_in), free(L->pin), free(L->seq), free(L->ahead);
        free(L->score), free(L->stamp), free(L->mark), free(L->prev);
        free(L->first), free(L->last), free(L->pred), free(L->pred_at);
    }
    if (s->mem) munmap(s->mem, s->mem_bytes);
    free(s->pred_logits), free(s->pred_xq), free(s->pred_ids), free(s->pred_w);
    free(s->layers), free(s);
}

const tm_store_stats *store_stats(const tm_store *s) {
    return &s->stats;
}
int32_t store_slots(const tm_store *s) {
    return s->n_slots;
}
size_t store_bytes(const tm_store *s) {
    return s->mem_bytes;
}
int32_t store_resident(const tm_store *s, uint32_t l) {
    return l < s->n_layer && s->layers[l].on ? s->layers[l].resident : 0;
}
void *store_memory(const tm_store *s, size_t *bytes) {
    *bytes = s->mem_bytes;
    return s->mem;
}
bool store_uring(const tm_store *s) {
    return store_io_uring(s->io);
}
bool store_direct(const tm_store *s) {
    return store_io_direct(s->io);
}
