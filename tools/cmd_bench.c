/* tiermoe bench: prompt processing (ppN) and generation (tgN) speed in a table
 * shaped like llama-bench's, with the weight bytes streamed per second next to
 * the machine's memory read bandwidth, measured right before each test.
 *
 * Weight bytes per test: a generated token reads every non-expert tensor (one
 * row of token_embd) and k experts per MoE layer; a prompt batch reads every
 * tensor once (it touches nearly every expert). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/rng.h"
#include "core/timing.h"
#include "model/layout.h"
#include "model/model.h"
#include "trace/trace.h"

static void bench_usage(FILE *out) {
    fprintf(out, "usage: tiermoe bench -m FILE [options]\n"
                 "  -p N          prompt tokens of the pp test (default 512; 0 = skip)\n"
                 "  -n N          generated tokens of the tg test (default 128; 0 = skip)\n"
                 "  -r N          repetitions (default 3)\n"
                 "  -t N[,N...]   thread counts (default: physical cores)\n"
                 "  -b N          prompt batch size (default 512)\n"
                 "  -ngl N|all|auto  layers on the GPU, from the first (default 0)\n"
                 "  -o md|csv|json  output format (default md)\n"
                 "  --no-membw    skip the memory bandwidth measurement (made before each test)\n"
                 "  --profile     print where each test's time went\n");
    fputs(trace_config_help, out);
}

typedef struct bench_result {
    const char *test;
    int n, threads;
    double mean, sd, weight_gbs, mem_gbs;
    double steal; /* share of CPU time the host took (virtual machines); -1: unknown */
} bench_result;

/* CPU time counters of /proc/stat's first line: the host's "steal" (time a
 * virtual machine's CPUs wanted to run but the host ran something else) and
 * the total. False where there is no such file. */
static bool bench_cpu_times(uint64_t *steal, uint64_t *total) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return false;
    unsigned long long v[8] = {0};
    const int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                         &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n != 8) return false;
    *steal = v[7], *total = 0;
    for (int i = 0; i < 8; i++) *total += v[i];
    return true;
}

/* Steal since the marks, as a share of all CPU time; then moves the marks. */
static double bench_steal_since(uint64_t *steal0, uint64_t *total0, bool *ok) {
    uint64_t steal, total;
    if (!*ok || !(*ok = bench_cpu_times(&steal, &total))) return -1;
    const double share =
        total > *total0 ? (double)(steal - *steal0) / (double)(total - *total0) : 0;
    *steal0 = steal, *total0 = total;
    return share;
}

static void bench_stats(const double *ts, int r, double n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < r; i++) s += n / ts[i];
    *mean = s / r;
    for (int i = 0; i < r; i++) s2 += (n / ts[i] - *mean) * (n / ts[i] - *mean);
    *sd = r > 1 ? sqrt(s2 / (r - 1)) : 0;
}

/* Time per part since `prof0` / `lane0` (per test run), then reset the marks. */
static void bench_profile(tm_context *ctx, uint64_t *prof0, tm_moe_lane_stats *lane0,
                          const char *test, int n, int reps) {
    uint64_t total = 0;
    for (int i = 0; i < TM_PROF_COUNT; i++) total += ctx->prof_ns[i] - prof0[i];
    fprintf(stderr, "%s%d, %d threads, per run (%.1f ms):", test, n, cpu_pool_size(ctx->pool),
            total * 1e-6 / reps);
    for (int i = 0; i < TM_PROF_COUNT; i++)
        fprintf(stderr, " %s %.1f ms (%.0f%%)%s", tm_prof_part_names[i],
                (ctx->prof_ns[i] - prof0[i]) * 1e-6 / reps,
                100.0 * (ctx->prof_ns[i] - prof0[i]) / (total ? total : 1),
                i + 1 < TM_PROF_COUNT ? "," : "\n");
    memcpy(prof0, ctx->prof_ns, sizeof(ctx->prof_ns));
    const tm_moe_lane_stats *ls = &ctx->lane_stats;
    const uint64_t cap = ls->thread_ns - lane0->thread_ns;
    if (cap) {
        uint64_t busy = 0;
        fprintf(stderr, "  CPU lane, thread time per run (%.1f thread-ms):", cap * 1e-6 / reps);
        for (int i = 0; i < TM_LANE_PART_COUNT; i++) {
            const uint64_t ns = ls->ns[i] - lane0->ns[i];
            busy += ns;
            fprintf(stderr, " %s %.1f ms (%.0f%%),", tm_moe_lane_part_names[i], ns * 1e-6 / reps,
                    100.0 * ns / cap);
        }
        fprintf(stderr, " idle %.1f ms (%.0f%%)\n", (cap - busy) * 1e-6 / reps,
                100.0 * (cap - busy) / cap);
    }
    *lane0 = *ls;
}

