/* The tier's setup: each layer's class and hot experts, the --moe-cache VRAM
 * slots (sized, ranked, uploaded; writable between steps), the hand-off
 * mailbox and the scratch of the lanes. The step itself is tier_step.c. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/timing.h"
#include "tier/calib.h"
#include "tier/tier_internal.h"
#include "trace/trace.h"

#define TIER_TIMEOUT_MS   30000 /* TIERMOE_HANDOFF_TIMEOUT_MS */
#define TIER_AHEAD_CACHED 1     /* --moe-ahead auto with a cache */

const char *const tm_tier_class_names[TM_TIER_CLASS_COUNT] = {"experts in VRAM", "experts in RAM",
                                                              "RAM + VRAM cache"};

/* ---- pieces ---- */

/* A slot's lane: 0 the CPU, 1 the PCIe lane, 2 hot. Slots [i, j) are one
 * token's (token-major) or a run of an expert-major list (share_q8 0 there);
 * *limit is the PCIe lane's count for the run, *cold its cold slots so far. */
static int tier_slot_lane(const tm_moe_worklist *wl, int64_t i, const int32_t *slot_of,
                          int32_t n_mapped, int32_t share_q8, int64_t *run_end, int32_t *limit,
                          int32_t *cold) {
    const tm_moe_slot *s = wl->slots;
    if (i >= *run_end) { /* a new token: its cold slots decide the lane's share */
        int32_t n_cold = 0;
        for (*run_end = i; *run_end < wl->n_slots && s[*run_end].token == s[i].token; ++*run_end)
            n_cold += !slot_of || slot_of[s[*run_end].expert] < 0;
        *limit = tm_cuda_mapped_count(n_cold, n_mapped, share_q8), *cold = 0;
    }
    if (slot_of && slot_of[s[i].expert] >= 0) return 2;
    return (*cold)++ < *limit ? 1 : 0;
}

int64_t tier_worklist_split(tm_moe_worklist *wl, const int32_t *slot_of, int32_t n_mapped,
                            int32_t share_q8, tm_moe_slot *tmp, int64_t *n_pcie) {
    const int64_t n = wl->n_slots;
    *n_pcie = 0;
    if (!slot_of && n_mapped <= 0) return n;
    int64_t count[3] = {0, 0, 0}, end = 0;
    int32_t limit = 0, cold = 0;
    for (int64_t i = 0; i < n; i++)
        count[tier_slot_lane(wl, i, slot_of, n_mapped, share_q8, &end, &limit, &cold)]++;
    int64_t at[3] = {0, count[0], count[0] + count[1]};
    end = 0;
    for (int64_t i = 0; i < n; i++)
        tmp[at[tier_slot_lane(wl, i, slot_of, n_mapped, share_q8, &end, &limit, &cold)]++] =
            wl->slots[i];
    memcpy(wl->slots, tmp, (size_t)n * sizeof(*tmp));
    *n_pcie = count[1];
    return count[0];
}

void tier_worklist_group(tm_moe_worklist *wl, int64_t n) {
    tm_moe_slot *s = wl->slots;
    for (int64_t i = 1; i < n; i++) { /* insertion: a decode step's few cold slots */
        const tm_moe_slot x = s[i];
        int64_t j = i;
        for (; j > 0 && s[j - 1].expert > x.expert; j--) s[j] = s[j - 1];
        s[j] = x;
    }
    wl->expert_major = true;
}

size_t tier_gemm_scratch_bound(int64_t n_embd, int64_t n_ff, uint32_t n_expert, int64_t n_items) {
    const tm_cuda_moe_params probe = {.n_embd = n_embd, .n_ff = n_ff, .n_slots = (int32_t)n_expert};
    return cuda_moe_grouped_gemm_scratch_bytes(&probe, n_items, (int32_t)n_expert);
}

int32_t tier_pcie_slots(const tm_tier *t) {
    return t->n_pcie ? tm_cuda_mapped_count((int32_t)t->k, t->n_pcie, t->pcie_share_q8) : 0;
}

size_t tier_pcie_bytes(const tm_tier *t) {
    return t->pcie_pinned;
}

tm_tier_class tier_layer_class(const tm_tier *t, uint32_t layer) {
    return t->layers[layer].cls;
}

const tm_tier_stats *tier_stats(const tm_tier *t) {
    return t->stats;
}

const tm_tier_stats *tier_stats_gpu(const tm_tier *t, int *n) {
    *n = t->n_bufs;
    return t->stats_gpu;
}

int tier_layer_gpu(const tm_tier *t, uint32_t layer) {
    const tier_layer *L = layer < t->n_layer ? &t->layers[layer] : NULL;
    return L && L->moe && L->on_gpu ? L->gpu_index : -1;
}

const tm_moe_lane_stats *tier_lane_stats(const tm_tier *t) {
    return &t->lane_stats;
}

static tm_cuda_moe_matrix tier_gpu_matrix(const void *data, const tm_moe_matrix *m) {
    return (tm_cuda_moe_matrix){data, m->type, m->expert_stride, m->row_bytes};
}

/* The device copy of tensor w's view m: where m starts in w (the up rows of a fused
 * ffn_gate_up_exps start n_ff rows in), in w's copy; NULL when w has none. */
static const void *tier_view_dev(tm_exec *e, const tm_weight *w, const tm_moe_matrix *m) {
    const uint8_t *d = exec_weight_dev(e, w);
    return d ? d + (m->data - w->data) : NULL;
}

