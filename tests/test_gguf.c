/* GGUF reader and writer tests.
 *
 * - Round trips through the writer and reader: every value type (scalars,
 *   strings incl. empty, non-ASCII and embedded NULs, arrays of every type,
 *   string arrays, nested and empty arrays), tensors of several types and
 *   shapes at alignments 32 and 64 with data streamed in odd chunks,
 *   gguf_file_copy byte identity, lookups on 600 tensors and 40 keys.
 * - Writer errors: duplicates, bad shapes, wrong call order, missing or extra
 *   data, a failing write (RLIMIT_FSIZE), and no file left under the final
 *   name (nor a .tmp) after any failure.
 * - One hand-built bad buffer per validation rule, checking the status and
 *   that the message names the file, the field and the byte offset. With
 *   TM_GGUF_EXPORT_BAD=DIR set, each bad buffer is also written to DIR (that
 *   is how tests/data/gguf_bad/ was made).
 * - Every prefix of a valid file (truncation anywhere).
 * - Regression inputs: every file in tests/data/gguf_bad/ must fail cleanly,
 *   every file in fuzz/corpus/gguf/ must not crash (run under ASan+UBSan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

/* ---- helpers ---- */

static char tmp_dir[512];

static const char *tmp_path(const char *name) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", tmp_dir, name);
    return buf[k];
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(p, 1, (size_t)sz, fp);
    fclose(fp);
    return p;
}

/* A byte builder for hand-made files. */
typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bb_raw(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_raw(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) { bb_raw(b, &v, 4); }
static void bb_u64(bb *b, uint64_t v) { bb_raw(b, &v, 8); }
static void bb_str(bb *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_raw(b, s, strlen(s));
}
static void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_u32(b, TM_GGUF_MAGIC);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, TM_GGUF_TYPE_UINT32);
    bb_u32(b, v);
}
static void bb_tensor(bb *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type,
                      uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) bb_u64(b, (uint64_t)ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
static void bb_pad(bb *b, size_t align) {
    while (b->n % align) bb_u8(b, 0);
}
static void bb_zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_u8(b, 0);
}

/* Open a copy of exactly the buffer's size (so ASan sees any over-read). */
static tm_status open_exact(const uint8_t *p, size_t n, const char *name, tm_gguf_file **f) {
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    tm_status st = gguf_file_open_buffer(copy, n, name, f);
    if (st == TM_OK) {
        gguf_file_close(*f); /* reopen from a buffer that outlives the file */
        *f = NULL;
    }
    free(copy);
    if (st == TM_OK) st = gguf_file_open_buffer(p, n, name, f);
    return st;
}

/* The bad buffer must fail with `want`; the message must name the case (the
 * file name), "byte offset", and contain each of the needles. */
static void expect_bad_at(bb *b, const char *name, tm_status want, const char *needle1,
                          const char *needle2) {
    const char *dir = getenv("TM_GGUF_EXPORT_BAD");
    if (dir && dir[0]) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s.gguf", dir, name);
        FILE *fp = fopen(path, "wb");
        if (fp) {
            fwrite(b->p, 1, b->n, fp);
            fclose(fp);
        }
    }
    tm_gguf_file *f = (tm_gguf_file *)1;
    tm_status st = open_exact(b->p, b->n, name, &f);
    const char *msg = tm_error_message();
    if (st != want || f != NULL || !strstr(msg, name) || !strstr(msg, "byte offset") ||
        (needle1 && !strstr(msg, needle1)) || (needle2 && !strstr(msg, needle2)))
        fail_msg("%s: got status %s, message \"%s\"; expected %s mentioning '%s' and '%s'", name,
                 tm_status_name(st), msg, tm_status_name(want), needle1 ? needle1 : "",
                 needle2 ? needle2 : "");
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ---- value round trip ---- */

static int value_equal(const tm_gguf_value *a, const tm_gguf_value *b) {
    if (a->type != b->type) return 0;
    switch (a->type) {
    case TM_GGUF_TYPE_STRING:
        return a->v.str.len == b->v.str.len &&
               (a->v.str.len == 0 || !memcmp(a->v.str.data, b->v.str.data, a->v.str.len));
    case TM_GGUF_TYPE_BOOL: return a->v.b == b->v.b;
    case TM_GGUF_TYPE_ARRAY: {
        const tm_gguf_array *x = &a->v.arr, *y = &b->v.arr;
        if (x->elem_type != y->elem_type || x->n != y->n) return 0;
        size_t es = gguf_value_type_size(x->elem_type);
        if (es) return x->n == 0 || !memcmp(x->data, y->data, x->n * es);
        for (uint64_t i = 0; i < x->n; i++) {
            tm_gguf_value ea, eb;
            if (x->elem_type == TM_GGUF_TYPE_STRING) {
                ea.type = eb.type = TM_GGUF_TYPE_STRING;
                ea.v.str = ((const tm_gguf_str *)x->data)[i];
                eb.v.str = ((const tm_gguf_str *)y->data)[i];
            } else {
                ea = ((const tm_gguf_value *)x->data)[i];
                eb = ((const tm_gguf_value *)y->data)[i];
            }
            if (!value_equal(&ea, &eb)) return 0;
        }
        return 1;
    }
    default: return !memcmp(&a->v, &b->v, gguf_value_type_size(a->type));
    }
}

static tm_gguf_value scalar(tm_gguf_value_type t, const void *p) {
    tm_gguf_value v;
    memset(&v, 0, sizeof(v));
    v.type = t;
    memcpy(&v.v, p, gguf_value_type_size(t));
    return v;
}

static tm_gguf_value array_of(tm_gguf_value_type et, const void *data, uint64_t n) {
    tm_gguf_value v;
    memset(&v, 0, sizeof(v));
    v.type = TM_GGUF_TYPE_ARRAY;
    v.v.arr.elem_type = et;
    v.v.arr.data = data;
    v.v.arr.n = n;
    return v;
}

