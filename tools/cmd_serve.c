/* tiermoe serve: the OpenAI-compatible server (src/server/, docs/server.md).
 * Binds first (so /health answers "loading"), loads the model, serves until
 * SIGINT or SIGTERM, then shuts down cleanly and exits 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

#ifndef TM_HAVE_SERVER
int cmd_serve(int argc, char **argv) {
    (void)argc, (void)argv;
    fprintf(stderr, "tiermoe serve: left out of this build (libmicrohttpd was not found; "
                    "scripts/deps.sh installs libmicrohttpd-dev)\n");
    return 1;
}
#else
#include "server.h" /* src/server: the server, on the API as this file */

static void serve_usage(FILE *out) {
    fprintf(
        out,
        "usage: tiermoe serve -m FILE [options]\n"
        "  -m, --model FILE       GGUF model (with a vocabulary)\n"
        "  --host ADDR            address to listen on (default 127.0.0.1)\n"
        "  --port N               port (default 8080; 0: any free one, printed)\n"
        "  --api-key KEY          require 'Authorization: Bearer KEY' (all but /health);\n"
        "                         also TIERMOE_API_KEY\n"
        "  -a, --alias NAME       a name requests may give as \"model\" (repeat or comma-list;\n"
        "                         the first is the id in /v1/models). Always accepted: the\n"
        "                         file's base name (with or without .gguf), general.name\n"
        "  -np, --parallel N      slots: N sequences decoded together in one batch, each with\n"
        "                         -c / N positions of the KV cache (default 1)\n"
        "  -n, --n-predict N      max_tokens of a request that gives none (default: the\n"
        "                         context size)\n"
        "  --max-tokens N         the largest max_tokens a request may ask (default: -c)\n"
        "  --max-prompt N         the longest prompt in tokens (default: -c less one)\n"
        "  --max-body BYTES       the largest request body (default 8388608)\n"
        "  --max-queue N          requests that may wait (default 64; more get 503)\n"
        "  --max-connections N    requests served at once (default 64); more get 503 but\n"
        "                         /health (libmicrohttpd holds up to 2N connections)\n"
        "  --max-connections-per-ip N  connections from one address (default: 1.5 x\n"
        "                         --max-connections)\n"
        "  --read-timeout S       seconds a client has to send a request, headers and body,\n"
        "                         from connecting or its previous reply (default 10)\n"
        "  --cors-origin ORIGIN   pages of ORIGIN (http://host:port; repeat or comma-list;\n"
        "                         * for any) may call the API: CORS headers, and their POSTs\n"
        "                         accepted (else a POST from another page's Origin is 403)\n"
        "  --chat-template NAME   chatml|qwen3|llama3|mistral|harmony|gemma4\n"
        "                         (default: from the model)\n"
        "  --no-expert-trace      no live expert counters (/moe-layer-perf answers 409; a\n"
        "                         full-GPU decode keeps its CUDA graph)\n"
        "  --profile              time every part (lane times in /metrics; slower on a GPU)\n"
        "  --quiet                no line per request on stderr\n"
        "  sampling flags set the defaults of what a request does not give:\n");
    fputs(cli_gen_help, out);
    fputs(cli_place_help, out);
    fputs(cli_trace_help, out);
}

/* Append v to the comma-separated *list (a repeated flag); false out of memory. */
static bool list_append(char **list, const char *v) {
    const size_t n = *list ? strlen(*list) : 0;
    char *grown = realloc(*list, n + strlen(v) + 2);
    if (!grown) return false;
    snprintf(grown + n, strlen(v) + 2, "%s%s", n ? "," : "", v);
    *list = grown;
    return true;
}

