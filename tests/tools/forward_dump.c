/* forward_dump: run tiermoe's forward pass over a token sequence and write every
 * named intermediate as a golden-format dump (docs/golden-format.md), so tests
 * can compare it layer by layer with the float64 reference or HF goldens.
 *
 *   forward_dump MODEL --tokens 1,2,3,... [--prompt N] [--precise] [--kv f16|f32]
 *                [--threads N] [--batch N] -o DUMP.gguf
 *
 * The first N tokens (default: all) go through one prompt call (expert-major
 * worklists); the rest are decoded one at a time through the KV cache
 * (token-major), teacher-forced, so the dump covers every position. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/model.h"

typedef struct dump_array {
    char name[64];
    bool is_int;
    int64_t n, rows, cap;
    void *data; /* [rows][n] */
} dump_array;

typedef struct dump {
    dump_array a[512];
    int count;
    int failed;
} dump;

static void dump_cb(void *ud, const char *stage, int layer, const void *data, int64_t n_tok,
                    int64_t n, bool is_int) {
    dump *d = ud;
    char name[64];
    if (layer >= 0)
        snprintf(name, sizeof(name), "blk.%d.%s", layer, stage);
    else
        snprintf(name, sizeof(name), "%s", stage);
    dump_array *a = NULL;
    for (int i = 0; i < d->count; i++)
        if (!strcmp(d->a[i].name, name)) a = &d->a[i];
    if (!a) {
        if (d->count == 512) {
            d->failed = 1;
            return;
        }
        a = &d->a[d->count++];
        snprintf(a->name, sizeof(a->name), "%s", name);
        a->is_int = is_int, a->n = n;
    }
    if (a->rows + n_tok > a->cap) {
        int64_t cap = (a->rows + n_tok) * 2;
        void *p = realloc(a->data, (size_t)(cap * n) * 4);
        if (!p) {
            d->failed = 1;
            return;
        }
        a->data = p, a->cap = cap;
    }
    memcpy((uint8_t *)a->data + (size_t)(a->rows * n) * 4, data, (size_t)(n_tok * n) * 4);
    a->rows += n_tok;
}

static int die(const char *what) {
    fprintf(stderr, "forward_dump: %s: %s\n", what, tm_error_message());
    return 1;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *out = NULL, *tok_arg = NULL;
    long n_prompt = -1;
    tm_context_params cp = {.kv_type = TM_TYPE_F16};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--precise"))
            cp.precise = true;
        else if (i + 1 < argc && !strcmp(argv[i], "--tokens"))
            tok_arg = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--prompt"))
            n_prompt = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--threads"))
            cp.n_threads = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--batch"))
            cp.n_batch = atol(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--kv"))
            cp.kv_type = !strcmp(argv[++i], "f32") ? TM_TYPE_F32 : TM_TYPE_F16;
        else if (i + 1 < argc && !strcmp(argv[i], "-o"))
            out = argv[++i];
        else if (!model_path && argv[i][0] != '-')
            model_path = argv[i];
        else {
            fprintf(stderr, "forward_dump: bad argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model_path || !out || !tok_arg) {
        fprintf(stderr, "usage: forward_dump MODEL --tokens 1,2,3 [--prompt N] [--precise] [--kv "
                        "f16|f32] -o DUMP\n");
        return 2;
    }
    int32_t tokens[4096];
    int64_t n_tok = 0;
    for (char *s = (char *)tok_arg; *s;) {
        if (n_tok == 4096) {
            fprintf(stderr, "forward_dump: more than 4096 tokens\n");
            return 2;
        }
        tokens[n_tok++] = (int32_t)strtol(s, &s, 10);
        if (*s == ',') s++;
    }
    if (n_prompt < 0 || n_prompt > n_tok) n_prompt = (long)n_tok;

    tm_model *m;
    if (model_load(model_path, &m) != TM_OK) return die(model_path);
    dump *d = calloc(1, sizeof(*d));
    cp.cb = dump_cb, cp.cb_ud = d;
    cp.n_ctx = n_tok + 1;
    if (cp.n_batch <= 0) cp.n_batch = n_prompt > 0 ? n_prompt : 1;
    tm_context *ctx;
    if (model_context_create(m, &cp, &ctx) != TM_OK) return die("context");
    if (n_prompt > 0 &&
        model_decode(ctx, tokens, n_prompt, TM_MOE_PHASE_PROMPT, n_prompt <= cp.n_batch) != TM_OK)
        return die("prompt");
    for (int64_t i = n_prompt; i < n_tok; i++)
        if (model_decode(ctx, &tokens[i], 1, TM_MOE_PHASE_DECODE, false) != TM_OK)
            return die("decode");
    if (d->failed) {
        fprintf(stderr, "forward_dump: out of memory collecting intermediates\n");
        return 1;
    }

    tm_gguf_writer *w;
    tm_status st = gguf_writer_init(&w, 3, TM_GGUF_DEFAULT_ALIGNMENT);
    if (st == TM_OK) st = gguf_writer_set_str(w, "general.architecture", "tiermoe.dump");
    if (st == TM_OK) st = gguf_writer_set_u32(w, "dump.version", 1);
    if (st == TM_OK) st = gguf_writer_set_str(w, "dump.model", model_path);
    if (st == TM_OK)
        st = gguf_writer_set_str(w, "dump.source", cp.precise ? "tiermoe precise" : "tiermoe");
    if (st == TM_OK)
        st = gguf_writer_set_array(w, "dump.tokens", TM_GGUF_TYPE_INT32, tokens, (uint64_t)n_tok);
    for (int i = 0; st == TM_OK && i < d->count; i++) {
        uint64_t idx;
        st = gguf_writer_add_tensor(w, d->a[i].name, d->a[i].is_int ? TM_TYPE_I32 : TM_TYPE_F32, 2,
                                    (int64_t[]){d->a[i].n, d->a[i].rows}, &idx);
    }
    if (st == TM_OK) st = gguf_writer_begin(w, out);
    for (int i = 0; st == TM_OK && i < d->count; i++)
        st = gguf_writer_write_data(w, d->a[i].data, (size_t)(d->a[i].n * d->a[i].rows) * 4);
    if (st == TM_OK) st = gguf_writer_finish(w);
    if (st != TM_OK) return die(out);
    gguf_writer_free(w);
    for (int i = 0; i < d->count; i++) free(d->a[i].data);
    free(d);
    model_context_free(ctx);
    model_free(m);
    return 0;
}
