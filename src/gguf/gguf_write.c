/* GGUF writer: metadata is serialized into memory as it is set, tensor infos
 * are collected, and gguf_writer_begin() writes header + metadata + infos +
 * padding to "<path>.tmp". Tensor bytes then stream through
 * gguf_writer_write_data() in declaration order, each tensor padded to the
 * alignment, and gguf_writer_finish() renames the file into place. Any
 * failure removes the temporary file, so a partial file never appears under
 * the final name.
 *
 * Alignment: the writer uses the alignment given to gguf_writer_init(), or the
 * value of a `general.alignment` key set on it (a uint32 power of two). When
 * the alignment is not the default 32 and no such key was set, begin() adds
 * the key, so every file we write reads back with the alignment it was
 * written with. Tensor offsets are packed in declaration order. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "gguf/gguf.h"
#include "gguf/gguf_internal.h"

#define OUT_BUF_BYTES (1u << 20)

typedef struct byte_buf {
    uint8_t *data;
    size_t len, cap;
} byte_buf;

typedef struct writer_tensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[TM_GGUF_MAX_DIMS];
    uint64_t n_bytes;
    uint64_t offset;
} writer_tensor;

typedef enum writer_state { WS_BUILD, WS_DATA, WS_DONE, WS_FAILED } writer_state;

struct tm_gguf_writer {
    uint32_t version;
    uint64_t alignment;
    int alignment_key_set;
    byte_buf kv; /* serialized kv records */
    uint64_t n_kv;
    char **keys; /* for duplicate checks */
    size_t cap_keys;
    writer_tensor *tensors;
    uint64_t n_tensors, cap_tensors;

    writer_state state;
    int fd;
    char *path, *tmp_path;
    uint8_t *out; /* output buffer */
    size_t out_len;
    uint64_t file_pos; /* bytes handed to write() so far */
    uint64_t cur_tensor, cur_written;
};

/* ---- byte buffer ---- */

static int buf_reserve(byte_buf *b, size_t more) {
    if (more <= b->cap - b->len) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < more) {
        if (cap > SIZE_MAX / 2) return 0;
        cap *= 2;
    }
    uint8_t *d = realloc(b->data, cap);
    if (!d) return 0;
    b->data = d;
    b->cap = cap;
    return 1;
}

static int buf_put(byte_buf *b, const void *p, size_t n) {
    if (!buf_reserve(b, n)) return 0;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 1;
}

static int buf_u32(byte_buf *b, uint32_t v) {
    return buf_put(b, &v, 4);
}
static int buf_u64(byte_buf *b, uint64_t v) {
    return buf_put(b, &v, 8);
}
static int buf_str(byte_buf *b, const char *s, uint64_t n) {
    if (n > SIZE_MAX) return 0;
    return buf_u64(b, n) && buf_put(b, s, (size_t)n);
}

/* ---- init / free ---- */

tm_status gguf_writer_init(tm_gguf_writer **out, uint32_t version, uint64_t alignment) {
    if (!out) return tm_error_set(TM_ERR_ARG, "gguf_writer_init: out is NULL");
    *out = NULL;
    if (version == 0) version = 3;
    if (version != 2 && version != 3)
        return tm_error_set(TM_ERR_ARG, "gguf writer: version: expected 2 or 3, got %" PRIu32,
                            version);
    if (alignment == 0) alignment = TM_GGUF_DEFAULT_ALIGNMENT;
    if (!gguf_is_pow2(alignment) || alignment > UINT32_MAX)
        return tm_error_set(TM_ERR_ARG,
                            "gguf writer: alignment: expected a power of two that fits in uint32, "
                            "got %" PRIu64,
                            alignment);
    tm_gguf_writer *w = calloc(1, sizeof(*w));
    if (!w) return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
    w->version = version;
    w->alignment = alignment;
    w->fd = -1;
    *out = w;
    return TM_OK;
}

static void writer_close_tmp(tm_gguf_writer *w) {
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
        if (w->tmp_path) unlink(w->tmp_path);
    }
}

void gguf_writer_free(tm_gguf_writer *w) {
    if (!w) return;
    writer_close_tmp(w);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->tensors);
    free(w->kv.data);
    free(w->out);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

