/* The expert usage tracer and its learn/perf files, checked against
 * independent computations and properties that must hold:
 * - counts through the callback path equal a histogram of the ids fed; the
 *   working set, reuse and window reuse equal brute-force recomputations over
 *   the same ids;
 *   a chained callback still sees every intermediate;
 * - on a real tiny mkmodel model (128 experts, top-8, skew 1), the tracer's
 *   per-expert counts equal the top-8 of the "router_logits" the forward
 *   emits, selected here by the test itself, token by token;
 * - JSON write -> read gives equal stats; the CSV has one row per layer and
 *   expert with the counts of the file;
 * - corrupt, truncated and mismatched files are rejected naming the file and
 *   the field;
 * - merging sums every counter; other shapes or windows are refused;
 * - a learn file written before window reuse existed (tests/data/trace/,
 *   made by the build before it) reads, and merges with a new one;
 * - skew numbers of uniform and one-expert layers are their closed forms;
 * - switches from the environment and flags. */
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
#include "model/model.h"
#include "model/synth.h"
#include "routing_test_util.h"
#include "trace/trace.h"

static const char *tmp_dir(void) {
    const char *t = getenv("TM_TEST_TMP");
    return t && *t ? t : "/tmp";
}

static void tmp_path(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/trace_%s", tmp_dir(), name);
}

/* A model struct with only what the tracer reads. */
static tm_model fake_model(uint32_t L, uint32_t E, uint32_t k) {
    static const tm_arch arch = {.name = "qwen3moe"};
    tm_model m = {0};
    m.arch = &arch;
    m.cfg.n_layer = L, m.cfg.n_expert = E, m.cfg.n_expert_used = k;
    return m;
}

typedef struct inner_log {
    int calls, topk_calls;
} inner_log;

static void inner_cb(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                     int64_t n, bool is_int) {
    inner_log *l = ud;
    l->calls++;
    l->topk_calls += !strcmp(name, "topk_ids");
    (void)layer, (void)data, (void)n_tok, (void)n, (void)is_int;
}

/* Emit one layer the way the forward does. */
static void emit_layer(tm_context_params *p, int layer, const int32_t *ids, int64_t n_tok,
                       int64_t k) {
    float dummy[1] = {0};
    p->cb(p->cb_ud, "attn_out", layer, dummy, n_tok, 1, false);
    p->cb(p->cb_ud, "router_logits", layer, dummy, n_tok, 1, false);
    p->cb(p->cb_ud, "topk_ids", layer, ids, n_tok, k, true);
    p->cb(p->cb_ud, "topk_weights", layer, dummy, n_tok, k, false);
    p->cb(p->cb_ud, "ffn_out", layer, dummy, n_tok, 1, false);
    p->cb(p->cb_ud, "x_out", layer, dummy, n_tok, 1, false);
}

/* How many of token t's experts one of tokens [t-R, t-1] used, by brute force. */
static uint32_t brute_reuse_window(const int32_t *ids, int64_t t, uint32_t R, uint32_t k) {
    uint32_t shared = 0;
    for (uint32_t j = 0; j < k; j++) {
        bool found = false;
        for (int64_t u = t - R; u < t && !found; u++)
            for (uint32_t q = 0; q < k; q++) found |= ids[u * k + q] == ids[t * k + j];
        shared += found;
    }
    return shared;
}

/* Distinct experts among tokens [t-W+1, t] of one sequence, by brute force. */
static uint32_t brute_ws(const int32_t *ids, int64_t t, uint32_t W, uint32_t E, uint32_t k) {
    bool seen[256] = {0};
    uint32_t d = 0;
    assert_true(E <= 256);
    for (int64_t u = t - W + 1; u <= t; u++)
        for (uint32_t j = 0; j < k; j++)
            if (!seen[ids[u * k + j]]) seen[ids[u * k + j]] = true, d++;
    return d;
}

