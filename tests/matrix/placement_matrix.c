/* The placement matrix: see placement_matrix.h. */
#include "placement_matrix.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "tier/gpus.h"
#include "model/synth.h"
#include "tier/plan.h"
#include "trace/trace.h"

#define PM_ALL (1 << 20) /* -ngl all */

#define PM_CHECK(call, what)                                                                       \
    do {                                                                                           \
        tm_status st_ = (call);                                                                    \
        if (st_ != TM_OK) fail_msg("%s: %s: %s", what, #call, tm_error_message());                 \
    } while (0)

void pm_model_config(tm_synth_config *sc, uint32_t n_layer, uint32_t n_expert, tm_type type_attn) {
    if (synth_config_preset(sc, "tiny") != TM_OK) fail_msg("%s", tm_error_message());
    sc->n_layer = n_layer, sc->n_expert = n_expert, sc->n_threads = 2, sc->seed = 11;
    sc->type_attn = type_attn;
}

tm_status pm_model_write_config(char *path, size_t len, const char *name,
                                const tm_synth_config *sc) {
    const char *tmp = getenv("TM_TEST_TMP");
    snprintf(path, len, "%s/%s", tmp ? tmp : "/tmp", name);
    return synth_model_write(sc, path);
}

void pm_model_write(char *path, size_t len, const char *name, uint32_t n_layer, uint32_t n_expert,
                    tm_type type_attn) {
    tm_synth_config sc;
    pm_model_config(&sc, n_layer, n_expert, type_attn);
    if (pm_model_write_config(path, len, name, &sc) != TM_OK)
        fail_msg("mkmodel: %s", tm_error_message());
}

double pm_attn_spread(const char *path) {
    tm_model *m;
    PM_CHECK(model_load(path, &m), path);
    double most = 1;
    for (uint32_t l = 0; !strcmp(m->arch->name, "gemma4") && l < m->cfg.n_layer; l++) {
        char qn[64], kn[64];
        snprintf(qn, sizeof(qn), "blk.%u.attn_q_norm.weight", l);
        snprintf(kn, sizeof(kn), "blk.%u.attn_k_norm.weight", l);
        const tm_gguf_tensor *q = gguf_file_find_tensor(m->file, qn),
                             *k = gguf_file_find_tensor(m->file, kn);
        if (!q || !k || q->type != TM_TYPE_F32 || k->type != TM_TYPE_F32 ||
            q->n_elements != k->n_elements || !q->data || !k->data)
            fail_msg("%s: want f32 %s and %s of one length", path, qn, kn);
        const float *gq = q->data, *gk = k->data;
        double s = 0; /* sum of (g_q g_k)^2: the logit's variance for unit-RMS q and k */
        for (int64_t i = 0; i < q->n_elements; i++) s += (double)gq[i] * gk[i] * gq[i] * gk[i];
        most = fmax(most, sqrt(s));
    }
    model_free(m);
    return most;
}

static void *pm_alloc(size_t n) { /* zeroed: a dense layer's routing stays 0, as the reference's */
    void *p = calloc(1, n ? n : 1);
    if (!p) fail_msg("out of memory (%zu bytes)", n);
    return p;
}

static void pm_route_cb(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                        int64_t n, bool is_int) {
    pm_run *r = ud;
    if (layer < 0 || layer >= r->n_layer || n_tok > r->n_tok) return;
    if (!strcmp(name, "topk_ids") && is_int)
        memcpy(r->ids + (int64_t)layer * r->n_tok * r->k, data, (size_t)(n_tok * n) * 4);
    if (!strcmp(name, "router_logits"))
        memcpy(r->logits + (int64_t)layer * r->n_tok * r->n_expert, data, (size_t)(n_tok * n) * 4);
}

pm_run *pm_run_open(tm_model *m, const tm_context_params *p) {
    pm_run *r = pm_alloc(sizeof(*r));
    r->n_layer = (int)m->cfg.n_layer, r->k = (int)m->cfg.n_expert_used;
    r->n_expert = (int)m->cfg.n_expert;
    tm_context_params cp = *p;
    cp.cb = pm_route_cb, cp.cb_ud = r;
    PM_CHECK(model_context_create(m, &cp, &r->ctx), "context");
    r->n_tok = r->ctx->params.n_batch; /* the context's (n_batch 0: the engine's choice) */
    r->ids = pm_alloc((size_t)(r->n_layer * r->n_tok * r->k) * 4);
    r->logits = pm_alloc((size_t)(r->n_layer * r->n_tok * r->n_expert) * 4);
    return r;
}

void pm_run_close(pm_run *r) {
    if (!r) return;
    model_context_free(r->ctx);
    free(r->ids), free(r->logits), free(r);
}

tm_context *pm_run_context(pm_run *r) {
    return r->ctx;
}

double pm_rel_l2(const float *a, const float *ref, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        e += d * d, s += (double)ref[i] * ref[i];
    }
    return sqrt(e / (s + 1e-300));
}

