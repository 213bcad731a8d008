/* gguf_dump: print what our GGUF reader read, as JSON, for the oracle tests.
 *
 * usage: gguf_dump [--no-hash] FILE
 * {"version", "alignment", "data_offset", "file_size",
 *  "kv": [{"key", "offset", "type", "value"}],   arrays: "value": {"elem_type", "items": [...]}
 *  "tensors": [{"name", "type", "type_name", "n_dims", "ne", "n_elements", "offset",
 *               "file_offset", "n_bytes", "fnv1a64"}]}
 * Strings are written byte for byte (JSON-escaped where needed); floats with
 * %.17g of their exact double value (so float32 round-trips); NaN and
 * infinities as Python's json module writes them. fnv1a64 is a hex FNV-1a 64
 * hash of the tensor's bytes. On a reader error: message on stderr, exit 1. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

static void put_str(const char *s, uint64_t n) {
    putchar('"');
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void put_double(double d) {
    if (isnan(d))
        fputs("NaN", stdout);
    else if (isinf(d))
        fputs(d > 0 ? "Infinity" : "-Infinity", stdout);
    else {
        char b[40];
        snprintf(b, sizeof(b), "%.17g", d);
        /* keep it a float token in JSON ("-0" would read back as the integer 0) */
        printf("%s%s", b, strpbrk(b, ".e") ? "" : ".0");
    }
}

static void put_scalar(tm_gguf_value_type t, const void *p) {
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        uint64_t u64;
        int64_t i64;
        double f64;
    } v;
    memcpy(&v, p, gguf_value_type_size(t));
    switch (t) {
    case TM_GGUF_TYPE_UINT8:
        printf("%u", v.u8);
        break;
    case TM_GGUF_TYPE_INT8:
        printf("%d", v.i8);
        break;
    case TM_GGUF_TYPE_UINT16:
        printf("%u", v.u16);
        break;
    case TM_GGUF_TYPE_INT16:
        printf("%d", v.i16);
        break;
    case TM_GGUF_TYPE_UINT32:
        printf("%" PRIu32, v.u32);
        break;
    case TM_GGUF_TYPE_INT32:
        printf("%" PRId32, v.i32);
        break;
    case TM_GGUF_TYPE_FLOAT32:
        put_double((double)v.f32);
        break;
    case TM_GGUF_TYPE_BOOL:
        fputs(v.u8 ? "true" : "false", stdout);
        break;
    case TM_GGUF_TYPE_UINT64:
        printf("%" PRIu64, v.u64);
        break;
    case TM_GGUF_TYPE_INT64:
        printf("%" PRId64, v.i64);
        break;
    case TM_GGUF_TYPE_FLOAT64:
        put_double(v.f64);
        break;
    default:
        fputs("null", stdout);
        break;
    }
}

static void put_array(const tm_gguf_array *a) {
    printf("{\"elem_type\": \"%s\", \"items\": [", gguf_value_type_name(a->elem_type));
    size_t es = gguf_value_type_size(a->elem_type);
    for (uint64_t i = 0; i < a->n; i++) {
        if (i) fputs(", ", stdout);
        if (es) {
            put_scalar(a->elem_type, (const uint8_t *)a->data + i * es);
        } else if (a->elem_type == TM_GGUF_TYPE_STRING) {
            tm_gguf_str s = gguf_array_get_str(a, i);
            put_str(s.data, s.len);
        } else {
            put_array(&((const tm_gguf_value *)a->data)[i].v.arr);
        }
    }
    fputs("]}", stdout);
}

static void put_value(const tm_gguf_value *v) {
    if (v->type == TM_GGUF_TYPE_STRING)
        put_str(v->v.str.data, v->v.str.len);
    else if (v->type == TM_GGUF_TYPE_ARRAY)
        put_array(&v->v.arr);
    else if (v->type == TM_GGUF_TYPE_BOOL)
        fputs(v->v.b ? "true" : "false", stdout);
    else
        put_scalar(v->type, &v->v);
}

static uint64_t fnv1a64(const uint8_t *p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int main(int argc, char **argv) {
    int hash = 1;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-hash"))
            hash = 0;
        else if (!path)
            path = argv[i];
        else
            path = NULL, i = argc;
    }
    if (!path) {
        fprintf(stderr, "usage: gguf_dump [--no-hash] FILE\n");
        return 2;
    }
    tm_gguf_file *f;
    tm_status st = gguf_file_open(path, &f);
    if (st) {
        fprintf(stderr, "gguf_dump: %s (%s)\n", tm_error_message(), tm_status_name(st));
        return 1;
    }
    printf("{\"version\": %" PRIu32 ", \"alignment\": %" PRIu64 ", \"data_offset\": %" PRIu64
           ", \"file_size\": %" PRIu64 ",\n \"kv\": [",
           f->version, f->alignment, f->data_offset, f->file_size);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const tm_gguf_kv *kv = &f->kv[i];
        fputs(i ? ",\n  {\"key\": " : "\n  {\"key\": ", stdout);
        put_str(kv->key.data, kv->key.len);
        printf(", \"offset\": %" PRIu64 ", \"type\": \"%s\", \"value\": ", kv->file_offset,
               gguf_value_type_name(kv->value.type));
        put_value(&kv->value);
        putchar('}');
    }
    fputs("],\n \"tensors\": [", stdout);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", stdout);
        put_str(t->name.data, t->name.len);
        printf(", \"type\": %" PRIu32 ", \"type_name\": \"%s\", \"n_dims\": %" PRIu32 ", \"ne\": [",
               t->type, quant_type_name(t->type), t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        printf("], \"n_elements\": %" PRId64 ", \"offset\": %" PRIu64 ", \"file_offset\": %" PRIu64
               ", \"n_bytes\": %" PRIu64,
               t->n_elements, t->offset, t->file_offset, t->n_bytes);
        if (hash) printf(", \"fnv1a64\": \"%016" PRIx64 "\"", fnv1a64(t->data, t->n_bytes));
        putchar('}');
    }
    fputs("]}\n", stdout);
    gguf_file_close(f);
    return ferror(stdout) ? 1 : 0;
}
