/* Samplers, the MoE router and worklists, checked against properties that must hold:
 * - greedy is the first argmax; top-k 1 is greedy at any temperature;
 * - at temperature 1 with no filters, the sampled frequencies match softmax(logits)
 *   (chi-square over 200k draws, 0.1% critical value);
 * - top-k / top-p / min-p never return a token outside the set their rule keeps;
 * - top-k (a partial selection) draws exactly what the full sort draws when every
 *   token outside the top k has logit -inf, on a large vocabulary with many ties;
 * - the repetition penalty divides positive and multiplies negative logits once;
 * - router: ids are the k most probable experts in order, weights renormalise to 1,
 *   sigmoid and softmax-over-top-k gatings match their definitions;
 * - worklists: expert-major lists are grouped by expert with tokens ascending and
 *   hold every (token, expert, weight) exactly once; decode lists keep token order. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "cpu/cpu.h"
#include "moe/moe.h"
#include "sample/sample.h"

#define NV 50

static void random_logits(float *l, int n, uint64_t seed) {
    tm_rng r;
    tm_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) l[i] = 3.0f * tm_rng_normal(&r);
}

static void test_greedy_and_topk1(void **state) {
    (void)state;
    float l[NV];
    random_logits(l, NV, 1);
    l[17] = l[33] = 100; /* a tie: the first wins */
    tm_sampler s;
    tm_sampler_params p;
    sample_params_default(&p);
    p.temp = 0;
    assert_int_equal(sampler_init(&s, &p, NV), TM_OK);
    assert_int_equal(sampler_sample(&s, l, NULL, 0), 17);
    sampler_free(&s);
    p.temp = 1.5f, p.top_k = 1, p.top_p = 1, p.min_p = 0;
    assert_int_equal(sampler_init(&s, &p, NV), TM_OK);
    for (int i = 0; i < 100; i++) assert_int_equal(sampler_sample(&s, l, NULL, 0), 17);
    sampler_free(&s);
}

static void test_distribution(void **state) {
    (void)state;
    float l[NV];
    random_logits(l, NV, 2);
    for (int i = 0; i < NV; i++) l[i] *= 0.4f; /* flatter: every token gets draws */
    tm_sampler s;
    tm_sampler_params p = {
        .temp = 1, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1, .seed = 3};
    assert_int_equal(sampler_init(&s, &p, NV), TM_OK);
    enum { N = 200000 };
    static int count[NV];
    memset(count, 0, sizeof(count));
    for (int i = 0; i < N; i++) count[sampler_sample(&s, l, NULL, 0)]++;
    double z = 0, m = -1e30, chi2 = 0;
    for (int i = 0; i < NV; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < NV; i++) z += exp(l[i] - m);
    for (int i = 0; i < NV; i++) {
        double e = N * exp(l[i] - m) / z;
        chi2 += (count[i] - e) * (count[i] - e) / e;
    }
    /* 49 degrees of freedom: P(chi2 > 85.35) = 0.001 */
    assert_true(chi2 < 85.35);
    sampler_free(&s);
}

/* top-k selects its candidates without sorting the vocabulary: the same tokens, draw for
 * draw, as the full sort (top-k off) over logits where the rest are -inf. */
static void test_topk_selection(void **state) {
    (void)state;
    enum { V = 5000 };
    static float l[V], masked[V];
    tm_rng r;
    tm_rng_seed(&r, 11);
    for (int i = 0; i < V; i++) l[i] = roundf(8 * tm_rng_normal(&r)) / 4; /* many ties */
    static const int32_t ks[] = {1, 2, 7, 40, 1000, V - 1};
    for (size_t t = 0; t < sizeof(ks) / sizeof(ks[0]); t++) {
        const int32_t k = ks[t];
        /* the k best by (logit descending, id ascending), brute force */
        for (int i = 0; i < V; i++) {
            int better = 0;
            for (int j = 0; j < V && better < k; j++)
                better += l[j] > l[i] || (l[j] == l[i] && j < i);
            masked[i] = better < k ? l[i] : -INFINITY;
        }
        tm_sampler a, b;
        tm_sampler_params p = {.temp = 0.7f,
                               .top_k = k,
                               .top_p = 0.9f,
                               .min_p = 0.01f,
                               .repeat_penalty = 1,
                               .seed = 100 + (uint64_t)t};
        assert_int_equal(sampler_init(&a, &p, V), TM_OK);
        p.top_k = 0;
        assert_int_equal(sampler_init(&b, &p, V), TM_OK);
        for (int i = 0; i < 300; i++) {
            const int32_t x = sampler_sample(&a, l, NULL, 0),
                          y = sampler_sample(&b, masked, NULL, 0);
            if (x != y) fail_msg("top-k %d, draw %d: %d, the full sort %d", k, i, x, y);
        }
        sampler_free(&a), sampler_free(&b);
    }
}