/* ---- the PCIe lane: cold experts the GPU reads in place from RAM ---- */

/* The PCIe lane's share of each token's cold slots when TM_MOE_PCIE_AUTO, in
 * 1/256: measured on the H100 machine with both lanes running, the PCIe lane
 * reads ~39 GB/s and the CPU lane ~78 GB/s (Qwen3-30B-A3B --cpu-moe decode),
 * so the GPU's share is a third of the cold slots (tm_cuda_mapped_count: 2 of
 * 8 or 6, 1 of 3, none of 2). A calibration profile of this machine replaces
 * it (tier_pcie_share). */
#define TIER_PCIE_SHARE_Q8 85

/* This machine's calibration profile for these experts, kept in t->calib:
 * the saved one ($TIERMOE_CALIB, else the cache directory; `tiermoe
 * calibrate`), else a quick measurement (calib_load_or_measure: a fraction of
 * a second, kept for the process). TIERMOE_CALIB=none: neither (the built-in
 * constants; tests and comparisons). A failed measurement leaves none. */
static void tier_calib_load(tm_tier *t) {
    const char *env = getenv("TIERMOE_CALIB");
    if (env && !strcmp(env, "none")) return;
    tm_moe_experts *ex = malloc(t->n_layer * sizeof(*ex));
    tm_calib *c = malloc(sizeof(*c));
    if (!ex || !c) {
        free(ex), free(c);
        return;
    }
    uint32_t n = 0; /* the layers with experts */
    for (uint32_t l = 0; l < t->n_layer; l++)
        if (t->layers[l].moe) ex[n++] = t->layers[l].host;
    const tm_calib_source src = {
        exec_pool(t->e), exec_gpu(t->e), exec_blas(t->e), ex, n, t->n_expert, t->k};
    if (calib_load_or_measure(&src, NULL, c, NULL) == TM_OK)
        t->calib = c, c = NULL;
    else
        tm_log_warn("calibration: %s; the lanes' shares use the built-in constants",
                    tm_error_message());
    free(ex), free(c);
}

/* The auto share of the PCIe lane: from the calibration profile when there
 * is one, else the H100 machine's constant. */
static int32_t tier_pcie_share(const tm_tier *t) {
    return t->calib ? calib_pcie_share_q8(t->calib) : TIER_PCIE_SHARE_Q8;
}

typedef struct tier_span {
    uintptr_t begin, end;
} tier_span;

static int tier_span_cmp(const void *a, const void *b) {
    const tier_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The device address of host address p inside a registered span. */
static const void *tier_pin_dev(const tm_tier *t, const void *p) {
    for (int i = 0; i < t->n_pins; i++) {
        const uintptr_t off = (uintptr_t)p - (uintptr_t)t->pin_host[i];
        if ((uintptr_t)p >= (uintptr_t)t->pin_host[i] && off < t->pin_bytes[i])
            return (const uint8_t *)t->pin_dev[i] + off;
    }
    return NULL;
}

static void tier_pcie_unpin(tm_tier *t) {
    for (int i = 0; i < t->n_pins; i++) cuda_host_unregister(t->pin_host[i]);
    free(t->pin_host), free(t->pin_dev), free(t->pin_bytes);
    t->pin_host = t->pin_dev = NULL, t->pin_bytes = NULL, t->n_pins = 0, t->pcie_pinned = 0;
}

/* Pin the RAM experts' pages of the mapped file, page-aligned spans merged
 * (registrations may not overlap), and map them for the GPU. */
static tm_status tier_pcie_pin(tm_tier *t, const bool *lane) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    tier_span *s = malloc(3 * (size_t)t->n_layer * sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    int n = 0;
    for (uint32_t l = 0; l < t->n_layer; l++) {
        const tier_layer *L = &t->layers[l];
        if (!lane[l]) continue;
        const tm_moe_matrix *m[3] = {&L->host.gate, &L->host.up, &L->host.down};
        const int64_t rows[3] = {L->host.n_ff, L->host.n_ff, L->host.n_embd};
        for (int p = 0; p < 3; p++) {
            /* the view's own bytes: a fused gate_up's up view ends with the tensor,
               not an expert stride past its first row */
            const uintptr_t b = (uintptr_t)m[p]->data;
            const uintptr_t e =
                b + m[p]->expert_stride * (t->n_expert - 1) + (uintptr_t)rows[p] * m[p]->row_bytes;
            s[n++] = (tier_span){b & ~(page - 1), (e + page - 1) & ~(page - 1)};
        }
    }
    qsort(s, (size_t)n, sizeof(*s), tier_span_cmp);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && s[i].begin <= s[m - 1].end) {
            if (s[i].end > s[m - 1].end) s[m - 1].end = s[i].end;
        } else {
            s[m++] = s[i];
        }
    }
    tm_status st = TM_OK;
    if (!(t->pin_host = calloc((size_t)m, sizeof(void *))) ||
        !(t->pin_dev = calloc((size_t)m, sizeof(void *))) ||
        !(t->pin_bytes = calloc((size_t)m, sizeof(size_t))))
        st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m && st == TM_OK; i++) {
        const size_t bytes = s[i].end - s[i].begin;
        st = cuda_host_register((void *)s[i].begin, bytes, true, &t->pin_dev[i]);
        if (st == TM_OK) {
            t->pin_host[i] = (void *)s[i].begin, t->pin_bytes[i] = bytes;
            t->n_pins++, t->pcie_pinned += bytes;
        }
    }
    free(s);
    return st;
}

