/* The tier's pieces that need no GPU, against plain reference code written
 * here: a prompt step's worklist by lane (tier_worklist_partition), and the
 * split of a worklist into the CPU lane's cold slots, the PCIe lane's (the
 * first n cold slots of each decode token) and the GPU's hot ones
 * (tier_worklist_split: CPU, PCIe, hot, each in its previous order, so an
 * expert's run stays whole), and a decode step's cold slots grouped by expert
 * (tier_worklist_group), and the search of the PCIe lane's decode share
 * (tier_tune.h) on made-up step times. The lanes and the merge run end to end
 * in test_mock_placement. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "tier/tier.h"
#include "tier/tier_tune.h"

/* ---- tier_worklist_partition ---- */

/* A prompt step's slots by the lane of their expert: the CPU's, the GPU's
 * RAM experts' (fetch lane), the hot ones; each lane's slots in their order
 * before, against a stable filter. */
static void test_worklist_partition(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 5);
    for (int c = 0; c < 200; c++) {
        const uint32_t n_expert = 1 + (uint32_t)(tm_rng_u64(&r) % 64);
        const uint32_t k = 1 + (uint32_t)(tm_rng_u64(&r) % (n_expert < 8 ? n_expert : 8));
        const int64_t n_tok = 1 + (int64_t)(tm_rng_u64(&r) % 40);
        int32_t *ids = malloc((size_t)(n_tok * k) * sizeof(int32_t));
        float *w = malloc((size_t)(n_tok * k) * sizeof(float));
        for (int64_t t = 0; t < n_tok; t++) { /* k distinct experts a token: a run from s0 */
            const uint32_t s0 = (uint32_t)(tm_rng_u64(&r) % n_expert);
            for (uint32_t j = 0; j < k; j++)
                ids[t * k + j] = (int32_t)((s0 + j) % n_expert),
                            w[t * k + j] = (float)(t * 100 + j);
        }
        int32_t *lane = malloc(n_expert * sizeof(int32_t));
        for (uint32_t e = 0; e < n_expert; e++) lane[e] = (int32_t)(tm_rng_u64(&r) % 3);
        tm_moe_worklist wl = {0};
        assert_int_equal(moe_worklist_build(&wl, ids, w, n_tok, n_expert, k, TM_MOE_PHASE_PROMPT),
                         TM_OK);
        const int64_t n = wl.n_slots;
        tm_moe_slot *before = malloc((size_t)n * sizeof(*before)),
                    *tmp = malloc((size_t)n * sizeof(*tmp));
        memcpy(before, wl.slots, (size_t)n * sizeof(*before));
        int64_t counts[3];
        tier_worklist_partition(&wl, lane, tmp, counts);
        int64_t at = 0;
        for (int l = 0; l < 3; l++) {
            int64_t want = 0;
            for (int64_t i = 0; i < n; i++) {
                if (lane[before[i].expert] != l) continue;
                want++;
                const tm_moe_slot *g = &wl.slots[at++];
                if (g->token != before[i].token || g->expert != before[i].expert ||
                    g->weight != before[i].weight)
                    fail_msg("case %d: lane %d, slot %lld out of order", c, l, (long long)(at - 1));
            }
            assert_int_equal(counts[l], want);
        }
        assert_int_equal(at, n);
        moe_worklist_free(&wl);
        free(ids), free(w), free(lane), free(before), free(tmp);
    }
}

/* ---- tier_worklist_split ---- */

