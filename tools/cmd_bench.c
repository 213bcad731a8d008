/* tiermoe bench: prompt processing (ppN) and generation (tgN) speed in a table
 * shaped like llama-bench's, with the weight bytes the CPU streams per second
 * next to the machine's memory read bandwidth, measured right before each
 * test, and the bound that bandwidth sets.
 *
 * Weight bytes per test, by the side that reads them: a generated token reads
 * every non-expert tensor (one row of token_embd) where it lives, and its
 * routed experts where the tier computed them (counted by the tier: hot slots
 * on the GPU, cold on the CPU); a prompt batch reads every tensor once where it
 * lives (it touches nearly every expert). CPU bound = mem GB/s / CPU bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/rng.h"
#include "core/timing.h"
#include "model/model.h"
#include "trace/trace.h"

static void bench_usage(FILE *out) {
    fprintf(out, "usage: tiermoe bench -m FILE [options]\n"
                 "  -p N          prompt tokens of the pp test (default 512; 0 = skip)\n"
                 "  -n N          generated tokens of the tg test (default 128; 0 = skip)\n"
                 "  -r N          repetitions (default 3)\n"
                 "  -t N[,N...]   thread counts (default: physical cores)\n"
                 "  -b N          prompt batch size (default 512)\n"
                 "  -o md|csv|json  output format (default md)\n"
                 "  --no-membw    skip the memory bandwidth measurement (made before each test)\n"
                 "  --profile     print where each test's time went\n");
    fputs(cli_place_help, out);
    fputs(trace_config_help, out);
}

typedef struct bench_result {
    const char *test;
    int n, threads;
    double mean, sd;
    double cpu_gbs, gpu_gbs; /* weight bytes each side read per second */
    double pcie_gbs;         /* expert bytes the GPU read from RAM per second (--moe-pcie) */
    double mem_gbs;          /* the CPU's read bandwidth (0: not measured) */
    double bound;            /* t/s the CPU's bandwidth allows (0: not measured) */
    double steal;            /* share of CPU time the host took (virtual machines); -1: unknown */
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

/* Weight bytes a step reads outside the experts, by side: a token's
 * embedding row (unless the table doubles as the output head), every other
 * tensor where it lives. */
static void bench_dense_bytes(const tm_context *ctx, uint64_t *cpu, uint64_t *gpu) {
    const tm_gguf_file *f = ctx->model->file;
    const bool tied = !gguf_file_find_tensor(f, "output.weight");
    *cpu = *gpu = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        if (placement_tensor_is_expert(t->name.data, t->name.len)) continue;
        uint64_t b = t->n_bytes;
        if (!tied && t->name.len == 17 && !memcmp(t->name.data, "token_embd.weight", 17))
            b = t->n_bytes / (uint64_t)(t->ne[1] ? t->ne[1] : 1),
            *cpu += b; /* a row, on the host */
        else
            *(ctx->placement.tensor_dev[i] == TM_DEV_GPU ? gpu : cpu) += b;
    }
}

/* Expert bytes of every layer by where they live (a prompt batch reads them all). */
static void bench_expert_bytes(const tm_context *ctx, uint64_t *cpu, uint64_t *gpu) {
    const tm_gguf_file *f = ctx->model->file;
    *cpu = *gpu = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        if (placement_tensor_is_expert(t->name.data, t->name.len))
            *(ctx->placement.tensor_dev[i] == TM_DEV_GPU ? gpu : cpu) += t->n_bytes;
    }
}

/* The tier's expert bytes so far: [0] the GPU's from VRAM, [1] the CPU's, [2]
 * the GPU's from RAM over PCIe. */
static void bench_tier_bytes(const tm_context *ctx, uint64_t bytes[3]) {
    const tm_tier_stats *ts = tier_stats(ctx->tier);
    bytes[0] = bytes[1] = bytes[2] = 0;
    for (int c = 0; c < TM_TIER_CLASS_COUNT; c++)
        bytes[0] += ts[c].hot_bytes, bytes[1] += ts[c].cold_bytes, bytes[2] += ts[c].pcie_bytes;
}

/* "CPU AVX512", "CUDA", "CUDA 13 + CPU AVX512", "CUDA (experts: 48 layers in RAM, 4.20 GiB cached) + CPU AVX512" */
static void bench_backend(const tm_context *ctx, char *out, size_t n) {
    const char *cpu = cpu_level_name(cpu_level_get());
    if (!ctx->placement.any_gpu) {
        snprintf(out, n, "CPU %s", cpu);
        return;
    }
    uint32_t ram = 0;
    for (uint32_t l = 0; l < ctx->placement.n_layer; l++)
        ram += ctx->placement.experts_dev[l] == TM_DEV_CPU &&
               ctx->placement.layer_dev[l] == TM_DEV_GPU;
    const bool all = ctx->gpu_output && (uint32_t)ctx->n_gpu_layers == ctx->placement.n_layer;
    int w = all ? snprintf(out, n, "CUDA") : snprintf(out, n, "CUDA %d", ctx->n_gpu_layers);
    if (ram && w > 0 && (size_t)w < n)
        w += snprintf(out + w, n - (size_t)w, " (experts: %u layers in RAM", ram);
    if (ram && tier_cache_bytes(ctx->tier) && w > 0 && (size_t)w < n)
        w += snprintf(out + w, n - (size_t)w, ", %.2f GiB cached",
                      tier_cache_bytes(ctx->tier) / 1073741824.0);
    if (ram && tier_pcie_slots(ctx->tier) && w > 0 && (size_t)w < n)
        w += snprintf(out + w, n - (size_t)w, ", up to %d a token over PCIe",
                      tier_pcie_slots(ctx->tier));
    if (ram && w > 0 && (size_t)w < n) w += snprintf(out + w, n - (size_t)w, ")");
    if ((!all || ram) && w > 0 && (size_t)w < n) snprintf(out + w, n - (size_t)w, " + CPU %s", cpu);
}

