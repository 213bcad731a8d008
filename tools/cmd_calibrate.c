/* tiermoe calibrate: measure this machine's costs for the tier's lane
 * decisions on a model's experts (src/tier/calib.h, docs/calibrate.md),
 * print them as they are measured, and save the profile where runs look for
 * it ($XDG_CACHE_HOME/tiermoe/, else ~/.cache/tiermoe/; or --profile-out).
 *
 * The experts are found by llama.cpp's tensor names
 * (calib_experts_from_gguf), so any MoE architecture the loader takes works;
 * the experts a token routes to come from the model's hyper-parameters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_internal.h"
#include "core/timing.h"
#include "model/model.h"
#include "tier/calib.h"

static void calibrate_usage(FILE *out) {
    fprintf(out,
            "usage: tiermoe calibrate -m FILE [options]\n"
            "       tiermoe calibrate --show PROFILE.json\n"
            "Measures what the tier decides by on this machine, with the model's expert shape\n"
            "and type: the CPU lane's and the GPU's time per expert by tokens per expert, copy\n"
            "rates, the GPU reading RAM over PCIe alone and beside the CPU lane, the hand-off\n"
            "round trip (docs/calibrate.md). Prints each row as it is measured and saves the\n"
            "profile as JSON.\n"
            "  -m, --model FILE      GGUF model (its experts are measured)\n"
            "  -t, --threads N       CPU lane threads (default: physical cores; a profile is\n"
            "                        used only by runs with the same count)\n"
            "  --quick               a short measurement (what a run does without a profile)\n"
            "  --cpu-only            leave the GPU out (also what happens without one)\n"
            "  --max-tokens N        largest tokens-per-expert point (default 512)\n"
            "  --profile-out FILE    where to write the profile (default: the cache directory,\n"
            "                        $XDG_CACHE_HOME/tiermoe/ or ~/.cache/tiermoe/, a name from\n"
            "                        the CPU, the GPU, the threads and the expert shape)\n"
            "  --show FILE           print a saved profile's table (checked as runs read it)\n"
            "  --drive               only the drive read test (the SSD tier, --ram-cache): random\n"
            "                        O_DIRECT reads over the -m file at queue depths 1 to 64,\n"
            "                        MB/s and reads/s (--drive-seconds S a point, default 2)\n");
}

typedef struct calibrate_args {
    const char *model, *profile_out, *show;
    int threads;
    bool quick, cpu_only;
    int32_t max_tokens;
    bool drive;
    double drive_seconds;
} calibrate_args;

/* 0, or the exit code of a usage error (printed). */
static int calibrate_parse(int argc, char **argv, calibrate_args *a, bool *help) {
    *help = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        long long v;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            *help = true;
            return 0;
        }
        if (!strcmp(f, "--quick")) {
            a->quick = true;
            continue;
        }
        if (!strcmp(f, "--drive")) {
            a->drive = true;
            continue;
        }
        if (!strcmp(f, "--cpu-only")) {
            a->cpu_only = true;
            continue;
        }
        const bool known = !strcmp(f, "-m") || !strcmp(f, "--model") || !strcmp(f, "-t") ||
                           !strcmp(f, "--threads") || !strcmp(f, "--max-tokens") ||
                           !strcmp(f, "--profile-out") || !strcmp(f, "--show") ||
                           !strcmp(f, "--drive-seconds");
        if (!known) {
            fprintf(stderr, "tiermoe calibrate: unknown flag '%s'\n", f);
            calibrate_usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe calibrate: %s needs a value\n", f);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) {
            a->model = val;
        } else if (!strcmp(f, "--profile-out")) {
            a->profile_out = val;
        } else if (!strcmp(f, "--show")) {
            a->show = val;
        } else if (!strcmp(f, "--drive-seconds")) {
            if (cli_parse_f64(f, val, 0.01, 600, &a->drive_seconds)) return 2;
        } else if (!strcmp(f, "--max-tokens")) {
            if (cli_parse_i64(f, val, 1, 1 << 16, &v)) return 2;
            a->max_tokens = (int32_t)v;
        } else {
            if (cli_parse_i64(f, val, 1, 1024, &v)) return 2;
            a->threads = (int)v;
        }
    }
    if (a->show && a->model) {
        fprintf(stderr, "tiermoe calibrate: --show takes a profile, not -m\n");
        return 2;
    }
    if (!a->model && !a->show) {
        fprintf(stderr, "tiermoe calibrate: missing -m FILE\n");
        calibrate_usage(stderr);
        return 2;
    }
    return 0;
}

/* The GPU to measure, or NULL (the table's head says none; a line here says
 * why when there is one that cannot be used). */
