/* The hot-cache planner and plan files, against hand-computed plans, an
 * independent reference of the documented scoring (a plain O(n^2) greedy),
 * and properties every plan must have:
 * - flat on a hand-made observation gives the hand-computed plan;
 * - on random observations, every mode equals the reference, never exceeds
 *   the budget, gives no layer more than n_expert or a duplicate, leaves no
 *   unchosen expert that would still fit, and gives non-cacheable layers nothing;
 * - each mode's defining property: flat takes the top shares; pressure
 *   favours the layer whose cold slots cost more wait (or expert time
 *   without a hot/cold split); smooth_pressure damps an outlier; time
 *   favours the slower layer; balanced spreads slots within one per layer;
 *   curve 0 turns every mode but balanced into flat;
 * - JSON round trip; every validation error names the file and the field;
 *   the fuzz corpus (fuzz/corpus/plan): seeds accepted, the rest handled. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "fuzz_corpus.h"
#include "tier/plan.h"
#include "trace/trace.h"

static const char *tmp_dir(void) {
    const char *t = getenv("TM_TEST_TMP");
    return t && *t ? t : "/tmp";
}

static tm_trace_shape shape_of(uint32_t L, uint32_t E, uint32_t k) {
    tm_trace_shape s = {.n_layer = L, .n_expert = E, .n_expert_used = k};
    snprintf(s.arch, sizeof(s.arch), "qwen3moe");
    return s;
}

/* Observations with the given counts [L][E] (tokens = hits / k, rounded up by padding expert 0
 * is not needed: tests use sums divisible by k). */
static void obs_make(tm_trace_stats *s, uint32_t L, uint32_t E, uint32_t k,
                     const uint64_t *counts) {
    tm_trace_shape sh = shape_of(L, E, k);
    assert_int_equal(trace_stats_init(s, &sh, 0), TM_OK);
    for (uint32_t l = 0; l < L; l++) {
        uint64_t sum = 0;
        for (uint32_t e = 0; e < E; e++) sum += s->layers[l].experts[e] = counts[l * E + e];
        s->layers[l].expert_hits_total = sum;
        s->layers[l].tokens = sum / k;
        s->layers[l].calls = 1;
    }
    s->tokens = s->layers[0].tokens;
}

static void test_flat_by_hand(void **state) {
    (void)state;
    /* shares: l0 .5 0 .3 .2 | l1 .1 .1 .1 .7 | l2 .4 .4 .2 0; 10 bytes each, 45 bytes:
     * l1e3 (.7), l0e0 (.5), l2e0 (.4), l2e1 (.4, same share: the lower id... of the same layer) */
    const uint64_t c[12] = {5, 0, 3, 2, 1, 1, 1, 7, 4, 4, 2, 0};
    tm_trace_stats s;
    obs_make(&s, 3, 4, 1, c);
    const uint64_t bytes[3] = {10, 10, 10};
    tm_plan_params p = {
        .mode = TM_PLAN_FLAT, .layer_curve = 1, .budget_bytes = 45, .expert_bytes = bytes};
    tm_plan plan;
    assert_int_equal(plan_make(&s, &p, &plan), TM_OK);
    assert_int_equal(plan.used_bytes, 40);
    assert_int_equal(plan.n_slots[0], 1);
    assert_int_equal(plan.experts[0][0], 0);
    assert_int_equal(plan.n_slots[1], 1);
    assert_int_equal(plan.experts[1][0], 3);
    assert_int_equal(plan.n_slots[2], 2);
    assert_int_equal(plan.experts[2][0], 0);
    assert_int_equal(plan.experts[2][1], 1);
    /* hits on the learn data: (5 + 7 + 4 + 4) / 30 */
    assert_true(fabs(plan_hit_rate(&plan, &s, NULL) - 20.0 / 30) < 1e-12);
    const bool cache[3] = {true, false, true};
    assert_true(fabs(plan_hit_rate(&plan, &s, cache) - 13.0 / 20) < 1e-12);
    plan_free(&plan);
    /* layer 1 not cacheable: its .7 goes; next best l0e2 (.3) and then the .2s:
     * l0e3 and l2e2 tie on share; the lower layer first */
    p.cacheable = cache, p.budget_bytes = 50;
    assert_int_equal(plan_make(&s, &p, &plan), TM_OK);
    assert_int_equal(plan.n_slots[1], 0);
    assert_int_equal(plan.n_slots[0], 3);
    assert_int_equal(plan.experts[0][1], 2);
    assert_int_equal(plan.experts[0][2], 3);
    assert_int_equal(plan.n_slots[2], 2);
    assert_int_equal(plan.used_bytes, 50);
    plan_free(&plan);
    /* a budget of everything: experts without hits come last, lowest id first */
    p.cacheable = NULL, p.budget_bytes = 1000;
    assert_int_equal(plan_make(&s, &p, &plan), TM_OK);
    assert_int_equal(plan.used_bytes, 120);
    assert_int_equal(plan.n_slots[0], 4);
    assert_int_equal(plan.experts[0][3], 1);
    assert_int_equal(plan.experts[2][3], 3);
    plan_free(&plan);
    trace_stats_free(&s);
}

