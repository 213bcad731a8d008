/* The replay of routing logs against cache policies:
 * - Belady (MIN with bypass, prompt calls as free admissions) equals an
 *   exhaustive search over every choice of residents on tiny layers, and no
 *   demand policy (static, lru, lfu, adaptive; any cap) beats it there;
 * - on synthetic logs, at every residency and lag: belady >= every demand
 *   policy; hits never rise with the lag; lag 0 equals the policies' own hit
 *   counts; static and belady do not depend on the lag;
 * - orderings known from the data: when each sequence keeps to its own few
 *   experts, lru and adaptive beat the static plan by far; when routing is
 *   stationary (the same skewed distribution throughout), static beats lru
 *   and adaptive stays near static;
 * - the training counts are the first sequences' counts; bad parameters. */
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
#include "routing_test_util.h"
#include "tier/cache_replay.h"

/* ---- Belady against an exhaustive search ---- */

#define TE 6  /* experts */
#define TT 10 /* steps */

typedef struct tiny_layer {
    tm_trace_log_layer ly;
    tm_trace_log_call calls[TT];
    int32_t ids[TT * 3 * 3];
    uint32_t mask[TT]; /* experts of each step */
    bool dec[TT];
} tiny_layer;

static int popcount(uint32_t x) {
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

/* Most decode hits from step u with residents `set`: every subset of set | step's experts
 * of at most S, after counting the step's hits against set. */
static int dp_best(const tiny_layer *t, int T, int S, int u, uint32_t set, int *memo) {
    if (u == T) return 0;
    int *m = &memo[u * (1 << TE) + (int)set];
    if (*m >= 0) return *m;
    const int h = t->dec[u] ? popcount(set & t->mask[u]) : 0;
    const uint32_t pool = set | t->mask[u];
    int best = 0;
    for (uint32_t sub = pool;; sub = (sub - 1) & pool) { /* every subset of pool */
        if (popcount(sub) <= S) {
            const int v = dp_best(t, T, S, u + 1, sub, memo);
            best = v > best ? v : best;
        }
        if (!sub) break;
    }
    return *m = h + best;
}

static void tiny_random(tm_rng *r, tiny_layer *t, int T, uint32_t k) {
    memset(t, 0, sizeof(*t));
    uint64_t off = 0;
    for (int u = 0; u < T; u++) {
        const uint32_t n_tok = tm_rng_u64(r) % 3 ? 1 : 2 + (uint32_t)(tm_rng_u64(r) % 2);
        t->calls[u] = (tm_trace_log_call){.seq = 0, .n_tok = n_tok, .off = off};
        t->dec[u] = n_tok == 1;
        test_random_ids(r, t->ids + off, n_tok, TE, k);
        for (uint64_t i = 0; i < (uint64_t)n_tok * k; i++) t->mask[u] |= 1u << t->ids[off + i];
        off += (uint64_t)n_tok * k;
    }
    t->ly = (tm_trace_log_layer){
        .n_calls = (uint64_t)T, .n_ids = off, .calls = t->calls, .ids = t->ids};
}

/* A demand policy's decode hits on the tiny layer, lag 0. */
static uint64_t tiny_policy(const tiny_layer *t, tm_cache_policy_kind kind, int32_t cap, int32_t S,
                            const int32_t *initial, uint32_t k) {
    tm_cache_policy_params p = cache_policy_params_default(kind);
    p.max_admit = cap;
    tm_cache_policy *c;
    assert_int_equal(cache_policy_create(&p, TE, S, initial, &c), TM_OK);
    uint64_t hits = 0;
    tm_cache_admit adm[TE];
    for (uint64_t u = 0; u < t->ly.n_calls; u++) {
        int64_t h;
        cache_policy_step(c, t->ids + t->calls[u].off, t->calls[u].n_tok, k, adm, &h);
        if (t->dec[u]) hits += (uint64_t)h;
    }
    cache_policy_free(c);
    return hits;
}

static void test_belady_exhaustive(void **state) {
    (void)state;
    tm_rng r;
    tm_rng_seed(&r, 2024);
    int *memo = malloc(TT * (1 << TE) * sizeof(int));
    for (int it = 0; it < 1500; it++) {
        const int T = 3 + (int)(tm_rng_u64(&r) % (TT - 2));
        const uint32_t k = 1 + (uint32_t)(tm_rng_u64(&r) % 3);
        const int32_t S = 1 + (int32_t)(tm_rng_u64(&r) % (TE - 1));
        tiny_layer t;
        tiny_random(&r, &t, T, k);
        int32_t initial[TE];
        uint32_t set = 0;
        for (int32_t s = 0; s < S; s++) {
            const int32_t e = (int32_t)(tm_rng_u64(&r) % TE);
            initial[s] = (set >> e) & 1 || tm_rng_u64(&r) % 3 == 0 ? -1 : e;
            if (initial[s] >= 0) set |= 1u << e;
        }
        for (int i = 0; i < TT * (1 << TE); i++) memo[i] = -1;
        const int best = dp_best(&t, T, S, 0, set, memo);
        uint64_t hits, up, upp;
        assert_int_equal(cache_replay_belady(&t.ly, 0, k, TE, S, initial, &hits, &up, &upp), TM_OK);
        if ((int)hits != best) {
            fprintf(stderr, "iteration %d: belady %llu, exhaustive %d\n", it,
                    (unsigned long long)hits, best);
            fail();
        }
        for (int kind = TM_CACHE_STATIC; kind < TM_CACHE_KIND_COUNT; kind++)
            for (int32_t cap = 0; cap < 3; cap++)
                assert_true(tiny_policy(&t, (tm_cache_policy_kind)kind, cap, S, initial, k) <=
                            hits);
    }
    free(memo);
}

/* ---- synthetic logs ---- */

typedef struct syn_params {
    uint32_t L, E, k, n_seq, prompt, decode;
    uint32_t topic;     /* experts a sequence keeps to (0: none) */
    double topic_share; /* share of its picks from them */
    double zipf;        /* exponent of the stationary popularity */
    uint64_t seed;
} syn_params;

/* One pick: from the sequence's topic, else by the layer's Zipf popularity. */
static int32_t syn_pick(tm_rng *r, const syn_params *sp, const int32_t *topic, const double *cdf) {
    const double u = (double)(tm_rng_u64(r) >> 11) / 9007199254740992.0;
    if (sp->topic && u < sp->topic_share) return topic[tm_rng_u64(r) % sp->topic];
    const double v = (double)(tm_rng_u64(r) >> 11) / 9007199254740992.0;
    uint32_t e = 0;
    while (e + 1 < sp->E && cdf[e] < v) e++;
    return (int32_t)e;
}

static void syn_log(const syn_params *sp, const char *path, tm_trace_log *out) {
    tm_trace_shape sh = {.n_layer = sp->L, .n_expert = sp->E, .n_expert_used = sp->k};
    snprintf(sh.arch, sizeof(sh.arch), "qwen3moe");
    tm_trace_log_writer *w;
    assert_int_equal(trace_log_writer_open(path, &sh, &w), TM_OK);
    tm_rng r;
    tm_rng_seed(&r, sp->seed);
    double *cdf = malloc(sp->E * sizeof(double));
    int32_t *topic = malloc((size_t)sp->L * (sp->topic ? sp->topic : 1) * sizeof(int32_t));
    int32_t *ids = malloc((size_t)sp->prompt * sp->k * sizeof(int32_t));
    double z = 0;
    for (uint32_t e = 0; e < sp->E; e++) z += pow(e + 1, -sp->zipf), cdf[e] = z;
    for (uint32_t e = 0; e < sp->E; e++) cdf[e] /= z;
    for (uint32_t s = 0; s < sp->n_seq; s++) {
        trace_log_writer_sequence(w);
        for (uint32_t i = 0; i < sp->L * sp->topic; i++)
            topic[i] = (int32_t)(tm_rng_u64(&r) % sp->E);
        for (uint32_t step = 0; step < 1 + sp->decode; step++) {
            const int64_t n_tok = step ? 1 : sp->prompt;
            for (uint32_t l = 0; l < sp->L; l++) {
                for (int64_t t = 0; t < n_tok; t++)
                    for (uint32_t j = 0; j < sp->k; j++) {
                        int32_t e;
                        bool dup;
                        do {
                            e = syn_pick(&r, sp, topic + l * sp->topic, cdf);
                            e = (e + (int32_t)(l * 5)) % (int32_t)sp->E; /* layers differ */
                            dup = false;
                            for (uint32_t q = 0; q < j; q++) dup |= ids[t * sp->k + q] == e;
                        } while (dup);
                        ids[t * sp->k + j] = e;
                    }
                trace_log_writer_record(w, l, ids, n_tok);
            }
        }
    }
    assert_int_equal(trace_log_writer_close(w, true), TM_OK);
    free(cdf), free(topic), free(ids);
    assert_int_equal(trace_log_read(path, out), TM_OK);
    remove(path);
}

static double rate(const tm_replay_result *r, int q) {
    return (double)r->hits[q] / (double)r->routed;
}

/* Each policy replayed by hand at lag 0 (the policies' own hit counts). */
static void own_hits(const tm_trace_log *log, const tm_replay_params *p, double residency,
                     uint64_t *hits) {
    const uint32_t n_train = (uint32_t)floor(p->train_fraction * log->n_seq);
    tm_trace_stats counts;
    assert_int_equal(cache_replay_counts(log, n_train, &counts), TM_OK);
    uint64_t bytes[16];
    for (uint32_t l = 0; l < log->shape.n_layer; l++) bytes[l] = 1;
    const tm_plan_params pp = {.mode = p->weighting,
                               .layer_curve = TM_PLAN_CURVE_DEFAULT,
                               .budget_bytes = (uint64_t)llround(residency * log->shape.n_expert) *
                                               log->shape.n_layer,
                               .expert_bytes = bytes};
    tm_plan plan;
    assert_int_equal(plan_make(&counts, &pp, &plan), TM_OK);
    const tm_cache_policy_kind kinds[5] = {TM_CACHE_STATIC, TM_CACHE_STATIC, TM_CACHE_LRU,
                                           TM_CACHE_LFU, TM_CACHE_ADAPTIVE};
    for (int q = 0; q < 5; q++) {
        hits[q] = 0;
        for (uint32_t l = 0; l < log->shape.n_layer; l++) {
            tm_cache_policy_params kp = p->knobs;
            kp.kind = kinds[q], kp.max_admit = p->max_admit;
            if (q == TM_REPLAY_UPDATE) kp.half_life = p->update_half_life;
            tm_cache_policy *c;
            assert_int_equal(
                cache_policy_create(&kp, log->shape.n_expert, plan.n_slots[l], plan.experts[l], &c),
                TM_OK);
            cache_policy_warm(c, counts.layers[l].experts);
            const tm_trace_log_layer *ly = &log->layers[l];
            tm_cache_admit adm[256];
            uint32_t prev = UINT32_MAX;
            for (uint64_t i = 0; i < ly->n_calls; i++) {
                const tm_trace_log_call *cl = &ly->calls[i];
                if (cl->seq < n_train) continue;
                if (q == TM_REPLAY_UPDATE && prev != UINT32_MAX && cl->seq != prev)
                    cache_policy_update(c, NULL, p->update_rate, adm);
                prev = cl->seq;
                int64_t h;
                cache_policy_step(c, ly->ids + cl->off, cl->n_tok, log->shape.n_expert_used, adm,
                                  &h);
                if (cl->n_tok == 1) hits[q] += (uint64_t)h;
            }
            cache_policy_free(c);
        }
    }
    plan_free(&plan);
    trace_stats_free(&counts);
}

static void check_log_properties(const tm_trace_log *log) {
    const double res[4] = {0.1, 0.25, 0.4, 0.6};
    for (int i = 0; i < 4; i++) {
        tm_replay_result r[3];
        for (int32_t lag = 0; lag < 3; lag++) {
            tm_replay_params p = cache_replay_params_default();
            p.lag = lag, p.max_admit = i % 2 ? 1 : 0;
            assert_int_equal(cache_replay(log, &p, res[i], &r[lag]), TM_OK);
            assert_true(r[lag].routed > 0);
            for (int q = 0; q < TM_REPLAY_BELADY; q++) {
                if (q != TM_REPLAY_UPDATE)
                    assert_true(r[lag].hits[q] <= r[lag].hits[TM_REPLAY_BELADY]);
                if (lag) assert_true(r[lag].hits[q] <= r[lag - 1].hits[q]);
            }
            if (lag) {
                assert_int_equal(r[lag].hits[TM_REPLAY_STATIC], r[0].hits[TM_REPLAY_STATIC]);
                assert_int_equal(r[lag].hits[TM_REPLAY_BELADY], r[0].hits[TM_REPLAY_BELADY]);
            } else {
                uint64_t own[5];
                own_hits(log, &p, res[i], own);
                for (int q = 0; q < 5; q++) assert_int_equal(r[0].hits[q], own[q]);
            }
            assert_int_equal(
                r[lag].uploads[TM_REPLAY_STATIC] + r[lag].prompt_uploads[TM_REPLAY_STATIC], 0);
        }
    }
}

static void tmp_path(char *buf, size_t n, const char *name) {
    const char *t = getenv("TM_TEST_TMP");
    snprintf(buf, n, "%s/replay_%s", t && *t ? t : "/tmp", name);
}

static void test_topic_log(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "topic.bin");
    const syn_params sp = {.L = 4,
                           .E = 48,
                           .k = 4,
                           .n_seq = 16,
                           .prompt = 12,
                           .decode = 60,
                           .topic = 8,
                           .topic_share = 0.85,
                           .zipf = 0.8,
                           .seed = 1};
    tm_trace_log log;
    syn_log(&sp, path, &log);
    assert_int_equal(log.n_seq, 16);
    check_log_properties(&log);
    /* each sequence keeps to 8 experts of 48: recency wins at 25% (12 slots) */
    tm_replay_params p = cache_replay_params_default();
    tm_replay_result r;
    assert_int_equal(cache_replay(&log, &p, 0.25, &r), TM_OK);
    assert_int_equal(r.n_train, 8);
    assert_int_equal(r.decode_tokens, 8 * 60);
    assert_int_equal(r.routed, 8 * 60 * 4 * 4);
    assert_true(rate(&r, TM_REPLAY_LRU) > rate(&r, TM_REPLAY_STATIC) + 0.2);
    assert_true(rate(&r, TM_REPLAY_ADAPTIVE) > rate(&r, TM_REPLAY_STATIC) + 0.2);
    trace_log_free(&log);
}