/* ---- metadata ---- */

static tm_status writer_check_building(tm_gguf_writer *w, const char *what) {
    if (!w) return tm_error_set(TM_ERR_ARG, "gguf writer: %s: writer is NULL", what);
    if (w->state != WS_BUILD)
        return tm_error_set(TM_ERR_ARG, "gguf writer: %s: expected before gguf_writer_begin()",
                            what);
    return TM_OK;
}

static tm_status ser_value(tm_gguf_writer *w, const char *key, const tm_gguf_value *v, int depth,
                           int with_type);

static tm_status ser_array(tm_gguf_writer *w, const char *key, const tm_gguf_array *a, int depth) {
    byte_buf *b = &w->kv;
    if (depth > TM_GGUF_MAX_ARRAY_DEPTH)
        return tm_error_set(TM_ERR_ARG,
                            "gguf writer: key '%s': arrays nested deeper than %d levels", key,
                            TM_GGUF_MAX_ARRAY_DEPTH);
    if ((unsigned)a->elem_type >= TM_GGUF_TYPE_COUNT)
        return tm_error_set(TM_ERR_ARG,
                            "gguf writer: key '%s': array element type %d is not a GGUF type", key,
                            (int)a->elem_type);
    if (a->n && !a->data)
        return tm_error_set(TM_ERR_ARG, "gguf writer: key '%s': array of %" PRIu64 " has no data",
                            key, a->n);
    if (!buf_u32(b, (uint32_t)a->elem_type) || !buf_u64(b, a->n)) goto nomem;
    size_t esize = gguf_value_type_size(a->elem_type);
    if (esize) {
        if (a->n > SIZE_MAX / esize) goto nomem;
        if (a->elem_type == TM_GGUF_TYPE_BOOL)
            for (uint64_t i = 0; i < a->n; i++)
                if (((const uint8_t *)a->data)[i] > 1)
                    return tm_error_set(
                        TM_ERR_ARG, "gguf writer: key '%s': bool element %" PRIu64 " is not 0 or 1",
                        key, i);
        if (!buf_put(b, a->data, (size_t)(a->n * esize))) goto nomem;
        return TM_OK;
    }
    for (uint64_t i = 0; i < a->n; i++) {
        tm_status st;
        if (a->elem_type == TM_GGUF_TYPE_STRING) {
            tm_gguf_value sv = {.type = TM_GGUF_TYPE_STRING};
            sv.v.str = ((const tm_gguf_str *)a->data)[i];
            st = ser_value(w, key, &sv, depth, 0);
        } else {
            const tm_gguf_value *ev = &((const tm_gguf_value *)a->data)[i];
            if (ev->type != TM_GGUF_TYPE_ARRAY)
                return tm_error_set(TM_ERR_ARG,
                                    "gguf writer: key '%s': element %" PRIu64
                                    " of an array of arrays has type %s",
                                    key, i, gguf_value_type_name(ev->type));
            st = ser_value(w, key, ev, depth + 1, 0);
        }
        if (st) return st;
    }
    return TM_OK;
nomem:
    return tm_error_set(TM_ERR_NOMEM, "gguf writer: key '%s': out of memory", key);
}

/* Serialize a value (with its u32 type tag when `with_type`). `depth` is the
 * array nesting level an ARRAY value would have. */
static tm_status ser_value(tm_gguf_writer *w, const char *key, const tm_gguf_value *v, int depth,
                           int with_type) {
    byte_buf *b = &w->kv;
    if ((unsigned)v->type >= TM_GGUF_TYPE_COUNT)
        return tm_error_set(TM_ERR_ARG, "gguf writer: key '%s': value type %d is not a GGUF type",
                            key, (int)v->type);
    if (with_type && !buf_u32(b, (uint32_t)v->type)) goto nomem;
    if (v->type == TM_GGUF_TYPE_ARRAY) return ser_array(w, key, &v->v.arr, depth);
    if (v->type == TM_GGUF_TYPE_STRING) {
        if (v->v.str.len && !v->v.str.data)
            return tm_error_set(TM_ERR_ARG, "gguf writer: key '%s': string has no data", key);
        if (!buf_str(b, v->v.str.data, v->v.str.len)) goto nomem;
        return TM_OK;
    }
    if (v->type == TM_GGUF_TYPE_BOOL) {
        uint8_t c = v->v.b ? 1 : 0;
        return buf_put(b, &c, 1) ? TM_OK : tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
    }
    if (!buf_put(b, &v->v, gguf_value_type_size(v->type))) goto nomem;
    return TM_OK;
nomem:
    return tm_error_set(TM_ERR_NOMEM, "gguf writer: key '%s': out of memory", key);
}

