/* tiermoe inspect FILE: what a GGUF holds and where its bytes are.
 *
 * Prints the architecture and its hyper-parameters (every "<arch>." key),
 * the tokenizer summary, other metadata, the tensor table and, for MoE
 * models, the expert bytes per layer and the expert / non-expert split. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli_internal.h"
#include "gguf/gguf.h"
#include "model/layout.h"
#include "quant/quant.h"

static void inspect_usage(FILE *out) {
    fprintf(out, "usage: tiermoe inspect [--no-tensors] [--all-kv] FILE.gguf\n"
                 "  --no-tensors  omit the tensor table\n"
                 "  --all-kv      print every metadata value in full (arrays too)\n");
}

static void print_bytes(uint64_t b) {
    if (b >= (1ull << 30))
        printf("%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20))
        printf("%.2f MiB", b / 1048576.0);
    else if (b >= 1024)
        printf("%.2f KiB", b / 1024.0);
    else
        printf("%" PRIu64 " B", b);
}

/* One scalar of an array, printed. */
static void print_array_item(const tm_gguf_array *a, uint64_t i) {
    const uint8_t *p = (const uint8_t *)a->data;
    switch (a->elem_type) {
    case TM_GGUF_TYPE_STRING: {
        tm_gguf_str s = gguf_array_get_str(a, i);
        printf("\"%.*s\"", (int)(s.len > 40 ? 40 : s.len), s.data);
        break;
    }
    case TM_GGUF_TYPE_ARRAY:
        printf("[…]");
        break;
    case TM_GGUF_TYPE_FLOAT32:
        printf("%g", gguf_array_get_f32(a, i));
        break;
    case TM_GGUF_TYPE_FLOAT64: {
        double d;
        memcpy(&d, p + 8 * i, 8);
        printf("%g", d);
        break;
    }
    case TM_GGUF_TYPE_UINT64: {
        uint64_t u;
        memcpy(&u, p + 8 * i, 8);
        printf("%" PRIu64, u);
        break;
    }
    case TM_GGUF_TYPE_INT64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        printf("%" PRId64, v);
        break;
    }
    case TM_GGUF_TYPE_BOOL:
        printf("%s", p[i] ? "true" : "false");
        break;
    case TM_GGUF_TYPE_INT8:
    case TM_GGUF_TYPE_INT16:
    case TM_GGUF_TYPE_INT32:
        printf("%" PRId32, gguf_array_get_i32(a, i));
        break;
    default:
        printf("%" PRIu32, gguf_array_get_u32(a, i));
        break;
    }
}

static void print_value(const tm_gguf_value *v, int full) {
    switch (v->type) {
    case TM_GGUF_TYPE_UINT8:
        printf("%u", v->v.u8);
        break;
    case TM_GGUF_TYPE_INT8:
        printf("%d", v->v.i8);
        break;
    case TM_GGUF_TYPE_UINT16:
        printf("%u", v->v.u16);
        break;
    case TM_GGUF_TYPE_INT16:
        printf("%d", v->v.i16);
        break;
    case TM_GGUF_TYPE_UINT32:
        printf("%" PRIu32, v->v.u32);
        break;
    case TM_GGUF_TYPE_INT32:
        printf("%" PRId32, v->v.i32);
        break;
    case TM_GGUF_TYPE_UINT64:
        printf("%" PRIu64, v->v.u64);
        break;
    case TM_GGUF_TYPE_INT64:
        printf("%" PRId64, v->v.i64);
        break;
    case TM_GGUF_TYPE_FLOAT32:
        printf("%g", v->v.f32);
        break;
    case TM_GGUF_TYPE_FLOAT64:
        printf("%g", v->v.f64);
        break;
    case TM_GGUF_TYPE_BOOL:
        printf("%s", v->v.b ? "true" : "false");
        break;
    case TM_GGUF_TYPE_STRING: {
        uint64_t n = v->v.str.len;
        const char *nl = memchr(v->v.str.data, '\n', n);
        if (!full && (nl || n > 60)) {
            uint64_t shown = nl ? (uint64_t)(nl - v->v.str.data) : 60;
            if (shown > 60) shown = 60;
            printf("\"%.*s…\" (%" PRIu64 " bytes)", (int)shown, v->v.str.data, n);
        } else {
            printf("\"%.*s\"", (int)n, v->v.str.data);
        }
        break;
    }
    case TM_GGUF_TYPE_ARRAY: {
        const tm_gguf_array *a = &v->v.arr;
        uint64_t shown = full ? a->n : (a->n < 6 ? a->n : 6);
        printf("%s[%" PRIu64 "] [", gguf_value_type_name(a->elem_type), a->n);
        for (uint64_t i = 0; i < shown; i++) {
            if (i) printf(", ");
            print_array_item(a, i);
        }
        printf("%s]", shown < a->n ? ", …" : "");
        break;
    }
    default:
        printf("?");
        break;
    }
}

static int has_prefix(tm_gguf_str s, const char *prefix) {
    size_t n = strlen(prefix);
    return s.len >= n && !memcmp(s.data, prefix, n);
}

