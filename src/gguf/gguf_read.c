/* GGUF reader: maps a file (or takes a buffer) and validates all of it.
 *
 * Every read goes through a cursor that checks the bytes left first, every
 * count is checked against the bytes left before anything is allocated for
 * it (an element needs at least its minimum encoded size), and all offset
 * and size arithmetic is overflow-checked. Scalars and strings point into
 * the image; string arrays and nested arrays get small side tables that the
 * file owns. Name lookups use open-addressing hash tables built while
 * parsing, which also find duplicate keys and tensor names.
 *
 * Error messages read "<file>: byte offset <n>: <what>: <field>: expected ...". */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "gguf/gguf.h"
#include "gguf/gguf_internal.h"
#include "quant/quant.h"

/* Smallest encodings, used to bound counts before allocating:
 * kv = key length u64 + ≥1 key byte + type u32 + ≥1 value byte;
 * tensor info = name length u64 + ≥1 byte + n_dims u32 + ≥1 dim u64 + type u32 + offset u64. */
#define KV_MIN_BYTES     (8 + 1 + 4 + 1)
#define TENSOR_MIN_BYTES (8 + 1 + 4 + 8 + 4 + 8)
#define STR_MIN_BYTES    8
#define ARRAY_MIN_BYTES  (4 + 8)

typedef struct name_table {
    uint64_t *slots; /* index + 1; 0 = empty */
    uint64_t mask;
} name_table;

typedef struct gguf_priv {
    void **allocs; /* side tables of string and nested arrays */
    size_t n_allocs, cap_allocs;
    name_table kv_index, tensor_index;
    int owns_map;
} gguf_priv;

typedef struct parser {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
    const char *name; /* file name for messages */
    char what[160];   /* the record being read, e.g. "kv 3 'general.name'" */
    tm_gguf_file *f;
    gguf_priv *priv;
} parser;

/* ---- errors ---- */

static tm_status perr(parser *ps, tm_status st, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static tm_status perr(parser *ps, tm_status st, uint64_t off, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return tm_error_set(st, "%s: byte offset %" PRIu64 ": %s%s%s", ps->name, off, ps->what,
                        ps->what[0] ? ": " : "", msg);
}

/* Quote up to 64 bytes of a name for messages, escaping non-printables. */
static void quote_name(char *dst, size_t cap, const char *s, uint64_t len) {
    size_t o = 0;
    uint64_t n = len > 64 ? 64 : len;
    for (uint64_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')
            dst[o++] = (char)c;
        else
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
    }
    if (len > n && o + 4 < cap) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o < cap ? o : cap - 1] = '\0';
}

/* ---- allocation owned by the file ---- */

static void *priv_alloc(parser *ps, size_t n, size_t elem) {
    gguf_priv *pv = ps->priv;
    if (pv->n_allocs == pv->cap_allocs) {
        size_t cap = pv->cap_allocs ? pv->cap_allocs * 2 : 16;
        void **a = realloc(pv->allocs, cap * sizeof(*a));
        if (!a) return NULL;
        pv->allocs = a;
        pv->cap_allocs = cap;
    }
    void *m = calloc(n ? n : 1, elem);
    if (m) pv->allocs[pv->n_allocs++] = m;
    return m;
}

/* ---- name tables ---- */

static int table_init(name_table *t, uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2; /* n is bounded by the file size, so this cannot overflow */
    t->slots = calloc(cap, sizeof(uint64_t));
    t->mask = cap - 1;
    return t->slots != NULL;
}

/* Find `name` among entries named by `names(i)`; returns the slot. */
static uint64_t table_slot(const name_table *t, const char *s, uint64_t len,
                           const tm_gguf_str *(*name_of)(const tm_gguf_file *, uint64_t),
                           const tm_gguf_file *f, int *found) {
    uint64_t h = gguf_hash_bytes(s, (size_t)len) & t->mask;
    for (;;) {
        uint64_t v = t->slots[h];
        if (!v) {
            *found = 0;
            return h;
        }
        const tm_gguf_str *n = name_of(f, v - 1);
        if (n->len == len && memcmp(n->data, s, (size_t)len) == 0) {
            *found = 1;
            return h;
        }
        h = (h + 1) & t->mask;
    }
}