#define N_VALUES 40

static void test_roundtrip_values(void **state) {
    (void)state;
    tm_gguf_value vals[N_VALUES];
    char keys[N_VALUES][32];
    int nv = 0;
    uint8_t u8 = 250;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    uint64_t u64 = UINT64_MAX;
    int64_t i64 = INT64_MIN;
    double f64 = 1.0 / 3.0;
    const void *scalars[] = {&u8, &i8, &u16, &i16, &u64, &i64, &f64};
    const tm_gguf_value_type stypes[] = {TM_GGUF_TYPE_UINT8,  TM_GGUF_TYPE_INT8,  TM_GGUF_TYPE_UINT16,
                                         TM_GGUF_TYPE_INT16,  TM_GGUF_TYPE_UINT64, TM_GGUF_TYPE_INT64,
                                         TM_GGUF_TYPE_FLOAT64};
    for (int i = 0; i < 7; i++) {
        snprintf(keys[nv], sizeof(keys[nv]), "scalar.%s", gguf_value_type_name(stypes[i]));
        vals[nv++] = scalar(stypes[i], scalars[i]);
    }
    /* arrays of every scalar type, and empty arrays of every type */
    static const uint8_t a_u8[] = {0, 1, 255};
    static const int8_t a_i8[] = {-128, 0, 127};
    static const uint16_t a_u16[] = {1, 65535};
    static const int16_t a_i16[] = {-32768, 5};
    static const uint32_t a_u32[] = {0, 4000000000u, 7};
    static const int32_t a_i32[] = {INT32_MIN, -1, INT32_MAX};
    static const float a_f32[] = {0.1f, -0.0f, 3.4e38f};
    static const uint8_t a_bool[] = {1, 0, 1};
    static const uint64_t a_u64[] = {UINT64_MAX, 0};
    static const int64_t a_i64[] = {INT64_MIN, INT64_MAX};
    static const double a_f64[] = {1e-300, -2.5};
    const void *adata[] = {a_u8, a_i8, a_u16, a_i16, a_u32, a_i32, a_f32, a_bool, NULL, NULL,
                           a_u64, a_i64, a_f64};
    const uint64_t an[] = {3, 3, 2, 2, 3, 3, 3, 3, 0, 0, 2, 2, 2};
    for (int t = 0; t < TM_GGUF_TYPE_COUNT; t++) {
        if (!adata[t]) continue;
        snprintf(keys[nv], sizeof(keys[nv]), "array.%s", gguf_value_type_name((tm_gguf_value_type)t));
        vals[nv++] = array_of((tm_gguf_value_type)t, adata[t], an[t]);
    }
    for (int t = 0; t < TM_GGUF_TYPE_COUNT; t++) {
        snprintf(keys[nv], sizeof(keys[nv]), "empty.%s", gguf_value_type_name((tm_gguf_value_type)t));
        vals[nv++] = array_of((tm_gguf_value_type)t, NULL, 0);
    }
    /* strings: empty, non-ASCII, embedded NUL; a string array; nested arrays */
    static const tm_gguf_str strs[] = {{"", 0}, {"Grüße 世界", 14}, {"a\0b", 3}, {"<s>", 3}};
    for (int i = 0; i < 3; i++) {
        snprintf(keys[nv], sizeof(keys[nv]), "string.%d", i);
        vals[nv].type = TM_GGUF_TYPE_STRING;
        vals[nv++].v.str = strs[i];
    }
    snprintf(keys[nv], sizeof(keys[nv]), "array.strings");
    vals[nv++] = array_of(TM_GGUF_TYPE_STRING, strs, 4);
    tm_gguf_value inner[3] = {array_of(TM_GGUF_TYPE_INT32, a_i32, 3),
                              array_of(TM_GGUF_TYPE_STRING, strs, 4),
                              array_of(TM_GGUF_TYPE_FLOAT32, NULL, 0)};
    tm_gguf_value mid[2] = {array_of(TM_GGUF_TYPE_ARRAY, inner, 3),
                            array_of(TM_GGUF_TYPE_ARRAY, inner + 1, 1)};
    snprintf(keys[nv], sizeof(keys[nv]), "array.nested2");
    vals[nv++] = array_of(TM_GGUF_TYPE_ARRAY, inner, 3);
    snprintf(keys[nv], sizeof(keys[nv]), "array.nested3");
    vals[nv++] = array_of(TM_GGUF_TYPE_ARRAY, mid, 2);
    assert_true(nv <= N_VALUES);

    tm_gguf_writer *w;
    assert_int_equal(gguf_writer_init(&w, 3, 0), TM_OK);
    for (int i = 0; i < nv; i++) assert_int_equal(gguf_writer_set_value(w, keys[i], &vals[i]), TM_OK);
    assert_int_equal(gguf_writer_set_u32(w, "typed.u32", 123456789u), TM_OK);
    assert_int_equal(gguf_writer_set_i32(w, "typed.i32", -5), TM_OK);
    assert_int_equal(gguf_writer_set_u64(w, "typed.u64", 1ull << 40), TM_OK);
    assert_int_equal(gguf_writer_set_f32(w, "typed.f32", 0.25f), TM_OK);
    assert_int_equal(gguf_writer_set_bool(w, "typed.bool", true), TM_OK);
    assert_int_equal(gguf_writer_set_str(w, "typed.str", "héllo"), TM_OK);
    const char *cstrs[] = {"x", "", "ÿ"};
    assert_int_equal(gguf_writer_set_array(w, "typed.strs", TM_GGUF_TYPE_STRING, cstrs, 3), TM_OK);
    assert_int_equal(gguf_writer_set_array(w, "typed.u32s", TM_GGUF_TYPE_UINT32, a_u32, 3), TM_OK);
    const char *path = tmp_path("values.gguf");
    assert_int_equal(gguf_writer_begin(w, path), TM_OK);
    assert_int_equal(gguf_writer_finish(w), TM_OK);
    gguf_writer_free(w);
    assert_false(file_exists(tmp_path("values.gguf.tmp")));

    tm_gguf_file *f;
    assert_int_equal(gguf_file_open(path, &f), TM_OK);
    assert_int_equal(f->version, 3);
    assert_int_equal(f->alignment, 32);
    assert_int_equal(f->n_kv, (uint64_t)nv + 8);
    assert_int_equal(f->n_tensors, 0);
    for (int i = 0; i < nv; i++) {
        const tm_gguf_kv *kv = gguf_file_find_kv(f, keys[i]);
        assert_non_null(kv);
        assert_ptr_equal(kv, &f->kv[i]); /* order kept */
        if (!value_equal(&kv->value, &vals[i])) fail_msg("value of '%s' differs after round trip", keys[i]);
    }
    uint32_t u32v;
    uint64_t u64v;
    float f32v;
    bool bv;
    tm_gguf_str sv;
    const tm_gguf_array *av;
    assert_int_equal(gguf_file_get_u32(f, "typed.u32", &u32v), TM_OK);
    assert_int_equal(u32v, 123456789u);
    assert_int_equal(gguf_file_get_u64(f, "typed.u64", &u64v), TM_OK);
    assert_int_equal(u64v, 1ull << 40);
    assert_int_equal(gguf_file_get_u64(f, "scalar.uint8", &u64v), TM_OK); /* any integer that fits */
    assert_int_equal(u64v, 250);
    assert_int_equal(gguf_file_get_u32(f, "typed.i32", &u32v), TM_ERR_FORMAT); /* negative */
    assert_non_null(strstr(tm_error_message(), "typed.i32"));
    assert_int_equal(gguf_file_get_u32(f, "scalar.uint64", &u32v), TM_ERR_FORMAT); /* too big */
    assert_int_equal(gguf_file_get_f32(f, "typed.f32", &f32v), TM_OK);
    assert_true(f32v == 0.25f);
    assert_int_equal(gguf_file_get_f32(f, "scalar.float64", &f32v), TM_OK);
    assert_true(f32v == (float)(1.0 / 3.0));
    assert_int_equal(gguf_file_get_bool(f, "typed.bool", &bv), TM_OK);
    assert_true(bv);
    assert_int_equal(gguf_file_get_str(f, "typed.str", &sv), TM_OK);
    assert_true(gguf_str_eq(sv, "héllo"));
    assert_int_equal(gguf_file_get_str(f, "typed.u32", &sv), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "typed.u32"));
    assert_int_equal(gguf_file_get_str(f, "no.such.key", &sv), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "no.such.key"));
    assert_int_equal(gguf_file_get_array(f, "typed.strs", &av), TM_OK);
    assert_int_equal(av->n, 3);
    assert_true(gguf_str_eq(gguf_array_get_str(av, 2), "ÿ"));
    assert_true(gguf_str_eq(gguf_array_get_str(av, 1), ""));
    assert_int_equal(gguf_file_get_array(f, "array.int16", &av), TM_OK);
    assert_int_equal(gguf_array_get_i32(av, 0), -32768);
    assert_int_equal(gguf_file_get_array(f, "array.uint32", &av), TM_OK);
    assert_int_equal(gguf_array_get_u32(av, 1), 4000000000u);
    assert_int_equal(gguf_file_get_array(f, "array.float32", &av), TM_OK);
    assert_true(gguf_array_get_f32(av, 0) == 0.1f);
    assert_null(gguf_file_find_kv(f, "scalar"));
    gguf_file_close(f);
}

