/* The PCIe lane's decode share, tuned by timing decode steps (--moe-pcie auto).
 *
 * The calibration's share balances the lanes' rates as measured for 20 ms: the
 * GPU reading pinned RAM in place against the CPU lane, each while the other
 * runs. On the H200 pair (2026-11-30, 30b-a3b with 24 layers' experts in RAM,
 * one GPU) that measurement gave the PCIe lane 1 to 3 of a token's 8 cold
 * slots from one process to the next on a quiet host (the CPU lane's rate
 * beside the GPU's reads swung from 64 to 126 GB/s; the GPU's own read rate,
 * 46 GB/s, did not move) and 4 to 7 while the host took 7-14% of the CPU time,
 * and decode follows the slot count, not the calibration: 125 t/s with none
 * over PCIe, 133 with 1, 142 with 2, 106 with
 * 3 and 108 with 4 (one process each, the host's steal under 2%; profiled, 6
 * slots 25% slower than 2). So decoding measures it: each candidate (i of the k
 * slots of a token all cold, as tm_cuda_mapped_count gives them) is timed over
 * TIER_TUNE_WINDOW one-row decode steps (the median of step end to step end;
 * the step after a change is left out): the calibration's first, then the
 * lane off, then the untimed neighbours of the fastest so far until both of
 * its are timed (more PCIe slots must be 2% faster to win), and the fastest
 * is kept. The router kernel reads the share from the mailbox when it runs
 * (tm_cuda_router_params.mapped_share_live), so a decode graph keeps serving,
 * and the host's split reads pcie_share_q8: both change only here, after a
 * step, when none runs. TIERMOE_PCIE_TUNE=0 keeps the calibration's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timing.h"
#include "tier/calib.h"
#include "tier/tier_internal.h"

#define TIER_TUNE_MARGIN 0.98 /* a candidate with more PCIe slots must be 2% faster */

int32_t tier_tune_share(int32_t k, int32_t i) {
    int32_t lo = 0, hi = 0;
    for (int32_t s = 1; s < 256; s++)
        if (tm_cuda_mapped_count(k, k, s) == i) {
            if (!lo) lo = s;
            hi = s;
        }
    return lo ? (lo + hi) / 2 : 0;
}

void tier_tune_start(tier_tune *u, int32_t first, int32_t window) {
    memset(u, 0, sizeof(*u));
    u->on = true, u->first = u->cur = first, u->n = -1;
    u->window = window < 1 ? 1 : window < TIER_TUNE_WINDOW ? window : TIER_TUNE_WINDOW;
}

int32_t tier_tune_count(const tier_tune *u) {
    int32_t n = 0;
    for (int32_t i = 0; i <= TM_CUDA_ROUTER_MAX_USED; i++) n += u->ms[i] > 0;
    return n;
}

/* The fastest candidate timed: fewer PCIe slots unless more are 2% faster. */
static int32_t tier_tune_best(const tier_tune *u, int32_t n_max) {
    int32_t best = -1;
    for (int32_t i = 0; i <= n_max; i++)
        if (u->ms[i] > 0 && (best < 0 || u->ms[i] < u->ms[best] * TIER_TUNE_MARGIN)) best = i;
    return best;
}

bool tier_tune_period(tier_tune *u, int32_t n_max, double ms) {
    if (!u->on || u->done) return false;
    if (u->n < 0) { /* the step the change came after */
        u->n = 0;
        return false;
    }
    u->period[u->n++] = ms;
    if (u->n < u->window) return false;
    u->ms[u->cur] = calib_median(u->period, u->window);
    const int32_t best = tier_tune_best(u, n_max);
    int32_t next = best; /* the lane off, then an untimed neighbour of the fastest */
    if (!(u->ms[0] > 0))
        next = 0;
    else if (best > 0 && !(u->ms[best - 1] > 0))
        next = best - 1;
    else if (best < n_max && !(u->ms[best + 1] > 0))
        next = best + 1;
    else
        u->done = true;
    u->n = -1;
    const bool moved = next != u->cur;
    u->cur = next;
    return moved;
}

/* ---- on the tier ---- */

static void tier_tune_set(tm_tier *t) {
    t->pcie_share_q8 = tier_tune_share((int32_t)t->k, t->tune.cur);
    __atomic_store_n(t->mb.share, t->pcie_share_q8, __ATOMIC_RELEASE);
}

void tier_tune_init(tm_tier *t) {
    tier_tune *u = &t->tune;
    memset(u, 0, sizeof(*u));
    __atomic_store_n(t->mb.share, t->pcie_share_q8, __ATOMIC_RELEASE);
    /* TIERMOE_PCIE_TUNE: 0 off, 1..TIER_TUNE_WINDOW the window (tests take 1) */
    const char *env = getenv("TIERMOE_PCIE_TUNE");
    const int w = env ? atoi(env) : TIER_TUNE_WINDOW;
    if (w <= 0 || t->k > TM_CUDA_ROUTER_MAX_USED) return;
    tier_tune_start(u, tm_cuda_mapped_count((int32_t)t->k, t->n_pcie, t->pcie_share_q8), w);
    tier_tune_set(t);
}

int32_t tier_tune_timed(const tm_tier *t) {
    return tier_tune_count(&t->tune);
}

static void tier_tune_log(const tm_tier *t) {
    const tier_tune *u = &t->tune;
    char s[512];
    size_t n = 0;
    for (int32_t i = 0; i <= (int32_t)t->k && n < sizeof(s); i++)
        if (u->ms[i] > 0)
            n +=
                (size_t)snprintf(s + n, sizeof(s) - n, "%s%d: %.2f ms", n ? ", " : "", i, u->ms[i]);
    tm_log_info("--moe-pcie auto: decode steps with i of %u cold slots over PCIe (%s); keeps %d "
                "(the calibration's %d)",
                t->k, s, u->cur, u->first);
}

void tier_tune_step(tm_tier *t) {
    tier_tune *u = &t->tune;
    const int64_t rows = u->rows;
    u->rows = 0;
    if (!u->on || u->done) return;
    const uint64_t now = tm_time_ns();
    if (rows != 1) { /* prompts and several rows are other steps: the chain breaks */
        u->last_ns = 0;
        return;
    }
    const uint64_t last = u->last_ns;
    u->last_ns = now;
    if (!last) return;
    const int32_t n_max = t->n_pcie < (int32_t)t->k ? t->n_pcie : (int32_t)t->k;
    if (tier_tune_period(u, n_max, (double)(now - last) * 1e-6)) tier_tune_set(t);
    if (u->done) tier_tune_log(t);
}