/* The lane's share, its pinned experts, its work list and the RAM layers'
 * all-cold slot map, for the layers with experts in RAM whose routing is on
 * the GPU (the decode hand-off's layers). A host that cannot pin loses the
 * lane, with one line. */
static tm_status tier_pcie_create(tm_tier *t, const tm_placement *pl, const tm_tier_params *p) {
    const bool ahead = p->ahead > 0; /* copies ahead read the pinned pages too */
    if (!t->gpu || t->store ||       /* the store replaces the mapping */
        (p->pcie == TM_MOE_PCIE_OFF && p->fetch == TM_MOE_FETCH_OFF && !ahead))
        return TM_OK;
    bool *lane = calloc(t->n_layer, sizeof(bool)), any = false;
    if (!lane) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < t->n_layer; l++)
        any |= lane[l] =
            t->layers[l].moe && t->layers[l].cls != TM_TIER_VRAM && pl->layer_dev[l] == TM_DEV_GPU;
    const bool automatic = p->pcie == TM_MOE_PCIE_AUTO;
    int32_t n = p->pcie == TM_MOE_PCIE_OFF ? 0 : automatic ? (int32_t)t->k : p->pcie;
    if (n > (int32_t)t->k) n = (int32_t)t->k;
    /* the shares the profile sets: the decode lane's auto count, and copied-ahead
       prompts' CPU share (a fixed --moe-pcie N with --moe-fetch off|pcie uses none) */
    if (any && (automatic || p->fetch == TM_MOE_FETCH_AUTO || p->fetch == TM_MOE_FETCH_COPY))
        tier_calib_load(t);
    const int32_t share = automatic && any ? tier_pcie_share(t) : 0;
    if (automatic && (!share || !tm_cuda_mapped_count((int32_t)t->k, n, share))) n = 0;
    /* prompts' fetch lane copies from the same pinned pages the decode lane reads */
    if (!any || (n <= 0 && p->fetch == TM_MOE_FETCH_OFF && !ahead)) {
        free(lane);
        return TM_OK;
    }
    tm_status st = tier_pcie_pin(t, lane);
    if (st != TM_OK) {
        tm_log_warn("--moe-pcie / --moe-fetch: %s; the CPU computes every cold expert",
                    tm_error_message());
        tier_pcie_unpin(t);
        free(lane);
        return TM_OK;
    }
    if (n > 0 &&
        (st = exec_dev_alloc(t->e, (size_t)(TM_CUDA_MMVQ_MAX_TOK * t->k) * sizeof(tm_cuda_moe_item),
                             (void **)&t->pcie_items))) {
        free(lane);
        return st;
    }
    for (uint32_t l = 0; l < t->n_layer; l++) {
        tier_layer *L = &t->layers[l];
        if (!lane[l]) continue;
        L->pcie = (tm_cuda_moe_params){
            .n_embd = t->n_embd,
            .n_ff = t->n_ff,
            .n_slots = (int32_t)t->n_expert,
            .gate = tier_gpu_matrix(tier_pin_dev(t, L->host.gate.data), &L->host.gate),
            .up = tier_gpu_matrix(tier_pin_dev(t, L->host.up.data), &L->host.up),
            .down = tier_gpu_matrix(tier_pin_dev(t, L->host.down.data), &L->host.down),
            .ext = L->ext,
            .streamed = true,
        };
        L->n_pcie = n;
    }
    free(lane);
    t->n_pcie = n, t->pcie_share_q8 = automatic ? share : 0;
    if (n <= 0)
        tm_log_info("--moe-pcie off: %.2f GiB of experts pinned in %d spans for the lanes that "
                    "copy them",
                    t->pcie_pinned / 1073741824.0, t->n_pins);
    else if (automatic)
        tm_log_info("--moe-pcie: the GPU reads %.0f%% of each decode token's experts in RAM (%d "
                    "when all %u are) over PCIe (%s); %.2f GiB of experts pinned in %d spans",
                    100.0 * share / 256, tier_pcie_slots(t), t->k,
                    t->calib ? "this machine's calibration"
                             : "measured on the H100 machine; tiermoe calibrate measures this one",
                    t->pcie_pinned / 1073741824.0, t->n_pins);
    else
        tm_log_info("--moe-pcie: the GPU reads the first %d of each decode token's experts in RAM "
                    "over PCIe; %.2f GiB of experts pinned in %d spans",
                    n, t->pcie_pinned / 1073741824.0, t->n_pins);
    return TM_OK;
}

/* --ram-cache: the store for every layer whose experts are in RAM. Decode's
 * GPU lanes that read RAM experts in place or copy them ahead (--moe-pcie,
 * --moe-ahead) read the file's pinned mapping, which the store replaces:
 * they are turned off (one line), and the CPU lane computes decode's cold
 * experts from the store. Prompts' fetch lane copies the routed experts from
 * the store's slots, pinned for it (a host that cannot pin: the CPU lane). */
