/* Measuring a calibration profile (calib.h, docs/calibrate.md).
 *
 * Every expert measurement is a call over `k` distinct experts of one layer
 * (k = the experts a token routes to), each with n tokens; time per expert =
 * the call's time / k. Calls rotate over a working set of experts twice the
 * size of the last-level cache (the CPU's; the GPU's L2 for VRAM and PCIe,
 * 1.25 times when quick), so weights come from memory as in a real step,
 * never from a cache a previous call filled. The working set's pages are
 * read once first, so no call pays page faults.
 *
 * Parts, in order (each prints its rows as it goes):
 *   membw    cpu_read_bandwidth_gbs (full only)
 *   touch    the working set's pages read once
 *   cpu      the CPU lane (moe_cpu_lane_run) at 1, 2, 4, ..., 512 tokens per expert:
 *            expert-major, median of 5 calls after one warm-up (quick: one call;
 *            stops adding points after 100 ms once it has two)
 *   copy     host→GPU from pinned memory (events around cuda_copy_async) and
 *            from pageable memory (cuda_upload, wall time), one expert and a
 *            big copy; GPU→host pinned; medians
 *   pcie     kernels reading a pinned host copy of the experts in place
 *            (cuda_host_register + cuda_moe_grouped, 1 token, k experts a
 *            launch) for ~200 ms (quick 20); the CPU lane alone for as long;
 *            then both at once (the same launches, at most CALIB_GATED_MAX):
 *            the stream waits for the host's go, the host runs CPU lane calls
 *            until the stream is idle
 *   gpu      the experts uploaded to VRAM, then cuda_moe_grouped (<= 8
 *            tokens) or cuda_moe_grouped_gemm at each point: 10 launches
 *            back to back between events after a warm-up (quick 3)
 *   handoff  100 round trips (quick 20) cuda_signal_host → host spin → flag
 *            → cuda_wait_host, between events, after a go from the host
 * Every buffer is freed and the stream left idle, on errors too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/timing.h"
#include "tier/calib_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define calib_relax() _mm_pause()
#else
#define calib_relax() ((void)0)
#endif

#define CALIB_MIB             ((uint64_t)1 << 20)
#define CALIB_QUICK_CURVE_NS  100000000ull /* a quick curve stops adding points after this */
#define CALIB_SPIN_TIMEOUT_NS 10000000000ull
#define CALIB_GPU_WAIT_NS     10000000000ull
#define CALIB_MAX_K           256 /* experts a call */
/* Launches queued behind a gate (the stream waiting for the host's go): a
 * stream's queue holds about a thousand before a launch blocks, and a
 * blocked launch would never see the go. */
#define CALIB_GATED_MAX 256

typedef struct calib_gpu {
    tm_cuda_device *dev;
    tm_cuda_stream s;
    tm_cuda_pool *pool;
    tm_cuda_blas *blas;
    bool own_blas; /* made here (the source gave none) */
    tm_cuda_event ev[2];
    int32_t m;                 /* experts in VRAM and in the pinned host copy */
    tm_cuda_moe_params vram;   /* slots 0..m-1: experts 0..m-1 of use[0] */
    float *x, *y, *h_scratch;  /* device */
    void *gemm_scratch;        /* device */
    tm_cuda_moe_item *items;   /* device [(reps + 1) * max_tok * k] */
    tm_cuda_moe_item *items_h; /* pinned, the same */
    int32_t *slots;            /* host [k] */
    int64_t *starts;           /* host [k + 1] */
    uint32_t *seq;             /* device [handoffs]: 1, 2, ... */
    uint32_t *mb, *mb_dev;     /* mapped: go, flag_h, flag_y, err, then the spans' room */
    float *src_h, *src_w;      /* device: what the hand-off sends */
    int32_t *src_ids;
    float *add; /* device [n_embd]: what the wait adds to */
} calib_gpu;

typedef struct calib_ctx {
    const tm_calib_source *src;
    tm_calib *c;
    FILE *log;
    bool quick;
    int32_t k, max_tok, reps, gpu_reps, handoffs;
    uint64_t eb;            /* bytes of one expert */
    uint64_t concurrent_ns; /* how long the PCIe and CPU lane runs take */
    tm_moe_cpu_lane *lane;
    tm_moe_worklist wl;
    float *x, *y; /* host [max_tok][n_embd] */
    int32_t *ids; /* host [max_tok][k] */
    float *w;
    const tm_moe_experts **use; /* the layers of the key's kind */
    uint32_t n_use;
    uint32_t ws_layers,
        ws_experts; /* the working set: experts < ws_experts of use[0 .. ws_layers) */
    uint64_t call;  /* rotation over the working set */
    calib_gpu g;
} calib_ctx;

/* ---- small pieces ---- */

static void calib_cpu_name(char *out, size_t n) {
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (!v) continue;
        for (v++; *v == ' ' || *v == '\t'; v++) {
        }
        size_t len = strcspn(v, "\n");
        while (len && v[len - 1] == ' ') len--;
        if (len) snprintf(out, n, "%.*s", (int)len, v);
        break;
    }
    fclose(f);
}

static uint64_t calib_expert_bytes(const tm_moe_experts *ex) {
    return (uint64_t)ex->n_ff * (ex->gate.row_bytes + ex->up.row_bytes) +
           (uint64_t)ex->n_embd * ex->down.row_bytes;
}

static bool calib_same_kind(const tm_moe_experts *a, const tm_moe_experts *b) {
    return a->n_embd == b->n_embd && a->n_ff == b->n_ff && a->gate.type == b->gate.type &&
           a->up.type == b->up.type && a->down.type == b->down.type &&
           calib_expert_bytes(a) == calib_expert_bytes(b);
}