tm_status gguf_writer_set_value(tm_gguf_writer *w, const char *key, const tm_gguf_value *v) {
    tm_status st = writer_check_building(w, "set metadata");
    if (st) return st;
    if (!key || !key[0])
        return tm_error_set(TM_ERR_ARG, "gguf writer: key: expected a non-empty key");
    if (!v) return tm_error_set(TM_ERR_ARG, "gguf writer: key '%s': value is NULL", key);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return tm_error_set(TM_ERR_ARG, "gguf writer: key '%s': duplicate key", key);
    int is_align = !strcmp(key, "general.alignment");
    if (is_align && (v->type != TM_GGUF_TYPE_UINT32 || !gguf_is_pow2(v->v.u32)))
        return tm_error_set(TM_ERR_ARG,
                            "gguf writer: key 'general.alignment': expected a uint32 power of two");
    if (w->n_kv == w->cap_keys) {
        size_t cap = w->cap_keys ? w->cap_keys * 2 : 16;
        char **k = realloc(w->keys, cap * sizeof(*k));
        if (!k) return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
        w->keys = k;
        w->cap_keys = cap;
    }
    char *kcopy = strdup(key);
    if (!kcopy) return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
    size_t mark = w->kv.len;
    if (!buf_str(&w->kv, key, strlen(key))) {
        free(kcopy);
        return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
    }
    if ((st = ser_value(w, key, v, 1, 1))) {
        w->kv.len = mark; /* drop the partial record */
        free(kcopy);
        return st;
    }
    w->keys[w->n_kv++] = kcopy;
    if (is_align) {
        w->alignment = v->v.u32;
        w->alignment_key_set = 1;
    }
    return TM_OK;
}

#define WRITER_SETTER(fn, ctype, TYPE, member)                                                     \
    tm_status fn(tm_gguf_writer *w, const char *key, ctype x) {                                    \
        tm_gguf_value v = {.type = TYPE};                                                          \
        v.v.member = x;                                                                            \
        return gguf_writer_set_value(w, key, &v);                                                  \
    }

WRITER_SETTER(gguf_writer_set_u32, uint32_t, TM_GGUF_TYPE_UINT32, u32)
WRITER_SETTER(gguf_writer_set_i32, int32_t, TM_GGUF_TYPE_INT32, i32)
WRITER_SETTER(gguf_writer_set_u64, uint64_t, TM_GGUF_TYPE_UINT64, u64)
WRITER_SETTER(gguf_writer_set_f32, float, TM_GGUF_TYPE_FLOAT32, f32)
WRITER_SETTER(gguf_writer_set_bool, bool, TM_GGUF_TYPE_BOOL, b)

tm_status gguf_writer_set_str(tm_gguf_writer *w, const char *key, const char *s) {
    if (!s)
        return tm_error_set(TM_ERR_ARG, "gguf writer: key '%s': string is NULL", key ? key : "?");
    tm_gguf_value v = {.type = TM_GGUF_TYPE_STRING};
    v.v.str = (tm_gguf_str){s, strlen(s)};
    return gguf_writer_set_value(w, key, &v);
}