static void test_filters(void **state) {
    (void)state;
    float l[NV];
    random_logits(l, NV, 4);
    double z = 0, m = -1e30;
    for (int i = 0; i < NV; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < NV; i++) z += exp(l[i] - m);
    /* rank of every token */
    int rank[NV];
    for (int i = 0; i < NV; i++) {
        rank[i] = 0;
        for (int j = 0; j < NV; j++) rank[i] += l[j] > l[i] || (l[j] == l[i] && j < i);
    }
    tm_sampler s;
    /* top-k 5 */
    tm_sampler_params p = {
        .temp = 2, .top_k = 5, .top_p = 1, .min_p = 0, .repeat_penalty = 1, .seed = 5};
    assert_int_equal(sampler_init(&s, &p, NV), TM_OK);
    for (int i = 0; i < 2000; i++) assert_true(rank[sampler_sample(&s, l, NULL, 0)] < 5);
    sampler_free(&s);
    /* top-p 0.5: the smallest prefix of the sorted probabilities reaching 0.5 */
    p.top_k = 0, p.top_p = 0.5f;
    assert_int_equal(sampler_init(&s, &p, NV), TM_OK);
    for (int i = 0; i < 2000; i++) {
        int id = sampler_sample(&s, l, NULL, 0);
        double before = 0; /* mass of the tokens ranked above id */
        for (int j = 0; j < NV; j++)
            if (rank[j] < rank[id]) before += exp(l[j] - m) / z;
        assert_true(before < 0.5);
    }
    sampler_free(&s);
    /* min-p 0.2: p(id) >= 0.2 p(best) */
    p.top_p = 1, p.min_p = 0.2f;
    assert_int_equal(sampler_init(&s, &p, NV), TM_OK);
    for (int i = 0; i < 2000; i++) {
        int id = sampler_sample(&s, l, NULL, 0);
        assert_true(exp(l[id] - m) >= 0.2 * (1 - 1e-6));
    }
    sampler_free(&s);
    /* bad parameters */
    p.min_p = 2;
    assert_int_equal(sampler_init(&s, &p, NV), TM_ERR_ARG);
    p.min_p = 0, p.top_p = 0;
    assert_int_equal(sampler_init(&s, &p, NV), TM_ERR_ARG);
}

static void test_repeat_penalty(void **state) {
    (void)state;
    float l[4] = {2.0f, 1.9f, -1.0f, -1.05f};
    tm_sampler s;
    tm_sampler_params p = {.temp = 0, .top_p = 1, .repeat_penalty = 1.1f, .repeat_last_n = 8};
    assert_int_equal(sampler_init(&s, &p, 4), TM_OK);
    int32_t hist[] = {0, 0, 0}; /* token 0 penalised once: 2.0 / 1.1 = 1.82 < 1.9 */
    assert_int_equal(sampler_sample(&s, l, hist, 3), 1);
    float neg[4] = {-1.0f, -1.05f, -5, -5};
    int32_t h2[] = {0}; /* -1.0 * 1.1 = -1.1 < -1.05 */
    assert_int_equal(sampler_sample(&s, neg, h2, 1), 1);
    p.repeat_last_n = 0; /* window of zero tokens: no penalty */
    sampler_free(&s);
    assert_int_equal(sampler_init(&s, &p, 4), TM_OK);
    assert_int_equal(sampler_sample(&s, l, hist, 3), 0);
    sampler_free(&s);
}