static int serve_main(int argc, char **argv, cli_place *place, char **aliases, char **origins) {
    const char *model_path = NULL;
    tm_server_params sp = {.port = 8080, .parallel = 1, .api_key = getenv("TIERMOE_API_KEY")};
    tm_sampler_params_init(&sp.sampling);
    cli_gen gen = {.o = place->o, .sp = &sp.sampling};
    cli_trace ct = {0};
    if (cli_trace_from_env(&ct, "serve")) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-expert-trace") || !strcmp(a, "--quiet") || !strcmp(a, "--profile")) {
            sp.no_trace |= !strcmp(a, "--no-expert-trace");
            sp.quiet |= !strcmp(a, "--quiet");
            place->o->profile |= !strcmp(a, "--profile");
            continue;
        }
        const int nt = cli_trace_parse(&ct, argc, argv, i);
        const int np = nt ? 0 : cli_place_parse(place, "serve", argc, argv, i);
        const int ng = nt || np ? 0 : cli_gen_parse(&gen, "serve", argc, argv, i);
        if (nt < 0 || np < 0 || ng < 0) return 2;
        if (nt + np + ng > 0) {
            i += nt + np + ng - 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe serve: %s needs a value (or is unknown)\n", a);
            serve_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        long long n;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model_path = v;
        else if (!strcmp(a, "--host"))
            sp.host = v;
        else if (!strcmp(a, "--api-key"))
            sp.api_key = v;
        else if (!strcmp(a, "-a") || !strcmp(a, "--alias") || !strcmp(a, "--cors-origin")) {
            if (!list_append(!strcmp(a, "--cors-origin") ? origins : aliases, v)) {
                fprintf(stderr, "tiermoe serve: out of memory\n");
                return 1;
            }
            sp.alias = *aliases, sp.cors_origin = *origins;
        } else if (!strcmp(a, "--chat-template"))
            sp.chat_template = v;
        else {
            static const struct {
                const char *flag, *alt;
                long long lo, hi;
            } nums[] = {{"--port", NULL, 0, 65535},
                        {"--parallel", "-np", 1, TM_SERVER_MAX_PARALLEL},
                        {"--n-predict", "-n", 1, 1ll << 32},
                        {"--max-tokens", NULL, 1, 1ll << 32},
                        {"--max-prompt", NULL, 1, 1ll << 32},
                        {"--max-body", NULL, 1024, 1ll << 32},
                        {"--max-queue", NULL, 1, 1 << 20},
                        {"--max-connections", NULL, 1, 4096},
                        {"--max-connections-per-ip", NULL, 1, 8192},
                        {"--read-timeout", NULL, 1, 3600}};
            size_t k = 0;
            while (k < sizeof(nums) / sizeof(nums[0]) && strcmp(a, nums[k].flag) &&
                   !(nums[k].alt && !strcmp(a, nums[k].alt)))
                k++;
            if (k == sizeof(nums) / sizeof(nums[0])) {
                fprintf(stderr, "tiermoe serve: unknown flag '%s'\n", a);
                serve_usage(stderr);
                return 2;
            }
            if (cli_parse_i64(a, v, nums[k].lo, nums[k].hi, &n)) return 2;
            switch (k) {
            case 0:
                sp.port = (int)n;
                break;
            case 1:
                sp.parallel = (int)n;
                break;
            case 2:
                sp.default_tokens = n;
                break;
            case 3:
                sp.max_tokens = n;
                break;
            case 4:
                sp.max_prompt = n;
                break;
            case 5:
                sp.max_body = (size_t)n;
                break;
            case 6:
                sp.max_queue = (int)n;
                break;
            case 7:
                sp.max_connections = (int)n;
                break;
            case 8:
                sp.max_per_ip = (int)n;
                break;
            default:
                sp.read_timeout = (int)n;
                break;
            }
        }
    }
    if (!model_path) {
        fprintf(stderr, "tiermoe serve: missing -m FILE\n");
        serve_usage(stderr);
        return 2;
    }
    sp.seed_given = gen.seed_given;
    sp.trace_names = ct.names, sp.trace_per_layer = ct.per_layer, sp.trace_output = ct.output;
    if (sp.chat_template && tm_chat_format_check(sp.chat_template) != TM_OK) {
        fprintf(stderr, "tiermoe serve: --chat-template: %s\n", tm_error_message());
        return 2;
    }

    /* SIGINT and SIGTERM are taken by sigtimedwait below: blocked in every thread */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    tm_server *srv = NULL;
    if (server_create(&sp, &srv) != TM_OK) {
        fprintf(stderr, "tiermoe serve: %s\n", server_error_message());
        return 1;
    }
    fprintf(stderr, "tiermoe serve: listening on http://%s%s%s:%d\n",
            strchr(sp.host ? sp.host : "", ':') ? "[" : "", sp.host ? sp.host : "127.0.0.1",
            strchr(sp.host ? sp.host : "", ':') ? "]" : "", server_port(srv));
    int rc = 1;
    tm_model *m = NULL;
    tm_model_info info;
    cli_place_finish(place, "serve");
    if (tm_context_opts_check(place->o) != TM_OK || tm_model_load(model_path, &m) != TM_OK) {
        fprintf(stderr, "tiermoe serve: %s\n", tm_error_message());
        goto out;
    }
    if (tm_model_describe(m, &info) != TM_OK || !info.has_vocab) {
        fprintf(stderr, "tiermoe serve: %s: the model needs a vocabulary\n", model_path);
        goto out;
    }
    if (server_load(srv, m, place->o) != TM_OK) {
        fprintf(stderr, "tiermoe serve: %s\n", server_error_message());
        goto out;
    }
    fprintf(stderr, "tiermoe serve: ready (%s); stop with Ctrl-C or SIGTERM\n", model_path);
    const struct timespec tick = {0, 200 * 1000000L};
    int sig;
    while ((sig = sigtimedwait(&sigs, NULL, &tick)) < 0) {
    }
    fprintf(stderr, "tiermoe serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
out:
    if (server_stop(srv) != TM_OK) {
        fprintf(stderr, "tiermoe serve: %s\n", server_error_message());
        rc = 1;
    }
    server_free(srv);
    tm_model_free(m);
    return rc;
}

int cmd_serve(int argc, char **argv) {
    tm_context_opts co;
    tm_context_opts_init(&co);
    cli_place place = {.o = &co};
    char *aliases = NULL, *origins = NULL; /* the repeated flags' values, comma-joined */
    const int rc = serve_main(argc, argv, &place, &aliases, &origins);
    cli_place_free(&place);
    free(aliases), free(origins);
    return rc;
}
#endif              /* TM_HAVE_SERVER */
