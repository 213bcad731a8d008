/* tiermoe report: read a learn/perf file and show, per layer, the top
 * experts, the skew (normalised entropy, share of hits covered by the top
 * 10/25/50% of experts), the working set and token-to-token reuse; optionally
 * an SVG heatmap (layers x experts, colour = the expert's share of its
 * layer's hits) and the CSV export. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
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
    int rc = 0;
    if (csv && trace_stats_write_csv(&s, csv) != TM_OK) {
        fprintf(stderr, "tiermoe report: %s\n", tm_error_message());
        rc = 1;
    }
    if (!rc && svg) rc = write_svg(&s, svg);
    trace_stats_free(&s);
    return rc;
}
