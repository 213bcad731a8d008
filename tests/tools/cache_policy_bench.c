/* cache_policy_bench: what cache_policy_step costs per layer per decode step.
 *
 *   cache_policy_bench [LOG] [-r REPS]
 *
 * Replays the decode steps of a routing log (tiermoe trace --routing-log; without
 * one, a synthetic stream with locality: 128 experts, top-8) through one policy of
 * each kind at 10/25/40/60% residency, max_admit 1, and prints the mean time of a
 * step (the decode critical path runs one per MoE layer per token). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/timing.h"
#include "tier/cache_policy.h"
#include "trace/trace_log.h"

int main(int argc, char **argv) {
    const char *path = NULL;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            path = argv[i];
    }
    uint32_t E = 128, k = 8;
    int32_t *ids = NULL;
    size_t n_steps = 0;
    if (path) { /* every layer's decode steps, one after another */
        tm_trace_log log;
        if (trace_log_read(path, &log) != TM_OK) {
            fprintf(stderr, "cache_policy_bench: %s\n", tm_error_message());
            return 1;
        }
        E = log.shape.n_expert, k = log.shape.n_expert_used;
        for (uint32_t l = 0; l < log.shape.n_layer; l++)
            for (uint64_t c = 0; c < log.layers[l].n_calls; c++)
                n_steps += log.layers[l].calls[c].n_tok == 1;
        ids = malloc(n_steps * k * sizeof(int32_t));
        size_t n = 0;
        for (uint32_t l = 0; l < log.shape.n_layer; l++)
            for (uint64_t c = 0; c < log.layers[l].n_calls; c++)
                if (log.layers[l].calls[c].n_tok == 1)
                    memcpy(ids + k * n++, log.layers[l].ids + log.layers[l].calls[c].off,
                           k * sizeof(int32_t));
        trace_log_free(&log);
    } else {
        tm_rng r;
        tm_rng_seed(&r, 1);
        n_steps = 100000;
        ids = malloc(n_steps * k * sizeof(int32_t));
        int32_t hot[24];
        for (int i = 0; i < 24; i++) hot[i] = (int32_t)(tm_rng_u64(&r) % E);
        for (size_t t = 0; t < n_steps; t++) {
            if (tm_rng_u64(&r) % 8 == 0) hot[tm_rng_u64(&r) % 24] = (int32_t)(tm_rng_u64(&r) % E);
            for (uint32_t j = 0; j < k; j++) {
                int32_t e;
                bool dup;
                do {
                    e = tm_rng_u64(&r) % 4 ? hot[tm_rng_u64(&r) % 24]
                                           : (int32_t)(tm_rng_u64(&r) % E);
                    dup = false;
                    for (uint32_t q = 0; q < j; q++) dup |= ids[t * k + q] == e;
                } while (dup);
                ids[t * k + j] = e;
            }
        }
    }
    printf("%zu decode steps, %u experts, top-%u, max_admit 1, %d reps\n", n_steps, E, k, reps);
    printf("%-9s %10s %10s %10s %10s   (ns per step; hit rate)\n", "policy", "10%", "25%", "40%",
           "60%");
    tm_cache_admit adm[4096];
    for (int kind = 0; kind < TM_CACHE_KIND_COUNT; kind++) {
        printf("%-9s", cache_policy_kind_name((tm_cache_policy_kind)kind));
        const double res[4] = {0.1, 0.25, 0.4, 0.6};
        for (int i = 0; i < 4; i++) {
            tm_cache_policy_params p = cache_policy_params_default((tm_cache_policy_kind)kind);
            p.max_admit = 1;
            uint64_t best = UINT64_MAX, hits = 0;
            for (int rep = 0; rep < reps; rep++) {
                tm_cache_policy *c;
                if (cache_policy_create(&p, E, (int32_t)(res[i] * E + 0.5), NULL, &c) != TM_OK)
                    return 1;
                hits = 0;
                const uint64_t t0 = tm_time_ns();
                for (size_t t = 0; t < n_steps; t++) {
                    int64_t h;
                    cache_policy_step(c, ids + t * k, 1, k, adm, &h);
                    hits += (uint64_t)h;
                }
                const uint64_t dt = tm_time_ns() - t0;
                best = dt < best ? dt : best;
                cache_policy_free(c);
            }
            printf(" %5.0f %3.0f%%", (double)best / n_steps, 100.0 * hits / (n_steps * k));
        }
        printf("\n");
    }
    free(ids);
    return 0;
}