static void test_counts_known_ids(void **state) {
    (void)state;
    const uint32_t L = 3, E = 40, k = 5, W = 7;
    tm_model m = fake_model(L, E, k);
    tm_trace_config cfg = {.stats = true, .window = W};
    tm_trace *tr;
    assert_int_equal(model_trace_create(&cfg, &m, &tr), TM_OK);
    inner_log inner = {0};
    tm_context_params p = {.cb = inner_cb, .cb_ud = &inner};
    trace_attach(tr, &p.cb, &p.cb_ud);
    trace_attach(tr, &p.cb, &p.cb_ud); /* twice is once */
    tm_rng r;
    tm_rng_seed(&r, 7);
    /* two sequences: a prompt batch of 13 then 9 single decode steps; then a prompt of 4 and 3
     * steps */
    const int64_t seq_prompt[2] = {13, 4}, seq_dec[2] = {9, 3};
    uint64_t hist[3][40] = {{0}}, ws_sum[3] = {0}, ws_n[3] = {0}, ws_max[3] = {0}, shared[3] = {0},
             pairs[3] = {0}, win_shared[3] = {0}, win_tokens[3] = {0};
    const uint32_t R = TM_TRACE_REUSE_WINDOW;
    int emitted = 0;
    for (int s = 0; s < 2; s++) {
        trace_sequence_begin(tr);
        const int64_t n = seq_prompt[s] + seq_dec[s];
        int32_t *ids[3];
        for (uint32_t l = 0; l < L; l++) {
            ids[l] = malloc((size_t)n * k * sizeof(int32_t));
            test_random_ids(&r, ids[l], n, E, k);
        }
        for (uint32_t l = 0; l < L; l++)
            emit_layer(&p, (int)l, ids[l], seq_prompt[s], k), emitted++;
        for (int64_t t = seq_prompt[s]; t < n; t++)
            for (uint32_t l = 0; l < L; l++)
                emit_layer(&p, (int)l, ids[l] + t * k, 1, k), emitted++;
        for (uint32_t l = 0; l < L; l++) {
            for (int64_t t = 0; t < n; t++) {
                for (uint32_t j = 0; j < k; j++) hist[l][ids[l][t * k + j]]++;
                if (t >= (int64_t)W - 1) {
                    uint32_t d = brute_ws(ids[l], t, W, E, k);
                    ws_sum[l] += d, ws_n[l]++;
                    if (d > ws_max[l]) ws_max[l] = d;
                }
                if (t >= (int64_t)R) {
                    win_shared[l] += brute_reuse_window(ids[l], t, R, k);
                    win_tokens[l]++;
                }
                if (t > 0) {
                    for (uint32_t j = 0; j < k; j++)
                        for (uint32_t q = 0; q < k; q++)
                            shared[l] += ids[l][t * k + j] == ids[l][(t - 1) * k + q];
                    pairs[l]++;
                }
            }
            free(ids[l]);
        }
    }
    const tm_trace_stats *st = trace_get_stats(tr);
    assert_int_equal(inner.calls, emitted * 6);
    assert_int_equal(inner.topk_calls, emitted);
    assert_int_equal(st->tokens, 13 + 9 + 4 + 3);
    for (uint32_t l = 0; l < L; l++) {
        const tm_trace_layer *ly = &st->layers[l];
        assert_int_equal(ly->calls, 2 + 9 + 3);
        assert_int_equal(ly->tokens, 29);
        assert_int_equal(ly->expert_hits_total, 29 * k);
        for (uint32_t e = 0; e < E; e++) assert_int_equal(ly->experts[e], hist[l][e]);
        for (uint32_t e = 0; e < E; e++)
            assert_int_equal(ly->hot_experts[e] + ly->cold_experts[e], 0);
        assert_int_equal(ly->ws_sum, ws_sum[l]);
        assert_int_equal(ly->ws_samples, ws_n[l]);
        assert_int_equal(ly->ws_max, ws_max[l]);
        assert_int_equal(ly->reuse_shared, shared[l]);
        assert_int_equal(ly->reuse_pairs, pairs[l]);
        assert_int_equal(ly->reuse_win_shared, win_shared[l]);
        assert_int_equal(ly->reuse_win_tokens, win_tokens[l]);
    }
    assert_int_equal(st->reuse_window, R);
    assert_int_equal(win_tokens[0], 22 - R); /* the second sequence (7 tokens) has none */
    trace_free(tr);
}