static tm_status tier_store_create(tm_tier *t, const tm_tier_layer *layers, tm_tier_params *q) {
    bool *in = calloc(t->n_layer, sizeof(bool)), any = false;
    tm_moe_experts *ex = calloc(t->n_layer, sizeof(*ex));
    tm_status st = TM_OK;
    if (!in || !ex) st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < t->n_layer && st == TM_OK; l++) {
        any |= in[l] = t->layers[l].moe && t->layers[l].cls != TM_TIER_VRAM;
        ex[l] = layers[l].experts;
        ex[l].sel_bias = t->layers[l].sel_bias; /* the prediction chooses as the router does */
    }
    if (st == TM_OK && !any)
        tm_log_info("--ram-cache: every layer's experts are in VRAM; no RAM cache");
    else if (st == TM_OK)
        st = store_create(&q->store, t->n_layer, ex, in, &t->router, &t->store);
    free(in), free(ex);
    if (st != TM_OK || !t->store) return st;
    if (t->gpu && (q->pcie != TM_MOE_PCIE_OFF || q->ahead > 0))
        tm_log_info("--ram-cache: decode's PCIe lane and copies ahead are off (they read the "
                    "file's mapping); the CPU lane computes decode's experts the VRAM does not "
                    "hold");
    q->pcie = TM_MOE_PCIE_OFF, q->ahead = TM_MOE_AHEAD_OFF;
    if (t->gpu && q->fetch == TM_MOE_FETCH_PCIE) {
        tm_log_info("--ram-cache: --moe-fetch pcie reads the file's mapping in place; prompts' "
                    "experts in RAM are computed by the CPU lane");
        q->fetch = TM_MOE_FETCH_OFF;
    }
    if (!t->gpu || q->fetch == TM_MOE_FETCH_OFF) return TM_OK;
    size_t bytes;
    void *mem = store_memory(t->store, &bytes), *dev;
    const uint64_t t0 = tm_time_ns();
    if (cuda_host_register(mem, bytes, false, &dev) != TM_OK) {
        tm_log_warn("--ram-cache: %s; prompts' experts in RAM are computed by the CPU lane",
                    tm_error_message());
        q->fetch = TM_MOE_FETCH_OFF;
        return TM_OK;
    }
    t->store_pin = mem;
    tm_log_info("--ram-cache: %.2f GiB pinned for prompts' copies to the GPU (%.1f s)",
                bytes / 1073741824.0, (tm_time_ns() - t0) * 1e-9);
    return TM_OK;
}

const tm_store_stats *tier_store_stats(const tm_tier *t) {
    return t->store ? store_stats(t->store) : NULL;
}

/* Mapped memory for decode hand-offs and the buffers of the prompt path. */
static tm_status tier_gpu_buffers(tm_tier *t, int64_t n_batch) {
    const int64_t T = TM_CUDA_MMVQ_MAX_TOK, E = t->n_embd, K = t->k;
    bool any_cold = false, any_hot = false;
    for (uint32_t l = 0; l < t->n_layer; l++) {
        if (!t->layers[l].moe) continue;
        any_cold |= t->layers[l].cls != TM_TIER_VRAM;
        any_hot |= t->layers[l].cls != TM_TIER_RAM || t->layers[l].pcie.n_slots > 0 ||
                   (t->store_pin && t->fetch && t->fetch->ring);
    }
    tm_status st;
    if (any_cold) {
        /* this GPU's (each GPU's over several): the router's count of the CPU's slots, and
           a RAM layer's slot map, all cold (the router counts them for the CPU, and the PCIe
           lane and the copies ahead take theirs) */
        const size_t map_bytes = t->n_expert * sizeof(int32_t);
        if ((st = exec_dev_alloc(t->e, (size_t)T * 4, (void **)&t->cpu_slots_dev)) ||
            (st = exec_dev_alloc(t->e, map_bytes, (void **)&t->cold_map_dev)) ||
            (st = cuda_fill_bytes(exec_gpu(t->e), t->cold_map_dev, 0xff, map_bytes)))
            return st;
    }
    if (any_cold && !t->mb_host_base) { /* one mailbox: mapped, portable, every GPU's */
        const size_t a[] = {(size_t)(T * E) * 4, (size_t)(T * K) * 4, (size_t)(T * K) * 4,
                            (size_t)t->n_expert * 4, (size_t)T * 4};
        size_t off[5], inbox = 0;
        for (int i = 0; i < 5; i++) off[i] = inbox, inbox += (a[i] + 63) & ~(size_t)63;
        const size_t flags = ((3 * (size_t)t->n_layer + 1) * 4 + 63) & ~(size_t)63;
        const size_t y = ((size_t)(T * E) * 4 + 63) & ~(size_t)63;
        const size_t total = flags + y + t->n_layer * inbox;
        void *dev;
        if (!(t->mb.in = calloc(t->n_layer, sizeof(tier_inbox))) ||
            !(t->mb_dev.in = calloc(t->n_layer, sizeof(tier_inbox))))
            return tm_error_set(TM_ERR_NOMEM, "out of memory");
        if ((st = cuda_host_alloc_mapped(total, &t->mb_host_base, &dev))) return st;
        memset(t->mb_host_base, 0, total);
        tier_mailbox *mbs[2] = {&t->mb, &t->mb_dev};
        uint8_t *bases[2] = {t->mb_host_base, dev};
        for (int i = 0; i < 2; i++) {
            uint8_t *b = bases[i];
            mbs[i]->flag_h = (uint32_t *)b;
            mbs[i]->flag_y = mbs[i]->flag_h + t->n_layer;
            mbs[i]->err = mbs[i]->flag_y + t->n_layer;
            mbs[i]->share = (int32_t *)(mbs[i]->err + t->n_layer);
            mbs[i]->y = (float *)(b + flags);
            for (uint32_t l = 0; l < t->n_layer; l++) {
                uint8_t *in = b + flags + y + l * inbox;
                mbs[i]->in[l] = (tier_inbox){.h = (float *)(in + off[0]),
                                             .ids = (int32_t *)(in + off[1]),
                                             .w = (float *)(in + off[2]),
                                             .fetched = (int32_t *)(in + off[3]),
                                             .cpu_slots = (int32_t *)(in + off[4])};
            }
        }
    }
    const size_t y_bytes = (size_t)(n_batch * E) * 4;
    if ((st = exec_dev_alloc(t->e, y_bytes, (void **)&t->y_dev)) ||
        (st = cuda_host_alloc(y_bytes, (void **)&t->y_host)))
        return st;
    if (!any_hot) return TM_OK;
    const int64_t n_items = n_batch * K;
    size_t gemm = 0;
    const tier_fetch *f = t->fetch && t->fetch->ring ? t->fetch : NULL;
    for (uint32_t l = 0; l < t->n_layer; l++) {
        const tier_layer *L = &t->layers[l];
        if (!L->moe) continue;
        /* each parameter set the layer's grouped GEMMs may take: its hot
         * experts, its RAM experts in place, a fetch-ring buffer */
        const bool in_ring = tier_ring_layer(t, L);
        const tm_cuda_moe_params ring = f ? tier_ring_params(t, L, f->ring, f->chunk_cap) : L->pcie;
        const size_t b[3] = {
            L->cls != TM_TIER_RAM
                ? cuda_moe_grouped_gemm_scratch_bytes(&L->gpu, n_items, (int32_t)t->n_expert)
                : 0,
            L->pcie.n_slots
                ? cuda_moe_grouped_gemm_scratch_bytes(&L->pcie, n_items, (int32_t)t->n_expert)
                : 0,
            f && in_ring ? cuda_moe_grouped_gemm_scratch_bytes(&ring, n_items, f->chunk_cap) : 0};
        for (int i = 0; i < 3; i++) gemm = b[i] > gemm ? b[i] : gemm;
    }
    t->gemm_scratch_bytes = gemm;
    /* cuda_moe_grouped's scratch, with room for its 8-bit activations */
    const tm_cuda_moe_params h_probe = {.n_embd = E, .n_ff = t->n_ff, .q8x = true};
    if ((st = exec_dev_alloc(t->e, (size_t)n_items * sizeof(tm_cuda_moe_item),
                             (void **)&t->items_dev)) ||
        (st = cuda_host_alloc((size_t)n_items * sizeof(tm_cuda_moe_item),
                              (void **)&t->items_host)) ||
        (st = exec_dev_alloc(t->e, (size_t)cuda_moe_scratch_floats(&h_probe, T * K) * 4,
                             (void **)&t->h_scratch)) ||
        (st = exec_dev_alloc(t->e, gemm, &t->gemm_scratch)))
        return st;
    return TM_OK;
}