/* ---- tensor round trip ---- */

typedef struct tensor_spec {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
} tensor_spec;

static const tensor_spec tspecs[] = {
    {"f32.1d", TM_TYPE_F32, 1, {7, 1, 1, 1}},
    {"f16.2d", TM_TYPE_F16, 2, {5, 3, 1, 1}},
    {"q8_0.2d", TM_TYPE_Q8_0, 2, {64, 2, 1, 1}},
    {"blk.0.ffn_up_exps.weight", TM_TYPE_Q4_K, 3, {256, 2, 4, 1}},
    {"bf16.4d", TM_TYPE_BF16, 4, {3, 1, 2, 2}},
    {"i8.1d", TM_TYPE_I8, 1, {1, 1, 1, 1}},
    {"mxfp4.2d", TM_TYPE_MXFP4, 2, {32, 3, 1, 1}},
    {"q6_k.1d", TM_TYPE_Q6_K, 1, {512, 1, 1, 1}},
};
#define N_TSPECS (sizeof(tspecs) / sizeof(tspecs[0]))

static uint8_t pattern_byte(size_t t, uint64_t i) { return (uint8_t)(i * 31u + t * 17u + (i >> 8)); }

static void write_tensor_file(const char *path, uint64_t alignment, size_t chunk) {
    tm_gguf_writer *w;
    assert_int_equal(gguf_writer_init(&w, 0, alignment), TM_OK);
    assert_int_equal(gguf_writer_set_str(w, "general.architecture", "test"), TM_OK);
    uint64_t total = 0;
    for (size_t t = 0; t < N_TSPECS; t++) {
        uint64_t idx;
        assert_int_equal(gguf_writer_add_tensor(w, tspecs[t].name, tspecs[t].type, tspecs[t].n_dims,
                                                tspecs[t].ne, &idx),
                         TM_OK);
        assert_int_equal(idx, t);
    }
    assert_int_equal(gguf_writer_begin(w, path), TM_OK);
    /* all tensors' bytes, then stream them in `chunk`-sized pieces across boundaries */
    uint8_t *all = NULL;
    for (size_t t = 0; t < N_TSPECS; t++) {
        int64_t n = 1;
        for (uint32_t d = 0; d < tspecs[t].n_dims; d++) n *= tspecs[t].ne[d];
        const tm_type_traits *tr = quant_type_traits(tspecs[t].type);
        uint64_t nb = (uint64_t)(n / tr->block_size) * tr->type_size;
        all = realloc(all, total + nb);
        for (uint64_t i = 0; i < nb; i++) all[total + i] = pattern_byte(t, i);
        total += nb;
    }
    for (uint64_t off = 0; off < total; off += chunk) {
        size_t c = total - off < chunk ? (size_t)(total - off) : chunk;
        assert_int_equal(gguf_writer_write_data(w, all + off, c), TM_OK);
    }
    free(all);
    assert_int_equal(gguf_writer_finish(w), TM_OK);
    gguf_writer_free(w);
}