/* Window reuse on sequences whose answer is known by construction. */
static void test_reuse_window_known(void **state) {
    (void)state;
    const uint32_t E = 64, k = 4, R = TM_TRACE_REUSE_WINDOW;
    tm_model m = fake_model(1, E, k);
    tm_trace_config cfg = {.stats = true};
    tm_trace *tr;
    assert_int_equal(model_trace_create(&cfg, &m, &tr), TM_OK);
    int32_t ids[40 * 4];
    /* the same 4 experts every token: every token from the R-th on shares all 4 */
    for (int t = 0; t < 40; t++)
        for (uint32_t j = 0; j < k; j++) ids[t * k + j] = (int32_t)j;
    trace_sequence_begin(tr);
    trace_record(tr, 0, ids, 40);
    const tm_trace_layer *ly = &trace_get_stats(tr)->layers[0];
    assert_int_equal(ly->reuse_win_tokens, 40 - R);
    assert_int_equal(ly->reuse_win_shared, (40 - R) * k);
    /* 16 disjoint sets in turn (token t uses 4 (t mod 16) + j): a set comes back after 16
     * tokens, beyond the window, so none is shared; one token at a time, as decode feeds it */
    trace_sequence_begin(tr);
    for (int t = 0; t < 40; t++) {
        int32_t row[4];
        for (uint32_t j = 0; j < k; j++) row[j] = (int32_t)(4 * (t % 16) + j);
        trace_record(tr, 0, row, 1);
    }
    assert_int_equal(ly->reuse_win_tokens, 2 * (40 - R));
    assert_int_equal(ly->reuse_win_shared, (40 - R) * k);
    /* period R: token t's set was used exactly R tokens earlier, the edge of the window */
    trace_sequence_begin(tr);
    for (int t = 0; t < 40; t++)
        for (uint32_t j = 0; j < k; j++) ids[t * k + j] = (int32_t)(4 * (t % R) + j);
    trace_record(tr, 0, ids, 40);
    assert_int_equal(ly->reuse_win_tokens, 3 * (40 - R));
    assert_int_equal(ly->reuse_win_shared, 2 * (40 - R) * k);
    trace_free(tr);
}

/* ---- the real forward ---- */

typedef struct route_check {
    uint32_t L, E, k;
    uint64_t *hist;   /* [L][E]: top-k of router_logits, selected here */
    uint64_t tokens0; /* tokens seen at layer 0 */
} route_check;

static void route_cb(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                     int64_t n, bool is_int) {
    route_check *rc = ud;
    if (strcmp(name, "router_logits") || layer < 0) return;
    assert_false(is_int);
    assert_int_equal(n, rc->E);
    const float *lg = data;
    if (layer == 0) rc->tokens0 += (uint64_t)n_tok;
    for (int64_t t = 0; t < n_tok; t++) {
        bool taken[256] = {0};
        for (uint32_t j = 0; j < rc->k;
             j++) { /* softmax is monotonic: the top-k probabilities are the top-k logits */
            int best = -1;
            for (uint32_t e = 0; e < rc->E; e++)
                if (!taken[e] && (best < 0 || lg[t * n + e] > lg[t * n + best])) best = (int)e;
            taken[best] = true;
            rc->hist[(size_t)layer * rc->E + (size_t)best]++;
        }
    }
}

