/* tiermoe run: generate from a prompt, streaming tokens, then llama.cpp-style timings. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/timing.h"
#include "model/model.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"

static void run_usage(FILE *out) {
    fprintf(out,
            "usage: tiermoe run -m FILE (-p TEXT | --tokens 1,2,3) [options]\n"
            "  -m, --model FILE       GGUF model\n"
            "  -p, --prompt TEXT      prompt text (needs a model with a vocabulary)\n"
            "  --tokens IDS           prompt as comma-separated token ids\n"
            "  -n, --n-predict N      tokens to generate (default 64)\n"
            "  -c, --ctx-size N       context size (default: min(4096, trained))\n"
            "  -b, --batch-size N     prompt tokens per forward chunk (default 512)\n"
            "  -t, --threads N        CPU threads (default: physical cores)\n"
            "  -s, --seed N           sampling seed (default 0)\n"
            "  --temp F               temperature, 0 = greedy (default 0.8)\n"
            "  --top-k N --top-p F --min-p F --repeat-penalty F --repeat-last-n N\n"
            "  --kv-type f16|f32      KV cache type (default f16)\n"
            "  --ignore-eos           keep generating past end-of-generation tokens\n"
            "  --profile              print where the time went\n");
}

/* Parse "1,2,3" into ids; returns 0 or 2 (usage error). */
static int parse_token_list(const char *s, int32_t **out, int64_t *n_out) {
    int64_t cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    const char *p = s;
    while (ids && *p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffff || (*end && *end != ',')) {
            fprintf(stderr, "tiermoe run: --tokens: expected comma-separated non-negative ids, got '%s'\n", s);
            free(ids);
            return 2;
        }
        if (n == cap) {
            int32_t *t = realloc(ids, (size_t)(cap *= 2) * sizeof(int32_t));
            if (!t) break;
            ids = t;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!ids || !n) {
        fprintf(stderr, "tiermoe run: --tokens: no token ids in '%s'\n", s);
        free(ids);
        return 2;
    }
    *out = ids, *n_out = n;
    return 0;
}

/* Print what a token completes; never half a UTF-8 character. */
static void run_print_token(tm_detok_stream *d, int32_t id) {
    const char *text;
    size_t len;
    if (tokenizer_stream_push(d, id, &text, &len) == TM_OK) fwrite(text, 1, len, stdout);
}

int cmd_run(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *tokens_arg = NULL;
    long long n_predict = 64, v;
    double d;
    tm_context_params cp = {0};
    tm_sampler_params sp;
    sample_params_default(&sp);
    int profile = 0, ignore_eos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--profile")) { profile = 1; continue; }
        if (!strcmp(a, "--ignore-eos")) { ignore_eos = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe run: %s needs a value (or is unknown)\n", a);
            run_usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
#define I64(lo, hi) if (cli_parse_i64(a, val, lo, hi, &v)) return 2
#define F64(lo, hi) if (cli_parse_f64(a, val, lo, hi, &d)) return 2
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = val;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = val;
        else if (!strcmp(a, "--tokens")) tokens_arg = val;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { I64(-0x7fffffffll, 0x7fffffff); n_predict = v; }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) { I64(1, 1 << 24); cp.n_ctx = v; }
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) { I64(1, 1 << 16); cp.n_batch = v; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { I64(1, 1024); cp.n_threads = (int)v; }
        else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) { I64(0, 0x7fffffffffffffffll); sp.seed = (uint64_t)v; }
        else if (!strcmp(a, "--temp")) { F64(0, 100); sp.temp = (float)d; }
        else if (!strcmp(a, "--top-k")) { I64(0, 1 << 24); sp.top_k = (int32_t)v; }
        else if (!strcmp(a, "--top-p")) { F64(1e-9, 1); sp.top_p = (float)d; }
        else if (!strcmp(a, "--min-p")) { F64(0, 1); sp.min_p = (float)d; }
        else if (!strcmp(a, "--repeat-penalty")) { F64(1e-3, 100); sp.repeat_penalty = (float)d; }
        else if (!strcmp(a, "--repeat-last-n")) { I64(0, 1 << 24); sp.repeat_last_n = (int32_t)v; }
        else if (!strcmp(a, "--kv-type")) {
            if (!strcmp(val, "f16")) cp.kv_type = TM_TYPE_F16;
            else if (!strcmp(val, "f32")) cp.kv_type = TM_TYPE_F32;
            else {
                fprintf(stderr, "tiermoe run: --kv-type: expected f16 or f32, got '%s'\n", val);
                return 2;
            }
        } else {
            fprintf(stderr, "tiermoe run: unknown flag '%s'\n", a);
            run_usage(stderr);
            return 2;
        }
