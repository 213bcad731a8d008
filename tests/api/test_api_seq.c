/* test_api's sequences (test_api.c says what the program is): two sequences in one
 * context, a plan applied between their steps, and several sequences' prompts in one step
 * give each sequence's tokens evaluated alone; prompt reuse; the expert counters and plans;
 * each GPU's counters and cache over two mock GPUs. */
#include "test_api.h"

static int32_t argmax(const float *v, uint32_t n) {
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = (int32_t)i;
    return best;
}

/* The greedy tokens of prompt evaluated alone. */
static void alone(const int32_t *prompt, int64_t n, int32_t *out) {
    tm_context_opts o;
    opts_for(&o, 1);
    tm_context *c = NULL;
    CHECK(tm_context_create(model, &o, &c));
    CHECK(tm_eval(c, 0, prompt, n));
    for (int i = 0; i < N_GEN; i++) {
        const float *l;
        CHECK(tm_logits(c, 0, &l));
        out[i] = argmax(l, info.n_vocab);
        CHECK(tm_eval(c, 0, &out[i], 1));
    }
    tm_context_free(c);
}

static const char plan_json[] =
    "{\"format\":\"tiermoe-moe-plan\",\"version\":1,\"model\":{\"arch\":\"qwen3moe\","
    "\"n_layer\":3,\"n_expert\":16,\"n_expert_used\":4},\"weighting\":\"flat\","
    "\"layer_curve\":1.0,\"budget_bytes\":24,\"used_bytes\":24,\"layers\":["
    "{\"layer\":0,\"expert_bytes\":1,\"experts\":[15,14,13,12,11,10,9,8]},"
    "{\"layer\":1,\"expert_bytes\":1,\"experts\":[8,9,10,11,12,13,14,15]},"
    "{\"layer\":2,\"expert_bytes\":1,\"experts\":[7,15,6,14,5,13,4,12]}]}";

/* Apply plan_json to c and check the cache holds each layer's first n_slots experts. */
static void apply_plan(tm_context *c) {
    const char *bad = "{\"format\":\"tiermoe-moe-plan\",\"version\":1,\"model\":{\"arch\":"
                      "\"qwen3moe\",\"n_layer\":3,\"n_expert\":64,\"n_expert_used\":4}}";
    EXPECT(TM_ERR_FORMAT, "n_expert", tm_cache_apply(c, bad, strlen(bad), NULL));
    tm_context_info ci;
    CHECK(tm_context_describe(c, &ci));
    int32_t changed = -1;
#ifndef TM_API_MOCKGPU
    assert_false(ci.cache);
    EXPECT(TM_ERR_UNSUPPORTED, "no VRAM expert cache",
           tm_cache_apply(c, plan_json, strlen(plan_json), &changed));
    assert_int_equal(changed, -1);
    size_t n_slots = 1;
    CHECK(tm_cache_experts(c, 0, NULL, 0, &n_slots));
    assert_int_equal(n_slots, 0);
#else
    assert_true(ci.cache);
    CHECK(tm_cache_apply(c, plan_json, strlen(plan_json), &changed));
    static const int32_t want[3][8] = {{15, 14, 13, 12, 11, 10, 9, 8},
                                       {8, 9, 10, 11, 12, 13, 14, 15},
                                       {7, 15, 6, 14, 5, 13, 4, 12}};
    int32_t total = 0;
    for (uint32_t l = 0; l < 3; l++) {
        int32_t in[16];
        size_t n_slots = 0;
        CHECK(tm_cache_experts(c, l, in, 16, &n_slots));
        assert_true(n_slots >= 1 && n_slots <= 8);
        total += (int32_t)n_slots;
        for (size_t i = 0; i < n_slots; i++) { /* slot order is the tier's: compare as sets */
            bool found = false;
            for (size_t k = 0; k < n_slots; k++) found |= in[k] == want[l][i];
            if (!found) fail_msg("layer %u: planned expert %d is not cached", l, want[l][i]);
        }
    }
    /* the cache held the lowest ids: every slot but layer 2's 7, 6, 5, 4 changes */
    assert_true(changed > 0 && changed <= total);
    CHECK(tm_cache_apply(c, plan_json, strlen(plan_json), &changed));
    assert_int_equal(changed, 0); /* already applied */
#endif
}

