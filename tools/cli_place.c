/* The placement flags of run, bench and trace (as llama.cpp's users know
 * them: -ngl, --cpu-moe, --n-cpu-moe, -ot) and the VRAM expert cache
 * (--moe-cache, --moe-learn), and the --profile print they share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trace/trace.h"

const char cli_place_help[] =
    "  -ngl, --n-gpu-layers N  the first N layers on the GPU; all (or N >= layers) puts the\n"
    "                         output head there too; auto: as many as fit (default 0, or auto\n"
    "                         when an expert flag below is given)\n"
    "  -cmoe, --cpu-moe       keep every layer's experts in RAM (computed by the CPU)\n"
    "  -ncmoe, --n-cpu-moe N  keep the experts of the first N layers in RAM\n"
    "  -ot, --override-tensor PATTERN=CPU|CUDA0[,...]\n"
    "                         tensors whose name matches the regex go there (first match wins)\n"
    "  --moe-cache MIB|auto   VRAM for the most used experts of the layers whose experts are in\n"
    "                         RAM, split evenly over those layers (auto: what is free)\n"
    "  --moe-learn FILE       learn file (tiermoe trace): the cache is planned from it and its\n"
    "                         policies start from its counts (default: the lowest expert ids)\n"
    "  --moe-cache-plan FILE  the cache holds this plan's experts (tiermoe plan; its size is the\n"
    "                         plan's, --moe-cache not needed)\n"
    "  --moe-cache-weighting flat|pressure|smooth_pressure|time|balanced  how the plan made at\n"
    "                         load weighs layers (default flat), --moe-cache-curve X its curve\n"
    "  --moe-cache-update update|full|off  update (default): weak slots are exchanged between\n"
    "                         requests; full: also the cache policy admits routed experts after\n"
    "                         each step; off: the planned experts stay\n"
    "  --moe-cache-policy adaptive|lru|lfu|static  the policy of 'full' (default adaptive)\n"
    "  --moe-cache-admit N    uploads a layer a step at most (default 1; 0: no cap)\n"
    "  --moe-pcie N|auto|off  of each decode token's experts in RAM, the GPU reads the first N\n"
    "                         over PCIe (pinned in place) while the CPU computes the rest\n"
    "                         (auto: about a third of the token's cold experts)\n"
    "  --moe-fetch auto|copy|pcie|off  prompts: the GPU computes experts in RAM, copied into a\n"
    "                         VRAM ring ahead of routing (copy) or read in place (pcie), while\n"
    "                         the CPU lane takes a balanced share (auto: copy when a batch uses\n"
    "                         nearly every expert, else pcie; off: the CPU computes them)\n"
    "  --moe-ahead N|auto|off decode: while a layer runs, the GPU predicts the next layer's\n"
    "                         experts (its router on this layer's input) and copies up to N\n"
    "                         of the cold ones to VRAM, computing them there; with --moe-cache\n"
    "                         into its least recently used slots, its updates then off (auto: 1\n"
    "                         with a cache whose --moe-cache-update is the default, and then\n"
    "                         --moe-pcie auto is off; else off)\n"
    "  --ram-cache MIB|auto   the SSD tier: experts in RAM are read from the file (O_DIRECT,\n"
    "                         io_uring) into a RAM cache of this size instead of the page cache\n"
    "                         (auto: available RAM less a reserve), pinned when prompts copy\n"
    "                         their routed experts from it to the GPU (--moe-fetch auto|copy);\n"
    "                         decode's PCIe lane and copies ahead are off with it\n";

/* A flag's N|auto|off value (N from 0 to max, 0 meaning off) into *out; -1
 * after a message naming the flag. */
static int cli_place_count(const char *cmd, const char *flag, const char *v, int64_t max,
                           int auto_value, int off_value, int *out) {
    long long n = 0;
    if (!strcmp(v, "auto"))
        *out = auto_value;
    else if (!strcmp(v, "off"))
        *out = off_value;
    else if (cli_parse_i64(flag, v, 0, max, &n)) {
        fprintf(stderr, "tiermoe %s: %s: or 'auto' or 'off'\n", cmd, flag);
        return -1;
    } else {
        *out = n ? (int)n : off_value;
    }
    return 0;
}

