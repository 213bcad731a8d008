/* Prompt steps' experts in RAM on the GPU: the fetch lane (copied into a ring
 * of VRAM buffers ahead of routing), the in-place PCIe GEMM, and the CPU
 * lane's share (docs/executor.md, "Prompts").
 *
 * A prompt batch of n tokens routes n*k slots; with n*k well above n_expert
 * nearly every expert of a layer is used (the expected share is
 * 1 - (1 - k/E)^n), so the lane copies a layer's cold experts without waiting
 * for its routing: layer l+1's copies run on the copy stream while layer l
 * computes. The ring holds n_bufs buffers of chunk_cap experts; chunk j goes
 * to buffer j % n_bufs, its copy waits for the compute that last read the
 * buffer (freed), its compute for the copy (ready). The host queues copy j
 * only once compute j - n_bufs is queued, so every wait names the right record.
 *
 * Batches that use few experts, or have few tokens for each, read the routed
 * ones in place instead (the
 * grouped GEMM over the pinned file pages: one read per expert while its
 * tokens fit one tile), while the CPU lane takes a share of them (those with
 * the fewest tokens), balanced layer by layer: when the CPU lane finishes
 * before the GPU's reads, its share grows, else it shrinks. Copying ahead, the
 * CPU lane takes the least used experts, a share set by this machine's
 * calibration profile (tier_fetch_cpu_q8), none without one, or
 * TIERMOE_FETCH_CPU_SHARE's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tier/calib.h"
#include "tier/tier_internal.h"

#define TIER_FETCH_CHUNK    16  /* experts a ring buffer holds */
#define TIER_FETCH_BUFS     6   /* ring buffers: copies run this many chunks ahead */
#define TIER_FETCH_USED_MIN 0.9 /* copy ahead when a batch is expected to use this share */
#define TIER_FETCH_TOK_MIN  10  /* ... and this many tokens a used expert (see below) */
#define TIER_CPU_Q8_START   32  /* the CPU lane's first share, 1/256 (balanced from there) */
#define TIER_CPU_Q8_STEP    4   /* balancing step a layer, 1/256 */
#define TIER_ALIGN(n)       (((n) + 255) & ~(size_t)255)

/* ---- setup ---- */

static tm_status tier_env_bool(const char *name, int *out) {
    const char *v = getenv(name);
    *out = -1;
    if (!v || !*v) return TM_OK;
    static const char *const yes[] = {"1", "true", "on", "yes"}, *const no[] = {"0", "false", "off",
                                                                                "no"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(v, yes[i])) *out = 1;
        if (!strcmp(v, no[i])) *out = 0;
    }
    if (*out < 0)
        return tm_error_set(TM_ERR_ARG, "%s: expected 1/0, true/false, on/off or yes/no, got '%s'",
                            name, v);
    return TM_OK;
}

/* TIERMOE_FETCH_RING=CxB (chunk experts x buffers) and
 * TIERMOE_FETCH_CPU_SHARE=F (a fixed share in [0, 1], no balancing). */
static tm_status tier_fetch_env(tm_tier *t, int32_t *chunk, int32_t *bufs) {
    const char *r = getenv("TIERMOE_FETCH_RING"), *c = getenv("TIERMOE_FETCH_CPU_SHARE");
    if (r && *r) {
        char *end = NULL;
        const long a = strtol(r, &end, 10);
        const long b = end && *end == 'x' ? strtol(end + 1, &end, 10) : 0;
        if (!end || *end || a < 1 || a > 4096 || b < 2 || b > 64)
            return tm_error_set(TM_ERR_ARG,
                                "TIERMOE_FETCH_RING: expected CHUNKxBUFFERS (1..4096 experts a "
                                "buffer, 2..64 buffers), got '%s'",
                                r);
        *chunk = (int32_t)a, *bufs = (int32_t)b;
    }
    if (c && *c) {
        char *end = NULL;
        const double f = strtod(c, &end);
        if (!end || *end || !(f >= 0 && f <= 1))
            return tm_error_set(TM_ERR_ARG,
                                "TIERMOE_FETCH_CPU_SHARE: expected a number in [0, 1], "
                                "got '%s'",
                                c);
        t->cpu_q8 = (int32_t)lround(f * 256), t->cpu_q8_fixed = true;
    }
    return TM_OK;
}

/* The ring: buffers, events, the copy stream, the plan's arrays. A failed
 * allocation costs the ring only (the in-place GEMM still serves). */