/* Two prompts (Qwen3 token ids) the sequence tests share. */
static const int32_t pa[] = {9707, 1879, 11, 419, 374, 264, 1273};
static const int32_t pb[] = {785, 6722, 315, 9625, 374};

/* The greedy tokens of pa and pb each alone, and a context of two empty sequences. */
static tm_context *two_prompts(int32_t *ta, int32_t *tb) {
    alone(pa, 7, ta);
    alone(pb, 5, tb);
    tm_context_opts o;
    opts_for(&o, 2);
    tm_context *c = NULL;
    CHECK(tm_context_create(model, &o, &c));
    return c;
}

/* Three sequences' prompts in one step (tm_eval_batch: runs of 7, 3 and 5 rows, the
 * second on a sequence holding 2 tokens already): each run's logits are those of its
 * prompt evaluated alone (tm_eval), and decoding on gives alone's tokens. */
void test_batch_prompts(void **state) {
    (void)state;
    int32_t ta[N_GEN], tb[N_GEN];
    alone(pa, 7, ta);
    alone(pb, 5, tb);
    tm_context *c = NULL, *r = NULL;
    tm_context_opts o;
    opts_for(&o, 1);
    CHECK(tm_context_create(model, &o, &r));
    float *ref = malloc(2 * (size_t)info.n_vocab * sizeof(float));
    assert_non_null(ref);
    const float *l;
    for (int i = 0; i < 2; i++) {
        CHECK(tm_eval(r, 0, i ? pb : pa, i ? 5 : 7));
        CHECK(tm_logits(r, 0, &l));
        memcpy(ref + (size_t)i * info.n_vocab, l, info.n_vocab * sizeof(float));
        CHECK(tm_seq_rewind(r, 0, 0, NULL));
    }
    tm_context_free(r);
    opts_for(&o, 3);
    CHECK(tm_context_create(model, &o, &c));
    CHECK(tm_eval(c, 2, pb, 2));
    int32_t seqs[15], toks[15];
    for (int i = 0; i < 15; i++) /* seq 0: pa; seq 2: pb[2..5); seq 1: pb */
        seqs[i] = i < 7    ? 0
                  : i < 10 ? 2
                           : 1,
        toks[i] = i < 7    ? pa[i]
                  : i < 10 ? pb[i - 5]
                           : pb[i - 10];
    CHECK(tm_eval_batch(c, 15, seqs, toks));
    const int32_t which[3] = {0, 1, 1}, len[3] = {7, 5, 5};
#ifdef TM_API_MOCKGPU /* a step of more than 8 rows takes the GPU's batched products, whose
                         inputs the mock rounds as tensor cores do (alone's 7 rows do not):
                         up to 0.014 measured; the rows at wrong positions differ by 0.66 */
    const float tol = 0.05f;
#else /* the CPU's products give the same bits in any batch (test_cpu_gemm): 0 measured */
    const float tol = 1e-3f;
#endif
    int32_t g[3][N_GEN];
    for (int q = 0; q < 3; q++) {
        int64_t n = 0;
        CHECK(tm_seq_length(c, q, &n));
        assert_int_equal(n, len[q]);
        CHECK(tm_logits(c, q, &l));
        const float *want = ref + (size_t)which[q] * info.n_vocab;
        for (uint32_t v = 0; v < info.n_vocab; v++)
            if (l[v] - want[v] > tol || want[v] - l[v] > tol)
                fail_msg("sequence %d, logit %u: %g, alone %g", q, v, (double)l[v],
                         (double)want[v]);
    }
    for (int i = 0; i < N_GEN; i++) { /* decode on, the three together */
        int32_t ids[3];
        for (int q = 0; q < 3; q++) {
            CHECK(tm_logits(c, q, &l));
            g[q][i] = ids[q] = argmax(l, info.n_vocab);
        }
        CHECK(tm_eval_rows(c, 3, (const int32_t[]){0, 1, 2}, ids));
    }
    assert_memory_equal(g[0], ta, sizeof(ta));
    assert_memory_equal(g[1], tb, sizeof(tb));
    assert_memory_equal(g[2], tb, sizeof(tb));
    const int32_t apart[3] = {0, 1, 0};
    EXPECT(TM_ERR_ARG, "not consecutive", tm_eval_batch(c, 3, apart, toks));
    EXPECT(TM_ERR_ARG, "n 0", tm_eval_batch(c, 0, apart, toks));
    EXPECT(TM_ERR_ARG, "seqs[0] is 3", tm_eval_batch(c, 1, (const int32_t[]){3}, toks));
    static int32_t zeros[128];
    EXPECT(TM_ERR_ARG, "do not fit", tm_eval_batch(c, 128, zeros, zeros));
    free(ref);
    tm_context_free(c);
}

/* Two sequences in one context, stepped together (tm_eval_rows), a plan applied
 * halfway: each gives the tokens it gives alone. */
void test_two_sequences(void **state) {
    (void)state;
    int32_t ta[N_GEN], tb[N_GEN];
    tm_context *c = two_prompts(ta, tb);
    CHECK(tm_eval(c, 0, pa, 7));
    CHECK(tm_eval(c, 1, pb, 5));
    int32_t ga[N_GEN], gb[N_GEN];
    for (int i = 0; i < N_GEN; i++) {
        if (i == N_GEN / 2) apply_plan(c);
        if (i == N_GEN / 2 + 2) CHECK(tm_cache_update(c)); /* as serve between requests */
        const float *la, *lb;
        CHECK(tm_logits(c, 0, &la));
        CHECK(tm_logits(c, 1, &lb));
        ga[i] = argmax(la, info.n_vocab), gb[i] = argmax(lb, info.n_vocab);
        const int32_t seqs[2] = {1, 0}, toks[2] = {gb[i], ga[i]};
        CHECK(tm_eval_rows(c, 2, seqs, toks));
    }
    assert_memory_equal(ga, ta, sizeof(ta));
    assert_memory_equal(gb, tb, sizeof(tb));
    int64_t n = 0;
    CHECK(tm_seq_length(c, 0, &n));
    assert_int_equal(n, 7 + N_GEN);
    /* every token routed to n_expert_used experts of each layer */
    for (uint32_t l = 0; l < info.n_layer; l++) {
        uint64_t counts[16], sum = 0;
        CHECK(tm_expert_counts(c, l, counts, 16));
        for (int e = 0; e < 16; e++) sum += counts[e];
        assert_int_equal(sum, (7 + 5 + 2 * N_GEN) * info.n_expert_used);
    }
    CHECK(tm_expert_counts_reset(c));
    uint64_t counts[16] = {1};
    CHECK(tm_expert_counts(c, 0, counts, 16));
    assert_int_equal(counts[0], 0);

    /* rewinding sequence 0 to its prompt and greedy again gives the same tokens */
    int64_t kept = -1;
    CHECK(tm_seq_rewind(c, 0, 6, &kept));
    assert_int_equal(kept, 6);
    const float *l;
    EXPECT(TM_ERR_ARG, "no logits", tm_logits(c, 0, &l));
    CHECK(tm_eval(c, 0, pa + 6, 1));
    tm_sampler_params sp;
    tm_sampler_params_init(&sp);
    sp.temp = 0;
    tm_sampler *s = NULL;
    CHECK(tm_sampler_create(model, &sp, &s));
    int32_t id = -1;
    CHECK(tm_sample(s, c, 0, &id));
    assert_int_equal(id, ta[0]);
    tm_sampler_free(s);
    tm_context_free(c);
}

/* Prompt prefix reuse (tm_seq_shared, tm_seq_prompt), a sequence's tokens,
 * logits read in place after a step and kept once another step runs, and
 * sampling given logits and a history: against the tokens of each prompt
 * evaluated alone (tm_eval), and tm_sample's. */
void test_prompt_reuse(void **state) {
    (void)state;
    int32_t ta[N_GEN], tb[N_GEN];
    tm_context *c = two_prompts(ta, tb);
    int64_t n_eval = -1, keep = -1, n = -1;
    CHECK(tm_seq_shared(c, 0, pa, 7, &keep));
    assert_int_equal(keep, 0);
    CHECK(tm_seq_prompt(c, 0, pa, 7, &n_eval));
    assert_int_equal(n_eval, 7);
    const int32_t *held = NULL;
    CHECK(tm_seq_tokens(c, 0, &held, &n));
    assert_int_equal(n, 7);
    assert_memory_equal(held, pa, sizeof(pa));
    const float *l0, *l1;
    CHECK(tm_logits(c, 0, &l0));
    assert_int_equal(argmax(l0, info.n_vocab), ta[0]);

    /* the prompt grown by two generated tokens: 7 kept, 2 evaluated */
    int32_t grown[9];
    memcpy(grown, pa, sizeof(pa));
    grown[7] = ta[0], grown[8] = ta[1];
    CHECK(tm_seq_shared(c, 0, pa, 7, &keep));
    assert_int_equal(keep, 6); /* never the last token: its logits are needed */
    CHECK(tm_seq_shared(c, 0, grown, 9, &keep));
    assert_int_equal(keep, 7);
    CHECK(tm_seq_shared(c, 0, pb, 5, &keep));
    assert_int_equal(keep, 0);
    CHECK(tm_seq_prompt(c, 0, grown, 9, &n_eval));
    assert_int_equal(n_eval, 2);
    CHECK(tm_logits(c, 0, &l0));
    assert_int_equal(argmax(l0, info.n_vocab), ta[2]);
    CHECK(tm_seq_prompt(c, 0, grown, 9, NULL)); /* the same prompt: its last token again */
    CHECK(tm_seq_tokens(c, 0, &held, &n));
    assert_int_equal(n, 9);
    assert_memory_equal(held, grown, sizeof(grown));
    CHECK(tm_seq_prompt(c, 1, pb, 5, &n_eval));
    assert_int_equal(n_eval, 5);

    /* a step of both: each row's logits in place in the step's output; the
     * next step of sequence 1 alone keeps sequence 0's */
    const int32_t seqs[2] = {1, 0}, toks[2] = {tb[0], ta[2]};
    CHECK(tm_eval_rows(c, 2, seqs, toks));
    CHECK(tm_logits(c, 0, &l0));
    CHECK(tm_logits(c, 1, &l1));
    assert_ptr_equal(l0, l1 + info.n_vocab); /* rows in the step's order, not copied */
    float *saved = malloc(info.n_vocab * sizeof(float));
    assert_non_null(saved);
    memcpy(saved, l0, info.n_vocab * sizeof(float));
    assert_int_equal(argmax(l0, info.n_vocab), ta[3]);
    assert_int_equal(argmax(l1, info.n_vocab), tb[1]);
    CHECK(tm_eval(c, 1, &tb[1], 1)); /* its row 0: sequence 0's row 1 stays in place */
    CHECK(tm_logits(c, 0, &l0));
    assert_memory_equal(l0, saved, info.n_vocab * sizeof(float));
    CHECK(tm_logits(c, 1, &l1));
    assert_int_equal(argmax(l1, info.n_vocab), tb[2]);
    memcpy(saved, l1, info.n_vocab * sizeof(float));
    CHECK(tm_eval(c, 0, &ta[3], 1)); /* overwrites row 0: sequence 1's are copied out first */
    CHECK(tm_logits(c, 1, &l1));
    assert_memory_equal(l1, saved, info.n_vocab * sizeof(float));
    CHECK(tm_logits(c, 0, &l0));
    assert_int_equal(argmax(l0, info.n_vocab), ta[4]);
    free(saved);

    /* sampling given the logits and the history is tm_sample's (same seed, a penalty) */
    tm_sampler_params sp;
    tm_sampler_params_init(&sp);
    sp.repeat_penalty = 1.3f, sp.repeat_last_n = 64, sp.seed = 7;
    tm_sampler *s1 = NULL, *s2 = NULL;
    CHECK(tm_sampler_create(model, &sp, &s1));
    CHECK(tm_sampler_create(model, &sp, &s2));
    CHECK(tm_seq_tokens(c, 1, &held, &n));
    assert_int_equal(n, 7);
    for (int i = 0; i < 16; i++) {
        int32_t a = -1, b = -2;
        CHECK(tm_sample(s1, c, 1, &a));
        CHECK(tm_sampler_sample(s2, l1, held, (size_t)n, &b));
        assert_int_equal(a, b);
    }
    int32_t g = -1;
    sp.temp = 0, sp.repeat_penalty = 1;
    tm_sampler_free(s2);
    CHECK(tm_sampler_create(model, &sp, &s2));
    CHECK(tm_sampler_sample(s2, l1, NULL, 0, &g));
    assert_int_equal(g, tb[2]);
    sp.repeat_penalty = 1e6f; /* greedy, the best token in the history: another one */
    tm_sampler_free(s2);
    CHECK(tm_sampler_create(model, &sp, &s2));
    CHECK(tm_sampler_sample(s2, l1, &tb[2], 1, &g));
    assert_int_not_equal(g, tb[2]);

    /* bad arguments */
    const int32_t bad[2] = {1, -5};
    EXPECT(TM_ERR_ARG, "context is NULL", tm_seq_shared(NULL, 0, pa, 7, &keep));
    EXPECT(TM_ERR_ARG, "seq 2", tm_seq_shared(c, 2, pa, 7, &keep));
    EXPECT(TM_ERR_ARG, "n >= 1", tm_seq_shared(c, 0, pa, 0, &keep));
    EXPECT(TM_ERR_ARG, "n_keep", tm_seq_shared(c, 0, pa, 7, NULL));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_seq_prompt(NULL, 0, pa, 7, &n_eval));
    EXPECT(TM_ERR_ARG, "seq -1", tm_seq_prompt(c, -1, pa, 7, &n_eval));
    EXPECT(TM_ERR_ARG, "n >= 1", tm_seq_prompt(c, 0, NULL, 7, &n_eval));
    EXPECT(TM_ERR_ARG, "tokens[1] is -5", tm_seq_prompt(c, 0, bad, 2, &n_eval));
    static int32_t many[129];
    EXPECT(TM_ERR_ARG, "do not fit", tm_seq_prompt(c, 0, many, 129, &n_eval));
    CHECK(tm_seq_length(c, 0, &n)); /* nothing was evaluated */
    assert_int_equal(n, 11);
    EXPECT(TM_ERR_ARG, "context is NULL", tm_seq_tokens(NULL, 0, &held, &n));
    EXPECT(TM_ERR_ARG, "seq 3", tm_seq_tokens(c, 3, &held, &n));
    EXPECT(TM_ERR_ARG, "must not be NULL", tm_seq_tokens(c, 0, NULL, &n));
    EXPECT(TM_ERR_ARG, "sampler", tm_sampler_sample(NULL, l1, NULL, 0, &g));
    EXPECT(TM_ERR_ARG, "logits", tm_sampler_sample(s2, NULL, NULL, 0, &g));
    EXPECT(TM_ERR_ARG, "history is NULL", tm_sampler_sample(s2, l1, NULL, 3, &g));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_cache_update(NULL));
    tm_sampler_free(s1);
    tm_sampler_free(s2);
    tm_context_free(c);
}