int cli_place_parse(cli_place *p, const char *cmd, int argc, char **argv, int i) {
    const char *a = argv[i];
    if (!strcmp(a, "-cmoe") || !strcmp(a, "--cpu-moe")) {
        p->cpu_moe = true;
        return 1;
    }
    const bool ours = !strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "-ncmoe") ||
                      !strcmp(a, "--n-cpu-moe") || !strcmp(a, "-ot") ||
                      !strcmp(a, "--override-tensor") || !strcmp(a, "--moe-cache") ||
                      !strcmp(a, "--moe-learn") || !strcmp(a, "--moe-pcie") ||
                      !strcmp(a, "--moe-fetch") || !strcmp(a, "--moe-ahead") ||
                      !strncmp(a, "--moe-cache-", 12) || !strcmp(a, "--ram-cache");
    if (!ours) return 0;
    if (i + 1 >= argc) {
        fprintf(stderr, "tiermoe %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[i + 1];
    long long n;
    if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers")) {
        if (cli_parse_ngl(a, v, &p->ngl)) return -1;
        p->ngl_given = true;
    } else if (!strcmp(a, "-ncmoe") || !strcmp(a, "--n-cpu-moe")) {
        if (cli_parse_i64(a, v, 0, 1 << 20, &n)) return -1;
        p->n_cpu_moe = (int)n;
    } else if (!strcmp(a, "-ot") || !strcmp(a, "--override-tensor")) {
        if (placement_overrides_check(a, v) != TM_OK) {
            fprintf(stderr, "tiermoe %s: %s\n", cmd, tm_error_message());
            return -1;
        }
        /* several -ot flags: one list, in order */
        const size_t old = p->overrides ? strlen(p->overrides) : 0;
        char *s = realloc(p->overrides, old + strlen(v) + 2);
        if (!s) return -1;
        sprintf(s + old, "%s%s", old ? "," : "", v);
        p->overrides = s;
    } else if (!strcmp(a, "--moe-cache")) {
        if (!strcmp(v, "auto"))
            p->cache_mib = TM_MOE_CACHE_AUTO;
        else if (cli_parse_i64(a, v, 0, 1ll << 30, &n)) {
            fprintf(stderr, "tiermoe %s: --moe-cache: or 'auto' (the free VRAM)\n", cmd);
            return -1;
        } else {
            p->cache_mib = n;
        }
    } else if (!strcmp(a, "--ram-cache")) {
        if (!strcmp(v, "auto"))
            p->ram_cache_mib = TM_RAM_CACHE_AUTO;
        else if (cli_parse_i64(a, v, 1, 1ll << 30, &n)) {
            fprintf(stderr, "tiermoe %s: --ram-cache: MiB (at least 1) or 'auto'\n", cmd);
            return -1;
        } else {
            p->ram_cache_mib = n;
        }
    } else if (!strcmp(a, "--moe-pcie")) {
        if (cli_place_count(cmd, a, v, TM_CUDA_ROUTER_MAX_USED, TM_MOE_PCIE_AUTO, TM_MOE_PCIE_OFF,
                            &p->pcie))
            return -1;
    } else if (!strcmp(a, "--moe-ahead")) {
        if (cli_place_count(cmd, a, v, TM_CUDA_FETCH_AHEAD_MAX, TM_MOE_AHEAD_AUTO, TM_MOE_AHEAD_OFF,
                            &p->ahead))
            return -1;
    } else if (!strcmp(a, "--moe-fetch")) {
        static const char *const names[] = {"auto", "copy", "pcie", "off"};
        static const int modes[] = {TM_MOE_FETCH_AUTO, TM_MOE_FETCH_COPY, TM_MOE_FETCH_PCIE,
                                    TM_MOE_FETCH_OFF};
        int k = 0;
        while (k < 4 && strcmp(v, names[k])) k++;
        if (k == 4) {
            fprintf(stderr, "tiermoe %s: --moe-fetch: expected auto, copy, pcie or off, got '%s'\n",
                    cmd, v);
            return -1;
        }
        p->fetch = modes[k];
    } else if (!strcmp(a, "--moe-cache-plan")) {
        p->plan_path = v;
    } else if (!strcmp(a, "--moe-cache-weighting")) {
        tm_plan_weighting w;
        if (plan_weighting_parse(v, &w) != TM_OK) {
            fprintf(stderr, "tiermoe %s: %s: %s\n", cmd, a, tm_error_message());
            return -1;
        }
        p->cache.weighting = (int32_t)w;
    } else if (!strcmp(a, "--moe-cache-curve")) {
        if (cli_parse_f64(a, v, 0, TM_PLAN_CURVE_MAX, &p->cache.curve)) return -1;
    } else if (!strcmp(a, "--moe-cache-update")) {
        static const char *const names[] = {"full", "update", "off"};
        int k = 0;
        while (k < 3 && strcmp(v, names[k])) k++;
        if (k == 3) {
            fprintf(stderr, "tiermoe %s: %s: expected full, update or off, got '%s'\n", cmd, a, v);
            return -1;
        }
        static const int32_t modes[] = {TM_MOE_UPDATE_FULL, TM_MOE_UPDATE_BETWEEN,
                                        TM_MOE_UPDATE_OFF};
        p->cache.update = modes[k];
    } else if (!strcmp(a, "--moe-cache-policy")) {
        if (cache_policy_kind_parse(v, &p->cache.policy) != TM_OK) {
            fprintf(stderr, "tiermoe %s: %s: %s\n", cmd, a, tm_error_message());
            return -1;
        }
        p->cache.policy_set = true;
    } else if (!strcmp(a, "--moe-cache-admit")) {
        if (cli_parse_i64(a, v, 0, 1 << 20, &n)) return -1;
        p->cache.max_admit = n ? (int32_t)n : -1;
    } else if (!strcmp(a, "--moe-learn")) {
        p->learn_path = v;
    } else {
        fprintf(stderr, "tiermoe %s: unknown flag %s\n", cmd, a);
        return -1;
    }
    return 2;
}