tm_status gguf_writer_set_array(tm_gguf_writer *w, const char *key, tm_gguf_value_type elem_type,
                                const void *data, uint64_t n) {
    tm_gguf_value v = {.type = TM_GGUF_TYPE_ARRAY};
    v.v.arr.elem_type = elem_type;
    v.v.arr.n = n;
    v.v.arr.data = data;
    if (elem_type == TM_GGUF_TYPE_ARRAY)
        return tm_error_set(TM_ERR_ARG,
                            "gguf writer: key '%s': nested arrays go through gguf_writer_set_value",
                            key ? key : "?");
    if (elem_type != TM_GGUF_TYPE_STRING) return gguf_writer_set_value(w, key, &v);
    /* const char *[n] -> tm_gguf_str[n] */
    if (n && !data)
        return tm_error_set(TM_ERR_ARG, "gguf writer: key '%s': array of %" PRIu64 " has no data",
                            key ? key : "?", n);
    if (n > SIZE_MAX / sizeof(tm_gguf_str))
        return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
    tm_gguf_str *s = malloc(n ? (size_t)n * sizeof(*s) : 1);
    if (!s) return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
    const char *const *cs = data;
    for (uint64_t i = 0; i < n; i++) {
        if (!cs[i]) {
            free(s);
            return tm_error_set(TM_ERR_ARG, "gguf writer: key '%s': string %" PRIu64 " is NULL",
                                key ? key : "?", i);
        }
        s[i] = (tm_gguf_str){cs[i], strlen(cs[i])};
    }
    v.v.arr.data = s;
    tm_status st = gguf_writer_set_value(w, key, &v);
    free(s);
    return st;
}

/* ---- tensors ---- */

tm_status gguf_writer_add_tensor(tm_gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const int64_t *ne, uint64_t *index_out) {
    tm_status st = writer_check_building(w, "add tensor");
    if (st) return st;
    if (!name || !name[0])
        return tm_error_set(TM_ERR_ARG, "gguf writer: tensor name: expected a non-empty name");
    if (!ne) return tm_error_set(TM_ERR_ARG, "gguf writer: tensor '%s': ne is NULL", name);
    writer_tensor t = {.type = type, .n_dims = n_dims};
    for (int d = 0; d < TM_GGUF_MAX_DIMS; d++) t.ne[d] = 1;
    for (uint32_t d = 0; d < n_dims && d < TM_GGUF_MAX_DIMS; d++) t.ne[d] = ne[d];
    int64_t n_el;
    char field[32], why[200];
    st = gguf_tensor_shape_check(type, n_dims, t.ne, &n_el, &t.n_bytes, field, sizeof(field), why,
                                 sizeof(why));
    if (st) return tm_error_set(TM_ERR_ARG, "gguf writer: tensor '%s': %s: %s", name, field, why);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name))
            return tm_error_set(TM_ERR_ARG, "gguf writer: tensor '%s': duplicate tensor name",
                                name);
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        writer_tensor *nt = realloc(w->tensors, (size_t)cap * sizeof(*nt));
        if (!nt) return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    if (!(t.name = strdup(name))) return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
    if (index_out) *index_out = w->n_tensors;
    w->tensors[w->n_tensors++] = t;
    return TM_OK;
}

/* ---- output ---- */

static tm_status writer_fail(tm_gguf_writer *w, tm_status st) {
    writer_close_tmp(w);
    w->state = WS_FAILED;
    return st;
}

static tm_status out_raw(tm_gguf_writer *w, const uint8_t *p, size_t n) {
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done > (1u << 30) ? (1u << 30) : n - done;
        ssize_t r = write(w->fd, p + done, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : ENOSPC; /* write() returning 0 means no room */
            return writer_fail(w,
                               tm_error_set(TM_ERR_IO,
                                            "%s: write failed at byte offset %" PRIu64
                                            " (%zu of %zu bytes written): %s",
                                            w->tmp_path, w->file_pos + done, done, n, strerror(e)));
        }
        done += (size_t)r;
    }
    w->file_pos += n;
    return TM_OK;
}

static tm_status out_flush(tm_gguf_writer *w) {
    size_t n = w->out_len;
    w->out_len = 0;
    return n ? out_raw(w, w->out, n) : TM_OK;
}

static tm_status out_put(tm_gguf_writer *w, const void *p, size_t n) {
    if (n == 0) return TM_OK; /* p may be NULL (no metadata yet) */
    if (n >= OUT_BUF_BYTES) { /* big chunks bypass the buffer */
        tm_status st = out_flush(w);
        return st ? st : out_raw(w, p, n);
    }
    if (n > OUT_BUF_BYTES - w->out_len) {
        tm_status st = out_flush(w);
        if (st) return st;
    }
    memcpy(w->out + w->out_len, p, n);
    w->out_len += n;
    return TM_OK;
}