/* The tiers' counters (every routed slot computed by one lane, every layer in
 * one class), the counts' JSON (tm_expert_stats_write's file), and a cache
 * plan from the counts: each cached layer's most selected experts, as the
 * test ranks tm_expert_counts. */
void test_counters_and_plans(void **state) {
    (void)state;
    tm_context_opts o;
    opts_for(&o, 1);
    tm_context *c = NULL;
    CHECK(tm_context_create(model, &o, &c));
    CHECK(tm_eval(c, 0, pa, 7));
    for (int i = 0; i < 3; i++) CHECK(tm_eval(c, 0, &pa[i], 1));
    tm_counters k;
    CHECK(tm_context_counters(c, &k));
    uint64_t layers = 0, slots = 0;
    for (int l = 0; l < TM_LAYER_CLASSES; l++) {
        const tm_tier_counters *t = &k.tier[l];
        layers += t->layers;
        slots += t->hot_slots + t->pcie_slots + t->cold_slots + t->fetch_slots;
        if (t->layers) assert_int_equal(t->steps, 4 * t->layers); /* a prompt step, 3 decodes */
    }
    assert_int_equal(layers, info.n_layer);
    assert_int_equal(slots, 10ull * info.n_expert_used * info.n_layer);
    assert_false(k.has_ssd);
#ifdef TM_API_MOCKGPU
    assert_int_equal(k.tier[TM_LAYER_CACHED].layers, info.n_layer);
    assert_true(k.cache_bytes > 0);
#else
    assert_int_equal(k.tier[TM_LAYER_RAM].layers, info.n_layer);
    assert_int_equal(k.tier[TM_LAYER_RAM].cold_slots, slots);
    assert_int_equal(k.cache_bytes, 0);
#endif

    /* the JSON is the learn file tm_expert_stats_write writes (less its newline) */
    static char json[1 << 16], file[1 << 16], plan[1 << 16];
    size_t len = 0, plen = 0;
    CHECK(tm_expert_stats_json(c, json, sizeof(json), &len));
    assert_int_equal(strlen(json), len);
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof(path), "%s/test_api_counts_%d.json", tmp ? tmp : "/tmp", (int)getpid());
    CHECK(tm_expert_stats_write(c, path));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    const size_t n = fread(file, 1, sizeof(file) - 1, f);
    fclose(f);
    remove(path);
    assert_int_equal(n, len + 1);
    assert_memory_equal(file, json, len);
    EXPECT(TM_ERR_ARG, "needed", tm_expert_stats_json(c, json, 9, &len));