/* ---- the reference: the documented score, an O(n^2) greedy ---- */

static double ref_cost(const tm_trace_stats *s, tm_plan_weighting mode, const bool *use, uint32_t l,
                       bool split) {
    const tm_trace_layer *y = &s->layers[l];
    if (!use[l] || !y->expert_hits_total) return -1;
    if (mode == TM_PLAN_TIME)
        return (double)(y->routing_ns + y->experts_ns + y->merge_ns + y->wait_ns) /
               (double)y->tokens;
    return split ? (double)y->wait_ns / (double)y->cold_slots_total
                 : (double)y->experts_ns / (double)y->expert_hits_total;
}

static void ref_priority(const tm_trace_stats *s, tm_plan_weighting mode, const bool *use,
                         double *P) {
    const uint32_t L = s->shape.n_layer;
    bool split = true, any = false;
    for (uint32_t l = 0; l < L; l++)
        if (use[l] && s->layers[l].expert_hits_total)
            any = true, split = split && s->layers[l].cold_slots_total > 0;
    split = split && any;
    double r[64], v[64];
    uint32_t n = 0;
    for (uint32_t l = 0; l < L; l++) {
        P[l] = 1;
        r[l] = ref_cost(s, mode, use, l, split);
        if (r[l] >= 0) v[n++] = r[l];
    }
    if (mode == TM_PLAN_FLAT || mode == TM_PLAN_BALANCED || !n) return;
    if (mode == TM_PLAN_SMOOTH_PRESSURE) {
        for (uint32_t i = 0; i < n; i++) /* bubble sort: tiny */
            for (uint32_t j = 0; j + 1 < n - i; j++)
                if (v[j] > v[j + 1]) {
                    double t = v[j];
                    v[j] = v[j + 1], v[j + 1] = t;
                }
        const double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        for (uint32_t l = 0; l < L; l++)
            if (r[l] >= 0) r[l] = sqrt(fmin(4, fmax(0.25, med > 0 ? r[l] / med : 1)));
    }
    double mean = 0;
    for (uint32_t l = 0; l < L; l++)
        if (r[l] >= 0) mean += r[l] / n;
    for (uint32_t l = 0; l < L; l++)
        if (r[l] >= 0 && mean > 0) P[l] = r[l] / mean;
}