static void inspect_tokenizer(const tm_gguf_file *f) {
    tm_gguf_str model, pre;
    if (gguf_file_get_str(f, "tokenizer.ggml.model", &model) != TM_OK) {
        printf("tokenizer:    none (no tokenizer.ggml.model key)\n");
        return;
    }
    printf("tokenizer:    %.*s", (int)model.len, model.data);
    if (gguf_file_get_str(f, "tokenizer.ggml.pre", &pre) == TM_OK)
        printf(", pre %.*s", (int)pre.len, pre.data);
    const tm_gguf_array *a;
    if (gguf_file_get_array(f, "tokenizer.ggml.tokens", &a) == TM_OK)
        printf(", %" PRIu64 " tokens", a->n);
    if (gguf_file_get_array(f, "tokenizer.ggml.merges", &a) == TM_OK)
        printf(", %" PRIu64 " merges", a->n);
    static const char *ids[] = {"bos", "eos", "eot", "unknown", "padding"};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        char key[64];
        uint32_t id;
        snprintf(key, sizeof(key), "tokenizer.ggml.%s_token_id", ids[i]);
        if (gguf_file_get_u32(f, key, &id) == TM_OK) printf(", %s %" PRIu32, ids[i], id);
    }
    tm_gguf_str tmpl;
    if (gguf_file_get_str(f, "tokenizer.chat_template", &tmpl) == TM_OK)
        printf(", chat template (%" PRIu64 " bytes)", tmpl.len);
    printf("\n");
}

static void inspect_tensors(const tm_gguf_file *f) {
    printf("\ntensors (%" PRIu64 "):\n  %-34s %-7s %-22s %12s %14s\n", f->n_tensors, "name", "type",
           "shape", "bytes", "offset");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        char shape[64];
        int n = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n += snprintf(shape + n, sizeof(shape) - (size_t)n, "%s%" PRId64, d ? " x " : "",
                          t->ne[d]);
        printf("  %-34.*s %-7s %-22s %12" PRIu64 " %14" PRIu64 "\n", (int)t->name.len, t->name.data,
               quant_type_name(t->type), shape, t->n_bytes, t->file_offset);
    }
}

static int inspect_experts(const tm_gguf_file *f) {
    tm_model_layout lay;
    if (model_layout_scan(f, &lay) != TM_OK) {
        fprintf(stderr, "tiermoe inspect: %s\n", tm_error_message());
        return 1;
    }
    uint64_t total = lay.expert_bytes + lay.other_bytes;
    printf("\nbytes:        ");
    print_bytes(total);
    printf(" of tensors in %" PRIu64 " tensors\n", f->n_tensors);
    if (!lay.n_expert) {
        printf("experts:      none (not a MoE model)\n");
        model_layout_free(&lay);
        return 0;
    }
    printf("experts:      %u per layer in %u of %u layers, one expert (gate+up+down) ",
           lay.n_expert, lay.n_moe_layers, lay.n_layer);
    print_bytes(lay.max_expert_slice);
    printf("\n  expert bytes     ");
    print_bytes(lay.expert_bytes);
    printf(" (%.1f%%)\n  non-expert bytes ", 100.0 * lay.expert_bytes / (total ? total : 1));
    print_bytes(lay.other_bytes);
    printf(" (%.1f%%)\n  per layer:", 100.0 * lay.other_bytes / (total ? total : 1));
    for (uint32_t l = 0; l < lay.n_layer; l++) {
        if (l % 6 == 0) printf("\n   ");
        printf(" %3u: ", l);
        print_bytes(lay.layer_expert_bytes[l]);
        printf(" ");
    }
    printf("\n");
    model_layout_free(&lay);
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    int tensors = 1, all_kv = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-tensors"))
            tensors = 0;
        else if (!strcmp(argv[i], "--all-kv"))
            all_kv = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            inspect_usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "tiermoe inspect: unknown flag '%s'\n", argv[i]);
            inspect_usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "tiermoe inspect: one file at a time ('%s' and '%s')\n", path, argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        inspect_usage(stderr);
        return 2;
    }
    tm_gguf_file *f;
    if (gguf_file_open(path, &f) != TM_OK) {
        fprintf(stderr, "tiermoe inspect: %s\n", tm_error_message());
        return 1;
    }
    tm_gguf_str arch = {"?", 1};
    gguf_file_get_str(f, "general.architecture", &arch);
    printf("file:         %s (", path);
    print_bytes(f->file_size);
    printf(", GGUF v%u, alignment %" PRIu64 ", %" PRIu64 " keys)\n", f->version, f->alignment,
           f->n_kv);
    printf("architecture: %.*s\n", (int)arch.len, arch.data);

    char prefix[80];
    snprintf(prefix, sizeof(prefix), "%.*s.", (int)(arch.len < 64 ? arch.len : 64), arch.data);
    printf("hyper-parameters:\n");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        if (!has_prefix(f->kv[i].key, prefix)) continue;
        printf("  %-44.*s ", (int)(f->kv[i].key.len - strlen(prefix)),
               f->kv[i].key.data + strlen(prefix));
        print_value(&f->kv[i].value, all_kv);
        printf("\n");
    }
    inspect_tokenizer(f);
    printf("metadata:\n");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        tm_gguf_str k = f->kv[i].key;
        if (has_prefix(k, prefix) || (!all_kv && has_prefix(k, "tokenizer."))) continue;
        printf("  %-44.*s ", (int)k.len, k.data);
        print_value(&f->kv[i].value, all_kv);
        printf("\n");
    }
    if (tensors) inspect_tensors(f);
    int rc = inspect_experts(f);
    gguf_file_close(f);
    return rc;
}