static void check_tensor_file(const char *path, uint64_t alignment) {
    tm_gguf_file *f;
    assert_int_equal(gguf_file_open(path, &f), TM_OK);
    assert_int_equal(f->alignment, alignment);
    const tm_gguf_kv *ak = gguf_file_find_kv(f, "general.alignment");
    if (alignment == TM_GGUF_DEFAULT_ALIGNMENT) {
        assert_null(ak);
    } else {
        assert_non_null(ak);
        assert_int_equal(ak->value.type, TM_GGUF_TYPE_UINT32);
        assert_int_equal(ak->value.v.u32, alignment);
    }
    assert_int_equal(f->data_offset % alignment, 0);
    assert_int_equal(f->n_tensors, N_TSPECS);
    for (size_t t = 0; t < N_TSPECS; t++) {
        const tm_gguf_tensor *ft = gguf_file_find_tensor(f, tspecs[t].name);
        assert_ptr_equal(ft, &f->tensors[t]);
        assert_int_equal(gguf_file_find_tensor_index(f, tspecs[t].name), (int64_t)t);
        assert_true(gguf_str_eq(ft->name, tspecs[t].name));
        assert_int_equal(ft->type, tspecs[t].type);
        assert_int_equal(ft->n_dims, tspecs[t].n_dims);
        int64_t n = 1;
        for (int d = 0; d < 4; d++) {
            int64_t want = d < (int)tspecs[t].n_dims ? tspecs[t].ne[d] : 1;
            assert_int_equal(ft->ne[d], want);
            n *= want;
        }
        assert_int_equal(ft->n_elements, n);
        const tm_type_traits *tr = quant_type_traits(tspecs[t].type);
        assert_int_equal(ft->n_bytes, (uint64_t)(n / tr->block_size) * tr->type_size);
        assert_int_equal(ft->offset % alignment, 0);
        assert_int_equal(ft->file_offset, f->data_offset + ft->offset);
        assert_ptr_equal(ft->data, f->map + ft->file_offset);
        for (uint64_t i = 0; i < ft->n_bytes; i++)
            if (((const uint8_t *)ft->data)[i] != pattern_byte(t, i))
                fail_msg("tensor %s byte %llu differs", tspecs[t].name, (unsigned long long)i);
    }
    assert_null(gguf_file_find_tensor(f, "missing"));
    assert_int_equal(gguf_file_find_tensor_index(f, "f32"), -1);

    /* copy: the writer reproduces the file byte for byte */
    const char *copy = tmp_path("copy.gguf");
    assert_int_equal(gguf_file_copy(f, copy), TM_OK);
    gguf_file_close(f);
    size_t n1 = 0, n2 = 0;
    uint8_t *a = read_all(path, &n1), *b = read_all(copy, &n2);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    /* the buffer reader sees the same file */
    assert_int_equal(gguf_file_open_buffer(a, n1, "buf", &f), TM_OK);
    assert_int_equal(f->n_tensors, N_TSPECS);
    assert_ptr_equal(f->tensors[0].data, a + f->tensors[0].file_offset);
    gguf_file_close(f);
    free(a);
    free(b);
}

static void test_roundtrip_tensors_align32(void **state) {
    (void)state;
    write_tensor_file(tmp_path("t32.gguf"), 32, 7);
    check_tensor_file(tmp_path("t32.gguf"), 32);
}

static void test_roundtrip_tensors_align64(void **state) {
    (void)state;
    write_tensor_file(tmp_path("t64.gguf"), 64, 1000);
    check_tensor_file(tmp_path("t64.gguf"), 64);
}

static void test_alignment_key_sets_alignment(void **state) {
    (void)state;
    tm_gguf_writer *w;
    assert_int_equal(gguf_writer_init(&w, 2, 0), TM_OK);
    assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 128), TM_OK);
    int64_t ne[1] = {3};
    assert_int_equal(gguf_writer_add_tensor(w, "a", TM_TYPE_F32, 1, ne, NULL), TM_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "b", TM_TYPE_F32, 1, ne, NULL), TM_OK);
    assert_int_equal(gguf_writer_begin(w, tmp_path("a128.gguf")), TM_OK);
    float d[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(gguf_writer_write_data(w, d, sizeof(d)), TM_OK); /* spans both tensors */
    assert_int_equal(gguf_writer_finish(w), TM_OK);
    gguf_writer_free(w);
    tm_gguf_file *f;
    assert_int_equal(gguf_file_open(tmp_path("a128.gguf"), &f), TM_OK);
    assert_int_equal(f->version, 2);
    assert_int_equal(f->alignment, 128);
    assert_int_equal(f->n_kv, 1);
    assert_int_equal(f->tensors[1].offset, 128);
    assert_true(((const float *)f->tensors[1].data)[2] == 6.0f);
    gguf_file_close(f);
}