int cmd_bench(int argc, char **argv) {
    const char *path = NULL, *fmt = "md";
    long long n_pp = 512, n_tg = 128, reps = 3, batch = 512, v;
    int threads[16], n_threads = 0, membw = 1, profile = 0, ngl = 0;
    tm_trace_config tc = {0};
    tm_trace *tr = NULL;
    if (trace_config_from_env(&tc) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-membw")) {
            membw = 0;
            continue;
        }
        if (!strcmp(a, "--profile")) {
            profile = 1;
            continue;
        }
        const int nt = trace_config_parse_arg(&tc, argc, argv, i);
        if (nt < 0) return 2;
        if (nt > 0) {
            i += nt - 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe bench: %s needs a value (or is unknown)\n", a);
            bench_usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            path = val;
        else if (!strcmp(a, "-p")) {
            if (cli_parse_i64(a, val, 0, 1 << 16, &n_pp)) return 2;
        } else if (!strcmp(a, "-n")) {
            if (cli_parse_i64(a, val, 0, 1 << 16, &n_tg)) return 2;
        } else if (!strcmp(a, "-r")) {
            if (cli_parse_i64(a, val, 1, 1000, &reps)) return 2;
        } else if (!strcmp(a, "-b")) {
            if (cli_parse_i64(a, val, 1, 1 << 16, &batch)) return 2;
        } else if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers")) {
            if (cli_parse_ngl(a, val, &ngl)) return 2;
        } else if (!strcmp(a, "-o")) {
            if (strcmp(val, "md") && strcmp(val, "csv") && strcmp(val, "json")) {
                fprintf(stderr, "tiermoe bench: -o: expected md, csv or json, got '%s'\n", val);
                return 2;
            }
            fmt = val;
        } else if (!strcmp(a, "-t")) {
            char *dup = strdup(val), *save = NULL;
            for (char *tokn = strtok_r(dup, ",", &save); tokn; tokn = strtok_r(NULL, ",", &save)) {
                if (n_threads == 16 || cli_parse_i64(a, tokn, 1, 1024, &v)) {
                    free(dup);
                    return 2;
                }
                threads[n_threads++] = (int)v;
            }
            free(dup);
        } else {
            fprintf(stderr, "tiermoe bench: unknown flag '%s'\n", a);
            bench_usage(stderr);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "tiermoe bench: missing -m FILE\n");
        return 2;
    }
    if (!n_threads) threads[n_threads++] = cpu_physical_cores();
    tm_model *m;
    if (model_load(path, &m) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        return 1;
    }
    tm_model_layout lay;
    if (model_layout_scan(m->file, &lay) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        model_free(m);
        return 1;
    }
    if (trace_config_enabled(&tc) && trace_create(&tc, m, &tr) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        model_layout_free(&lay);
        model_free(m);
        return 1;
    }
    const tm_gguf_tensor *embd = gguf_file_find_tensor(m->file, "token_embd.weight");
    const uint64_t embd_bytes = embd ? embd->n_bytes : 0;
    const bool tied = !gguf_file_find_tensor(m->file, "output.weight");
    const uint64_t dense = lay.other_bytes - (tied ? 0 : embd_bytes);
    uint64_t tg_bytes = dense;
    for (uint32_t l = 0; l < lay.n_layer; l++)
        tg_bytes +=
            lay.layer_expert_bytes[l] / (lay.n_expert ? lay.n_expert : 1) * m->cfg.n_expert_used;
    const uint64_t pp_bytes = dense + lay.expert_bytes;

    char model_name[96];
    tm_gguf_str arch = {"?", 1};
    gguf_file_get_str(m->file, "general.architecture", &arch);
    const tm_gguf_tensor *gexp = gguf_file_find_tensor(m->file, "blk.0.ffn_gate_exps.weight");
    snprintf(model_name, sizeof(model_name), "%.*s %.1fB %s", (int)arch.len, arch.data,
             m->n_params / 1e9, gexp ? quant_type_name(gexp->type) : "");

    bench_result res[64];
    char backend[48] = "CPU";
    int n_res = 0, rc = 0;
    tm_rng rng;
    tm_rng_seed(&rng, 1234);
    for (int ti = 0; ti < n_threads && !rc; ti++) {
        tm_context_params cp = {
            .n_ctx = (n_pp > n_tg ? n_pp : n_tg) + 8,
            .n_batch = batch,
            .n_threads = threads[ti],
            .n_gpu_layers = ngl,
            .profile = profile != 0,
        };
        if (tr) trace_attach(tr, &cp);
        tm_context *ctx;
        if (model_context_create(m, &cp, &ctx) != TM_OK) {
            fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
            rc = 1;
            break;
        }
        /* the host's read bandwidth bounds the CPU layers; on the GPU alone it means nothing */
        const bool probe = membw && !ctx->gpu_output;
        if (ctx->n_gpu_layers)
            snprintf(backend, sizeof(backend), ctx->gpu_output ? "CUDA" : "CUDA %d + CPU %s",
                     ctx->n_gpu_layers, cpu_level_name(cpu_level_get()));
        else
            snprintf(backend, sizeof(backend), "CPU %s", cpu_level_name(cpu_level_get()));
        int32_t *toks = malloc((size_t)(n_pp > 8 ? n_pp : 8) * sizeof(int32_t));
        for (long long i = 0; i < (n_pp > 8 ? n_pp : 8); i++)
            toks[i] = (int32_t)(tm_rng_u64(&rng) % m->cfg.n_vocab);
        /* warm-up: page in the weights, start the threads; on a GPU also load the
         * prompt path's kernels and capture the decode graph (first uses are slow) */
        if (model_decode(ctx, toks, 8, TM_MOE_PHASE_WARMUP, false) != TM_OK) rc = 1;
        if (!rc && ctx->n_gpu_layers) {
            const long long n = n_pp < batch ? n_pp : batch;
            model_context_reset(ctx);
            if (n > 8 && model_decode(ctx, toks, n, TM_MOE_PHASE_WARMUP, false) != TM_OK) rc = 1;
            if (!rc && model_decode(ctx, toks, 1, TM_MOE_PHASE_WARMUP, false) != TM_OK) rc = 1;
        }
        double ts[1000];
        uint64_t prof0[TM_PROF_COUNT];
        memcpy(prof0, ctx->prof_ns, sizeof(prof0));
        tm_moe_lane_stats lane0 = ctx->lane_stats;
        /* Before each test: the bandwidth (on a shared host it moves between
         * tests, and the share shown should be of what the test had) and the
         * steal marks. */
        uint64_t steal0 = 0, total0 = 0;
        bool steal_ok = true; /* until /proc/stat cannot be read */
        if (!rc && n_pp > 0) {
            const double mem = probe ? cpu_read_bandwidth_gbs(ctx->pool, (size_t)1 << 30) : 0;
            bench_steal_since(&steal0, &total0, &steal_ok);
            for (int r = 0; r < reps && !rc; r++) {
                model_context_reset(ctx);
                if (tr) trace_sequence_begin(tr);
                uint64_t t0 = tm_time_ns();
                if (model_decode(ctx, toks, n_pp, TM_MOE_PHASE_PROMPT, false) != TM_OK) rc = 1;
                ts[r] = (tm_time_ns() - t0) * 1e-9;
            }
            bench_result *b = &res[n_res++];
            *b = (bench_result){.test = "pp",
                                .n = (int)n_pp,
                                .threads = threads[ti],
                                .mem_gbs = mem,
                                .steal = bench_steal_since(&steal0, &total0, &steal_ok)};
            bench_stats(ts, (int)reps, (double)n_pp, &b->mean, &b->sd);
            b->weight_gbs = pp_bytes * (b->mean / n_pp) / 1e9 * ((n_pp + batch - 1) / batch);
            if (profile) bench_profile(ctx, prof0, &lane0, "pp", (int)n_pp, (int)reps);
        }
        if (!rc && n_tg > 0) {
            const double mem = probe ? cpu_read_bandwidth_gbs(ctx->pool, (size_t)1 << 30) : 0;
            bench_steal_since(&steal0, &total0, &steal_ok);
            for (int r = 0; r < reps && !rc; r++) {
                model_context_reset(ctx);
                if (tr) trace_sequence_begin(tr);
                int32_t id = toks[0];
                uint64_t t0 = tm_time_ns();
                for (long long i = 0; i < n_tg && !rc; i++) {
                    if (model_decode(ctx, &id, 1, TM_MOE_PHASE_DECODE, false) != TM_OK) rc = 1;
                    id = (int32_t)(tm_rng_u64(&rng) % m->cfg.n_vocab);
                }
                ts[r] = (tm_time_ns() - t0) * 1e-9;
            }
            bench_result *b = &res[n_res++];
            *b = (bench_result){.test = "tg",
                                .n = (int)n_tg,
                                .threads = threads[ti],
                                .mem_gbs = mem,
                                .steal = bench_steal_since(&steal0, &total0, &steal_ok)};
            bench_stats(ts, (int)reps, (double)n_tg, &b->mean, &b->sd);
            b->weight_gbs = tg_bytes * b->mean / 1e9;
            if (profile) bench_profile(ctx, prof0, &lane0, "tg", (int)n_tg, (int)reps);
        }
        if (rc) fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        free(toks);
        model_context_free(ctx);
    }

    const double size_gib = m->weight_bytes / 1073741824.0, params_b = m->n_params / 1e9;
    if (!strcmp(fmt, "md")) {
        printf("| model | size | params | backend | threads | test | t/s | weights GB/s | mem read "
               "GB/s | of mem |\n");
        printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    } else if (!strcmp(fmt, "csv")) {
        printf(
            "model,size_gib,params_b,backend,threads,test,ts_mean,ts_stddev,weights_gbs,mem_gbs\n");
    } else {
        printf("[\n");
    }
    for (int i = 0; i < n_res; i++) {
        const bench_result *b = &res[i];
        char test[32];
        snprintf(test, sizeof(test), "%s%d", b->test, b->n);
        if (!strcmp(fmt, "md"))
            printf("| %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f ± %.2f | %.1f | %.1f | "
                   "%.0f%% |\n",
                   model_name, size_gib, params_b, backend, b->threads, test, b->mean, b->sd,
                   b->weight_gbs, b->mem_gbs,
                   b->mem_gbs > 0 ? 100 * b->weight_gbs / b->mem_gbs : 0.0);
        else if (!strcmp(fmt, "csv"))
            printf("\"%s\",%.3f,%.3f,%s,%d,%s,%.3f,%.3f,%.2f,%.2f\n", model_name, size_gib,
                   params_b, backend, b->threads, test, b->mean, b->sd, b->weight_gbs, b->mem_gbs);
        else
            printf("  {\"model\": \"%s\", \"size_gib\": %.3f, \"params_b\": %.3f, \"backend\": "
                   "\"%s\", "
                   "\"threads\": %d, \"test\": \"%s\", \"ts_mean\": %.3f, \"ts_stddev\": %.3f, "
                   "\"weights_gbs\": %.2f, \"mem_gbs\": %.2f}%s\n",
                   model_name, size_gib, params_b, backend, b->threads, test, b->mean, b->sd,
                   b->weight_gbs, b->mem_gbs, i + 1 < n_res ? "," : "");
    }
    if (!strcmp(fmt, "json")) printf("]\n");
    fprintf(stderr, "cpu: %s\n", cpu_features_string());
    /* On a virtual machine the host may run others on our CPUs: say how much,
     * since it moves the numbers more than most changes do. */
    const char *sep = "host steal (CPU time the host took from this machine):";
    for (int i = 0; i < n_res; i++)
        if (res[i].steal >= 0) {
            fprintf(stderr, "%s %s%d %.1f%%", sep, res[i].test, res[i].n, 100 * res[i].steal);
            sep = ",";
        }
    if (strcmp(sep, ",") == 0) fputc('\n', stderr);
    if (tr && trace_finish(tr) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        rc = 1;
    }
    trace_free(tr);
    model_layout_free(&lay);
    model_free(m);
    return rc;
}