int cli_place_apply(cli_place *p, const char *cmd, const tm_model *m, tm_context_params *cp) {
    const bool cache = p->cache_mib != 0 || p->plan_path;
    const bool experts = p->cpu_moe || p->n_cpu_moe > 0 || cache;
    cp->n_gpu_layers = p->ngl_given || !experts ? p->ngl : TM_NGL_AUTO;
    cp->cpu_moe = p->cpu_moe, cp->n_cpu_moe = p->n_cpu_moe;
    cp->override_tensor = p->overrides;
    cp->moe_cache_mib = p->cache_mib;
    cp->moe_pcie = p->pcie;
    cp->moe_fetch = p->fetch;
    cp->moe_ahead = p->ahead;
    cp->ram_cache_mib = p->ram_cache_mib;
    cp->moe_cache = p->cache;
    tm_trace_shape shape;
    model_trace_shape(m, &shape);
    if (p->learn_path) {
        if (!cache)
            fprintf(stderr, "tiermoe %s: --moe-learn is used with --moe-cache; ignored\n", cmd);
        trace_stats_free(&p->learn);
        if (trace_stats_read_json(p->learn_path, &shape, &p->learn) != TM_OK) {
            fprintf(stderr, "tiermoe %s: --moe-learn: %s\n", cmd, tm_error_message());
            return 1;
        }
        cp->moe_cache.learn = &p->learn;
    }
    if (p->plan_path) {
        plan_free(&p->plan);
        if (plan_read_json(p->plan_path, &shape, &p->plan) != TM_OK) {
            fprintf(stderr, "tiermoe %s: --moe-cache-plan: %s\n", cmd, tm_error_message());
            return 1;
        }
        cp->moe_cache.plan = &p->plan;
    }
    return 0;
}

void cli_place_free(cli_place *p) {
    free(p->overrides);
    trace_stats_free(&p->learn);
    plan_free(&p->plan);
    memset(p, 0, sizeof(*p));
}

