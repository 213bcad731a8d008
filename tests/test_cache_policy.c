/* Cache policies against naive references and invariants:
 * - lru against a recency-list simulation, lfu against a count-and-scan
 *   simulation, step by step (hits, each admission, the residents), on
 *   random decode and prompt steps, with and without a cap;
 * - adaptive with a vanishing half-life, no hysteresis and no priors makes
 *   the same decisions as lru;
 * - every kind: never more than max_admit admissions a step, never more
 *   residents than slots, no expert twice, slot maps consistent, hits equal
 *   a count against the residents before the step, admissions only of
 *   experts the step routed, evictions only of residents it did not use;
 * - adaptive's hysteresis holds a full cache against one-off experts;
 * - the updater against a sort-and-pair reference; its rate cap;
 * - bad parameters are refused. */
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
#include "tier/cache_policy.h"

#define MAXE 64

/* k distinct ids per token with locality: mostly from a small drifting set. */
static void markov_ids(tm_rng *r, int32_t *ids, int64_t n_tok, uint32_t E, uint32_t k, int32_t *hot,
                       uint32_t n_hot) {
    for (int64_t t = 0; t < n_tok; t++) {
        if (tm_rng_u64(r) % 4 == 0) hot[tm_rng_u64(r) % n_hot] = (int32_t)(tm_rng_u64(r) % E);
        for (uint32_t j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = tm_rng_u64(r) % 3 ? hot[tm_rng_u64(r) % n_hot] : (int32_t)(tm_rng_u64(r) % E);
                dup = false;
                for (uint32_t q = 0; q < j; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = e;
        }
    }
}

/* ---- naive references ---- */

typedef struct naive {
    int kind; /* TM_CACHE_LRU or TM_CACHE_LFU */
    int32_t S, at[MAXE];
    int64_t count[MAXE], last[MAXE];
    int32_t max_admit;
} naive;

static void naive_init(naive *n, int kind, int32_t S, const int32_t *initial, int32_t max_admit) {
    memset(n, 0, sizeof(*n));
    n->kind = kind, n->S = S, n->max_admit = max_admit;
    for (int e = 0; e < MAXE; e++) n->last[e] = INT64_MIN / 2;
    for (int32_t s = 0; s < S; s++) {
        n->at[s] = initial ? initial[s] : -1;
        if (n->at[s] >= 0) n->last[n->at[s]] = -1 - s;
    }
}

static int32_t naive_slot(const naive *n, int32_t e) {
    for (int32_t s = 0; s < n->S; s++)
        if (n->at[s] == e) return s;
    return -1;
}

/* One step; returns admissions (slot, expert, evicted) in out. */
static int32_t naive_step(naive *n, int64_t t, const int32_t *ids, int64_t n_tok, uint32_t k,
                          tm_cache_admit *out, int64_t *hits) {
    int32_t order[MAXE], cnt[MAXE] = {0}, n_order = 0;
    *hits = 0;
    for (int64_t i = 0; i < n_tok * (int64_t)k; i++) {
        *hits += naive_slot(n, ids[i]) >= 0;
        if (!cnt[ids[i]]++) order[n_order++] = ids[i];
    }
    /* update recency / counts */
    for (int32_t i = 0; i < n_order; i++) {
        const int32_t e = order[i];
        n->count[e] += cnt[e];
        n->last[e] = t;
    }
    /* missed experts: more uses in the step first, then first use (lfu: higher count first) */
    int32_t miss[MAXE], nm = 0;
    for (int32_t i = 0; i < n_order; i++)
        if (naive_slot(n, order[i]) < 0) miss[nm++] = order[i];
    for (int32_t i = 1; i < nm; i++) /* stable insertion sort */
        for (int32_t j = i; j > 0; j--) {
            const int32_t a = miss[j - 1], b = miss[j];
            const bool swap =
                n->kind == TM_CACHE_LFU
                    ? (n->count[b] > n->count[a] || (n->count[b] == n->count[a] && cnt[b] > cnt[a]))
                    : cnt[b] > cnt[a];
            if (!swap) break;
            miss[j - 1] = b, miss[j] = a;
        }
    int32_t na = 0;
    for (int32_t i = 0; i < nm && (!n->max_admit || na < n->max_admit); i++) {
        const int32_t e = miss[i];
        int32_t v = -1;
        for (int32_t s = 0; s < n->S && v < 0; s++)
            if (n->at[s] < 0) v = s;
        if (v < 0) { /* not used now; lru: least recent; lfu: fewest uses, then least
                        recent; then the lower slot */
            const bool lfu = n->kind == TM_CACHE_LFU;
            for (int32_t s = 0; s < n->S; s++) {
                const int32_t x = n->at[s];
                if (cnt[x]) continue;
                if (v < 0 || (lfu && n->count[x] < n->count[n->at[v]]) ||
                    ((!lfu || n->count[x] == n->count[n->at[v]]) && n->last[x] < n->last[n->at[v]]))
                    v = s;
            }
            if (v >= 0 && lfu && !(n->count[e] > n->count[n->at[v]])) break;
        }
        if (v < 0) break;
        const int32_t old = n->at[v];
        out[na++] = (tm_cache_admit){v, e, old};
        n->at[v] = e;
    }
    return na;
}

static void compare_with_naive(int kind) {
    tm_rng r;
    tm_rng_seed(&r, 1000 + (uint64_t)kind);
    for (int it = 0; it < 200; it++) {
        const uint32_t E = 4 + (uint32_t)(tm_rng_u64(&r) % 40),
                       k = 1 + (uint32_t)(tm_rng_u64(&r) % 4);
        const int32_t S = (int32_t)(tm_rng_u64(&r) % (E + 1));
        const int32_t cap = (int32_t)(tm_rng_u64(&r) % 3);
        int32_t initial[MAXE];
        for (int32_t s = 0; s < S; s++) initial[s] = -1;
        for (int32_t s = 0, e = (int32_t)(tm_rng_u64(&r) % E); s < S; s++, e = (e + 3) % (int32_t)E)
            if (tm_rng_u64(&r) % 4) {
                bool dup = false;
                for (int32_t q = 0; q < s; q++) dup |= initial[q] == e;
                if (!dup) initial[s] = e;
            }
        tm_cache_policy_params p = cache_policy_params_default((tm_cache_policy_kind)kind);
        p.max_admit = cap;
        tm_cache_policy *c;
        assert_int_equal(cache_policy_create(&p, E, S, it % 5 ? initial : NULL, &c), TM_OK);
        naive n;
        naive_init(&n, kind, S, it % 5 ? initial : NULL, cap);
        int32_t hot[6];
        for (int i = 0; i < 6; i++) hot[i] = (int32_t)(tm_rng_u64(&r) % E);
        int32_t ids[8 * 4];
        tm_cache_admit a1[MAXE], a2[MAXE];
        for (int64_t t = 1; t <= 60; t++) {
            const int64_t n_tok = tm_rng_u64(&r) % 5 ? 1 : 1 + (int64_t)(tm_rng_u64(&r) % 8);
            markov_ids(&r, ids, n_tok, E, k, hot, 6);
            int64_t h1, h2;
            const int32_t n1 = cache_policy_step(c, ids, n_tok, k, a1, &h1);
            const int32_t n2 = naive_step(&n, t, ids, n_tok, k, a2, &h2);
            assert_int_equal(h1, h2);
            assert_int_equal(n1, n2);
            for (int32_t i = 0; i < n1; i++) {
                assert_int_equal(a1[i].slot, a2[i].slot);
                assert_int_equal(a1[i].expert, a2[i].expert);
                assert_int_equal(a1[i].evicted, a2[i].evicted);
            }
            for (int32_t s = 0; s < S; s++) assert_int_equal(cache_policy_expert_at(c, s), n.at[s]);
        }
        cache_policy_free(c);
    }
}

static void test_lru_naive(void **state) {
    (void)state;
    compare_with_naive(TM_CACHE_LRU);
}

static void test_lfu_naive(void **state) {
    (void)state;
    compare_with_naive(TM_CACHE_LFU);
}

static void test_adaptive_limit_is_lru(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 77);
    for (int it = 0; it < 50; it++) {
        const uint32_t E = 8 + (uint32_t)(tm_rng_u64(&r) % 40),
                       k = 1 + (uint32_t)(tm_rng_u64(&r) % 4);
        const int32_t S = 1 + (int32_t)(tm_rng_u64(&r) % (E - 1));
        tm_cache_policy_params pl = cache_policy_params_default(TM_CACHE_LRU),
                               pa = cache_policy_params_default(TM_CACHE_ADAPTIVE);
        pl.max_admit = pa.max_admit = (int32_t)(tm_rng_u64(&r) % 3);
        pa.half_life = 1e-6, pa.hysteresis = 0, pa.prior = 0; /* old uses decay to 0 at once */
        tm_cache_policy *cl, *ca;
        assert_int_equal(cache_policy_create(&pl, E, S, NULL, &cl), TM_OK);
        assert_int_equal(cache_policy_create(&pa, E, S, NULL, &ca), TM_OK);
        int32_t hot[5], ids[6 * 4];
        for (int i = 0; i < 5; i++) hot[i] = (int32_t)(tm_rng_u64(&r) % E);
        tm_cache_admit a1[MAXE], a2[MAXE];
        for (int t = 0; t < 200; t++) {
            const int64_t n_tok = 1 + (int64_t)(t % 7 == 0) * 5;
            markov_ids(&r, ids, n_tok, E, k, hot, 5);
            int64_t h1, h2;
            const int32_t n1 = cache_policy_step(cl, ids, n_tok, k, a1, &h1);
            const int32_t n2 = cache_policy_step(ca, ids, n_tok, k, a2, &h2);
            assert_int_equal(h1, h2);
            assert_int_equal(n1, n2);
            assert_memory_equal(a1, a2, (size_t)n1 * sizeof(tm_cache_admit));
        }
        cache_policy_free(cl), cache_policy_free(ca);
    }
}

