/* tiermoe trace: a learn pass. Runs every prompt of a file (one a line) as its
 * own sequence, prompt batch then -n greedy decode steps, with the expert
 * tracer attached, and writes the learn/perf JSON (docs/trace-format.md).
 * tiermoe trace --merge a.json b.json ... -o out.json sums learn files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_internal.h"
#include "core/timing.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "trace/trace.h"

static void trace_usage(FILE *out) {
    fprintf(out,
            "usage: tiermoe trace -m FILE --prompts FILE.txt -o learn.json [options]\n"
            "       tiermoe trace --merge a.json b.json ... -o out.json\n"
            "  -m, --model FILE       GGUF model\n"
            "  --prompts FILE         one prompt a line: text, or token ids \"1,2,3\" for a model\n"
            "                         without a vocabulary; empty lines are skipped\n"
            "  -o, --output FILE      learn file to write (JSON; FILE.csv: CSV)\n"
            "  -n, --n-predict N      greedy tokens generated (and traced) after each prompt "
            "(default 16)\n"
            "  -c, --ctx-size N       context size (default: longest prompt + N)\n"
            "  -b, --batch-size N     prompt tokens per forward chunk (default 512; with experts\n"
            "                         in RAM behind a GPU up to 4096, as VRAM allows)\n"
            "  -t, --threads N        CPU threads (default: physical cores)\n"
            "  --window W             working-set window in tokens (default %d)\n"
            "  --per-layer            print the per-layer table\n"
            "  --routing-log FILE     also write every call's top-k ids per layer, with sequence\n"
            "                         boundaries (binary; tiermoe report --replay FILE)\n"
            "  --expert-trace-names   log every routed slot\n"
            "  --merge FILES...       sum learn files of the same model shape instead\n"
            "placement (the routing traced is the same under any):\n",
            TM_TRACE_WINDOW_DEFAULT);
    fputs(cli_place_help, out);
}

typedef struct trace_prompt {
    int32_t *ids;
    int64_t n;
    int line;
} trace_prompt;

static void prompts_free(trace_prompt *p, int n) {
    for (int i = 0; i < n; i++) free(p[i].ids);
    free(p);
}

/* "1,2,3" (spaces allowed) into ids; 0 or an error naming file:line. */
static tm_status parse_ids(const char *path, int line, const char *s, trace_prompt *out) {
    tm_tokens v = {0};
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\t') p++;
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p || x < 0 || x > 0x7fffffff) {
            tokenizer_tokens_free(&v);
            return tm_error_set(
                TM_ERR_ARG,
                "%s:%d: expected comma-separated token ids (the model has no vocabulary)", path,
                line);
        }
        if (tokenizer_tokens_push(&v, (int32_t)x) != TM_OK) {
            tokenizer_tokens_free(&v);
            return TM_ERR_NOMEM;
        }
        p = end;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == ',')
            p++;
        else if (*p) {
            tokenizer_tokens_free(&v);
            return tm_error_set(TM_ERR_ARG, "%s:%d: unexpected '%c' in a token-id list", path, line,
                                *p);
        }
    }
    out->ids = v.ids, out->n = (int64_t)v.n;
    return TM_OK;
}

static tm_status prompts_read(const char *path, const tm_tokenizer *tok, trace_prompt **out,
                              int *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return tm_error_set(TM_ERR_IO, "%s: cannot open the prompts file", path);
    trace_prompt *ps = NULL;
    int n = 0, cap = 0, line = 0;
    char *buf = NULL;
    size_t bcap = 0;
    ssize_t len;
    tm_status st = TM_OK;
    while ((len = getline(&buf, &bcap, f)) >= 0) {
        line++;
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = '\0';
        if (!len) continue;
        if (n == cap) {
            trace_prompt *t = realloc(ps, (size_t)(cap = cap ? 2 * cap : 64) * sizeof(*ps));
            if (!t) {
                st = tm_error_set(TM_ERR_NOMEM, "out of memory reading %s", path);
                break;
            }
            ps = t;
        }
        trace_prompt *p = &ps[n];
        p->line = line;
        if (!tok) {
            if ((st = parse_ids(path, line, buf, p))) break;
        } else {
            tm_tokens ids = {0};
            tm_tokenize_opts o = {.add_special = true, .parse_special = false};
            if ((st = tokenizer_encode(tok, buf, (size_t)len, &o, &ids))) {
                tm_error_wrap(st, "%s:%d: ", path, line);
                break;
            }
            p->ids = ids.ids, p->n = (int64_t)ids.n;
        }
        n++;
        if (!p->n) {
            st = tm_error_set(TM_ERR_ARG, "%s:%d: the prompt has no tokens", path, line);
            break;
        }
    }
    free(buf);
    fclose(f);
    if (st == TM_OK && !n) st = tm_error_set(TM_ERR_ARG, "%s: no prompts (one a line)", path);
    if (st != TM_OK) {
        prompts_free(ps, n);
        return st;
    }
    *out = ps, *n_out = n;
    return TM_OK;
}