/* Number of (layer, token) routings that differ; fails on one that is not a near tie. */
static int pm_route_compare(const pm_run *ref, const pm_run *run, int64_t n_tok, double tie,
                            const char *what) {
    int ties = 0;
    float *sorted = pm_alloc((size_t)ref->n_expert * 4);
    for (int l = 0; l < ref->n_layer; l++)
        for (int64_t t = 0; t < n_tok; t++) {
            const int32_t *a = ref->ids + ((int64_t)l * ref->n_tok + t) * ref->k;
            const int32_t *b = run->ids + ((int64_t)l * run->n_tok + t) * run->k;
            bool same = true;
            for (int j = 0; j < ref->k; j++) {
                bool found = false;
                for (int i = 0; i < ref->k; i++) found |= a[j] == b[i];
                same &= found;
            }
            if (same) continue;
            const float *lg = ref->logits + ((int64_t)l * ref->n_tok + t) * ref->n_expert;
            memcpy(sorted, lg, (size_t)ref->n_expert * 4);
            for (int i = 0; i <= ref->k && i < ref->n_expert; i++) /* partial selection sort */
                for (int j = i + 1; j < ref->n_expert; j++)
                    if (sorted[j] > sorted[i]) {
                        const float x = sorted[i];
                        sorted[i] = sorted[j], sorted[j] = x;
                    }
            const double gap = sorted[ref->k - 1] - sorted[ref->k];
            if (!(gap < tie))
                fail_msg("%s: layer %d token %lld routed differently, reference margin %.3g", what,
                         l, (long long)t, gap);
            ties++;
        }
    free(sorted);
    return ties;
}

int pm_compare(tm_model *m, const int32_t *toks, int64_t n_prompt, int64_t n_decode, pm_run *ref,
               pm_run *run, double tol_prompt, double tol_decode, double tie, const char *what) {
    const int64_t V = m->cfg.n_vocab, B = ref->ctx->params.n_batch;
    double worst_p = 0, worst_d = 0;
    int ties = 0;
    for (int64_t i = 0; i < n_prompt + n_decode;) {
        const int64_t n = i < n_prompt ? (n_prompt - i < B ? n_prompt - i : B) : 1;
        const tm_moe_phase ph = i < n_prompt ? TM_MOE_PHASE_PROMPT : TM_MOE_PHASE_DECODE;
        PM_CHECK(model_decode(ref->ctx, toks + i, n, ph, false), what);
        PM_CHECK(model_decode(run->ctx, toks + i, n, ph, false), what);
        const int t = pm_route_compare(ref, run, n, tie, what);
        ties += t;
        const double err = pm_rel_l2(run->ctx->logits, ref->ctx->logits, V);
        const double tol = ph == TM_MOE_PHASE_PROMPT ? tol_prompt : tol_decode;
        if (!t && !(err <= tol))
            fail_msg("%s: logits after tokens [%lld, %lld): relative error %.3g > %.3g", what,
                     (long long)i, (long long)(i + n), err, tol);
        if (!t && ph == TM_MOE_PHASE_PROMPT) worst_p = fmax(worst_p, err);
        if (!t && ph == TM_MOE_PHASE_DECODE) worst_d = fmax(worst_d, err);
        i += n;
    }
    printf("    %s: worst logits error prompt %.3g (tol %.3g), decode %.3g (tol %.3g), %d near "
           "ties\n",
           what, worst_p, tol_prompt, worst_d, tol_decode, ties);
    return ties;
}

/* ---- the matrix ---- */

typedef struct pm_case {
    const char *name;
    int ngl;
    bool cpu_moe;
    int n_cpu_moe;
    const char *ot;
    int64_t cache_mib;
    int pcie;        /* --moe-pcie: 0 auto */
    int fetch;       /* --moe-fetch: 0 auto */
    const char *env; /* NAME=VALUE[ NAME=VALUE]: set while the case's contexts are made */
    int update;      /* --moe-cache-update (0: between requests only) */
    bool lru;        /* --moe-cache-policy lru --moe-cache-admit 0: an upload per miss */
    int ahead;       /* --moe-ahead: 0 auto (off) */
    int64_t ram_mib; /* --ram-cache (0: none) */
} pm_case;

/* -dev CUDA0,CUDA1 --tensor-split pm_split for the cases running now (NULL: one GPU;
 * placement_matrix_run_gpus) */
static const char *pm_split;

