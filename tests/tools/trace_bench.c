/* trace_bench: what the expert tracer costs in decode (tg).
 *
 *   trace_bench MODEL [-n TOKENS] [-r REPS] [-t THREADS]
 *
 * Two contexts on the same model: one with no callback (tracing off: the
 * forward's NULL check), one with the tracer attached (stats on). Reps
 * alternate off/on, on/off so drift hits both alike; each rep decodes -n random
 * tokens one at a time. Prints tokens/s of both and the difference, plus the
 * time spent inside the tracer's callback itself (timed around each call) as
 * a share of the traced decode time: the direct, low-noise measure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/timing.h"
#include "model/model.h"
#include "trace/trace.h"

typedef struct timed_cb {
    tm_tensor_cb cb;
    void *ud;
    uint64_t ns, calls;
} timed_cb;

static void timed(void *ud, const char *name, int layer, const void *data, int64_t n_tok, int64_t n,
                  bool is_int) {
    timed_cb *t = ud;
    uint64_t t0 = tm_time_ns();
    t->cb(t->ud, name, layer, data, n_tok, n, is_int);
    t->ns += tm_time_ns() - t0, t->calls++;
}

static void noop_cb(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                    int64_t n, bool is_int) {
    (void)ud, (void)name, (void)layer, (void)data, (void)n_tok, (void)n, (void)is_int;
}

static double decode_run(tm_context *ctx, tm_rng *r, int n, uint32_t n_vocab) {
    model_context_reset(ctx);
    int32_t id = 1;
    uint64_t t0 = tm_time_ns();
    for (int i = 0; i < n; i++) {
        if (model_decode(ctx, &id, 1, TM_MOE_PHASE_DECODE, false) != TM_OK) {
            fprintf(stderr, "trace_bench: %s\n", tm_error_message());
            exit(1);
        }
        id = (int32_t)(tm_rng_u64(r) % n_vocab);
    }
    return (tm_time_ns() - t0) * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: trace_bench MODEL [-n TOKENS] [-r REPS] [-t THREADS]\n");
        return 2;
    }
    int n = 64, reps = 5, threads = 2;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
    }
    if (n < 1 || reps < 1 || threads < 1) return 2;
    tm_model *m;
    if (model_load(argv[1], &m) != TM_OK) {
        fprintf(stderr, "trace_bench: %s\n", tm_error_message());
        return 1;
    }
    tm_trace_config tc = {.stats = true};
    tm_trace *tr;
    if (model_trace_create(&tc, m, &tr) != TM_OK) return 1;
    tm_context_params off = {.n_ctx = n + 8, .n_threads = threads};
    tm_context_params on = off;
    trace_attach(tr, &on.cb, &on.cb_ud);
    timed_cb tcb = {on.cb, on.cb_ud, 0, 0};
    on.cb = timed, on.cb_ud = &tcb;
    tm_context *c_off, *c_on;
    if (model_context_create(m, &off, &c_off) != TM_OK ||
        model_context_create(m, &on, &c_on) != TM_OK) {
        fprintf(stderr, "trace_bench: %s\n", tm_error_message());
        return 1;
    }
    tm_rng r;
    tm_rng_seed(&r, 1);
    decode_run(c_off, &r, n < 8 ? n : 8, m->cfg.n_vocab); /* warm-up: page in, start threads */
    decode_run(c_on, &r, n < 8 ? n : 8, m->cfg.n_vocab);
    tcb.ns = tcb.calls = 0;
    double s_off = 0, s_on = 0, best_off = 1e30, best_on = 1e30;
    for (int i = 0; i < reps; i++) {
        double a,
            b; /* ABBA order: whatever runs second (warmer caches, or more contention) alternates */
        if (i % 2 == 0)
            a = decode_run(c_off, &r, n, m->cfg.n_vocab),
            b = decode_run(c_on, &r, n, m->cfg.n_vocab);
        else
            b = decode_run(c_on, &r, n, m->cfg.n_vocab),
            a = decode_run(c_off, &r, n, m->cfg.n_vocab);
        s_off += a, s_on += b;
        best_off = a < best_off ? a : best_off, best_on = b < best_on ? b : best_on;
    }
    /* what the timing wrapper itself costs a call (two clock reads), measured on a no-op callback
     */
    timed_cb noop = {noop_cb, NULL, 0, 0};
    for (int i = 0; i < 200000; i++) timed(&noop, "x_out", 0, NULL, 1, 1, false);
    const double wrap_ns = (double)noop.ns / noop.calls;
    const double cb_ns = tcb.ns - wrap_ns * tcb.calls;
    printf("model %s: %u layers, %u experts top-%u, tg%d x %d reps, %d threads\n", argv[1],
           m->cfg.n_layer, m->cfg.n_expert, m->cfg.n_expert_used, n, reps, threads);
    printf("  off: %8.2f t/s (best %8.2f)\n", n * reps / s_off, n / best_off);
    printf("  on:  %8.2f t/s (best %8.2f)   difference of means %+.2f%%, of bests %+.2f%%\n",
           n * reps / s_on, n / best_on, 100 * (s_on / s_off - 1), 100 * (best_on / best_off - 1));
    printf("  inside the tracer's callback: %.3f ms over %llu calls = %.4f%% of traced decode time "
           "(%.0f ns a call;\n"
           "  the timing wrapper's own %.0f ns a call, measured on a no-op callback, taken off)\n",
           cb_ns * 1e-6, (unsigned long long)tcb.calls, 100.0 * cb_ns * 1e-9 / s_on,
           tcb.calls ? cb_ns / tcb.calls : 0.0, wrap_ns);
    model_context_free(c_off);
    model_context_free(c_on);
    trace_free(tr);
    model_free(m);
    return 0;
}