/* ids chosen by the reference into chosen[l][e] = order of choice + 1 (0: not chosen) */
static uint64_t ref_plan(const tm_trace_stats *s, const tm_plan_params *p, int *chosen) {
    const uint32_t L = s->shape.n_layer, E = s->shape.n_expert;
    bool use[64];
    double P[64];
    for (uint32_t l = 0; l < L; l++)
        use[l] = (!p->cacheable || p->cacheable[l]) && p->expert_bytes[l] > 0;
    ref_priority(s, p->mode, use, P);
    memset(chosen, 0, L * E * sizeof(int));
    bool *done = calloc(L * E, sizeof(bool));
    uint64_t used = 0;
    int order = 0;
    for (;;) { /* pick the best remaining candidate by the documented order */
        int64_t best = -1;
        double bs = 0, bsh = 0;
        bool bh = false;
        for (uint32_t l = 0; l < L; l++) {
            if (!use[l]) continue;
            const tm_trace_layer *y = &s->layers[l];
            for (uint32_t e = 0; e < E; e++) {
                if (done[l * E + e]) continue;
                const bool h = y->experts[e] > 0;
                const double share =
                    y->expert_hits_total ? (double)y->experts[e] / y->expert_hits_total : 0;
                uint32_t rank = 0; /* experts ahead of e in its layer */
                for (uint32_t q = 0; q < E; q++)
                    rank +=
                        y->experts[q] > y->experts[e] || (y->experts[q] == y->experts[e] && q < e);
                const double w = pow(P[l], p->layer_curve) / (double)p->expert_bytes[l];
                const double sc =
                    h ? w * (p->mode == TM_PLAN_BALANCED ? 1.0 / (1 + rank) : share) : w;
                bool better;
                if (best < 0)
                    better = true;
                else {
                    const uint32_t bl = (uint32_t)best / E, be = (uint32_t)best % E;
                    if (h != bh)
                        better = h;
                    else if (sc != bs)
                        better = sc > bs;
                    else if (share != bsh)
                        better = share > bsh;
                    else if (!h && e != be)
                        better = e < be;
                    else
                        better = l < bl || (l == bl && e < be);
                }
                if (better) best = l * E + e, bs = sc, bsh = share, bh = h;
            }
        }
        if (best < 0) break;
        done[best] = true;
        const uint64_t b = p->expert_bytes[best / E];
        if (used + b <= p->budget_bytes) used += b, chosen[best] = ++order;
    }
    free(done);
    return used;
}

static void random_obs(tm_rng *r, tm_trace_stats *s, uint32_t L, uint32_t E, bool split) {
    const uint32_t k = 2;
    uint64_t *c = malloc(L * E * sizeof(uint64_t));
    for (uint32_t l = 0; l < L; l++) {
        uint64_t sum = 0;
        for (uint32_t e = 0; e < E; e++) {
            /* skewed, some zeros, some ties */
            const uint64_t x = tm_rng_u64(r) % 8;
            c[l * E + e] = x < 2 ? 0 : x < 4 ? 3 : tm_rng_u64(r) % 40;
            sum += c[l * E + e];
        }
        if (sum % k) c[l * E] += k - sum % k;
    }
    obs_make(s, L, E, k, c);
    for (uint32_t l = 0; l < L; l++) {
        tm_trace_layer *y = &s->layers[l];
        y->routing_ns = 1000 + tm_rng_u64(r) % 5000;
        y->experts_ns = 1000 + tm_rng_u64(r) % 90000;
        y->merge_ns = tm_rng_u64(r) % 300;
        y->wait_ns = tm_rng_u64(r) % 8000;
        y->cold_slots_total = split ? 1 + y->expert_hits_total / 2 : 0;
    }
    free(c);
}

static void check_plan(const tm_trace_stats *s, const tm_plan_params *p, const tm_plan *plan,
                       const int *chosen, uint64_t ref_used) {
    const uint32_t L = s->shape.n_layer, E = s->shape.n_expert;
    assert_true(plan->used_bytes <= p->budget_bytes);
    assert_int_equal(plan->used_bytes, ref_used);
    uint64_t used = 0, min_left = UINT64_MAX;
    for (uint32_t l = 0; l < L; l++) {
        const bool use = (!p->cacheable || p->cacheable[l]) && p->expert_bytes[l] > 0;
        assert_true(plan->n_slots[l] >= 0 && (uint32_t)plan->n_slots[l] <= E);
        if (!use) assert_int_equal(plan->n_slots[l], 0);
        bool seen[64] = {0};
        int32_t n_ref = 0, last = 0;
        for (uint32_t e = 0; e < E; e++) n_ref += chosen[l * E + e] > 0;
        assert_int_equal(plan->n_slots[l], n_ref);
        for (int32_t i = 0; i < plan->n_slots[l]; i++) {
            const int32_t e = plan->experts[l][i];
            assert_true(e >= 0 && (uint32_t)e < E && !seen[e]);
            seen[e] = true;
            assert_true(chosen[l * E + e] > last); /* the reference's order: best first */
            last = chosen[l * E + e];
        }
        used += (uint64_t)plan->n_slots[l] * p->expert_bytes[l];
        if (use && (uint32_t)plan->n_slots[l] < E && p->expert_bytes[l] < min_left)
            min_left = p->expert_bytes[l];
    }
    assert_int_equal(used, plan->used_bytes);
    /* greedy to the end: nothing left out would still fit */
    if (min_left != UINT64_MAX) assert_true(min_left > p->budget_bytes - plan->used_bytes);
}