/* ~600 tensors and ~40 keys, like a 48-layer MoE model: every name is found. */
static void test_lookup_many(void **state) {
    (void)state;
    tm_gguf_writer *w;
    char name[64];
    assert_int_equal(gguf_writer_init(&w, 3, 0), TM_OK);
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof(name), "qwen3moe.key.%d", i);
        assert_int_equal(gguf_writer_set_u32(w, name, (uint32_t)i), TM_OK);
    }
    int64_t ne[2] = {32, 1};
    for (int i = 0; i < 600; i++) {
        snprintf(name, sizeof(name), "blk.%d.ffn_gate_exps.weight", i);
        assert_int_equal(gguf_writer_add_tensor(w, name, TM_TYPE_Q8_0, 2, ne, NULL), TM_OK);
    }
    assert_int_equal(gguf_writer_begin(w, tmp_path("many.gguf")), TM_OK);
    uint8_t blk[34] = {0};
    for (int i = 0; i < 600; i++) {
        blk[0] = (uint8_t)i;
        assert_int_equal(gguf_writer_write_data(w, blk, sizeof(blk)), TM_OK);
    }
    assert_int_equal(gguf_writer_finish(w), TM_OK);
    gguf_writer_free(w);
    tm_gguf_file *f;
    assert_int_equal(gguf_file_open(tmp_path("many.gguf"), &f), TM_OK);
    for (int i = 0; i < 600; i++) {
        snprintf(name, sizeof(name), "blk.%d.ffn_gate_exps.weight", i);
        const tm_gguf_tensor *t = gguf_file_find_tensor(f, name);
        assert_non_null(t);
        assert_int_equal(((const uint8_t *)t->data)[0], (uint8_t)i);
    }
    for (int i = 0; i < 40; i++) {
        uint32_t v;
        snprintf(name, sizeof(name), "qwen3moe.key.%d", i);
        assert_int_equal(gguf_file_get_u32(f, name, &v), TM_OK);
        assert_int_equal(v, i);
    }
    assert_null(gguf_file_find_tensor(f, "blk.600.ffn_gate_exps.weight"));
    gguf_file_close(f);
}

/* ---- writer errors ---- */

static void test_writer_rejects(void **state) {
    (void)state;
    tm_gguf_writer *w;
    assert_int_equal(gguf_writer_init(&w, 1, 0), TM_ERR_ARG);
    assert_int_equal(gguf_writer_init(&w, 3, 48), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "alignment"));
    assert_int_equal(gguf_writer_init(&w, 3, 0), TM_OK);
    assert_int_equal(gguf_writer_set_u32(w, "k", 1), TM_OK);
    assert_int_equal(gguf_writer_set_u32(w, "k", 2), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "duplicate key"));
    assert_int_equal(gguf_writer_set_u32(w, "", 2), TM_ERR_ARG);
    assert_int_equal(gguf_writer_set_u32(w, "general.alignment", 48), TM_ERR_ARG);
    assert_int_equal(gguf_writer_set_str(w, "general.alignment", "32"), TM_ERR_ARG);
    tm_gguf_value bad_nest[TM_GGUF_MAX_ARRAY_DEPTH + 1];
    bad_nest[TM_GGUF_MAX_ARRAY_DEPTH] = array_of(TM_GGUF_TYPE_UINT8, NULL, 0);
    for (int i = TM_GGUF_MAX_ARRAY_DEPTH - 1; i >= 0; i--)
        bad_nest[i] = array_of(TM_GGUF_TYPE_ARRAY, &bad_nest[i + 1], 1);
    assert_int_equal(gguf_writer_set_value(w, "deep", &bad_nest[0]), TM_ERR_ARG); /* 9 levels */
    assert_non_null(strstr(tm_error_message(), "nested"));
    assert_int_equal(gguf_writer_set_value(w, "deep", &bad_nest[1]), TM_OK); /* 8 levels */
    int64_t ne[4] = {32, 2, 1, 1};
    assert_int_equal(gguf_writer_add_tensor(w, "t", TM_TYPE_Q8_0, 2, ne, NULL), TM_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "t", TM_TYPE_Q8_0, 2, ne, NULL), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "duplicate tensor"));
    assert_int_equal(gguf_writer_add_tensor(w, "u", TM_TYPE_Q4_K, 2, ne, NULL), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "ne[0]"));
    assert_int_equal(gguf_writer_add_tensor(w, "u", 33, 2, ne, NULL), TM_ERR_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "u", TM_TYPE_F32, 0, ne, NULL), TM_ERR_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "u", TM_TYPE_F32, 5, ne, NULL), TM_ERR_ARG);
    assert_int_equal(gguf_writer_add_tensor(w, "", TM_TYPE_F32, 1, ne, NULL), TM_ERR_ARG);
    int64_t big[2] = {INT64_MAX / 2, 3};
    assert_int_equal(gguf_writer_add_tensor(w, "u", TM_TYPE_F32, 2, big, NULL), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "overflow"));
    assert_int_equal(gguf_writer_write_data(w, "x", 1), TM_ERR_ARG); /* before begin */

    /* missing data: finish fails, nothing is left behind */
    const char *path = tmp_path("short.gguf");
    unlink(path);
    assert_int_equal(gguf_writer_begin(w, path), TM_OK);
    assert_true(file_exists(tmp_path("short.gguf.tmp")));
    assert_int_equal(gguf_writer_set_u32(w, "late", 1), TM_ERR_ARG); /* after begin */
    assert_int_equal(gguf_writer_write_data(w, ne, 10), TM_OK);
    assert_int_equal(gguf_writer_finish(w), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "'t'"));
    assert_false(file_exists(path));
    assert_false(file_exists(tmp_path("short.gguf.tmp")));
    gguf_writer_free(w);

    /* too much data */
    assert_int_equal(gguf_writer_init(&w, 3, 0), TM_OK);
    assert_int_equal(gguf_writer_add_tensor(w, "t", TM_TYPE_F32, 1, ne, NULL), TM_OK);
    assert_int_equal(gguf_writer_begin(w, path), TM_OK);
    uint8_t zeros[200] = {0};
    assert_int_equal(gguf_writer_write_data(w, zeros, sizeof(zeros)), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "beyond"));
    gguf_writer_free(w);
    assert_false(file_exists(tmp_path("short.gguf.tmp")));
    assert_false(file_exists(path));

    /* unwritable location */
    assert_int_equal(gguf_writer_init(&w, 3, 0), TM_OK);
    assert_int_equal(gguf_writer_begin(w, "/nonexistent-dir/x.gguf"), TM_ERR_IO);
    assert_non_null(strstr(tm_error_message(), "/nonexistent-dir/x.gguf.tmp"));
    gguf_writer_free(w);
}

