/* GGUF reader validation: bad input must fail cleanly with a clear message.
 *
 * - One hand-built bad buffer per validation rule, checking the status and
 *   that the message names the file, the field and the byte offset. With
 *   TM_GGUF_EXPORT_BAD=DIR set, each bad buffer is also written to DIR (that
 *   is how tests/data/gguf_bad/ was made).
 * - Every prefix of a valid file (truncation anywhere).
 * - Regression inputs: every file in tests/data/gguf_bad/ must fail cleanly,
 *   every file in fuzz/corpus/gguf/ must not crash (run under ASan+UBSan). */
#include "gguf_test_util.h"

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
    expect_bad_at(&b, "tensor_offset_misaligned", TM_ERR_FORMAT, "offset",
                  "multiple of the alignment 32");

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

/* expect_bad_at plus a third needle (the tensor, the type and the field). */
static void expect_bad3(bb *b, const char *name, tm_status want, const char *n1, const char *n2,
                        const char *n3) {
    tm_gguf_file *f = (tm_gguf_file *)1;
    tm_status st = open_exact(b->p, b->n, name, &f);
    const char *msg = tm_error_message();
    if (st == want && f == NULL && !strstr(msg, n3))
        fail_msg("%s: message \"%s\" does not mention '%s'", name, msg, n3);
    if (st == TM_OK && f) gguf_file_close(f);
    expect_bad_at(b, name, want, n1, n2); /* exports the buffer, checks the rest, frees it */
}

/* The low-bit types (issue 33): a row length that is not a multiple of the
   type's block (32 and 256), data shorter than the type needs, tensors laid out
   for another type's block size, unknown ids between and after the known ones;
   each error names the tensor, the type and the field. */
static void test_bad_lowbit_tensors(void **state) {
    (void)state;
    static const tm_type lowbit[] = {
        TM_TYPE_Q4_1,  TM_TYPE_Q5_0,    TM_TYPE_Q5_1,   TM_TYPE_IQ4_NL,
        TM_TYPE_Q2_K,  TM_TYPE_Q3_K,    TM_TYPE_IQ4_XS, TM_TYPE_IQ3_XXS,
        TM_TYPE_IQ3_S, TM_TYPE_IQ2_XXS, TM_TYPE_IQ2_XS, TM_TYPE_IQ2_S,
        TM_TYPE_IQ1_S, TM_TYPE_IQ1_M,   TM_TYPE_TQ1_0,  TM_TYPE_TQ2_0};
    const char *tname = "blk.0.ffn_up_exps.weight";
    char name[96], blk[64];
    for (size_t i = 0; i < sizeof(lowbit) / sizeof(lowbit[0]); i++) {
        const tm_type_traits *tr = quant_type_traits(lowbit[i]);
        assert_non_null(tr);
        assert_true(tr->block_size == 32 || tr->block_size == 256);
        snprintf(blk, sizeof(blk), "%s's block size %lld", tr->name, (long long)tr->block_size);
        /* half a block more than one block: a multiple of 16, never of the block */
        int64_t odd[3] = {tr->block_size * 3 / 2, 2, 4};
        bb b = {0};
        bb_start_tensors(&b, 1);
        bb_tensor(&b, tname, 3, odd, lowbit[i], 0);
        bb_pad(&b, 32);
        bb_zeros(&b, 4096);
        snprintf(name, sizeof(name), "lowbit_ne0_not_block_multiple_%s", tr->name);
        expect_bad3(&b, name, TM_ERR_FORMAT, "ne[0]", blk, tname);

        /* one byte short of the data the type needs */
        int64_t ne[3] = {tr->block_size * 2, 2, 1};
        uint64_t need = quant_row_size(lowbit[i], ne[0]) * 2;
        bb_start_tensors(&b, 1);
        bb_tensor(&b, tname, 2, ne, lowbit[i], 0);
        bb_pad(&b, 32);
        bb_zeros(&b, need - 1);
        snprintf(name, sizeof(name), "lowbit_data_short_%s", tr->name);
        char what[64];
        snprintf(what, sizeof(what), "%s data of %llu bytes", tr->name, (unsigned long long)need);
        expect_bad3(&b, name, TM_ERR_FORMAT, "past the end", what, tname);
    }

    /* offsets laid out for q4_0 (18-byte blocks) in a file that says q4_1 (20):
       the first tensor's data runs into the second's */
    int64_t ne[2] = {256, 4}; /* 32 blocks: 576 bytes as q4_0, 640 as q4_1 */
    bb b = {0};
    bb_start_tensors(&b, 2);
    bb_tensor(&b, "blk.0.ffn_gate_exps.weight", 2, ne, TM_TYPE_Q4_1, 0);
    bb_tensor(&b, "blk.0.ffn_up_exps.weight", 2, ne, TM_TYPE_Q4_1, 576);
    bb_pad(&b, 32);
    bb_zeros(&b, 1280);
    expect_bad3(&b, "lowbit_sizes_of_another_type", TM_ERR_FORMAT, "overlaps", "q4_1 data",
                "'blk.0.ffn_gate_exps.weight' (q4_1)");

    /* ids ggml removed (4, 5, 31-33, 36-38) and ids past the table */
    static const uint32_t unknown[] = {4, 5, 31, 32, 33, 36, 37, 38, TM_TYPE_COUNT, 0xffffffffu};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        char got[32];
        snprintf(got, sizeof(got), "got %u", unknown[i]);
        snprintf(name, sizeof(name), "lowbit_type_unknown_%u", unknown[i]);
        int64_t ne2[2] = {256, 2};
        bb_start_tensors(&b, 1);
        bb_tensor(&b, tname, 2, ne2, unknown[i], 0);
        bb_pad(&b, 32);
        bb_zeros(&b, 2048);
        expect_bad3(&b, name, TM_ERR_UNSUPPORTED, "type: expected a known ggml type id", got,
                    tname);
    }
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
                fail_msg("prefix of %zu bytes: status %s (%s)", len, tm_status_name(st),
                         tm_error_message());
            if (!strstr(tm_error_message(), "prefix: byte offset"))
                fail_msg("prefix of %zu bytes: message lacks file and offset: %s", len,
                         tm_error_message());
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
        if (!p) fail_msg("%s: cannot read it", path); /* every file is fed, none skipped */
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
            if (st2 != st)
                fail_msg("%s: open gives %s, open_buffer %s", path, tm_status_name(st2),
                         tm_status_name(st));
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
    gguf_test_tmp_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_header),          cmocka_unit_test(test_bad_kv),
        cmocka_unit_test(test_bad_tensors),         cmocka_unit_test(test_bad_lowbit_tensors),
        cmocka_unit_test(test_truncation_anywhere), cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_regression_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