static void test_modes_against_reference(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 11);
    int *chosen = malloc(8 * 24 * sizeof(int));
    for (int it = 0; it < 300; it++) {
        const uint32_t L = 1 + (uint32_t)(tm_rng_u64(&r) % 8),
                       E = 2 + (uint32_t)(tm_rng_u64(&r) % 23);
        tm_trace_stats s;
        random_obs(&r, &s, L, E, it % 3 == 0);
        uint64_t bytes[8];
        bool cache[8];
        for (uint32_t l = 0; l < L; l++) {
            bytes[l] = it % 2 ? 100 : 50 + tm_rng_u64(&r) % 200;
            cache[l] = tm_rng_u64(&r) % 5 != 0;
        }
        if (it % 7 == 0) bytes[0] = 0; /* a layer without experts */
        tm_plan_params p = {.mode = (tm_plan_weighting)(it % TM_PLAN_WEIGHTING_COUNT),
                            .layer_curve = (double)(tm_rng_u64(&r) % 5) / 2,
                            .budget_bytes = tm_rng_u64(&r) % (L * E * 120 + 1),
                            .expert_bytes = bytes,
                            .cacheable = it % 4 ? cache : NULL};
        tm_plan plan;
        assert_int_equal(plan_make(&s, &p, &plan), TM_OK);
        const uint64_t ref_used = ref_plan(&s, &p, chosen);
        check_plan(&s, &p, &plan, chosen, ref_used);
        plan_free(&plan);
        trace_stats_free(&s);
    }
    free(chosen);
}

/* Two layers with the same counts; n_slots of each under a mode. */
static void two_layer_slots(const tm_trace_stats *s, tm_plan_weighting mode, double curve,
                            uint64_t budget, int32_t *n0, int32_t *n1) {
    const uint64_t bytes[4] = {1, 1, 1, 1};
    tm_plan_params p = {
        .mode = mode, .layer_curve = curve, .budget_bytes = budget, .expert_bytes = bytes};
    tm_plan plan;
    assert_int_equal(plan_make(s, &p, &plan), TM_OK);
    *n0 = plan.n_slots[0], *n1 = plan.n_slots[1];
    plan_free(&plan);
}