/* The first layer of the most common shape and types (llama.cpp's mixes keep
 * some layers' down projections in another type): the profile's key. */
static uint32_t calib_key_layer(const tm_calib_source *src) {
    uint32_t best = 0, best_n = 0;
    for (uint32_t l = 0; l < src->n_layer; l++) {
        uint32_t n = 0;
        for (uint32_t j = 0; j < src->n_layer; j++)
            n += calib_same_kind(&src->layers[l], &src->layers[j]);
        if (n > best_n) best = l, best_n = n;
    }
    return best;
}

tm_status calib_key_make(const tm_calib_source *src, tm_calib_key *out) {
    memset(out, 0, sizeof(*out));
    if (!src->layers || !src->n_layer || !src->n_expert || !src->n_used ||
        src->n_used > src->n_expert || src->n_used > CALIB_MAX_K)
        return tm_error_set(TM_ERR_ARG,
                            "calibration: %u layers of %u experts, %u of them a token: nothing to "
                            "measure",
                            src->n_layer, src->n_expert, src->n_used);
    for (uint32_t l = 0; l < src->n_layer; l++) {
        const tm_moe_experts *b = &src->layers[l];
        if (b->n_embd <= 0 || b->n_ff <= 0 || !b->gate.data || !b->up.data || !b->down.data)
            return tm_error_set(TM_ERR_ARG,
                                "calibration: layer %u's experts: n_embd %lld, n_ff %lld", l,
                                (long long)b->n_embd, (long long)b->n_ff);
    }
    const tm_moe_experts *a = &src->layers[calib_key_layer(src)];
    calib_cpu_name(out->cpu, sizeof(out->cpu));
    if (src->gpu) snprintf(out->gpu, sizeof(out->gpu), "%s", cuda_device_info(src->gpu)->name);
    out->threads = src->pool ? cpu_pool_size(src->pool) : 1;
    out->expert = (tm_calib_expert){a->n_embd,  a->n_ff,      a->gate.type,
                                    a->up.type, a->down.type, calib_expert_bytes(a)};
    return TM_OK;
}

/* ---- the CPU lane ---- */