/* Invariants of any kind on random streams. */
static void test_invariants(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 9);
    for (int it = 0; it < 240; it++) {
        const tm_cache_policy_kind kind = (tm_cache_policy_kind)(it % TM_CACHE_KIND_COUNT);
        const uint32_t E = 2 + (uint32_t)(tm_rng_u64(&r) % 60),
                       k = 1 + (uint32_t)(tm_rng_u64(&r) % (E < 8 ? E : 8));
        const int32_t S = (int32_t)(tm_rng_u64(&r) % (E + 1));
        tm_cache_policy_params p = cache_policy_params_default(kind);
        p.max_admit = (int32_t)(tm_rng_u64(&r) % 4);
        p.hysteresis = (double)(tm_rng_u64(&r) % 3) / 2;
        p.half_life = (double)(tm_rng_u64(&r) % 3) * 20;
        int32_t initial[MAXE];
        for (int32_t s = 0; s < S; s++) initial[s] = s % 3 == 2 ? -1 : s; /* some empty slots */
        tm_cache_policy *c;
        assert_int_equal(cache_policy_create(&p, E, S, initial, &c), TM_OK);
        if (it % 2) {
            uint64_t warm[MAXE];
            for (uint32_t e = 0; e < E; e++) warm[e] = tm_rng_u64(&r) % 50;
            cache_policy_warm(c, warm);
        }
        int32_t hot[4], ids[16 * 8];
        for (int i = 0; i < 4; i++) hot[i] = (int32_t)(tm_rng_u64(&r) % E);
        tm_cache_admit adm[MAXE];
        for (int t = 0; t < 300; t++) {
            const int64_t n_tok = tm_rng_u64(&r) % 6 ? 1 : 1 + (int64_t)(tm_rng_u64(&r) % 16);
            markov_ids(&r, ids, n_tok, E, k, hot, 4);
            int32_t before[MAXE];
            int64_t want = 0;
            for (int32_t s = 0; s < S; s++) before[s] = cache_policy_expert_at(c, s);
            bool routed[MAXE] = {0};
            for (int64_t i = 0; i < n_tok * (int64_t)k; i++) {
                routed[ids[i]] = true;
                for (int32_t s = 0; s < S; s++) want += before[s] == ids[i];
            }
            int64_t hits;
            const int32_t n = cache_policy_step(c, ids, n_tok, k, adm, &hits);
            assert_int_equal(hits, want);
            assert_true(n >= 0 && n <= S);
            if (p.max_admit) assert_true(n <= p.max_admit);
            if (kind == TM_CACHE_STATIC) assert_int_equal(n, 0);
            for (int32_t i = 0; i < n; i++) {
                assert_true(routed[adm[i].expert]);
                assert_true(adm[i].evicted < 0 || !routed[adm[i].evicted]);
                assert_true(adm[i].slot >= 0 && adm[i].slot < S);
                assert_int_equal(adm[i].evicted, before[adm[i].slot]);
                before[adm[i].slot] = adm[i].expert; /* admissions apply in order */
            }
            bool seen[MAXE] = {0};
            int32_t resident = 0;
            for (int32_t s = 0; s < S; s++) {
                const int32_t e = cache_policy_expert_at(c, s);
                assert_int_equal(e, before[s]);
                if (e < 0) continue;
                assert_false(seen[e]);
                seen[e] = true, resident++;
                assert_int_equal(cache_policy_slot_of(c, e), s);
            }
            assert_true(resident <= S);
            for (uint32_t e = 0; e < E; e++)
                if (!seen[e]) assert_int_equal(cache_policy_slot_of(c, (int32_t)e), -1);
        }
        cache_policy_free(c);
    }
}