static const pm_case pm_cases[] = {
    {"CPU only", 0, false, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"-ngl all", PM_ALL, false, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"-ngl 2", 2, false, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    /* the hot experts' f32 activations in the normal mode (8-bit is the default there; the
       precise runs keep f32 either way) */
    {"-ngl all, TIERMOE_MOE_Q8X=0", PM_ALL, false, 0, NULL, 0, 0, 0, "TIERMOE_MOE_Q8X=0", 0, false,
     0, 0},
    {"--cpu-moe --moe-pcie off", PM_ALL, true, 0, NULL, 0, TM_MOE_PCIE_OFF, 0, NULL, 0, false, 0,
     0},
    {"--cpu-moe --moe-ahead 2", PM_ALL, true, 0, NULL, 0, 0, 0, NULL, 0, false, 2, 0},
    {"--cpu-moe --moe-cache 1 --moe-ahead 1 (copies ahead into cached layers)", PM_ALL, true, 0,
     NULL, 1, 0, 0, NULL, 0, false, 1, 0},
    /* the defaults with a cache: one copy ahead a layer into its slots, the PCIe lane off */
    {"--cpu-moe --moe-cache 1 (defaults: copies ahead into the cache)", PM_ALL, true, 0, NULL, 1, 0,
     0, NULL, 0, false, 0, 0},
    {"--cpu-moe --moe-ahead 4 --moe-pcie off", PM_ALL, true, 0, NULL, 0, TM_MOE_PCIE_OFF, 0, NULL,
     0, false, 4, 0},
    {"--cpu-moe", PM_ALL, true, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"--cpu-moe --moe-pcie 32 (every routed expert over PCIe)", PM_ALL, true, 0, NULL, 0, 32, 0,
     NULL, 0, false, 0, 0},
    /* the decode share tuned, a step a candidate: it changes between steps of one graph */
    {"--cpu-moe, the PCIe lane's share tuned", PM_ALL, true, 0, NULL, 0, 0, 0,
     "TIERMOE_PCIE_TUNE=1", 0, false, 0, 0},
    {"--cpu-moe --moe-fetch pcie (prompts read in place)", PM_ALL, true, 0, NULL, 0, 0,
     TM_MOE_FETCH_PCIE, NULL, 0, false, 0, 0},
    {"--cpu-moe --moe-fetch off", PM_ALL, true, 0, NULL, 0, 0, TM_MOE_FETCH_OFF, NULL, 0, false, 0,
     0},
    /* a ring smaller than a layer (it wraps within and across layers) and a
     * fixed CPU share, so every prompt layer has both lanes */
    {"--cpu-moe, fetch ring 2x3, CPU share 0.3", PM_ALL, true, 0, NULL, 0, 0, TM_MOE_FETCH_COPY,
     "TIERMOE_FETCH_RING=2x3 TIERMOE_FETCH_CPU_SHARE=0.3", 0, false, 0, 0},
    /* the SSD tier: prompts' routed experts read into a RAM cache smaller than a
     * layer's experts and copied from its pinned slots through a small ring */
    {"--cpu-moe --ram-cache 1 --moe-fetch copy, fetch ring 2x3", PM_ALL, true, 0, NULL, 0,
     TM_MOE_PCIE_OFF, TM_MOE_FETCH_COPY, "TIERMOE_FETCH_RING=2x3", 0, false, 0, 1},
    {"--n-cpu-moe 2", PM_ALL, false, 2, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"--cpu-moe --moe-cache 2 --moe-cache-update full (learn file of random counts, adaptive)",
     PM_ALL, true, 0, NULL, 2, 0, 0, NULL, TM_MOE_UPDATE_FULL, false, 0, 0},
    {"--cpu-moe --moe-cache 2 --moe-cache-update off", PM_ALL, true, 0, NULL, 2, 0, 0, NULL,
     TM_MOE_UPDATE_OFF, false, 0, 0},
    /* every miss uploaded: slots change every step, uploads in flight overlap */
    {"--cpu-moe --moe-cache 1 --moe-cache-policy lru --moe-cache-admit 0", PM_ALL, true, 0, NULL, 1,
     0, 0, NULL, TM_MOE_UPDATE_FULL, true, 0, 0},
    /* layer 0: attention on the GPU, experts in RAM; layer 1: its output
     * projection on the CPU between GPU ops; later layers: attention on the
     * CPU, experts on the GPU */
    {"-ngl 2 -ot mix", 2, false, 0,
     "blk\\.0\\.ffn_(gate|up|down|gate_up)_exps=CPU,blk\\.1\\.attn_output\\.weight=CPU,"
     "blk\\.[2-9]\\.ffn_(gate|up|down|gate_up)_exps=CUDA0",
     0, 0, 0, NULL, 0, false, 0, 0},
};

/* plan (may be NULL): the cache cases' plan instead of one made from learn and the budget. */
static tm_context_params pm_params(const pm_case *c, const tm_trace_stats *learn,
                                   const tm_plan *plan, bool precise, tm_type kv, int64_t n_batch) {
    tm_gpu_opts gpus = {0};
    if (pm_split && (gpus_devices_parse("-dev", "CUDA0,CUDA1", &gpus) != TM_OK ||
                     gpus_split_parse("-ts", pm_split, &gpus) != TM_OK))
        fail_msg("%s: %s", c->name, tm_error_message());
    return (tm_context_params){.n_ctx = 256,
                               .gpus = gpus,
                               .n_batch = n_batch,
                               .n_threads = 2,
                               .kv_type = kv,
                               .precise = precise,
                               .n_gpu_layers = c->ngl,
                               .cpu_moe = c->cpu_moe,
                               .n_cpu_moe = c->n_cpu_moe,
                               .override_tensor = c->ot,
                               .moe_cache_mib = c->cache_mib,
                               .moe_pcie = c->pcie,
                               .moe_fetch = c->fetch,
                               .moe_ahead = c->ahead,
                               .ram_cache_mib = c->ram_mib,
                               .moe_cache = {.learn = c->cache_mib ? learn : NULL,
                                             .plan = c->cache_mib ? plan : NULL,
                                             .update = c->update,
                                             .policy_set = c->lru,
                                             .policy = TM_CACHE_LRU,
                                             .max_admit = c->lru ? -1 : 0}};
}

/* Set (on) or unset the case's environment. The PCIe lane's share is not tuned unless a
 * case says so (TIERMOE_PCIE_TUNE): the lanes' checks below know the share it starts at. */
static void pm_env(const pm_case *c, bool on) {
    if (on)
        setenv("TIERMOE_PCIE_TUNE", "0", 1);
    else
        unsetenv("TIERMOE_PCIE_TUNE");
    if (!c->env) return;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", c->env);
    for (char *save = NULL, *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) fail_msg("pm_case env: '%s' is not NAME=VALUE", kv);
        *eq = '\0';
        if (on)
            setenv(kv, eq + 1, 1);
        else
            unsetenv(kv);
    }
}