static tm_status calib_cpu_setup(calib_ctx *x) {
    const tm_calib_source *src = x->src;
    const int64_t E = x->c->key.expert.n_embd, T = x->max_tok, K = x->k;
    if (!(x->x = malloc((size_t)(T * E) * sizeof(float))) ||
        !(x->y = malloc((size_t)(T * E) * sizeof(float))) ||
        !(x->ids = malloc((size_t)(T * K) * sizeof(int32_t))) ||
        !(x->w = malloc((size_t)(T * K) * sizeof(float))))
        return tm_error_set(TM_ERR_NOMEM, "calibration: out of memory for %d tokens", x->max_tok);
    uint64_t r = 0x9e3779b97f4a7c15ull; /* activations of a normed hidden state's size */
    for (int64_t i = 0; i < T * E; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        x->x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    /* the working set: twice the last-level cache, at least 64 MiB and k experts */
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    uint64_t want_b = 2 * (l3 > 0 ? (uint64_t)l3 : 32 * CALIB_MIB);
    if (want_b < 64 * CALIB_MIB) want_b = 64 * CALIB_MIB;
    uint64_t want = (want_b + x->eb - 1) / x->eb;
    if (!(x->use = malloc(src->n_layer * sizeof(*x->use))))
        return tm_error_set(TM_ERR_NOMEM, "calibration: out of memory");
    const tm_moe_experts *kind = &src->layers[calib_key_layer(src)];
    for (uint32_t l = 0; l < src->n_layer; l++)
        if (calib_same_kind(&src->layers[l], kind)) x->use[x->n_use++] = &src->layers[l];
    const uint64_t total = (uint64_t)x->n_use * src->n_expert;
    if (want > total) want = total;
    x->ws_layers = (uint32_t)((want + src->n_expert - 1) / src->n_expert);
    if (x->ws_layers > x->n_use) x->ws_layers = x->n_use;
    uint64_t per = (want + x->ws_layers - 1) / x->ws_layers;
    if (per < (uint64_t)x->k) per = (uint64_t)x->k;
    x->ws_experts = per > src->n_expert ? src->n_expert : (uint32_t)per;
    return moe_cpu_lane_create(&x->lane);
}

/* Read every page of the working set once (page faults now, not in a call). */
static void calib_touch(calib_ctx *x) {
    const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    volatile uint8_t sink = 0;
    uint8_t acc = 0;
    for (uint32_t l = 0; l < x->ws_layers; l++) {
        const tm_moe_experts *ex = x->use[l];
        const tm_moe_matrix *m[3] = {&ex->gate, &ex->up, &ex->down};
        const int64_t rows[3] = {ex->n_ff, ex->n_ff, ex->n_embd};
        for (uint32_t e = 0; e < x->ws_experts; e++)
            for (int p = 0; p < 3; p++) {
                const uint8_t *b = m[p]->data + (size_t)e * m[p]->expert_stride;
                const size_t n = (size_t)rows[p] * m[p]->row_bytes;
                for (size_t i = 0; i < n; i += (size_t)page) acc ^= b[i];
                acc ^= b[n - 1];
            }
    }
    sink = acc;
    (void)sink;
}

/* The next k experts of the rotation: a layer, and its experts (distinct). */
static uint32_t calib_group(calib_ctx *x, int32_t *experts) {
    const uint64_t c = x->call++;
    const uint32_t layer = (uint32_t)(c % x->ws_layers);
    const uint64_t base = (c / x->ws_layers) * (uint64_t)x->k;
    for (int32_t j = 0; j < x->k; j++) experts[j] = (int32_t)((base + (uint64_t)j) % x->ws_experts);
    return layer;
}

/* One CPU lane call: k experts, n_tok tokens each; its wall time. */
static tm_status calib_cpu_call(calib_ctx *x, int32_t n_tok, uint64_t *ns) {
    int32_t e[CALIB_MAX_K];
    const uint32_t layer = calib_group(x, e);
    for (int32_t t = 0; t < n_tok; t++)
        for (int32_t j = 0; j < x->k; j++)
            x->ids[t * x->k + j] = e[j], x->w[t * x->k + j] = 1.0f / (float)x->k;
    tm_status st = moe_worklist_build(&x->wl, x->ids, x->w, n_tok, x->src->n_expert, (uint32_t)x->k,
                                      n_tok == 1 ? TM_MOE_PHASE_DECODE : TM_MOE_PHASE_PROMPT);
    if (st != TM_OK) return st;
    memset(x->y, 0, (size_t)n_tok * (size_t)x->c->key.expert.n_embd * sizeof(float));
    const uint64_t t0 = tm_time_ns();
    st = moe_cpu_lane_run(x->lane, x->src->pool, x->use[layer], &x->wl, 0, x->wl.n_slots, x->x,
                          x->y, false);
    *ns = tm_time_ns() - t0;
    return st;
}

static tm_status calib_cpu_point(calib_ctx *x, int32_t n_tok, double *ns) {
    double t[16];
    uint64_t d;
    tm_status st = calib_cpu_call(x, n_tok, &d); /* warm-up: scratch grown, pool awake */
    for (int r = 0; r < x->reps && st == TM_OK; r++) {
        st = calib_cpu_call(x, n_tok, &d);
        t[r] = (double)d;
    }
    if (st == TM_OK) *ns = calib_median(t, x->reps) / x->k;
    return st;
}

typedef tm_status (*calib_point_fn)(calib_ctx *x, int32_t n_tok, double *ns);
typedef void (*calib_row_fn)(FILE *f, const tm_calib *c, int i);

/* A curve's points in order, each row printed as it is measured, then made
 * non-decreasing (calib_curve_fit; a line says which points moved). A quick
 * one stops adding points after CALIB_QUICK_CURVE_NS once it has two. */
static tm_status calib_curve(calib_ctx *x, tm_calib_curve *cv, calib_point_fn fn,
                             calib_row_fn row) {
    const uint64_t t0 = tm_time_ns();
    cv->n = 0;
    for (int i = 0; i < TM_CALIB_N_TOKENS && tm_calib_tokens[i] <= x->max_tok; i++) {
        if (x->quick && cv->n >= 2 && tm_time_ns() - t0 > CALIB_QUICK_CURVE_NS) break;
        double ns = 0;
        tm_status st = fn(x, tm_calib_tokens[i], &ns);
        if (st != TM_OK) return st;
        cv->tokens[cv->n] = tm_calib_tokens[i], cv->ns[cv->n] = ns;
        if (x->log) row(x->log, x->c, cv->n);
        cv->n++;
    }
    const tm_calib_curve raw = *cv;
    calib_curve_fit(cv);
    for (int i = 0, j; x->log && i < cv->n; i = j) { /* the runs the fit pooled */
        for (j = i + 1; j < cv->n && cv->ns[j] == cv->ns[i]; j++) {
        }
        if (j - i > 1 && raw.ns[i] != cv->ns[i])
            fprintf(x->log,
                    "  (%d-%d tokens: %.1f us each, the mean of what they measured: more tokens "
                    "never cost less)\n",
                    cv->tokens[i], cv->tokens[j - 1], cv->ns[i] * 1e-3);
    }
    return TM_OK;
}

/* ---- the GPU ---- */

static size_t calib_a256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* The expert matrices packed per projection, slot s at s * rows * row_bytes,
 * from base (VRAM or the pinned host copy). */
static tm_cuda_moe_params calib_packed(const calib_ctx *x, void *base, int32_t m) {
    const tm_moe_experts *ex = x->use[0];
    const tm_moe_matrix *h[3] = {&ex->gate, &ex->up, &ex->down};
    const int64_t rows[3] = {ex->n_ff, ex->n_ff, ex->n_embd};
    tm_cuda_moe_matrix g[3];
    uintptr_t at = (uintptr_t)base; /* an integer: the size probe passes NULL */
    for (int p = 0; p < 3; p++) {
        const size_t stride = (size_t)rows[p] * h[p]->row_bytes;
        g[p] = (tm_cuda_moe_matrix){(const void *)at, h[p]->type, stride, h[p]->row_bytes};
        at += calib_a256((size_t)m * stride);
    }
    return (tm_cuda_moe_params){.n_embd = ex->n_embd,
                                .n_ff = ex->n_ff,
                                .n_slots = m,
                                .gate = g[0],
                                .up = g[1],
                                .down = g[2]};
}

static size_t calib_packed_bytes(const calib_ctx *x, int32_t m) {
    const tm_moe_experts *ex = x->use[0];
    return calib_a256((size_t)m * (size_t)ex->n_ff * ex->gate.row_bytes) +
           calib_a256((size_t)m * (size_t)ex->n_ff * ex->up.row_bytes) +
           calib_a256((size_t)m * (size_t)ex->n_embd * ex->down.row_bytes);
}

/* Copy experts 0..m-1 of use[0] into packed params p (host memcpy or upload). */
static tm_status calib_fill(calib_ctx *x, const tm_cuda_moe_params *p, bool device) {
    const tm_moe_experts *ex = x->use[0];
    const tm_moe_matrix *h[3] = {&ex->gate, &ex->up, &ex->down};
    const tm_cuda_moe_matrix *d[3] = {&p->gate, &p->up, &p->down};
    for (int32_t s = 0; s < p->n_slots; s++)
        for (int q = 0; q < 3; q++) {
            uint8_t *dst = (uint8_t *)d[q]->data + (size_t)s * d[q]->expert_stride;
            const uint8_t *src = h[q]->data + (size_t)s * h[q]->expert_stride;
            if (!device) {
                memcpy(dst, src, d[q]->expert_stride);
                continue;
            }
            tm_status st = cuda_upload(x->g.dev, dst, src, d[q]->expert_stride, NULL);
            if (st != TM_OK) return st;
        }
    return TM_OK;
}

static tm_status calib_dev_alloc(calib_gpu *g, size_t bytes, void **out) {
    return cuda_pool_alloc(g->pool, bytes ? bytes : 4, 256, out);
}

/* One pool for everything but the big copies (room for the experts in VRAM),
 * the pinned work items, the hand-off's mapped mailbox, a cuBLAS handle. */
static tm_status calib_gpu_setup(calib_ctx *x) {
    calib_gpu *g = &x->g;
    const tm_calib_source *src = x->src;
    const int64_t E = x->c->key.expert.n_embd, T = x->max_tok, K = x->k;
    /* experts rotated over: twice the L2 (quick: 1.25 times), at least k (and 2: a second
     * slot to rotate to) */
    const uint64_t l2 = cuda_device_info(g->dev)->l2_bytes;
    uint64_t m = ((x->quick ? l2 + l2 / 4 : 2 * l2) + x->eb - 1) / x->eb;
    if (m < (uint64_t)K) m = (uint64_t)K;
    if (m < 2) m = 2;
    if (m > src->n_expert) m = src->n_expert;
    size_t free_b = 0, total_b = 0;
    tm_status st = cuda_device_memory(g->dev, &free_b, &total_b);
    if (st != TM_OK) return st;
    while (m > (uint64_t)K && m > 2 && calib_packed_bytes(x, (int32_t)m) > free_b / 4) m--;
    g->m = (int32_t)m;
    const int64_t launches = (int64_t)(x->gpu_reps + 1) * T; /* the curve's; the PCIe lane's m */
    const int64_t n_items = (launches > g->m ? launches : g->m) * K;
    tm_cuda_moe_params probe = calib_packed(x, NULL, g->m);
    const size_t h_scratch = (size_t)cuda_moe_scratch_floats(&probe, TM_CUDA_MMVQ_MAX_TOK * K) * 4;
    const size_t gemm = cuda_moe_grouped_gemm_scratch_bytes(&probe, T * K, (int32_t)K);
    const size_t sizes[] = {calib_packed_bytes(x, g->m),
                            (size_t)(T * E) * 4,
                            (size_t)(T * E) * 4,
                            (size_t)n_items * sizeof(tm_cuda_moe_item),
                            h_scratch,
                            gemm,
                            (size_t)x->handoffs * 4,
                            (size_t)E * 4,
                            (size_t)K * 4,
                            (size_t)K * 4,
                            (size_t)E * 4};
    size_t total = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(*sizes); i++) total += calib_a256(sizes[i] + 4);
    void *p[11];
    if ((st = cuda_pool_create(g->dev, total, &g->pool))) return st;
    for (size_t i = 0; i < 11 && st == TM_OK; i++) st = calib_dev_alloc(g, sizes[i], &p[i]);
    if (st != TM_OK) return st;
    g->vram = calib_packed(x, p[0], g->m);
    g->x = p[1], g->y = p[2], g->items = p[3], g->h_scratch = p[4], g->gemm_scratch = p[5];
    g->seq = p[6], g->src_h = p[7], g->src_ids = p[8], g->src_w = p[9], g->add = p[10];
    const size_t mb_bytes = 16 + (size_t)(2 * E + 2 * K) * 4;
    void *mb_host = NULL, *mb_dev = NULL;
    if ((st = cuda_host_alloc((size_t)n_items * sizeof(tm_cuda_moe_item), (void **)&g->items_h)) ||
        (st = cuda_host_alloc_mapped(mb_bytes, &mb_host, &mb_dev)))
        return st;
    g->mb = mb_host, g->mb_dev = mb_dev;
    memset(g->mb, 0, mb_bytes);
    if (!(g->slots = malloc((size_t)K * sizeof(int32_t))) ||
        !(g->starts = malloc((size_t)(K + 1) * sizeof(int64_t))))
        return tm_error_set(TM_ERR_NOMEM, "calibration: out of memory");
    uint32_t *seq = malloc((size_t)x->handoffs * 4);
    if (!seq) return tm_error_set(TM_ERR_NOMEM, "calibration: out of memory");
    for (int32_t i = 0; i < x->handoffs; i++) seq[i] = (uint32_t)i + 1;
    const size_t zero_b = (size_t)(E > K ? E : K) * 4;
    float *zero = calloc(1, zero_b);
    if (!zero) st = tm_error_set(TM_ERR_NOMEM, "calibration: out of memory");
    if (st == TM_OK) st = cuda_copy_to_device(g->dev, g->seq, seq, (size_t)x->handoffs * 4);
    free(seq);
    if (st == TM_OK) st = cuda_copy_to_device(g->dev, g->x, x->x, (size_t)(T * E) * 4);
    if (st == TM_OK) st = cuda_fill_bytes(g->dev, g->y, 0, (size_t)(T * E) * 4);
    const void *dst[4] = {g->src_h, g->src_ids, g->src_w, g->add};
    const size_t nb[4] = {(size_t)E * 4, (size_t)K * 4, (size_t)K * 4, (size_t)E * 4};
    for (int i = 0; i < 4 && st == TM_OK; i++)
        st = cuda_copy_to_device(g->dev, (void *)dst[i], zero, nb[i]);
    free(zero);
    if (st == TM_OK && !(g->blas = src->blas)) {
        st = cuda_blas_create(g->dev, &g->blas);
        g->own_blas = st == TM_OK;
    }
    return st;
}