#ifdef TM_API_MOCKGPU
    /* a plan from the live counts, and the same from their learn JSON */
    CHECK(tm_expert_stats_json(c, json, sizeof(json), &len));
    CHECK(tm_cache_plan(c, NULL, 0, NULL, plan, sizeof(plan), &plen));
    static char plan2[1 << 16];
    size_t plen2 = 0;
    CHECK(tm_cache_plan(c, json, len, "flat", plan2, sizeof(plan2), &plen2));
    assert_string_equal(plan2, plan);
    int32_t changed = -1;
    CHECK(tm_cache_apply(c, plan, plen, &changed));
    for (uint32_t l = 0; l < info.n_layer; l++) {
        uint64_t counts[16];
        int32_t in[16];
        size_t n_slots = 0;
        CHECK(tm_expert_counts(c, l, counts, 16));
        CHECK(tm_cache_experts(c, l, in, 16, &n_slots));
        assert_true(n_slots >= 1);
        for (size_t i = 0; i < n_slots; i++) { /* every cached expert outranks every other */
            assert_true(in[i] >= 0);
            for (int e = 0; e < 16; e++) {
                bool cached = false;
                for (size_t j = 0; j < n_slots; j++) cached |= in[j] == e;
                if (!cached)
                    assert_true(counts[in[i]] > counts[e] ||
                                (counts[in[i]] == counts[e] && in[i] < e));
            }
        }
    }
