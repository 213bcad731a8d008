/* Context options: their defaults, their check and what the engine makes of
 * them (api_opts.h). Messages name the field and the flag of `tiermoe run`
 * that sets it, so a library user and a CLI user both find what to change. */
#include <string.h>

#include "api/api_internal.h"
#include "api/api_opts.h"
#include "cuda/cuda.h"
#include "tier/cache_policy.h"

/* The header's limits are the engine's. */
_Static_assert(TM_MOE_PCIE_MAX == TM_CUDA_ROUTER_MAX_USED, "TM_MOE_PCIE_MAX");
_Static_assert(TM_MOE_AHEAD_MAX == TM_CUDA_FETCH_AHEAD_MAX, "TM_MOE_AHEAD_MAX");
_Static_assert((int)TM_MOE_CACHE_CURVE_MAX == (int)TM_PLAN_CURVE_MAX, "TM_MOE_CACHE_CURVE_MAX");
_Static_assert(TM_CACHE_UPDATE_BETWEEN == TM_MOE_UPDATE_BETWEEN &&
                   TM_CACHE_UPDATE_FULL == TM_MOE_UPDATE_FULL,
               "TM_CACHE_UPDATE_*");

void tm_context_opts_init(tm_context_opts *o) {
    if (!o) return;
    *o = (tm_context_opts){.moe_pcie = TM_AUTO, .moe_fetch = TM_AUTO, .moe_ahead = TM_AUTO};
}

/* A --moe-pcie / --moe-ahead count: TM_AUTO, TM_OFF or 0..max (0: off, as the flags). */
static tm_status opts_count(const char *fn, const char *field, const char *flag, int32_t v,
                            int32_t max, int auto_v, int off_v, int *out) {
    API_ARG(v == TM_AUTO || v == TM_OFF || (v >= 0 && v <= max),
            "%s: %s %d (%s): expected TM_AUTO, TM_OFF or 0..%d", fn, field, v, flag, max);
    *out = v == TM_AUTO ? auto_v : v == TM_OFF || v == 0 ? off_v : v;
    return TM_OK;
}

static tm_status opts_fetch(const char *fn, int32_t v, int *out) {
    switch (v) {
    case TM_AUTO:
        *out = TM_MOE_FETCH_AUTO;
        return TM_OK;
    case TM_OFF:
        *out = TM_MOE_FETCH_OFF;
        return TM_OK;
    case TM_FETCH_COPY:
        *out = TM_MOE_FETCH_COPY;
        return TM_OK;
    case TM_FETCH_PCIE:
        *out = TM_MOE_FETCH_PCIE;
        return TM_OK;
    default:
        return tm_error_set(TM_ERR_ARG,
                            "%s: moe_fetch %d (--moe-fetch): expected TM_AUTO, TM_OFF, "
                            "TM_FETCH_COPY or TM_FETCH_PCIE",
                            fn, v);
    }
}

/* The cache's plan and update fields (--moe-cache-*) into c. */
static tm_status opts_cache(const char *fn, const tm_context_opts *o, tm_moe_cache_opts *c) {
    *c = (tm_moe_cache_opts){0};
    if (o->moe_cache_weighting) {
        tm_plan_weighting w;
        if (plan_weighting_parse(o->moe_cache_weighting, &w) != TM_OK)
            return tm_error_wrap(TM_ERR_ARG, "%s: moe_cache_weighting (--moe-cache-weighting)", fn);
        c->weighting = (int32_t)w;
    }
    API_ARG(o->moe_cache_curve >= 0 && o->moe_cache_curve <= TM_MOE_CACHE_CURVE_MAX,
            "%s: moe_cache_curve %g (--moe-cache-curve): expected 0 .. %g", fn, o->moe_cache_curve,
            TM_MOE_CACHE_CURVE_MAX);
    c->curve = o->moe_cache_curve;
    API_ARG(o->moe_cache_update == TM_CACHE_UPDATE_BETWEEN ||
                o->moe_cache_update == TM_CACHE_UPDATE_FULL || o->moe_cache_update == TM_OFF,
            "%s: moe_cache_update %d (--moe-cache-update): expected TM_CACHE_UPDATE_BETWEEN, "
            "TM_CACHE_UPDATE_FULL or TM_OFF",
            fn, o->moe_cache_update);
    c->update = o->moe_cache_update == TM_OFF ? TM_MOE_UPDATE_OFF : o->moe_cache_update;
    if (o->moe_cache_policy) {
        if (cache_policy_kind_parse(o->moe_cache_policy, &c->policy) != TM_OK)
            return tm_error_wrap(TM_ERR_ARG, "%s: moe_cache_policy (--moe-cache-policy)", fn);
        c->policy_set = true;
    }
    API_ARG(o->moe_cache_admit >= 0 || o->moe_cache_admit == TM_OFF,
            "%s: moe_cache_admit %d (--moe-cache-admit): expected 0 or more, or TM_OFF", fn,
            o->moe_cache_admit);
    c->max_admit = o->moe_cache_admit == TM_OFF ? -1 : o->moe_cache_admit;
    return TM_OK;
}