static void test_counts_real_model(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "tiny.gguf");
    tm_synth_config sc;
    assert_int_equal(synth_config_preset(&sc, "tiny"), TM_OK);
    sc.n_layer = 2, sc.n_expert = 128, sc.n_expert_used = 8, sc.skew = 1.0, sc.n_threads = 1,
    sc.seed = 5;
    assert_int_equal(synth_model_write(&sc, path), TM_OK);
    tm_model *m;
    assert_int_equal(model_load(path, &m), TM_OK);
    route_check rc = {m->cfg.n_layer, m->cfg.n_expert, m->cfg.n_expert_used, NULL, 0};
    rc.hist = calloc((size_t)rc.L * rc.E, sizeof(uint64_t));
    tm_trace_config cfg = {.stats = true};
    tm_trace *tr;
    assert_int_equal(model_trace_create(&cfg, m, &tr), TM_OK);
    tm_context_params cp = {
        .n_ctx = 128, .n_batch = 16, .n_threads = 2, .cb = route_cb, .cb_ud = &rc};
    trace_attach(tr, &cp.cb, &cp.cb_ud);
    tm_context *ctx;
    assert_int_equal(model_context_create(m, &cp, &ctx), TM_OK);
    tm_rng r;
    tm_rng_seed(&r, 3);
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % m->cfg.n_vocab);
    /* 30 prompt tokens in batches of 16 (2 calls), then 10 decode steps */
    assert_int_equal(model_decode(ctx, toks, 30, TM_MOE_PHASE_PROMPT, false), TM_OK);
    for (int i = 30; i < 40; i++)
        assert_int_equal(model_decode(ctx, toks + i, 1, TM_MOE_PHASE_DECODE, false), TM_OK);
    const tm_trace_stats *st = trace_get_stats(tr);
    /* model_trace_create handed the tracer the model's shape and its routing label */
    assert_string_equal(st->shape.arch, m->arch->name);
    assert_int_equal(st->shape.n_layer, 2);
    assert_int_equal(st->shape.n_expert, 128);
    assert_int_equal(st->shape.n_expert_used, 8);
    if (!strstr(st->routing, "skew 1")) fail_msg("routing label '%s' lacks 'skew 1'", st->routing);
    assert_int_equal(rc.tokens0, 40);
    assert_int_equal(st->tokens, 40);
    uint64_t distinct = 0;
    for (uint32_t l = 0; l < rc.L; l++) {
        assert_int_equal(st->layers[l].calls, 2 + 10);
        assert_int_equal(st->layers[l].tokens, 40);
        assert_int_equal(st->layers[l].expert_hits_total, 40 * rc.k);
        for (uint32_t e = 0; e < rc.E; e++) {
            assert_int_equal(st->layers[l].experts[e], rc.hist[(size_t)l * rc.E + e]);
            distinct += rc.hist[(size_t)l * rc.E + e] > 0;
        }
        assert_true(st->layers[l].experts_ns > 0 && st->layers[l].routing_ns > 0);
    }
    assert_true(distinct > 2 * rc.k); /* the comparison saw real routing, not a constant */
    model_context_free(ctx);
    trace_free(tr);
    free(rc.hist);
    model_free(m);
    remove(path);
}

/* ---- files ---- */

/* Random but consistent stats (through the tracer, so hits = tokens * k). */
static void make_stats(tm_trace_stats *out, uint32_t L, uint32_t E, uint32_t k, uint64_t seed) {
    tm_model m = fake_model(L, E, k);
    tm_trace_config cfg = {.stats = true, .window = 5};
    tm_trace *tr;
    assert_int_equal(model_trace_create(&cfg, &m, &tr), TM_OK);
    tm_rng r;
    tm_rng_seed(&r, seed);
    int32_t ids[20 * 8];
    for (int step = 0; step < 6; step++)
        for (uint32_t l = 0; l < L; l++) {
            const int64_t n = 1 + (int64_t)(tm_rng_u64(&r) % 20);
            test_random_ids(&r, ids, n, E, k);
            trace_record(tr, l, ids, n);
        }
    const tm_trace_stats *s = trace_get_stats(tr);
    assert_int_equal(trace_stats_init(out, &s->shape, s->window), TM_OK);
    assert_int_equal(trace_stats_merge(out, s, "x"), TM_OK);
    for (uint32_t l = 0; l < L; l++) {
        tm_trace_layer *ly = &out->layers[l];
        ly->routing_ns = tm_rng_u64(&r) >> 20, ly->experts_ns = tm_rng_u64(&r) >> 20;
        ly->merge_ns = l, ly->wait_ns = 2 * l;
        ly->hot_experts[l % E] = 3, ly->cold_experts[(l + 1) % E] = 4;
        ly->hot_slots_total = 3, ly->cold_slots_total = 4;
    }
    trace_free(tr);
}