/* --moe-ahead auto copies into the cache (and turns the PCIe lane's auto share off). */
static bool pm_auto_ahead(const pm_case *c) {
    return c->ahead == TM_MOE_AHEAD_AUTO && c->cache_mib && c->update == TM_MOE_UPDATE_BETWEEN &&
           c->pcie == TM_MOE_PCIE_AUTO;
}

/* Whether layer l of the model has routed experts (GLM's leading dense layers do not). */
static bool pm_moe_layer(const tm_model *m, uint32_t l) {
    char name[64], fused[64]; /* gemma4: gate and up one tensor */
    snprintf(name, sizeof(name), "blk.%u.ffn_gate_exps.weight", l);
    snprintf(fused, sizeof(fused), "blk.%u.ffn_gate_up_exps.weight", l);
    return gguf_file_find_tensor(m->file, name) || gguf_file_find_tensor(m->file, fused);
}

/* The model's layers with routed experts. */
static uint32_t pm_moe_layers(const tm_model *m) {
    uint32_t n = 0;
    for (uint32_t l = 0; l < m->cfg.n_layer; l++) n += pm_moe_layer(m, l);
    return n;
}

/* Whether the case puts experts in RAM while a GPU runs (the -ot mix puts layer 0's
 * there: none when layer 0 is dense). */
static bool pm_ram_on_gpu(const pm_case *c, const tm_context *ctx) {
    (void)c;
    for (uint32_t l = 0; l < ctx->model->cfg.n_layer; l++)
        if (ctx->placement.layer_dev[l] == TM_DEV_GPU &&
            ctx->placement.experts_dev[l] != TM_DEV_GPU && pm_moe_layer(ctx->model, l))
            return true;
    return false;
}

/* Over several GPUs: each GPU copied ahead for its own layers, where one of them follows
 * another of its layers (a span's first layer gets none: its copies would be queued on the
 * GPU before), and computed slots from them. */
static void pm_check_ahead_gpus(const pm_case *c, const tm_context *ctx, const char *what) {
    const tm_placement *pl = &ctx->placement;
    int n_gpu = 0;
    const tm_tier_stats *gs = tier_stats_gpu(ctx->tier, &n_gpu);
    if (n_gpu != 2) fail_msg("%s: counts of %d GPUs, want 2", what, n_gpu);
    for (int g = 0; g < n_gpu; g++) {
        bool want = false;
        for (uint32_t l = 1; l < ctx->model->cfg.n_layer; l++)
            want |= pl->layer_gpu[l] == g && pl->layer_gpu[l - 1] == g &&
                    pl->layer_dev[l] == TM_DEV_GPU && pl->experts_dev[l] != TM_DEV_GPU &&
                    pm_moe_layer(ctx->model, l) && pm_moe_layer(ctx->model, l - 1) &&
                    (c->ahead > 0 || tier_cache_slots(ctx->tier, l) > 0);
        if (want != (gs[g].ahead_experts > 0) || want != (gs[g].ahead_slots > 0))
            fail_msg("%s: GPU %d: %llu experts copied ahead, %llu slots computed from them, "
                     "want %s",
                     what, g, (unsigned long long)gs[g].ahead_experts,
                     (unsigned long long)gs[g].ahead_slots, want ? "some" : "none");
    }
}