static tm_status tier_ring_create(tm_tier *t, int32_t chunk, int32_t bufs) {
    tier_fetch *f = calloc(1, sizeof(*f));
    if (!f) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    t->fetch = f;
    if (chunk > (int32_t)t->n_expert) chunk = (int32_t)t->n_expert;
    f->chunk_cap = chunk, f->n_bufs = bufs;
    size_t gate = 0, up = 0, down = 0; /* the largest expert of each matrix */
    for (uint32_t l = 0; l < t->n_layer; l++) {
        const tier_layer *L = &t->layers[l];
        if (!tier_ring_layer(t, L)) continue;
        if (L->host.gate.expert_stride > gate) gate = L->host.gate.expert_stride;
        if (L->host.up.expert_stride > up) up = L->host.up.expert_stride;
        if (L->host.down.expert_stride > down) down = L->host.down.expert_stride;
    }
    f->off_up = TIER_ALIGN((size_t)chunk * gate);
    f->off_down = f->off_up + TIER_ALIGN((size_t)chunk * up);
    f->buf_bytes = f->off_down + TIER_ALIGN((size_t)chunk * down);
    const int32_t per_layer = (int32_t)((t->n_expert + (uint32_t)chunk - 1) / (uint32_t)chunk);
    f->cap_chunks = (int64_t)per_layer * t->n_layer;
    const int64_t n_items = exec_n_batch(t->e) * t->k;
    if (!(f->ready = calloc((size_t)bufs, sizeof(tm_cuda_event))) ||
        !(f->freed = calloc((size_t)bufs, sizeof(tm_cuda_event))) ||
        !(f->list = malloc((size_t)t->n_layer * t->n_expert * sizeof(int32_t))) ||
        !(f->n_list = malloc(t->n_layer * sizeof(int32_t))) ||
        !(f->first_chunk = malloc(t->n_layer * sizeof(int32_t))) ||
        !(f->chunks = calloc((size_t)f->cap_chunks, sizeof(tier_chunk))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < t->n_layer; l++) f->n_list[l] = -1;
    f->seq = (uint32_t)-1;
    tm_status st = exec_dev_alloc(t->e, (size_t)bufs * f->buf_bytes, (void **)&f->ring);
    if (st != TM_OK) {
        tm_log_warn("--moe-fetch: no VRAM for the fetch ring (%.1f MiB: %s); prompts read experts "
                    "in RAM over PCIe in place",
                    (double)bufs * f->buf_bytes / 1048576.0, tm_error_message());
        f->ring = NULL;
        return TM_OK;
    }
    if ((st = cuda_host_alloc((size_t)n_items * sizeof(tm_cuda_moe_item),
                              (void **)&f->items_host)) ||
        (st = exec_dev_alloc(t->e, (size_t)n_items * sizeof(tm_cuda_moe_item),
                             (void **)&f->items_dev)))
        return st;
    for (int32_t b = 0; b < bufs && st == TM_OK; b++)
        if (!(st = cuda_event_create(&f->ready[b]))) st = cuda_event_create(&f->freed[b]);
    if (st == TM_OK && exec_profiling(t->e)) {
        f->n_prof = bufs + per_layer + 1;
        if (!(f->prof = calloc(4 * (size_t)f->n_prof, sizeof(tm_cuda_event))))
            return tm_error_set(TM_ERR_NOMEM, "out of memory");
        for (int32_t i = 0; i < 4 * f->n_prof && st == TM_OK; i++)
            st = cuda_event_create(&f->prof[i]);
    }
    return st;
}

tm_status tier_fetch_create(tm_tier *t, const tm_tier_params *p) {
    t->fetch_mode = p->fetch, t->cpu_q8 = TIER_CPU_Q8_START;
    int enable;
    int32_t chunk = TIER_FETCH_CHUNK, bufs = TIER_FETCH_BUFS;
    tm_status st = tier_env_bool("TIERMOE_POSTFETCH_ENABLE", &enable);
    if (st == TM_OK) st = tier_fetch_env(t, &chunk, &bufs);
    if (st != TM_OK) return st;
    if (enable == 0) t->fetch_mode = TM_MOE_FETCH_OFF;
    if (!(t->lane_of = malloc(t->n_expert * sizeof(int32_t))) ||
        !(t->cold_mark = malloc(t->n_expert)) ||
        !(t->by_count = malloc(t->n_expert * sizeof(*t->by_count))))
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    bool pinned = false;
    for (uint32_t l = 0; l < t->n_layer; l++) pinned |= tier_ring_layer(t, &t->layers[l]);
    if (!t->gpu || !pinned || t->fetch_mode == TM_MOE_FETCH_OFF) {
        t->fetch_mode = TM_MOE_FETCH_OFF;
        return TM_OK;
    }
    if (t->fetch_mode == TM_MOE_FETCH_PCIE) return TM_OK;
    if ((st = tier_ring_create(t, chunk, bufs)) != TM_OK) return st;
    if (t->fetch->ring && t->store_pin)
        tm_log_info("--moe-fetch: prompts copy their routed experts from the RAM cache into a "
                    "VRAM ring of %d x %d experts (%.1f MiB)",
                    bufs, t->fetch->chunk_cap, (double)bufs * t->fetch->buf_bytes / 1048576.0);
    else if (t->fetch->ring)
        tm_log_info("--moe-fetch: prompts copy experts in RAM into a VRAM ring of %d x %d experts "
                    "(%.1f MiB) ahead of routing; the CPU lane takes %s",
                    bufs, t->fetch->chunk_cap, (double)bufs * t->fetch->buf_bytes / 1048576.0,
                    t->cpu_q8_fixed ? "a fixed share"
                    : t->calib      ? "the share this machine's calibration sets"
                                    : "none of them (no calibration profile)");
    return TM_OK;
}

tm_status tier_fetch_ring_add(tm_tier *t, const tier_fetch *like) {
    return tier_ring_create(t, like->chunk_cap, like->n_bufs);
}

void tier_fetch_free(tm_tier *t) {
    free(t->lane_of), free(t->cold_mark), free(t->by_count);
    tier_fetch_ring_free(t->fetch);
}

void tier_fetch_ring_free(tier_fetch *f) {
    if (!f) return;
    for (int32_t b = 0; f->ready && b < f->n_bufs; b++) cuda_event_free(f->ready[b]);
    for (int32_t b = 0; f->freed && b < f->n_bufs; b++) cuda_event_free(f->freed[b]);
    for (int32_t i = 0; f->prof && i < 4 * f->n_prof; i++) cuda_event_free(f->prof[i]);
    cuda_host_free(f->items_host);
    free(f->ready), free(f->freed), free(f->prof), free(f->list), free(f->n_list);
    free(f->first_chunk), free(f->chunks), free(f);
}

size_t tier_fetch_bytes(const tm_tier *t) {
    return t->fetch && t->fetch->ring ? (size_t)t->fetch->n_bufs * t->fetch->buf_bytes : 0;
}

double tier_prompt_cpu_share(const tm_tier *t) {
    return t->cpu_q8 / 256.0;
}

tier_prompt_mode tier_prompt_mode_of(const tm_tier *t, const tier_layer *L, int64_t n_tok) {
    if (t->fetch_mode == TM_MOE_FETCH_OFF || !tier_ring_layer(t, L) || L->cls == TM_TIER_VRAM)
        return TIER_PROMPT_CPU;
    const bool ring = t->fetch && t->fetch->ring;
    if (t->store_pin) { /* only the routed experts are read and copied, so the tokens an
                           expert has decide (the same threshold as copies from the file) */
        if (!ring) return TIER_PROMPT_CPU;
        if (t->fetch_mode == TM_MOE_FETCH_COPY) return TIER_PROMPT_STORE;
        return (double)n_tok * t->k / t->n_expert >= TIER_FETCH_TOK_MIN ? TIER_PROMPT_STORE
                                                                        : TIER_PROMPT_CPU;
    }
    if (t->fetch_mode == TM_MOE_FETCH_PCIE || !ring) return TIER_PROMPT_PCIE;
    if (t->fetch_mode == TM_MOE_FETCH_COPY) return TIER_PROMPT_FETCH;
    /* experts used against experts in total: copying all ahead wastes little
     * only when nearly all are used; and with few tokens an expert, reading the
     * routed ones in place while the CPU lane computes a share beats copying
     * (H100 machine, 30b-a3b, --cpu-moe: pp40 197 t/s in place against 125
     * copied, pp128 434 against 400, pp512 847 against 1,580) */
    const double used = 1 - pow(1 - (double)t->k / t->n_expert, (double)n_tok);
    const double per_expert = (double)n_tok * t->k / ((double)t->n_expert * used);
    return used >= TIER_FETCH_USED_MIN && per_expert >= TIER_FETCH_TOK_MIN ? TIER_PROMPT_FETCH
                                                                           : TIER_PROMPT_PCIE;
}

/* ---- the worklist by lane ---- */

void tier_worklist_partition(tm_moe_worklist *wl, const int32_t *lane_of, tm_moe_slot *tmp,
                             int64_t counts[3]) {
    counts[0] = counts[1] = counts[2] = 0;
    for (int64_t i = 0; i < wl->n_slots; i++) counts[lane_of[wl->slots[i].expert]]++;
    int64_t at[3] = {0, counts[0], counts[0] + counts[1]};
    for (int64_t i = 0; i < wl->n_slots; i++)
        tmp[at[lane_of[wl->slots[i].expert]]++] = wl->slots[i];
    memcpy(wl->slots, tmp, (size_t)wl->n_slots * sizeof(*tmp));
}

static bool tier_is_cold(const tier_layer *L, int32_t e) {
    return L->cls == TM_TIER_RAM || L->slot_of[e] < 0;
}

/* The n least seen of the cold experts of L (ties: the higher id) get
 * cold_mark 1; used when copying ahead, before the routing is known. */
static void tier_cpu_pick_seen(tm_tier *t, const tier_layer *L, int32_t n) {
    memset(t->cold_mark, 0, t->n_expert);
    for (int32_t i = 0; i < n; i++) {
        int32_t best = -1;
        for (int32_t e = (int32_t)t->n_expert - 1; e >= 0; e--)
            if (tier_is_cold(L, e) && !t->cold_mark[e] && (best < 0 || L->seen[e] < L->seen[best]))
                best = e;
        if (best < 0) return;
        t->cold_mark[best] = 1;
    }
}

/* ---- the ring ---- */

/* The CPU lane's share of a copied-ahead layer's cold experts, in 1/256:
 * TIERMOE_FETCH_CPU_SHARE's, else the one this machine's calibration
 * profile sets (calib_fetch_cpu_share_q8), else none (on the H100 machine a
 * balanced share slowed the step: 1,535 t/s against 1,588). */
static int32_t tier_fetch_cpu_q8(const tm_tier *t, const tier_layer *L) {
    if (t->cpu_q8_fixed) return t->cpu_q8;
    if (!t->calib) return 0;
    return calib_fetch_cpu_share_q8(t->calib, L->expert_bytes,
                                    (double)exec_n_tok(t->e) * t->k / t->n_expert);
}

static tm_status tier_fetch_plan(tm_tier *t, const tier_layer *L) {
    tier_fetch *f = t->fetch;
    const uint32_t l = L->index;
    int32_t n_cold = 0;
    for (int32_t e = 0; e < (int32_t)t->n_expert; e++) n_cold += tier_is_cold(L, e);
    const int32_t q8 = tier_fetch_cpu_q8(t, L);
    tier_cpu_pick_seen(t, L, (int32_t)((n_cold * q8 + 128) >> 8));
    int32_t *list = f->list + (size_t)l * t->n_expert, n = 0;
    for (int32_t e = 0; e < (int32_t)t->n_expert; e++)
        if (tier_is_cold(L, e) && !t->cold_mark[e]) list[n++] = e;
    f->n_list[l] = n, f->first_chunk[l] = (int32_t)f->n_chunks;
    for (int32_t i = 0; i < n; i += f->chunk_cap) {
        TM_ASSERT(f->n_chunks < f->cap_chunks); /* a layer is planned once a step */
        f->chunks[f->n_chunks++] =
            (tier_chunk){l, i, n - i < f->chunk_cap ? n - i : f->chunk_cap, false};
    }
    return TM_OK;
}

static uint8_t *tier_ring_buf(const tier_fetch *f, int64_t chunk) {
    return f->ring + (size_t)(chunk % f->n_bufs) * f->buf_bytes;
}

/* Queue chunk j's copies: per matrix, one copy per run of consecutive ids. */
static tm_status tier_chunk_copy(tm_tier *t, int64_t j) {
    tier_fetch *f = t->fetch;
    const tier_chunk *c = &f->chunks[j];
    const tier_layer *L = &t->layers[c->layer];
    const int32_t *ids = f->list + (size_t)c->layer * t->n_expert + c->first;
    uint8_t *buf = tier_ring_buf(f, j);
    const tm_moe_matrix *m[3] = {&L->host.gate, &L->host.up, &L->host.down};
    const size_t off[3] = {0, f->off_up, f->off_down};
    tm_status st = TM_OK;
    for (int p = 0; p < 3 && st == TM_OK; p++)
        for (int32_t i = 0; i < c->n && st == TM_OK;) {
            int32_t r = 1;
            while (i + r < c->n && ids[i + r] == ids[i] + r) r++;
            /* the run's rows: r - 1 strides and the last expert's slice (a fused view's
               stride spans the other view's rows too, which come along) */
            const size_t stride = m[p]->expert_stride;
            st = cuda_copy_async(buf + off[p] + (size_t)i * stride,
                                 m[p]->data + (size_t)ids[i] * stride,
                                 (size_t)(r - 1) * stride + tier_slice_bytes(&L->host, p), t->copy);
            i += r;
        }
    return st;
}

/* Queue the copies the ring has room for: chunk j once compute j - n_bufs
 * is queued. A copy that cannot be queued leaves its chunk to the CPU lane. */
static tm_status tier_fetch_pump(tm_tier *t) {
    tier_fetch *f = t->fetch;
    const bool prof = f->prof != NULL;
    while (f->n_copied < f->n_chunks && f->n_copied < f->n_computed + f->n_bufs) {
        const int64_t j = f->n_copied++;
        const int32_t b = (int32_t)(j % f->n_bufs), pi = prof ? (int32_t)(j % f->n_prof) : 0;
        tm_status st = cuda_stream_wait_event(t->copy, f->freed[b]);
        if (st == TM_OK && prof) st = cuda_event_record(f->prof[4 * pi], t->copy);
        if (st == TM_OK) st = tier_chunk_copy(t, j);
        if (st == TM_OK && prof) st = cuda_event_record(f->prof[4 * pi + 1], t->copy);
        if (st == TM_OK) st = cuda_event_record(f->ready[b], t->copy);
        if (st != TM_OK) {
            f->chunks[j].failed = true;
            if (!f->warned)
                tm_log_warn("fetch lane: a copy to VRAM could not be queued (%s); the CPU lane "
                            "computes those experts (counted as fallbacks)",
                            tm_error_message());
            f->warned = true;
        }
    }
    return TM_OK;
}

tm_status tier_fetch_begin(tm_tier *t, tier_layer *L) {
    tier_fetch *f = t->fetch;
    const uint32_t seq = exec_step_seq(t->e);
    if (f->seq != seq) { /* a new step: a new plan */
        for (uint32_t l = 0; l < t->n_layer; l++) f->n_list[l] = -1;
        f->n_chunks = f->n_copied = f->n_computed = 0, f->seq = seq;
    }
    tm_status st = f->n_list[L->index] < 0 ? tier_fetch_plan(t, L) : TM_OK;
    return st == TM_OK ? tier_fetch_pump(t) : st;
}

tm_status tier_fetch_plan_next(tm_tier *t, int64_t next) {
    if (next < 0 || next >= (int64_t)t->n_layer) return TM_OK;
    const tier_layer *N = &t->layers[next];
    if (t->n_bufs > 1 && N->gpu_index != t->bufs_gpu) /* another GPU's ring: planned at its */
        return TM_OK;                                 /* own step */
    if (t->fetch->n_list[next] >= 0 ||
        tier_prompt_mode_of(t, N, exec_n_tok(t->e)) != TIER_PROMPT_FETCH)
        return TM_OK;
    tm_status st = tier_fetch_plan(t, N);
    return st == TM_OK ? tier_fetch_pump(t) : st;
}

/* ---- lanes ---- */

static int tier_count_cmp(const void *a, const void *b) {
    const int64_t *x = a, *y = b; /* {tokens, id} */
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

void tier_prompt_lanes(tm_tier *t, tier_layer *L, tier_prompt_mode mode,
                       const tm_moe_worklist *wl) {
    const int32_t E = (int32_t)t->n_expert;
    const int32_t cold = mode == TIER_PROMPT_STORE ? TIER_LANE_GPU : TIER_LANE_CPU;
    for (int32_t e = 0; e < E; e++) t->lane_of[e] = tier_is_cold(L, e) ? cold : TIER_LANE_HOT;
    if (mode == TIER_PROMPT_FETCH) {
        const tier_fetch *f = t->fetch;
        const int32_t *list = f->list + (size_t)L->index * t->n_expert;
        for (int64_t j = f->first_chunk[L->index];
             j < f->n_chunks && f->chunks[j].layer == L->index; j++) {
            const tier_chunk *c = &f->chunks[j];
            for (int32_t i = c->first; i < c->first + c->n; i++) {
                t->lane_of[list[i]] = c->failed ? TIER_LANE_CPU : TIER_LANE_GPU;
                if (c->failed)
                    t->stats[L->cls].fallback_slots +=
                        (uint64_t)(wl->expert_begin[list[i] + 1] - wl->expert_begin[list[i]]);
            }
        }
        return;
    }
    if (mode != TIER_PROMPT_PCIE) return;
    /* routed cold experts by tokens: the CPU lane takes its share of the
     * fewest-token ones (cheapest for it, while a read costs the GPU the same) */
    int64_t(*by)[2] = t->by_count;
    int32_t n = 0;
    for (int32_t e = 0; e < E; e++) {
        const int64_t c = wl->expert_begin[e + 1] - wl->expert_begin[e];
        if (c && tier_is_cold(L, e)) by[n][0] = c, by[n][1] = e, n++;
    }
    qsort(by, (size_t)n, sizeof(*by), tier_count_cmp);
    const int32_t n_cpu = (n * t->cpu_q8 + 128) >> 8;
    for (int32_t i = n_cpu; i < n; i++) t->lane_of[by[i][1]] = TIER_LANE_GPU;
}

/* ---- the GPU's part ---- */

static uint64_t tier_ev_ns(tm_cuda_event a, tm_cuda_event b) {
    float ms = 0;
    return cuda_event_elapsed(a, b, &ms) == TM_OK ? (uint64_t)(ms * 1e6) : 0;
}

int32_t tier_groups(tm_tier *t, const tm_cuda_moe_item *items, const tm_moe_slot *sl, int64_t a,
                    int64_t b) {
    int32_t n = 0;
    for (int64_t i = a; i < b; i++)
        if (i == a || sl[i].expert != sl[i - 1].expert) {
            t->group_slots[n] = items[i].slot;
            t->group_starts[n++] = i;
        }
    t->group_starts[n] = b;
    return n;
}

tm_cuda_moe_params tier_ring_params(const tm_tier *t, const tier_layer *L, uint8_t *buf,
                                    int32_t n_slots) {
    const tier_fetch *f = t->fetch;
    const tm_moe_experts *h = &L->host;
    return (tm_cuda_moe_params){
        .n_embd = t->n_embd,
        .n_ff = t->n_ff,
        .n_slots = n_slots,
        .gate = {buf, h->gate.type, h->gate.expert_stride, h->gate.row_bytes},
        .up = {buf + f->off_up, h->up.type, h->up.expert_stride, h->up.row_bytes},
        .down = {buf + f->off_down, h->down.type, h->down.expert_stride, h->down.row_bytes},
        .ext = L->ext,
        .streamed = true,
    };
}

static tm_status tier_gemm(tm_tier *t, const tm_cuda_moe_params *p, int32_t n_groups,
                           const tm_cuda_moe_item *items_dev, const float *h, float *y) {
    const tm_cuda_moe_groups g = {n_groups, t->group_slots, t->group_starts, items_dev};
    return cuda_moe_grouped_gemm(exec_blas(t->e), p, &g, h, exec_n_tok(t->e), y, t->gemm_scratch,
                                 exec_stream(t->e));
}

static tm_status tier_fetch_run(tm_tier *t, tier_layer *L, const tm_moe_slot *sl, int64_t n,
                                const float *h, float *y) {
    tier_fetch *f = t->fetch;
    const tm_cuda_stream s = exec_stream(t->e);
    const bool prof = f->prof != NULL;
    tm_tier_stats *ts = &t->stats[L->cls];
    int32_t *pos = t->lane_of; /* the lanes are in the slots now: reuse as expert -> index */
    const int32_t *list = f->list + (size_t)L->index * t->n_expert;
    for (int32_t i = 0; i < f->n_list[L->index]; i++) pos[list[i]] = i;
    tm_status st = TM_OK;
    for (int64_t i = 0; i < n; i++) {
        const int32_t p = pos[sl[i].expert];
        f->items_host[i] =
            (tm_cuda_moe_item){p % f->chunk_cap, sl[i].token, sl[i].weight, sl[i].expert};
    }
    if (n &&
        (st = cuda_copy_async(f->items_dev, f->items_host, (size_t)n * sizeof(*f->items_host), s)))
        return st;
    int64_t a = 0;
    for (int64_t j = f->first_chunk[L->index]; j < f->n_chunks && f->chunks[j].layer == L->index;
         j++) {
        const tier_chunk *c = &f->chunks[j];
        TM_ASSERT(f->n_computed == j); /* chunks are computed in the order they were copied */
        if ((st = tier_fetch_pump(t))) return st;
        const int32_t b = (int32_t)(j % f->n_bufs), pi = prof ? (int32_t)(j % f->n_prof) : 0;
        int64_t e_ = a;
        while (e_ < n && pos[sl[e_].expert] < c->first + c->n) e_++;
        if (!c->failed) {
            if ((prof && (st = cuda_event_record(f->prof[4 * pi + 2], s))) ||
                (st = cuda_stream_wait_event(s, f->ready[b])) ||
                (prof && (st = cuda_event_record(f->prof[4 * pi + 3], s))))
                return st;
            const tm_cuda_moe_params p = tier_ring_params(t, L, tier_ring_buf(f, j), c->n);
            const int32_t n_groups = tier_groups(t, f->items_host, sl, a, e_);
            if (n_groups && (st = tier_gemm(t, &p, n_groups, f->items_dev, h, y))) return st;
            ts->fetch_experts += (uint64_t)c->n;
            ts->fetch_bytes += (uint64_t)c->n * L->expert_bytes;
        }
        if ((st = cuda_event_record(f->freed[b], s))) return st;
        f->n_computed++;
        a = e_;
    }
    if ((st = tier_fetch_pump(t))) return st;
    if (!prof) return TM_OK;
    /* --profile: the step syncs after each layer, so the layer's events have run */
    if ((st = exec_sync(t->e))) return st;
    for (int64_t j = f->first_chunk[L->index]; j < f->n_chunks && f->chunks[j].layer == L->index;
         j++) {
        if (f->chunks[j].failed) continue;
        const int32_t pi = (int32_t)(j % f->n_prof);
        ts->copy_ns += tier_ev_ns(f->prof[4 * pi], f->prof[4 * pi + 1]);
        ts->copy_wait_ns += tier_ev_ns(f->prof[4 * pi + 2], f->prof[4 * pi + 3]);
    }
    return TM_OK;
}

/* ---- copies from the store (--ram-cache) ---- */

/* A store run's GPU sink: each chunk's experts are copied from the store's
 * pinned slots into the next ring buffer on the copy stream, and the grouped
 * GEMM computes the chunk's slots from there. The store evicts a slot only
 * after settle, which waits for the copies queued so far. */
typedef struct tier_store_gpu {
    tm_tier *t;
    tier_layer *L;
    const tm_moe_slot *sl; /* the run's slots: the worklist's from s0 */
    int64_t s0;
    const float *h;
    float *y;
    int64_t unread; /* --profile: the first chunk whose events are not counted yet */
} tier_store_gpu;

static tm_status tier_store_chunk(void *ud, const tm_moe_experts *ex, int64_t a, int64_t b) {
    tier_store_gpu *g = ud;
    tm_tier *t = g->t;
    tier_fetch *f = t->fetch;
    const tier_layer *L = g->L;
    const tm_moe_slot *sl = g->sl;
    const tm_cuda_stream s = exec_stream(t->e);
    a -= g->s0, b -= g->s0; /* the run's slots, like the items */
    const int64_t j = t->n_stored++;
    const int32_t bi = (int32_t)(j % f->n_bufs);
    tm_cuda_event *ev = f->prof ? f->prof + 4 * (j % f->n_prof) : NULL; /* settle reads them */
    uint8_t *buf = tier_ring_buf(f, j);
    const tm_moe_matrix *m[3] = {&ex->gate, &ex->up, &ex->down};
    const size_t off[3] = {0, f->off_up, f->off_down};
    tm_status st = cuda_stream_wait_event(t->copy, f->freed[bi]);
    if (st == TM_OK && ev) st = cuda_event_record(ev[0], t->copy);
    /* the chunk's experts, one a run, each into the next position of the buffer */
    int32_t n = -1;
    for (int64_t i = a; i < b && st == TM_OK; i++) {
        const int32_t e = sl[i].expert;
        if (i == a || e != sl[i - 1].expert) {
            n++;
            TM_ASSERT(n < f->chunk_cap); /* the sink's max_experts */
            for (int p = 0; p < 3 && st == TM_OK; p++)
                st = cuda_copy_async(buf + off[p] + (size_t)n * m[p]->expert_stride,
                                     m[p]->expert_at[e], tier_slice_bytes(ex, p), t->copy);
        }
        f->items_host[i] = (tm_cuda_moe_item){n, sl[i].token, sl[i].weight, e};
    }
    if (st == TM_OK && ev) st = cuda_event_record(ev[1], t->copy);
    if (st == TM_OK) st = cuda_event_record(f->ready[bi], t->copy);
    if (st == TM_OK)
        st = cuda_copy_async(f->items_dev + a, f->items_host + a,
                             (size_t)(b - a) * sizeof(*f->items_host), s);
    if (st == TM_OK && ev) st = cuda_event_record(ev[2], s);
    if (st == TM_OK) st = cuda_stream_wait_event(s, f->ready[bi]);
    if (st == TM_OK && ev) st = cuda_event_record(ev[3], s);
    if (st == TM_OK) {
        const tm_cuda_moe_params p = tier_ring_params(t, L, buf, n + 1);
        const int32_t n_groups = tier_groups(t, f->items_host, sl, a, b);
        st = tier_gemm(t, &p, n_groups, f->items_dev, g->h, g->y);
    }
    if (st == TM_OK) st = cuda_event_record(f->freed[bi], s);
    if (st != TM_OK)
        return tm_error_wrap(st, "layer %u, copying experts from the RAM cache: ", L->index);
    tm_tier_stats *ts = &t->stats[L->cls];
    ts->fetch_experts += (uint64_t)(n + 1);
    ts->fetch_bytes += (uint64_t)(n + 1) * L->expert_bytes;
    return TM_OK;
}

/* The copies queued so far are done; --profile: their times counted (at most
 * the two chunks since the last settle, fewer than the profile's events). */
static tm_status tier_store_settle(void *ud) {
    tier_store_gpu *g = ud;
    tm_tier *t = g->t;
    const tier_fetch *f = t->fetch;
    tm_status st = cuda_stream_sync(t->copy);
    tm_tier_stats *ts = &t->stats[g->L->cls];
    for (; st == TM_OK && f->prof && g->unread < t->n_stored; g->unread++) {
        const tm_cuda_event *ev = f->prof + 4 * (g->unread % f->n_prof);
        ts->copy_ns += tier_ev_ns(ev[0], ev[1]);
        ts->copy_wait_ns += tier_ev_ns(ev[2], ev[3]); /* waits for the compute stream there */
    }
    return st;
}

/* y += slots sl[0, n) (the worklist's from s0: cold, expert-major) of layer
 * L, their experts read into the store as the chunks come and copied from it. */
static tm_status tier_store_run(tm_tier *t, tier_layer *L, const tm_moe_slot *sl, int64_t n,
                                const float *h, float *y) {
    const int64_t s0 = sl - t->wl.slots;
    tier_store_gpu g = {t, L, sl, s0, h, y, t->n_stored};
    const tm_store_sink k = {.run = tier_store_chunk,
                             .settle = tier_store_settle,
                             .max_experts = t->fetch->chunk_cap,
                             .ud = &g};
    return store_run(t->store, L->index, exec_pool(t->e), &t->wl, s0, s0 + n, NULL, &k);
}

tm_status tier_prompt_gpu(tm_tier *t, tier_layer *L, tier_prompt_mode mode, const tm_moe_slot *sl,
                          int64_t n, const float *h, float *y) {
    tm_tier_stats *ts = &t->stats[L->cls];
    const bool prof = tier_profiling(t);
    const tm_cuda_stream s = exec_stream(t->e);
    ts->fetch_slots += (uint64_t)n;
    tm_status st;
    if (prof && (st = cuda_event_record(t->ev[4], s))) return st;
    if (mode == TIER_PROMPT_FETCH) {
        st = tier_fetch_run(t, L, sl, n, h, y);
    } else if (mode == TIER_PROMPT_STORE) {
        st = n ? tier_store_run(t, L, sl, n, h, y) : TM_OK;
    } else { /* in place, slot = expert id, over the pinned file pages; the items go
                after the hot lane's in the same buffers */
        tm_cuda_moe_item *items = t->items_host + (t->wl.n_slots - n);
        tm_cuda_moe_item *dev = t->items_dev + (t->wl.n_slots - n);
        for (int64_t i = 0; i < n; i++)
            items[i] = (tm_cuda_moe_item){sl[i].expert, sl[i].token, sl[i].weight, sl[i].expert};
        const int32_t n_groups = tier_groups(t, items, sl, 0, n);
        ts->fetch_experts += (uint64_t)n_groups;
        ts->fetch_bytes += (uint64_t)n_groups * L->expert_bytes;
        st = n ? cuda_copy_async(dev, items, (size_t)n * sizeof(*items), s) : TM_OK;
        if (st == TM_OK && n_groups) st = tier_gemm(t, &L->pcie, n_groups, dev, h, y);
        if (st == TM_OK) st = cuda_event_record(t->pcie_done, s);
    }
    if (st != TM_OK || !prof) return st;
    if ((st = cuda_event_record(t->ev[5], s)) || (st = exec_sync(t->e))) return st;
    ts->fetch_ns += tier_ev_ns(t->ev[4], t->ev[5]);
    return TM_OK;
}

tm_status tier_prompt_balance(tm_tier *t, tier_prompt_mode mode) {
    if (t->cpu_q8_fixed || mode != TIER_PROMPT_PCIE) return TM_OK;
    /* the GPU's in-place reads of this layer still running: the CPU lane was
     * the faster, give it more */
    bool done = true;
    tm_status st = cuda_event_query(t->pcie_done, &done);
    if (st != TM_OK) return st;
    t->cpu_q8 += done ? -TIER_CPU_Q8_STEP : TIER_CPU_Q8_STEP;
    if (t->cpu_q8 < 0) t->cpu_q8 = 0;
    if (t->cpu_q8 > 256) t->cpu_q8 = 256;
    return TM_OK;
}