static void check_split(tm_rng *r, tm_moe_phase phase, int c) {
    const uint32_t n_expert = 1 + (uint32_t)(tm_rng_u64(r) % 64);
    const uint32_t k = 1 + (uint32_t)(tm_rng_u64(r) % (n_expert < 8 ? n_expert : 8));
    const int64_t n_tok = 1 + (int64_t)(tm_rng_u64(r) % 40);
    int32_t *ids = malloc((size_t)(n_tok * k) * sizeof(int32_t));
    float *w = malloc((size_t)(n_tok * k) * sizeof(float));
    for (int64_t t = 0; t < n_tok; t++) /* k distinct experts a token, as a router gives */
        for (uint32_t j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(tm_rng_u64(r) % n_expert);
                dup = false;
                for (uint32_t i = 0; i < j; i++) dup |= ids[t * k + i] == e;
            } while (dup);
            ids[t * k + j] = e, w[t * k + j] = (float)(t * 100 + j);
        }
    int32_t *map = malloc(n_expert * sizeof(int32_t));
    const int mode = c % 4; /* all cold, all hot, mixed, mixed with every other */
    for (uint32_t e = 0; e < n_expert; e++)
        map[e] = mode == 0   ? -1
                 : mode == 1 ? (int32_t)e
                 : mode == 2 ? (tm_rng_u64(r) % 2 ? (int32_t)e : -1)
                             : (e % 2 ? 7 : -1);
    tm_moe_worklist wl = {0};
    assert_int_equal(moe_worklist_build(&wl, ids, w, n_tok, n_expert, k, phase), TM_OK);
    const int64_t n = wl.n_slots;
    tm_moe_slot *before = malloc((size_t)n * sizeof(*before)),
                *tmp = malloc((size_t)n * sizeof(*tmp));
    memcpy(before, wl.slots, (size_t)n * sizeof(*before));
    /* the PCIe lane takes slots of decode (token-major) worklists only */
    const int32_t n_mapped = wl.expert_major ? 0 : (int32_t)(tm_rng_u64(r) % (k + 1));
    /* a share of each token's cold slots (at most n_mapped), or n_mapped each */
    const int32_t share = c % 3 == 0 ? 0 : c % 3 == 1 ? 85 : (int32_t)(1 + tm_rng_u64(r) % 256);
    int64_t n_pcie = -1;
    const int64_t n_cold = tier_worklist_split(&wl, map, n_mapped, share, tmp, &n_pcie);
    /* the reference: a stable filter by lane; a cold slot is the PCIe lane's
     * when fewer than n_mapped cold slots of its token come before it */
    int64_t at = 0, want[3] = {0, 0, 0};
    for (int pass = 0; pass < 3; pass++)
        for (int64_t i = 0; i < n; i++) {
            int lane = 2;
            if (map[before[i].expert] < 0) {
                int64_t before_cold = 0, token_cold = 0;
                for (int64_t j = 0; j < n; j++) {
                    const bool c_j =
                        before[j].token == before[i].token && map[before[j].expert] < 0;
                    before_cold += j < i && c_j, token_cold += c_j;
                }
                /* the token's count (test_calib checks it against every count) */
                const int64_t limit = tm_cuda_mapped_count((int32_t)token_cold, n_mapped, share);
                lane = before_cold < limit ? 1 : 0;
            }
            if (lane != pass) continue;
            want[pass]++;
            const tm_moe_slot *got = &wl.slots[at++];
            if (got->token != before[i].token || got->expert != before[i].expert ||
                got->weight != before[i].weight)
                fail_msg("case %d: slot %lld is {%d, %d, %g}, want {%d, %d, %g}", c,
                         (long long)(at - 1), got->token, got->expert, got->weight, before[i].token,
                         before[i].expert, before[i].weight);
        }
    assert_int_equal(n_cold, want[0]);
    assert_int_equal(n_pcie, want[1]);
    if (wl.expert_major) /* each expert's slots stay one run */
        for (int64_t i = 1; i < n; i++)
            for (int64_t j = 0; j + 1 < i; j++)
                if (wl.slots[j].expert == wl.slots[i].expert &&
                    wl.slots[i - 1].expert != wl.slots[i].expert)
                    fail_msg("case %d: expert %d's run is broken at slot %lld", c,
                             wl.slots[i].expert, (long long)i);
    /* no map: every slot cold, nothing moves */
    memcpy(wl.slots, before, (size_t)n * sizeof(*before));
    assert_int_equal(tier_worklist_split(&wl, NULL, 0, 0, tmp, &n_pcie), n);
    assert_int_equal(n_pcie, 0);
    assert_memory_equal(wl.slots, before, (size_t)n * sizeof(*before));
    moe_worklist_free(&wl);
    free(ids), free(w), free(map), free(before), free(tmp);
}

static void test_worklist_split(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 11);
    for (int c = 0; c < 400; c++)
        check_split(&r, c % 2 ? TM_MOE_PHASE_PROMPT : TM_MOE_PHASE_DECODE, c);
}

/* ---- tier_worklist_group ---- */

/* A decode step of several rows: its first n slots grouped by expert against a
 * stable sort written here (each expert's slots in their order before: tokens
 * ascending), the rest untouched, the list expert-major. */
