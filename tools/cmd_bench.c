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

#include "cli_internal.h"
#include "core/rng.h"
#include "core/timing.h"
#include "model/model.h"
#include "model/model_profile.h"
#include "model/synth.h"
#include "trace/trace.h"

static void bench_usage(FILE *out) {
    fprintf(out, "usage: tiermoe bench -m FILE [options]\n"
                 "Several values of -p, -n, -t, -ngl and -ncmoe (a,b,...) run every combination,\n"
                 "as llama-bench does; a context per (-ngl, -ncmoe, -t), every -p and -n in it.\n"
                 "  -p N[,N...]   prompt tokens of the pp tests (default 512; 0 = skip)\n"
                 "  -n N[,N...]   generated tokens of the tg tests (default 128; 0 = skip)\n"
                 "  -d N[,N...]   context depth: each test runs after an N-token prompt (not\n"
                 "                timed), named \"tg128 @ d8192\" as llama-bench's (default 0)\n"
                 "  -r N          repetitions (default 3)\n"
                 "  -t N[,N...]   thread counts (default: physical cores)\n"
                 "  -b N          prompt batch size (default: the engine's, 512 or with\n"
                 "                experts in RAM behind a GPU up to 4096 as VRAM allows)\n"
                 "  -np N[,N...]  tg tests decode N sequences together, a row each a step, as\n"
                 "                serve --parallel does (default 1); t/s counts all N\n"
                 "  -o md|csv|json|jsonl  output format (default md)\n"
                 "  --no-membw    skip the memory bandwidth measurement (made before each test)\n"
                 "  --profile     print where each test's time went\n");
    fputs(cli_place_help, out);
    fputs(cli_trace_help, out);
}

#define BENCH_MAX_VALUES 16

/* A flag's comma-separated values (at most BENCH_MAX_VALUES); ngl: -ngl's
 * words (all, auto) too. Prints the error; nonzero on bad input. */
