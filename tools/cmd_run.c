/* tiermoe run: generate from a prompt, streaming tokens, then llama.cpp-style
 * timings. On the public API alone (include/tiermoe.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static void run_usage(FILE *out) {
    fprintf(
        out,
        "usage: tiermoe run -m FILE (-p TEXT | --tokens 1,2,3 | --chat) [options]\n"
        "  -m, --model FILE       GGUF model\n"
        "  -p, --prompt TEXT      prompt text (needs a model with a vocabulary)\n"
        "  --tokens IDS           prompt as comma-separated token ids\n"
        "  --chat                 interactive chat with history, one user turn per line of stdin\n"
        "  -sys, --system-prompt TEXT   system message for --chat\n"
        "  --chat-template NAME   chatml|qwen3|llama3|mistral|harmony|gemma4\n"
        "                         (default: from the model)\n"
        "  --verbose-prompt       print the prompt's token ids to stderr\n"
        "  -n, --n-predict N      tokens to generate (per turn with --chat; default 64)\n"
        "  --ignore-eos           keep generating past end-of-generation tokens\n"
        "  --profile              print where the time went\n");
    fputs(cli_gen_help, out);
    fputs(cli_place_help, out);
    fputs(cli_trace_help, out);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
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

/* One conversation with the model: the tokens in sequence 0 of the context,
 * the sampler, the streaming detokenizer, and the time spent. Both the
 * one-shot prompt and --chat go through session_eval and session_generate. */
typedef struct run_session {
    tm_model *m;
    bool vocab; /* false: the model has no vocabulary, print ids */
    tm_context *ctx;
    int64_t n_ctx;
    tm_sampler *sampler;
    int32_t *ids; /* [n_ctx] the tokens whose keys and values the context holds */
    int64_t n;
    bool ignore_eos, verbose_prompt;
    tm_detokenizer *detok;
    double prompt_ms, eval_ms;
    int64_t n_prompt, n_eval, n_gen;
} run_session;

/* Print what a token completes (never half a UTF-8 character); keep the bytes in reply. */
static void session_print(run_session *s, int32_t id, char **reply, size_t *reply_len) {
    if (!s->vocab) {
        printf(" %d", id);
        return;
    }
    const char *text;
    size_t len;
    if (tm_detokenizer_push(s->detok, id, &text, &len) != TM_OK) return;
    fwrite(text, 1, len, stdout);
    if (reply) {
        char *r = realloc(*reply, *reply_len + len + 1);
        if (!r) return;
        memcpy(r + *reply_len, text, len);
        *reply = r, *reply_len += len, r[*reply_len] = '\0';
    }
}

/* Make the context hold exactly ids[0..n) (n <= n_ctx), reusing the prefix it
 * already has: never the last token, whose logits the next sample needs, and
 * less where the model's state cannot go back (tm_seq_rewind). */
static tm_status session_eval(run_session *s, const int32_t *ids, int64_t n) {
    int64_t keep = 0, kept = 0;
    while (keep < s->n && keep < n - 1 && s->ids[keep] == ids[keep]) keep++;
    tm_seq_rewind(s->ctx, 0, keep, &kept);
    const uint64_t t0 = now_ns();
    const tm_status st = tm_eval(s->ctx, 0, ids + kept, n - kept);
    s->prompt_ms += (now_ns() - t0) * 1e-6;
    if (st != TM_OK) {
        tm_seq_length(s->ctx, 0, &s->n); /* what is left of it */
        return st;
    }
    memcpy(s->ids + kept, ids + kept, (size_t)(n - kept) * sizeof(int32_t));
    s->n = n;
    s->n_prompt += n - kept;
    return TM_OK;
}

/* Sample up to n_predict tokens (fewer when the context fills or an end-of-generation
 * token comes), streaming them; the reply's text goes to *reply when reply is not NULL. */