static const tm_gguf_str *kv_name(const tm_gguf_file *f, uint64_t i) {
    return &f->kv[i].key;
}
static const tm_gguf_str *tensor_name(const tm_gguf_file *f, uint64_t i) {
    return &f->tensors[i].name;
}

/* ---- the cursor ---- */

static tm_status need(parser *ps, uint64_t n, const char *field) {
    if (n > ps->size - ps->pos)
        return perr(ps, TM_ERR_FORMAT, ps->pos,
                    "%s: expected %" PRIu64 " bytes, only %" PRIu64 " left (file truncated?)",
                    field, n, ps->size - ps->pos);
    return TM_OK;
}

static tm_status read_u32(parser *ps, const char *field, uint32_t *out) {
    tm_status st = need(ps, 4, field);
    if (st) return st;
    memcpy(out, ps->p + ps->pos, 4);
    ps->pos += 4;
    return TM_OK;
}

static tm_status read_u64(parser *ps, const char *field, uint64_t *out) {
    tm_status st = need(ps, 8, field);
    if (st) return st;
    memcpy(out, ps->p + ps->pos, 8);
    ps->pos += 8;
    return TM_OK;
}

static tm_status read_str(parser *ps, const char *field, tm_gguf_str *out) {
    uint64_t at = ps->pos, len;
    tm_status st = read_u64(ps, field, &len);
    if (st) return st;
    if (len > ps->size - ps->pos)
        return perr(ps, TM_ERR_FORMAT, at,
                    "%s: string length %" PRIu64 " runs past the end of the file (%" PRIu64
                    " bytes left)",
                    field, len, ps->size - ps->pos);
    out->data = (const char *)(ps->p + ps->pos);
    out->len = len;
    ps->pos += len;
    return TM_OK;
}

/* A key or tensor name: non-empty, no NUL bytes (lookups take C strings). */
static tm_status read_name(parser *ps, const char *field, tm_gguf_str *out) {
    uint64_t at = ps->pos;
    tm_status st = read_str(ps, field, out);
    if (st) return st;
    if (out->len == 0) return perr(ps, TM_ERR_FORMAT, at, "%s: expected a non-empty string", field);
    if (memchr(out->data, 0, (size_t)out->len))
        return perr(ps, TM_ERR_FORMAT, at, "%s: expected no NUL bytes inside the name", field);
    return TM_OK;
}

/* ---- values ---- */

static tm_status check_bools(parser *ps, const uint8_t *p, uint64_t n, uint64_t at) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return perr(ps, TM_ERR_FORMAT, at + i, "bool value: expected 0 or 1, got %u", p[i]);
    return TM_OK;
}

static tm_status parse_value(parser *ps, tm_gguf_value_type type, int depth, tm_gguf_value *out);

/* The body of an array value: u32 elem_type | u64 n | n values. `depth` is
 * this array's nesting level (1 for a key's array). */