/* After each step: a GPU that gave up waiting for the CPU lane added nothing
 * for that layer, so the step's result is wrong: fail it. Then the VRAM
 * cache's uploads: those done are used, the step's admissions queued. */
static tm_status tier_step_check(void *ud) {
    tm_tier *t = ud;
    tier_tune_step(t);
    tm_status st = tier_ahead_refresh(t); /* the GPU moved copies into cache slots */
    if (st == TM_OK) st = tier_cache_apply(t);
    for (uint32_t l = 0; l < t->n_layer; l++)
        if (__atomic_exchange_n(&t->mb.err[l], 0, __ATOMIC_ACQ_REL) && st == TM_OK)
            st = tm_error_set(TM_ERR_DEVICE,
                              "layer %u: the GPU gave up waiting %.1f s for the CPU lane "
                              "(TIERMOE_HANDOFF_TIMEOUT_MS)",
                              l, t->timeout_ns * 1e-9);
    return st;
}

/* The activation and biases of a layer's experts as the GPU lanes take them
 * (tm_cuda_moe_ext): the biases copied to VRAM, [n_expert] rows each, when
 * the layer has them and may compute experts on the GPU (its experts or its
 * routing there: VRAM, cache, PCIe and fetch lanes). */
static tm_status tier_ext_create(tm_tier *t, tier_layer *L, const tm_placement *pl) {
    const tm_moe_experts *h = &L->host;
    L->ext = (tm_cuda_moe_ext){.act = h->act == TM_MOE_ACT_SWIGLU_OAI ? TM_CUDA_MOE_SWIGLU_OAI
                                      : h->act == TM_MOE_ACT_GEGLU    ? TM_CUDA_MOE_GEGLU
                                                                      : TM_CUDA_MOE_SWIGLU,
                               .alpha = h->act_alpha,
                               .limit = h->act_limit,
                               .n_expert = (int32_t)t->n_expert};
    if (!t->gpu ||
        (pl->experts_dev[L->index] != TM_DEV_GPU && pl->layer_dev[L->index] != TM_DEV_GPU))
        return TM_OK;
    const float *src[3] = {h->gate_bias, h->up_bias, h->down_bias};
    const float **dst[3] = {&L->ext.gate_bias, &L->ext.up_bias, &L->ext.down_bias};
    const int64_t n[3] = {t->n_ff, t->n_ff, t->n_embd};
    for (int i = 0; i < 3; i++) {
        if (!src[i]) continue;
        const size_t bytes = (size_t)(n[i] * t->n_expert) * sizeof(float);
        void *d;
        tm_status st = exec_dev_alloc(t->e, bytes, &d);
        /* through the staging buffers: the biases lie in the mapped file between
           expert tensors whose pages another context may have pinned, and a
           direct copy from a range that is partly pinned is refused */
        if (st == TM_OK) st = cuda_upload(exec_gpu(t->e), d, src[i], bytes, NULL);
        if (st != TM_OK) return tm_error_wrap(st, "layer %u: expert biases: ", L->index);
        *dst[i] = d;
    }
    return TM_OK;
}