#else
    EXPECT(TM_ERR_UNSUPPORTED, "no VRAM expert cache",
           tm_cache_plan(c, NULL, 0, NULL, plan, sizeof(plan), &plen));
#endif
    EXPECT(TM_ERR_ARG, "weighting", tm_cache_plan(c, NULL, 0, "steep", plan, sizeof(plan), &plen));
    EXPECT(TM_ERR_FORMAT, "not JSON", tm_cache_plan(c, "{", 1, NULL, plan, sizeof(plan), &plen));
    const char *other = "{\"format\":\"tiermoe-expert-trace\",\"version\":1,\"model\":{"
                        "\"arch\":\"qwen3moe\",\"n_layer\":3,\"n_expert\":64,"
                        "\"n_expert_used\":4}}";
    assert_int_not_equal(tm_cache_plan(c, other, strlen(other), NULL, plan, sizeof(plan), &plen),
                         TM_OK);
    assert_non_null(strstr(tm_error_message(), "learn"));
    EXPECT(TM_ERR_ARG, "context is NULL",
           tm_cache_plan(NULL, NULL, 0, NULL, plan, sizeof(plan), &plen));
    EXPECT(TM_ERR_ARG, "len", tm_cache_plan(c, NULL, 0, NULL, plan, sizeof(plan), NULL));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_expert_stats_json(NULL, json, sizeof(json), &len));
    EXPECT(TM_ERR_ARG, "len", tm_expert_stats_json(c, json, sizeof(json), NULL));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_context_counters(NULL, &k));
    EXPECT(TM_ERR_ARG, "out", tm_context_counters(c, NULL));
    tm_context_free(c);

    o.expert_stats = false;
    CHECK(tm_context_create(model, &o, &c));
    EXPECT(TM_ERR_UNSUPPORTED, "expert_stats", tm_expert_stats_json(c, json, sizeof(json), &len));
    EXPECT(TM_ERR_UNSUPPORTED, "expert_stats",
           tm_cache_plan(c, NULL, 0, NULL, plan, sizeof(plan), &plen));
    tm_context_free(c);
}

