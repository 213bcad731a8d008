/* Thread pool: cpu_pool_for covers every item exactly once for many
 * (n, chunk, threads) combinations; cpu_pool_run gives each thread its own
 * ith with the right nth; thousands of tiny back-to-back jobs (the per-layer
 * pattern) neither deadlock nor lose a job, with spinning and with the
 * futex sleep path forced (TIERMOE_SPIN_US=0); cpu_pool_for_steps runs
 * every item of every step once, and no item of a step starts before every
 * item of the previous non-empty step has finished. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/rng.h"
#include "core/timing.h"
#include "cpu/cpu.h"

typedef struct for_ctx {
    atomic_int *hits;
    int64_t n;
    atomic_int bad;
    int nth;
} for_ctx;

static void for_fn(void *ctx, int64_t b, int64_t e, int ith) {
    for_ctx *c = ctx;
    if (b < 0 || e > c->n || b >= e || ith < 0 || ith >= c->nth) atomic_fetch_add(&c->bad, 1);
    for (int64_t i = b; i < e && i < c->n && i >= 0; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_for_coverage(void **s) {
    (void)s;
    const int threads[] = {1, 2, 3, 4, 7};
    const int64_t ns[] = {0, 1, 2, 5, 16, 17, 100, 1000, 4099};
    const int64_t chunks[] = {0, 1, 3, 16, 64, 5000};
    for (size_t ti = 0; ti < 5; ti++) {
        tm_pool *pool;
        assert_int_equal(cpu_pool_create(threads[ti], &pool), TM_OK);
        assert_int_equal(cpu_pool_size(pool), threads[ti]);
        for (size_t ni = 0; ni < 9; ni++) {
            for (size_t ci = 0; ci < 6; ci++) {
                int64_t n = ns[ni];
                atomic_int *hits = calloc((size_t)n + 1, sizeof *hits);
                for_ctx c = {.hits = hits, .n = n, .nth = threads[ti]};
                atomic_init(&c.bad, 0);
                cpu_pool_for(pool, n, chunks[ci], for_fn, &c);
                assert_int_equal(atomic_load(&c.bad), 0);
                for (int64_t i = 0; i < n; i++)
                    if (atomic_load(&hits[i]) != 1)
                        fail_msg("threads %d n %lld chunk %lld: item %lld run %d times",
                                 threads[ti], (long long)n, (long long)chunks[ci], (long long)i,
                                 atomic_load(&hits[i]));
                free(hits);
            }
        }
        cpu_pool_free(pool);
    }
    /* a NULL pool runs on the caller */
    atomic_int hits[10] = {0};
    for_ctx c = {.hits = hits, .n = 10, .nth = 1};
    atomic_init(&c.bad, 0);
    cpu_pool_for(NULL, 10, 3, for_fn, &c);
    for (int i = 0; i < 10; i++) assert_int_equal(atomic_load(&hits[i]), 1);
}

typedef struct run_ctx {
    atomic_int seen[16];
    atomic_int bad;
    atomic_llong total;
    int nth;
} run_ctx;

static void run_fn(void *ctx, int ith, int nth) {
    run_ctx *c = ctx;
    if (nth != c->nth || ith < 0 || ith >= nth) {
        atomic_fetch_add(&c->bad, 1);
        return;
    }
    atomic_fetch_add(&c->seen[ith], 1);
    atomic_fetch_add(&c->total, 1);
}

static void run_many(int nth, int jobs) {
    tm_pool *pool;
    assert_int_equal(cpu_pool_create(nth, &pool), TM_OK);
    run_ctx c;
    memset(&c, 0, sizeof c);
    c.nth = nth;
    uint64_t t0 = tm_time_ns();
    for (int j = 0; j < jobs; j++) cpu_pool_run(pool, run_fn, &c);
    double us = (double)(tm_time_ns() - t0) / 1e3 / jobs;
    assert_int_equal(atomic_load(&c.bad), 0);
    for (int i = 0; i < nth; i++) assert_int_equal(atomic_load(&c.seen[i]), jobs);
    assert_int_equal(atomic_load(&c.total), (long long)nth * jobs);
    printf("# %d threads, %d jobs: %.2f us per job\n", nth, jobs, us);
    cpu_pool_free(pool);
}

static void test_run_ith(void **s) {
    (void)s;
    for (int nth = 1; nth <= 6; nth++) run_many(nth, 100);
}

static void test_many_tiny_jobs(void **s) {
    (void)s;
    run_many(4, 10000);
    setenv("TIERMOE_SPIN_US", "0", 1); /* every wait goes to the futex */
    run_many(3, 3000);
    unsetenv("TIERMOE_SPIN_US");
}

/* ---- cpu_pool_for_steps ---- */

#define STEPS_MAX 8

typedef struct steps_ctx {
    atomic_int *hits[STEPS_MAX];  /* per step, per item: times run */
    atomic_llong done[STEPS_MAX]; /* per step: items finished */
    int64_t n[STEPS_MAX];
    int prev[STEPS_MAX]; /* previous non-empty step, -1 for none */
    atomic_int early;    /* items that started before the previous step was done */
    atomic_int bad;
    int nth;
} steps_ctx;