/* A router vector of layer L (f32 [n_expert]: the selection bias, the per-expert
 * factors), and its copy in VRAM for the router kernel (the tier's own: wherever the
 * placement put the tensor, the routing may run on the GPU). */
static tm_status tier_router_vector(tm_tier *t, tier_layer *L, const tm_weight *b, const char *what,
                                    const float **host, const float **dev) {
    if (b->type != TM_TYPE_F32 || b->ne[0] != t->n_expert)
        return tm_error_set(TM_ERR_ARG, "layer %u: %s '%.*s': %s of %lld, expected f32 of %u",
                            L->index, what, (int)b->name_len, b->name, quant_type_name(b->type),
                            (long long)b->ne[0], t->n_expert);
    *host = (const float *)b->data;
    if (!t->gpu) return TM_OK;
    void *d;
    const size_t bytes = t->n_expert * sizeof(float);
    tm_status st = exec_dev_alloc(t->e, bytes, &d);
    if (st == TM_OK) st = cuda_upload(exec_gpu(t->e), d, *host, bytes, NULL);
    if (st != TM_OK) return tm_error_wrap(st, "layer %u: %s", L->index, what);
    *dev = d;
    return TM_OK;
}

/* Over several GPUs each GPU has its own lanes for the experts in RAM of its layers (the
 * PCIe lane's work list, the fetch ring, the copy stream: tm_tier.bufs[g]), its own copies
 * ahead (tm_tier.ahead[g]) and its own VRAM cache; the SSD tier's ring is one GPU's so far
 * (issue 35): --ram-cache is an error naming the flag. */
static tm_status tier_gpus_lanes(tm_tier *t, const tm_tier_params *q) {
    bool cold = false;
    for (uint32_t l = 0; l < t->n_layer; l++)
        cold |= t->layers[l].moe && t->layers[l].cls != TM_TIER_VRAM;
    if (cold && q->store.budget_mib)
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "--ram-cache: with experts in RAM over %d GPUs the SSD tier is one "
                            "GPU's so far (each GPU's PCIe and fetch lanes, copies ahead and VRAM "
                            "cache run); leave --ram-cache out, or give one GPU (-dev CUDAn)",
                            exec_gpu_count(t->e));
    return TM_OK;
}

/* Whether a VRAM cache is asked for: --moe-cache N, each GPU's A,B, or a plan. */
static bool tier_cache_asked(const tm_tier_params *q) {
    bool any = q->cache_mib != 0 || q->cache.plan;
    for (int g = 0; g < q->n_cache_gpu; g++) any |= q->cache_mib_gpu[g] != 0;
    return any;
}

