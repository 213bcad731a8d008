/* tiermoe run: generate from a prompt, streaming tokens, then llama.cpp-style timings. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/timing.h"
#include "model/model.h"
#include "model/session.h"
#include "model/synth.h"
#include "sample/sample.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "trace/trace.h"

static void run_usage(FILE *out) {
    fprintf(
        out,
        "usage: tiermoe run -m FILE (-p TEXT | --tokens 1,2,3 | --chat) [options]\n"
        "  -m, --model FILE       GGUF model\n"
        "  -p, --prompt TEXT      prompt text (needs a model with a vocabulary)\n"
        "  --tokens IDS           prompt as comma-separated token ids\n"
        "  --chat                 interactive chat with history, one user turn per line of stdin\n"
        "  -sys, --system-prompt TEXT   system message for --chat\n"
        "  --chat-template NAME   chatml|qwen3|llama3|mistral|harmony (default: from the model)\n"
        "  --verbose-prompt       print the prompt's token ids to stderr\n"
        "  -n, --n-predict N      tokens to generate (per turn with --chat; default 64)\n"
        "  --ignore-eos           keep generating past end-of-generation tokens\n"
        "  --profile              print where the time went\n");
    fputs(cli_gen_help, out);
    fputs(cli_place_help, out);
    fputs(trace_config_help, out);
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
            fprintf(stderr,
                    "tiermoe run: --tokens: expected comma-separated non-negative ids, got '%s'\n",
                    s);
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

/* One conversation with the model: the tokens in its KV cache (seq), the
 * sampler, the streaming detokenizer, and the time spent. Both the one-shot
 * prompt and --chat go through session_eval and session_generate. */
typedef struct run_session {
    tm_model *m;
    tm_tokenizer *tok; /* NULL: the model has no vocabulary, print ids */
    tm_context *ctx;
    tm_sampler sampler;
    tm_session seq; /* the tokens whose keys and values are in the cache */
    bool ignore_eos, verbose_prompt;
    tm_detok_stream detok;
    double prompt_ms, eval_ms;
    int64_t n_prompt, n_eval, n_gen;
} run_session;

/* Print what a token completes (never half a UTF-8 character); keep the bytes in reply. */
static void session_print(run_session *s, int32_t id, char **reply, size_t *reply_len) {
    if (!s->tok) {
        printf(" %d", id);
        return;
    }
    const char *text;
    size_t len;
    if (tokenizer_stream_push(&s->detok, id, &text, &len) != TM_OK) return;
    fwrite(text, 1, len, stdout);
    if (reply) {
        char *r = realloc(*reply, *reply_len + len + 1);
        if (!r) return;
        memcpy(r + *reply_len, text, len);
        *reply = r, *reply_len += len, r[*reply_len] = '\0';
    }
}

/* Make the cache hold exactly ids[0..n), reusing the prefix it already has. */
static tm_status session_eval(run_session *s, const int32_t *ids, int64_t n) {
    int64_t n_eval = 0;
    uint64_t t0 = tm_time_ns();
    tm_status st = model_session_eval(&s->seq, ids, n, &n_eval);
    s->prompt_ms += (tm_time_ns() - t0) * 1e-6;
    s->n_prompt += n_eval;
    return st;
}

/* Sample up to n_predict tokens (fewer when the context fills or an end-of-generation
 * token comes), streaming them; the reply's text goes to *reply when reply is not NULL. */
static tm_status session_generate(run_session *s, int64_t n_predict, char **reply,
                                  size_t *reply_len) {
    if (s->tok) tokenizer_stream_init(&s->detok, s->tok, false, false);
    uint64_t t0 = tm_time_ns();
    tm_status st = TM_OK;
    for (int64_t n = 0; n < n_predict; n++) {
        int32_t id = sampler_sample(&s->sampler, s->ctx->logits, s->seq.ids, s->seq.n);
        s->n_gen++;
        session_print(s, id, reply, reply_len);
        fflush(stdout);
        if (n + 1 == n_predict ||
            (s->tok && !s->ignore_eos && tokenizer_is_end_of_generation(s->tok, id)))
            break;
        if (s->seq.n == s->ctx->n_ctx) {
            fprintf(stderr, "\ntiermoe run: the context of %lld positions is full (-c)\n",
                    (long long)s->ctx->n_ctx);
            break;
        }
        if ((st = model_session_push(&s->seq, id)) != TM_OK) break;
        s->n_eval++;
    }
    s->eval_ms += (tm_time_ns() - t0) * 1e-6;
    if (s->tok) {
        const char *text;
        size_t len;
        if (tokenizer_stream_flush(&s->detok, &text, &len) == TM_OK) fwrite(text, 1, len, stdout);
        tokenizer_stream_free(&s->detok);
    }
    printf("\n");
    return st;
}