static void test_json_round_trip(void **state) {
    (void)state;
    char path[512], csv[512];
    tmp_path(path, sizeof(path), "rt.json");
    tmp_path(csv, sizeof(csv), "rt.csv");
    tm_trace_stats a, b;
    make_stats(&a, 4, 24, 6, 11);
    assert_int_equal(trace_stats_write_json(&a, path), TM_OK);
    assert_int_equal(trace_stats_read_json(path, &a.shape, &b), TM_OK);
    assert_true(trace_stats_equal(&a, &b));
    trace_stats_free(&b);
    assert_int_equal(trace_stats_read_json(path, NULL, &b), TM_OK);
    assert_true(trace_stats_equal(&a, &b));
    b.layers[2].experts[5]++;
    assert_false(trace_stats_equal(&a, &b));
    trace_stats_free(&b);

    /* CSV: header + one row per layer and expert, with the file's counts */
    assert_int_equal(trace_stats_write_csv(&a, csv), TM_OK);
    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof(line), f));
    assert_string_equal(line, "layer,expert,hits,hot,cold,share\n");
    unsigned rows = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned l, e;
        unsigned long long hits, hot, cold;
        double share;
        assert_int_equal(
            sscanf(line, "%u,%u,%llu,%llu,%llu,%lf", &l, &e, &hits, &hot, &cold, &share), 6);
        assert_int_equal(l, rows / 24);
        assert_int_equal(e, rows % 24);
        assert_int_equal(hits, a.layers[l].experts[e]);
        assert_int_equal(hot, a.layers[l].hot_experts[e]);
        assert_int_equal(cold, a.layers[l].cold_experts[e]);
        assert_true(fabs(share - (double)hits / a.layers[l].expert_hits_total) < 1e-5);
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, 4 * 24);
    trace_stats_free(&a);
    remove(path), remove(csv);
}