tm_status tier_create(tm_exec *e, const tm_placement *pl, uint32_t n_layer,
                      const tm_tier_layer *layers, const tm_moe_router_params *router,
                      const tm_tier_params *p, tm_tier **out) {
    *out = NULL;
    tm_tier_params q = *p;
    p = &q;
    tm_tier *t = calloc(1, sizeof(*t));
    if (!t) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    t->e = e, t->n_layer = n_layer, t->router = *router, t->ev = t->ev_gpu[0];
    t->router.sel_bias = t->router.expert_scale = NULL; /* each layer's own: tier_router */
    t->n_expert = router->n_expert, t->k = router->n_used;
    for (uint32_t l = n_layer; l-- > 0;) /* the experts' shape: any MoE layer's */
        if (layers[l].gate) t->n_embd = layers[l].experts.n_embd, t->n_ff = layers[l].experts.n_ff;
    t->gpu = exec_gpu(e) != NULL;
    const char *env = getenv("TIERMOE_HANDOFF_TIMEOUT_MS");
    t->timeout_ns = (uint64_t)(env && atoll(env) > 0 ? atoll(env) : TIER_TIMEOUT_MS) * 1000000u;
    tm_status st = TM_OK;
    if (!(t->layers = calloc(n_layer, sizeof(*t->layers))) ||
        !(t->group_slots = malloc(t->n_expert * sizeof(int32_t))) ||
        !(t->group_starts = malloc((t->n_expert + 1) * sizeof(int64_t))))
        st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    if (st == TM_OK) st = moe_cpu_lane_create(&t->lane);
    if (st == TM_OK && exec_profiling(e)) moe_cpu_lane_profile(t->lane, &t->lane_stats);
    for (uint32_t l = 0; l < n_layer && st == TM_OK; l++) {
        tier_layer *L = &t->layers[l];
        const tm_tier_layer *d = &layers[l];
        L->t = t, L->index = l, L->host = d->experts, L->moe = d->gate != NULL;
        if (!(L->seen = calloc(t->n_expert, sizeof(uint64_t)))) {
            st = tm_error_set(TM_ERR_NOMEM, "out of memory");
            break;
        }
        /* a dense layer: VRAM's class (no lane, cache or store takes it), counted in none */
        L->cls = TM_TIER_VRAM;
        if (!L->moe) continue;
        /* over several GPUs, what the layer allocates goes to its experts' GPU, and a layer
           whose experts are in RAM steps on its own layer's GPU (where its input is) */
        if (exec_gpu_count(e) > 1 && pl->experts_gpu)
            L->gpu_index = pl->experts_dev[l] == TM_DEV_GPU ? pl->experts_gpu[l]
                           : pl->layer_dev[l] == TM_DEV_GPU ? pl->layer_gpu[l]
                                                            : 0;
        L->on_gpu = t->gpu && (pl->experts_dev[l] == TM_DEV_GPU || pl->layer_dev[l] == TM_DEV_GPU);
        if (t->gpu && (st = exec_gpu_set(e, L->gpu_index))) break;
        if (d->sel_bias && (st = tier_router_vector(t, L, d->sel_bias, "selection bias",
                                                    &L->sel_bias, &L->sel_bias_dev)))
            break;
        if (d->expert_scale && (st = tier_router_vector(t, L, d->expert_scale, "per-expert scale",
                                                        &L->expert_scale, &L->expert_scale_dev)))
            break;
        if (p->cache.learn) /* the CPU lane's share of prompts takes the least used first */
            memcpy(L->seen, p->cache.learn->layers[l].experts, t->n_expert * sizeof(uint64_t));
        L->expert_bytes = tier_slice_bytes(&d->experts, 0) + tier_slice_bytes(&d->experts, 1) +
                          tier_slice_bytes(&d->experts, 2);
        L->cls = pl->experts_dev[l] == TM_DEV_GPU && t->gpu ? TM_TIER_VRAM : TM_TIER_RAM;
        if (t->gpu && d->router && d->router->type == TM_TYPE_F32) {
            L->router_dev = exec_weight_dev(e, d->router);
            if (L->router_dev && d->router_bias && d->router_bias->type == TM_TYPE_F32)
                L->router_bias_dev = exec_weight_dev(e, d->router_bias);
        }
        if ((st = tier_ext_create(t, L, pl)) != TM_OK) break;
        L->gpu.ext = L->ext; /* a cache's slots keep it */
        if (L->cls == TM_TIER_VRAM)
            L->gpu = (tm_cuda_moe_params){
                .n_embd = t->n_embd,
                .n_ff = t->n_ff,
                .n_slots = (int32_t)t->n_expert,
                .gate =
                    tier_gpu_matrix(tier_view_dev(e, d->gate, &d->experts.gate), &d->experts.gate),
                .up = tier_gpu_matrix(tier_view_dev(e, d->up, &d->experts.up), &d->experts.up),
                .down =
                    tier_gpu_matrix(tier_view_dev(e, d->down, &d->experts.down), &d->experts.down),
                .ext = L->ext,
            };
    }
    if (st == TM_OK && t->gpu && exec_gpu_count(e) > 1) st = tier_gpus_lanes(t, &q);
    /* each GPU's buffers (bufs[g], made below) and copy stream (its cache's uploads, its
       fetch ring's copies), GPU 0's current last */
    t->n_bufs = t->gpu ? exec_gpu_count(e) : 0;
    for (int g = t->n_bufs - 1; g >= 0 && st == TM_OK; g--)
        if (!(st = exec_gpu_set(e, g))) st = cuda_stream_create(&t->copy_gpu[g]);
    t->copy = t->copy_gpu[0];
    if (st == TM_OK && p->store.budget_mib) st = tier_store_create(t, layers, &q);
    /* --moe-ahead auto: one expert a layer step into the slots of a VRAM cache that would
       otherwise change between requests only (the H200 machine, 30b-a3b, Qwen3 routing
       profile, 4212 MiB: 171.3 t/s with --moe-pcie off against 148.5 in one call, 179.4
       against 168.6 in another; 80.5% of the routed slots hit the cache and 9.8% more the
       copies); none into the buffer of a layer without slots (there the copies were slower
       than the PCIe lane) */
    if (q.ahead == TM_MOE_AHEAD_AUTO) {
        t->ahead_cached_only = true;
        q.ahead = t->gpu && tier_cache_asked(&q) && q.cache.update == TM_MOE_UPDATE_BETWEEN
                      ? TIER_AHEAD_CACHED
                      : TM_MOE_AHEAD_OFF;
        /* and the PCIe lane's auto share off: with the copies, the few cold slots left ran
           faster on the CPU alone (179.4 t/s against 166.3 and 171.2 with the lane, another
           call on another machine) */
        if (q.ahead > 0 && q.pcie == TM_MOE_PCIE_AUTO) q.pcie = TM_MOE_PCIE_OFF;
    }
    if (q.ahead > 0 && tier_cache_asked(&q) && q.cache.update != TM_MOE_UPDATE_OFF) {
        tm_log_info("--moe-ahead: the VRAM cache's slots take the copies (least recently used "
                    "first, on the GPU); --moe-cache-update is off");
        q.cache.update = TM_MOE_UPDATE_OFF;
    }
    /* the grouped GEMMs' scratch is allocated after the cache: --moe-cache auto leaves room */
    if (t->gpu)
        t->gemm_reserve =
            tier_gemm_scratch_bound(t->n_embd, t->n_ff, t->n_expert, exec_n_batch(e) * t->k);
    if (st == TM_OK) st = tier_cache_create(t, &q);
    if (st == TM_OK) st = tier_pcie_create(t, pl, &q);
    if (st == TM_OK) st = tier_fetch_create(t, &q);
    if (st == TM_OK) st = tier_ahead_create(t, &q);
    /* The hot experts' decode products take 8-bit activations in the normal mode (q4_K
       experts; cuda_moe_grouped's q8x path). H200, 30b-a3b -ngl all, 2026-11-27: tg64 x8
       912 -> 1016 t/s, one sequence 322.5 -> 323-325. TIERMOE_MOE_Q8X=0 keeps f32 (for
       comparisons). */
    const char *q8x = getenv("TIERMOE_MOE_Q8X");
    if (t->gpu && !(q8x && !strcmp(q8x, "0")) && !exec_precise(e))
        for (uint32_t l = 0; l < n_layer; l++) t->layers[l].gpu.q8x = true;
    /* each GPU's buffers (the last made, GPU 0's, stay in the fields): GPU 0's fetch ring
       and PCIe work list were made above, the others' of their shape here */
    tier_fetch *const ring0 = t->fetch;
    tm_cuda_moe_item *const pcie0 = t->pcie_items;
    int failed = -1; /* the GPU whose buffers failed */
    for (int g = t->n_bufs - 1; g >= 0 && st == TM_OK; g--) {
        failed = g;
        if ((st = exec_gpu_set(e, g))) break;
        t->copy = t->copy_gpu[g], t->fetch = g ? NULL : ring0, t->pcie_items = g ? NULL : pcie0;
        t->pcie_done = NULL;
        if (g && ring0) st = tier_fetch_ring_add(t, ring0);
        if (st == TM_OK && g && pcie0)
            st = exec_dev_alloc(e, (size_t)(TM_CUDA_MMVQ_MAX_TOK * t->k) * sizeof(*pcie0),
                                (void **)&t->pcie_items);
        if (st == TM_OK && t->fetch_mode != TM_MOE_FETCH_OFF) st = cuda_event_create(&t->pcie_done);
        for (int i = 0; i < 8 && st == TM_OK && exec_profiling(e); i++)
            st = cuda_event_create(&t->ev_gpu[g][i]); /* on GPU g, set above */
        if (st == TM_OK) st = tier_gpu_buffers(t, exec_n_batch(e));
        tier_bufs_save(t, g); /* also after a failure: tier_free frees what bufs[g] holds */
        if (st != TM_OK) break;
        if (g) t->items_host = NULL, t->y_host = NULL; /* bufs[g] owns them */
    }
    if (st != TM_OK && failed > 0) { /* bufs[failed] owns what it made; the fields: GPU 0's
                                        ring (not yet in bufs[0]), freed once by tier_free */
        t->fetch = ring0, t->pcie_done = NULL, t->copy = t->copy_gpu[0];
        t->items_host = NULL, t->y_host = NULL;
    }
    if (st == TM_OK && t->mb_host_base) exec_step_check(e, tier_step_check, t);
    if (st == TM_OK && t->mb_host_base && t->n_pcie > 0 && t->pcie_share_q8 > 0) tier_tune_init(t);
    for (uint32_t l = 0; l < n_layer && st == TM_OK; l++)
        if (t->layers[l].moe) {
            t->stats[t->layers[l].cls].layers++;
            if (t->layers[l].on_gpu) t->stats_gpu[t->layers[l].gpu_index].layers++;
        }
    if (st != TM_OK) {
        tier_free(t);
        return st;
    }
    *out = t;
    return TM_OK;
}