/* A write that fails part way (file size limit, like a full disk): an I/O
 * error naming the file and offset, and no file under either name. */
static void test_writer_short_write(void **state) {
    (void)state;
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    tm_gguf_writer *w;
    assert_int_equal(gguf_writer_init(&w, 3, 0), TM_OK);
    int64_t ne[1] = {1 << 20};
    assert_int_equal(gguf_writer_add_tensor(w, "big", TM_TYPE_F32, 1, ne, NULL), TM_OK);
    const char *path = tmp_path("full.gguf");
    unlink(path);
    lim = old;
    lim.rlim_cur = 100000;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    tm_status st = gguf_writer_begin(w, path);
    uint8_t *data = calloc(1, 4u << 20);
    if (st == TM_OK) st = gguf_writer_write_data(w, data, 4u << 20);
    if (st == TM_OK) st = gguf_writer_finish(w);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    free(data);
    assert_int_equal(st, TM_ERR_IO);
    assert_non_null(strstr(tm_error_message(), "full.gguf.tmp"));
    assert_non_null(strstr(tm_error_message(), "write failed"));
    assert_int_equal(gguf_writer_finish(w), TM_ERR_ARG); /* stays failed */
    gguf_writer_free(w);
    assert_false(file_exists(path));
    assert_false(file_exists(tmp_path("full.gguf.tmp")));
}

/* ---- reader validation: one bad buffer per rule ---- */

static void test_bad_header(void **state) {
    (void)state;
    bb b = {0};
    bb_u32(&b, 0x46554746); /* "FGUF" */
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 0);
    expect_bad_at(&b, "bad_magic", TM_ERR_FORMAT, "magic", "byte offset 0");
    bb_header(&b, 1, 0, 0);
    expect_bad_at(&b, "version1", TM_ERR_UNSUPPORTED, "version 1", "byte offset 4");
    bb_header(&b, 4, 0, 0);
    expect_bad_at(&b, "version4", TM_ERR_UNSUPPORTED, "version", "got 4");
    bb_header(&b, 0x03000000, 0, 0);
    expect_bad_at(&b, "big_endian", TM_ERR_UNSUPPORTED, "big-endian", NULL);
    bb_raw(&b, "GG", 2);
    expect_bad_at(&b, "short_magic", TM_ERR_FORMAT, "magic", "truncated");
    bb_header(&b, 3, 0, 0);
    b.n -= 1;
    expect_bad_at(&b, "short_header", TM_ERR_FORMAT, "kv count", "truncated");
    bb_header(&b, 3, 0, 1000);
    bb_kv_u32(&b, "a", 1);
    expect_bad_at(&b, "kv_count_huge", TM_ERR_FORMAT, "kv count", "bytes left");
    bb_header(&b, 3, UINT64_MAX / 2, 0);
    expect_bad_at(&b, "tensor_count_huge", TM_ERR_FORMAT, "tensor count", "bytes left");
    tm_gguf_file *f;
    assert_int_equal(gguf_file_open_buffer(NULL, 0, "empty", &f), TM_ERR_FORMAT);
}

static void test_bad_kv(void **state) {
    (void)state;
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1ull << 40); /* key length past the end */
    bb_raw(&b, "abc", 3);
    bb_zeros(&b, 16);
    expect_bad_at(&b, "key_len_past_eof", TM_ERR_FORMAT, "key", "string length");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "");
    bb_u32(&b, TM_GGUF_TYPE_UINT8);
    bb_u8(&b, 1);
    bb_zeros(&b, 16);
    expect_bad_at(&b, "key_empty", TM_ERR_FORMAT, "key", "non-empty");

    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 3);
    bb_raw(&b, "a\0b", 3);
    bb_u32(&b, TM_GGUF_TYPE_UINT8);
    bb_u8(&b, 1);
    expect_bad_at(&b, "key_nul", TM_ERR_FORMAT, "key", "NUL");

    bb_header(&b, 3, 0, 2);
    bb_kv_u32(&b, "general.name", 1);
    bb_kv_u32(&b, "general.name", 2);
    expect_bad_at(&b, "key_duplicate", TM_ERR_FORMAT, "general.name", "duplicate key");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, 13);
    bb_u64(&b, 0);
    expect_bad_at(&b, "value_type_unknown", TM_ERR_FORMAT, "value type", "got 13");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, TM_GGUF_TYPE_STRING);
    bb_u64(&b, 100);
    bb_raw(&b, "short", 5);
    expect_bad_at(&b, "string_len_past_eof", TM_ERR_FORMAT, "'k'", "string length 100");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, TM_GGUF_TYPE_UINT64);
    bb_u32(&b, 7); /* 4 of 8 bytes */
    bb_u8(&b, 0);
    bb_u8(&b, 0);
    expect_bad_at(&b, "scalar_truncated", TM_ERR_FORMAT, "uint64", "truncated");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, TM_GGUF_TYPE_BOOL);
    bb_u8(&b, 2);
    expect_bad_at(&b, "bool_not_01", TM_ERR_FORMAT, "bool", "got 2");

    const uint32_t elem[] = {TM_GGUF_TYPE_UINT32, TM_GGUF_TYPE_STRING, TM_GGUF_TYPE_ARRAY};
    const char *names[] = {"array_u32_count_huge", "array_str_count_huge", "array_arr_count_huge"};
    for (int i = 0; i < 3; i++) {
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "tokenizer.ggml.tokens");
        bb_u32(&b, TM_GGUF_TYPE_ARRAY);
        bb_u32(&b, elem[i]);
        bb_u64(&b, 1ull << 61); /* would be 16 EiB of tm_gguf_str if trusted */
        bb_zeros(&b, 64);
        expect_bad_at(&b, names[i], TM_ERR_FORMAT, "array length", "tokenizer.ggml.tokens");
    }

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, TM_GGUF_TYPE_ARRAY);
    bb_u32(&b, 99);
    bb_u64(&b, 0);
    expect_bad_at(&b, "array_elem_type_unknown", TM_ERR_FORMAT, "array element type", "got 99");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k");
    bb_u32(&b, TM_GGUF_TYPE_ARRAY);
    bb_u32(&b, TM_GGUF_TYPE_BOOL);
    bb_u64(&b, 3);
    bb_u8(&b, 1);
    bb_u8(&b, 0);
    bb_u8(&b, 7);
    expect_bad_at(&b, "array_bool_not_01", TM_ERR_FORMAT, "bool", "got 7");

    /* nesting: 8 levels are fine, 9 are refused */
    for (int levels = 8; levels <= 9; levels++) {
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "deep");
        bb_u32(&b, TM_GGUF_TYPE_ARRAY);
        for (int l = 1; l < levels; l++) {
            bb_u32(&b, TM_GGUF_TYPE_ARRAY);
            bb_u64(&b, 1);
        }
        bb_u32(&b, TM_GGUF_TYPE_UINT8);
        bb_u64(&b, 0);
        if (levels == 8) {
            tm_gguf_file *f;
            assert_int_equal(gguf_file_open_buffer(b.p, b.n, "deep8", &f), TM_OK);
            gguf_file_close(f);
            free(b.p);
            memset(&b, 0, sizeof(b));
        } else {
            expect_bad_at(&b, "array_nesting_too_deep", TM_ERR_FORMAT, "nesting", "'deep'");
        }
    }

    /* general.alignment: must be a uint32 power of two */
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    expect_bad_at(&b, "alignment_not_pow2", TM_ERR_FORMAT, "general.alignment", "power of two");
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 0);
    expect_bad_at(&b, "alignment_zero", TM_ERR_FORMAT, "general.alignment", "power of two");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, TM_GGUF_TYPE_UINT64);
    bb_u64(&b, 64);
    expect_bad_at(&b, "alignment_not_u32", TM_ERR_FORMAT, "general.alignment", "uint32");
}