static void test_adaptive_hysteresis(void **state) {
    (void)state;
    /* 8 slots full of experts 0..7, used in turn; after a warm-up, a one-off expert each step
     * never enters adaptive (the residents score higher); lru takes every one-off, and then
     * takes back the steady expert it evicted */
    for (int kind = TM_CACHE_LRU; kind <= TM_CACHE_ADAPTIVE; kind += 2) {
        tm_cache_policy_params p = cache_policy_params_default((tm_cache_policy_kind)kind);
        const int32_t initial[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        tm_cache_policy *c;
        assert_int_equal(cache_policy_create(&p, 64, 8, initial, &c), TM_OK);
        int64_t uploads = 0, hits_total = 0;
        for (int t = 0; t < 16; t++) {
            const int32_t ids[2] = {t % 8, (t + 4) % 8};
            tm_cache_admit adm[8];
            int64_t hits;
            assert_int_equal(cache_policy_step(c, ids, 1, 2, adm, &hits), 0);
            assert_int_equal(hits, 2);
        }
        for (int t = 0; t < 100; t++) {
            /* k = 2: one of the steady eight, one newcomer */
            const int32_t ids[2] = {t % 8, 8 + t % 56};
            tm_cache_admit adm[8];
            int64_t hits;
            uploads += cache_policy_step(c, ids, 1, 2, adm, &hits);
            hits_total += hits;
        }
        if (kind == TM_CACHE_LRU)
            assert_true(uploads > 100);
        else {
            assert_int_equal(uploads, 0);
            assert_int_equal(hits_total, 100);
        }
        cache_policy_free(c);
    }
    /* an expert used steadily from now on gets in once it beats the weakest by (1 + h) */
    tm_cache_policy_params p = cache_policy_params_default(TM_CACHE_ADAPTIVE);
    p.half_life = 1e6, p.hysteresis = 1.1, p.prior = 0;
    const int32_t initial[2] = {0, 1};
    tm_cache_policy *c;
    assert_int_equal(cache_policy_create(&p, 16, 2, initial, &c), TM_OK);
    int entered = -1;
    for (int t = 0; t < 10; t++) {
        /* 0 and 1 used twice at the start, then only expert 5 (and 0) */
        const int32_t a[2] = {0, 1}, b[2] = {0, 5};
        tm_cache_admit adm[2];
        int64_t hits;
        const int32_t n = cache_policy_step(c, t < 2 ? a : b, 1, 2, adm, &hits);
        if (n && entered < 0) {
            entered = t;
            assert_int_equal(adm[0].expert, 5);
            assert_int_equal(adm[0].evicted, 1);
        }
    }
    /* expert 1 has 2 uses (t 0, 1); 5 needs more than 2.1 * 2: its 5th use, at t = 6 */
    assert_int_equal(entered, 6);
    cache_policy_free(c);
}

static void test_adaptive_learn_prior(void **state) {
    (void)state;
    /* one slot, no hysteresis, no plan prior; 200 one-off experts (far beyond the auto
     * half-life of 8 tokens). Not warmed: each one-off takes the slot. Warmed with counts
     * saying expert 0 takes every token: 0's prior (0.5 * 1 * k / lambda = 5.8 uses) keeps
     * it. Warmed after the first step (which let expert 1 in) with counts for expert 1:
     * 1 stays. */
    for (int mode = 0; mode < 3; mode++) {
        tm_cache_policy_params p = cache_policy_params_default(TM_CACHE_ADAPTIVE);
        p.hysteresis = 0, p.prior = 0;
        const int32_t initial[1] = {0};
        tm_cache_policy *c;
        assert_int_equal(cache_policy_create(&p, 256, 1, initial, &c), TM_OK);
        uint64_t counts[256] = {0};
        counts[mode == 2 ? 1 : 0] = 1000;
        if (mode == 1) cache_policy_warm(c, counts);
        int64_t uploads = 0;
        for (int t = 0; t < 200; t++) {
            const int32_t ids[1] = {1 + t};
            tm_cache_admit adm[1];
            int64_t hits;
            uploads += cache_policy_step(c, ids, 1, 1, adm, &hits);
            if (t == 0 && mode == 2) cache_policy_warm(c, counts);
        }
        if (mode == 0)
            assert_int_equal(uploads, 200);
        else {
            assert_int_equal(uploads, mode == 2 ? 1 : 0); /* mode 2: the first step was cold */
            assert_int_equal(cache_policy_slot_of(c, mode == 2 ? 1 : 0), 0);
        }
        cache_policy_free(c);
    }
}

/* ---- the updater ---- */

static void test_update_reference(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 31);
    for (int it = 0; it < 200; it++) {
        const uint32_t E = 2 + (uint32_t)(tm_rng_u64(&r) % 60);
        const int32_t S = (int32_t)(tm_rng_u64(&r) % (E + 1));
        const double rate = (double)(tm_rng_u64(&r) % 5) / 4, h = (double)(tm_rng_u64(&r) % 3) / 2;
        tm_cache_policy_params p = cache_policy_params_default(TM_CACHE_STATIC);
        p.hysteresis = h;
        int32_t initial[MAXE];
        for (int32_t s = 0; s < S; s++)
            initial[s] = tm_rng_u64(&r) % 5 ? (int32_t)((s * 7 + it) % E) : -1;
        for (int32_t s = 0; s < S; s++) /* drop duplicates */
            for (int32_t q = 0; q < s; q++)
                if (initial[q] == initial[s]) initial[s] = -1;
        tm_cache_policy *c;
        assert_int_equal(cache_policy_create(&p, E, S, initial, &c), TM_OK);
        uint64_t counts[MAXE];
        for (uint32_t e = 0; e < E; e++) counts[e] = tm_rng_u64(&r) % 3 ? tm_rng_u64(&r) % 20 : 0;
        tm_cache_admit adm[MAXE];
        const int32_t n = cache_policy_update(c, counts, rate, adm);
        /* reference: newcomers with counts > 0 best first (ties: lower id); residents weakest
         * first (empty slots first, lowest slot first; then lower count, then less recent:
         * the plan's order makes the higher slot the less recent) */
        int32_t newc[MAXE], nn = 0, res[MAXE];
        bool in[MAXE] = {0};
        for (int32_t s = 0; s < S; s++)
            if (initial[s] >= 0) in[initial[s]] = true;
        for (uint32_t e = 0; e < E; e++)
            if (!in[e] && counts[e] > 0) newc[nn++] = (int32_t)e;
        for (int32_t i = 1; i < nn; i++)
            for (int32_t j = i; j > 0 && counts[newc[j]] > counts[newc[j - 1]]; j--) {
                const int32_t t = newc[j];
                newc[j] = newc[j - 1], newc[j - 1] = t;
            }
        for (int32_t s = 0; s < S; s++) res[s] = s;
        for (int32_t i = 1; i < S; i++)
            for (int32_t j = i; j > 0; j--) {
                const int32_t a = initial[res[j - 1]], b = initial[res[j]];
                const bool swap =
                    (b < 0 && a >= 0) ||
                    (a >= 0 && b >= 0 &&
                     (counts[b] < counts[a] || (counts[b] == counts[a] && res[j] > res[j - 1])));
                if (!swap) break;
                const int32_t t = res[j];
                res[j] = res[j - 1], res[j - 1] = t;
            }
        const int32_t max_x = (int32_t)floor(rate * S + 1e-9);
        int32_t want = 0;
        for (int32_t i = 0; i < nn && i < S && want < max_x; i++) {
            const int32_t old = initial[res[i]];
            if (old >= 0 && !((double)counts[newc[i]] > (1 + h) * (double)counts[old])) break;
            assert_true(want < n);
            assert_int_equal(adm[want].slot, res[i]);
            assert_int_equal(adm[want].expert, newc[i]);
            assert_int_equal(adm[want].evicted, old);
            want++;
        }
        assert_int_equal(n, want);
        assert_true(n <= max_x);
        cache_policy_free(c);
    }
}

