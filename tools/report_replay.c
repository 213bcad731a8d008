/* tiermoe report --replay LOG: replay a routing log (tiermoe trace
 * --routing-log) against the cache policies at several residencies and print
 * their hit rates on the held-out sequences and their uploads per token
 * (src/tier/cache_replay.h). Its own file: report's other output is not
 * touched by it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_internal.h"
#include "tier/cache_replay.h"

#define REPLAY_MAX_RES 16

static void replay_usage(FILE *out) {
    fprintf(out,
            "usage: tiermoe report --replay LOG [options]\n"
            "  --train-fraction F   first share of the sequences trains the plan, the rest is\n"
            "                       replayed (default 0.5)\n"
            "  --lag N              steps between an admission and its first use: the engine\n"
            "                       uploads during the next step (default 1)\n"
            "  --max-admit N        lru/lfu/adaptive: uploads per layer per step (default 0: no "
            "cap)\n"
            "  --residency LIST     shares of each layer's experts resident (default "
            "0.1,0.25,0.4,0.6)\n"
            "  --weighting MODE     the plan's mode (default flat)\n"
            "  --update-rate R      update: share of slots exchanged between sequences (default "
            "0.25)\n"
            "  --update-half-life T update: tokens until a use counts half (default 4096)\n"
            "  --half-life T        adaptive: tokens until a use counts half (default 0: auto,\n"
            "                       %g x slots / k: %g turnovers of the layer's cache)\n"
            "  --hysteresis H       adaptive/update: a newcomer needs (1 + H) x the resident's "
            "score (default %g)\n",
            TM_CACHE_TURNOVERS, TM_CACHE_TURNOVERS, TM_CACHE_HYSTERESIS_DEFAULT);
}

static int parse_list(const char *s, double *v, int *n) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == REPLAY_MAX_RES) {
            fprintf(stderr, "tiermoe report: --residency: at most %d values\n", REPLAY_MAX_RES);
            return 2;
        }
        if (cli_parse_f64("--residency", t, 1e-9, 1, &v[(*n)++])) return 2;
    }
    if (!*n) {
        fprintf(stderr, "tiermoe report: --residency: expected shares like 0.1,0.4\n");
        return 2;
    }
    return 0;
}

static int replay_parse(int argc, char **argv, const char **log, tm_replay_params *p, double *res,
                        int *n_res) {
    long long v;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            replay_usage(stdout);
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe report: %s needs a value (or is unknown with --replay)\n", f);
            replay_usage(stderr);
            return 2;
        }
        const char *a = argv[++i];
        if (!strcmp(f, "--replay"))
            *log = a;
        else if (!strcmp(f, "--train-fraction")) {
            if (cli_parse_f64(f, a, 0, 0.999999, &p->train_fraction)) return 2;
        } else if (!strcmp(f, "--lag")) {
            if (cli_parse_i64(f, a, 0, 1 << 20, &v)) return 2;
            p->lag = (int32_t)v;
        } else if (!strcmp(f, "--max-admit")) {
            if (cli_parse_i64(f, a, 0, 1 << 20, &v)) return 2;
            p->max_admit = p->knobs.max_admit = (int32_t)v;
        } else if (!strcmp(f, "--residency")) {
            if (parse_list(a, res, n_res)) return 2;
        } else if (!strcmp(f, "--weighting")) {
            if (plan_weighting_parse(a, &p->weighting) != TM_OK) {
                fprintf(stderr, "tiermoe report: --weighting: %s\n", tm_error_message());
                return 2;
            }
        } else if (!strcmp(f, "--update-rate")) {
            if (cli_parse_f64(f, a, 0, 1, &p->update_rate)) return 2;
        } else if (!strcmp(f, "--update-half-life")) {
            if (cli_parse_f64(f, a, 1e-3, 1e12, &p->update_half_life)) return 2;
        } else if (!strcmp(f, "--half-life")) {
            if (cli_parse_f64(f, a, 0, 1e12, &p->knobs.half_life)) return 2;
        } else if (!strcmp(f, "--hysteresis")) {
            if (cli_parse_f64(f, a, 0, 1e6, &p->knobs.hysteresis)) return 2;
        } else {
            fprintf(stderr, "tiermoe report: '%s' does not go with --replay\n", f);
            replay_usage(stderr);
            return 2;
        }
    }
    return 0;
}

static void replay_print(const tm_trace_log *log, const char *path, const tm_replay_params *p,
                         const tm_replay_result *r, int n, FILE *out) {
    const tm_trace_shape *sh = &log->shape;
    fprintf(out,
            "replay %s: %s, %u layers x %u experts (top-%u), %u sequences: %u train the plan (%s), "
            "%u held out with %llu decode tokens\n",
            path, sh->arch, sh->n_layer, sh->n_expert, sh->n_expert_used, log->n_seq, r[0].n_train,
            plan_weighting_name(p->weighting), r[0].n_eval, (unsigned long long)r[0].decode_tokens);
    char cap[32] = "no cap";
    if (p->max_admit) snprintf(cap, sizeof(cap), "at most %d", p->max_admit);
    char hl[48] = "auto";
    if (p->knobs.half_life > 0) snprintf(hl, sizeof(hl), "%g tokens", p->knobs.half_life);
    fprintf(out,
            "lag %d step%s; uploads per layer per step: %s; adaptive: half-life %s, hysteresis "
            "%g; update: up to %g of the slots between sequences, half-life %g tokens\n",
            p->lag, p->lag == 1 ? "" : "s", cap, hl, p->knobs.hysteresis, p->update_rate,
            p->update_half_life);
    fprintf(out,
            "\nhit rate on the held-out decode tokens (share of routed slots served from "
            "VRAM)\n%-9s %6s",
            "resident", "slots");
    for (int q = 0; q < TM_REPLAY_COUNT; q++) fprintf(out, " %9s", tm_replay_policy_names[q]);
    fprintf(out, "\n");
    for (int i = 0; i < n; i++) {
        fprintf(out, "%7.0f%%  %6lld", 100 * r[i].residency, (long long)r[i].slots);
        for (int q = 0; q < TM_REPLAY_COUNT; q++)
            fprintf(out, " %8.1f%%", r[i].routed ? 100.0 * r[i].hits[q] / r[i].routed : 0.0);
        fprintf(out, "\n");
    }
    fprintf(out,
            "\nuploads per decode token, all %u layers (in parentheses: uploads at prompt calls, "
            "update: between sequences, per held-out sequence)\n%-9s",
            sh->n_layer, "resident");
    for (int q = TM_REPLAY_UPDATE; q < TM_REPLAY_COUNT; q++)
        fprintf(out, " %18s", tm_replay_policy_names[q]);
    fprintf(out, "\n");
    for (int i = 0; i < n; i++) {
        fprintf(out, "%7.0f%%  ", 100 * r[i].residency);
        for (int q = TM_REPLAY_UPDATE; q < TM_REPLAY_COUNT; q++) {
            char cell[40];
            snprintf(cell, sizeof(cell), "%.2f (%.1f)",
                     r[i].decode_tokens ? (double)r[i].uploads[q] / r[i].decode_tokens : 0.0,
                     r[i].n_eval ? (double)r[i].prompt_uploads[q] / r[i].n_eval : 0.0);
            fprintf(out, " %18s", cell);
        }
        fprintf(out, "\n");
    }
}

int report_replay(int argc, char **argv) {
    const char *path = NULL;
    tm_replay_params p = cache_replay_params_default();
    double res[REPLAY_MAX_RES] = {0.10, 0.25, 0.40, 0.60};
    int n_res = 4;
    int rc = replay_parse(argc, argv, &path, &p, res, &n_res);
    if (rc) return rc < 0 ? 0 : rc;
    tm_trace_log log;
    if (trace_log_read(path, &log) != TM_OK) {
        fprintf(stderr, "tiermoe report: %s\n", tm_error_message());
        return 1;
    }
    tm_replay_result r[REPLAY_MAX_RES];
    for (int i = 0; i < n_res; i++)
        if (cache_replay(&log, &p, res[i], &r[i]) != TM_OK) {
            fprintf(stderr, "tiermoe report: --replay %s: %s\n", path, tm_error_message());
            trace_log_free(&log);
            return 1;
        }
    replay_print(&log, path, &p, r, n_res, stdout);
    trace_log_free(&log);
    return 0;
}