void tier_free(tm_tier *t) {
    if (!t) return;
    /* nothing queued may still read or write what is freed below: uploads on
     * the copy stream, slot maps on their way to the device */
    for (int g = 0; g < EXEC_MAX_GPUS; g++) /* t->copy is one of them */
        if (t->copy_gpu[g]) (void)cuda_stream_sync(t->copy_gpu[g]);
    if (t->gpu) (void)exec_sync(t->e);
    for (uint32_t l = 0; t->layers && l < t->n_layer; l++) free(t->layers[l].seen);
    tier_cache_free(t);
    tier_fetch_free(t);
    tier_ahead_free(t);
    free(t->calib);
    cuda_host_unregister(t->store_pin); /* before the slots are unmapped */
    store_free(t->store);
    for (int g = 0; g < EXEC_MAX_GPUS; g++) cuda_stream_free(t->copy_gpu[g]); /* and bufs[g]'s: */
    cuda_event_free(t->pcie_done);
    for (int g = 0; g < t->n_bufs; g++)
        if (g != t->bufs_gpu)
            cuda_event_free(t->bufs[g].pcie_done), tier_fetch_ring_free(t->bufs[g].fetch);
    for (int g = 0; g < EXEC_MAX_GPUS; g++)
        for (int i = 0; i < 8; i++) cuda_event_free(t->ev_gpu[g][i]);
    tier_pcie_unpin(t);
    cuda_host_free(t->mb_host_base);
    free(t->mb.in), free(t->mb_dev.in);
    cuda_host_free(t->y_host);
    cuda_host_free(t->items_host);
    for (int g = 0; g < t->n_bufs; g++)
        if (g != t->bufs_gpu)
            cuda_host_free(t->bufs[g].y_host), cuda_host_free(t->bufs[g].items_host);
    moe_cpu_lane_free(t->lane);
    moe_worklist_free(&t->wl);
    free(t->split_tmp), free(t->layers), free(t->group_slots), free(t->group_starts);
    free(t);
}