static void test_mode_properties(void **state) {
    (void)state;
    /* 4 layers, 16 experts, identical skewed counts */
    uint64_t c[4 * 16];
    for (int l = 0; l < 4; l++)
        for (int e = 0; e < 16; e++) c[l * 16 + e] = 64 >> (e / 3);
    tm_trace_stats s;
    obs_make(&s, 4, 16, 1, c);
    for (int l = 0; l < 4; l++) s.layers[l].experts_ns = 1000, s.layers[l].routing_ns = 100;
    int32_t a, b;
    /* flat: identical layers get the same slots (20 over 4 layers: the top 3 of each, then
     * the next share's ties to the lower layers: 6, 6, 5, 3) */
    two_layer_slots(&s, TM_PLAN_FLAT, 1, 20, &a, &b);
    assert_int_equal(a, 6);
    assert_int_equal(b, 6);
    /* pressure without a hot/cold split: expert time per routed slot; layer 0 slower */
    s.layers[0].experts_ns = 8000;
    two_layer_slots(&s, TM_PLAN_PRESSURE, 1, 20, &a, &b);
    assert_true(a > b);
    /* ... curve 0: flat again */
    two_layer_slots(&s, TM_PLAN_PRESSURE, 0, 20, &a, &b);
    assert_int_equal(a, b);
    /* with a split, wait per cold slot decides: layer 1 waits longer per cold slot */
    for (int l = 0; l < 4; l++) s.layers[l].cold_slots_total = 100, s.layers[l].wait_ns = 1000;
    s.layers[1].wait_ns = 9000;
    two_layer_slots(&s, TM_PLAN_PRESSURE, 1, 20, &a, &b);
    assert_true(b > a);
    /* smooth_pressure: an outlier (100x) gets less than under pressure, still more than the
     * rest (pressure: all 16 of its experts first; smooth: priority 2x the others', so
     * 3, the others' 3 each, its next 3, then one more: 6 and 4) */
    s.layers[1].wait_ns = 100000;
    int32_t pa, pb, sa, sb;
    two_layer_slots(&s, TM_PLAN_PRESSURE, 1, 16, &pa, &pb);
    two_layer_slots(&s, TM_PLAN_SMOOTH_PRESSURE, 1, 16, &sa, &sb);
    assert_int_equal(pb, 16);
    assert_int_equal(pa, 0);
    assert_int_equal(sb, 6);
    assert_int_equal(sa, 4);
    /* time: total MoE time per token; layer 2 and 3 equal, layer 3 slowest */
    for (int l = 0; l < 4; l++) s.layers[l].cold_slots_total = 0, s.layers[l].wait_ns = 0;
    s.layers[0].experts_ns = 1000;
    s.layers[3].experts_ns = 5000;
    {
        const uint64_t bytes[4] = {1, 1, 1, 1};
        tm_plan_params p = {
            .mode = TM_PLAN_TIME, .layer_curve = 1, .budget_bytes = 18, .expert_bytes = bytes};
        tm_plan plan;
        assert_int_equal(plan_make(&s, &p, &plan), TM_OK);
        assert_int_equal(plan.n_slots[3], 9);
        assert_int_equal(plan.n_slots[0], 3);
        assert_int_equal(plan.n_slots[2], 3);
        plan_free(&plan);
    }
    trace_stats_free(&s);
    /* balanced: slots within one of each other even when flat would not spread them */
    for (int e = 0; e < 16; e++) c[e] = e == 0 ? 1000 : 1, c[16 + e] = 50 - e;
    for (int l = 2; l < 4; l++)
        for (int e = 0; e < 16; e++) c[l * 16 + e] = 1 + (uint64_t)(e * 7 % 5);
    obs_make(&s, 4, 16, 1, c);
    for (uint64_t budget = 1; budget <= 64; budget++) {
        const uint64_t bytes[4] = {1, 1, 1, 1};
        tm_plan_params p = {.mode = TM_PLAN_BALANCED,
                            .layer_curve = 1,
                            .budget_bytes = budget,
                            .expert_bytes = bytes};
        tm_plan plan;
        assert_int_equal(plan_make(&s, &p, &plan), TM_OK);
        int32_t lo = 99, hi = 0;
        for (int l = 0; l < 4; l++)
            lo = plan.n_slots[l] < lo ? plan.n_slots[l] : lo,
            hi = plan.n_slots[l] > hi ? plan.n_slots[l] : hi;
        assert_true(hi - lo <= 1);
        assert_int_equal(plan.used_bytes, budget);
        /* each layer's own best first */
        if (plan.n_slots[0]) assert_int_equal(plan.experts[0][0], 0);
        plan_free(&plan);
    }
    /* flat on the same counts does not spread: l0's one big expert, then layers 2 and 3 */
    {
        const uint64_t bytes[4] = {1, 1, 1, 1};
        tm_plan_params p = {
            .mode = TM_PLAN_FLAT, .layer_curve = 1, .budget_bytes = 8, .expert_bytes = bytes};
        tm_plan plan;
        assert_int_equal(plan_make(&s, &p, &plan), TM_OK);
        assert_int_equal(plan.n_slots[0], 1);
        assert_int_equal(plan.n_slots[1], 0);
        assert_int_equal(plan.n_slots[2], 4);
        assert_int_equal(plan.n_slots[3], 3);
        plan_free(&plan);
    }
    trace_stats_free(&s);
}

