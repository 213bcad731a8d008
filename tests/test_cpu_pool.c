/* Thread pool: cpu_pool_for covers every item exactly once for many
 * (n, chunk, threads) combinations; cpu_pool_run gives each thread its own
 * ith with the right nth; thousands of tiny back-to-back jobs (the per-layer
 * pattern) neither deadlock nor lose a job, with spinning and with the
 * futex sleep path forced (TIERMOE_SPIN_US=0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

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
                        fail_msg("threads %d n %lld chunk %lld: item %lld run %d times", threads[ti],
                                 (long long)n, (long long)chunks[ci], (long long)i, atomic_load(&hits[i]));
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

static void test_bad_size(void **s) {
    (void)s;
    tm_pool *pool = (tm_pool *)1;
    assert_int_equal(cpu_pool_create(0, &pool), TM_ERR_ARG);
    assert_null(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_for_coverage),
        cmocka_unit_test(test_run_ith),
        cmocka_unit_test(test_many_tiny_jobs),
        cmocka_unit_test(test_bad_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