static void write_text(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* Replace the first `from` in text with `to` (the result is new). */
static char *replace(const char *text, const char *from, const char *to) {
    const char *p = strstr(text, from);
    assert_non_null(p);
    size_t n = strlen(text) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
    return out;
}

static void expect_reject(const char *path, const char *text, size_t n,
                          const tm_trace_shape *expect, const char *field) {
    write_text(path, text, n);
    tm_trace_stats s;
    tm_status st = trace_stats_read_json(path, expect, &s);
    if (st == TM_OK) fail_msg("accepted a bad file (want an error naming '%s')", field);
    const char *msg = tm_error_message();
    if (!strstr(msg, path) || !strstr(msg, field))
        fail_msg("message '%s' does not name the file and '%s'", msg, field);
    assert_null(s.layers);
}

static void test_bad_files(void **state) {
    (void)state;
    char good[512], bad[512];
    tmp_path(good, sizeof(good), "good.json");
    tmp_path(bad, sizeof(bad), "bad.json");
    tm_trace_stats a;
    make_stats(&a, 2, 16, 4, 3);
    snprintf(a.routing, sizeof(a.routing), "uniform");
    assert_int_equal(trace_stats_write_json(&a, good), TM_OK);
    char *text = read_text(good);
    const size_t n = strlen(text);
    struct {
        const char *from, *to, *field;
    } cases[] = {
        {"\"format\":\"tiermoe-moe-layer-perf\"", "\"format\":\"other\"", "format"},
        {"\"version\":1", "\"version\":2", "version"},
        {"\"n_expert\":16", "\"n_expert\":\"16\"", "model.n_expert"},
        {"\"calls\":", "\"callz\":", "layers[0].calls"},
        {"\"tokens\":", "\"tokens\":-", "tokens"},
        {"\"experts\":[", "\"experts\":[0,", "layers[0].experts: 17 entries"},
        {"\"hot_experts\":[", "\"hot_experts\":7,\"x\":[", "layers[0].hot_experts"},
        {"\"layer\":1", "\"layer\":5", "layers[1].layer"},
        {"\"n_layer\":2", "\"n_layer\":3", "layers: 2 entries"},
        {"\"window\":5", "\"window\":0", "window"},
        {"\"layers\":[", "\"layerz\":[", "layers"},
        {"\"reuse_window\":8", "\"reuse_window\":-8", "reuse_window"},
        {"\"reuse_window_tokens\":", "\"reuse_window_tokenz\":", "layers[0].reuse_window_tokens"},
        {"\"reuse_window_shared\":", "\"reuse_window_shared\":1e9,\"x\":",
         "layers[0].reuse_window_shared"},
        {"\"synthetic_routing\":\"", "\"synthetic_routing\":7,\"x\":\"", "model.synthetic_routing"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *t = replace(text, cases[i].from, cases[i].to);
        expect_reject(bad, t, strlen(t), NULL, cases[i].field);
        free(t);
    }
    /* counts that do not add up */
    {
        char key[64];
        snprintf(key, sizeof(key), "\"expert_hits_total\":%llu",
                 (unsigned long long)a.layers[0].expert_hits_total);
        char val[64];
        snprintf(val, sizeof(val), "\"expert_hits_total\":%llu",
                 (unsigned long long)a.layers[0].expert_hits_total + 1);
        char *t = replace(text, key, val);
        expect_reject(bad, t, strlen(t), NULL, "layers[0].expert_hits_total");
        free(t);
    }
    /* more window-shared experts than the window's tokens can hold */
    {
        char key[64];
        snprintf(key, sizeof(key), "\"reuse_window_tokens\":%llu",
                 (unsigned long long)a.layers[0].reuse_win_tokens);
        assert_true(a.layers[0].reuse_win_shared > 0);
        char *t = replace(text, key, "\"reuse_window_tokens\":0");
        expect_reject(bad, t, strlen(t), NULL, "layers[0].reuse_window_");
        free(t);
    }
    /* one count negative or not a number, the length kept */
    {
        char key[64];
        snprintf(key, sizeof(key), "\"experts\":[%llu,",
                 (unsigned long long)a.layers[0].experts[0]);
        char *t = replace(text, key, "\"experts\":[-1,");
        expect_reject(bad, t, strlen(t), NULL, "layers[0].experts[0]");
        free(t);
        t = replace(text, key, "\"experts\":[\"x\",");
        expect_reject(bad, t, strlen(t), NULL, "layers[0].experts[0]");
        free(t);
    }
    /* truncated at several places, not JSON, empty, missing file */
    for (size_t cut = 1; cut + 1 < n; cut += n / 7) /* not n - 1: only the newline gone */
        expect_reject(bad, text, cut, NULL, "not valid JSON");
    expect_reject(bad, "[1,2]", 5, NULL, "object");
    expect_reject(bad, "", 0, NULL, "not valid JSON");
    remove(bad);
    tm_trace_stats s;
    assert_int_not_equal(trace_stats_read_json(bad, NULL, &s), TM_OK);
    assert_non_null(strstr(tm_error_message(), bad));
    /* the model does not match: other expert / layer / used counts, other architecture */
    tm_trace_shape sh = a.shape;
    sh.n_expert = 32;
    expect_reject(bad, text, n, &sh, "model.n_expert is 16, the model has 32");
    sh = a.shape, sh.n_layer = 3;
    expect_reject(bad, text, n, &sh, "model.n_layer is 2, the model has 3");
    sh = a.shape, sh.n_expert_used = 8;
    expect_reject(bad, text, n, &sh, "model.n_expert_used");
    sh = a.shape, snprintf(sh.arch, sizeof(sh.arch), "gpt-oss");
    expect_reject(bad, text, n, &sh, "model.arch");
    /* the good file still reads */
    assert_int_equal(trace_stats_read_json(good, &a.shape, &s), TM_OK);
    trace_stats_free(&s);
    free(text);
    trace_stats_free(&a);
    remove(good), remove(bad);
}

static void test_merge(void **state) {
    (void)state;
    tm_trace_stats a, b, c;
    make_stats(&a, 3, 20, 4, 1);
    make_stats(&b, 3, 20, 4, 2);
    make_stats(&c, 3, 20, 4, 1); /* a copy of a */
    assert_int_equal(trace_stats_merge(&c, &b, "b"), TM_OK);
    assert_int_equal(c.tokens, a.tokens + b.tokens);
    for (uint32_t l = 0; l < 3; l++) {
        const tm_trace_layer *x = &a.layers[l], *y = &b.layers[l], *z = &c.layers[l];
        assert_int_equal(z->calls, x->calls + y->calls);
        assert_int_equal(z->tokens, x->tokens + y->tokens);
        assert_int_equal(z->expert_hits_total, x->expert_hits_total + y->expert_hits_total);
        assert_int_equal(z->hot_slots_total, x->hot_slots_total + y->hot_slots_total);
        assert_int_equal(z->routing_ns, x->routing_ns + y->routing_ns);
        assert_int_equal(z->experts_ns, x->experts_ns + y->experts_ns);
        assert_int_equal(z->ws_sum, x->ws_sum + y->ws_sum);
        assert_int_equal(z->ws_samples, x->ws_samples + y->ws_samples);
        assert_int_equal(z->ws_max, x->ws_max > y->ws_max ? x->ws_max : y->ws_max);
        assert_int_equal(z->reuse_shared, x->reuse_shared + y->reuse_shared);
        assert_int_equal(z->reuse_win_shared, x->reuse_win_shared + y->reuse_win_shared);
        assert_int_equal(z->reuse_win_tokens, x->reuse_win_tokens + y->reuse_win_tokens);
        for (uint32_t e = 0; e < 20; e++) {
            assert_int_equal(z->experts[e], x->experts[e] + y->experts[e]);
            assert_int_equal(z->hot_experts[e], x->hot_experts[e] + y->hot_experts[e]);
            assert_int_equal(z->cold_experts[e], x->cold_experts[e] + y->cold_experts[e]);
        }
    }
    /* a merged file is a valid file */
    char path[512];
    tmp_path(path, sizeof(path), "merged.json");
    tm_trace_stats d;
    assert_int_equal(trace_stats_write_json(&c, path), TM_OK);
    assert_int_equal(trace_stats_read_json(path, &c.shape, &d), TM_OK);
    assert_true(trace_stats_equal(&c, &d));
    trace_stats_free(&d);
    remove(path);
    /* shapes must match */
    tm_trace_stats other;
    make_stats(&other, 3, 24, 4, 1);
    assert_int_not_equal(trace_stats_merge(&c, &other, "other.json"), TM_OK);
    assert_non_null(strstr(tm_error_message(), "other.json"));
    trace_stats_free(&other);
    make_stats(&other, 3, 20, 4, 1);
    other.window = 9;
    assert_int_not_equal(trace_stats_merge(&c, &other, "w.json"), TM_OK);
    assert_non_null(strstr(tm_error_message(), "window"));
    trace_stats_free(&other);
    make_stats(&other, 3, 20, 4, 1);
    other.reuse_window = 4;
    assert_int_not_equal(trace_stats_merge(&c, &other, "rw.json"), TM_OK);
    assert_non_null(strstr(tm_error_message(), "reuse_window"));
    trace_stats_free(&other);
    /* the routing label: kept when equal, "mixed" when not */
    make_stats(&other, 3, 20, 4, 1);
    snprintf(other.routing, sizeof(other.routing), "uniform");
    assert_int_equal(trace_stats_merge(&c, &other, "o"), TM_OK);
    assert_string_equal(c.routing, "mixed");
    trace_stats_free(&other);
    trace_stats_free(&a), trace_stats_free(&b), trace_stats_free(&c);
}

/* A learn file of the build before window reuse and the routing label
 * (tests/data/trace/learn_v1_old.json: tiny preset, written by that build's
 * `tiermoe trace`): it still reads, with no window-reuse counts, and merges
 * with a new file into the new one's counts. */
static void test_old_file(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    char old[512], path[512];
    snprintf(old, sizeof(old), "%s/trace/learn_v1_old.json", data && *data ? data : "tests/data");
    tm_trace_stats o, n, sum;
    assert_int_equal(trace_stats_read_json(old, NULL, &o), TM_OK);
    assert_int_equal(o.reuse_window, 0);
    assert_string_equal(o.routing, "");
    assert_true(o.tokens > 0 && o.layers[0].reuse_pairs > 0);
    for (uint32_t l = 0; l < o.shape.n_layer; l++)
        assert_true(o.layers[l].reuse_win_shared == 0 && o.layers[l].reuse_win_tokens == 0);
    make_stats(&n, o.shape.n_layer, o.shape.n_expert, o.shape.n_expert_used, 9);
    n.window = o.window;
    assert_true(n.layers[0].reuse_win_tokens > 0);
    /* old + new and new + old: the window reuse is the new file's, the rest sums */
    for (int order = 0; order < 2; order++) {
        const tm_trace_stats *first = order ? &n : &o, *second = order ? &o : &n;
        assert_int_equal(trace_stats_init(&sum, &first->shape, first->window), TM_OK);
        sum.reuse_window = 0;
        assert_int_equal(trace_stats_merge(&sum, first, "first"), TM_OK);
        assert_int_equal(trace_stats_merge(&sum, second, "second"), TM_OK);
        assert_int_equal(sum.reuse_window, TM_TRACE_REUSE_WINDOW);
        assert_int_equal(sum.tokens, o.tokens + n.tokens);
        for (uint32_t l = 0; l < o.shape.n_layer; l++) {
            assert_int_equal(sum.layers[l].reuse_win_shared, n.layers[l].reuse_win_shared);
            assert_int_equal(sum.layers[l].reuse_win_tokens, n.layers[l].reuse_win_tokens);
            assert_int_equal(sum.layers[l].reuse_pairs,
                             o.layers[l].reuse_pairs + n.layers[l].reuse_pairs);
        }
        /* and the merged file is a new file that reads back the same */
        tmp_path(path, sizeof(path), "old_new.json");
        tm_trace_stats back;
        assert_int_equal(trace_stats_write_json(&sum, path), TM_OK);
        assert_int_equal(trace_stats_read_json(path, NULL, &back), TM_OK);
        assert_true(trace_stats_equal(&sum, &back));
        trace_stats_free(&back), trace_stats_free(&sum);
        remove(path);
    }
    trace_stats_free(&o), trace_stats_free(&n);
}

static void test_skew(void **state) {
    (void)state;
    tm_trace_shape sh = {"qwen3moe", 2, 128, 8};
    tm_trace_stats s;
    assert_int_equal(trace_stats_init(&s, &sh, 0), TM_OK);
    for (uint32_t e = 0; e < 128; e++) s.layers[0].experts[e] = 10;
    s.layers[1].experts[77] = 80;
    tm_trace_skew k;
    trace_layer_skew(&s, 0, &k);
    assert_true(fabs(k.entropy - 1) < 1e-12);
    assert_int_equal(k.n_top[0], 13), assert_int_equal(k.n_top[1], 32),
        assert_int_equal(k.n_top[2], 64);
    assert_true(fabs(k.top[0] - 13.0 / 128) < 1e-12 && fabs(k.top[1] - 0.25) < 1e-12 &&
                fabs(k.top[2] - 0.5) < 1e-12);
    assert_int_equal(k.n_used, 128);
    assert_true(fabs(k.top1 - 1.0 / 128) < 1e-12);
    trace_layer_skew(&s, 1, &k);
    assert_true(fabs(k.entropy) < 1e-12 && k.top[0] == 1 && k.n_used == 1 && k.top1 == 1);
    /* two experts with 3:1 hits: entropy H(3/4) / log 128 */
    memset(s.layers[1].experts, 0, 128 * sizeof(uint64_t));
    s.layers[1].experts[5] = 30, s.layers[1].experts[9] = 90;
    trace_layer_skew(&s, 1, &k);
    const double h = -(0.75 * log(0.75) + 0.25 * log(0.25)) / log(128.0);
    assert_true(fabs(k.entropy - h) < 1e-12);
    assert_true(fabs(k.top1 - 0.75) < 1e-12);
    trace_stats_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_known_ids),
        cmocka_unit_test(test_reuse_window_known),
        cmocka_unit_test(test_old_file),
        cmocka_unit_test(test_counts_real_model),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_skew),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