static void test_bad_params(void **state) {
    (void)state;
    const uint64_t c[4] = {1, 1, 1, 1};
    tm_trace_stats s;
    obs_make(&s, 1, 4, 1, c);
    const uint64_t bytes[1] = {1};
    tm_plan plan;
    tm_plan_params p = {
        .mode = TM_PLAN_FLAT, .layer_curve = -1, .budget_bytes = 4, .expert_bytes = bytes};
    assert_int_equal(plan_make(&s, &p, &plan), TM_ERR_ARG);
    p.layer_curve = NAN;
    assert_int_equal(plan_make(&s, &p, &plan), TM_ERR_ARG);
    p.layer_curve = 1, p.mode = TM_PLAN_WEIGHTING_COUNT;
    assert_int_equal(plan_make(&s, &p, &plan), TM_ERR_ARG);
    for (int m = 0; m < TM_PLAN_WEIGHTING_COUNT; m++) {
        tm_plan_weighting w;
        assert_int_equal(plan_weighting_parse(plan_weighting_name((tm_plan_weighting)m), &w),
                         TM_OK);
        assert_int_equal(w, m);
    }
    tm_plan_weighting w;
    assert_int_equal(plan_weighting_parse("hot", &w), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "\"hot\""));
    trace_stats_free(&s);
    /* plan_set_layer refuses duplicates and ids out of range */
    tm_trace_shape sh = shape_of(2, 4, 1);
    assert_int_equal(plan_init(&plan, &sh), TM_OK);
    const int32_t dup[2] = {1, 1}, out[1] = {4}, ok[3] = {3, 0, 2};
    assert_int_equal(plan_set_layer(&plan, 0, dup, 2, 10), TM_ERR_ARG);
    assert_int_equal(plan_set_layer(&plan, 0, out, 1, 10), TM_ERR_ARG);
    assert_int_equal(plan_set_layer(&plan, 2, ok, 3, 10), TM_ERR_ARG);
    assert_int_equal(plan_set_layer(&plan, 1, ok, 3, 10), TM_OK);
    assert_int_equal(plan.used_bytes, 30);
    plan_free(&plan);
}

/* ---- files ---- */

static void plans_equal(const tm_plan *a, const tm_plan *b) {
    assert_string_equal(a->shape.arch, b->shape.arch);
    assert_int_equal(a->shape.n_layer, b->shape.n_layer);
    assert_int_equal(a->shape.n_expert, b->shape.n_expert);
    assert_int_equal(a->shape.n_expert_used, b->shape.n_expert_used);
    assert_int_equal(a->mode, b->mode);
    assert_true(a->layer_curve == b->layer_curve);
    assert_int_equal(a->budget_bytes, b->budget_bytes);
    assert_int_equal(a->used_bytes, b->used_bytes);
    for (uint32_t l = 0; l < a->shape.n_layer; l++) {
        assert_int_equal(a->n_slots[l], b->n_slots[l]);
        assert_int_equal(a->expert_bytes[l], b->expert_bytes[l]);
        for (int32_t i = 0; i < a->n_slots[l]; i++)
            assert_int_equal(a->experts[l][i], b->experts[l][i]);
    }
}

static void test_json_round_trip(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 5);
    tm_trace_stats s;
    random_obs(&r, &s, 6, 20, false);
    const uint64_t bytes[6] = {2654208, 2654208, 0, 2654208, 3000000, 2654208};
    tm_plan_params p = {.mode = TM_PLAN_SMOOTH_PRESSURE,
                        .layer_curve = 0.7,
                        .budget_bytes = 100000000,
                        .expert_bytes = bytes};
    tm_plan plan, back;
    assert_int_equal(plan_make(&s, &p, &plan), TM_OK);
    char path[512];
    snprintf(path, sizeof(path), "%s/plan_round.json", tmp_dir());
    assert_int_equal(plan_write_json(&plan, path), TM_OK);
    assert_int_equal(plan_read_json(path, &s.shape, &back), TM_OK);
    plans_equal(&plan, &back);
    plan_free(&back);
    /* one layer a line */
    FILE *f = fopen(path, "r");
    int lines = 0, ch;
    while ((ch = fgetc(f)) != EOF) lines += ch == '\n';
    fclose(f);
    assert_int_equal(lines, 1 + 6 + 1); /* header, a line per layer, the closing brackets */
    json_t *j = plan_to_json(&plan);
    assert_int_equal(plan_from_json(j, "mem", NULL, &back), TM_OK);
    plans_equal(&plan, &back);
    plan_free(&back);
    json_decref(j);
    plan_free(&plan);
    trace_stats_free(&s);
    remove(path);
}