/* A header with one kv, then tensor infos from the caller. */
static void bb_start_tensors(bb *b, uint64_t n_tensors) {
    bb_header(b, 3, n_tensors, 1);
    bb_str(b, "general.architecture");
    bb_u32(b, TM_GGUF_TYPE_STRING);
    bb_str(b, "test");
}

static void test_bad_tensors(void **state) {
    (void)state;
    bb b = {0};
    int64_t ne[4] = {32, 2, 1, 1};

    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 2, ne, 200, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_bad_at(&b, "tensor_type_unknown", TM_ERR_UNSUPPORTED, "type", "got 200");

    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 0, ne, TM_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_bad_at(&b, "tensor_n_dims_0", TM_ERR_FORMAT, "n_dims", "got 0");

    bb_start_tensors(&b, 1);
    bb_str(&b, "t");
    bb_u32(&b, 5);
    for (int i = 0; i < 5; i++) bb_u64(&b, 1);
    bb_u32(&b, TM_TYPE_F32);
    bb_u64(&b, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    expect_bad_at(&b, "tensor_n_dims_5", TM_ERR_FORMAT, "n_dims", "got 5");

    int64_t zero[2] = {32, 0}, neg[2] = {32, -4};
    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 2, zero, TM_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_bad_at(&b, "tensor_dim_zero", TM_ERR_FORMAT, "ne[1]", "at least 1");
    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 2, neg, TM_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_bad_at(&b, "tensor_dim_negative", TM_ERR_FORMAT, "ne[1]", "got -4");

    int64_t huge[4] = {1ll << 32, 1ll << 32, 1, 1};
    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 2, huge, TM_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    expect_bad_at(&b, "tensor_dims_overflow", TM_ERR_FORMAT, "ne[1]", "overflow");
    int64_t bytes_ovf[2] = {1ll << 62, 1}; /* elements fit, f32 bytes do not */
    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 2, bytes_ovf, TM_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    expect_bad_at(&b, "tensor_bytes_overflow", TM_ERR_FORMAT, "overflow", "'t'");

    int64_t odd[2] = {100, 2};
    bb_start_tensors(&b, 1);
    bb_tensor(&b, "blk.0.ffn_down_exps.weight", 2, odd, TM_TYPE_Q4_K, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 512);
    expect_bad_at(&b, "tensor_ne0_not_block_multiple", TM_ERR_FORMAT, "ne[0]", "block size 256");

    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 2, ne, TM_TYPE_F32, 16);
    bb_pad(&b, 32);
    bb_zeros(&b, 512);
    expect_bad_at(&b, "tensor_offset_misaligned", TM_ERR_FORMAT, "offset", "multiple of the alignment 32");

    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 2, ne, TM_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 255); /* needs 256 */
    expect_bad_at(&b, "tensor_data_past_eof", TM_ERR_FORMAT, "'t'", "past the end");

    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 2, ne, TM_TYPE_F32, 0xffffffffffffffe0ull); /* aligned, offset+base wraps */
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_bad_at(&b, "tensor_offset_wraps", TM_ERR_FORMAT, "'t'", "past the end");

    bb_start_tensors(&b, 2);
    bb_tensor(&b, "a", 2, ne, TM_TYPE_F32, 0);   /* [0, 256) */
    bb_tensor(&b, "b", 2, ne, TM_TYPE_F32, 224); /* [224, 480) */
    bb_pad(&b, 32);
    bb_zeros(&b, 512);
    expect_bad_at(&b, "tensor_overlap", TM_ERR_FORMAT, "overlaps", "'a'");

    bb_start_tensors(&b, 2);
    bb_tensor(&b, "a", 2, ne, TM_TYPE_F32, 0);
    bb_tensor(&b, "a", 2, ne, TM_TYPE_F32, 256);
    bb_pad(&b, 32);
    bb_zeros(&b, 512);
    expect_bad_at(&b, "tensor_name_duplicate", TM_ERR_FORMAT, "duplicate tensor name", "'a'");

    bb_start_tensors(&b, 1);
    bb_tensor(&b, "", 2, ne, TM_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_bad_at(&b, "tensor_name_empty", TM_ERR_FORMAT, "name", "non-empty");

    bb_start_tensors(&b, 1);
    bb_str(&b, "a.long.tensor.name.so.the.count.check.passes");
    bb_u32(&b, 2);
    bb_u64(&b, 32); /* the second dim and everything after is missing */
    expect_bad_at(&b, "tensor_info_truncated", TM_ERR_FORMAT, "ne", "truncated");

    bb_start_tensors(&b, 1);
    bb_tensor(&b, "t", 1, ne, TM_TYPE_F32, 0);
    expect_bad_at(&b, "data_section_past_eof", TM_ERR_FORMAT, "data section", NULL);

    /* alignment from the key governs offsets */
    bb_header(&b, 3, 1, 1);
    bb_kv_u32(&b, "general.alignment", 64);
    bb_tensor(&b, "t", 1, ne, TM_TYPE_F32, 32);
    bb_pad(&b, 64);
    bb_zeros(&b, 256);
    expect_bad_at(&b, "tensor_offset_misaligned_64", TM_ERR_FORMAT, "offset", "alignment 64");
}