static void calib_gpu_free(calib_gpu *g) {
    if (!g->dev) return;
    (void)cuda_stream_sync(g->s); /* nothing may still use what is freed below */
    if (g->own_blas) cuda_blas_free(g->blas);
    for (int i = 0; i < 2; i++) cuda_event_free(g->ev[i]);
    cuda_host_free(g->items_h);
    cuda_host_free(g->mb);
    cuda_pool_free(g->pool);
    free(g->slots), free(g->starts);
    memset(g, 0, sizeof(*g));
}

static tm_status calib_elapsed_ns(calib_gpu *g, double *ns) {
    float ms = 0;
    tm_status st = cuda_event_elapsed(g->ev[0], g->ev[1], &ms);
    *ns = (double)ms * 1e6;
    if (st == TM_OK && !(*ns > 0)) *ns = 1; /* below the events' resolution */
    return st;
}

/* Work items of launch r over params with m slots: k experts (r*k + j) % m,
 * n_tok tokens each, expert-major, into items_h[r * n_tok * k ...]. */
static void calib_items(calib_ctx *x, int32_t r, int32_t n_tok, int32_t m) {
    tm_cuda_moe_item *it = x->g.items_h + (size_t)r * (size_t)n_tok * (size_t)x->k;
    for (int32_t j = 0; j < x->k; j++) {
        const int32_t slot = (int32_t)(((int64_t)r * x->k + j) % m);
        for (int32_t t = 0; t < n_tok; t++)
            it[j * n_tok + t] = (tm_cuda_moe_item){slot, t, 1.0f / (float)x->k, slot};
    }
}