/* The tier's counters after a run: every layer in the class the placement
 * implies, and the lanes it implies did work. */
static void pm_check_lanes(const pm_case *c, const tm_context *ctx, const char *what) {
    const uint32_t L = pm_moe_layers(ctx->model), K = ctx->model->cfg.n_expert_used;
    const tm_tier_stats *s = tier_stats(ctx->tier);
    /* the PCIe lane: there whenever a GPU computes layers with experts in RAM */
    const int32_t n_pcie = tier_pcie_slots(ctx->tier);
    uint64_t pcie = 0, cold = 0;
    for (int i = 0; i < TM_TIER_CLASS_COUNT; i++) pcie += s[i].pcie_slots, cold += s[i].cold_slots;
    const bool ram_on_gpu = pm_ram_on_gpu(c, ctx);
    /* auto: some but not all of k >= 3 (none when copies ahead go into a cache by default);
     * with k = 2 the built-in share (85/256: tm_cuda_mapped_count) keeps both on the CPU, a
     * calibration may give the GPU one */
    const bool ok = !ram_on_gpu || c->pcie == TM_MOE_PCIE_OFF || pm_auto_ahead(c) ? n_pcie == 0
                    : c->pcie > 0 ? n_pcie == (c->pcie < (int)K ? c->pcie : (int32_t)K)
                                  : K < 2 || (n_pcie >= (K >= 3) && n_pcie < (int32_t)K);
    /* the lane ran where there was a cold expert to read (a cache that holds every expert
     * leaves none). With a measured share its count follows each token's cold slots
     * (tm_cuda_mapped_count): a cache or copies ahead that leave one cold slot of k = 2 may
     * leave it to the CPU (seen on the H200 with qwen3next's k = 2), so the lane must have run
     * only where every slot of a token was cold: no cache, no copies ahead, or a fixed count. */
    const bool all_cold = !c->cache_mib && c->ahead <= TM_MOE_AHEAD_AUTO;
    if (c->env && strstr(c->env, "TIERMOE_PCIE_TUNE=1")) {
        /* tuned: any count of k now; a lane that read experts was timed at two or more */
        if (n_pcie > (int32_t)K || (pcie > 0 && tier_tune_timed(ctx->tier) < 2))
            fail_msg("%s: %d PCIe slots a token (%llu in all), %d shares timed", what, n_pcie,
                     (unsigned long long)pcie, tier_tune_timed(ctx->tier));
        return;
    }
    if (!ok || (n_pcie == 0 && pcie > 0) ||
        (n_pcie > 0 && pcie == 0 && cold > 0 && (all_cold || c->pcie > 0)))
        fail_msg("%s: %d PCIe slots a token (%llu in all) for --moe-pcie %d, k %u", what, n_pcie,
                 (unsigned long long)pcie, c->pcie, K);
    if (ram_on_gpu && !c->cache_mib && (n_pcie < (int32_t)K) != (cold > 0))
        fail_msg("%s: %llu cold slots with %d of %u over PCIe", what, (unsigned long long)cold,
                 n_pcie, K);
    /* copies ahead: the layers after the first whose experts are in RAM get some, and
       some of them are routed (the tiny models' residual stream carries the routing) */
    uint64_t copied = 0, ahead = 0;
    for (int i = 0; i < TM_TIER_CLASS_COUNT; i++)
        copied += s[i].ahead_experts, ahead += s[i].ahead_slots;
    const bool want_ahead = ram_on_gpu && !c->ot && (c->ahead > 0 || pm_auto_ahead(c));
    if (want_ahead != (copied > 0) || want_ahead != (ahead > 0))
        fail_msg("%s: %llu experts copied ahead, %llu slots computed from them, want %s", what,
                 (unsigned long long)copied, (unsigned long long)ahead,
                 want_ahead ? "some" : "none");
    if (pm_split && want_ahead) pm_check_ahead_gpus(c, ctx, what);
    if (n_pcie >= (int32_t)K) return;
    uint32_t vram = 0, ram = 0;
    for (uint32_t l = 0; l < ctx->model->cfg.n_layer; l++) {
        if (!pm_moe_layer(ctx->model, l)) continue;
        const bool gpu_experts =
            c->ngl && !c->cpu_moe && !c->ot && (int)l >= c->n_cpu_moe && (int)l < c->ngl;
        if (!c->ot) gpu_experts ? vram++ : ram++;
    }
    if (c->cache_mib) { /* the plan may leave layers without slots */
        const tm_tier_stats *cs = &s[TM_TIER_CACHED];
        if (!cs->layers || cs->layers + s[TM_TIER_RAM].layers != L || !cs->hot_slots ||
            !cs->cold_slots)
            fail_msg("%s: want cached layers (the rest in RAM) with hot and cold slots, got %u "
                     "cached of %u, %llu hot, %llu cold",
                     what, cs->layers, L, (unsigned long long)cs->hot_slots,
                     (unsigned long long)cs->cold_slots);
        /* live updates: none when off; lru uploads its misses (adaptive may or not) */
        if ((c->update == TM_MOE_UPDATE_OFF && cs->admits) || (c->lru && !cs->admits))
            fail_msg("%s: %llu experts admitted", what, (unsigned long long)cs->admits);
        return;
    }
    if (c->ot) { /* layers with experts in RAM: cold slots; in VRAM: hot ones */
        bool want_cold = false, want_hot = false;
        for (uint32_t l = 0; l < ctx->model->cfg.n_layer; l++)
            if (pm_moe_layer(ctx->model, l)) {
                want_hot |= ctx->placement.experts_dev[l] == TM_DEV_GPU;
                want_cold |= ctx->placement.experts_dev[l] != TM_DEV_GPU;
            }
        if ((want_cold && !s[TM_TIER_RAM].cold_slots) || (want_hot && !s[TM_TIER_VRAM].hot_slots))
            fail_msg("%s: want cold slots in RAM layers and hot ones in VRAM layers", what);
        return;
    }
    if (s[TM_TIER_VRAM].layers != vram || s[TM_TIER_RAM].layers != ram)
        fail_msg("%s: %u VRAM and %u RAM layers, want %u and %u", what, s[TM_TIER_VRAM].layers,
                 s[TM_TIER_RAM].layers, vram, ram);
    if ((vram && !s[TM_TIER_VRAM].hot_slots) || (ram && !s[TM_TIER_RAM].cold_slots) ||
        s[TM_TIER_VRAM].cold_slots || s[TM_TIER_RAM].hot_slots)
        fail_msg("%s: slots in the wrong lane", what);
}

