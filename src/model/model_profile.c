/* The --profile report (model_profile.h). */
#include "model/model_profile.h"

void model_profile_print(const tm_context *ctx, const uint64_t *prof0,
                         const tm_moe_lane_stats *lane0, const tm_tier_stats *tier0, int runs,
                         FILE *out) {
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
    int n_gpu = 0;
    const tm_tier_stats *gs = tier_stats_gpu(ctx->tier, &n_gpu);
    if (n_gpu < 2) n_gpu = 0; /* one GPU: the classes' lines say it all */
    uint64_t steps = 0, rows = 0;
    exec_step_counts(ctx->exec, &steps, &rows);
    for (int g = 0; g < n_gpu; g++) { /* since load: shares and per step, not per run */
        const tm_tier_stats *s = &gs[g];
        const uint64_t all = s->hot_slots + s->pcie_slots + s->cold_slots + s->ahead_slots;
        if (!s->layers) continue;
        const tm_exec_peer_stats p = exec_peer_stats(ctx->exec, g);
        const double per = steps ? 1.0 / (double)steps : 0;
        fprintf(out,
                "  GPU %d (its %u layers' MoE steps, since load): %llu routed slots, %.1f%% hot, "
                "%.1f%% over PCIe, %.1f%% from copies ahead, %.1f%% to the CPU lane (prompts' "
                "fetched slots apart); %.3f GB of experts read from VRAM, %.3f GB over PCIe, "
                "%.3f GB copied ahead; lanes per step: hot %.3f ms, PCIe %.3f ms, waiting for the "
                "CPU lane %.3f ms, CPU lane %.3f ms; peer copies: %.2f a step, %.2f KB a token, "
                "%.3f ms a step (%llu steps)\n",
                g, s->layers, (unsigned long long)all, all ? 100.0 * s->hot_slots / all : 0.0,
                all ? 100.0 * s->pcie_slots / all : 0.0, all ? 100.0 * s->ahead_slots / all : 0.0,
                all ? 100.0 * s->cold_slots / all : 0.0, s->hot_bytes * 1e-9, s->pcie_bytes * 1e-9,
                s->ahead_bytes * 1e-9, s->hot_ns * 1e-6 * per, s->pcie_ns * 1e-6 * per,
                s->gpu_wait_ns * 1e-6 * per, s->cold_ns * 1e-6 * per, (double)p.copies * per,
                rows ? p.bytes * 1e-3 / (double)rows : 0.0, p.ns * 1e-6 * per,
                (unsigned long long)steps);
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

void model_store_print(const tm_context *ctx, const tm_store_stats *s0, double wall_s, FILE *out) {
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
