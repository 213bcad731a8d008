/* quant_tool: drive the reference quantizers from the command line.
 *
 *   quant_tool dequant TYPE in.bin out.f32   raw blocks -> little-endian f32
 *   quant_tool quant   TYPE in.f32 out.bin   f32 -> raw blocks
 *   quant_tool bench   [N] [TYPE...]         quantize/dequantize throughput on
 *                                            N (default 2^24) normal values, one core
 *   quant_tool types                         the type table: id name block bytes compute
 *
 * The oracle test (tests/oracle/test_quant_oracle.py) compares its output with
 * the gguf package; bench numbers go into docs/quant.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "core/timing.h"
#include "quant/quant.h"

static int read_file(const char *path, unsigned char **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "quant_tool: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 20, len = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        unsigned char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f) || !buf;
    fclose(f);
    if (err) {
        fprintf(stderr, "quant_tool: cannot read %s\n", path);
        free(buf);
        return 1;
    }
    *data = buf;
    *size = len;
    return 0;
}

static int write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) {
        fprintf(stderr, "quant_tool: cannot write %s\n", path);
        if (f) fclose(f);
        return 1;
    }
    return 0;
}

static int convert(int quantize, const char *type_name, const char *in, const char *out) {
    tm_type t;
    if (quant_type_from_name(type_name, &t) != TM_OK) {
        fprintf(stderr, "quant_tool: %s\n", tm_error_message());
        return 2;
    }
    const tm_type_traits *tr = quant_type_traits(t);
    unsigned char *data;
    size_t size;
    if (read_file(in, &data, &size)) return 1;
    size_t unit = quantize ? sizeof(float) * (size_t)tr->block_size : tr->type_size;
    if (size % unit) {
        fprintf(stderr, "quant_tool: %s holds %zu bytes, not a multiple of %zu (%s %s)\n", in, size,
                unit, tr->name, quantize ? "block of f32 values" : "block");
        free(data);
        return 1;
    }
    int64_t n = (int64_t)(size / unit) * tr->block_size;
    size_t out_size = quantize ? quant_row_size(t, n) : (size_t)n * sizeof(float);
    void *buf = malloc(out_size ? out_size : 1);
    tm_status st = !buf       ? TM_ERR_NOMEM
                   : quantize ? quant_row_quantize(t, (const float *)data, buf, n)
                              : quant_row_dequantize(t, data, buf, n);
    int rc = 0;
    if (st != TM_OK) {
        fprintf(stderr, "quant_tool: %s\n", buf ? tm_error_message() : "out of memory");
        rc = 1;
    } else {
        rc = write_file(out, buf, out_size);
    }
    free(buf);
    free(data);
    return rc;
}

static int bench(int argc, char **argv) {
    int64_t n = 1 << 24;
    int first = 0;
    if (argc > 0 && atoll(argv[0]) > 0) {
        n = atoll(argv[0]);
        first = 1;
    }
    n -= n % 256;
    /* default: every compute type of the table */
    const char *defaults[TM_TYPE_COUNT];
    int ndefaults = 0;
    for (uint32_t t = 0; t < TM_TYPE_COUNT; t++)
        if (quant_type_is_compute(t) && t != TM_TYPE_F32)
            defaults[ndefaults++] = quant_type_name(t);
    const char **names = argc > first ? (const char **)argv + first : defaults;
    int count = argc > first ? argc - first : ndefaults;
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    void *q = malloc((size_t)n * sizeof(float)); /* larger than any quantized row */
    if (!x || !y || !q) return 1;
    tm_rng rng;
    tm_rng_seed(&rng, 1);
    for (int64_t i = 0; i < n; i++) x[i] = tm_rng_normal(&rng) * 0.02f;
    printf("%-7s %12s %12s %10s   (%lld values, best of 3, one thread)\n", "type", "quant Mv/s",
           "dequant Mv/s", "rmse/std", (long long)n);
    for (int k = 0; k < count; k++) {
        tm_type t;
        if (quant_type_from_name(names[k], &t) != TM_OK || !quant_type_traits(t)->quantize) {
            fprintf(stderr, "quant_tool: %s has no quantizer\n", names[k]);
            return 2;
        }
        const int has_dequant = quant_type_traits(t)->dequantize != NULL;
        double best_q = 1e30, best_d = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = tm_time_s();
            quant_row_quantize(t, x, q, n);
            double t1 = tm_time_s();
            if (has_dequant) quant_row_dequantize(t, q, y, n);
            double t2 = tm_time_s();
            best_q = t1 - t0 < best_q ? t1 - t0 : best_q;
            best_d = t2 - t1 < best_d ? t2 - t1 : best_d;
        }
        if (!has_dequant) { /* quantize-only so far: no round trip to measure */
            printf("%-6s %12.2f %12s %10s\n", quant_type_name(t), (double)n / best_q * 1e-6, "-",
                   "-");
            continue;
        }
        double se = 0;
        for (int64_t i = 0; i < n; i++) se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        printf("%-7s %12.1f %12.1f %10.5f\n", quant_type_name(t), (double)n / best_q * 1e-6,
               (double)n / best_d * 1e-6, sqrt(se / (double)n) / 0.02);
    }
    free(x);
    free(y);
    free(q);
    return 0;
}

static int types(void) {
    for (uint32_t t = 0; t < TM_TYPE_COUNT; t++) {
        const tm_type_traits *tr = quant_type_traits(t);
        if (tr)
            printf("%u %s %lld %zu %d\n", t, tr->name, (long long)tr->block_size, tr->type_size,
                   quant_type_is_compute(t));
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "types")) return types();
    if (argc == 5 && !strcmp(argv[1], "dequant")) return convert(0, argv[2], argv[3], argv[4]);
    if (argc == 5 && !strcmp(argv[1], "quant")) return convert(1, argv[2], argv[3], argv[4]);
    if (argc >= 2 && !strcmp(argv[1], "bench")) return bench(argc - 2, argv + 2);
    fprintf(stderr, "usage: quant_tool dequant TYPE in.bin out.f32\n"
                    "       quant_tool quant TYPE in.f32 out.bin\n"
                    "       quant_tool bench [N] [TYPE...]\n"
                    "       quant_tool types\n");
    return 2;
}
