/* tiermoe plan: learn files (merged) + a VRAM budget -> a plan file of the
 * experts to cache per layer (src/tier/plan.h, docs/plan-format.md). Expert
 * bytes and the model's shape come from the GGUF (--model) or are given
 * (--expert-bytes); layers whose experts are all in VRAM get no slots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_internal.h"
#include "model/layout.h"
#include "model/model.h"
#include "tier/plan.h"
#include "trace/trace.h"

static void plan_usage(FILE *out) {
    fprintf(out,
            "usage: tiermoe plan LEARN.json [LEARN2.json ...] --budget MIB -o plan.json [options]\n"
            "  --budget MIB           VRAM for cached experts, in MiB\n"
            "  -o, --output FILE      the plan to write (JSON, docs/plan-format.md)\n"
            "  -m, --model FILE       GGUF: expert bytes per layer and the shape the learn files\n"
            "                         must have\n"
            "  --expert-bytes N       without a model: bytes of one expert (gate+up+down), every "
            "layer\n"
            "  --weighting MODE       flat (default), pressure, smooth_pressure, time, balanced\n"
            "  --layer-curve X        exponent on the mode's layer priority, 0..%g (default %g)\n"
            "  --layers-in-vram N     the first N layers' experts are in VRAM (-ngl N): no slots\n"
            "  --n-cpu-moe N          only the first N layers' experts are in RAM: slots for them "
            "only\n"
            "several learn files are summed (same model shape and window).\n",
            TM_PLAN_CURVE_MAX, TM_PLAN_CURVE_DEFAULT);
}

typedef struct plan_args {
    const char *out, *model;
    double budget_mib, curve;
    long long expert_bytes, in_vram, n_cpu_moe;
    tm_plan_weighting mode;
    char **learn;
    int n_learn;
} plan_args;

static int plan_parse(int argc, char **argv, plan_args *a) {
    a->curve = TM_PLAN_CURVE_DEFAULT, a->budget_mib = -1, a->in_vram = -1, a->n_cpu_moe = -1;
    a->learn = calloc((size_t)argc, sizeof(char *));
    if (!a->learn) return 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            plan_usage(stdout);
            return -1;
        }
        if (f[0] != '-') {
            a->learn[a->n_learn++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe plan: %s needs a value (or is unknown)\n", f);
            plan_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(f, "-o") || !strcmp(f, "--output"))
            a->out = v;
        else if (!strcmp(f, "-m") || !strcmp(f, "--model"))
            a->model = v;
        else if (!strcmp(f, "--budget")) {
            if (cli_parse_f64(f, v, 0, 1 << 30, &a->budget_mib)) return 2;
        } else if (!strcmp(f, "--expert-bytes")) {
            if (cli_parse_i64(f, v, 1, 1ll << 40, &a->expert_bytes)) return 2;
        } else if (!strcmp(f, "--layer-curve")) {
            if (cli_parse_f64(f, v, 0, TM_PLAN_CURVE_MAX, &a->curve)) return 2;
        } else if (!strcmp(f, "--layers-in-vram")) {
            if (cli_parse_i64(f, v, 0, TM_TRACE_MAX_LAYER, &a->in_vram)) return 2;
        } else if (!strcmp(f, "--n-cpu-moe")) {
            if (cli_parse_i64(f, v, 0, TM_TRACE_MAX_LAYER, &a->n_cpu_moe)) return 2;
        } else if (!strcmp(f, "--weighting")) {
            if (plan_weighting_parse(v, &a->mode) != TM_OK) {
                fprintf(stderr, "tiermoe plan: --weighting: %s\n", tm_error_message());
                return 2;
            }
        } else {
            fprintf(stderr, "tiermoe plan: unknown flag '%s'\n", f);
            plan_usage(stderr);
            return 2;
        }
    }
    const char *missing = !a->n_learn                     ? "a learn file"
                          : a->budget_mib < 0             ? "--budget MIB"
                          : !a->out                       ? "-o FILE"
                          : !a->model && !a->expert_bytes ? "--model FILE or --expert-bytes N"
                                                          : NULL;
    if (missing) {
        fprintf(stderr, "tiermoe plan: missing %s\n", missing);
        plan_usage(stderr);
        return 2;
    }
    if (a->model && a->expert_bytes) {
        fprintf(stderr, "tiermoe plan: --model and --expert-bytes: give one\n");
        return 2;
    }
    if (a->in_vram >= 0 && a->n_cpu_moe >= 0) {
        fprintf(stderr, "tiermoe plan: --layers-in-vram and --n-cpu-moe: give one\n");
        return 2;
    }
    return 0;
}

/* The model's shape and expert bytes per layer (0: the layer has no experts). */
static int plan_model_bytes(const char *path, tm_trace_shape *shape, uint64_t **bytes) {
    tm_model *m;
    if (model_load(path, &m) != TM_OK) {
        fprintf(stderr, "tiermoe plan: %s\n", tm_error_message());
        return 1;
    }
    model_trace_shape(m, shape);
    tm_model_layout lay;
    int rc = 1;
    if (model_layout_scan(m->file, &lay) != TM_OK) {
        fprintf(stderr, "tiermoe plan: %s\n", tm_error_message());
        goto out;
    }
    if (lay.n_expert != shape->n_expert || lay.n_layer > shape->n_layer) {
        fprintf(stderr,
                "tiermoe plan: %s: its expert tensors (%u experts, %u layers) disagree with "
                "its keys (%u, %u)\n",
                path, lay.n_expert, lay.n_layer, shape->n_expert, shape->n_layer);
    } else if ((*bytes = calloc(shape->n_layer, sizeof(uint64_t)))) {
        for (uint32_t l = 0; l < lay.n_layer; l++)
            (*bytes)[l] = lay.n_expert ? lay.layer_expert_bytes[l] / lay.n_expert : 0;
        rc = 0;
    }
    model_layout_free(&lay);
out:
    model_free(m);
    return rc;
}