/* A small valid plan as text with one field replaced: key "KEY" -> value. */
static const char *good_plan =
    "{\"format\":\"tiermoe-moe-plan\",\"version\":1,"
    "\"model\":{\"arch\":\"qwen3moe\",\"n_layer\":2,\"n_expert\":8,\"n_expert_used\":2},"
    "\"weighting\":\"flat\",\"layer_curve\":1.0,\"budget_bytes\":100,\"used_bytes\":50,"
    "\"layers\":[{\"layer\":0,\"expert_bytes\":10,\"experts\":[3,1,7]},"
    "{\"layer\":1,\"expert_bytes\":10,\"experts\":[0,2]}]}";

static void expect_bad(const char *from, const char *to, const tm_trace_shape *expect,
                       tm_status want, const char *msg) {
    char text[2048];
    const char *at = strstr(good_plan, from);
    assert_non_null(at);
    snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - good_plan), good_plan, to,
             at + strlen(from));
    tm_plan plan;
    const tm_status st = plan_parse_json(text, strlen(text), "plan.json", expect, &plan);
    if (st != want || !strstr(tm_error_message(), msg) ||
        strncmp(tm_error_message(), "plan.json: ", 11)) {
        fprintf(stderr, "case '%s' -> '%s': status %d, message: %s (wanted '%s')\n", from, to, st,
                tm_error_message(), msg);
        fail();
    }
}