static tm_status out_zeros(tm_gguf_writer *w, uint64_t n) {
    static const uint8_t zeros[256];
    while (n) {
        size_t c = n > sizeof(zeros) ? sizeof(zeros) : (size_t)n;
        tm_status st = out_put(w, zeros, c);
        if (st) return st;
        n -= c;
    }
    return TM_OK;
}

static tm_status out_pad(tm_gguf_writer *w) {
    uint64_t pos = w->file_pos + w->out_len, aligned;
    if (!gguf_align_up(pos, w->alignment, &aligned))
        return writer_fail(w, tm_error_set(TM_ERR_ARG, "%s: file size overflows", w->tmp_path));
    return out_zeros(w, aligned - pos);
}

tm_status gguf_writer_begin(tm_gguf_writer *w, const char *path) {
    tm_status st = writer_check_building(w, "begin");
    if (st) return st;
    if (!path || !path[0]) return tm_error_set(TM_ERR_ARG, "gguf writer: begin: path is empty");
    /* the alignment key, when the alignment is not the default and nobody set it */
    if (w->alignment != TM_GGUF_DEFAULT_ALIGNMENT && !w->alignment_key_set &&
        (st = gguf_writer_set_u32(w, "general.alignment", (uint32_t)w->alignment)))
        return st;
    /* offsets: packed in declaration order, each aligned */
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = off;
        if (__builtin_add_overflow(off, w->tensors[i].n_bytes, &off) ||
            !gguf_align_up(off, w->alignment, &off))
            return tm_error_set(TM_ERR_ARG,
                                "gguf writer: tensor '%s': data offsets overflow 64 bits",
                                w->tensors[i].name);
    }
    size_t plen = strlen(path);
    free(w->path);
    free(w->tmp_path);
    w->path = strdup(path);
    w->tmp_path = malloc(plen + 5);
    w->out = malloc(OUT_BUF_BYTES);
    if (!w->path || !w->tmp_path || !w->out)
        return tm_error_set(TM_ERR_NOMEM, "gguf writer: out of memory");
    memcpy(w->tmp_path, path, plen);
    memcpy(w->tmp_path + plen, ".tmp", 5);
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0)
        return tm_error_set(TM_ERR_IO, "%s: cannot create: %s", w->tmp_path, strerror(errno));
    w->state = WS_DATA;
    w->file_pos = 0;
    w->out_len = 0;
    w->cur_tensor = 0;
    w->cur_written = 0;

    uint32_t head32[2] = {TM_GGUF_MAGIC, w->version};
    uint64_t head64[2] = {w->n_tensors, w->n_kv};
    if ((st = out_put(w, head32, sizeof(head32))) || (st = out_put(w, head64, sizeof(head64))) ||
        (st = out_put(w, w->kv.data, w->kv.len)))
        return st;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        uint64_t len = strlen(t->name);
        uint32_t type = t->type;
        if ((st = out_put(w, &len, 8)) || (st = out_put(w, t->name, (size_t)len)) ||
            (st = out_put(w, &t->n_dims, 4)))
            return st;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((st = out_put(w, &t->ne[d], 8))) return st;
        if ((st = out_put(w, &type, 4)) || (st = out_put(w, &t->offset, 8))) return st;
    }
    return out_pad(w);
}

tm_status gguf_writer_write_data(tm_gguf_writer *w, const void *data, size_t size) {
    if (!w || w->state != WS_DATA)
        return tm_error_set(TM_ERR_ARG,
                            "gguf writer: write data: expected after a successful begin()");
    if (size && !data) return tm_error_set(TM_ERR_ARG, "gguf writer: write data: data is NULL");
    const uint8_t *p = data;
    while (size) {
        if (w->cur_tensor >= w->n_tensors)
            return writer_fail(w, tm_error_set(TM_ERR_ARG,
                                               "%s: %zu bytes of tensor data beyond the %" PRIu64
                                               " declared tensors",
                                               w->tmp_path, size, w->n_tensors));
        writer_tensor *t = &w->tensors[w->cur_tensor];
        uint64_t left = t->n_bytes - w->cur_written;
        size_t take = size < left ? size : (size_t)left;
        tm_status st = out_put(w, p, take);
        if (st) return st;
        p += take;
        size -= take;
        w->cur_written += take;
        if (w->cur_written == t->n_bytes) {
            if ((st = out_pad(w))) return st;
            w->cur_tensor++;
            w->cur_written = 0;
        }
    }
    return TM_OK;
}