/* Launch r of the items (as calib_items laid them out) over p. */
static tm_status calib_gpu_launch(calib_ctx *x, const tm_cuda_moe_params *p, int32_t r,
                                  int32_t n_tok) {
    calib_gpu *g = &x->g;
    const int64_t n = (int64_t)n_tok * x->k;
    const tm_cuda_moe_item *it = g->items + r * n;
    if (n_tok <= TM_CUDA_MMVQ_MAX_TOK)
        return cuda_moe_grouped(p, it, n, g->x, n_tok, g->y, g->h_scratch, g->s);
    const tm_cuda_moe_item *ih = g->items_h + r * n;
    for (int32_t j = 0; j < x->k; j++) g->slots[j] = ih[j * n_tok].slot, g->starts[j] = j * n_tok;
    g->starts[x->k] = n;
    const tm_cuda_moe_groups gr = {x->k, g->slots, g->starts, it};
    return cuda_moe_grouped_gemm(g->blas, p, &gr, g->x, n_tok, g->y, g->gemm_scratch, g->s);
}

static tm_status calib_gpu_point(calib_ctx *x, int32_t n_tok, double *ns) {
    calib_gpu *g = &x->g;
    const int32_t R = x->gpu_reps;
    for (int32_t r = 0; r <= R; r++) calib_items(x, r, n_tok, g->m);
    tm_status st = cuda_copy_async(
        g->items, g->items_h,
        (size_t)(R + 1) * (size_t)n_tok * (size_t)x->k * sizeof(tm_cuda_moe_item), g->s);
    if (st == TM_OK) st = calib_gpu_launch(x, &g->vram, 0, n_tok); /* warm-up */
    if (st == TM_OK) st = cuda_event_record(g->ev[0], g->s);
    for (int32_t r = 1; r <= R && st == TM_OK; r++) st = calib_gpu_launch(x, &g->vram, r, n_tok);
    if (st == TM_OK) st = cuda_event_record(g->ev[1], g->s);
    if (st == TM_OK) st = cuda_stream_sync(g->s);
    double t = 0;
    if (st == TM_OK) st = calib_elapsed_ns(g, &t);
    *ns = t / R / x->k;
    return st;
}

/* ---- copies ---- */

typedef enum { CALIB_H2D_PINNED, CALIB_H2D_PAGEABLE, CALIB_D2H_PINNED } calib_copy_kind;

static tm_status calib_copy_once(calib_ctx *x, calib_copy_kind kind, void *dev, void *pinned,
                                 void *pageable, size_t bytes, double *ns) {
    calib_gpu *g = &x->g;
    tm_status st;
    if (kind == CALIB_H2D_PAGEABLE) { /* synchronous: wall time */
        const uint64_t t0 = tm_time_ns();
        st = cuda_upload(g->dev, dev, pageable, bytes, NULL);
        *ns = (double)(tm_time_ns() - t0);
        return st;
    }
    if ((st = cuda_event_record(g->ev[0], g->s)) ||
        (st = kind == CALIB_H2D_PINNED ? cuda_copy_async(dev, pinned, bytes, g->s)
                                       : cuda_copy_async(pinned, dev, bytes, g->s)) ||
        (st = cuda_event_record(g->ev[1], g->s)) || (st = cuda_stream_sync(g->s)))
        return st;
    return calib_elapsed_ns(g, ns);
}

/* GB/s of one kind and size: median over reps after a warm-up. */
static tm_status calib_copy_rate(calib_ctx *x, calib_copy_kind kind, void *dev, void *pinned,
                                 void *pageable, size_t bytes, double *gbs) {
    double t[16], ns;
    const int reps = x->quick ? 3 : 5;
    tm_status st = calib_copy_once(x, kind, dev, pinned, pageable, bytes, &ns);
    for (int r = 0; r < reps && st == TM_OK; r++)
        st = calib_copy_once(x, kind, dev, pinned, pageable, bytes, &t[r]);
    if (st == TM_OK) *gbs = (double)bytes / calib_median(t, reps);
    return st;
}