/* Prompts with experts in RAM on a GPU: the GPU computed some of them (the
 * fetch lane) unless --moe-fetch off, and every routed slot was counted once. */
static void pm_check_fetch(const pm_case *c, const tm_context *ctx, const char *what) {
    const tm_tier_stats *s = tier_stats(ctx->tier);
    uint64_t fetch = 0, all = 0, fallback = 0;
    for (int i = 0; i < TM_TIER_CLASS_COUNT; i++) {
        fetch += s[i].fetch_slots, fallback += s[i].fallback_slots;
        all += s[i].hot_slots + s[i].pcie_slots + s[i].cold_slots + s[i].fetch_slots +
               s[i].ahead_slots;
    }
    const tm_model_config *cfg = &ctx->model->cfg;
    const uint32_t L = pm_moe_layers(ctx->model);
    if (all != (uint64_t)(40 + 16) * L * cfg->n_expert_used)
        fail_msg("%s: %llu routed slots counted, want %u", what, (unsigned long long)all,
                 (40 + 16) * L * cfg->n_expert_used);
    const bool ram_on_gpu = pm_ram_on_gpu(c, ctx);
    const bool want = ram_on_gpu && c->fetch != TM_MOE_FETCH_OFF;
    if (want != (fetch > 0) || fallback)
        fail_msg("%s: %llu prompt slots on the fetch lane (%llu fallbacks), want %s", what,
                 (unsigned long long)fetch, (unsigned long long)fallback, want ? "some" : "none");
}

/* The placements of an architecture whose layers run on the CPU only (gemma4): the CPU,
 * the SSD tier's RAM cache read by the CPU lane, and the experts in VRAM (the tier's hot
 * lane on the GPU for layers on the CPU). */
static const pm_case pm_cases_cpu[] = {
    {"CPU only", 0, false, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"CPU only --ram-cache 1", 0, false, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 1},
    {"layers on the CPU, experts in VRAM (-ot ffn_(gate_up|down)_exps=CUDA0)", 0, false, 0,
     "ffn_(gate_up|down)_exps=CUDA0", 0, 0, 0, NULL, 0, false, 0, 0},
};

/* Spans of layers over two GPUs (MOCK_GPUS=2): the executor's state a GPU, the
 * activations crossing by a peer copy at the boundary; every layer's experts on the GPUs,
 * or some in RAM with the CPU lane computing them for both GPUs' layers (one mailbox, each
 * GPU's router counts), each GPU's PCIe and fetch lanes, copies ahead and cache for its own
 * layers' experts, or layers past -ngl on the CPU. */