static tm_status parse_array(parser *ps, int depth, tm_gguf_array *arr) {
    uint64_t at = ps->pos;
    if (depth > TM_GGUF_MAX_ARRAY_DEPTH)
        return perr(ps, TM_ERR_FORMAT, at, "array nesting: expected at most %d levels",
                    TM_GGUF_MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t n;
    tm_status st = read_u32(ps, "array element type", &et);
    if (st) return st;
    if (et >= TM_GGUF_TYPE_COUNT)
        return perr(ps, TM_ERR_FORMAT, at,
                    "array element type: expected a GGUF value type 0..12, got %" PRIu32, et);
    uint64_t n_at = ps->pos;
    if ((st = read_u64(ps, "array length", &n))) return st;
    arr->elem_type = (tm_gguf_value_type)et;
    arr->n = n;
    uint64_t left = ps->size - ps->pos;
    size_t esize = gguf_value_type_size(arr->elem_type);
    uint64_t min_size = esize ? esize : et == TM_GGUF_TYPE_STRING ? STR_MIN_BYTES : ARRAY_MIN_BYTES;
    if (n > left / min_size)
        return perr(ps, TM_ERR_FORMAT, n_at,
                    "array length: %" PRIu64 " elements of %s need at least %" PRIu64
                    " bytes each, only %" PRIu64 " bytes left",
                    n, gguf_value_type_name(arr->elem_type), min_size, left);
    if (esize) { /* scalars stay in the image */
        arr->data = ps->p + ps->pos;
        if (et == TM_GGUF_TYPE_BOOL && (st = check_bools(ps, ps->p + ps->pos, n, ps->pos)))
            return st;
        ps->pos += n * esize;
        return TM_OK;
    }
    if (et == TM_GGUF_TYPE_STRING) {
        tm_gguf_str *s = priv_alloc(ps, (size_t)n, sizeof(*s));
        if (!s)
            return tm_error_set(TM_ERR_NOMEM, "%s: out of memory for %" PRIu64 " strings", ps->name,
                                n);
        for (uint64_t i = 0; i < n; i++)
            if ((st = read_str(ps, "array string", &s[i]))) return st;
        arr->data = s;
        return TM_OK;
    }
    tm_gguf_value *v = priv_alloc(ps, (size_t)n, sizeof(*v));
    if (!v)
        return tm_error_set(TM_ERR_NOMEM, "%s: out of memory for %" PRIu64 " arrays", ps->name, n);
    for (uint64_t i = 0; i < n; i++)
        if ((st = parse_value(ps, TM_GGUF_TYPE_ARRAY, depth + 1, &v[i]))) return st;
    arr->data = v;
    return TM_OK;
}

static tm_status parse_value(parser *ps, tm_gguf_value_type type, int depth, tm_gguf_value *out) {
    out->type = type;
    if (type == TM_GGUF_TYPE_STRING) return read_str(ps, "string value", &out->v.str);
    if (type == TM_GGUF_TYPE_ARRAY) return parse_array(ps, depth, &out->v.arr);
    size_t size = gguf_value_type_size(type);
    tm_status st = need(ps, size, gguf_value_type_name(type));
    if (st) return st;
    memcpy(&out->v, ps->p + ps->pos, size); /* every scalar member starts the union */
    if (type == TM_GGUF_TYPE_BOOL) {
        if ((st = check_bools(ps, ps->p + ps->pos, 1, ps->pos))) return st;
        out->v.b = ps->p[ps->pos] != 0;
    }
    ps->pos += size;
    return TM_OK;
}

/* ---- header, kv, tensor infos ---- */

static tm_status parse_header(parser *ps) {
    tm_gguf_file *f = ps->f;
    uint32_t magic, version;
    snprintf(ps->what, sizeof(ps->what), "header");
    tm_status st = read_u32(ps, "magic", &magic);
    if (st) return st;
    if (magic != TM_GGUF_MAGIC)
        return perr(
            ps, TM_ERR_FORMAT, 0,
            "magic: expected \"GGUF\" (47 47 55 46), got %02x %02x %02x %02x: not a GGUF file",
            ps->p[0], ps->p[1], ps->p[2], ps->p[3]);
    if ((st = read_u32(ps, "version", &version))) return st;
    if (version == 1)
        return perr(ps, TM_ERR_UNSUPPORTED, 4,
                    "version: GGUF version 1 (32-bit counts, 2023) is not supported; expected 2 or "
                    "3 (re-convert the model with a current llama.cpp)");
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && (version == 0x02000000u || version == 0x03000000u))
            return perr(ps, TM_ERR_UNSUPPORTED, 4,
                        "version: this is a big-endian GGUF file; expected a little-endian one");
        return perr(ps, TM_ERR_UNSUPPORTED, 4, "version: expected 2 or 3, got %" PRIu32, version);
    }
    f->version = version;
    if ((st = read_u64(ps, "tensor count", &f->n_tensors))) return st;
    if ((st = read_u64(ps, "kv count", &f->n_kv))) return st;
    uint64_t left = ps->size - ps->pos;
    if (f->n_kv > left / KV_MIN_BYTES)
        return perr(ps, TM_ERR_FORMAT, 16,
                    "kv count: %" PRIu64
                    " key/value pairs need at least %d bytes each, only %" PRIu64 " bytes left",
                    f->n_kv, KV_MIN_BYTES, left);
    left -= f->n_kv * KV_MIN_BYTES;
    if (f->n_tensors > left / TENSOR_MIN_BYTES)
        return perr(ps, TM_ERR_FORMAT, 8,
                    "tensor count: %" PRIu64 " tensors (after %" PRIu64
                    " kv pairs) need at least %d bytes each, only %" PRIu64 " bytes left",
                    f->n_tensors, f->n_kv, TENSOR_MIN_BYTES, left);
    return TM_OK;
}

