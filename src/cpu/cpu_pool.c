/* Thread pool: n-1 workers plus the calling thread (ith 0) run one job at a
 * time. Per-layer jobs last tens of microseconds, so waiting spins first
 * (TIERMOE_SPIN_US, default 200 us; yielding after the first few microseconds
 * so oversubscribed cores still progress) and only then sleeps on a futex; wakers
 * make the syscall only when someone actually sleeps. A NULL pool runs jobs
 * on the calling thread. Jobs must not start pool jobs themselves. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/log.h"
#include "core/timing.h"
#include "cpu/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

struct tm_pool {
    int n_threads;
    pthread_t *threads;
    tm_pool_fn fn;
    void *ctx;
    uint64_t spin_ns;
    _Alignas(64) atomic_uint gen; /* bumped per job; workers wait for a change */
    atomic_int sleepers;          /* workers sleeping on gen */
    atomic_bool stop;
    _Alignas(64) atomic_int remaining; /* workers still running the current job */
    atomic_int main_sleeping;
    _Alignas(64) atomic_int bar_arrived; /* threads at the barrier inside a job */
    _Alignas(64) atomic_uint bar_gen;    /* bumped when the last one arrives */
    atomic_int bar_sleepers;
};

typedef struct pool_worker_arg {
    tm_pool *pool;
    int ith;
} pool_worker_arg;

static void futex_wait(atomic_uint *addr, unsigned expected) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}
static void futex_wake_all(void *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Spin, then sleep, until *word != seen; returns the new value. */
static unsigned pool_wait_change(tm_pool *p, atomic_uint *word, unsigned seen,
                                 atomic_int *sleepers) {
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        unsigned v = atomic_load_explicit(word, memory_order_acquire);
        if (v != seen) return v;
        cpu_relax();
        if ((i & 255) != 255) continue;
        uint64_t now = tm_time_ns();
        if (!t0) t0 = now;
        if (now - t0 < p->spin_ns) {
            if (i > 1024) sched_yield(); /* oversubscribed cores: let the runner run */
            continue;
        }
        atomic_fetch_add(sleepers, 1);
        if (atomic_load(word) == seen) futex_wait(word, seen);
        atomic_fetch_sub(sleepers, 1);
    }
}

static void *pool_worker(void *arg_) {
    pool_worker_arg *arg = arg_;
    tm_pool *p = arg->pool;
    int ith = arg->ith;
    free(arg);
    unsigned seen = 0;
    for (;;) {
        seen = pool_wait_change(p, &p->gen, seen, &p->sleepers);
        if (atomic_load(&p->stop)) break;
        p->fn(p->ctx, ith, p->n_threads);
        if (atomic_fetch_sub(&p->remaining, 1) == 1 && atomic_load(&p->main_sleeping))
            futex_wake_all(&p->remaining);
    }
    return NULL;
}

tm_status cpu_pool_create(int n_threads, tm_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return tm_error_set(TM_ERR_ARG, "thread count %d is out of range (1..1024)", n_threads);
    tm_pool *p = calloc(1, sizeof *p);
    if (!p) return tm_error_set(TM_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    p->spin_ns = 200000;
    const char *env = getenv("TIERMOE_SPIN_US");
    if (env && *env) p->spin_ns = (uint64_t)strtoull(env, NULL, 10) * 1000;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return tm_error_set(TM_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        pool_worker_arg *arg = malloc(sizeof *arg);
        int rc = arg ? 0 : ENOMEM;
        if (arg) {
            arg->pool = p;
            arg->ith = i;
            rc = pthread_create(&p->threads[i], NULL, pool_worker, arg);
            if (rc) free(arg);
        }
        if (rc) {
            p->n_threads = i; /* free() joins the ones that started */
            cpu_pool_free(p);
            return tm_error_set(TM_ERR_NOMEM,
                                "thread pool: cannot start thread %d of %d (error %d)", i,
                                n_threads, rc);
        }
    }
    *out = p;
    return TM_OK;
}

void cpu_pool_free(tm_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    atomic_fetch_add(&p->gen, 1);
    futex_wake_all(&p->gen);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}

int cpu_pool_size(const tm_pool *p) {
    return p ? p->n_threads : 1;
}

void cpu_pool_run(tm_pool *p, tm_pool_fn fn, void *ctx) {
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->remaining, p->n_threads - 1);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn/ctx, pairs with the sleepers check */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->gen);
    fn(ctx, 0, p->n_threads);
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        int v = atomic_load_explicit(&p->remaining, memory_order_acquire);
        if (v == 0) break;
        cpu_relax();
        if ((i & 255) != 255) continue;
        uint64_t now = tm_time_ns();
        if (!t0) t0 = now;
        if (now - t0 < p->spin_ns) {
            if (i > 1024) sched_yield();
            continue;
        }
        atomic_store(&p->main_sleeping, 1);
        v = atomic_load(&p->remaining);
        if (v != 0)
            syscall(SYS_futex, (uint32_t *)&p->remaining, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
        atomic_store(&p->main_sleeping, 0);
    }
}