static int plan_learn(const plan_args *a, const tm_trace_shape *expect, tm_trace_stats *acc) {
    if (trace_stats_read_json(a->learn[0], expect, acc) != TM_OK) {
        fprintf(stderr, "tiermoe plan: %s\n", tm_error_message());
        return 1;
    }
    for (int i = 1; i < a->n_learn; i++) {
        tm_trace_stats s;
        if (trace_stats_read_json(a->learn[i], expect, &s) != TM_OK ||
            trace_stats_merge(acc, &s, a->learn[i]) != TM_OK) {
            fprintf(stderr, "tiermoe plan: %s\n", tm_error_message());
            trace_stats_free(&s);
            trace_stats_free(acc);
            return 1;
        }
        trace_stats_free(&s);
    }
    return 0;
}

static void plan_summary(const tm_plan *plan, const tm_trace_stats *obs, const bool *cacheable,
                         FILE *out) {
    const uint32_t L = plan->shape.n_layer;
    int32_t lo = INT32_MAX, hi = 0;
    uint32_t n_cache = 0, n_empty = 0;
    int64_t total = 0;
    uint64_t routed = 0;
    for (uint32_t l = 0; l < L; l++) {
        if (!cacheable[l]) continue;
        const int32_t n = plan->n_slots[l];
        n_cache++, n_empty += n == 0, total += n;
        lo = n < lo ? n : lo, hi = n > hi ? n : hi;
        routed += obs->layers[l].expert_hits_total;
    }
    const double mib = 1.0 / (1 << 20);
    fprintf(out, "plan: %s (layer curve %g), budget %.1f MiB, used %.1f MiB: %lld experts\n",
            plan_weighting_name(plan->mode), plan->layer_curve, plan->budget_bytes * mib,
            plan->used_bytes * mib, (long long)total);
    if (!n_cache) {
        fprintf(out, "  no layer can be cached (every layer's experts are in VRAM or absent)\n");
        return;
    }
    fprintf(out,
            "  experts per cacheable layer: min %d, mean %.1f, max %d (%u of %u layers cacheable, "
            "%u without slots)\n",
            lo, (double)total / n_cache, hi, n_cache, L, n_empty);
    fprintf(out, "  expected hit rate on the learn data: %.1f%% of %llu routed slots\n",
            100 * plan_hit_rate(plan, obs, cacheable), (unsigned long long)routed);
}

int cmd_plan(int argc, char **argv) {
    plan_args a = {0};
    int rc = plan_parse(argc, argv, &a);
    if (rc) {
        free(a.learn);
        return rc < 0 ? 0 : rc;
    }
    tm_trace_shape shape;
    uint64_t *bytes = NULL;
    bool *cacheable = NULL;
    tm_trace_stats obs = {0};
    tm_plan plan = {0};
    rc = 1;
    if (a.model && plan_model_bytes(a.model, &shape, &bytes)) goto out;
    if (plan_learn(&a, a.model ? &shape : NULL, &obs)) goto out;
    const uint32_t L = obs.shape.n_layer;
    if (!bytes && !(bytes = calloc(L, sizeof(uint64_t)))) goto out;
    if (!(cacheable = calloc(L, sizeof(bool)))) goto out;
    for (uint32_t l = 0; l < L; l++) {
        if (!a.model) bytes[l] = (uint64_t)a.expert_bytes;
        cacheable[l] = bytes[l] > 0 && (a.in_vram < 0 || l >= a.in_vram) &&
                       (a.n_cpu_moe < 0 || l < a.n_cpu_moe);
    }
    const tm_plan_params pp = {.mode = a.mode,
                               .layer_curve = a.curve,
                               .budget_bytes = (uint64_t)(a.budget_mib * (1 << 20)),
                               .expert_bytes = bytes,
                               .cacheable = cacheable};
    if (plan_make(&obs, &pp, &plan) != TM_OK || plan_write_json(&plan, a.out) != TM_OK) {
        fprintf(stderr, "tiermoe plan: %s\n", tm_error_message());
        goto out;
    }
    plan_summary(&plan, &obs, cacheable, stdout);
    printf("wrote %s\n", a.out);
    rc = 0;
out:
    plan_free(&plan);
    trace_stats_free(&obs);
    free(bytes), free(cacheable), free(a.learn);
    return rc;
}