static void test_worklist_group(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 17);
    for (int c = 0; c < 200; c++) {
        const uint32_t n_expert = 1 + (uint32_t)(tm_rng_u64(&r) % 32);
        const uint32_t k = 1 + (uint32_t)(tm_rng_u64(&r) % (n_expert < 8 ? n_expert : 8));
        const int64_t n_tok = 1 + (int64_t)(tm_rng_u64(&r) % 8), N = n_tok * k;
        int32_t ids[64];
        float w[64];
        for (int64_t t = 0; t < n_tok; t++) { /* k distinct experts a token */
            const uint32_t s0 = (uint32_t)(tm_rng_u64(&r) % n_expert);
            for (uint32_t j = 0; j < k; j++)
                ids[t * k + j] = (int32_t)((s0 + 3 * j) % n_expert),
                            w[t * k + j] = (float)(t * k + j);
        }
        tm_moe_worklist wl = {0};
        assert_int_equal(moe_worklist_build(&wl, ids, w, n_tok, n_expert, k, TM_MOE_PHASE_DECODE),
                         TM_OK);
        const int64_t n = (int64_t)(tm_rng_u64(&r) % (uint64_t)(N + 1));
        tm_moe_slot before[64], want[64];
        memcpy(before, wl.slots, (size_t)N * sizeof(*before));
        int64_t m = 0; /* stable: by expert, then the order before */
        for (uint32_t e = 0; e < n_expert; e++)
            for (int64_t i = 0; i < n; i++)
                if (before[i].expert == (int32_t)e) want[m++] = before[i];
        tier_worklist_group(&wl, n);
        assert_true(wl.expert_major);
        for (int64_t i = 0; i < N; i++) {
            const tm_moe_slot *g = &wl.slots[i], *x = i < n ? &want[i] : &before[i];
            if (g->expert != x->expert || g->token != x->token || g->weight != x->weight)
                fail_msg(
                    "case %d: slot %lld of %lld (%lld grouped): expert %d token %d, want %d %d", c,
                    (long long)i, (long long)N, (long long)n, g->expert, g->token, x->expert,
                    x->token);
        }
        moe_worklist_free(&wl);
    }
}

/* ---- tier_tune ---- */

/* The share for i of k slots gives i of k (tm_cuda_mapped_count), for every k the
 * router takes. */
static void test_tune_share(void **state) {
    (void)state;
    for (int32_t k = 1; k <= TM_CUDA_ROUTER_MAX_USED; k++)
        for (int32_t i = 0; i <= k; i++) {
            const int32_t s = tier_tune_share(k, i);
            if (s < 1 || s > 255 || tm_cuda_mapped_count(k, k, s) != i)
                fail_msg("k %d, %d slots: share %d gives %d", k, i, s,
                         tm_cuda_mapped_count(k, k, s));
        }
}

/* Step times of a made-up machine: a valley at `best` slots (1 ms a slot away from it),
 * 5% noise on some steps (the median leaves them out), flat within 1% from `flat` on. */
static double tune_ms(int32_t i, int32_t best, int32_t flat, int step) {
    const int32_t d = i > best ? i - best : best - i;
    double ms = 10.0 + d;
    if (flat >= 0 && i >= flat) ms = 10.0 + (flat > best ? flat - best : best - flat) - 0.05 * i;
    return step % 4 == 3 ? ms * 1.05 : ms;
}

static int32_t tune_run(int32_t n_max, int32_t first, int32_t best, int32_t flat, int *steps) {
    tier_tune u;
    tier_tune_start(&u, first, TIER_TUNE_WINDOW);
    int s = 0;
    while (!u.done && s < 1000) tier_tune_period(&u, n_max, tune_ms(u.cur, best, flat, s++));
    *steps = s;
    return u.done ? u.cur : -1;
}

/* From any start the search settles on the valley's floor, a window a candidate
 * timed; where more slots are within 2% it keeps fewer. */
static void test_tune_search(void **state) {
    (void)state;
    for (int32_t n_max = 1; n_max <= 8; n_max++)
        for (int32_t best = 0; best <= n_max; best++)
            for (int32_t first = 0; first <= n_max; first++) {
                int steps = 0;
                const int32_t got = tune_run(n_max, first, best, -1, &steps);
                if (got != best || steps > (best + 4) * (TIER_TUNE_WINDOW + 1))
                    fail_msg("n_max %d, valley at %d, from %d: settled on %d after %d steps", n_max,
                             best, first, got, steps);
            }
    int steps = 0; /* 3 and up within 1% of each other: 3 */
    assert_int_equal(tune_run(8, 6, 3, 3, &steps), 3);
    /* a second, shallower valley at the calibration's 6: the lane off is timed too, and
       the search climbs from there to the deeper one */
    static const double bumpy[9] = {10.5, 10, 11, 14, 15, 16, 13, 16, 17};
    tier_tune u;
    tier_tune_start(&u, 6, TIER_TUNE_WINDOW);
    for (int s = 0; !u.done && s < 1000; s++) tier_tune_period(&u, 8, bumpy[u.cur]);
    assert_true(u.done);
    assert_int_equal(u.cur, 1);
    assert_int_equal(tier_tune_count(&u), 4); /* 6, 0, 1, 2 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worklist_partition), cmocka_unit_test(test_worklist_split),
        cmocka_unit_test(test_worklist_group),     cmocka_unit_test(test_tune_share),
        cmocka_unit_test(test_tune_search),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