static tm_status calib_copies(calib_ctx *x) {
    calib_gpu *g = &x->g;
    tm_calib_copy *c = &x->c->copy;
    uint64_t big = (x->quick ? 32 : 256) * CALIB_MIB;
    if (big < 4 * x->eb) big = 4 * x->eb;
    c->expert_bytes = x->eb, c->big_bytes = big;
    tm_cuda_pool *pool = NULL;
    void *dev = NULL, *pinned = NULL, *pageable = malloc(big);
    tm_status st = pageable ? TM_OK : tm_error_set(TM_ERR_NOMEM, "calibration: out of memory");
    if (st == TM_OK) st = cuda_pool_create(g->dev, big, &pool);
    if (st == TM_OK) st = cuda_pool_alloc(pool, big, 256, &dev);
    if (st == TM_OK) st = cuda_host_alloc(big, &pinned);
    if (st == TM_OK) {
        memset(pageable, 1, big);
        memset(pinned, 1, big);
    }
    const struct {
        calib_copy_kind kind;
        uint64_t bytes;
        double *gbs;
    } runs[] = {{CALIB_H2D_PINNED, x->eb, &c->h2d_pinned_expert_gbs},
                {CALIB_H2D_PINNED, big, &c->h2d_pinned_big_gbs},
                {CALIB_H2D_PAGEABLE, x->eb, &c->h2d_pageable_expert_gbs},
                {CALIB_H2D_PAGEABLE, big, &c->h2d_pageable_big_gbs},
                {CALIB_D2H_PINNED, big, &c->d2h_pinned_big_gbs}};
    for (size_t i = 0; i < sizeof(runs) / sizeof(*runs) && st == TM_OK; i++)
        st = calib_copy_rate(x, runs[i].kind, dev, pinned, pageable, runs[i].bytes, runs[i].gbs);
    (void)cuda_stream_sync(g->s);
    cuda_host_free(pinned);
    cuda_pool_free(pool);
    free(pageable);
    return st;
}

/* ---- the PCIe lane, alone and beside the CPU lane ---- */

/* Spin until *flag reaches want (the stream's signal). Gives up when the
 * stream fails, goes idle without it, or after CALIB_SPIN_TIMEOUT_NS. */
static tm_status calib_spin(calib_gpu *g, const uint32_t *flag, uint32_t want) {
    const uint64_t t0 = tm_time_ns();
    uint64_t last = t0;
    for (unsigned i = 0;; i++) {
        if ((int32_t)(__atomic_load_n(flag, __ATOMIC_ACQUIRE) - want) >= 0) return TM_OK;
        calib_relax();
        if ((i & 1023) != 1023) continue;
        const uint64_t now = tm_time_ns();
        if (now - last < 1000000) continue;
        last = now;
        bool idle = false;
        tm_status st = cuda_stream_query(g->s, &idle);
        if (st != TM_OK) return tm_error_wrap(st, "hand-off %u", want);
        if (idle && (int32_t)(__atomic_load_n(flag, __ATOMIC_ACQUIRE) - want) < 0)
            return tm_error_set(TM_ERR_DEVICE,
                                "calibration: the GPU finished without hand-off %u's signal", want);
        if (now - t0 > CALIB_SPIN_TIMEOUT_NS)
            return tm_error_set(TM_ERR_DEVICE, "calibration: no signal from the GPU in %.0f s",
                                CALIB_SPIN_TIMEOUT_NS * 1e-9);
    }
}

/* The stream waits for the host's go (mb[0] = 1): what is queued after it
 * starts when the host says so, not while it is still queueing. */
static tm_status calib_gate(calib_gpu *g) {
    __atomic_store_n(&g->mb[0], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&g->mb[3], 0, __ATOMIC_RELEASE);
    return cuda_wait_host(&g->mb_dev[0], g->seq, CALIB_GPU_WAIT_NS, &g->mb_dev[3], NULL, NULL, 0,
                          g->s);
}

static tm_status calib_gate_check(calib_gpu *g) {
    if (__atomic_load_n(&g->mb[3], __ATOMIC_ACQUIRE))
        return tm_error_set(TM_ERR_DEVICE, "calibration: the GPU gave up waiting for the host");
    return TM_OK;
}

/* R launches over p, 1 token: items as calib_items laid out for launches 0..m-1. */
static tm_status calib_pcie_run(calib_ctx *x, const tm_cuda_moe_params *p, int32_t R) {
    tm_status st = cuda_event_record(x->g.ev[0], x->g.s);
    for (int32_t r = 0; r < R && st == TM_OK; r++) st = calib_gpu_launch(x, p, r % p->n_slots, 1);
    return st == TM_OK ? cuda_event_record(x->g.ev[1], x->g.s) : st;
}

/* CPU lane decode calls until `until` says stop; its expert bytes per ns. */
static tm_status calib_cpu_stream(calib_ctx *x, uint64_t min_ns, calib_gpu *busy, double *gbs,
                                  int *calls) {
    const uint64_t t0 = tm_time_ns();
    uint64_t d;
    tm_status st = TM_OK;
    *calls = 0;
    for (;;) {
        if ((st = calib_cpu_call(x, 1, &d))) return st;
        ++*calls;
        if (busy) {
            bool idle = false;
            if ((st = cuda_stream_query(busy->s, &idle))) return st;
            if (idle) break;
        } else if (tm_time_ns() - t0 >= min_ns) {
            break;
        }
    }
    *gbs = (double)*calls * (double)x->k * (double)x->eb / (double)(tm_time_ns() - t0);
    return TM_OK;
}