/* Each GPU's counters and the GPU of each layer: over two mock GPUs with -ts 1,1 the
 * layers go by llama.cpp's rule (layer l to the first GPU whose share passes
 * l / n_layer), each GPU's cache slots are its layers' (tm_cache_experts), the
 * GPUs' slots and bytes add up to the classes' and the cache's, and the residual
 * crosses into GPU 1 once a step: steps copies of rows x n_embd floats. */
void test_gpus(void **state) {
    (void)state;
    tm_context_opts o;
    opts_for(&o, 1);
    tm_gpu_counters g[TM_MAX_GPUS];
    size_t n = 9;
    int32_t gpu = 0;
#ifdef TM_API_MOCKGPU
    setenv("MOCK_GPUS", "2", 1);
    o.devices = "CUDA0,CUDA1", o.tensor_split = "1,1", o.moe_cache_gpus = "1,1";
#endif
    tm_context *c = NULL;
    CHECK(tm_context_create(model, &o, &c));
    unsetenv("MOCK_GPUS");
    CHECK(tm_eval(c, 0, pa, 7));
    for (int i = 0; i < 3; i++) CHECK(tm_eval(c, 0, &pa[i], 1));
    CHECK(tm_context_gpus(c, g, TM_MAX_GPUS, &n));
    tm_counters k;
    CHECK(tm_context_counters(c, &k));
#ifdef TM_API_MOCKGPU
    assert_int_equal(n, 2);
    size_t n1 = 0; /* too small: the count, nothing written */
    EXPECT(TM_ERR_ARG, "room for 1", tm_context_gpus(c, g, 1, &n1));
    assert_int_equal(n1, 2);
    uint64_t bytes = 0, hot = 0, cold = 0;
    size_t n_slots = 0, slots[2] = {0, 0};
    int32_t in[16];
    for (uint32_t l = 0; l < info.n_layer; l++) {
        CHECK(tm_layer_gpu(c, l, &gpu));
        assert_int_equal(gpu, 2 * l >= info.n_layer); /* shares 1/2, 1 */
        CHECK(tm_cache_experts(c, l, in, 16, &n_slots));
        slots[gpu] += n_slots;
    }
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(g[i].device, (int32_t)i);
        assert_int_equal(g[i].cache_slots, slots[i]);
        assert_true(g[i].cache_layers > 0 && g[i].tier.hot_slots > 0);
        bytes += g[i].cache_bytes, hot += g[i].tier.hot_slots, cold += g[i].tier.cold_slots;
        assert_int_equal(g[i].peer_copies, i ? 4 : 0); /* 4 steps of 7, 1, 1, 1 rows */
        assert_int_equal(g[i].peer_bytes, i ? 10ull * info.n_embd * sizeof(float) : 0);
    }
    assert_int_equal(bytes, k.cache_bytes);
    assert_int_equal(hot, k.tier[TM_LAYER_CACHED].hot_slots);
    assert_int_equal(cold, k.tier[TM_LAYER_CACHED].cold_slots);
#else
    assert_int_equal(n, 0);
    CHECK(tm_layer_gpu(c, 0, &gpu));
    assert_int_equal(gpu, -1);
#endif
    EXPECT(TM_ERR_ARG, "layer", tm_layer_gpu(c, info.n_layer, &gpu));
    EXPECT(TM_ERR_ARG, "gpu", tm_layer_gpu(c, 0, NULL));
    EXPECT(TM_ERR_ARG, "out", tm_context_gpus(c, NULL, 1, &n));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_context_gpus(NULL, g, 1, &n));
    tm_context_free(c);
}