static tm_status parse_kvs(parser *ps) {
    tm_gguf_file *f = ps->f;
    f->kv = priv_alloc(ps, (size_t)f->n_kv, sizeof(*f->kv));
    if (!f->kv || !table_init(&ps->priv->kv_index, f->n_kv))
        return tm_error_set(TM_ERR_NOMEM, "%s: out of memory for %" PRIu64 " kv pairs", ps->name,
                            f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        tm_gguf_kv *kv = &f->kv[i];
        kv->file_offset = ps->pos;
        snprintf(ps->what, sizeof(ps->what), "kv %" PRIu64, i);
        tm_status st = read_name(ps, "key", &kv->key);
        if (st) return st;
        char q[96];
        quote_name(q, sizeof(q), kv->key.data, kv->key.len);
        snprintf(ps->what, sizeof(ps->what), "kv %" PRIu64 " '%s'", i, q);
        int found;
        uint64_t slot =
            table_slot(&ps->priv->kv_index, kv->key.data, kv->key.len, kv_name, f, &found);
        if (found)
            return perr(ps, TM_ERR_FORMAT, kv->file_offset,
                        "key: duplicate key name (first at byte offset %" PRIu64 ")",
                        f->kv[ps->priv->kv_index.slots[slot] - 1].file_offset);
        ps->priv->kv_index.slots[slot] = i + 1;
        uint64_t type_at = ps->pos;
        uint32_t type;
        if ((st = read_u32(ps, "value type", &type))) return st;
        if (type >= TM_GGUF_TYPE_COUNT)
            return perr(ps, TM_ERR_FORMAT, type_at,
                        "value type: expected a GGUF value type 0..12, got %" PRIu32, type);
        if ((st = parse_value(ps, (tm_gguf_value_type)type, 1, &kv->value))) return st;
    }
    ps->what[0] = '\0';
    return TM_OK;
}

static tm_status parse_alignment(parser *ps) {
    tm_gguf_file *f = ps->f;
    f->alignment = TM_GGUF_DEFAULT_ALIGNMENT;
    const tm_gguf_kv *kv = gguf_file_find_kv(f, "general.alignment");
    if (!kv) return TM_OK;
    snprintf(ps->what, sizeof(ps->what), "kv 'general.alignment'");
    if (kv->value.type != TM_GGUF_TYPE_UINT32)
        return perr(ps, TM_ERR_FORMAT, kv->file_offset, "value type: expected uint32, got %s",
                    gguf_value_type_name(kv->value.type));
    if (!gguf_is_pow2(kv->value.v.u32))
        return perr(ps, TM_ERR_FORMAT, kv->file_offset,
                    "value: expected a power of two, got %" PRIu32, kv->value.v.u32);
    f->alignment = kv->value.v.u32;
    ps->what[0] = '\0';
    return TM_OK;
}