static void session_print_ids(const run_session *s, const char *what, const int32_t *ids,
                              int64_t n) {
    if (!s->verbose_prompt) return;
    fprintf(stderr, "%s:", what);
    for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* --chat: read user turns from stdin, render the whole conversation with the model's
 * template each turn, and reuse the cached prefix. */
static int run_chat(run_session *s, const char *system, const char *template_name,
                    int64_t n_predict) {
    if (!s->tok) {
        fprintf(stderr, "tiermoe run: --chat needs a model with a vocabulary\n");
        return 1;
    }
    const char *def_sys = NULL;
    tm_chat_format f = chat_format_detect(tokenizer_chat_template(s->tok), &def_sys);
    if (template_name && chat_format_from_name(template_name, &f) != TM_OK) {
        fprintf(stderr, "tiermoe run: --chat-template: %s\n", tm_error_message());
        return 2;
    }
    if (f == TM_CHAT_UNKNOWN) {
        fprintf(
            stderr,
            "tiermoe run: this model's chat template is not one tiermoe knows; choose one with "
            "--chat-template chatml|qwen3|llama3|mistral|harmony, or use -p for raw completion\n");
        return 2;
    }
    fprintf(stderr, "chat (%s template): type a message and press Enter; end with Ctrl-D\n",
            chat_format_name(f));
    tm_chat_message *msgs = NULL;
    size_t n_msgs = 0, cap = 0;
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 0;
    if (system) {
        msgs = malloc(sizeof(*msgs) * (cap = 8));
        if (!msgs) return 1;
        msgs[n_msgs++] = (tm_chat_message){"system", strdup(system)};
    }
    for (;;) {
        if (isatty(fileno(stdin))) fprintf(stderr, "> ");
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (!got) continue;
        if (n_msgs + 2 > cap) {
            tm_chat_message *t = realloc(msgs, sizeof(*msgs) * (cap = cap ? 2 * cap : 8));
            if (!t) {
                rc = 1;
                break;
            }
            msgs = t;
        }
        msgs[n_msgs++] = (tm_chat_message){"user", strdup(line)};
        char *text = NULL;
        size_t text_len = 0;
        tm_tokens ids = {0};
        tm_chat_opts o = {.add_generation_prompt = true, .default_system = def_sys};
        tm_tokenize_opts to = {.add_special = true, .parse_special = true};
        if (chat_render(f, msgs, n_msgs, &o, &text, &text_len) != TM_OK ||
            tokenizer_encode(s->tok, text, text_len, &to, &ids) != TM_OK ||
            session_eval(s, ids.ids, (int64_t)ids.n) != TM_OK) {
            fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
            free(text), tokenizer_tokens_free(&ids);
            rc = 1;
            break;
        }
        session_print_ids(s, "prompt ids", ids.ids, (int64_t)ids.n);
        free(text), tokenizer_tokens_free(&ids);
        char *reply = calloc(1, 1);
        size_t reply_len = 0;
        if (!reply || session_generate(s, n_predict, &reply, &reply_len) != TM_OK) {
            fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
            free(reply);
            rc = 1;
            break;
        }
        size_t start, n;
        chat_reply_content(f, reply, reply_len, &start, &n);
        memmove(reply, reply + start, n);
        reply[n] = '\0';
        msgs[n_msgs++] = (tm_chat_message){"assistant", reply};
    }
    for (size_t i = 0; i < n_msgs; i++) free((char *)msgs[i].content);
    free(msgs), free(line);
    return rc;
}

static int run_main(int argc, char **argv, cli_place *place) {
    const char *model_path = NULL, *prompt = NULL, *tokens_arg = NULL, *system = NULL,
               *template_name = NULL;
    long long n_predict = 64, v;
    tm_context_params cp = {.kv_type = TM_TYPE_F16}; /* --kv-type's default */
    tm_sampler_params sp;
    sample_params_default(&sp);
    cli_gen gen = {.cp = &cp, .sp = &sp};
    int chat = 0;
    run_session s = {0};
    tm_trace_config tc = {0};
    tm_trace *tr = NULL;
    if (trace_config_from_env(&tc) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--profile")) {
            cp.profile = true;
            continue;
        }
        const int nt = trace_config_parse_arg(&tc, argc, argv, i);
        if (nt < 0) return 2;
        if (nt > 0) {
            i += nt - 1;
            continue;
        }
        const int np = cli_place_parse(place, "run", argc, argv, i);
        const int ng = np ? 0 : cli_gen_parse(&gen, "run", argc, argv, i);
        if (np < 0 || ng < 0) return 2;
        if (np + ng > 0) {
            i += np + ng - 1;
            continue;
        }
        if (!strcmp(a, "--ignore-eos")) {
            s.ignore_eos = true;
            continue;
        }
        if (!strcmp(a, "--chat")) {
            chat = 1;
            continue;
        }
        if (!strcmp(a, "--verbose-prompt")) {
            s.verbose_prompt = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe run: %s needs a value (or is unknown)\n", a);
            run_usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model_path = val;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt"))
            prompt = val;
        else if (!strcmp(a, "--tokens"))
            tokens_arg = val;
        else if (!strcmp(a, "-sys") || !strcmp(a, "--system-prompt"))
            system = val;
        else if (!strcmp(a, "--chat-template"))
            template_name = val;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (cli_parse_i64(a, val, -0x7fffffffll, 0x7fffffff, &v)) return 2;
            n_predict = v;
        } else {
            fprintf(stderr, "tiermoe run: unknown flag '%s'\n", a);
            run_usage(stderr);
            return 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "tiermoe run: missing -m FILE\n");
        run_usage(stderr);
        return 2;
    }
    if (chat ? (prompt || tokens_arg) : !prompt == !tokens_arg) {
        fprintf(stderr, "tiermoe run: give exactly one of -p TEXT, --tokens IDS or --chat\n");
        return 2;
    }
    if ((system || template_name) && !chat) {
        fprintf(stderr, "tiermoe run: -sys and --chat-template go with --chat\n");
        return 2;
    }
    if (n_predict <= 0) {
        fprintf(stderr, "tiermoe run: -n %lld: the number of tokens to generate must be positive\n",
                n_predict);
        return 2;
    }

    int32_t *prompt_ids = NULL;
    int64_t n_prompt = 0;
    if (tokens_arg && parse_token_list(tokens_arg, &prompt_ids, &n_prompt)) return 2;

    const uint64_t t_load0 = tm_time_ns();
    int rc = 1;
    if (model_load(model_path, &s.m) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        free(prompt_ids);
        return 1;
    }
    if (cli_place_apply(place, "run", s.m, &cp)) goto out;
    if (tokenizer_load_gguf(s.m->file, &s.tok) != TM_OK) {
        s.tok = NULL;
        if (prompt || chat) {
            fprintf(stderr, "tiermoe run: %s needs the model's vocabulary: %s (use --tokens IDS)\n",
                    chat ? "--chat" : "-p", tm_error_message());
            goto out;
        }
    }
    if (prompt) {
        tm_tokens ids = {0};
        tm_tokenize_opts o = {.add_special = true, .parse_special = true};
        if (tokenizer_encode(s.tok, prompt, strlen(prompt), &o, &ids) != TM_OK) {
            fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
            goto out;
        }
        prompt_ids = ids.ids, n_prompt = (int64_t)ids.n;
        if (!n_prompt) {
            fprintf(stderr, "tiermoe run: the prompt tokenized to nothing\n");
            goto out;
        }
    }
    if (trace_config_enabled(&tc)) {
        if (model_trace_create(&tc, s.m, &tr) != TM_OK) {
            fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
            goto out;
        }
        trace_attach(tr, &cp.cb, &cp.cb_ud);
    }
    if (model_context_create(s.m, &cp, &s.ctx) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        goto out;
    }
    if (tr) trace_set_resident(tr, tier_expert_resident, s.ctx->tier);
    if (n_prompt >= s.ctx->n_ctx) {
        fprintf(stderr,
                "tiermoe run: the prompt has %lld tokens, the context only %lld positions (-c)\n",
                (long long)n_prompt, (long long)s.ctx->n_ctx);
        rc = 2;
        goto out;
    }
    if (sampler_init(&s.sampler, &sp, (int32_t)s.m->cfg.n_vocab) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        rc = 2;
        goto out;
    }
    if (model_session_init(&s.seq, s.ctx) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        goto out;
    }
    const double load_ms = (tm_time_ns() - t_load0) * 1e-6;

    if (chat) {
        rc = run_chat(&s, system, template_name, n_predict);
    } else {
        if (n_prompt + n_predict > s.ctx->n_ctx) {
            n_predict = s.ctx->n_ctx - n_prompt;
            fprintf(stderr,
                    "tiermoe run: generating %lld tokens, what fits the context of %lld (-c)\n",
                    n_predict, (long long)s.ctx->n_ctx);
        }
        session_print_ids(&s, "prompt ids", prompt_ids, n_prompt);
        if (s.tok) { /* echo the prompt as llama.cpp does */
            tokenizer_stream_init(&s.detok, s.tok, false, false);
            for (int64_t i = 0; i < n_prompt; i++) session_print(&s, prompt_ids[i], NULL, NULL);
            tokenizer_stream_free(&s.detok);
        } else {
            for (int64_t i = 0; i < n_prompt; i++) printf("%s%d", i ? " " : "", prompt_ids[i]);
            printf(" |");
        }
        fflush(stdout);
        if (session_eval(&s, prompt_ids, n_prompt) != TM_OK ||
            session_generate(&s, n_predict, NULL, NULL) != TM_OK) {
            fprintf(stderr, "\ntiermoe run: %s\n", tm_error_message());
            goto out;
        }
        rc = 0;
    }
    fprintf(stderr, "\nload time        = %10.2f ms\n", load_ms);
    fprintf(stderr,
            "prompt eval time = %10.2f ms / %5lld tokens (%8.2f ms per token, %8.2f tokens per "
            "second)\n",
            s.prompt_ms, (long long)s.n_prompt, s.n_prompt ? s.prompt_ms / s.n_prompt : 0.0,
            s.prompt_ms > 0 ? 1e3 * s.n_prompt / s.prompt_ms : 0.0);
    fprintf(stderr,
            "eval time        = %10.2f ms / %5lld runs   (%8.2f ms per token, %8.2f tokens per "
            "second)\n",
            s.eval_ms, (long long)s.n_eval, s.n_eval ? s.eval_ms / s.n_eval : 0.0,
            s.n_eval ? 1e3 * s.n_eval / s.eval_ms : 0.0);
    fprintf(stderr, "total time       = %10.2f ms / %5lld tokens\n",
            load_ms + s.prompt_ms + s.eval_ms, (long long)(s.n_prompt + s.n_gen));
    if (cp.profile) {
        cli_profile_print(s.ctx, NULL, NULL, NULL, 1, stderr);
        cli_store_print(s.ctx, NULL, (s.prompt_ms + s.eval_ms) * 1e-3, stderr);
        synth_routing_print(s.m->file, stderr);
    }
    if (tr && trace_finish(tr) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        rc = 1;
    }
out:
    trace_free(tr);
    model_session_free(&s.seq);
    sampler_free(&s.sampler);
    model_context_free(s.ctx);
    if (s.tok) tokenizer_free(s.tok);
    model_free(s.m);
    free(prompt_ids);
    return rc;
}

int cmd_run(int argc, char **argv) {
    cli_place place = {0};
    const int rc = run_main(argc, argv, &place);
    cli_place_free(&place);
    return rc;
}