static void test_update_own_scores(void **state) {
    (void)state;
    /* without counts the updater uses the decayed uses: after a steady run on experts
     * 10..13, a full update brings them in over the plan's unused experts 0..3 */
    tm_cache_policy_params p = cache_policy_params_default(TM_CACHE_STATIC);
    p.half_life = 50;
    const int32_t initial[4] = {0, 1, 2, 3};
    tm_cache_policy *c;
    assert_int_equal(cache_policy_create(&p, 32, 4, initial, &c), TM_OK);
    for (int t = 0; t < 40; t++) {
        const int32_t ids[2] = {10 + t % 4, 10 + (t + 1) % 4};
        tm_cache_admit adm[4];
        int64_t hits;
        assert_int_equal(cache_policy_step(c, ids, 1, 2, adm, &hits), 0);
    }
    tm_cache_admit adm[4];
    assert_int_equal(cache_policy_update(c, NULL, 0.5, adm), 2); /* the rate caps it at 2 */
    assert_int_equal(cache_policy_update(c, NULL, 1.0, adm), 2);
    for (int e = 10; e < 14; e++) assert_true(cache_policy_slot_of(c, e) >= 0);
    assert_int_equal(cache_policy_update(c, NULL, 1.0, adm), 0); /* nothing better left */
    cache_policy_free(c);
}