static int bench_parse_list(const char *flag, const char *val, long long lo, long long hi, bool ngl,
                            long long *out, int *n) {
    const size_t len = strlen(val);
    if (!len || val[0] == ',' || val[len - 1] == ',' || strstr(val, ",,")) {
        fprintf(stderr, "tiermoe bench: %s: an empty value in '%s'\n", flag, val);
        return 1;
    }
    char *dup = strdup(val), *save = NULL;
    if (!dup) return 1;
    *n = 0;
    int rc = 0;
    for (char *t = strtok_r(dup, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        int g = 0;
        if (*n == BENCH_MAX_VALUES) {
            fprintf(stderr, "tiermoe bench: %s: at most %d values\n", flag, BENCH_MAX_VALUES);
            rc = 1;
        } else if (ngl) {
            rc = cli_parse_ngl(flag, t, &g);
            out[(*n)++] = g;
        } else {
            rc = cli_parse_i64(flag, t, lo, hi, &out[*n]);
            ++*n;
        }
    }
    if (!rc && !*n) {
        fprintf(stderr, "tiermoe bench: %s: expected a value, got '%s'\n", flag, val);
        rc = 1;
    }
    free(dup);
    return rc;
}

typedef struct bench_result {
    const char *test;
    int n, n_par, threads;
    int depth;
    /* tokens in the context before the test (-d) */ /* n_par: sequences decoded together (tg) */
    char backend[128]; /* where things ran, from the context (bench_backend) */
    int n_gpu_layers, n_cpu_moe;
    long long n_batch; /* the prompt batch (-b or the engine's choice) */
    double mean, sd;
    double cpu_gbs, gpu_gbs; /* weight bytes each side read per second */
    double pcie_gbs;         /* expert bytes the GPU read from RAM per second (--moe-pcie) */
    double mem_gbs;          /* the CPU's read bandwidth (0: not measured) */
    double bound;            /* t/s the CPU's bandwidth allows (0: not measured) */
    double steal;            /* share of CPU time the host took (virtual machines); -1: unknown */
    double cache_hit;   /* routed slots of cached layers served from the VRAM cache; -1: none */
    double ahead_share; /* routed slots of layers with experts in RAM computed from copies ahead
                           (-1: none copied) */
    double ahead_used;  /* experts copied ahead that the step routed to */
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
        bytes[0] += ts[c].hot_bytes, bytes[1] += ts[c].cold_bytes,
            bytes[2] += ts[c].pcie_bytes + ts[c].fetch_bytes + ts[c].ahead_bytes;
}

/* The share of the cached layers' routed slots the VRAM cache served since
 * the marks (-1: no cache). */
static double bench_cache_hit(const tm_context *ctx, const tm_tier_stats *tier0) {
    const tm_tier_stats *s = &tier_stats(ctx->tier)[TM_TIER_CACHED], *s0 = &tier0[TM_TIER_CACHED];
    if (!s->layers) return -1;
    const uint64_t hot = s->hot_slots - s0->hot_slots,
                   all = hot + (s->cold_slots - s0->cold_slots) + (s->pcie_slots - s0->pcie_slots) +
                         (s->fetch_slots - s0->fetch_slots) + (s->ahead_slots - s0->ahead_slots);
    return all ? (double)hot / (double)all : 0;
}

/* Decode steps' copies ahead since the marks: the share of the routed slots of
 * layers with experts in RAM (cached or not) computed from them, and the share
 * of the copied experts routed (-1: nothing copied). */
static void bench_ahead(const tm_context *ctx, const tm_tier_stats *tier0, double *share,
                        double *used) {
    uint64_t slots = 0, all = 0, copied = 0, routed = 0;
    for (int c = TM_TIER_RAM; c <= TM_TIER_CACHED; c++) {
        const tm_tier_stats *s = &tier_stats(ctx->tier)[c], *s0 = &tier0[c];
        slots += s->ahead_slots - s0->ahead_slots, copied += s->ahead_experts - s0->ahead_experts;
        routed += s->ahead_used - s0->ahead_used;
        all += (s->hot_slots - s0->hot_slots) + (s->cold_slots - s0->cold_slots) +
               (s->pcie_slots - s0->pcie_slots) + (s->fetch_slots - s0->fetch_slots) +
               (s->ahead_slots - s0->ahead_slots);
    }
    *share = copied && all ? (double)slots / (double)all : -1;
    *used = copied ? (double)routed / (double)copied : 0;
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

/* What every context's tests share. */
typedef struct bench_opts {
    long long pp[BENCH_MAX_VALUES], tg[BENCH_MAX_VALUES], np[BENCH_MAX_VALUES],
        depth[BENCH_MAX_VALUES];
    int n_pp, n_tg, n_np, n_depth;
    long long reps, batch;
    bool membw, profile;
    tm_trace *tr;
} bench_opts;

#define BENCH_MAX_RESULTS 256

#define BENCH_MAX_PAR 64

/* One decode step of sequences 0 .. n-1, a token each. Nonzero on failure. */
static int bench_decode_rows(tm_context *ctx, const int32_t *ids, int n) {
    int seqs[BENCH_MAX_PAR];
    for (int i = 0; i < n; i++) seqs[i] = i;
    return model_decode_rows(ctx, n, seqs, ids) != TM_OK;
}

/* One context (a placement and a thread count): warm up, then every pp and
 * tg test, appended to res. Nonzero after printing an error. */
static int bench_context(tm_model *m, const tm_context_params *cp0, const bench_opts *o,
                         tm_rng *rng, bench_result *res, int *n_res) {
    long long max_pp = 0, max_tg = 0, max_np = 1, max_d = 0;
    for (int i = 0; i < o->n_pp; i++) max_pp = o->pp[i] > max_pp ? o->pp[i] : max_pp;
    for (int i = 0; i < o->n_tg; i++) max_tg = o->tg[i] > max_tg ? o->tg[i] : max_tg;
    for (int i = 0; i < o->n_np; i++) max_np = o->np[i] > max_np ? o->np[i] : max_np;
    for (int i = 0; i < o->n_depth; i++) max_d = o->depth[i] > max_d ? o->depth[i] : max_d;
    /* every depth runs every test */
    const int n_per = o->n_pp + o->n_tg * o->n_np, n_tests = n_per * o->n_depth;
    if (*n_res + n_tests > BENCH_MAX_RESULTS) {
        fprintf(stderr, "tiermoe bench: more than %d tests; give fewer values\n",
                BENCH_MAX_RESULTS);
        return 1;
    }
    tm_context_params cp = *cp0;
    cp.n_seq = (int)max_np; /* each its own KV range of the longest test */
    cp.n_ctx = (max_d + (max_pp > max_tg ? max_pp : max_tg) + 8) * max_np;
    /* -b, or the engine's choice (512, more with experts in RAM behind a GPU) */
    cp.n_batch = o->batch ? (o->batch > max_np ? o->batch : max_np) : (max_np > 512 ? max_np : 0);
    cp.profile = o->profile;
    if (o->tr) trace_attach(o->tr, &cp.cb, &cp.cb_ud);
    tm_context *ctx;
    if (model_context_create(m, &cp, &ctx) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        return 1;
    }
    if (o->tr) trace_set_resident(o->tr, tier_expert_resident, ctx->tier);
    const long long batch = ctx->params.n_batch;
    char backend[128];
    bench_backend(ctx, backend, sizeof(backend));
    uint64_t dense_cpu, dense_gpu, exp_cpu, exp_gpu;
    bench_dense_bytes(ctx, &dense_cpu, &dense_gpu);
    bench_expert_bytes(ctx, &exp_cpu, &exp_gpu);
    /* the host's read bandwidth bounds what the CPU reads; with nothing but
     * the embedding there it means nothing */
    const bool probe = o->membw && (dense_cpu > (uint64_t)m->cfg.n_embd * 4 || exp_cpu);
    long long n_toks = max_d + max_pp > 8 ? max_d + max_pp : 8; /* a pp test follows its depth */
    n_toks = n_toks > max_np ? n_toks : max_np;
    int32_t *toks = malloc((size_t)n_toks * sizeof(int32_t));
    if (!toks) {
        model_context_free(ctx);
        return 1;
    }
    for (long long i = 0; i < n_toks; i++) toks[i] = (int32_t)(tm_rng_u64(rng) % m->cfg.n_vocab);
    int rc = 0;
    /* warm-up: page in the weights, start the threads; on a GPU also load the
     * prompt path's kernels and capture the decode graph (first uses are slow) */
    if (model_decode(ctx, toks, 8, TM_MOE_PHASE_WARMUP, false) != TM_OK) rc = 1;
    if (!rc && ctx->placement.any_gpu) {
        const long long n = max_pp < batch ? max_pp : batch;
        model_context_reset(ctx);
        if (n > 8 && model_decode(ctx, toks, n, TM_MOE_PHASE_WARMUP, false) != TM_OK) rc = 1;
        if (!rc && model_decode(ctx, toks, 1, TM_MOE_PHASE_DECODE, false) != TM_OK) rc = 1;
        for (int i = 0; i < o->n_np && !rc; i++) /* the decode graph of each row count */
            rc = bench_decode_rows(ctx, toks, (int)o->np[i]);
    }
    const int reps = (int)o->reps;
    double ts[1000];
    uint64_t prof0[TM_PROF_COUNT], steal0 = 0, total0 = 0;
    tm_moe_lane_stats lane0;
    tm_tier_stats tier0[TM_TIER_CLASS_COUNT];
    bool steal_ok = true; /* until /proc/stat cannot be read */
    /* the tests: at each depth every pp value, then every tg value */
    for (int tj = 0; tj < n_tests && !rc; tj++) {
        const int ti = tj % n_per;
        const long long depth = o->depth[tj / n_per];
        const bool pp = ti < o->n_pp;
        const long long n = pp ? o->pp[ti] : o->tg[(ti - o->n_pp) % o->n_tg];
        const int n_par = pp ? 1 : (int)o->np[(ti - o->n_pp) / o->n_tg];
        if (n <= 0) continue;
        /* Before each test: the profile marks, the bandwidth (on a shared host
         * it moves between tests, and the share shown should be of what the
         * test had) and the steal marks. */
        memcpy(prof0, model_prof_ns(ctx), sizeof(prof0));
        lane0 = *model_lane_stats(ctx);
        memcpy(tier0, tier_stats(ctx->tier), sizeof(tier0));
        const tm_store_stats *sst = tier_store_stats(ctx->tier);
        const tm_store_stats store0 = sst ? *sst : (tm_store_stats){0};
        const double mem = probe ? cpu_read_bandwidth_gbs(ctx->pool, (size_t)1 << 30) : 0;
        /* the tier's bytes of the timed parts (a depth's prompt is not the test's) */
        uint64_t b0[3], b1[3], bytes[3] = {0, 0, 0};
        bench_steal_since(&steal0, &total0, &steal_ok);
        for (int r = 0; r < reps && !rc; r++) {
            /* a repetition is a request: the VRAM cache's updater runs between them */
            if (r && tier_cache_update(ctx->tier, TM_MOE_UPDATE_RATE) != TM_OK) rc = 1;
            model_context_reset(ctx);
            if (o->tr) trace_sequence_begin(o->tr);
            /* the depth's prompt, untimed (-d with -np 1 only: checked at parsing) */
            if (depth && model_decode(ctx, toks, depth, TM_MOE_PHASE_PROMPT, false) != TM_OK) {
                rc = 1;
                break;
            }
            int32_t ids[BENCH_MAX_PAR];
            memcpy(ids, toks, (size_t)n_par * sizeof(int32_t));
            bench_tier_bytes(ctx, b0);
            const uint64_t t0 = tm_time_ns();
            if (pp) {
                if (model_decode(ctx, toks + depth, n, TM_MOE_PHASE_PROMPT, false) != TM_OK) rc = 1;
            } else {
                for (long long i = 0; i < n && !rc; i++) {
                    if (n_par == 1)
                        rc = model_decode(ctx, ids, 1, TM_MOE_PHASE_DECODE, false) != TM_OK;
                    else
                        rc = bench_decode_rows(ctx, ids, n_par);
                    for (int q = 0; q < n_par; q++)
                        ids[q] = (int32_t)(tm_rng_u64(rng) % m->cfg.n_vocab);
                }
            }
            ts[r] = (tm_time_ns() - t0) * 1e-9;
            bench_tier_bytes(ctx, b1);
            for (int k = 0; k < 3; k++) bytes[k] += b1[k] - b0[k];
        }
        if (rc) break;
        bench_result *b = &res[(*n_res)++];
        *b = (bench_result){.test = pp ? "pp" : "tg",
                            .n = (int)n,
                            .n_par = n_par,
                            .depth = (int)depth,
                            .threads = cp.n_threads,
                            .n_gpu_layers = ctx->n_gpu_layers,
                            .n_batch = batch,
                            .n_cpu_moe = cp.n_cpu_moe,
                            .mem_gbs = mem,
                            .steal = bench_steal_since(&steal0, &total0, &steal_ok),
                            .cache_hit = bench_cache_hit(ctx, tier0)};
        bench_ahead(ctx, tier0, &b->ahead_share, &b->ahead_used);
        memcpy(b->backend, backend, sizeof(backend));
        bench_stats(ts, reps, (double)(n * n_par), &b->mean, &b->sd);
        double cpu_b, gpu_b, pcie_b = 0;
        if (pp) { /* every tensor once per batch, where it lives; experts in RAM the
                     GPU copied or read over PCIe (the fetch lane) not on the CPU */
            const double batches = (double)((n + batch - 1) / batch);
            const double fetched = (double)bytes[2] / reps;
            const double cpu_exp = exp_cpu * batches > fetched ? exp_cpu * batches - fetched : 0;
            cpu_b = ((double)dense_cpu * batches + cpu_exp) / n;
            gpu_b = (double)(dense_gpu + exp_gpu) * batches / n;
            pcie_b = fetched / n;
        } else { /* a token: the dense weights where they live, its experts where they ran */
            const double n_gen = (double)(n * n_par * reps);
            cpu_b = dense_cpu + bytes[1] / n_gen;
            gpu_b = dense_gpu + bytes[0] / n_gen;
            pcie_b = bytes[2] / n_gen;
        }
        b->cpu_gbs = cpu_b * b->mean / 1e9, b->gpu_gbs = gpu_b * b->mean / 1e9;
        b->pcie_gbs = pcie_b * b->mean / 1e9;
        b->bound = mem > 0 && cpu_b > 0 ? mem * 1e9 / cpu_b : 0;
        if (sst) { /* the SSD tier: faults and reads of the test */
            double wall = 0;
            for (int r = 0; r < reps; r++) wall += ts[r];
            fprintf(stderr, "%s%lld:", b->test, n);
            model_store_print(ctx, &store0, wall, stderr);
        }
        if (o->profile) {
            fprintf(stderr, "%s%lld x%d, %d threads: ", b->test, n, n_par, cp.n_threads);
            model_profile_print(ctx, prof0, &lane0, tier0, pp ? reps : (int)(n * reps), stderr);
        }
    }
    if (rc) fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
    free(toks);
    model_context_free(ctx);
    return rc;
}

/* A share (0..1) as JSON: null where the test did not measure it (below 0). */
static void bench_json_share(const char *key, double v) {
    if (v >= 0)
        printf(", \"%s\": %.4f", key, v);
    else
        printf(", \"%s\": null", key);
}

/* "pp512", "tg128", "tg128 x8" (8 sequences decoded together), "tg128 @ d8192" (after an
 * 8192-token prompt, as llama-bench names it). */
static void bench_test_name(const bench_result *b, char *out, size_t n) {
    int w = b->n_par > 1 ? snprintf(out, n, "%s%d x%d", b->test, b->n, b->n_par)
                         : snprintf(out, n, "%s%d", b->test, b->n);
    if (b->depth && w > 0 && (size_t)w < n) snprintf(out + w, n - (size_t)w, " @ d%d", b->depth);
}

static void bench_print(const bench_result *res, int n_res, const char *fmt, const char *model,
                        double size_gib, double params_b) {
    const bool md = !strcmp(fmt, "md"), csv = !strcmp(fmt, "csv"), json = !strcmp(fmt, "json");
    if (md) {
        printf("| model | size | params | backend | threads | test | t/s | CPU GB/s | mem read "
               "GB/s | of mem | CPU bound t/s | GPU GB/s | PCIe GB/s |\n");
        printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
               "| ---: |\n");
    } else if (csv) {
        printf("model,size_gib,params_b,backend,n_gpu_layers,n_cpu_moe,threads,n_parallel,test,ts_"
               "mean,"
               "ts_stddev,cpu_gbs,mem_gbs,cpu_bound_ts,gpu_gbs,pcie_gbs\n");
    } else if (json) {
        printf("[\n");
    }
    for (int i = 0; i < n_res; i++) {
        const bench_result *b = &res[i];
        char test[32];
        bench_test_name(b, test, sizeof(test));
        if (md)
            printf("| %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f ± %.2f | %.1f | %.1f | %.0f%% | "
                   "%.1f | %.1f | %.1f |\n",
                   model, size_gib, params_b, b->backend, b->threads, test, b->mean, b->sd,
                   b->cpu_gbs, b->mem_gbs, b->mem_gbs > 0 ? 100 * b->cpu_gbs / b->mem_gbs : 0.0,
                   b->bound, b->gpu_gbs, b->pcie_gbs);
        else if (csv)
            printf("\"%s\",%.3f,%.3f,\"%s\",%d,%d,%d,%d,%s,%.3f,%.3f,%.2f,%.2f,%.2f,%.2f,%.2f\n",
                   model, size_gib, params_b, b->backend, b->n_gpu_layers, b->n_cpu_moe, b->threads,
                   b->n_par, test, b->mean, b->sd, b->cpu_gbs, b->mem_gbs, b->bound, b->gpu_gbs,
                   b->pcie_gbs);
        else { /* json: an array; jsonl: an object a line */
            printf("%s{\"model\": \"%s\", \"size_gib\": %.3f, \"params_b\": %.3f, \"backend\": "
                   "\"%s\", \"n_gpu_layers\": %d, \"n_cpu_moe\": %d, \"n_batch\": %lld, "
                   "\"threads\": %d, \"n_parallel\": %d, \"n_depth\": %d, \"test\": "
                   "\"%s\", \"ts_mean\": %.3f, \"ts_stddev\": %.3f, \"cpu_gbs\": %.2f, "
                   "\"mem_gbs\": %.2f, \"cpu_bound_ts\": %.2f, \"gpu_gbs\": %.2f, \"pcie_gbs\": "
                   "%.2f",
                   json ? "  " : "", model, size_gib, params_b, b->backend, b->n_gpu_layers,
                   b->n_cpu_moe, b->n_batch, b->threads, b->n_par, b->depth, test, b->mean, b->sd,
                   b->cpu_gbs, b->mem_gbs, b->bound, b->gpu_gbs, b->pcie_gbs);
            /* what the table's readers get on stderr: the host's steal and the VRAM cache's
               and the copies ahead's shares of the routed slots */
            bench_json_share("host_steal", b->steal);
            bench_json_share("vram_cache_hit", b->cache_hit);
            bench_json_share("ahead_share", b->ahead_share);
            printf("}%s\n", json && i + 1 < n_res ? "," : "");
        }
    }
    if (json) printf("]\n");
}

static int bench_main(int argc, char **argv, cli_place *place) {
    const char *path = NULL, *fmt = "md";
    bench_opts o = {.pp = {512},
                    .tg = {128},
                    .np = {1},
                    .depth = {0},
                    .n_depth = 1,
                    .n_pp = 1,
                    .n_tg = 1,
                    .n_np = 1,
                    .reps = 3,
                    .batch = 0,
                    .membw = true};
    long long threads[BENCH_MAX_VALUES], ngl[BENCH_MAX_VALUES], ncmoe[BENCH_MAX_VALUES];
    int n_threads = 0, n_ngl = 0, n_ncmoe = 0;
    cli_trace ct = {0};
    if (cli_trace_from_env(&ct, "bench")) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-membw")) {
            o.membw = false;
            continue;
        }
        if (!strcmp(a, "--profile")) {
            o.profile = true;
            continue;
        }
        const int nt = cli_trace_parse(&ct, argc, argv, i);
        if (nt < 0) return 2;
        if (nt > 0) {
            i += nt - 1;
            continue;
        }
        /* -ngl and -ncmoe take lists here; the other placement flags one value */
        const bool is_ngl = !strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers"),
                   is_ncmoe = !strcmp(a, "-ncmoe") || !strcmp(a, "--n-cpu-moe");
        const int np = is_ngl || is_ncmoe ? 0 : cli_place_parse(place, "bench", argc, argv, i);
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
        int bad = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            path = val;
        else if (!strcmp(a, "-p"))
            bad = bench_parse_list(a, val, 0, 1 << 16, false, o.pp, &o.n_pp);
        else if (!strcmp(a, "-n"))
            bad = bench_parse_list(a, val, 0, 1 << 16, false, o.tg, &o.n_tg);
        else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth"))
            bad = bench_parse_list(a, val, 0, 1 << 20, false, o.depth, &o.n_depth);
        else if (!strcmp(a, "-np"))
            bad = bench_parse_list(a, val, 1, BENCH_MAX_PAR, false, o.np, &o.n_np);
        else if (!strcmp(a, "-t"))
            bad = bench_parse_list(a, val, 1, 1024, false, threads, &n_threads);
        else if (is_ngl)
            bad = bench_parse_list(a, val, 0, 0, true, ngl, &n_ngl);
        else if (is_ncmoe)
            bad = bench_parse_list(a, val, 0, 1 << 20, false, ncmoe, &n_ncmoe);
        else if (!strcmp(a, "-r"))
            bad = cli_parse_i64(a, val, 1, 1000, &o.reps);
        else if (!strcmp(a, "-b"))
            bad = cli_parse_i64(a, val, 1, 1 << 16, &o.batch);
        else if (!strcmp(a, "-o")) {
            if (strcmp(val, "md") && strcmp(val, "csv") && strcmp(val, "json") &&
                strcmp(val, "jsonl")) {
                fprintf(stderr, "tiermoe bench: -o: expected md, csv, json or jsonl, got '%s'\n",
                        val);
                return 2;
            }
            fmt = val;
        } else {
            fprintf(stderr, "tiermoe bench: unknown flag '%s'\n", a);
            bench_usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!path) {
        fprintf(stderr, "tiermoe bench: missing -m FILE\n");
        return 2;
    }
    for (int i = 0; i < o.n_depth; i++)
        for (int j = 0; j < o.n_np; j++)
            if (o.depth[i] && o.np[j] > 1) {
                fprintf(stderr,
                        "tiermoe bench: -d %lld with -np %lld: a depth runs one sequence "
                        "(give -np 1 or -d 0)\n",
                        o.depth[i], o.np[j]);
                return 2;
            }
    if (!n_threads) threads[n_threads++] = cpu_physical_cores();
    tm_model *m;
    if (model_load(path, &m) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        return 1;
    }
    const tm_trace_config tc = cli_trace_config(&ct);
    if (cli_trace_enabled(&ct) && model_trace_create(&tc, m, &o.tr) != TM_OK) {
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

    bench_result *res = calloc(BENCH_MAX_RESULTS, sizeof(*res));
    cli_files files = {0};
    int n_res = 0, rc = res ? 0 : 1;
    tm_rng rng;
    tm_rng_seed(&rng, 1234);
    /* every (-ngl, -ncmoe, -t): a context of its own */
    for (int gi = 0; gi < (n_ngl ? n_ngl : 1) && !rc; gi++)
        for (int ci = 0; ci < (n_ncmoe ? n_ncmoe : 1) && !rc; ci++) {
            if (n_ngl) place->ngl = (int)ngl[gi], place->ngl_given = true;
            if (n_ncmoe) place->o->n_cpu_moe = (int32_t)ncmoe[ci];
            cli_place_finish(place, "bench");
            tm_context_params cp; /* the KV cache in f16 (the default), as llama-bench's */
            if (cli_place_apply(place, "bench", m, &files, &cp)) {
                rc = 1;
                break;
            }
            for (int ti = 0; ti < n_threads && !rc; ti++) {
                cp.n_threads = (int)threads[ti];
                rc = bench_context(m, &cp, &o, &rng, res, &n_res);
            }
        }
    bench_print(res, n_res, fmt, model_name, m->weight_bytes / 1073741824.0, m->n_params / 1e9);
    fprintf(stderr, "cpu: %s\n", cpu_features_string());
    synth_routing_print(m->file, stderr);
    /* On a virtual machine the host may run others on our CPUs: say how much,
     * since it moves the numbers more than most changes do. */
    const char *sep = "host steal (CPU time the host took from this machine):";
    for (int i = 0; i < n_res; i++)
        if (res[i].steal >= 0) {
            char test[32];
            bench_test_name(&res[i], test, sizeof(test));
            fprintf(stderr, "%s %s %.1f%%", sep, test, 100 * res[i].steal);
            sep = ",";
        }
    if (strcmp(sep, ",") == 0) fputc('\n', stderr);
    sep = "VRAM cache, routed slots served from it:";
    for (int i = 0; i < n_res; i++)
        if (res[i].cache_hit >= 0) {
            char test[32];
            bench_test_name(&res[i], test, sizeof(test));
            fprintf(stderr, "%s %s %.1f%%", sep, test, 100 * res[i].cache_hit);
            sep = ",";
        }
    if (strcmp(sep, ",") == 0) fputc('\n', stderr);
    sep = "copies ahead (--moe-ahead), routed slots in RAM layers computed from them:";
    for (int i = 0; i < n_res; i++)
        if (res[i].ahead_share >= 0) {
            char test[32];
            bench_test_name(&res[i], test, sizeof(test));
            fprintf(stderr, "%s %s %.1f%% (%.0f%% of the copied experts routed)", sep, test,
                    100 * res[i].ahead_share, 100 * res[i].ahead_used);
            sep = ",";
        }
    if (strcmp(sep, ",") == 0) fputc('\n', stderr);
    if (o.tr && trace_finish(o.tr) != TM_OK) {
        fprintf(stderr, "tiermoe bench: %s\n", tm_error_message());
        rc = 1;
    }
    trace_free(o.tr);
    cli_files_free(&files);
    free(res);
    model_free(m);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    tm_context_opts co;
    tm_context_opts_init(&co);
    cli_place place = {.o = &co};
    const int rc = bench_main(argc, argv, &place);
    cli_place_free(&place);
    return rc;
}
