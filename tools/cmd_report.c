/* tiermoe report: read a learn/perf file and show, per layer, the top
 * experts, the skew (normalised entropy, share of hits covered by the top
 * 10/25/50% of experts), the working set and token-to-token reuse; the
 * routing statistics next to Qwen3-30B-A3B's published ones (labelled with
 * the synthetic routing profile when the model was made by mkmodel); optionally
 * an SVG heatmap (layers x experts, colour = the expert's share of its
 * layer's hits) and the CSV export. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_internal.h"
#include "model/synth.h"
#include "trace/trace.h"

static void report_usage(FILE *out) {
    fprintf(out,
            "usage: tiermoe report learn.json [--svg heatmap.svg] [--csv out.csv] [--summary]\n"
            "  --svg FILE   heatmap, layers x experts, colour = share of the layer's routed slots\n"
            "  --csv FILE   one row per layer and expert: layer,expert,hits,hot,cold,share\n"
            "  --summary    only the one-line summary, not the per-layer table\n"
            "       tiermoe report --replay LOG [options]: cache policies on a routing log\n"
            "               (tiermoe report --replay - --help for the options)\n");
}

/* White (0) through orange to dark red (1). */
static void heat_colour(double x, char *out, size_t n) {
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    unsigned r, g, b; /* each 0..255: the colour is exactly 7 characters */
    if (x < 0.5) {
        const double u = x / 0.5;
        r = 255, g = (unsigned)(255 - u * (255 - 140)), b = (unsigned)(255 - u * 255);
    } else {
        const double u = (x - 0.5) / 0.5;
        r = (unsigned)(255 - u * (255 - 120)), g = (unsigned)(140 - u * 140), b = 0;
    }
    snprintf(out, n, "#%02x%02x%02x", r & 0xffu, g & 0xffu, b & 0xffu);
}

static int write_svg(const tm_trace_stats *s, const char *path) {
    const uint32_t L = s->shape.n_layer, E = s->shape.n_expert;
    const double cw = E >= 512 ? 2 : 1024.0 / E < 16 ? 1024.0 / E : 16;
    const double ch = L >= 100 ? 6 : 600.0 / L < 24 ? 600.0 / L : 24;
    const double x0 = 60, y0 = 50, w = cw * E, h = ch * L;
    double max_share = 0;
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t e = 0; e < E; e++) {
            const tm_trace_layer *ly = &s->layers[l];
            const double sh =
                ly->expert_hits_total ? (double)ly->experts[e] / ly->expert_hits_total : 0;
            if (sh > max_share) max_share = sh;
        }
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return 2;
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "tiermoe report: %s: cannot create: %s\n", tmp, strerror(errno));
        return 1;
    }
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            x0 + w + 120, y0 + h + 50);
    fprintf(f,
            "<text x=\"%.0f\" y=\"20\">%s: share of each layer's %u-of-%u routed slots, %llu "
            "tokens (darkest = "
            "%.2f%%)</text>\n",
            x0, s->shape.arch, s->shape.n_expert_used, E, (unsigned long long)s->tokens,
            100 * max_share);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">expert 0..%u</text>\n", x0, y0 + h + 20, E - 1);
    fprintf(f, "<text x=\"10\" y=\"%.0f\" transform=\"rotate(-90 10 %.0f)\">layer</text>\n",
            y0 + h / 2, y0 + h / 2);
    for (uint32_t l = 0; l < L; l++) {
        const tm_trace_layer *ly = &s->layers[l];
        if (l % (L > 24 ? 8 : 1) == 0)
            fprintf(f,
                    "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"10\">%u</text>\n",
                    x0 - 4, y0 + (l + 0.8) * ch, l);
        for (uint32_t e = 0; e < E; e++) {
            const double sh =
                ly->expert_hits_total ? (double)ly->experts[e] / ly->expert_hits_total : 0;
            char col[8];
            heat_colour(max_share > 0 ? sh / max_share : 0, col, sizeof(col));
            fprintf(f,
                    "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                    "fill=\"%s\"><title>layer %u expert "
                    "%u: %llu hits, %.3f%%</title></rect>\n",
                    x0 + e * cw, y0 + l * ch, cw, ch, col, l, e, (unsigned long long)ly->experts[e],
                    100 * sh);
        }
    }
    /* legend */
    for (int i = 0; i < 10; i++) {
        char col[8];
        heat_colour(i / 9.0, col, sizeof(col));
        fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"16\" height=\"%.1f\" fill=\"%s\"/>\n",
                x0 + w + 20, y0 + (9 - i) * h / 10, h / 10, col);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">%.2f%%</text>\n", x0 + w + 40, y0 + 10,
            100 * max_share);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">0%%</text>\n</svg>\n", x0 + w + 40,
            y0 + h);
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        fprintf(stderr, "tiermoe report: %s: write failed: %s\n", path, strerror(errno));
        remove(tmp);
        return 1;
    }
    return 0;
}