static tm_status parse_tensor_info(parser *ps, uint64_t i, uint64_t *record_at) {
    tm_gguf_file *f = ps->f;
    tm_gguf_tensor *t = &f->tensors[i];
    *record_at = ps->pos;
    snprintf(ps->what, sizeof(ps->what), "tensor %" PRIu64, i);
    tm_status st = read_name(ps, "name", &t->name);
    if (st) return st;
    char q[96];
    quote_name(q, sizeof(q), t->name.data, t->name.len);
    snprintf(ps->what, sizeof(ps->what), "tensor %" PRIu64 " '%s'", i, q);
    int found;
    uint64_t slot =
        table_slot(&ps->priv->tensor_index, t->name.data, t->name.len, tensor_name, f, &found);
    if (found)
        return perr(ps, TM_ERR_FORMAT, *record_at,
                    "name: duplicate tensor name (first is tensor %" PRIu64 ")",
                    ps->priv->tensor_index.slots[slot] - 1);
    ps->priv->tensor_index.slots[slot] = i + 1;

    uint64_t dims_at = ps->pos;
    if ((st = read_u32(ps, "n_dims", &t->n_dims))) return st;
    if (t->n_dims < 1 || t->n_dims > TM_GGUF_MAX_DIMS)
        return perr(ps, TM_ERR_FORMAT, dims_at, "n_dims: expected 1 to %d, got %" PRIu32,
                    TM_GGUF_MAX_DIMS, t->n_dims);
    for (int d = 0; d < TM_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        if ((st = read_u64(ps, "ne", &v))) return st;
        /* values ≥ 2^63 become negative and fail the shape check below */
        t->ne[d] = (int64_t)v;
    }
    uint64_t type_at = ps->pos;
    if ((st = read_u32(ps, "type", &t->type))) return st;
    uint64_t off_at = ps->pos;
    if ((st = read_u64(ps, "offset", &t->offset))) return st;

    char field[32], why[200];
    st = gguf_tensor_shape_check(t->type, t->n_dims, t->ne, &t->n_elements, &t->n_bytes, field,
                                 sizeof(field), why, sizeof(why));
    if (st) return perr(ps, st, strcmp(field, "type") ? dims_at : type_at, "%s: %s", field, why);
    if (t->offset % f->alignment != 0)
        return perr(ps, TM_ERR_FORMAT, off_at,
                    "offset: expected a multiple of the alignment %" PRIu64 ", got %" PRIu64,
                    f->alignment, t->offset);
    return TM_OK;
}

