/* GGUF reader and writer tests: round trips and the writer.
 *
 * - Round trips through the writer and reader: every value type (scalars,
 *   strings incl. empty, non-ASCII and embedded NULs, arrays of every type,
 *   string arrays, nested and empty arrays), tensors of several types and
 *   shapes at alignments 32 and 64 with data streamed in odd chunks,
 *   gguf_file_copy byte identity, lookups on 600 tensors and 40 keys.
 * - Writer errors: duplicates, bad shapes, wrong call order, missing or extra
 *   data, a failing write (RLIMIT_FSIZE), and no file left under the final
 *   name (nor a .tmp) after any failure.
 * Bad input to the reader: test_gguf_bad.c. */
#include "gguf_test_util.h"

/* ---- value round trip ---- */

static int value_equal(const tm_gguf_value *a, const tm_gguf_value *b) {
    if (a->type != b->type) return 0;
    switch (a->type) {
    case TM_GGUF_TYPE_STRING:
        return a->v.str.len == b->v.str.len &&
               (a->v.str.len == 0 || !memcmp(a->v.str.data, b->v.str.data, a->v.str.len));
    case TM_GGUF_TYPE_BOOL:
        return a->v.b == b->v.b;
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
    default:
        return !memcmp(&a->v, &b->v, gguf_value_type_size(a->type));
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
    const tm_gguf_value_type stypes[] = {
        TM_GGUF_TYPE_UINT8,  TM_GGUF_TYPE_INT8,  TM_GGUF_TYPE_UINT16, TM_GGUF_TYPE_INT16,
        TM_GGUF_TYPE_UINT64, TM_GGUF_TYPE_INT64, TM_GGUF_TYPE_FLOAT64};
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
    const void *adata[] = {a_u8,   a_i8, a_u16, a_i16, a_u32, a_i32, a_f32,
                           a_bool, NULL, NULL,  a_u64, a_i64, a_f64};
    const uint64_t an[] = {3, 3, 2, 2, 3, 3, 3, 3, 0, 0, 2, 2, 2};
    for (int t = 0; t < TM_GGUF_TYPE_COUNT; t++) {
        if (!adata[t]) continue;
        snprintf(keys[nv], sizeof(keys[nv]), "array.%s",
                 gguf_value_type_name((tm_gguf_value_type)t));
        vals[nv++] = array_of((tm_gguf_value_type)t, adata[t], an[t]);
    }
    for (int t = 0; t < TM_GGUF_TYPE_COUNT; t++) {
        snprintf(keys[nv], sizeof(keys[nv]), "empty.%s",
                 gguf_value_type_name((tm_gguf_value_type)t));
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
    for (int i = 0; i < nv; i++)
        assert_int_equal(gguf_writer_set_value(w, keys[i], &vals[i]), TM_OK);
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
        if (!value_equal(&kv->value, &vals[i]))
            fail_msg("value of '%s' differs after round trip", keys[i]);
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
    assert_int_equal(gguf_file_get_u64(f, "scalar.uint8", &u64v),
                     TM_OK); /* any integer that fits */
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

int main(void) {
    gguf_test_tmp_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_values),
        cmocka_unit_test(test_roundtrip_tensors_align32),
        cmocka_unit_test(test_roundtrip_tensors_align64),
        cmocka_unit_test(test_alignment_key_sets_alignment),
        cmocka_unit_test(test_lookup_many),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_writer_short_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