static void progress(int done, int total, uint64_t tokens, double secs) {
    char bar[31];
    const int w = 30, fill = total ? done * w / total : w;
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = '\0';
    fprintf(stderr, "\rtrace: [%s] %d/%d prompts, %llu tokens, %.1f tok/s", bar, done, total,
            (unsigned long long)tokens, secs > 0 ? tokens / secs : 0.0);
    if (done == total) fprintf(stderr, "\n");
    fflush(stderr);
}

static int trace_merge(char **files, int n_files, const char *out) {
    tm_trace_stats acc, s;
    if (trace_stats_read_json(files[0], NULL, &acc) != TM_OK) {
        fprintf(stderr, "tiermoe trace: %s\n", tm_error_message());
        return 1;
    }
    for (int i = 1; i < n_files; i++) {
        if (trace_stats_read_json(files[i], NULL, &s) != TM_OK ||
            trace_stats_merge(&acc, &s, files[i]) != TM_OK) {
            fprintf(stderr, "tiermoe trace: --merge: %s\n", tm_error_message());
            trace_stats_free(&s);
            trace_stats_free(&acc);
            return 1;
        }
        trace_stats_free(&s);
    }
    const size_t n = strlen(out);
    tm_status st = n > 4 && !strcmp(out + n - 4, ".csv") ? trace_stats_write_csv(&acc, out)
                                                         : trace_stats_write_json(&acc, out);
    if (st == TM_OK)
        fprintf(stderr, "tiermoe trace: merged %d files (%llu tokens) into %s\n", n_files,
                (unsigned long long)acc.tokens, out);
    else
        fprintf(stderr, "tiermoe trace: %s\n", tm_error_message());
    trace_stats_free(&acc);
    return st == TM_OK ? 0 : 1;
}