void cli_profile_print(const tm_context *ctx, const uint64_t *prof0, const tm_moe_lane_stats *lane0,
                       const tm_tier_stats *tier0, int runs, FILE *out) {
    const uint64_t *prof = model_prof_ns(ctx);
    uint64_t total = 0;
    for (int i = 0; i < TM_PROF_COUNT; i++) total += prof[i] - (prof0 ? prof0[i] : 0);
    fprintf(out, "time by part, per run (%.2f ms):", total * 1e-6 / runs);
    for (int i = 0; i < TM_PROF_COUNT; i++) {
        const uint64_t ns = prof[i] - (prof0 ? prof0[i] : 0);
        fprintf(out, " %s %.2f ms (%.0f%%)%s", tm_prof_part_names[i], ns * 1e-6 / runs,
                100.0 * ns / (total ? total : 1), i + 1 < TM_PROF_COUNT ? "," : "\n");
    }
    const tm_moe_lane_stats *ls = model_lane_stats(ctx);
    const uint64_t cap = ls->thread_ns - (lane0 ? lane0->thread_ns : 0);
    if (cap) {
        uint64_t busy = 0;
        fprintf(out, "  CPU lane, thread time per run (%.2f thread-ms):", cap * 1e-6 / runs);
        for (int i = 0; i < TM_LANE_PART_COUNT; i++) {
            const uint64_t ns = ls->ns[i] - (lane0 ? lane0->ns[i] : 0);
            busy += ns;
            fprintf(out, " %s %.2f ms (%.0f%%),", tm_moe_lane_part_names[i], ns * 1e-6 / runs,
                    100.0 * ns / cap);
        }
        fprintf(out, " idle %.2f ms (%.0f%%)\n", (cap - busy) * 1e-6 / runs,
                100.0 * (cap - busy) / cap);
    }
    const tm_tier_stats *ts = tier_stats(ctx->tier);
    bool any = false;
    for (int c = 0; c < TM_TIER_CLASS_COUNT; c++) any |= ts[c].layers && ctx->placement.any_gpu;
    if (!any) return;
    fprintf(
        out,
        "  MoE step by layer class, per run: | class | layers | layer steps | hot slots | "
        "PCIe slots | cold slots | GPU hot lane ms | GPU PCIe lane ms | CPU cold lane ms (of it "
        "worklist) | "
        "host waits for GPU ms | GPU waits for CPU ms | merge ms |\n");
    for (int c = 0; c < TM_TIER_CLASS_COUNT; c++) {
        const tm_tier_stats *s = &ts[c], z = {0}, *s0 = tier0 ? &tier0[c] : &z;
        if (!s->layers) continue;
        fprintf(
            out,
            "  | %s | %u | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f (%.2f) | %.2f | %.2f | "
            "%.2f |\n",
            tm_tier_class_names[c], s->layers, (double)(s->calls - s0->calls) / runs,
            (double)(s->hot_slots - s0->hot_slots) / runs,
            (double)(s->pcie_slots - s0->pcie_slots) / runs,
            (double)(s->cold_slots - s0->cold_slots) / runs, (s->hot_ns - s0->hot_ns) * 1e-6 / runs,
            (s->pcie_ns - s0->pcie_ns) * 1e-6 / runs, (s->cold_ns - s0->cold_ns) * 1e-6 / runs,
            (s->cold_prep_ns - s0->cold_prep_ns) * 1e-6 / runs,
            (s->wait_ns - s0->wait_ns) * 1e-6 / runs,
            (s->gpu_wait_ns - s0->gpu_wait_ns) * 1e-6 / runs,
            (s->merge_ns - s0->merge_ns) * 1e-6 / runs);
    }
    const tm_tier_stats *cs = &ts[TM_TIER_CACHED], z = {0},
                        *cs0 = tier0 ? &tier0[TM_TIER_CACHED] : &z;
    const uint64_t hot = cs->hot_slots - cs0->hot_slots,
                   all = hot + cs->cold_slots - cs0->cold_slots + cs->pcie_slots - cs0->pcie_slots +
                         cs->fetch_slots - cs0->fetch_slots + cs->ahead_slots - cs0->ahead_slots;
    if (cs->layers)
        fprintf(out,
                "  VRAM cache: %.1f%% of routed slots hot; per run %.1f experts admitted after "
                "steps, %.1f exchanged between requests, %.3f GB uploaded\n",
                all ? 100.0 * hot / all : 0.0, (double)(cs->admits - cs0->admits) / runs,
                (double)(cs->exchanges - cs0->exchanges) / runs,
                (cs->upload_bytes - cs0->upload_bytes) * 1e-9 / runs);
    for (int c = 0; c < TM_TIER_CLASS_COUNT; c++) {
        const tm_tier_stats *s = &ts[c], *s0 = tier0 ? &tier0[c] : &z;
        const uint64_t copied = s->ahead_experts - s0->ahead_experts,
                       used = s->ahead_used - s0->ahead_used;
        if (!copied) continue;
        fprintf(out,
                "  decode, %s: %.1f experts copied ahead per run (%.3f GB, prediction and copies "
                "%.2f ms of GPU time), %.1f%% of them routed, %.1f slots computed from them\n",
                tm_tier_class_names[c], (double)copied / runs,
                (s->ahead_bytes - s0->ahead_bytes) * 1e-9 / runs,
                (s->ahead_ns - s0->ahead_ns) * 1e-6 / runs, 100.0 * used / copied,
                (double)(s->ahead_slots - s0->ahead_slots) / runs);
    }
    for (int c = 0; c < TM_TIER_CLASS_COUNT; c++) {
        const tm_tier_stats *s = &ts[c], *s0 = tier0 ? &tier0[c] : &z;
        const uint64_t slots = s->fetch_slots - s0->fetch_slots,
                       fb = s->fallback_slots - s0->fallback_slots;
        if (!slots && !fb) continue;
        const double copy = (double)(s->copy_ns - s0->copy_ns),
                     wait = (double)(s->copy_wait_ns - s0->copy_wait_ns);
        fprintf(out,
                "  prompts, %s: GPU computed %.1f slots of experts in RAM per run (%.1f experts, "
                "%.3f GB copied or read over PCIe, %.2f ms), ring copies %.2f ms (%.0f%% hidden "
                "behind compute), %.1f fallback slots; CPU lane share now %.0f%%; fetch ring "
                "%.1f MiB of VRAM\n",
                tm_tier_class_names[c], (double)slots / runs,
                (double)(s->fetch_experts - s0->fetch_experts) / runs,
                (s->fetch_bytes - s0->fetch_bytes) * 1e-9 / runs,
                (s->fetch_ns - s0->fetch_ns) * 1e-6 / runs, copy * 1e-6 / runs,
                copy > 0 ? 100.0 * (1 - (wait < copy ? wait : copy) / copy) : 0.0,
                (double)fb / runs, 100 * tier_prompt_cpu_share(ctx->tier),
                tier_fetch_bytes(ctx->tier) / 1048576.0);
    }
}