static tm_status calib_pcie(calib_ctx *x) {
    calib_gpu *g = &x->g;
    tm_calib *c = x->c;
    const size_t page = (size_t)(sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096);
    const size_t bytes = (calib_packed_bytes(x, g->m) + page - 1) & ~(page - 1);
    void *host = NULL, *dev = NULL;
    if (posix_memalign(&host, page, bytes))
        return tm_error_set(TM_ERR_NOMEM, "calibration: out of memory for %.1f MiB of experts",
                            bytes / 1048576.0);
    tm_cuda_moe_params p = calib_packed(x, host, g->m);
    tm_status st = calib_fill(x, &p, false);
    if (st == TM_OK) st = cuda_host_register(host, bytes, true, &dev);
    if (st != TM_OK) {
        free(host);
        return tm_error_wrap(st, "the PCIe lane");
    }
    p = calib_packed(x, dev, g->m);
    for (int32_t r = 0; r < g->m; r++) calib_items(x, r, 1, g->m);
    st = cuda_copy_async(g->items, g->items_h, (size_t)g->m * (size_t)x->k * sizeof(*g->items),
                         g->s);
    /* alone: a probe of 3 launches sizes the run */
    double probe = 0, ns = 0;
    int32_t R = 3;
    if (st == TM_OK) st = calib_pcie_run(x, &p, 1); /* warm-up */
    if (st == TM_OK) st = calib_pcie_run(x, &p, R);
    if (st == TM_OK) st = cuda_stream_sync(g->s);
    if (st == TM_OK) st = calib_elapsed_ns(g, &probe);
    if (st == TM_OK) {
        const double per = probe / R;
        R = (int32_t)fmin(fmax((double)x->concurrent_ns / per, 3), 20000);
        st = calib_pcie_run(x, &p, R);
    }
    if (st == TM_OK) st = cuda_stream_sync(g->s);
    if (st == TM_OK) st = calib_elapsed_ns(g, &ns);
    const double launch_bytes = (double)x->k * (double)x->eb;
    if (st == TM_OK) c->pcie_read_gbs = R * launch_bytes / ns;
    int calls = 0;
    if (st == TM_OK) st = calib_cpu_stream(x, x->concurrent_ns, NULL, &c->cpu_lane_gbs, &calls);
    /* together: the stream starts on the host's go, the CPU lane runs until it is idle */
    if (R > CALIB_GATED_MAX) R = CALIB_GATED_MAX;
    if (st == TM_OK) st = calib_gate(g);
    if (st == TM_OK) st = calib_pcie_run(x, &p, R);
    if (st == TM_OK) {
        __atomic_store_n(&g->mb[0], 1, __ATOMIC_RELEASE);
        st = calib_cpu_stream(x, 0, g, &c->cpu_lane_concurrent_gbs, &calls);
    }
    __atomic_store_n(&g->mb[0], 1, __ATOMIC_RELEASE); /* never leave the stream waiting */
    if (st == TM_OK) st = cuda_stream_sync(g->s);
    if (st == TM_OK) st = calib_gate_check(g);
    if (st == TM_OK) st = calib_elapsed_ns(g, &ns);
    if (st == TM_OK) c->pcie_read_concurrent_gbs = R * launch_bytes / ns;
    (void)cuda_stream_sync(g->s);
    cuda_host_unregister(host);
    free(host);
    if (st == TM_OK && x->log && calls < 3)
        fprintf(x->log,
                "  (the GPU finished after %d CPU lane calls: the concurrent rates are "
                "rough)\n",
                calls);
    return st;
}

/* ---- hand-off ---- */

static tm_status calib_handoff(calib_ctx *x) {
    calib_gpu *g = &x->g;
    const int64_t E = x->c->key.expert.n_embd, K = x->k;
    uint32_t *flag_h = &g->mb[1], *flag_y = &g->mb[2];
    uint32_t *flag_h_d = &g->mb_dev[1], *flag_y_d = &g->mb_dev[2], *err_d = &g->mb_dev[3];
    float *h_d = (float *)(g->mb_dev + 4), *y_d = h_d + E;
    int32_t *ids_d = (int32_t *)(y_d + E);
    float *w_d = (float *)(ids_d + K);
    const tm_cuda_span spans[3] = {
        {h_d, g->src_h, E * 4}, {ids_d, g->src_ids, K * 4}, {w_d, g->src_w, K * 4}};
    __atomic_store_n(flag_h, 0, __ATOMIC_RELEASE);
    __atomic_store_n(flag_y, 0, __ATOMIC_RELEASE);
    tm_status st = calib_gate(g);
    if (st == TM_OK) st = cuda_event_record(g->ev[0], g->s);
    for (int32_t i = 0; i < x->handoffs && st == TM_OK; i++) {
        st = cuda_signal_host(spans, 3, flag_h_d, g->seq + i, g->s);
        if (st == TM_OK)
            st = cuda_wait_host(flag_y_d, g->seq + i, CALIB_GPU_WAIT_NS, err_d, g->add, y_d, E,
                                g->s);
    }
    if (st == TM_OK) st = cuda_event_record(g->ev[1], g->s);
    if (st == TM_OK) __atomic_store_n(&g->mb[0], 1, __ATOMIC_RELEASE);
    for (int32_t i = 0; i < x->handoffs && st == TM_OK; i++) {
        st = calib_spin(g, flag_h, (uint32_t)i + 1);
        __atomic_store_n(flag_y, (uint32_t)i + 1, __ATOMIC_RELEASE); /* always answer */
    }
    if (st != TM_OK) { /* never leave the stream waiting */
        __atomic_store_n(&g->mb[0], 1, __ATOMIC_RELEASE);
        __atomic_store_n(flag_y, (uint32_t)x->handoffs, __ATOMIC_RELEASE);
    }
    tm_status st2 = cuda_stream_sync(g->s);
    if (st == TM_OK) st = st2;
    if (st == TM_OK) st = calib_gate_check(g);
    double ns = 0;
    if (st == TM_OK) st = calib_elapsed_ns(g, &ns);
    if (st == TM_OK) x->c->handoff_round_trip_ns = ns / x->handoffs;
    return st;
}