typedef struct pool_for_job {
    tm_pool_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    _Alignas(64) atomic_llong next;
} pool_for_job;

static void pool_for_worker(void *ctx, int ith, int nth) {
    (void)nth;
    pool_for_job *job = ctx;
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&job->next, job->chunk, memory_order_relaxed);
        if (b >= job->n) break;
        int64_t e = b + job->chunk < job->n ? b + job->chunk : job->n;
        job->fn(job->ctx, b, e, ith);
    }
}

void cpu_pool_for(tm_pool *p, int64_t n, int64_t chunk, tm_pool_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    if (!p || p->n_threads == 1 || chunk >= n) {
        fn(ctx, 0, n, 0);
        return;
    }
    pool_for_job job = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk};
    atomic_init(&job.next, 0);
    cpu_pool_run(p, pool_for_worker, &job);
}

/* All n_threads threads of the running job meet here; the last to arrive
 * releases the others (spin, then sleep, as for jobs). */
static void pool_barrier(tm_pool *p) {
    unsigned gen = atomic_load_explicit(&p->bar_gen, memory_order_acquire);
    if (atomic_fetch_add(&p->bar_arrived, 1) == p->n_threads - 1) {
        atomic_store(&p->bar_arrived, 0);
        atomic_fetch_add(&p->bar_gen, 1); /* seq_cst: pairs with the sleepers check */
        if (atomic_load(&p->bar_sleepers) > 0) futex_wake_all(&p->bar_gen);
        return;
    }
    pool_wait_change(p, &p->bar_gen, gen, &p->bar_sleepers);
}

#define POOL_MAX_STEPS 8

typedef struct pool_steps_job {
    tm_pool *pool;
    const tm_pool_step *steps;
    int n_steps;
    void *ctx;
    struct {
        _Alignas(64) atomic_llong next; /* next unclaimed item of step i, one cache line each */
    } counter[POOL_MAX_STEPS];
} pool_steps_job;

static void pool_steps_worker(void *ctx, int ith, int nth) {
    pool_steps_job *job = ctx;
    bool first = true;
    for (int i = 0; i < job->n_steps; i++) {
        const tm_pool_step *st = &job->steps[i];
        if (st->n <= 0) continue;
        if (!first && nth > 1) pool_barrier(job->pool);
        first = false;
        const int64_t chunk = st->chunk < 1 ? 1 : st->chunk;
        for (;;) {
            int64_t b =
                atomic_fetch_add_explicit(&job->counter[i].next, chunk, memory_order_relaxed);
            if (b >= st->n) break;
            st->fn(job->ctx, b, b + chunk < st->n ? b + chunk : st->n, ith);
        }
    }
}

void cpu_pool_for_steps(tm_pool *p, int n_steps, const tm_pool_step *steps, void *ctx) {
    TM_ASSERT(n_steps >= 0 && n_steps <= POOL_MAX_STEPS);
    pool_steps_job job = {.pool = p, .steps = steps, .n_steps = n_steps, .ctx = ctx};
    for (int i = 0; i < n_steps; i++) atomic_init(&job.counter[i].next, 0);
    cpu_pool_run(p, pool_steps_worker, &job);
}