void cli_store_print(const tm_context *ctx, const tm_store_stats *s0, double wall_s, FILE *out) {
    const tm_store_stats *s = tier_store_stats(ctx->tier), z = {0};
    if (!s) return;
    if (!s0) s0 = &z;
    const uint64_t tok = s->tokens - s0->tokens, routed = s->routed - s0->routed,
                   bytes = s->bytes_read - s0->bytes_read;
    const double wait = (s->wait_ns - s0->wait_ns) * 1e-9, per = tok ? 1.0 / (double)tok : 0;
    fprintf(out,
            "  SSD tier (--ram-cache): %.2f experts faulted per token, %.1f read ahead (%.0f%% of "
            "those used; the next layer's router named %.0f%% of the experts its steps used), "
            "%.2f MB read per token, hit rate %.1f%%, at most %d experts resident "
            "in a layer; reads %.0f MB/s over the run, lane waited %.3f s (%.0f MB/s while "
            "waiting)\n",
            (double)(s->faults - s0->faults) * per, (double)(s->prefetched - s0->prefetched) * per,
            s->prefetched > s0->prefetched
                ? 100.0 * (double)(s->prefetch_used - s0->prefetch_used) /
                      (double)(s->prefetched - s0->prefetched)
                : 0.0,
            s->pred_routed > s0->pred_routed ? 100.0 * (double)(s->pred_hits - s0->pred_hits) /
                                                   (double)(s->pred_routed - s0->pred_routed)
                                             : 0.0,
            bytes * 1e-6 * per,
            routed ? 100.0 * (double)(s->hits - s0->hits) / (double)routed : 0.0, s->max_resident,
            wall_s > 0 ? bytes * 1e-6 / wall_s : 0.0, wait, wait > 0 ? bytes * 1e-6 / wait : 0.0);
}