#undef I64
#undef F64
    }
    if (!model_path) {
        fprintf(stderr, "tiermoe run: missing -m FILE\n");
        run_usage(stderr);
        return 2;
    }
    if (!prompt == !tokens_arg) {
        fprintf(stderr, "tiermoe run: give exactly one of -p TEXT or --tokens IDS\n");
        return 2;
    }
    if (n_predict <= 0) {
        fprintf(stderr, "tiermoe run: -n %lld: the number of tokens to generate must be positive\n", n_predict);
        return 2;
    }

    int32_t *prompt_ids = NULL;
    int64_t n_prompt = 0;
    if (tokens_arg && parse_token_list(tokens_arg, &prompt_ids, &n_prompt)) return 2;

    const uint64_t t_load0 = tm_time_ns();
    tm_model *m;
    if (model_load(model_path, &m) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        free(prompt_ids);
        return 1;
    }
    tm_tokenizer *tok = NULL;
    int rc = 1;
    tm_context *ctx = NULL;
    tm_sampler sampler = {0};
    int32_t *hist = NULL;
    tm_detok_stream detok;
    bool have_detok = false;
    if (tokenizer_load_gguf(m->file, &tok) != TM_OK) {
        if (prompt) {
            fprintf(stderr, "tiermoe run: -p needs the model's vocabulary: %s (use --tokens IDS)\n", tm_error_message());
            goto out;
        }
        tok = NULL;
    }
    if (prompt) {
        tm_tokens ids = {0};
        tm_tokenize_opts o = {.add_special = true, .parse_special = true};
        if (tokenizer_encode(tok, prompt, strlen(prompt), &o, &ids) != TM_OK) {
            fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
            goto out;
        }
        prompt_ids = ids.ids, n_prompt = (int64_t)ids.n;
        if (!n_prompt) {
            fprintf(stderr, "tiermoe run: the prompt tokenized to nothing\n");
            goto out;
        }
    }
    if (model_context_create(m, &cp, &ctx) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        goto out;
    }
    if (n_prompt >= ctx->n_ctx) {
        fprintf(stderr, "tiermoe run: the prompt has %lld tokens, the context only %lld positions (-c)\n",
                (long long)n_prompt, (long long)ctx->n_ctx);
        rc = 2;
        goto out;
    }
    if (sampler_init(&sampler, &sp, (int32_t)m->cfg.n_vocab) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        rc = 2;
        goto out;
    }
    const double load_ms = (tm_time_ns() - t_load0) * 1e-6;
    if (n_prompt + n_predict > ctx->n_ctx) {
        n_predict = ctx->n_ctx - n_prompt;
        fprintf(stderr, "tiermoe run: generating %lld tokens, what fits the context of %lld (-c)\n", n_predict,
                (long long)ctx->n_ctx);
    }
    hist = malloc((size_t)(n_prompt + n_predict) * sizeof(int32_t));
    if (!hist) goto out;
    memcpy(hist, prompt_ids, (size_t)n_prompt * sizeof(int32_t));
    if (tok) {
        tokenizer_stream_init(&detok, tok, false, false);
        have_detok = true;
    }

    /* prompt */
    if (tok) {
        for (int64_t i = 0; i < n_prompt; i++) run_print_token(&detok, prompt_ids[i]);
    } else {
        for (int64_t i = 0; i < n_prompt; i++) printf("%s%d", i ? " " : "", prompt_ids[i]);
        printf(" |");
    }
    fflush(stdout);
    uint64_t t0 = tm_time_ns();
    if (model_decode(ctx, prompt_ids, n_prompt, TM_MOE_PHASE_PROMPT, false) != TM_OK) {
        fprintf(stderr, "\ntiermoe run: %s\n", tm_error_message());
        goto out;
    }
    const double prompt_ms = (tm_time_ns() - t0) * 1e-6;

    /* generation */
    int64_t n_hist = n_prompt, n_gen = 0, n_eval = 0;
    t0 = tm_time_ns();
    while (n_gen < n_predict) {
        int32_t id = sampler_sample(&sampler, ctx->logits, hist, n_hist);
        hist[n_hist++] = id;
        n_gen++;
        if (tok) run_print_token(&detok, id);
        else printf(" %d", id);
        fflush(stdout);
        if (n_gen == n_predict || (tok && !ignore_eos && tokenizer_is_end_of_generation(tok, id))) break;
        if (model_decode(ctx, &id, 1, TM_MOE_PHASE_DECODE, false) != TM_OK) {
            fprintf(stderr, "\ntiermoe run: %s\n", tm_error_message());
            goto out;
        }
        n_eval++;
    }
    if (have_detok) {
        const char *text;
        size_t len;
        if (tokenizer_stream_flush(&detok, &text, &len) == TM_OK) fwrite(text, 1, len, stdout);
    }
    printf("\n");
    const double eval_ms = (tm_time_ns() - t0) * 1e-6;
    fprintf(stderr, "\nload time        = %10.2f ms\n", load_ms);
    fprintf(stderr, "prompt eval time = %10.2f ms / %5lld tokens (%8.2f ms per token, %8.2f tokens per second)\n",
            prompt_ms, (long long)n_prompt, prompt_ms / n_prompt, 1e3 * n_prompt / prompt_ms);
    fprintf(stderr, "eval time        = %10.2f ms / %5lld runs   (%8.2f ms per token, %8.2f tokens per second)\n",
            eval_ms, (long long)n_eval, n_eval ? eval_ms / n_eval : 0.0, n_eval ? 1e3 * n_eval / eval_ms : 0.0);
    fprintf(stderr, "total time       = %10.2f ms / %5lld tokens\n", load_ms + prompt_ms + eval_ms,
            (long long)(n_prompt + n_gen));
    if (profile) {
        uint64_t total = 0;
        for (int i = 0; i < TM_PROF_COUNT; i++) total += ctx->prof_ns[i];
        fprintf(stderr, "time by part (prompt and eval):\n");
        for (int i = 0; i < TM_PROF_COUNT; i++)
            fprintf(stderr, "  %-12s %10.2f ms %5.1f%%\n", tm_prof_part_names[i], ctx->prof_ns[i] * 1e-6,
                    100.0 * ctx->prof_ns[i] / (total ? total : 1));
    }
    rc = 0;
out:
    if (have_detok) tokenizer_stream_free(&detok);
    free(hist);
    sampler_free(&sampler);
    model_context_free(ctx);
    if (tok) tokenizer_free(tok);
    model_free(m);
    free(prompt_ids);
    return rc;
}
