/* cpu_gemm_bench: speed of cpu_gemm on the shapes the models need.
 *
 *   cpu_gemm_bench [-t THREADS] [-l scalar|avx2|avx512|amx] [-m MIB] [-s SECONDS] [-q]
 *                  [-y TYPE,TYPE,...] [-e]
 *
 * Each case is a "job" of n_mat distinct weight matrices (rows x k) run over
 * the pool in row chunks, the way a layer runs (e.g. decode: 8 routed experts'
 * gate and up together). Weights rotate through a buffer of MIB MiB (default
 * 2048, larger than the last-level cache) so decode reads them from memory.
 * Activations are quantized once, outside the timing.
 * Reported: GB/s of weight bytes read (what bounds decode) and GOP/s
 * (2 * rows * k * n_tok per matrix); "GB/s/cpu" divides by the process's CPU
 * time instead of wall time (with -t 1, the per-core speed even while other
 * work shares the machine). -q runs only the Qwen3-30B-A3B cases;
 * -y only a 4096 x 4096 matrix of each type named (e.g. q2_K,iq4_xs), one
 * token (decode) and 64 (a prompt); with -e instead the Qwen3-30B-A3B expert
 * shapes (768 x 2048 gate/up, 2048 x 768 down) at 1 and 4 tokens. -m 1 keeps the
 * weights in cache (the kernels' compute speed), the default reads memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/rng.h"
#include "core/timing.h"
#include "cpu/cpu.h"
#include "../quant_test_util.h"

typedef struct bench_case {
    const char *name;
    tm_type type;
    int64_t rows, k, n_mat, n_tok;
} bench_case;

typedef struct bench_job {
    tm_type type;
    int64_t rows, k, n_tok, chunks_per_mat, chunk;
    size_t wrb, xrb, mat_bytes;
    const uint8_t *w; /* n_total matrices */
    int64_t n_total, base;
    const void *xq;
    float *y; /* n_mat * n_tok * rows */
} bench_job;

static void bench_item(void *ctx, int64_t b, int64_t e, int ith) {
    (void)ith;
    bench_job *j = ctx;
    for (int64_t it = b; it < e; it++) {
        int64_t m = it / j->chunks_per_mat, c = it % j->chunks_per_mat;
        int64_t r0 = c * j->chunk, r1 = r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows;
        const uint8_t *w = j->w + (size_t)((j->base + m) % j->n_total) * j->mat_bytes;
        cpu_gemm(j->type, j->k, w, j->wrb, r0, r1, j->xq, j->xrb, j->n_tok,
                 j->y + m * j->n_tok * j->rows, j->rows);
    }
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill_weights(tm_type t, uint8_t *w, size_t bytes, uint64_t seed) {
    tm_rng r;
    tm_rng_seed(&r, seed);
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = tm_rng_u64(&r);
        memcpy(w + i, &v, 8);
    }
    const tm_type_traits *tr = quant_type_traits(t);
    size_t bs = tr->type_size, nb = bytes / bs;
    tm_half d = quant_f32_to_f16(0.004f);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * bs;
        switch (t) {
        case TM_TYPE_Q4_K:
        case TM_TYPE_Q5_K:
            memcpy(p, &d, 2);
            memcpy(p + 2, &d, 2);
            break;
        case TM_TYPE_Q6_K:
            memcpy(p + bs - 2, &d, 2);
            break;
        case TM_TYPE_Q8_0:
        case TM_TYPE_Q4_0:
            memcpy(p, &d, 2);
            break;
        case TM_TYPE_MXFP4:
            p[0] = 120;
            break;
        case TM_TYPE_Q4_1: /* d, m */
        case TM_TYPE_Q5_1:
            memcpy(p, &d, 2);
            memcpy(p + 2, &d, 2);
            break;
        case TM_TYPE_Q5_0: /* d first */
        case TM_TYPE_IQ4_NL:
        case TM_TYPE_IQ4_XS:
            memcpy(p, &d, 2);
            break;
        case TM_TYPE_Q2_K: /* d, dmin last */
            memcpy(p + bs - 4, &d, 2);
            memcpy(p + bs - 2, &d, 2);
            break;
        case TM_TYPE_Q3_K: /* d last */
        case TM_TYPE_TQ1_0:
        case TM_TYPE_TQ2_0:
            memcpy(p + bs - 2, &d, 2);
            break;
        case TM_TYPE_IQ2_XXS: /* the grid i-quants but iq1_m start with d */
        case TM_TYPE_IQ2_XS:
        case TM_TYPE_IQ2_S:
        case TM_TYPE_IQ3_XXS:
        case TM_TYPE_IQ3_S:
        case TM_TYPE_IQ1_S:
            memcpy(p, &d, 2);
            break;
        case TM_TYPE_IQ1_M:
            quant_test_iq1m_set_d((tm_block_iq1_m *)p, d);
            break;
        case TM_TYPE_F16: {
            tm_half h = quant_f32_to_f16(((float)(p[0] & 0x7f) - 64) / 64);
            memcpy(p, &h, 2);
            break;
        }
        case TM_TYPE_BF16:
            p[1] &= 0x3f;
            break; /* |exponent| small, finite */
        case TM_TYPE_F32: {
            float f = ((float)(p[0]) - 128) / 128;
            memcpy(p, &f, 4);
            break;
        }
        default:
            break;
        }
    }
}

