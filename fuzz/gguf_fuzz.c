/* libFuzzer target for the GGUF reader (and writer): parse any byte string
 * with gguf_file_open_buffer(); when it is accepted, walk everything the
 * reader promises is valid (every kv value down to nested elements, every
 * lookup, the first and last byte of every tensor), so ASan catches any read
 * the validation let through. Accepted inputs are then copied with our writer
 * (gguf_file_copy to a file in /dev/shm) and read back: the copy must hold
 * the same keys, values, tensors and bytes (abort() otherwise).
 * Build and run: see fuzz/README.md. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void touch_str(tm_gguf_str s) {
    if (s.len) sink += (uint8_t)s.data[0] + (uint8_t)s.data[s.len - 1];
}

static void touch_value(const tm_gguf_value *v) {
    if (v->type == TM_GGUF_TYPE_STRING) {
        touch_str(v->v.str);
        return;
    }
    if (v->type != TM_GGUF_TYPE_ARRAY) {
        sink += v->v.u8;
        return;
    }
    const tm_gguf_array *a = &v->v.arr;
    if (!a->n) return;
    size_t es = gguf_value_type_size(a->elem_type);
    if (es) {
        const uint8_t *p = a->data;
        sink += p[0] + p[a->n * es - 1];
        if (es <= 4 && a->elem_type != TM_GGUF_TYPE_FLOAT32 && a->elem_type != TM_GGUF_TYPE_BOOL)
            sink += gguf_array_get_u32(a, a->n - 1) + (uint32_t)gguf_array_get_i32(a, 0);
        if (a->elem_type == TM_GGUF_TYPE_FLOAT32) sink += (uint64_t)(gguf_array_get_f32(a, 0) != 0);
    } else if (a->elem_type == TM_GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < a->n; i++) touch_str(gguf_array_get_str(a, i));
    } else {
        for (uint64_t i = 0; i < a->n; i++) touch_value(&((const tm_gguf_value *)a->data)[i]);
    }
}

static int str_same(tm_gguf_str a, tm_gguf_str b) {
    return a.len == b.len && (a.len == 0 || !memcmp(a.data, b.data, a.len));
}

static int value_same(const tm_gguf_value *a, const tm_gguf_value *b) {
    if (a->type != b->type) return 0;
    if (a->type == TM_GGUF_TYPE_STRING) return str_same(a->v.str, b->v.str);
    if (a->type == TM_GGUF_TYPE_BOOL) return a->v.b == b->v.b;
    if (a->type != TM_GGUF_TYPE_ARRAY) return !memcmp(&a->v, &b->v, gguf_value_type_size(a->type));
    const tm_gguf_array *x = &a->v.arr, *y = &b->v.arr;
    if (x->elem_type != y->elem_type || x->n != y->n) return 0;
    size_t es = gguf_value_type_size(x->elem_type);
    if (es) return x->n == 0 || !memcmp(x->data, y->data, x->n * es);
    for (uint64_t i = 0; i < x->n; i++) {
        if (x->elem_type == TM_GGUF_TYPE_STRING) {
            if (!str_same(gguf_array_get_str(x, i), gguf_array_get_str(y, i))) return 0;
        } else if (!value_same(&((const tm_gguf_value *)x->data)[i],
                               &((const tm_gguf_value *)y->data)[i])) {
            return 0;
        }
    }
    return 1;
}

/* read(write(f)) == f, or abort. Skips huge alignments (a kv-only file may
 * declare 2^31, and the writer would pad to it). */
static void check_copy(const tm_gguf_file *f) {
    static char path[64];
    if (f->alignment > 4096) return;
    if (!path[0])
        snprintf(path, sizeof(path), "%s/gguf_fuzz_%d.gguf",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
    if (gguf_file_copy(f, path) != TM_OK) abort(); /* everything we read, we can write */
    tm_gguf_file *g;
    if (gguf_file_open(path, &g) != TM_OK) abort();
    int same = g->version == f->version && g->alignment == f->alignment && g->n_kv == f->n_kv &&
               g->n_tensors == f->n_tensors;
    for (uint64_t i = 0; same && i < f->n_kv; i++)
        same = str_same(f->kv[i].key, g->kv[i].key) && value_same(&f->kv[i].value, &g->kv[i].value);
    for (uint64_t i = 0; same && i < f->n_tensors; i++) {
        const tm_gguf_tensor *a = &f->tensors[i], *b = &g->tensors[i];
        same = str_same(a->name, b->name) && a->type == b->type && a->n_dims == b->n_dims &&
               !memcmp(a->ne, b->ne, sizeof(a->ne)) && a->n_bytes == b->n_bytes &&
               !memcmp(a->data, b->data, a->n_bytes);
    }
    gguf_file_close(g);
    unlink(path);
    if (!same) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private copy of exactly `size` bytes, so any over-read hits a redzone */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    tm_gguf_file *f = NULL;
    if (gguf_file_open_buffer(buf, size, "fuzz", &f) == TM_OK) {
        char name[256];
        for (uint64_t i = 0; i < f->n_kv; i++) {
            const tm_gguf_kv *kv = &f->kv[i];
            touch_value(&kv->value);
            size_t n = kv->key.len < sizeof(name) - 1 ? (size_t)kv->key.len : sizeof(name) - 1;
            memcpy(name, kv->key.data, n);
            name[n] = '\0';
            const tm_gguf_kv *found = gguf_file_find_kv(f, name);
            if (n == kv->key.len && found != kv) abort(); /* every key must be found, as itself */
            uint32_t u32;
            uint64_t u64;
            float f32;
            bool b;
            tm_gguf_str s;
            const tm_gguf_array *arr;
            sink += gguf_file_get_u32(f, name, &u32) + gguf_file_get_u64(f, name, &u64) +
                    gguf_file_get_f32(f, name, &f32) + gguf_file_get_bool(f, name, &b) +
                    gguf_file_get_str(f, name, &s) + gguf_file_get_array(f, name, &arr);
        }
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const tm_gguf_tensor *t = &f->tensors[i];
            const uint8_t *p = t->data;
            sink += p[0] + p[t->n_bytes - 1];
            if (t->file_offset + t->n_bytes > size || t->file_offset % f->alignment) abort();
            size_t n = t->name.len < sizeof(name) - 1 ? (size_t)t->name.len : sizeof(name) - 1;
            memcpy(name, t->name.data, n);
            name[n] = '\0';
            if (n == t->name.len && gguf_file_find_tensor_index(f, name) != (int64_t)i) abort();
        }
        sink += (uint64_t)(gguf_file_find_kv(f, "general.architecture") != NULL);
        check_copy(f);
        gguf_file_close(f);
    }
    free(buf);
    return 0;
}