/* The GPU list's options into p->gpus (the parsers name the field and its flag). */
static tm_status opts_gpus(const char *fn, const tm_context_opts *o, tm_context_params *p) {
    API_ARG(o->split_mode == TM_SPLIT_LAYER || o->split_mode == TM_SPLIT_NONE,
            "%s: split_mode %d (--split-mode): expected TM_SPLIT_LAYER or TM_SPLIT_NONE", fn,
            o->split_mode);
    API_ARG(o->main_gpu >= 0 && o->main_gpu < TM_MAX_GPUS,
            "%s: main_gpu %d (-mg): expected a GPU index 0 .. %d", fn, o->main_gpu,
            TM_MAX_GPUS - 1);
    p->gpus.split_mode = o->split_mode, p->gpus.main_gpu = o->main_gpu;
    tm_status st = TM_OK;
    if (o->devices) st = gpus_devices_parse("devices (-dev)", o->devices, &p->gpus);
    if (!st && o->tensor_split)
        st = gpus_split_parse("tensor_split (--tensor-split)", o->tensor_split, &p->gpus);
    if (!st && o->moe_cache_gpus) {
        st = gpus_cache_parse("moe_cache_gpus (--moe-cache)", o->moe_cache_gpus, &p->gpus);
        p->moe_cache_mib = 0;
        for (int i = 0; i < p->gpus.n_cache; i++) p->moe_cache_mib += p->gpus.cache_mib[i];
    }
    return st ? tm_error_wrap(st, "%s", fn) : TM_OK;
}

tm_status api_opts_params(const char *fn, const tm_context_opts *o, tm_context_params *p) {
    API_ARG(o->n_ctx >= 0 && o->n_seq >= 0 && o->n_batch >= 0 && o->n_threads >= 0,
            "%s: n_ctx, n_seq, n_batch and n_threads must not be negative", fn);
    API_ARG(o->n_gpu_layers >= TM_AUTO,
            "%s: n_gpu_layers %d (-ngl): expected a layer count or TM_AUTO", fn, o->n_gpu_layers);
    API_ARG(o->n_cpu_moe >= 0, "%s: n_cpu_moe %d (--n-cpu-moe) is negative", fn, o->n_cpu_moe);
    API_ARG(o->moe_cache_mib >= 0 || o->moe_cache_mib == TM_AUTO,
            "%s: moe_cache_mib %lld (--moe-cache): expected MiB or TM_AUTO", fn,
            (long long)o->moe_cache_mib);
    API_ARG(o->ram_cache_mib >= 0 || o->ram_cache_mib == TM_AUTO,
            "%s: ram_cache_mib %lld (--ram-cache): expected MiB or TM_AUTO", fn,
            (long long)o->ram_cache_mib);
    *p = (tm_context_params){
        .n_ctx = o->n_ctx,
        .n_seq = o->n_seq,
        .n_batch = o->n_batch,
        .n_threads = o->n_threads,
        .kv_type = o->kv_f32 ? TM_TYPE_F32 : TM_TYPE_F16,
        .n_gpu_layers = o->n_gpu_layers == TM_AUTO ? TM_NGL_AUTO : o->n_gpu_layers,
        .cpu_moe = o->cpu_moe,
        .n_cpu_moe = o->n_cpu_moe,
        .override_tensor = o->override_tensor,
        .moe_cache_mib = o->moe_cache_mib == TM_AUTO ? TM_MOE_CACHE_AUTO : o->moe_cache_mib,
        .ram_cache_mib = o->ram_cache_mib == TM_AUTO ? TM_RAM_CACHE_AUTO : o->ram_cache_mib,
        .profile = o->profile};
    tm_status st;
    if ((st = opts_count(fn, "moe_pcie", "--moe-pcie", o->moe_pcie, TM_MOE_PCIE_MAX,
                         TM_MOE_PCIE_AUTO, TM_MOE_PCIE_OFF, &p->moe_pcie)) ||
        (st = opts_count(fn, "moe_ahead", "--moe-ahead", o->moe_ahead, TM_MOE_AHEAD_MAX,
                         TM_MOE_AHEAD_AUTO, TM_MOE_AHEAD_OFF, &p->moe_ahead)) ||
        (st = opts_fetch(fn, o->moe_fetch, &p->moe_fetch)) ||
        (st = opts_cache(fn, o, &p->moe_cache)))
        return st;
    if (o->override_tensor &&
        (st = placement_overrides_check("override_tensor (-ot)", o->override_tensor)) != TM_OK)
        return tm_error_wrap(st, "%s", fn);
    return opts_gpus(fn, o, p);
}

tm_status tm_context_opts_check(const tm_context_opts *o) {
    API_ARG(o, "tm_context_opts_check: opts must not be NULL");
    tm_context_params p;
    return api_opts_params("tm_context_opts_check", o, &p);
}

tm_status api_opts_files(const char *fn, const tm_model *m, const tm_context_opts *o,
                         tm_trace_stats *learn, tm_plan *plan, tm_context_params *p) {
    tm_trace_shape shape;
    model_trace_shape(m, &shape);
    tm_status st;
    if (o->moe_learn) {
        if ((st = trace_stats_read_json(o->moe_learn, &shape, learn)) != TM_OK)
            return tm_error_wrap(st, "%s: moe_learn (--moe-learn)", fn);
        p->moe_cache.learn = learn;
    }
    if (o->moe_cache_plan) {
        if ((st = plan_read_json(o->moe_cache_plan, &shape, plan)) != TM_OK)
            return tm_error_wrap(st, "%s: moe_cache_plan (--moe-cache-plan)", fn);
        p->moe_cache.plan = plan;
    }
    return TM_OK;
}