/* ---- the whole measurement ---- */

/* The parts without a function of their own. */

static tm_status calib_membw(calib_ctx *x) {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    uint64_t b = 4 * (l3 > 0 ? (uint64_t)l3 : 32 * CALIB_MIB);
    if (b < 256 * CALIB_MIB) b = 256 * CALIB_MIB;
    x->c->cpu_read_gbs = cpu_read_bandwidth_gbs(x->src->pool, (size_t)b);
    return TM_OK;
}

static tm_status calib_touch_part(calib_ctx *x) {
    tm_status st = calib_cpu_setup(x);
    if (st == TM_OK) calib_touch(x);
    return st;
}

static tm_status calib_cpu_curve(calib_ctx *x) {
    if (x->log) {
        fprintf(x->log, "working set: experts 0-%u of %u layer%s (%.1f MiB), read once in %.2f s\n",
                x->ws_experts - 1, x->ws_layers, x->ws_layers > 1 ? "s" : "",
                (double)x->ws_layers * x->ws_experts * (double)x->eb / 1048576.0,
                x->c->measure_s[TM_CALIB_PHASE_TOUCH]);
        calib_print_cpu_head(x->log);
    }
    return calib_curve(x, &x->c->cpu_expert, calib_cpu_point, calib_print_cpu_row);
}

static tm_status calib_gpu_open(calib_ctx *x) {
    calib_gpu *g = &x->g;
    g->dev = x->src->gpu, g->s = cuda_device_stream(g->dev);
    tm_status st = cuda_event_create(&g->ev[0]);
    return st == TM_OK ? cuda_event_create(&g->ev[1]) : st;
}

static tm_status calib_gpu_curve(calib_ctx *x) {
    tm_status st = calib_fill(x, &x->g.vram, true);
    if (st != TM_OK) return st;
    if (x->log) calib_print_gpu_head(x->log);
    return calib_curve(x, &x->c->gpu_expert, calib_gpu_point, calib_print_gpu_row);
}

typedef tm_status (*calib_part_fn)(calib_ctx *x);
typedef void (*calib_print_fn)(FILE *f, const tm_calib *c);

/* Every part in order: its phase (where its time goes), whether it needs the
 * GPU, whether a quick measurement skips it, what an error is prefixed with,
 * what prints its result (NULL: it prints its own rows). */
static const struct calib_part {
    calib_part_fn run;
    tm_calib_phase phase;
    bool gpu, full_only;
    const char *what;
    calib_print_fn print;
} calib_parts[] = {
    {calib_membw, TM_CALIB_PHASE_MEMBW, false, true, NULL, calib_print_membw},
    {calib_touch_part, TM_CALIB_PHASE_TOUCH, false, false, NULL, NULL},
    {calib_cpu_curve, TM_CALIB_PHASE_CPU, false, false, "the CPU lane", NULL},
    {calib_gpu_open, TM_CALIB_PHASE_COPY, true, false, NULL, NULL},
    {calib_copies, TM_CALIB_PHASE_COPY, true, false, "copy rates", calib_print_copy},
    {calib_gpu_setup, TM_CALIB_PHASE_GPU, true, false, "GPU buffers", NULL},
    {calib_pcie, TM_CALIB_PHASE_PCIE, true, false, NULL, calib_print_pcie},
    {calib_gpu_curve, TM_CALIB_PHASE_GPU, true, false, "GPU experts from VRAM", NULL},
    {calib_handoff, TM_CALIB_PHASE_HANDOFF, true, false, NULL, calib_print_handoff},
};

static tm_status calib_run(calib_ctx *x) {
    if (x->log) calib_print_head(x->log, x->c);
    for (size_t i = 0; i < sizeof(calib_parts) / sizeof(*calib_parts); i++) {
        const struct calib_part *p = &calib_parts[i];
        if (p->gpu && !x->src->gpu) break;
        const uint64_t t0 = tm_time_ns();
        tm_status st = x->quick && p->full_only ? TM_OK : p->run(x);
        if (!(x->quick && p->full_only))
            x->c->measure_s[p->phase] += (double)(tm_time_ns() - t0) * 1e-9;
        if (st != TM_OK) return p->what ? tm_error_wrap(st, "%s", p->what) : st;
        if (x->log && p->print) p->print(x->log, x->c);
    }
    return TM_OK;
}

tm_status calib_measure(const tm_calib_source *src, const tm_calib_opts *o, tm_calib *out) {
    memset(out, 0, sizeof(*out));
    tm_status st = calib_key_make(src, &out->key);
    if (st != TM_OK) return st;
    calib_ctx x = {.src = src, .c = out, .log = o->log, .quick = o->quick};
    x.k = (int32_t)src->n_used, x.eb = out->key.expert.bytes;
    x.max_tok = o->max_tokens > 0 ? o->max_tokens : tm_calib_tokens[TM_CALIB_N_TOKENS - 1];
    x.reps = o->quick ? 1 : 5, x.gpu_reps = o->quick ? 3 : 10, x.handoffs = o->quick ? 20 : 100;
    x.concurrent_ns = (o->quick ? 20 : 200) * 1000000ull;
    out->quick = o->quick, out->experts_per_call = x.k;
    snprintf(out->cpu_level, sizeof(out->cpu_level), "%s", cpu_level_name(cpu_level_get()));
    const time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(out->created, sizeof(out->created), "%Y-%m-%dT%H:%M:%SZ", &utc);
    st = calib_run(&x);
    calib_gpu_free(&x.g);
    moe_cpu_lane_free(x.lane);
    moe_worklist_free(&x.wl);
    free(x.x), free(x.y), free(x.ids), free(x.w), free(x.use);
    if (st == TM_OK && x.log) calib_print_time(x.log, out);
    return st;
}