/* Every proper prefix of a valid file that cuts into needed bytes fails cleanly. */
static void test_truncation_anywhere(void **state) {
    (void)state;
    size_t n = 0;
    uint8_t *p = read_all(tmp_path("t32.gguf"), &n);
    if (!p) { /* the tensor round trip test writes it; make it here when run alone */
        write_tensor_file(tmp_path("t32.gguf"), 32, 7);
        p = read_all(tmp_path("t32.gguf"), &n);
    }
    assert_non_null(p);
    tm_gguf_file *f;
    assert_int_equal(gguf_file_open_buffer(p, n, "full", &f), TM_OK);
    uint64_t needed = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].file_offset + f->tensors[i].n_bytes > needed)
            needed = f->tensors[i].file_offset + f->tensors[i].n_bytes;
    gguf_file_close(f);
    for (size_t len = 0; len < n; len++) {
        tm_status st = open_exact(p, len, "prefix", &f);
        if (len < needed) {
            if (st != TM_ERR_FORMAT || f)
                fail_msg("prefix of %zu bytes: status %s (%s)", len, tm_status_name(st), tm_error_message());
            if (!strstr(tm_error_message(), "prefix: byte offset"))
                fail_msg("prefix of %zu bytes: message lacks file and offset: %s", len, tm_error_message());
        } else { /* only the last tensor's trailing padding is missing */
            assert_int_equal(st, TM_OK);
            gguf_file_close(f);
        }
    }
    free(p);
}

static void test_open_errors(void **state) {
    (void)state;
    tm_gguf_file *f = (tm_gguf_file *)1;
    assert_int_equal(gguf_file_open(tmp_path("does-not-exist.gguf"), &f), TM_ERR_IO);
    assert_null(f);
    assert_non_null(strstr(tm_error_message(), "does-not-exist.gguf"));
    assert_int_equal(gguf_file_open(tmp_dir, &f), TM_ERR_IO);
    FILE *fp = fopen(tmp_path("empty.gguf"), "wb");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(gguf_file_open(tmp_path("empty.gguf"), &f), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "empty.gguf"));
}

/* ---- regression inputs ---- */

static int feed_dir(const char *dir, int must_fail) {
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s: %s", dir, strerror(errno));
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        size_t n = 0;
        uint8_t *p = read_all(path, &n);
        if (!p) continue;
        tm_gguf_file *f = NULL;
        tm_status st = open_exact(p, n, e->d_name, &f);
        if (must_fail && st == TM_OK) fail_msg("%s: expected the reader to reject it", path);
        if (st == TM_OK) {
            for (uint64_t i = 0; i < f->n_tensors; i++) /* touch the data the reader vouched for */
                assert_true(f->tensors[i].file_offset + f->tensors[i].n_bytes <= n);
            gguf_file_close(f);
        } else {
            if (!strstr(tm_error_message(), e->d_name))
                fail_msg("%s: message does not name the file: %s", path, tm_error_message());
            tm_status st2 = gguf_file_open(path, &f); /* the mmap path agrees */
            if (st2 != st) fail_msg("%s: open gives %s, open_buffer %s", path, tm_status_name(st2), tm_status_name(st));
        }
        free(p);
        count++;
    }
    closedir(d);
    return count;
}

static void test_regression_inputs(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    if (!data) data = "tests/data";
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/gguf_bad", data);
    int bad = feed_dir(dir, 1);
    snprintf(dir, sizeof(dir), "%s/../../fuzz/corpus/gguf", data);
    int corpus = feed_dir(dir, 0);
    print_message("fed %d bad files and %d corpus files\n", bad, corpus);
    assert_true(bad > 0 && corpus > 0);
}

int main(void) {
    const char *t = getenv("TM_TEST_TMP");
    if (t) mkdir(t, 0755);
    snprintf(tmp_dir, sizeof(tmp_dir), "%s/gguf_tmp", t ? t : "/tmp");
    mkdir(tmp_dir, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_values),
        cmocka_unit_test(test_roundtrip_tensors_align32),
        cmocka_unit_test(test_roundtrip_tensors_align64),
        cmocka_unit_test(test_alignment_key_sets_alignment),
        cmocka_unit_test(test_lookup_many),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_writer_short_write),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_bad_kv),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_truncation_anywhere),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_regression_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