static const pm_case pm_cases_gpus[] = {
    {"-ngl all", PM_ALL, false, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"--cpu-moe", PM_ALL, true, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"--n-cpu-moe 2", PM_ALL, false, 2, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"-ngl 2", 2, false, 0, NULL, 0, 0, 0, NULL, 0, false, 0, 0},
    {"--cpu-moe --moe-pcie off --moe-fetch off (the CPU lane alone)", PM_ALL, true, 0, NULL, 0,
     TM_MOE_PCIE_OFF, TM_MOE_FETCH_OFF, NULL, 0, false, 0, 0},
    {"--cpu-moe --moe-pcie 32 --moe-fetch pcie (everything in RAM over PCIe)", PM_ALL, true, 0,
     NULL, 0, 32, TM_MOE_FETCH_PCIE, NULL, 0, false, 0, 0},
    {"--cpu-moe, fetch ring 2x3, CPU share 0.3", PM_ALL, true, 0, NULL, 0, 0, TM_MOE_FETCH_COPY,
     "TIERMOE_FETCH_RING=2x3 TIERMOE_FETCH_CPU_SHARE=0.3", 0, false, 0, 0},
    /* each GPU's copies ahead for its own layers: into its buffer, into its cached layers'
       slots (asked, and --moe-cache's default) */
    {"--cpu-moe --moe-ahead 2", PM_ALL, true, 0, NULL, 0, 0, 0, NULL, 0, false, 2, 0},
    {"--cpu-moe --moe-cache 1 --moe-ahead 1 (copies ahead into cached layers)", PM_ALL, true, 0,
     NULL, 1, 0, 0, NULL, 0, false, 1, 0},
    /* each GPU's VRAM cache of its own layers' experts, fixed (copies ahead into its slots,
       the default) and admitting after steps */
    {"--cpu-moe --moe-cache 1", PM_ALL, true, 0, NULL, 1, 0, 0, NULL, 0, false, 0, 0},
    {"--cpu-moe --moe-cache 2 --moe-cache-update full", PM_ALL, true, 0, NULL, 2, 0, 0, NULL,
     TM_MOE_UPDATE_FULL, false, 0, 0},
};

static void pm_matrix(const char *path, const pm_tolerance *tol, const pm_case *cases,
                      size_t n_cases);

void placement_matrix_run_gpus(const char *path, const pm_tolerance *tol) {
    static const char *const splits[] = {"1,1", "1,3"}; /* boundaries after layer 1 and 0 */
    setenv("MOCK_GPUS", "2", 1);
    for (int i = 0; i < 2; i++) {
        printf("  -dev CUDA0,CUDA1 --tensor-split %s:\n", splits[i]);
        pm_split = splits[i];
        pm_matrix(path, tol, pm_cases_gpus, sizeof(pm_cases_gpus) / sizeof(pm_cases_gpus[0]));
    }
    pm_split = NULL;
    unsetenv("MOCK_GPUS");
}

void placement_matrix_run(const char *path, const pm_tolerance *tol) {
    pm_matrix(path, tol, pm_cases, sizeof(pm_cases) / sizeof(pm_cases[0]));
}

void placement_matrix_run_cpu(const char *path, const pm_tolerance *tol) {
    pm_matrix(path, tol, pm_cases_cpu, sizeof(pm_cases_cpu) / sizeof(pm_cases_cpu[0]));
}