typedef struct span {
    uint64_t begin, end, index;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static tm_status parse_tensors(parser *ps) {
    tm_gguf_file *f = ps->f;
    tm_status st = TM_OK;
    f->tensors = priv_alloc(ps, (size_t)f->n_tensors, sizeof(*f->tensors));
    uint64_t *record_at = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(uint64_t));
    span *spans = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(span));
    if (!f->tensors || !record_at || !spans || !table_init(&ps->priv->tensor_index, f->n_tensors)) {
        st = tm_error_set(TM_ERR_NOMEM, "%s: out of memory for %" PRIu64 " tensors", ps->name,
                          f->n_tensors);
        goto done;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if ((st = parse_tensor_info(ps, i, &record_at[i]))) goto done;

    ps->what[0] = '\0';
    if (!gguf_align_up(ps->pos, f->alignment, &f->data_offset) ||
        (f->n_tensors > 0 && f->data_offset > ps->size)) {
        st = perr(ps, TM_ERR_FORMAT, ps->pos,
                  "data section: expected it to start (aligned to %" PRIu64
                  ") within the file of %" PRIu64 " bytes",
                  f->alignment, ps->size);
        goto done;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        tm_gguf_tensor *t = &f->tensors[i];
        uint64_t end;
        if (__builtin_add_overflow(f->data_offset, t->offset, &t->file_offset) ||
            __builtin_add_overflow(t->file_offset, t->n_bytes, &end) || end > ps->size) {
            char q[96];
            quote_name(q, sizeof(q), t->name.data, t->name.len);
            snprintf(ps->what, sizeof(ps->what), "tensor %" PRIu64 " '%s'", i, q);
            st = perr(ps, TM_ERR_FORMAT, record_at[i],
                      "offset: %s data of %" PRIu64 " bytes at relative offset %" PRIu64
                      " runs past the end of the file (data section at %" PRIu64
                      ", file size %" PRIu64 ")",
                      quant_type_name(t->type), t->n_bytes, t->offset, f->data_offset, ps->size);
            goto done;
        }
        t->data = ps->p + t->file_offset;
        spans[i] = (span){t->file_offset, end, i};
    }
    qsort(spans, (size_t)f->n_tensors, sizeof(span), span_cmp);
    for (uint64_t i = 1; i < f->n_tensors; i++) {
        if (spans[i].begin < spans[i - 1].end) {
            const tm_gguf_tensor *a = &f->tensors[spans[i - 1].index],
                                 *b = &f->tensors[spans[i].index];
            char qa[96], qb[96];
            quote_name(qa, sizeof(qa), a->name.data, a->name.len);
            quote_name(qb, sizeof(qb), b->name.data, b->name.len);
            snprintf(ps->what, sizeof(ps->what), "tensor %" PRIu64 " '%s'", spans[i].index, qb);
            st = perr(ps, TM_ERR_FORMAT, record_at[spans[i].index],
                      "offset: %s data [%" PRIu64 ", %" PRIu64 ") overlaps tensor %" PRIu64
                      " '%s' (%s) at [%" PRIu64 ", %" PRIu64 ")",
                      quant_type_name(b->type), b->offset, b->offset + b->n_bytes,
                      spans[i - 1].index, qa, quant_type_name(a->type), a->offset,
                      a->offset + a->n_bytes);
            goto done;
        }
    }
done:
    free(record_at);
    free(spans);
    return st;
}

/* ---- open / close ---- */

static void priv_free(gguf_priv *pv) {
    if (!pv) return;
    for (size_t i = 0; i < pv->n_allocs; i++) free(pv->allocs[i]);
    free(pv->allocs);
    free(pv->kv_index.slots);
    free(pv->tensor_index.slots);
    free(pv);
}

void gguf_file_close(tm_gguf_file *f) {
    if (!f) return;
    gguf_priv *pv = f->priv;
    if (pv && pv->owns_map && f->map) munmap((void *)f->map, (size_t)f->file_size);
    if (f->fd >= 0) close(f->fd);
    priv_free(pv);
    free(f->path);
    free(f);
}

static tm_status parse_image(tm_gguf_file *f, const char *name) {
    parser ps = {.p = f->map, .size = f->file_size, .name = name, .f = f, .priv = f->priv};
    tm_status st;
    if ((st = parse_header(&ps))) return st;
    if ((st = parse_kvs(&ps))) return st;
    if ((st = parse_alignment(&ps))) return st;
    return parse_tensors(&ps);
}

static tm_status file_new(const char *name, tm_gguf_file **out) {
    tm_gguf_file *f = calloc(1, sizeof(*f));
    gguf_priv *pv = calloc(1, sizeof(*pv));
    char *path = strdup(name);
    if (!f || !pv || !path) {
        free(f);
        free(pv);
        free(path);
        return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", name);
    }
    f->fd = -1;
    f->path = path;
    f->priv = pv;
    *out = f;
    return TM_OK;
}