static int bench_main(int argc, char **argv, cli_place *place) {
    const char *path = NULL, *fmt = "md";
    long long n_pp = 512, n_tg = 128, reps = 3, batch = 512, v;
    int threads[16], n_threads = 0, membw = 1, profile = 0;
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
        const int np = cli_place_parse(place, "bench", argc, argv, i);
        if (np < 0) return 2;
        if (np > 0) {
            i += np - 1;
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
    tm_context_params place_cp = {0};
    if (cli_place_apply(place, "bench", m, &place_cp)) {
        model_free(m);
        return 1;
    }
    if (trace_config_enabled(&tc) && trace_create(&tc, m, &tr) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        model_free(m);
        return 1;
    }
    char model_name[96];
    tm_gguf_str arch = {"?", 1};
    gguf_file_get_str(m->file, "general.architecture", &arch);
    const tm_gguf_tensor *gexp = gguf_file_find_tensor(m->file, "blk.0.ffn_gate_exps.weight");
    snprintf(model_name, sizeof(model_name), "%.*s %.1fB %s", (int)arch.len, arch.data,
             m->n_params / 1e9, gexp ? quant_type_name(gexp->type) : "");

    bench_result res[64];
    char backend[128] = "CPU";
    int n_res = 0, rc = 0;
    tm_rng rng;
    tm_rng_seed(&rng, 1234);
    for (int ti = 0; ti < n_threads && !rc; ti++) {
        tm_context_params cp = place_cp;
        cp.n_ctx = (n_pp > n_tg ? n_pp : n_tg) + 8;
        cp.n_batch = batch;
        cp.n_threads = threads[ti];
        cp.profile = profile != 0;
        if (tr) trace_attach(tr, &cp);
        tm_context *ctx;
        if (model_context_create(m, &cp, &ctx) != TM_OK) {
            fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
            rc = 1;
            break;
        }
        bench_backend(ctx, backend, sizeof(backend));
        uint64_t dense_cpu, dense_gpu, exp_cpu, exp_gpu;
        bench_dense_bytes(ctx, &dense_cpu, &dense_gpu);
        bench_expert_bytes(ctx, &exp_cpu, &exp_gpu);
        /* the host's read bandwidth bounds what the CPU reads; with nothing but
         * the embedding there it means nothing */
        const bool probe = membw && (dense_cpu > (uint64_t)m->cfg.n_embd * 4 || exp_cpu);
        int32_t *toks = malloc((size_t)(n_pp > 8 ? n_pp : 8) * sizeof(int32_t));
        for (long long i = 0; i < (n_pp > 8 ? n_pp : 8); i++)
            toks[i] = (int32_t)(tm_rng_u64(&rng) % m->cfg.n_vocab);
        /* warm-up: page in the weights, start the threads; on a GPU also load the
         * prompt path's kernels and capture the decode graph (first uses are slow) */
        if (model_decode(ctx, toks, 8, TM_MOE_PHASE_WARMUP, false) != TM_OK) rc = 1;
        if (!rc && ctx->placement.any_gpu) {
            const long long n = n_pp < batch ? n_pp : batch;
            model_context_reset(ctx);
            if (n > 8 && model_decode(ctx, toks, n, TM_MOE_PHASE_WARMUP, false) != TM_OK) rc = 1;
            if (!rc && model_decode(ctx, toks, 1, TM_MOE_PHASE_DECODE, false) != TM_OK) rc = 1;
        }
        double ts[1000];
        uint64_t prof0[TM_PROF_COUNT];
        memcpy(prof0, model_prof_ns(ctx), sizeof(prof0));
        tm_moe_lane_stats lane0 = *model_lane_stats(ctx);
        tm_tier_stats tier0[TM_TIER_CLASS_COUNT];
        memcpy(tier0, tier_stats(ctx->tier), sizeof(tier0));
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
            /* every tensor once per batch, where it lives */
            const double batches = (double)((n_pp + batch - 1) / batch);
            const double cpu_b = (double)(dense_cpu + exp_cpu) * batches,
                         gpu_b = (double)(dense_gpu + exp_gpu) * batches;
            b->cpu_gbs = cpu_b * (b->mean / n_pp) / 1e9;
            b->gpu_gbs = gpu_b * (b->mean / n_pp) / 1e9;
            b->bound = mem > 0 && cpu_b > 0 ? n_pp * mem * 1e9 / cpu_b : 0;
            if (profile) {
                fprintf(stderr, "pp%lld, %d threads: ", n_pp, threads[ti]);
                cli_profile_print(ctx, prof0, &lane0, tier0, (int)reps, stderr);
            }
        }
        memcpy(prof0, model_prof_ns(ctx), sizeof(prof0));
        lane0 = *model_lane_stats(ctx);
        memcpy(tier0, tier_stats(ctx->tier), sizeof(tier0));
        if (!rc && n_tg > 0) {
            const double mem = probe ? cpu_read_bandwidth_gbs(ctx->pool, (size_t)1 << 30) : 0;
            uint64_t b0[3], b1[3];
            bench_tier_bytes(ctx, b0);
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
            bench_tier_bytes(ctx, b1);
            bench_result *b = &res[n_res++];
            *b = (bench_result){.test = "tg",
                                .n = (int)n_tg,
                                .threads = threads[ti],
                                .mem_gbs = mem,
                                .steal = bench_steal_since(&steal0, &total0, &steal_ok)};
            bench_stats(ts, (int)reps, (double)n_tg, &b->mean, &b->sd);
            /* a token: the dense weights where they live, its experts where the tier ran them */
            const double n_gen = (double)(n_tg * reps);
            const double cpu_b = dense_cpu + (b1[1] - b0[1]) / n_gen,
                         gpu_b = dense_gpu + (b1[0] - b0[0]) / n_gen,
                         pcie_b = (b1[2] - b0[2]) / n_gen;
            b->cpu_gbs = cpu_b * b->mean / 1e9, b->gpu_gbs = gpu_b * b->mean / 1e9;
            b->pcie_gbs = pcie_b * b->mean / 1e9;
            b->bound = mem > 0 && cpu_b > 0 ? mem * 1e9 / cpu_b : 0;
            if (profile) {
                fprintf(stderr, "tg%lld, %d threads: ", n_tg, threads[ti]);
                cli_profile_print(ctx, prof0, &lane0, tier0, (int)(n_tg * reps), stderr);
            }
        }
        if (rc) fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        free(toks);
        model_context_free(ctx);
    }

    const double size_gib = m->weight_bytes / 1073741824.0, params_b = m->n_params / 1e9;
    if (!strcmp(fmt, "md")) {
        printf("| model | size | params | backend | threads | test | t/s | CPU GB/s | mem read "
               "GB/s | of mem | CPU bound t/s | GPU GB/s | PCIe GB/s |\n");
        printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
               "| ---: |\n");
    } else if (!strcmp(fmt, "csv")) {
        printf("model,size_gib,params_b,backend,threads,test,ts_mean,ts_stddev,cpu_gbs,mem_gbs,"
               "cpu_bound_ts,gpu_gbs,pcie_gbs\n");
    } else {
        printf("[\n");
    }
    for (int i = 0; i < n_res; i++) {
        const bench_result *b = &res[i];
        char test[32];
        snprintf(test, sizeof(test), "%s%d", b->test, b->n);
        if (!strcmp(fmt, "md"))
            printf("| %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f ± %.2f | %.1f | %.1f | %.0f%% | "
                   "%.1f | %.1f | %.1f |\n",
                   model_name, size_gib, params_b, backend, b->threads, test, b->mean, b->sd,
                   b->cpu_gbs, b->mem_gbs, b->mem_gbs > 0 ? 100 * b->cpu_gbs / b->mem_gbs : 0.0,
                   b->bound, b->gpu_gbs, b->pcie_gbs);
        else if (!strcmp(fmt, "csv"))
            printf("\"%s\",%.3f,%.3f,\"%s\",%d,%s,%.3f,%.3f,%.2f,%.2f,%.2f,%.2f,%.2f\n", model_name,
                   size_gib, params_b, backend, b->threads, test, b->mean, b->sd, b->cpu_gbs,
                   b->mem_gbs, b->bound, b->gpu_gbs, b->pcie_gbs);
        else
            printf("  {\"model\": \"%s\", \"size_gib\": %.3f, \"params_b\": %.3f, \"backend\": "
                   "\"%s\", \"threads\": %d, \"test\": \"%s\", \"ts_mean\": %.3f, "
                   "\"ts_stddev\": %.3f, \"cpu_gbs\": %.2f, \"mem_gbs\": %.2f, "
                   "\"cpu_bound_ts\": %.2f, \"gpu_gbs\": %.2f, \"pcie_gbs\": %.2f}%s\n",
                   model_name, size_gib, params_b, backend, b->threads, test, b->mean, b->sd,
                   b->cpu_gbs, b->mem_gbs, b->bound, b->gpu_gbs, b->pcie_gbs,
                   i + 1 < n_res ? "," : "");
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
    model_free(m);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    cli_place place = {0};
    const int rc = bench_main(argc, argv, &place);
    cli_place_free(&place);
    return rc;
}
