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
#include "test_api.h"

tm_model *model;
tm_model_info info;

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

void assert_int_equal_msg(tm_status st, const char *what) {
    if (st != TM_OK) fail_msg("%s: %s: %s", what, tm_status_name(st), tm_error_message());
}

/* A call expected to fail with status want and a message containing word. */
void expect_fail(tm_status want, const char *word, tm_status got, const char *what) {
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

void opts_for(tm_context_opts *o, int32_t n_seq) {
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