/* Mean, min and max over layers of the four routing statistics the mkmodel
 * profiles are calibrated to, next to Qwen3-30B-A3B's (synth_qwen3_targets). */
static void report_routing(const tm_trace_stats *s, FILE *out) {
    const tm_routing_targets *t = &synth_qwen3_targets;
    const uint32_t n_layer = s->shape.n_layer, k = s->shape.n_expert_used;
    double v[4][3]; /* statistic: mean, min, max */
    bool have[4] = {true, true, false, false};
    for (int i = 0; i < 4; i++) v[i][0] = 0, v[i][1] = 1e300, v[i][2] = -1e300;
    for (uint32_t l = 0; l < n_layer; l++) {
        const tm_trace_layer *L = &s->layers[l];
        tm_trace_skew sk;
        trace_layer_skew(s, l, &sk);
        double x[4] = {sk.top[2], sk.top1, 0, 0};
        if (L->reuse_pairs) x[2] = (double)L->reuse_shared / ((double)L->reuse_pairs * k);
        if (L->reuse_win_tokens)
            x[3] = (double)L->reuse_win_shared / ((double)L->reuse_win_tokens * k);
        have[2] |= L->reuse_pairs > 0, have[3] |= L->reuse_win_tokens > 0;
        for (int i = 0; i < 4; i++) {
            v[i][0] += x[i] / n_layer;
            if (x[i] < v[i][1]) v[i][1] = x[i];
            if (x[i] > v[i][2]) v[i][2] = x[i];
        }
    }
    char within[64];
    const uint32_t win = s->reuse_window ? s->reuse_window : TM_TRACE_REUSE_WINDOW;
    snprintf(within, sizeof(within), "experts used within the last %u tokens", win);
    const struct {
        const char *name;
        double target;
    } rows[4] = {{"slots on the top 50% of experts", t->top_half},
                 {"top expert's share of slots", t->top1},
                 {"experts shared with the previous token", t->reuse_prev},
                 {within, win == t->win ? t->reuse_win : -1}};
    fprintf(out, "routing statistics%s%s:\n", s->routing[0] ? ", synthetic routing: " : "",
            s->routing);
    fprintf(out, "  %-42s %-28s %s\n", "statistic", "measured mean (min..max)", "Qwen3-30B-A3B");
    for (int i = 0; i < 4; i++) {
        char m[64], tg[16] = "-";
        if (have[i])
            snprintf(m, sizeof(m), "%5.1f%% (%.1f..%.1f)", 100 * v[i][0], 100 * v[i][1],
                     100 * v[i][2]);
        else
            snprintf(m, sizeof(m), "n/a (%s)",
                     i == 2             ? "no sequence of 2 tokens"
                     : !s->reuse_window ? "not in this file"
                                        : "no sequence longer than the window");
        if (rows[i].target >= 0) snprintf(tg, sizeof(tg), "%5.1f%%", 100 * rows[i].target);
        fprintf(out, "  %-42s %-28s %s\n", rows[i].name, m, tg);
    }
}

int cmd_report(int argc, char **argv) {
    const char *in = NULL, *svg = NULL, *csv = NULL;
    bool summary = false;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--replay")) return report_replay(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            report_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--summary"))
            summary = true;
        else if (!strcmp(a, "--svg") || !strcmp(a, "--csv")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tiermoe report: %s needs a FILE\n", a);
                return 2;
            }
            *(a[2] == 's' ? &svg : &csv) = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "tiermoe report: unknown flag '%s'\n", a);
            report_usage(stderr);
            return 2;
        } else if (in) {
            fprintf(stderr, "tiermoe report: one learn file at a time (merge them with tiermoe "
                            "trace --merge)\n");
            return 2;
        } else
            in = a;
    }
    if (!in) {
        report_usage(stderr);
        return 2;
    }
    tm_trace_stats s;
    if (trace_stats_read_json(in, NULL, &s) != TM_OK) {
        fprintf(stderr, "tiermoe report: %s\n", tm_error_message());
        return 1;
    }
    trace_stats_print(&s, !summary, stdout);
    report_routing(&s, stdout);
    int rc = 0;
    if (csv && trace_stats_write_csv(&s, csv) != TM_OK) {
        fprintf(stderr, "tiermoe report: %s\n", tm_error_message());
        rc = 1;
    }
    if (!rc && svg) rc = write_svg(&s, svg);
    trace_stats_free(&s);
    return rc;
}