static void pm_matrix(const char *path, const pm_tolerance *tol, const pm_case *cases,
                      size_t n_cases) {
    tm_model *m;
    PM_CHECK(model_load(path, &m), path);
    const tm_model_config *cfg = &m->cfg;
    tm_rng r;
    tm_rng_seed(&r, 7);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % cfg->n_vocab);
    /* a learn file of random counts: it plans the cache and seeds its policies */
    tm_trace_stats learn;
    tm_trace_shape shape;
    model_trace_shape(m, &shape);
    PM_CHECK(trace_stats_init(&learn, &shape, 0), "learn");
    for (uint32_t l = 0; l < cfg->n_layer; l++)
        for (uint32_t e = 0; e < cfg->n_expert; e++) {
            learn.layers[l].experts[e] = tm_rng_u64(&r) % 1000;
            learn.layers[l].expert_hits_total += learn.layers[l].experts[e];
        }

    /* A model whose experts all fit the cache cases' 1-2 MiB (the tiny gpt-oss)
     * would leave nothing cold: its cache holds the learn file's top half of
     * each layer instead (a plan), so hot, cold and fetched slots all happen. */
    tm_plan half = {0}, *plan = NULL;
    uint64_t all = 0, *bytes = pm_alloc(cfg->n_layer * sizeof(uint64_t));
    for (uint32_t l = 0; l < cfg->n_layer; l++) { /* an expert's gate, up and down rows */
        bytes[l] = 0;
        if (!pm_moe_layer(m, l)) continue; /* a dense layer */
        static const char *const mat[3] = {"gate", "up", "down"};
        char fused[64]; /* gemma4: gate and up one tensor */
        snprintf(fused, sizeof(fused), "blk.%u.ffn_gate_up_exps.weight", l);
        const tm_gguf_tensor *gu = gguf_file_find_tensor(m->file, fused);
        if (gu) bytes[l] += gu->n_bytes / cfg->n_expert;
        for (int i = gu ? 2 : 0; i < 3; i++) {
            char name[64];
            snprintf(name, sizeof(name), "blk.%u.ffn_%s_exps.weight", l, mat[i]);
            const tm_gguf_tensor *w = gguf_file_find_tensor(m->file, name);
            if (!w) fail_msg("%s: no %s", path, name);
            bytes[l] += w->n_bytes / cfg->n_expert;
        }
        all += bytes[l] * cfg->n_expert;
    }
    if (all <= (2u << 20)) { /* the largest cache case */
        PM_CHECK(plan_init(&half, &shape), "plan");
        int32_t *ids = pm_alloc(cfg->n_expert * sizeof(int32_t));
        for (uint32_t l = 0; l < cfg->n_layer; l++) {
            if (!bytes[l]) continue; /* a dense layer: no slots */
            const uint64_t *cnt = learn.layers[l].experts;
            for (uint32_t e = 0; e < cfg->n_expert; e++) ids[e] = (int32_t)e;
            for (uint32_t i = 1; i < cfg->n_expert; i++) /* most counted first */
                for (uint32_t j = i; j > 0 && cnt[ids[j]] > cnt[ids[j - 1]]; j--) {
                    const int32_t x = ids[j];
                    ids[j] = ids[j - 1], ids[j - 1] = x;
                }
            PM_CHECK(plan_set_layer(&half, l, ids, (int32_t)cfg->n_expert / 2, bytes[l]), "plan");
        }
        free(ids);
        plan = &half;
    }
    free(bytes);

    /* the reference: the f64 forward, once; its trace avoids the precise near ties */
    const double tie = tol->tie;
    pm_ref *ref = pm_ref_make(path, toks, 56, 64, tie, 2 * tol->decode);

    printf("  %s: %u layers, %u experts (k %u); f64 reference: %d of 56 tokens redrawn (routing "
           "gaps >= %g of their RMS), greedy compared over %d of 64 steps\n",
           path, cfg->n_layer, cfg->n_expert, cfg->n_expert_used, ref->redrawn, tie,
           ref->greedy_tie_at);
    const char *only = getenv("TM_PM_ONLY"); /* the cases whose name has it (a rerun) */
    for (size_t ci = 0; ci < n_cases; ci++) {
        const pm_case *c = &cases[ci];
        if (only && *only && !strstr(c->name, only)) continue;
        char what[160];
        pm_env(c, true);
        /* 40 prompt tokens in batches of 24 and 16, then 16 decode steps */
        for (int precise = 0; precise < 2; precise++) {
            snprintf(what, sizeof(what), "%s, %s CPU ops", c->name, precise ? "precise" : "normal");
            const tm_context_params p =
                pm_params(c, &learn, plan, precise, precise ? TM_TYPE_F32 : TM_TYPE_F16, 24);
            pm_run *run = pm_run_open(m, &p);
            if (precise)
                pm_compare_ref(m, toks, 40, 16, ref, run, tol->prompt,
                               tol->decode_kv > 0 ? tol->decode_kv : tol->decode, tol->tie, what);
            else
                pm_compare_ref(m, toks, 40, 16, ref, run, tol->quant, tol->quant, tol->tie_quant,
                               what);
            pm_check_fetch(c, run->ctx, what);
            pm_run_close(run);
        }
        /* greedy, no callback: the decode graph where every op is on the GPU */
        snprintf(what, sizeof(what), "%s, greedy", c->name);
        const tm_context_params p = pm_params(c, &learn, plan, true, TM_TYPE_F32, 16);
        tm_context *ctx;
        PM_CHECK(model_context_create(m, &p, &ctx), what);
        const int either = pm_greedy_ref(ctx, toks, ref, tol->decode, what);
        pm_check_lanes(c, ctx, what);
        printf("    %s: %d greedy steps as the f64 reference's (%d at a near tie of the logits; "
               "%s)\n",
               c->name, ref->greedy_tie_at, either,
               exec_graph_ready(ctx->exec) ? "decode graph" : "eager");
        model_context_free(ctx);
        snprintf(what, sizeof(what), "%s, --parallel 4", c->name);
        pm_parallel_run(m, &p, toks, tol->decode, what);
        pm_env(c, false);
    }
    pm_ref_free(ref);
    trace_stats_free(&learn);
    plan_free(&half);
    model_free(m);
}