static int trace_main(int argc, char **argv, cli_place *place) {
    const char *model_path = NULL, *prompts_path = NULL, *out_path = NULL;
    long long n_predict = 16, v;
    tm_context_opts *co = place->o;
    tm_context_params cp;
    cli_files files = {0};
    tm_trace_config tc = {.stats = true};
    char **merge = NULL;
    int n_merge = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            trace_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--per-layer")) {
            tc.per_layer = true;
            continue;
        }
        if (!strcmp(a, "--expert-trace-names")) {
            tc.names = true;
            continue;
        }
        if (!strcmp(a, "--merge")) {
            merge = argv + i + 1;
            while (i + 1 < argc && argv[i + 1][0] != '-') i++, n_merge++;
            if (!n_merge) {
                fprintf(stderr, "tiermoe trace: --merge needs learn files\n");
                return 2;
            }
            continue;
        }
        const int np = cli_place_parse(place, "trace", argc, argv, i);
        if (np < 0) return 2;
        if (np > 0) {
            i += np - 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe trace: %s needs a value (or is unknown)\n", a);
            trace_usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model_path = val;
        else if (!strcmp(a, "--prompts"))
            prompts_path = val;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output"))
            out_path = val;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (cli_parse_i64(a, val, 0, 1 << 24, &n_predict)) return 2;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (cli_parse_i64(a, val, 1, 1 << 24, &v)) return 2;
            co->n_ctx = v;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (cli_parse_i64(a, val, 1, 1 << 16, &v)) return 2;
            co->n_batch = v;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (cli_parse_i64(a, val, 1, 1024, &v)) return 2;
            co->n_threads = (int32_t)v;
        } else if (!strcmp(a, "--routing-log")) {
            tc.routing_log = val;
        } else if (!strcmp(a, "--window")) {
            if (cli_parse_i64(a, val, 1, 1 << 20, &v)) return 2;
            tc.window = (uint32_t)v;
        } else {
            fprintf(stderr, "tiermoe trace: unknown flag '%s'\n", a);
            trace_usage(stderr);
            return 2;
        }
    }
    if (!out_path) {
        fprintf(stderr, "tiermoe trace: missing -o FILE\n");
        trace_usage(stderr);
        return 2;
    }
    if (merge) {
        if (model_path || prompts_path || tc.routing_log) {
            fprintf(stderr, "tiermoe trace: --merge takes learn files only (no -m, --prompts or "
                            "--routing-log)\n");
            return 2;
        }
        return trace_merge(merge, n_merge, out_path);
    }
    if (!model_path || !prompts_path) {
        fprintf(stderr, "tiermoe trace: missing %s\n", model_path ? "--prompts FILE" : "-m FILE");
        trace_usage(stderr);
        return 2;
    }

    tm_model *m;
    if (model_load(model_path, &m) != TM_OK) {
        fprintf(stderr, "tiermoe trace: %s\n", tm_error_message());
        return 1;
    }
    cli_place_finish(place, "trace");
    if (cli_place_apply(place, "trace", m, &files, &cp)) {
        cli_files_free(&files);
        model_free(m);
        return 1;
    }
    int rc = 1, n_prompts = 0;
    tm_tokenizer *tok = NULL;
    trace_prompt *ps = NULL;
    tm_context *ctx = NULL;
    tm_trace *tr = NULL;
    if (tokenizer_load_gguf(m->file, &tok) != TM_OK)
        tok = NULL; /* no vocabulary: prompts are ids */
    if (prompts_read(prompts_path, tok, &ps, &n_prompts) != TM_OK) {
        fprintf(stderr, "tiermoe trace: %s\n", tm_error_message());
        rc = 2;
        goto out;
    }
    int64_t longest = 0;
    for (int i = 0; i < n_prompts; i++) longest = ps[i].n > longest ? ps[i].n : longest;
    if (!cp.n_ctx) cp.n_ctx = longest + n_predict;
    for (int i = 0; i < n_prompts; i++)
        if (ps[i].n + n_predict > cp.n_ctx) {
            fprintf(stderr,
                    "tiermoe trace: %s:%d: %lld prompt tokens + -n %lld exceed the context of %lld "
                    "(-c)\n",
                    prompts_path, ps[i].line, (long long)ps[i].n, n_predict, (long long)cp.n_ctx);
            rc = 2;
            goto out;
        }
    tc.output = out_path;
    if (model_trace_create(&tc, m, &tr) != TM_OK) {
        fprintf(stderr, "tiermoe trace: %s\n", tm_error_message());
        goto out;
    }
    trace_attach(tr, &cp.cb, &cp.cb_ud);
    if (model_context_create(m, &cp, &ctx) != TM_OK) {
        fprintf(stderr, "tiermoe trace: %s\n", tm_error_message());
        goto out;
    }
    trace_set_resident(tr, tier_expert_resident, ctx->tier);
    const uint64_t t0 = tm_time_ns();
    uint64_t t_shown = 0;
    const int64_t n_vocab = m->cfg.n_vocab;
    for (int i = 0; i < n_prompts; i++) {
        model_context_reset(ctx);
        trace_sequence_begin(tr);
        if (model_decode(ctx, ps[i].ids, ps[i].n, TM_MOE_PHASE_PROMPT, false) != TM_OK) {
            fprintf(stderr, "\ntiermoe trace: %s:%d: %s\n", prompts_path, ps[i].line,
                    tm_error_message());
            goto out;
        }
        for (long long g = 0; g < n_predict; g++) {
            int32_t id = 0; /* greedy */
            for (int64_t j = 1; j < n_vocab; j++)
                if (ctx->logits[j] > ctx->logits[id]) id = (int32_t)j;
            if (model_decode(ctx, &id, 1, TM_MOE_PHASE_DECODE, false) != TM_OK) {
                fprintf(stderr, "\ntiermoe trace: %s:%d: %s\n", prompts_path, ps[i].line,
                        tm_error_message());
                goto out;
            }
        }
        const uint64_t now = tm_time_ns();
        if (now - t_shown > 200000000ull || i + 1 == n_prompts) { /* at most 5 updates a second */
            progress(i + 1, n_prompts, trace_get_stats(tr)->tokens, (now - t0) * 1e-9);
            t_shown = now;
        }
    }
    if (trace_finish(tr) != TM_OK) {
        fprintf(stderr, "tiermoe trace: %s\n", tm_error_message());
        goto out;
    }
    rc = 0;
out:
    model_context_free(ctx);
    trace_free(tr);
    prompts_free(ps, n_prompts);
    if (tok) tokenizer_free(tok);
    cli_files_free(&files);
    model_free(m);
    return rc;
}

int cmd_trace(int argc, char **argv) {
    tm_context_opts co;
    tm_context_opts_init(&co);
    cli_place place = {.o = &co};
    const int rc = trace_main(argc, argv, &place);
    cli_place_free(&place);
    return rc;
}