int main(int argc, char **argv) {
    int threads = cpu_physical_cores(), quick = 0, experts = 0;
    double seconds = 0.5, mib = 2048;
    enum { MAX_TYPES = 32 };
    bench_case type_cases[4 * MAX_TYPES];
    size_t n_type_cases = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc)
            mib = atof(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "-q"))
            quick = 1;
        else if (!strcmp(argv[i], "-e"))
            experts = 1;
        else if (!strcmp(argv[i], "-y") && i + 1 < argc) {
            char list[256];
            snprintf(list, sizeof list, "%s", argv[++i]);
            for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
                tm_type t;
                if (quant_type_from_name(name, &t) != TM_OK || !cpu_gemm_supports(t) ||
                    n_type_cases >= 4 * MAX_TYPES) {
                    fprintf(stderr,
                            "cpu_gemm_bench: -y: type '%s' is unknown or has no CPU kernel\n",
                            name);
                    return 1;
                }
                type_cases[n_type_cases++] = (bench_case){"square", t, 4096, 4096, 1, 1};
                type_cases[n_type_cases++] = (bench_case){"square", t, 4096, 4096, 1, 64};
                type_cases[n_type_cases++] = (bench_case){"gate/up", t, 768, 2048, 1, 1};
                type_cases[n_type_cases++] = (bench_case){"down", t, 2048, 768, 1, 1};
                type_cases[n_type_cases++] = (bench_case){"gate/up", t, 768, 2048, 1, 4};
                type_cases[n_type_cases++] = (bench_case){"down", t, 2048, 768, 1, 4};
            }
        } else if (!strcmp(argv[i], "-l") && i + 1 < argc) {
            const char *l = argv[++i];
            int ok = 0;
            for (int v = TM_CPU_SCALAR; v <= TM_CPU_AMX; v++)
                if (!strcmp(l, cpu_level_name((tm_cpu_level)v)))
                    ok = cpu_level_set((tm_cpu_level)v) == TM_OK;
            if (!ok) {
                fprintf(stderr, "cpu_gemm_bench: level '%s' is unknown or not available (%s)\n", l,
                        tm_error_message());
                return 1;
            }
        } else {
            fprintf(stderr,
                    "usage: cpu_gemm_bench [-t THREADS] [-l LEVEL] [-m MIB] [-s SECONDS] [-q] "
                    "[-y TYPE,...] [-e]\n");
            return 2;
        }
    }
    static const bench_case cases[] = {
        /* Qwen3-30B-A3B: 8 routed experts per token (gate+up, then down), Q4_K */
        {"expert gate+up x16", TM_TYPE_Q4_K, 768, 2048, 16, 1},
        {"expert down x8", TM_TYPE_Q4_K, 2048, 768, 8, 1},
        {"attn q", TM_TYPE_Q8_0, 4096, 2048, 1, 1},
        {"attn k+v x2", TM_TYPE_Q8_0, 512, 2048, 2, 1},
        {"attn o", TM_TYPE_Q8_0, 2048, 4096, 1, 1},
        {"output", TM_TYPE_Q8_0, 151936, 2048, 1, 1},
        /* prompt: ~32 tokens per expert for pp512, attention over 512 tokens */
        {"expert gate+up x16", TM_TYPE_Q4_K, 768, 2048, 16, 32},
        {"expert down x8", TM_TYPE_Q4_K, 2048, 768, 8, 32},
        {"expert gate+up x16", TM_TYPE_Q4_K, 768, 2048, 16, 512},
        /* runs that are not whole 16-token tiles (AMX pads the leftover tokens) */
        {"expert gate+up x16", TM_TYPE_Q4_K, 768, 2048, 16, 21},
        {"expert down x8", TM_TYPE_Q4_K, 2048, 768, 8, 40},
        {"attn q", TM_TYPE_Q8_0, 4096, 2048, 1, 32},
        {"attn q", TM_TYPE_Q8_0, 4096, 2048, 1, 512},
        {"attn o", TM_TYPE_Q8_0, 2048, 4096, 1, 512},
        /* other types, a 4096 x 4096 matrix */
        {"square", TM_TYPE_Q5_K, 4096, 4096, 1, 1},
        {"square", TM_TYPE_Q6_K, 4096, 4096, 1, 1},
        {"square", TM_TYPE_Q4_0, 4096, 4096, 1, 1},
        {"square", TM_TYPE_MXFP4, 4096, 4096, 1, 1},
        {"square", TM_TYPE_F16, 4096, 4096, 1, 1},
        {"square", TM_TYPE_BF16, 4096, 4096, 1, 1},
        {"square", TM_TYPE_F32, 4096, 4096, 1, 1},
        {"square", TM_TYPE_Q5_K, 4096, 4096, 1, 32},
        {"square", TM_TYPE_Q6_K, 4096, 4096, 1, 32},
        {"square", TM_TYPE_Q4_0, 4096, 4096, 1, 32},
        {"square", TM_TYPE_MXFP4, 4096, 4096, 1, 32},
        {"square", TM_TYPE_F16, 4096, 4096, 1, 32},
        {"square", TM_TYPE_BF16, 4096, 4096, 1, 32},
        {"square", TM_TYPE_F32, 4096, 4096, 1, 32},
        /* the grid i-quants: decode and a 64-token prompt */
        {"square", TM_TYPE_IQ2_XXS, 4096, 4096, 1, 1},
        {"square", TM_TYPE_IQ2_XS, 4096, 4096, 1, 1},
        {"square", TM_TYPE_IQ2_S, 4096, 4096, 1, 1},
        {"square", TM_TYPE_IQ3_XXS, 4096, 4096, 1, 1},
        {"square", TM_TYPE_IQ3_S, 4096, 4096, 1, 1},
        {"square", TM_TYPE_IQ1_S, 4096, 4096, 1, 1},
        {"square", TM_TYPE_IQ1_M, 4096, 4096, 1, 1},
        {"square", TM_TYPE_IQ2_XXS, 4096, 4096, 1, 64},
        {"square", TM_TYPE_IQ2_XS, 4096, 4096, 1, 64},
        {"square", TM_TYPE_IQ2_S, 4096, 4096, 1, 64},
        {"square", TM_TYPE_IQ3_XXS, 4096, 4096, 1, 64},
        {"square", TM_TYPE_IQ3_S, 4096, 4096, 1, 64},
        {"square", TM_TYPE_IQ1_S, 4096, 4096, 1, 64},
        {"square", TM_TYPE_IQ1_M, 4096, 4096, 1, 64},
    };
    size_t n_cases = quick ? 14 : sizeof cases / sizeof cases[0];
    const bench_case *list = cases;
    /* -e keeps the expert cases (the last four of each type's six), else the squares */
    size_t n_kept = 0;
    for (size_t i = 0; i < n_type_cases; i++)
        if ((i % 6 >= 2) == experts) type_cases[n_kept++] = type_cases[i];
    if (n_kept) list = type_cases, n_cases = n_kept;
    tm_pool *pool;
    if (cpu_pool_create(threads, &pool) != TM_OK) {
        fprintf(stderr, "cpu_gemm_bench: %s\n", tm_error_message());
        return 1;
    }
    printf("cpu: %s | level %s | %d threads | weights rotate through %.0f MiB\n\n",
           cpu_features_string(), cpu_level_name(cpu_level_get()), threads, mib);
    printf("| case | type | rows x k | mats | n_tok | us/job | GB/s | GOP/s | GB/s/cpu |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t ci = 0; ci < n_cases; ci++) {
        const bench_case *c = &list[ci];
        bench_job j = {.type = c->type, .rows = c->rows, .k = c->k, .n_tok = c->n_tok};
        j.wrb = quant_row_size(c->type, c->k);
        j.xrb = cpu_act_row_size(c->type, c->k);
        j.mat_bytes = j.wrb * (size_t)c->rows;
        j.n_total = (int64_t)(mib * 1048576.0 / (double)j.mat_bytes);
        if (j.n_total < c->n_mat) j.n_total = c->n_mat;
        /* as the cpu lane: 256 rows from 16 tokens, else 64 doubled up to 256 while under 32 KB */
        j.chunk = c->n_tok >= 16 ? 256 : 64;
        while (j.chunk < 256 && (size_t)j.chunk * j.wrb < (32 << 10)) j.chunk *= 2;
        j.chunks_per_mat = (c->rows + j.chunk - 1) / j.chunk;
        uint8_t *w = malloc(j.mat_bytes * (size_t)j.n_total);
        float *x = malloc(sizeof(float) * (size_t)(c->k * c->n_tok));
        void *xq = malloc(j.xrb * (size_t)c->n_tok);
        j.y = malloc(sizeof(float) * (size_t)(c->n_mat * c->n_tok * c->rows));
        if (!w || !x || !xq || !j.y) {
            fprintf(stderr, "cpu_gemm_bench: out of memory for case %zu\n", ci);
            return 1;
        }
        fill_weights(c->type, w, j.mat_bytes * (size_t)j.n_total, ci + 1);
        tm_rng r;
        tm_rng_seed(&r, 5);
        for (int64_t i = 0; i < c->k * c->n_tok; i++) x[i] = tm_rng_normal(&r);
        for (int64_t t = 0; t < c->n_tok; t++)
            cpu_act_quantize(c->type, x + t * c->k, (char *)xq + j.xrb * (size_t)t, c->k);
        j.w = w;
        j.xq = xq;
        int64_t items = c->n_mat * j.chunks_per_mat;
        /* warm up (also faults the pages in), then time whole jobs */
        cpu_pool_for(pool, items, 1, bench_item, &j);
        j.base += c->n_mat;
        int64_t jobs = 0;
        const double c0 = cpu_seconds();
        uint64_t t0 = tm_time_ns(), t1;
        do {
            cpu_pool_for(pool, items, 1, bench_item, &j);
            j.base += c->n_mat;
            jobs++;
            t1 = tm_time_ns();
        } while ((double)(t1 - t0) * 1e-9 < seconds);
        double s = (double)(t1 - t0) * 1e-9 / (double)jobs;
        const double cs = (cpu_seconds() - c0) / (double)jobs;
        double bytes = (double)j.mat_bytes * (double)c->n_mat;
        double ops = 2.0 * (double)c->rows * (double)c->k * (double)c->n_tok * (double)c->n_mat;
        printf("| %s | %s | %lld x %lld | %lld | %lld | %.1f | %.1f | %.0f | %.1f |\n", c->name,
               quant_type_name(c->type), (long long)c->rows, (long long)c->k, (long long)c->n_mat,
               (long long)c->n_tok, s * 1e6, bytes / s * 1e-9, ops / s * 1e-9, bytes / cs * 1e-9);
        fflush(stdout);
        free(w);
        free(x);
        free(xq);
        free(j.y);
    }
    cpu_pool_free(pool);
    return 0;
}