static void test_stationary_log(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "iid.bin");
    const syn_params sp = {.L = 3,
                           .E = 64,
                           .k = 4,
                           .n_seq = 12,
                           .prompt = 16,
                           .decode = 80,
                           .topic = 0,
                           .zipf = 1.0,
                           .seed = 2};
    tm_trace_log log;
    syn_log(&sp, path, &log);
    check_log_properties(&log);
    /* the same distribution throughout: frequency wins; recency churns */
    tm_replay_params p = cache_replay_params_default();
    p.max_admit = 1;
    for (double res = 0.1; res < 0.5; res += 0.15) {
        tm_replay_result r;
        assert_int_equal(cache_replay(&log, &p, res, &r), TM_OK);
        assert_true(rate(&r, TM_REPLAY_STATIC) > rate(&r, TM_REPLAY_LRU) + 0.03);
        assert_true(rate(&r, TM_REPLAY_ADAPTIVE) > rate(&r, TM_REPLAY_STATIC) - 0.05);
        assert_true(rate(&r, TM_REPLAY_ADAPTIVE) > rate(&r, TM_REPLAY_LRU));
    }
    trace_log_free(&log);
}

static void test_counts_and_errors(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "counts.bin");
    const syn_params sp = {.L = 2,
                           .E = 16,
                           .k = 2,
                           .n_seq = 3,
                           .prompt = 5,
                           .decode = 4,
                           .topic = 3,
                           .topic_share = 0.5,
                           .zipf = 0.5,
                           .seed = 3};
    tm_trace_log log;
    syn_log(&sp, path, &log);
    tm_trace_stats c;
    assert_int_equal(cache_replay_counts(&log, 2, &c), TM_OK);
    for (uint32_t l = 0; l < 2; l++) {
        uint64_t hist[16] = {0};
        const tm_trace_log_layer *ly = &log.layers[l];
        for (uint64_t i = 0; i < ly->n_calls; i++)
            if (ly->calls[i].seq < 2)
                for (uint64_t j = 0; j < (uint64_t)ly->calls[i].n_tok * 2; j++)
                    hist[ly->ids[ly->calls[i].off + j]]++;
        assert_memory_equal(hist, c.layers[l].experts, sizeof(hist));
        assert_int_equal(c.layers[l].tokens, 2 * (5 + 4));
        assert_int_equal(c.layers[l].calls, 2 * 5);
    }
    trace_stats_free(&c);
    tm_replay_params p = cache_replay_params_default();
    tm_replay_result r;
    assert_int_equal(cache_replay(&log, &p, 0, &r), TM_ERR_ARG);
    assert_int_equal(cache_replay(&log, &p, 1.5, &r), TM_ERR_ARG);
    p.train_fraction = 1;
    assert_int_equal(cache_replay(&log, &p, 0.5, &r), TM_ERR_ARG);
    p = cache_replay_params_default();
    p.lag = -1;
    assert_int_equal(cache_replay(&log, &p, 0.5, &r), TM_ERR_ARG);
    /* train on nothing: the plan holds the lowest ids; everything is held out */
    p = cache_replay_params_default();
    p.train_fraction = 0;
    assert_int_equal(cache_replay(&log, &p, 0.5, &r), TM_OK);
    assert_int_equal(r.n_eval, 3);
    assert_int_equal(r.slots, 2 * 8);
    trace_log_free(&log);
    /* no sequences at all */
    tm_trace_log empty = {.shape = log.shape, .n_seq = 0};
    assert_int_equal(cache_replay(&empty, &p, 0.5, &r), TM_ERR_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_belady_exhaustive),
        cmocka_unit_test(test_topic_log),
        cmocka_unit_test(test_stationary_log),
        cmocka_unit_test(test_counts_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