static void test_router(void **state) {
    (void)state;
    enum { T = 7, E = 128, K = 8 };
    float logits[T * E];
    random_logits(logits, T * E, 9);
    int32_t ids[T * K];
    float w[T * K];
    tm_moe_router_params p = {.gating = TM_MOE_GATING_SOFTMAX,
                              .n_expert = E,
                              .n_used = K,
                              .norm_topk = true,
                              .scale = 1.0f};
    moe_router_select(NULL, &p, logits, T, ids, w);
    for (int t = 0; t < T; t++) {
        const float *l = logits + t * E;
        double sum = 0, z = 0;
        for (int j = 0; j < K; j++) {
            sum += w[t * K + j];
            if (j) assert_true(l[ids[t * K + j - 1]] >= l[ids[t * K + j]]);
            int above = 0; /* exactly j experts have larger logits */
            for (int e = 0; e < E; e++) above += l[e] > l[ids[t * K + j]];
            assert_int_equal(above, j);
        }
        assert_true(fabs(sum - 1) < 1e-6);
        /* renormalised softmax: w_j = exp(l_j) / Σ_sel exp(l) */
        for (int j = 0; j < K; j++) z += exp(l[ids[t * K + j]] - l[ids[t * K]]);
        for (int j = 0; j < K; j++)
            assert_true(fabs(w[t * K + j] - exp(l[ids[t * K + j]] - l[ids[t * K]]) / z) < 1e-6);
    }
    /* softmax over the top-k only (gpt-oss) gives the same renormalised weights */
    float w2[T * K];
    int32_t ids2[T * K];
    p.gating = TM_MOE_GATING_SOFTMAX_TOPK, p.norm_topk = false;
    moe_router_select(NULL, &p, logits, T, ids2, w2);
    for (int i = 0; i < T * K; i++) {
        assert_int_equal(ids[i], ids2[i]);
        assert_true(fabs(w[i] - w2[i]) < 1e-6);
    }
    /* sigmoid with a scale, no renormalisation */
    p.gating = TM_MOE_GATING_SIGMOID, p.scale = 2.5f;
    moe_router_select(NULL, &p, logits, T, ids2, w2);
    for (int i = 0; i < T * K; i++) {
        assert_int_equal(ids[i], ids2[i]); /* sigmoid is monotonic: same ranking */
        double sg = 1 / (1 + exp(-logits[(i / K) * E + ids2[i]]));
        assert_true(fabs(w2[i] - 2.5 * sg) < 1e-5);
    }
    /* a batch spread over a pool (chunks of tokens on 3 threads) gives each
     * token what it gets alone */
    enum { TB = 100 };
    float *lb = malloc(sizeof(float) * TB * E), wb[TB * K], w1[K];
    int32_t ib[TB * K], i1[K];
    random_logits(lb, TB * E, 10);
    tm_pool *pool;
    assert_int_equal(cpu_pool_create(3, &pool), TM_OK);
    p = (tm_moe_router_params){.gating = TM_MOE_GATING_SOFTMAX,
                               .n_expert = E,
                               .n_used = K,
                               .norm_topk = true,
                               .scale = 1.0f};
    moe_router_select(pool, &p, lb, TB, ib, wb);
    for (int t = 0; t < TB; t++) {
        moe_router_select(NULL, &p, lb + t * E, 1, i1, w1);
        assert_memory_equal(i1, ib + t * K, sizeof i1);
        assert_memory_equal(w1, wb + t * K, sizeof w1);
    }
    cpu_pool_free(pool);
    free(lb);
}

static void test_worklist(void **state) {
    (void)state;
    enum { T = 33, E = 16, K = 4 };
    int32_t ids[T * K];
    float w[T * K];
    tm_rng r;
    tm_rng_seed(&r, 11);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int32_t e;
            int dup;
            do { /* distinct experts per token, as top-k gives */
                e = (int32_t)(tm_rng_u64(&r) % E);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * K + i] == e;
            } while (dup);
            ids[t * K + j] = e, w[t * K + j] = (float)(t * 100 + e);
        }
    tm_moe_worklist wl = {0};
    assert_int_equal(moe_worklist_build(&wl, ids, w, T, E, K, TM_MOE_PHASE_PROMPT), TM_OK);
    assert_true(wl.expert_major);
    assert_int_equal(wl.n_slots, T * K);
    int seen[T][E];
    memset(seen, 0, sizeof(seen));
    for (int e = 0; e < E; e++)
        for (int64_t s = wl.expert_begin[e]; s < wl.expert_begin[e + 1]; s++) {
            assert_int_equal(wl.slots[s].expert, e);
            if (s > wl.expert_begin[e]) assert_true(wl.slots[s].token > wl.slots[s - 1].token);
            assert_true(wl.slots[s].weight == (float)(wl.slots[s].token * 100 + e));
            seen[wl.slots[s].token][e]++;
        }
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) assert_int_equal(seen[t][ids[t * K + j]], 1);
    /* decode phase: token-major, whatever the count */
    assert_int_equal(moe_worklist_build(&wl, ids, w, T, E, K, TM_MOE_PHASE_DECODE), TM_OK);
    assert_false(wl.expert_major);
    for (int i = 0; i < T * K; i++) {
        assert_int_equal(wl.slots[i].token, i / K);
        assert_int_equal(wl.slots[i].expert, ids[i]);
    }
    moe_worklist_free(&wl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_topk1), cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_filters),          cmocka_unit_test(test_topk_selection),
        cmocka_unit_test(test_repeat_penalty),   cmocka_unit_test(test_router),
        cmocka_unit_test(test_worklist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