static void test_bad_params(void **state) {
    (void)state;
    tm_cache_policy *c;
    tm_cache_policy_params p = cache_policy_params_default(TM_CACHE_LRU);
    const int32_t dup[2] = {3, 3}, out[1] = {9};
    assert_int_equal(cache_policy_create(&p, 8, 9, NULL, &c), TM_ERR_ARG);
    assert_int_equal(cache_policy_create(&p, 8, -1, NULL, &c), TM_ERR_ARG);
    assert_int_equal(cache_policy_create(&p, 8, 2, dup, &c), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "initial[1]: expert 3 listed twice"));
    assert_int_equal(cache_policy_create(&p, 8, 1, out, &c), TM_ERR_ARG);
    p.max_admit = -1;
    assert_int_equal(cache_policy_create(&p, 8, 2, NULL, &c), TM_ERR_ARG);
    p = cache_policy_params_default(TM_CACHE_ADAPTIVE);
    p.hysteresis = NAN;
    assert_int_equal(cache_policy_create(&p, 8, 2, NULL, &c), TM_ERR_ARG);
    p = cache_policy_params_default(TM_CACHE_ADAPTIVE);
    p.kind = TM_CACHE_KIND_COUNT;
    assert_int_equal(cache_policy_create(&p, 8, 2, NULL, &c), TM_ERR_ARG);
    for (int k = 0; k < TM_CACHE_KIND_COUNT; k++) {
        tm_cache_policy_kind got;
        assert_int_equal(
            cache_policy_kind_parse(cache_policy_kind_name((tm_cache_policy_kind)k), &got), TM_OK);
        assert_int_equal(got, k);
    }
    tm_cache_policy_kind got;
    assert_int_equal(cache_policy_kind_parse("mru", &got), TM_ERR_ARG);
    /* zero slots: nothing to do, nothing resident */
    p = cache_policy_params_default(TM_CACHE_ADAPTIVE);
    assert_int_equal(cache_policy_create(&p, 8, 0, NULL, &c), TM_OK);
    const int32_t ids[2] = {1, 2};
    int64_t hits;
    assert_int_equal(cache_policy_step(c, ids, 1, 2, NULL, &hits), 0);
    assert_int_equal(hits, 0);
    assert_int_equal(cache_policy_update(c, NULL, 1, NULL), 0);
    cache_policy_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_naive),
        cmocka_unit_test(test_lfu_naive),
        cmocka_unit_test(test_adaptive_limit_is_lru),
        cmocka_unit_test(test_invariants),
        cmocka_unit_test(test_adaptive_hysteresis),
        cmocka_unit_test(test_update_reference),
        cmocka_unit_test(test_adaptive_learn_prior),
        cmocka_unit_test(test_update_own_scores),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
