/* The public API (include/tiermoe.h) through the shared library only: this
 * program sees no internal header. Built twice (tests/CMakeLists.txt): against
 * libtiermoe.so (no GPU: a plan is validated, then refused for want of a VRAM
 * cache) and against the same library over the host mock of the CUDA backend
 * (TM_API_MOCKGPU: every layer on the "GPU", experts in RAM, a VRAM cache the
 * plan rewrites). The model: mkmodel's tiny preset with Qwen3's vocabulary
 * (TM_API_MODEL, made by the api_model fixture).
 *
 * What is compared with something independent: two sequences evaluated in one
 * context, a plan applied between their steps, give the tokens of each
 * sequence evaluated alone in a context of its own; token ids of Qwen3's
 * tokenizer (HF's); the expert counts sum to tokens x experts per token; every
 * function's bad argument gives the status the header documents. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tiermoe.h"

#define N_GEN 8

static tm_model *model;
static tm_model_info info;

static int setup(void **state) {
    (void)state;
    const char *path = getenv("TM_API_MODEL");
    if (!path || tm_model_load(path, &model) != TM_OK) {
        fprintf(stderr, "test_api: TM_API_MODEL (%s): %s\n", path ? path : "unset",
                tm_error_message());
        return -1;
    }
    return tm_model_describe(model, &info) == TM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tm_model_free(model);
    return 0;
}

#define CHECK(call) assert_int_equal_msg(call, #call)
static void assert_int_equal_msg(tm_status st, const char *what) {
    if (st != TM_OK) fail_msg("%s: %s: %s", what, tm_status_name(st), tm_error_message());
}

/* A call expected to fail with status want and a message containing word. */
#define EXPECT(want, word, call) expect_fail(want, word, call, #call)
static void expect_fail(tm_status want, const char *word, tm_status got, const char *what) {
    if (got != want)
        fail_msg("%s: %s, want %s (%s)", what, tm_status_name(got), tm_status_name(want),
                 tm_error_message());
    if (!strstr(tm_error_message(), word))
        fail_msg("%s: the message does not name '%s': %s", what, word, tm_error_message());
}

static void test_version(void **state) {
    (void)state;
    char want[32];
    snprintf(want, sizeof(want), "%d.%d.%d", TIERMOE_VERSION_MAJOR, TIERMOE_VERSION_MINOR,
             TIERMOE_VERSION_PATCH);
    assert_string_equal(tm_version(), want);
    assert_string_equal(tm_status_name(TM_OK), "ok");
    assert_string_equal(tm_status_name(TM_ERR_ARG), "bad argument");
    assert_string_equal(info.arch, "qwen3moe");
    assert_int_equal(info.n_layer, 3);
    assert_int_equal(info.n_expert, 16);
    assert_true(info.has_vocab);
    assert_string_equal(info.chat_format, "qwen3");
    assert_string_equal(info.path, getenv("TM_API_MODEL"));
    assert_string_equal(info.name, "tiermoe tiny qwen3moe"); /* general.name, as gguf-py reads it */
}