static void test_bad_files(void **state) {
    (void)state;
    tm_plan plan;
    assert_int_equal(plan_parse_json(good_plan, strlen(good_plan), "plan.json", NULL, &plan),
                     TM_OK);
    assert_int_equal(plan.n_slots[0], 3);
    assert_int_equal(plan.experts[0][2], 7);
    plan_free(&plan);
    const tm_trace_shape want = shape_of(2, 8, 2), other_e = shape_of(2, 16, 2),
                         other_l = shape_of(3, 8, 2), other_k = shape_of(2, 8, 4);
    tm_trace_shape other_arch = want;
    snprintf(other_arch.arch, sizeof(other_arch.arch), "gpt-oss");
    expect_bad("[3,1,7]", "[3,1,8]", NULL, TM_ERR_FORMAT, "layers[0].experts[2]: expert 8 of 8");
    expect_bad("[3,1,7]", "[3,-1,7]", NULL, TM_ERR_FORMAT, "layers[0].experts[1]: expert -1 of 8");
    expect_bad("[3,1,7]", "[3,1,3]", NULL, TM_ERR_FORMAT,
               "layers[0].experts[2]: expert 3 is listed twice");
    expect_bad("[3,1,7]", "[3,\"1\",7]", NULL, TM_ERR_FORMAT,
               "layers[0].experts[1]: expected an integer");
    expect_bad("[3,1,7]", "[0,1,2,3,4,5,6,7,0]", NULL, TM_ERR_FORMAT,
               "layers[0].experts: 9 entries");
    expect_bad("\"flat\"", "\"hot\"", NULL, TM_ERR_FORMAT,
               "weighting: unknown weighting mode \"hot\"");
    expect_bad("\"flat\"", "3", NULL, TM_ERR_FORMAT, "weighting: missing or not a string");
    expect_bad("\"layer_curve\":1.0", "\"layer_curve\":-1", NULL, TM_ERR_FORMAT, "layer_curve");
    expect_bad("\"used_bytes\":50", "\"used_bytes\":40", NULL, TM_ERR_FORMAT,
               "used_bytes: is 40, the layers' experts * expert_bytes sum to 50");
    expect_bad("\"budget_bytes\":100", "\"budget_bytes\":49", NULL, TM_ERR_FORMAT,
               "used_bytes: 50 exceed budget_bytes 49");
    expect_bad("\"budget_bytes\":100", "\"budget_bytes\":-1", NULL, TM_ERR_FORMAT,
               "budget_bytes: expected a non-negative integer");
    expect_bad("\"layer\":1,", "\"layer\":0,", NULL, TM_ERR_FORMAT,
               "layers[1].layer: is 0, expected 1");
    expect_bad("\"expert_bytes\":10,\"experts\":[0,2]", "\"expert_bytes\":0,\"experts\":[0,2]",
               NULL, TM_ERR_FORMAT, "layers[1].expert_bytes: 0, but the layer has experts");
    expect_bad("\"expert_bytes\":10,\"experts\":[0,2]", "\"experts\":[0,2]", NULL, TM_ERR_FORMAT,
               "layers[1].expert_bytes: missing");
    expect_bad(",{\"layer\":1,\"expert_bytes\":10,\"experts\":[0,2]}", "", NULL, TM_ERR_FORMAT,
               "layers: 1 entries, model.n_layer is 2");
    expect_bad("\"experts\":[0,2]", "\"experts\":{}", NULL, TM_ERR_FORMAT,
               "layers[1].experts: missing or not an array");
    expect_bad("tiermoe-moe-plan", "tiermoe-moe-layer-perf", NULL, TM_ERR_FORMAT,
               "format: expected");
    expect_bad("\"version\":1", "\"version\":2", NULL, TM_ERR_UNSUPPORTED, "version: 2");
    expect_bad("\"n_expert\":8", "\"n_expert\":0", NULL, TM_ERR_FORMAT, "model: unsupported shape");
    expect_bad("\"n_expert_used\":2", "\"n_expert_used\":9", NULL, TM_ERR_FORMAT,
               "model: unsupported shape");
    expect_bad("\"arch\":\"qwen3moe\"", "\"arch\":7", NULL, TM_ERR_FORMAT, "model.arch");
    expect_bad("{\"format\"", "[{\"format\"", NULL, TM_ERR_FORMAT, "not valid JSON");
    expect_bad("]}]}", "]}]", NULL, TM_ERR_FORMAT, "not valid JSON"); /* truncated */
    expect_bad("\"version\":1,", "\"version\":1,\"version\":1,", NULL, TM_ERR_FORMAT,
               "not valid JSON");
    expect_bad("{\"format\":\"tiermoe-moe-plan\",", "[", NULL, TM_ERR_FORMAT, "not valid JSON");
    /* another model */
    expect_bad("\"version\":1", "\"version\":1", &other_e, TM_ERR_FORMAT,
               "model.n_expert is 8, the model has 16");
    expect_bad("\"version\":1", "\"version\":1", &other_l, TM_ERR_FORMAT,
               "model.n_layer is 2, the model has 3");
    expect_bad("\"version\":1", "\"version\":1", &other_k, TM_ERR_FORMAT,
               "model.n_expert_used is 2, the model has 4");
    expect_bad("\"version\":1", "\"version\":1", &other_arch, TM_ERR_FORMAT,
               "model.arch is \"qwen3moe\", the model is \"gpt-oss\"");
    assert_int_equal(plan_parse_json(good_plan, strlen(good_plan), "plan.json", &want, &plan),
                     TM_OK);
    plan_free(&plan);
    /* a missing file, a truncated file */
    char path[512];
    snprintf(path, sizeof(path), "%s/plan_missing.json", tmp_dir());
    remove(path);
    assert_int_equal(plan_read_json(path, NULL, &plan), TM_ERR_IO);
    assert_non_null(strstr(tm_error_message(), "plan_missing.json"));
    FILE *f = fopen(path, "w");
    fwrite(good_plan, 1, strlen(good_plan) / 2, f);
    fclose(f);
    assert_int_equal(plan_read_json(path, NULL, &plan), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "plan_missing.json: not valid JSON"));
    remove(path);
}

static void corpus_plan(const uint8_t *d, size_t n, bool seed) {
    tm_plan plan;
    const tm_status st = plan_parse_json((const char *)d, n, "corpus", NULL, &plan);
    if (seed) assert_int_equal(st, TM_OK);
    if (st == TM_OK) plan_free(&plan);
}

static void test_fuzz_corpus(void **state) {
    (void)state;
    corpus_each("plan", corpus_plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flat_by_hand),    cmocka_unit_test(test_modes_against_reference),
        cmocka_unit_test(test_mode_properties), cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_fuzz_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