tm_status gguf_file_open_buffer(const void *buf, size_t size, const char *name,
                                tm_gguf_file **out) {
    if (!out) return tm_error_set(TM_ERR_ARG, "gguf_file_open_buffer: out is NULL");
    *out = NULL;
    if (!name) name = "<buffer>";
    if (!buf && size) return tm_error_set(TM_ERR_ARG, "%s: buffer is NULL", name);
    tm_gguf_file *f = NULL;
    tm_status st = file_new(name, &f);
    if (st) return st;
    f->map = buf;
    f->file_size = size;
    if ((st = parse_image(f, name))) {
        gguf_file_close(f);
        return st;
    }
    *out = f;
    return TM_OK;
}

tm_status gguf_file_open(const char *path, tm_gguf_file **out) {
    if (!out || !path) return tm_error_set(TM_ERR_ARG, "gguf_file_open: path or out is NULL");
    *out = NULL;
    tm_gguf_file *f = NULL;
    tm_status st = file_new(path, &f);
    if (st) return st;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        st = tm_error_set(TM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        st = tm_error_set(TM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = tm_error_set(TM_ERR_IO, "%s: expected a regular file", path);
        goto fail;
    }
    if (sb.st_size <= 0) {
        st = tm_error_set(
            TM_ERR_FORMAT,
            "%s: byte offset 0: header: magic: the file is empty, expected a GGUF header", path);
        goto fail;
    }
    f->file_size = (uint64_t)sb.st_size;
    /* shared, not private: the same for reading, and the PCIe lane pins these
     * pages for the GPU (CUDA's registration of a private file mapping did not
     * return, even for 256 MiB, on the H100 machine) */
    void *m = mmap(NULL, (size_t)f->file_size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED) {
        st = tm_error_set(TM_ERR_IO, "%s: cannot map %" PRIu64 " bytes: %s", path, f->file_size,
                          strerror(errno));
        goto fail;
    }
    f->map = m;
    ((gguf_priv *)f->priv)->owns_map = 1;
    if ((st = parse_image(f, path))) goto fail;
    *out = f;
    return TM_OK;
fail:
    gguf_file_close(f);
    return st;
}

/* ---- lookups and typed getters ---- */

const tm_gguf_kv *gguf_file_find_kv(const tm_gguf_file *f, const char *key) {
    if (!f || !key || !f->priv || !((gguf_priv *)f->priv)->kv_index.slots) return NULL;
    const name_table *t = &((const gguf_priv *)f->priv)->kv_index;
    int found;
    uint64_t slot = table_slot(t, key, strlen(key), kv_name, f, &found);
    return found ? &f->kv[t->slots[slot] - 1] : NULL;
}

int64_t gguf_file_find_tensor_index(const tm_gguf_file *f, const char *name) {
    if (!f || !name || !f->priv || !((gguf_priv *)f->priv)->tensor_index.slots) return -1;
    const name_table *t = &((const gguf_priv *)f->priv)->tensor_index;
    int found;
    uint64_t slot = table_slot(t, name, strlen(name), tensor_name, f, &found);
    return found ? (int64_t)(t->slots[slot] - 1) : -1;
}

const tm_gguf_tensor *gguf_file_find_tensor(const tm_gguf_file *f, const char *name) {
    int64_t i = gguf_file_find_tensor_index(f, name);
    return i < 0 ? NULL : &f->tensors[i];
}

static tm_status get_kv(const tm_gguf_file *f, const char *key, const tm_gguf_kv **out) {
    *out = gguf_file_find_kv(f, key);
    if (!*out)
        return tm_error_set(TM_ERR_FORMAT, "%s: key '%s' is missing", f ? f->path : "?", key);
    return TM_OK;
}

static tm_status wrong_type(const tm_gguf_file *f, const tm_gguf_kv *kv, const char *key,
                            const char *expected) {
    return tm_error_set(TM_ERR_FORMAT, "%s: byte offset %" PRIu64 ": key '%s': expected %s, got %s",
                        f->path, kv->file_offset, key, expected,
                        gguf_value_type_name(kv->value.type));
}

/* Any integer value as (negative?, magnitude) so range checks are exact. */
static int value_as_int(const tm_gguf_value *v, int *neg, uint64_t *mag) {
    int64_t s;
    *neg = 0;
    switch (v->type) {
    case TM_GGUF_TYPE_UINT8:
        *mag = v->v.u8;
        return 1;
    case TM_GGUF_TYPE_UINT16:
        *mag = v->v.u16;
        return 1;
    case TM_GGUF_TYPE_UINT32:
        *mag = v->v.u32;
        return 1;
    case TM_GGUF_TYPE_UINT64:
        *mag = v->v.u64;
        return 1;
    case TM_GGUF_TYPE_INT8:
        s = v->v.i8;
        break;
    case TM_GGUF_TYPE_INT16:
        s = v->v.i16;
        break;
    case TM_GGUF_TYPE_INT32:
        s = v->v.i32;
        break;
    case TM_GGUF_TYPE_INT64:
        s = v->v.i64;
        break;
    default:
        return 0;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 1;
}

static tm_status get_uint(const tm_gguf_file *f, const char *key, uint64_t max, uint64_t *out) {
    const tm_gguf_kv *kv;
    tm_status st = get_kv(f, key, &kv);
    if (st) return st;
    int neg;
    uint64_t mag;
    if (!value_as_int(&kv->value, &neg, &mag)) return wrong_type(f, kv, key, "an integer");
    if (neg || mag > max)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: byte offset %" PRIu64
                            ": key '%s': expected a value in [0, %" PRIu64 "], got %s%" PRIu64,
                            f->path, kv->file_offset, key, max, neg ? "-" : "", mag);
    *out = mag;
    return TM_OK;
}

tm_status gguf_file_get_u32(const tm_gguf_file *f, const char *key, uint32_t *out) {
    uint64_t v = 0;
    tm_status st = get_uint(f, key, UINT32_MAX, &v);
    if (!st) *out = (uint32_t)v;
    return st;
}

tm_status gguf_file_get_u64(const tm_gguf_file *f, const char *key, uint64_t *out) {
    return get_uint(f, key, UINT64_MAX, out);
}

tm_status gguf_file_get_f32(const tm_gguf_file *f, const char *key, float *out) {
    const tm_gguf_kv *kv;
    tm_status st = get_kv(f, key, &kv);
    if (st) return st;
    if (kv->value.type == TM_GGUF_TYPE_FLOAT32)
        *out = kv->value.v.f32;
    else if (kv->value.type == TM_GGUF_TYPE_FLOAT64)
        *out = (float)kv->value.v.f64;
    else
        return wrong_type(f, kv, key, "float32 or float64");
    return TM_OK;
}

tm_status gguf_file_get_bool(const tm_gguf_file *f, const char *key, bool *out) {
    const tm_gguf_kv *kv;
    tm_status st = get_kv(f, key, &kv);
    if (st) return st;
    if (kv->value.type != TM_GGUF_TYPE_BOOL) return wrong_type(f, kv, key, "bool");
    *out = kv->value.v.b;
    return TM_OK;
}

tm_status gguf_file_get_str(const tm_gguf_file *f, const char *key, tm_gguf_str *out) {
    const tm_gguf_kv *kv;
    tm_status st = get_kv(f, key, &kv);
    if (st) return st;
    if (kv->value.type != TM_GGUF_TYPE_STRING) return wrong_type(f, kv, key, "string");
    *out = kv->value.v.str;
    return TM_OK;
}

tm_status gguf_file_get_array(const tm_gguf_file *f, const char *key, const tm_gguf_array **out) {
    const tm_gguf_kv *kv;
    tm_status st = get_kv(f, key, &kv);
    if (st) return st;
    if (kv->value.type != TM_GGUF_TYPE_ARRAY) return wrong_type(f, kv, key, "array");
    *out = &kv->value.v.arr;
    return TM_OK;
}