/* Ids from HF's Qwen3 tokenizer (transformers, Qwen/Qwen3-30B-A3B). */
static void test_text(void **state) {
    (void)state;
    const char *text = "Hello world";
    int32_t ids[64];
    size_t n = 0;
    EXPECT(TM_ERR_ARG, "room for 0",
           tm_tokenize(model, text, strlen(text), false, false, NULL, 0, &n));
    assert_int_equal(n, 2); /* the size asked for */
    CHECK(tm_tokenize(model, text, strlen(text), false, false, ids, 64, &n));
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 9707);
    assert_int_equal(ids[1], 1879);
    char out[64];
    size_t len = 0;
    EXPECT(TM_ERR_ARG, "12 needed", tm_detokenize(model, ids, n, false, out, 11, &len));
    assert_int_equal(len, 11);
    CHECK(tm_detokenize(model, ids, n, false, out, sizeof(out), &len));
    assert_string_equal(out, text);
    const char *piece;
    CHECK(tm_token_piece(model, 1879, &piece, &len));
    assert_int_equal(len, 6);
    assert_memory_equal(piece, " world", 6);
    bool end = true;
    CHECK(tm_token_is_end(model, 9707, &end));
    assert_false(end);
    CHECK(tm_token_is_end(model, 151645, &end)); /* <|im_end|> */
    assert_true(end);

    const tm_chat_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char chat[256];
    CHECK(tm_chat_apply(model, NULL, msgs, 2, true, chat, sizeof(chat), &len));
    assert_string_equal(chat, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                              "<|im_end|>\n<|im_start|>assistant\n");
    assert_int_equal(len, strlen(chat));
    CHECK(tm_tokenize(model, chat, len, true, true, ids, 64, &n));
    assert_int_equal(ids[0], 151644); /* <|im_start|>, one token with parse_special */
    CHECK(tm_chat_apply(model, "llama3", msgs + 1, 1, false, chat, sizeof(chat), &len));
    assert_non_null(strstr(chat, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"));
}

static void opts_for(tm_context_opts *o, int32_t n_seq) {
    tm_context_opts_init(o);
    o->n_ctx = 128 * n_seq;
    o->n_seq = n_seq;
    o->n_threads = 2;
    o->expert_stats = true;
#ifdef TM_API_MOCKGPU /* every layer on the GPU, the experts in RAM, 1 MiB of VRAM cache */
    o->n_gpu_layers = 99;
    o->cpu_moe = true;
    o->moe_cache_mib = 1;
    o->moe_pcie = TM_OFF; /* the CPU lane computes what the cache misses */
    o->moe_fetch = TM_OFF;
    o->moe_ahead = TM_OFF;
#endif
}

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
static void test_batch_prompts(void **state) {
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
static void test_two_sequences(void **state) {
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
static void test_prompt_reuse(void **state) {
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
static void test_counters_and_plans(void **state) {
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
static void test_gpus(void **state) {
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

static void log_cb(tm_log_level level, const char *text, void *user) {
    (void)level, (void)text;
    *(int *)user += 1;
}

/* Every function with a bad argument: the status the header documents, and a
 * message that names the argument. */
static void test_bad_arguments(void **state) {
    (void)state;
    tm_model *m = NULL;
    EXPECT(TM_ERR_ARG, "path", tm_model_load(NULL, &m));
    EXPECT(TM_ERR_IO, "/nonexistent.gguf", tm_model_load("/nonexistent.gguf", &m));
    assert_null(m);
    tm_model_free(NULL);
    tm_model_info mi;
    EXPECT(TM_ERR_ARG, "model is NULL", tm_model_describe(NULL, &mi));
    EXPECT(TM_ERR_ARG, "out", tm_model_describe(model, NULL));

    int32_t ids[4] = {1, 2, 3, -5};
    size_t n;
    char text[16];
    EXPECT(TM_ERR_ARG, "model is NULL", tm_tokenize(NULL, "a", 1, false, false, ids, 4, &n));
    EXPECT(TM_ERR_ARG, "text is NULL", tm_tokenize(model, NULL, 3, false, false, ids, 4, &n));
    EXPECT(TM_ERR_ARG, "n_ids", tm_tokenize(model, "a", 1, false, false, ids, 4, NULL));
    EXPECT(TM_ERR_ARG, "ids[3] is -5", tm_detokenize(model, ids, 4, false, text, 16, &n));
    EXPECT(TM_ERR_ARG, "len", tm_detokenize(model, ids, 3, false, text, 16, NULL));
    const char *piece;
    EXPECT(TM_ERR_ARG, "id 200000", tm_token_piece(model, 200000, &piece, &n));
    EXPECT(TM_ERR_ARG, "bytes", tm_token_piece(model, 1, NULL, &n));
    bool end;
    EXPECT(TM_ERR_ARG, "id -1", tm_token_is_end(model, -1, &end));
    EXPECT(TM_ERR_ARG, "is_end", tm_token_is_end(model, 1, NULL));
    const tm_chat_message msg = {"user", NULL};
    EXPECT(TM_ERR_ARG, "msgs[0]", tm_chat_apply(model, NULL, &msg, 1, true, text, 16, &n));
    const tm_chat_message hi = {"user", "hi"};
    EXPECT(TM_ERR_ARG, "format", tm_chat_apply(model, "jinja", &hi, 1, true, text, 16, &n));
    EXPECT(TM_ERR_ARG, "needed", tm_chat_apply(model, NULL, &hi, 1, true, text, 16, &n));

    tm_context_opts o;
    tm_context_opts_init(NULL); /* does nothing */
    opts_for(&o, 2);
    tm_context *c = NULL;
    EXPECT(TM_ERR_ARG, "model is NULL", tm_context_create(NULL, &o, &c));
    EXPECT(TM_ERR_ARG, "opts", tm_context_create(model, NULL, &c));
    o.moe_fetch = 7;
    EXPECT(TM_ERR_ARG, "moe_fetch 7", tm_context_create(model, &o, &c));
    o.moe_fetch = TM_AUTO, o.moe_pcie = 99;
    EXPECT(TM_ERR_ARG, "moe_pcie 99", tm_context_create(model, &o, &c));
    o.moe_pcie = TM_AUTO, o.override_tensor = "exps=GPU7";
    EXPECT(TM_ERR_ARG, "override_tensor", tm_context_create(model, &o, &c));
    o.override_tensor = NULL, o.moe_cache_plan = "/nonexistent-plan.json";
    EXPECT(TM_ERR_IO, "moe_cache_plan", tm_context_create(model, &o, &c));
    o.moe_cache_plan = NULL, o.n_seq = -1;
    EXPECT(TM_ERR_ARG, "n_seq", tm_context_create(model, &o, &c));
    assert_null(c);
    tm_context_free(NULL);
    opts_for(&o, 2);
    o.expert_stats = false;
    CHECK(tm_context_create(model, &o, &c));
    tm_context_info ci;
    EXPECT(TM_ERR_ARG, "context is NULL", tm_context_describe(NULL, &ci));
    EXPECT(TM_ERR_ARG, "out", tm_context_describe(c, NULL));

    EXPECT(TM_ERR_ARG, "context is NULL", tm_eval(NULL, 0, ids, 1));
    EXPECT(TM_ERR_ARG, "seq 2", tm_eval(c, 2, ids, 1));
    EXPECT(TM_ERR_ARG, "n >= 1", tm_eval(c, 0, ids, 0));
    EXPECT(TM_ERR_ARG, "tokens[3] is -5", tm_eval(c, 0, ids, 4));
    static int32_t many[129];
    EXPECT(TM_ERR_ARG, "do not fit", tm_eval(c, 0, many, 129));
    const int32_t twice[2] = {1, 1};
    EXPECT(TM_ERR_ARG, "twice", tm_eval_rows(c, 2, twice, ids));
    EXPECT(TM_ERR_ARG, "n 0", tm_eval_rows(c, 0, twice, ids));
    EXPECT(TM_ERR_ARG, "seqs and tokens", tm_eval_rows(c, 1, NULL, ids));
    const float *l;
    EXPECT(TM_ERR_ARG, "no logits", tm_logits(c, 0, &l));
    EXPECT(TM_ERR_ARG, "seq -1", tm_logits(c, -1, &l));
    int64_t len;
    EXPECT(TM_ERR_ARG, "seq 5", tm_seq_length(c, 5, &len));
    EXPECT(TM_ERR_ARG, "n must not", tm_seq_length(c, 0, NULL));
    EXPECT(TM_ERR_ARG, "n_keep -1", tm_seq_rewind(c, 0, -1, NULL));
    EXPECT(TM_ERR_ARG, "seq 9", tm_seq_rewind(c, 9, 0, NULL));

    tm_sampler_params sp;
    tm_sampler_params_init(&sp);
    tm_sampler *s = NULL;
    sp.top_p = -1;
    EXPECT(TM_ERR_ARG, "top", tm_sampler_create(model, &sp, &s));
    EXPECT(TM_ERR_ARG, "model is NULL", tm_sampler_create(NULL, &sp, &s));
    assert_null(s);
    tm_sampler_params_init(&sp);
    CHECK(tm_sampler_create(model, &sp, &s));
    int32_t tok;
    EXPECT(TM_ERR_ARG, "sampler", tm_sample(NULL, c, 0, &tok));
    EXPECT(TM_ERR_ARG, "no logits", tm_sample(s, c, 0, &tok));
    EXPECT(TM_ERR_ARG, "token", tm_sample(s, c, 0, NULL));
    tm_sampler_free(s);
    tm_sampler_free(NULL);

    uint64_t counts[16];
    EXPECT(TM_ERR_UNSUPPORTED, "expert_stats", tm_expert_counts(c, 0, counts, 16));
    EXPECT(TM_ERR_ARG, "layer 3", tm_expert_counts(c, 3, counts, 16));
    EXPECT(TM_ERR_ARG, "room for 16", tm_expert_counts(c, 0, counts, 8));
    EXPECT(TM_ERR_UNSUPPORTED, "expert_stats", tm_expert_counts_reset(c));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_expert_counts_reset(NULL));
    int32_t in[16];
    size_t slots;
    EXPECT(TM_ERR_ARG, "layer 7", tm_cache_experts(c, 7, in, 16, &slots));
    EXPECT(TM_ERR_ARG, "n_slots", tm_cache_experts(c, 0, in, 16, NULL));
    EXPECT(TM_ERR_ARG, "plan_json", tm_cache_apply(c, NULL, 0, NULL));
    EXPECT(TM_ERR_FORMAT, "not valid JSON", tm_cache_apply(c, "{", 1, NULL));
    tm_context_free(c);

    /* the context's info lines (KV cache size, ...) go to the callback, then to stderr again */
    int lines = 0;
    tm_log_set_callback(log_cb, &lines);
    CHECK(tm_context_create(model, &o, &c));
    tm_context_free(c);
    tm_log_set_callback(NULL, NULL);
    assert_true(lines > 0);
    const int before = lines;
    CHECK(tm_context_create(model, &o, &c));
    tm_context_free(c);
    assert_int_equal(lines, before);
}

/* The vocabulary alone (tm_model_load_vocab): HF's ids, the vocabulary's kind,
 * and no contexts or samplers. */
static void test_vocab_only(void **state) {
    (void)state;
    tm_model *v = NULL;
    CHECK(tm_model_load_vocab(getenv("TM_API_MODEL"), &v));
    tm_model_info vi;
    CHECK(tm_model_describe(v, &vi));
    assert_null(vi.arch);
    assert_int_equal(vi.n_layer, 0);
    assert_true(vi.has_vocab);
    assert_int_equal(vi.n_vocab, 151669); /* Qwen3's tokenizer.json: 151643 + 26 added */
    assert_string_equal(vi.chat_format, "qwen3");
    assert_null(vi.name);
    assert_non_null(vi.path);
    int32_t ids[8];
    size_t n = 0;
    CHECK(tm_tokenize(v, "Hello world", 11, false, false, ids, 8, &n));
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 9707);
    assert_int_equal(ids[1], 1879);
    tm_vocab_info voc;
    CHECK(tm_vocab_describe(v, &voc));
    assert_int_equal(voc.n_tokens, 151669);
    assert_string_equal(voc.model, "gpt2"); /* byte-level BPE, llama.cpp's name */
    assert_string_equal(voc.pre, "qwen2");
    tm_context_opts o;
    tm_context_opts_init(&o);
    tm_context *c = NULL;
    EXPECT(TM_ERR_UNSUPPORTED, "no weights", tm_context_create(v, &o, &c));
    tm_sampler_params sp;
    tm_sampler_params_init(&sp);
    tm_sampler *s = NULL;
    EXPECT(TM_ERR_UNSUPPORTED, "no weights", tm_sampler_create(v, &sp, &s));
    assert_null(c);
    assert_null(s);
    tm_model_free(v);

    tm_model *m = NULL;
    EXPECT(TM_ERR_ARG, "path", tm_model_load_vocab(NULL, &m));
    EXPECT(TM_ERR_IO, "/nonexistent.gguf", tm_model_load_vocab("/nonexistent.gguf", &m));
    assert_null(m);
    EXPECT(TM_ERR_ARG, "model is NULL", tm_vocab_describe(NULL, &voc));
    EXPECT(TM_ERR_ARG, "out", tm_vocab_describe(model, NULL));
}

/* Valid UTF-8 ends a chunk unless the text ends there. */
static bool utf8_whole(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const unsigned char c = (unsigned char)s[i];
        const size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (!k || i + k > n) return false;
        i += k;
    }
    return true;
}

/* Tokens, types and the streaming detokenizer: every chunk whole UTF-8
 * characters, all of them tm_detokenize's text; a lone lead byte held, then
 * flushed as it is or as U+FFFD. */
static void test_token_stream(void **state) {
    (void)state;
    tm_token_info ti;
    CHECK(tm_token_describe(model, 151645, &ti));
    assert_int_equal(ti.type, TM_TOKEN_TYPE_CONTROL);
    assert_int_equal(ti.len, 10);
    assert_memory_equal(ti.text, "<|im_end|>", 10);
    CHECK(tm_token_describe(model, 1879, &ti));
    assert_int_equal(ti.type, TM_TOKEN_TYPE_NORMAL);
    assert_memory_equal(ti.text, " world", 6);

    const char *text = "Fox 🦊 日本語 café";
    int32_t ids[64];
    size_t n = 0, len = 0;
    CHECK(tm_tokenize(model, text, strlen(text), false, false, ids, 64, &n));
    tm_detokenizer *d = NULL;
    CHECK(tm_detokenizer_create(model, false, false, &d));
    char all[128] = "";
    size_t all_len = 0;
    bool split = false; /* some token ended inside a character (🦊 is byte tokens in Qwen3) */
    for (size_t i = 0; i < n; i++) {
        const char *chunk;
        CHECK(tm_detokenizer_push(d, ids[i], &chunk, &len));
        if (!utf8_whole(chunk, len)) fail_msg("chunk %zu is not whole UTF-8", i);
        const char *piece;
        size_t piece_len;
        CHECK(tm_token_piece(model, ids[i], &piece, &piece_len));
        split |= !utf8_whole(piece, piece_len);
        memcpy(all + all_len, chunk, len);
        all_len += len;
    }
    const char *rest;
    CHECK(tm_detokenizer_flush(d, &rest, &len));
    assert_int_equal(len, 0);
    assert_true(split);
    assert_int_equal(all_len, strlen(text));
    assert_memory_equal(all, text, all_len);
    EXPECT(TM_ERR_ARG, "id 200000", tm_detokenizer_push(d, 200000, &rest, &len));
    EXPECT(TM_ERR_ARG, "text and len", tm_detokenizer_push(d, 1, NULL, &len));
    EXPECT(TM_ERR_ARG, "detokenizer", tm_detokenizer_flush(NULL, &rest, &len));
    tm_detokenizer_free(d);
    tm_detokenizer_free(NULL);

    int32_t lead; /* the byte token of 0xF0, a 4-byte character's first byte */
    CHECK(tm_tokenize(model, "\xF0", 1, false, false, &lead, 1, &n));
    for (int replace = 0; replace < 2; replace++) {
        CHECK(tm_detokenizer_create(model, false, replace, &d));
        CHECK(tm_detokenizer_push(d, lead, &rest, &len));
        assert_int_equal(len, 0); /* held: the character may go on */
        CHECK(tm_detokenizer_flush(d, &rest, &len));
        if (replace) {
            assert_int_equal(len, 3);
            assert_memory_equal(rest, "\xEF\xBF\xBD", 3); /* U+FFFD */
        } else {
            assert_int_equal(len, 1);
            assert_memory_equal(rest, "\xF0", 1);
        }
        tm_detokenizer_free(d);
    }
    d = NULL;
    EXPECT(TM_ERR_ARG, "out", tm_detokenizer_create(model, false, false, NULL));
    EXPECT(TM_ERR_ARG, "model is NULL", tm_detokenizer_create(NULL, false, false, &d));
    assert_null(d);
    EXPECT(TM_ERR_ARG, "id -3", tm_token_describe(model, -3, &ti));
    EXPECT(TM_ERR_ARG, "out", tm_token_describe(model, 1, NULL));
}

/* What of a reply goes back into the history: harmony's final channel (its
 * template's rule), the reply up to its end-of-turn token otherwise. */
/* tm_chat_render: tm_chat_apply's text with the same switches; with
 * disable_thinking, Qwen3's template's enable_thinking=False turn opening (an
 * empty think block, as HF's template writes it). */
static void test_chat_render(void **state) {
    (void)state;
    const tm_chat_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    static char a[512], b[512];
    size_t na = 0, nb = 0;
    CHECK(tm_chat_apply(model, NULL, msgs, 2, true, a, sizeof(a), &na));
    tm_chat_params p = {.add_generation_prompt = true};
    CHECK(tm_chat_render(model, NULL, msgs, 2, &p, b, sizeof(b), &nb));
    assert_int_equal(nb, na);
    assert_string_equal(b, a);
    p.disable_thinking = true;
    CHECK(tm_chat_render(model, NULL, msgs, 2, &p, b, sizeof(b), &nb));
    assert_string_equal(b + na, "<think>\n\n</think>\n\n");
    assert_memory_equal(b, a, na);
    CHECK(tm_chat_render(model, "chatml", msgs, 2, &p, b, sizeof(b), &nb)); /* no think block */
    CHECK(tm_chat_apply(model, "chatml", msgs, 2, true, a, sizeof(a), &na));
    assert_string_equal(b, a);
    for (const char *const *f =
             (const char *const[]){"chatml", "qwen3", "llama3", "mistral", "harmony", NULL};
         *f; f++) {
        CHECK(tm_chat_format_check(*f));
        CHECK(tm_chat_apply(model, *f, msgs, 2, true, a, sizeof(a), &na)); /* one it renders */
    }
    EXPECT(TM_ERR_ARG, "unknown chat template 'jinja'", tm_chat_format_check("jinja"));
    EXPECT(TM_ERR_ARG, "format", tm_chat_format_check(NULL));
    EXPECT(TM_ERR_ARG, "params", tm_chat_render(model, NULL, msgs, 2, NULL, b, sizeof(b), &nb));
    EXPECT(TM_ERR_ARG, "model is NULL", tm_chat_render(NULL, NULL, msgs, 2, &p, b, 9, &nb));
    EXPECT(TM_ERR_ARG, "format", tm_chat_render(model, "jinja", msgs, 2, &p, b, 9, &nb));
    EXPECT(TM_ERR_ARG, "needed", tm_chat_render(model, NULL, msgs, 2, &p, b, 9, &nb));
}

static void test_chat_reply(void **state) {
    (void)state;
    const char *h = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant"
                    "<|channel|>final<|message|>Four.<|return|>";
    size_t start = 0, n = 0;
    CHECK(tm_chat_reply(model, "harmony", h, strlen(h), &start, &n));
    assert_int_equal(n, 5);
    assert_memory_equal(h + start, "Four.", 5);
    const char *q = "Hi there!<|im_end|>";
    CHECK(tm_chat_reply(model, NULL, q, strlen(q), &start, &n)); /* the model's: qwen3 */
    assert_int_equal(start, 0);
    assert_int_equal(n, 9);
    EXPECT(TM_ERR_ARG, "format", tm_chat_reply(model, "jinja", q, strlen(q), &start, &n));
    EXPECT(TM_ERR_ARG, "start and n", tm_chat_reply(model, NULL, q, strlen(q), NULL, &n));
    EXPECT(TM_ERR_ARG, "reply is NULL", tm_chat_reply(model, NULL, NULL, 3, &start, &n));
}

/* The options' check without a model: each field's bad value names it. */
static void test_opts_check(void **state) {
    (void)state;
    tm_context_opts o;
    tm_context_opts_init(&o);
    CHECK(tm_context_opts_check(&o));
    o.moe_cache_weighting = "pressure", o.moe_cache_policy = "lru", o.moe_cache_curve = 2;
    o.moe_cache_update = TM_CACHE_UPDATE_FULL, o.moe_cache_admit = TM_OFF;
    o.override_tensor = "exps=CPU";
    CHECK(tm_context_opts_check(&o));
    tm_context_opts b = o;
    b.moe_cache_weighting = "heavy";
    EXPECT(TM_ERR_ARG, "moe_cache_weighting (--moe-cache-weighting)", tm_context_opts_check(&b));
    b = o, b.moe_cache_policy = "fifo";
    EXPECT(TM_ERR_ARG, "moe_cache_policy", tm_context_opts_check(&b));
    b = o, b.moe_cache_curve = TM_MOE_CACHE_CURVE_MAX + 1;
    EXPECT(TM_ERR_ARG, "moe_cache_curve", tm_context_opts_check(&b));
    b = o, b.moe_cache_update = 7;
    EXPECT(TM_ERR_ARG, "moe_cache_update 7", tm_context_opts_check(&b));
    b = o, b.moe_cache_admit = -5;
    EXPECT(TM_ERR_ARG, "moe_cache_admit -5", tm_context_opts_check(&b));
    b = o, b.moe_pcie = TM_MOE_PCIE_MAX + 1;
    EXPECT(TM_ERR_ARG, "(--moe-pcie)", tm_context_opts_check(&b));
    b = o, b.moe_ahead = TM_MOE_AHEAD_MAX;
    CHECK(tm_context_opts_check(&b));
    b.moe_ahead = TM_MOE_AHEAD_MAX + 1;
    EXPECT(TM_ERR_ARG, "moe_ahead", tm_context_opts_check(&b));
    b = o, b.override_tensor = "blk\\.(=CPU";
    EXPECT(TM_ERR_ARG, "override_tensor (-ot)", tm_context_opts_check(&b));
    /* the GPU list (the device count is checked when a context is made) */
    b = o, b.devices = "CUDA0,CUDA1", b.tensor_split = "3,1", b.moe_cache_gpus = "100,200";
    b.split_mode = TM_SPLIT_NONE, b.main_gpu = 1;
    CHECK(tm_context_opts_check(&b));
    b.devices = "none";
    CHECK(tm_context_opts_check(&b));
    b = o, b.devices = "GPU1";
    EXPECT(TM_ERR_ARG, "devices (-dev) 'GPU1'", tm_context_opts_check(&b));
    b = o, b.devices = "CUDA0,CUDA0";
    EXPECT(TM_ERR_ARG, "devices (-dev)", tm_context_opts_check(&b));
    b = o, b.split_mode = 2;
    EXPECT(TM_ERR_ARG, "split_mode 2 (--split-mode)", tm_context_opts_check(&b));
    b = o, b.main_gpu = TM_MAX_GPUS;
    EXPECT(TM_ERR_ARG, "main_gpu 8 (-mg)", tm_context_opts_check(&b));
    b = o, b.tensor_split = "1,-1";
    EXPECT(TM_ERR_ARG, "tensor_split (--tensor-split) '1,-1'", tm_context_opts_check(&b));
    b = o, b.moe_cache_gpus = "100,x";
    EXPECT(TM_ERR_ARG, "moe_cache_gpus (--moe-cache)", tm_context_opts_check(&b));
    EXPECT(TM_ERR_ARG, "opts", tm_context_opts_check(NULL));
}

/* A float after "key" in text (-1 when missing). */
static double number_after(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

/* The text a report function gives, under the size rule (a capacity of 0 asks). */
#define REPORT(call_with)                                                                          \
    do {                                                                                           \
        size_t need_ = 0;                                                                          \
        EXPECT(TM_ERR_ARG, "needed", call_with(NULL, 0, &need_));                                  \
        assert_true(need_ > 0 && need_ < sizeof(text));                                            \
        CHECK(call_with(text, sizeof(text), &len));                                                \
        assert_int_equal(len, need_);                                                              \
        assert_int_equal(strlen(text), len);                                                       \
    } while (0)

/* --profile's report, the counts' summary and their file, after a prompt and
 * two decoded tokens. */
static void test_reports(void **state) {
    (void)state;
    tm_context_opts o;
    opts_for(&o, 1);
    o.profile = true;
    tm_context *c = NULL;
    CHECK(tm_context_create(model, &o, &c));
    static const int32_t prompt[] = {9707, 1879, 11, 419, 374};
    CHECK(tm_eval(c, 0, prompt, 5));
    CHECK(tm_eval(c, 0, prompt, 1));
    CHECK(tm_eval(c, 0, prompt + 1, 1));
    static char text[1 << 16];
    size_t len = 0;
#define PROFILE(t, cap, l) tm_context_profile(c, t, cap, l)
    REPORT(PROFILE);
    /* the parts' times add up to the total (each rounded to 0.01 ms) */
    const double total = number_after(text, "time by part, per run (");
    const char *by_part = strstr(text, "):");
    if (total <= 0 || !by_part) fail_msg("profile: no time by part in\n%s", text);
    static const char *const parts[] = {"embed ",  "norms+rope ", "attn proj ", "attention ",
                                        "router ", "experts ",    "output "};
    double sum = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        const double ms = number_after(by_part, parts[i]);
        if (ms < 0) fail_msg("profile: no part '%s' in\n%s", parts[i], text);
        sum += ms;
    }
    if (sum < total - 0.05 || sum > total + 0.05)
        fail_msg("profile: parts sum to %.2f ms, the total is %.2f ms:\n%s", sum, total, text);
    assert_non_null(strstr(text, "synthetic routing: uniform")); /* mkmodel's default */

    /* the summary: 7 tokens through each layer, a row per layer with per_layer */
#define SUMMARY(t, cap, l) tm_expert_stats_summary(c, false, t, cap, l)
    REPORT(SUMMARY);
    assert_int_equal((int)number_after(text, "(top-4), "), 7);
    assert_null(strstr(text, "layer   0:"));
#define SUMMARY_LAYERS(t, cap, l) tm_expert_stats_summary(c, true, t, cap, l)
    REPORT(SUMMARY_LAYERS);
    assert_non_null(strstr(text, "layer   2: calls 3 tokens 7 hits 28"));

    /* the CSV file: each layer's and expert's hits are tm_expert_counts' */
    char path[512];
    snprintf(path, sizeof(path), "%s.stats.csv", getenv("TM_API_MODEL"));
    CHECK(tm_expert_stats_write(c, path));
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof(line), f)); /* the header */
    uint64_t counts[3][16];
    for (uint32_t l = 0; l < 3; l++) CHECK(tm_expert_counts(c, l, counts[l], 16));
    int rows = 0;
    unsigned layer, expert;
    unsigned long long hits;
    while (fgets(line, sizeof(line), f) &&
           sscanf(line, "%u,%u,%llu", &layer, &expert, &hits) == 3) {
        assert_true(layer < 3 && expert < 16);
        assert_int_equal(hits, counts[layer][expert]);
        rows++;
    }
    fclose(f);
    remove(path);
    assert_int_equal(rows, 3 * 16);
    EXPECT(TM_ERR_IO, "/nonexistent-dir/", tm_expert_stats_write(c, "/nonexistent-dir/x.json"));
    EXPECT(TM_ERR_ARG, "path", tm_expert_stats_write(c, NULL));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_expert_stats_write(NULL, path));
    EXPECT(TM_ERR_ARG, "len", tm_context_profile(c, text, sizeof(text), NULL));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_context_profile(NULL, text, sizeof(text), &len));
    EXPECT(TM_ERR_ARG, "context is NULL", tm_expert_stats_summary(NULL, false, text, 9, &len));
    tm_context_free(c);

    o.profile = false, o.expert_stats = false;
    CHECK(tm_context_create(model, &o, &c));
    EXPECT(TM_ERR_UNSUPPORTED, "without profile", tm_context_profile(c, text, sizeof(text), &len));
    EXPECT(TM_ERR_UNSUPPORTED, "expert_stats", tm_expert_stats_summary(c, true, text, 9, &len));
    EXPECT(TM_ERR_UNSUPPORTED, "expert_stats", tm_expert_stats_write(c, path));
    tm_context_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),       cmocka_unit_test(test_text),
        cmocka_unit_test(test_two_sequences), cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_vocab_only),    cmocka_unit_test(test_token_stream),
        cmocka_unit_test(test_chat_reply),    cmocka_unit_test(test_opts_check),
        cmocka_unit_test(test_reports),       cmocka_unit_test(test_prompt_reuse),
        cmocka_unit_test(test_chat_render),   cmocka_unit_test(test_counters_and_plans),
        cmocka_unit_test(test_gpus),          cmocka_unit_test(test_batch_prompts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