static tm_cuda_device *calibrate_gpu(bool cpu_only) {
    int n = 0;
    tm_cuda_device *dev = NULL;
    if (cpu_only || cuda_device_count(&n) != TM_OK || n < 1) return NULL;
    if (cuda_device_open(0, &dev) != TM_OK) {
        printf("note: the GPU cannot be used (%s)\n", tm_error_message());
        return NULL;
    }
    return dev;
}

/* The drive read test: a table of MB/s and reads/s by queue depth, for
 * 4 KiB reads (what a drive's IOPS are quoted for) and 1 MiB reads (what the
 * SSD tier issues: an expert's slices in reads of up to 1 MiB). */
static int calibrate_drive(const calibrate_args *a) {
    static const int depths[] = {1, 4, 16, 32, 64};
    static const size_t blocks[] = {4096, (size_t)1 << 20};
    const double secs = a->drive_seconds > 0 ? a->drive_seconds : 2.0;
    printf("tiermoe calibrate --drive: %s, random reads, %.1f s a point\n", a->model, secs);
    printf("| read size | queue depth | MB/s | reads/s | O_DIRECT | io_uring |\n"
           "| --- | --- | --- | --- | --- | --- |\n");
    double best = 0;
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 5; d++) {
            tm_calib_drive r;
            if (calib_drive_measure(a->model, depths[d], blocks[b], secs, &r) != TM_OK) {
                fprintf(stderr, "tiermoe calibrate: %s\n", tm_error_message());
                return 1;
            }
            if (r.mbs > best) best = r.mbs;
            printf("| %zu KiB | %d | %.0f | %.0f | %s | %s |\n", blocks[b] >> 10, depths[d], r.mbs,
                   r.iops, r.direct ? "yes" : "no", r.uring ? "yes" : "no");
            fflush(stdout);
        }
    printf("drive: %.0f MB/s at best\n", best);
    return 0;
}

int cmd_calibrate(int argc, char **argv) {
    calibrate_args a = {0};
    bool help;
    int rc = calibrate_parse(argc, argv, &a, &help);
    if (rc || help) {
        if (help) calibrate_usage(stdout);
        return rc;
    }
    if (a.drive) return calibrate_drive(&a);
    if (a.show) {
        tm_calib c;
        if (calib_read_json(a.show, NULL, &c) != TM_OK) {
            fprintf(stderr, "tiermoe calibrate: %s\n", tm_error_message());
            return 1;
        }
        calib_print(&c, stdout);
        return 0;
    }
    tm_model *m = NULL;
    tm_moe_experts *layers = NULL;
    uint32_t n_layers = 0, n_expert = 0;
    tm_pool *pool = NULL;
    tm_cuda_device *gpu = NULL;
    tm_calib c, back;
    char path[4096];
    const uint64_t t0 = tm_time_ns();
    tm_status st = model_load(a.model, &m);
    if (st == TM_OK) st = calib_experts_from_gguf(m->file, &layers, &n_layers, &n_expert);
    if (st == TM_OK) st = cpu_pool_create(a.threads > 0 ? a.threads : cpu_physical_cores(), &pool);
    if (st == TM_OK) {
        printf("tiermoe calibrate: %s (%u layers of %u experts, %u a token)\n", a.model, n_layers,
               n_expert, m->cfg.n_expert_used);
        gpu = calibrate_gpu(a.cpu_only);
        const tm_calib_source src = {.pool = pool,
                                     .gpu = gpu,
                                     .layers = layers,
                                     .n_layer = n_layers,
                                     .n_expert = n_expert,
                                     .n_used = m->cfg.n_expert_used};
        const tm_calib_opts o = {a.quick, a.max_tokens, stdout};
        st = calib_measure(&src, &o, &c);
    }
    if (st == TM_OK) {
        if (a.profile_out)
            snprintf(path, sizeof(path), "%s", a.profile_out);
        else
            st = calib_default_path(&c.key, path, sizeof(path));
    }
    if (st == TM_OK) st = calib_write_json(&c, path);
    if (st == TM_OK) st = calib_read_json(path, &c.key, &back); /* what runs will read */
    if (st == TM_OK) {
        const int32_t share = calib_pcie_share_q8(&c), k = c.experts_per_call;
        if (c.key.gpu[0])
            printf("decode: the PCIe lane takes %d/256 of a token's cold slots (%d of %d)\n", share,
                   share ? tm_cuda_mapped_count(k, k, share) : 0, k);
        printf("profile: %s (%.1f s in all)\n", path, (double)(tm_time_ns() - t0) * 1e-9);
    } else {
        fprintf(stderr, "tiermoe calibrate: %s\n", tm_error_message());
    }
    cuda_device_close(gpu);
    cpu_pool_free(pool);
    free(layers);
    model_free(m);
    return st == TM_OK ? 0 : 1;
}