tm_status gguf_writer_finish(tm_gguf_writer *w) {
    if (!w || w->state != WS_DATA)
        return tm_error_set(TM_ERR_ARG, "gguf writer: finish: expected after a successful begin()");
    if (w->cur_tensor < w->n_tensors) {
        const writer_tensor *t = &w->tensors[w->cur_tensor];
        return writer_fail(w,
                           tm_error_set(TM_ERR_ARG,
                                        "%s: tensor %" PRIu64 " '%s': only %" PRIu64 " of %" PRIu64
                                        " bytes were written (%" PRIu64 " tensors declared)",
                                        w->tmp_path, w->cur_tensor, t->name, w->cur_written,
                                        t->n_bytes, w->n_tensors));
    }
    tm_status st = out_flush(w);
    if (st) return st;
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        int e = errno;
        unlink(w->tmp_path);
        w->state = WS_FAILED;
        return tm_error_set(TM_ERR_IO, "%s: close failed: %s", w->tmp_path, strerror(e));
    }
    if (rename(w->tmp_path, w->path) != 0) {
        int e = errno;
        unlink(w->tmp_path);
        w->state = WS_FAILED;
        return tm_error_set(TM_ERR_IO, "%s: cannot rename to %s: %s", w->tmp_path, w->path,
                            strerror(e));
    }
    w->state = WS_DONE;
    return TM_OK;
}

/* ---- copy ---- */

tm_status gguf_file_copy(const tm_gguf_file *f, const char *path) {
    return gguf_file_copy_edit(f, path, NULL, NULL);
}

tm_status gguf_file_copy_edit(const tm_gguf_file *f, const char *path, const char *key,
                              const tm_gguf_value *value) {
    if (!f || !path) return tm_error_set(TM_ERR_ARG, "gguf_file_copy: file or path is NULL");
    tm_gguf_writer *w;
    tm_status st = gguf_writer_init(&w, f->version, f->alignment);
    if (st) return st;
    char *name = NULL;
    bool edited = false;
    for (uint64_t i = 0; i < f->n_kv && !st; i++) {
        /* keys hold no NUL bytes (the reader checks), so a C string copy is exact */
        name = strndup(f->kv[i].key.data, (size_t)f->kv[i].key.len);
        const bool edit = name && key && !strcmp(name, key);
        edited |= edit;
        st = !name   ? tm_error_set(TM_ERR_NOMEM, "gguf_file_copy: out of memory")
             : !edit ? gguf_writer_set_value(w, name, &f->kv[i].value)
             : value ? gguf_writer_set_value(w, name, value)
                     : TM_OK;
        free(name);
    }
    if (!st && key && value && !edited) st = gguf_writer_set_value(w, key, value);
    for (uint64_t i = 0; i < f->n_tensors && !st; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        name = strndup(t->name.data, (size_t)t->name.len);
        st = name ? gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, NULL)
                  : tm_error_set(TM_ERR_NOMEM, "gguf_file_copy: out of memory");
        free(name);
    }
    if (!st) st = gguf_writer_begin(w, path);
    for (uint64_t i = 0; i < f->n_tensors && !st; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        if (!t->data) {
            st = tm_error_set(TM_ERR_ARG,
                              "gguf_file_copy: %s: tensor %" PRIu64 " has no data mapped", f->path,
                              i);
            break;
        }
        if (t->n_bytes > SIZE_MAX) {
            st = tm_error_set(TM_ERR_ARG, "gguf_file_copy: tensor too large for this host");
            break;
        }
        st = gguf_writer_write_data(w, t->data, (size_t)t->n_bytes);
    }
    if (!st) st = gguf_writer_finish(w);
    if (st) tm_error_wrap(st, "copying %s to %s", f->path, path);
    gguf_writer_free(w);
    return st;
}