static void steps_item(steps_ctx *c, int step, int64_t b, int64_t e, int ith) {
    if (b < 0 || e > c->n[step] || b >= e || ith < 0 || ith >= c->nth) atomic_fetch_add(&c->bad, 1);
    const int pv = c->prev[step];
    if (pv >= 0 && atomic_load(&c->done[pv]) != c->n[pv]) atomic_fetch_add(&c->early, 1);
    for (int64_t i = b; i < e && i < c->n[step] && i >= 0; i++) {
        if ((i & 7) == 0) sched_yield(); /* let the others run ahead if they could */
        atomic_fetch_add(&c->hits[step][i], 1);
    }
    atomic_fetch_add(&c->done[step], e - b);
}

/* The step index is not an argument of the range function: one per step. */
#define STEP_FN(i)                                                                                 \
    static void step_fn##i(void *ctx, int64_t b, int64_t e, int ith) {                             \
        steps_item(ctx, i, b, e, ith);                                                             \
    }
STEP_FN(0)
STEP_FN(1)
STEP_FN(2)
STEP_FN(3)
STEP_FN(4)
STEP_FN(5)
STEP_FN(6)
STEP_FN(7)
static const tm_pool_range_fn step_fns[STEPS_MAX] = {step_fn0, step_fn1, step_fn2, step_fn3,
                                                     step_fn4, step_fn5, step_fn6, step_fn7};

/* One cpu_pool_for_steps call with these step sizes and chunks, checked. */
static void steps_check(tm_pool *pool, int n_steps, const int64_t *ns, const int64_t *chunks) {
    steps_ctx c;
    memset(&c, 0, sizeof c);
    c.nth = cpu_pool_size(pool);
    tm_pool_step steps[STEPS_MAX];
    int last = -1;
    for (int i = 0; i < n_steps; i++) {
        c.n[i] = ns[i];
        c.hits[i] = calloc((size_t)ns[i] + 1, sizeof(atomic_int));
        atomic_init(&c.done[i], 0);
        c.prev[i] = last;
        if (ns[i] > 0) last = i;
        steps[i] = (tm_pool_step){.fn = step_fns[i], .n = ns[i], .chunk = chunks[i]};
    }
    cpu_pool_for_steps(pool, n_steps, steps, &c);
    assert_int_equal(atomic_load(&c.bad), 0);
    if (atomic_load(&c.early))
        fail_msg("%d threads, %d steps: %d chunks started before the previous step finished", c.nth,
                 n_steps, atomic_load(&c.early));
    for (int i = 0; i < n_steps; i++) {
        for (int64_t it = 0; it < ns[i]; it++)
            if (atomic_load(&c.hits[i][it]) != 1)
                fail_msg("%d threads, step %d of %d (n %lld chunk %lld): item %lld run %d times",
                         c.nth, i, n_steps, (long long)ns[i], (long long)chunks[i], (long long)it,
                         atomic_load(&c.hits[i][it]));
        free(c.hits[i]);
    }
}

static void test_for_steps(void **s) {
    (void)s;
    const int threads[] = {1, 2, 3, 4, 7};
    const int64_t ns[] = {0, 1, 2, 5, 16, 33, 257};
    const int64_t chunks[] = {0, 1, 3, 16, 1000};
    tm_rng r;
    tm_rng_seed(&r, 7);
    for (size_t ti = 0; ti < 5; ti++) {
        tm_pool *pool;
        assert_int_equal(cpu_pool_create(threads[ti], &pool), TM_OK);
        for (int round = 0; round < 60; round++) {
            int n_steps = (int)(tm_rng_u64(&r) % (STEPS_MAX + 1));
            int64_t n[STEPS_MAX], ch[STEPS_MAX];
            for (int i = 0; i < n_steps; i++) {
                n[i] = ns[tm_rng_u64(&r) % 7];
                ch[i] = chunks[tm_rng_u64(&r) % 5];
            }
            steps_check(pool, n_steps, n, ch);
        }
        /* every step empty but the last, and the other way round */
        const int64_t n1[] = {0, 0, 0, 9}, n2[] = {9, 0, 0, 0}, c1[] = {1, 1, 1, 1};
        steps_check(pool, 4, n1, c1);
        steps_check(pool, 4, n2, c1);
        cpu_pool_free(pool);
    }
    const int64_t n3[] = {4, 5, 6}, c3[] = {1, 2, 100};
    steps_check(NULL, 3, n3, c3); /* a NULL pool runs the steps on the caller, in order */
}

/* Per-layer pattern: 10,000 back-to-back step jobs, spinning and with the
 * futex sleep path forced; a lost wake-up would hang here. */
static void test_for_steps_many(void **s) {
    (void)s;
    const int64_t n[] = {16, 3, 40, 1}, ch[] = {1, 1, 4, 1};
    tm_pool *pool;
    assert_int_equal(cpu_pool_create(4, &pool), TM_OK);
    for (int j = 0; j < 10000; j++) steps_check(pool, 4, n, ch);
    cpu_pool_free(pool);
    setenv("TIERMOE_SPIN_US", "0", 1);
    assert_int_equal(cpu_pool_create(3, &pool), TM_OK);
    for (int j = 0; j < 2000; j++) steps_check(pool, 4, n, ch);
    cpu_pool_free(pool);
    unsetenv("TIERMOE_SPIN_US");
}

static void test_bad_size(void **s) {
    (void)s;
    tm_pool *pool = (tm_pool *)1;
    assert_int_equal(cpu_pool_create(0, &pool), TM_ERR_ARG);
    assert_null(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_for_coverage),   cmocka_unit_test(test_run_ith),
        cmocka_unit_test(test_many_tiny_jobs), cmocka_unit_test(test_for_steps),
        cmocka_unit_test(test_for_steps_many), cmocka_unit_test(test_bad_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