static tm_status session_generate(run_session *s, int64_t n_predict, char **reply,
                                  size_t *reply_len) {
    tm_status st = TM_OK;
    if (s->vocab && (st = tm_detokenizer_create(s->m, false, false, &s->detok)) != TM_OK) return st;
    const uint64_t t0 = now_ns();
    for (int64_t n = 0; n < n_predict; n++) {
        int32_t id;
        bool end = false;
        if ((st = tm_sample(s->sampler, s->ctx, 0, &id)) != TM_OK) break;
        s->n_gen++;
        session_print(s, id, reply, reply_len);
        fflush(stdout);
        if (s->vocab && !s->ignore_eos) tm_token_is_end(s->m, id, &end);
        if (n + 1 == n_predict || end) break;
        if (s->n == s->n_ctx) {
            fprintf(stderr, "\ntiermoe run: the context of %lld positions is full (-c)\n",
                    (long long)s->n_ctx);
            break;
        }
        if ((st = tm_eval(s->ctx, 0, &id, 1)) != TM_OK) break;
        s->ids[s->n++] = id;
        s->n_eval++;
    }
    s->eval_ms += (now_ns() - t0) * 1e-6;
    if (s->vocab) {
        const char *text;
        size_t len;
        if (tm_detokenizer_flush(s->detok, &text, &len) == TM_OK) fwrite(text, 1, len, stdout);
        tm_detokenizer_free(s->detok);
        s->detok = NULL;
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

/* The conversation rendered with the chat template and tokenized, then made
 * the context's (its shared prefix kept); false after a message. */
static bool chat_eval(run_session *s, const char *template_name, const tm_chat_message *msgs,
                      size_t n_msgs) {
    size_t len = 0, n_ids = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    /* the size first (a capacity of 0 asks for it: TM_ERR_ARG), then the text */
    tm_status st = tm_chat_apply(s->m, template_name, msgs, n_msgs, true, NULL, 0, &len);
    if (st == TM_ERR_ARG && (text = malloc(len + 1)))
        st = tm_chat_apply(s->m, template_name, msgs, n_msgs, true, text, len + 1, &len);
    if (st == TM_OK) st = cli_tokenize(s->m, text, len, true, true, &ids, &n_ids);
    bool ok = st == TM_OK;
    if (!ok)
        fprintf(stderr, "tiermoe run: %s\n", text ? tm_error_message() : "out of memory");
    else if ((int64_t)n_ids > s->n_ctx) {
        fprintf(stderr, "tiermoe run: %lld tokens do not fit the context of %lld positions (-c)\n",
                (long long)n_ids, (long long)s->n_ctx);
        ok = false;
    } else if (session_eval(s, ids, (int64_t)n_ids) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        ok = false;
    } else {
        session_print_ids(s, "prompt ids", ids, (int64_t)n_ids);
    }
    free(text), free(ids);
    return ok;
}

/* --chat: read user turns from stdin, render the whole conversation with the model's
 * template each turn, and reuse the cached prefix. */
static int run_chat(run_session *s, const char *system, const char *template_name,
                    int64_t n_predict) {
    if (!s->vocab) {
        fprintf(stderr, "tiermoe run: --chat needs a model with a vocabulary\n");
        return 1;
    }
    size_t start = 0, n = 0;
    const tm_status st = tm_chat_reply(s->m, template_name, "", 0, &start, &n); /* the format */
    if (st == TM_ERR_ARG) {
        fprintf(stderr, "tiermoe run: --chat-template: %s\n", tm_error_message());
        return 2;
    }
    if (st != TM_OK) {
        fprintf(stderr,
                "tiermoe run: this model's chat template is not one tiermoe knows; choose one with "
                "--chat-template chatml|qwen3|llama3|mistral|harmony|gemma4, or use -p for raw "
                "completion\n");
        return 2;
    }
    tm_model_info info;
    tm_model_describe(s->m, &info);
    fprintf(stderr, "chat (%s template): type a message and press Enter; end with Ctrl-D\n",
            template_name ? template_name : info.chat_format);
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
        if (!chat_eval(s, template_name, msgs, n_msgs)) {
            rc = 1;
            break;
        }
        char *reply = calloc(1, 1);
        size_t reply_len = 0;
        if (!reply || session_generate(s, n_predict, &reply, &reply_len) != TM_OK) {
            fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
            free(reply);
            rc = 1;
            break;
        }
        tm_chat_reply(s->m, template_name, reply, reply_len, &start, &n);
        memmove(reply, reply + start, n);
        reply[n] = '\0';
        msgs[n_msgs++] = (tm_chat_message){"assistant", reply};
    }
    for (size_t i = 0; i < n_msgs; i++) free((char *)msgs[i].content);
    free(msgs), free(line);
    return rc;
}

/* The vocabulary's absence, for -p and --chat: the reason the library kept. */
static void run_no_vocab(const run_session *s, const char *flag) {
    size_t n;
    tm_tokenize(s->m, "", 0, false, false, NULL, 0, &n); /* fails, saying why */
    fprintf(stderr, "tiermoe run: %s needs the model's vocabulary: %s (use --tokens IDS)\n", flag,
            tm_error_message());
}

/* The timings in llama.cpp's format, then --profile's report and the tracer's. */
static int run_report(const run_session *s, double load_ms, bool profile, const cli_trace *tr) {
    fprintf(stderr, "\nload time        = %10.2f ms\n", load_ms);
    fprintf(stderr,
            "prompt eval time = %10.2f ms / %5lld tokens (%8.2f ms per token, %8.2f tokens per "
            "second)\n",
            s->prompt_ms, (long long)s->n_prompt, s->n_prompt ? s->prompt_ms / s->n_prompt : 0.0,
            s->prompt_ms > 0 ? 1e3 * s->n_prompt / s->prompt_ms : 0.0);
    fprintf(stderr,
            "eval time        = %10.2f ms / %5lld runs   (%8.2f ms per token, %8.2f tokens per "
            "second)\n",
            s->eval_ms, (long long)s->n_eval, s->n_eval ? s->eval_ms / s->n_eval : 0.0,
            s->n_eval ? 1e3 * s->n_eval / s->eval_ms : 0.0);
    fprintf(stderr, "total time       = %10.2f ms / %5lld tokens\n",
            load_ms + s->prompt_ms + s->eval_ms, (long long)(s->n_prompt + s->n_gen));
    size_t len = 0;
    char *text = NULL;
    /* the size first (a capacity of 0 asks for it: TM_ERR_ARG), then the text */
    if (profile && tm_context_profile(s->ctx, NULL, 0, &len) == TM_ERR_ARG &&
        (text = malloc(len + 1)) && tm_context_profile(s->ctx, text, len + 1, &len) == TM_OK)
        fputs(text, stderr);
    free(text), text = NULL;
    if (!cli_trace_enabled(tr)) return 0;
    tm_status st = TM_OK;
    if (tr->stats || tr->per_layer || tr->output) {
        st = tm_expert_stats_summary(s->ctx, tr->per_layer, NULL, 0, &len);
        if (st == TM_ERR_ARG && (text = malloc(len + 1)))
            st = tm_expert_stats_summary(s->ctx, tr->per_layer, text, len + 1, &len);
        if (st == TM_OK) fputs(text, stderr);
        free(text);
    }
    if (st == TM_OK && tr->output && (st = tm_expert_stats_write(s->ctx, tr->output)) == TM_OK)
        fprintf(stderr, "expert trace: wrote %s\n", tr->output);
    if (st == TM_OK) return 0;
    fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
    return 1;
}

static int run_main(int argc, char **argv, cli_place *place) {
    const char *model_path = NULL, *prompt = NULL, *tokens_arg = NULL, *system = NULL,
               *template_name = NULL;
    long long n_predict = 64, v;
    tm_context_opts co;
    tm_context_opts_init(&co);
    place->o = &co;
    tm_sampler_params sp;
    tm_sampler_params_init(&sp);
    cli_gen gen = {.o = &co, .sp = &sp};
    int chat = 0;
    run_session s = {0};
    cli_trace tr = {0};
    if (cli_trace_from_env(&tr, "run")) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--profile")) {
            co.profile = true;
            continue;
        }
        const int nt = cli_trace_parse(&tr, argc, argv, i);
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

    const uint64_t t_load0 = now_ns();
    int rc = 1;
    if (tm_model_load(model_path, &s.m) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        free(prompt_ids);
        return 1;
    }
    cli_place_finish(place, "run");
    tm_model_info info;
    tm_model_describe(s.m, &info);
    s.vocab = info.has_vocab;
    if (!s.vocab && (prompt || chat)) {
        run_no_vocab(&s, chat ? "--chat" : "-p");
        goto out;
    }
    if (prompt) {
        size_t n = 0;
        const tm_status st = cli_tokenize(s.m, prompt, strlen(prompt), true, true, &prompt_ids, &n);
        if (st != TM_OK) {
            fprintf(stderr, "tiermoe run: %s\n",
                    st == TM_ERR_NOMEM ? "out of memory" : tm_error_message());
            goto out;
        }
        n_prompt = (int64_t)n;
        if (!n_prompt) {
            fprintf(stderr, "tiermoe run: the prompt tokenized to nothing\n");
            goto out;
        }
    }
    co.expert_stats = cli_trace_enabled(&tr);
    co.expert_trace_names = tr.names;
    tm_context_info ci;
    if (tm_context_create(s.m, &co, &s.ctx) != TM_OK || tm_context_describe(s.ctx, &ci) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        goto out;
    }
    s.n_ctx = ci.n_ctx;
    if (n_prompt >= s.n_ctx) {
        fprintf(stderr,
                "tiermoe run: the prompt has %lld tokens, the context only %lld positions (-c)\n",
                (long long)n_prompt, (long long)s.n_ctx);
        rc = 2;
        goto out;
    }
    if (tm_sampler_create(s.m, &sp, &s.sampler) != TM_OK) {
        fprintf(stderr, "tiermoe run: %s\n", tm_error_message());
        rc = 2;
        goto out;
    }
    if (!(s.ids = malloc((size_t)s.n_ctx * sizeof(int32_t)))) {
        fprintf(stderr, "tiermoe run: out of memory for %lld token ids\n", (long long)s.n_ctx);
        goto out;
    }
    const double load_ms = (now_ns() - t_load0) * 1e-6;

    if (chat) {
        rc = run_chat(&s, system, template_name, n_predict);
    } else {
        if (n_prompt + n_predict > s.n_ctx) {
            n_predict = s.n_ctx - n_prompt;
            fprintf(stderr,
                    "tiermoe run: generating %lld tokens, what fits the context of %lld (-c)\n",
                    n_predict, (long long)s.n_ctx);
        }
        session_print_ids(&s, "prompt ids", prompt_ids, n_prompt);
        if (s.vocab) { /* echo the prompt as llama.cpp does (what is held back is dropped) */
            if (tm_detokenizer_create(s.m, false, false, &s.detok) == TM_OK)
                for (int64_t i = 0; i < n_prompt; i++) session_print(&s, prompt_ids[i], NULL, NULL);
            tm_detokenizer_free(s.detok);
            s.detok = NULL;
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
    if (run_report(&s, load_ms, co.profile, &tr)) rc = 1;
out:
    free(s.ids);
    tm_sampler_free(s.sampler);
    tm_context_free(s.ctx);
    tm_model_free(s.m);
    free(prompt_ids);
    return rc;
}

int cmd_run(int argc, char **argv) {
    cli_place place = {0};
    const int rc = run_main(argc, argv, &place);
    cli_place_free(&place);
    return rc;
}
