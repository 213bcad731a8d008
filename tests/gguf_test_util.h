/* Helpers shared by the GGUF tests (test_gguf.c: round trips and the writer;
 * test_gguf_bad.c: validation of bad input): a temporary folder, a byte
 * builder for hand-made files, and a file of several tensor types. */
#ifndef TM_TESTS_GGUF_TEST_UTIL_H
#define TM_TESTS_GGUF_TEST_UTIL_H

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

/* Each test program uses some of these. */
#define TM_TEST_HELPER __attribute__((unused)) static

/* ---- helpers ---- */

static char tmp_dir[512];

TM_TEST_HELPER const char *tmp_path(const char *name) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", tmp_dir, name);
    return buf[k];
}

TM_TEST_HELPER int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

TM_TEST_HELPER uint8_t *read_all(const char *path, size_t *n) {
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

/* stderr into a temporary file while a call runs, to check the log. */
__attribute__((unused)) static int capture_fd = -1;
__attribute__((unused)) static FILE *capture_file;
TM_TEST_HELPER void capture_begin(void) {
    fflush(stderr);
    capture_file = tmpfile();
    assert_non_null(capture_file);
    capture_fd = dup(2);
    dup2(fileno(capture_file), 2);
}
TM_TEST_HELPER char *capture_end(void) {
    fflush(stderr);
    dup2(capture_fd, 2);
    close(capture_fd);
    off_t n = lseek(fileno(capture_file), 0, SEEK_END);
    char *s = calloc((size_t)n + 1, 1);
    assert_int_equal(pread(fileno(capture_file), s, (size_t)n, 0), n);
    fclose(capture_file);
    return s;
}

/* A byte builder for hand-made files. */
typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

TM_TEST_HELPER void bb_raw(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
TM_TEST_HELPER void bb_u8(bb *b, uint8_t v) {
    bb_raw(b, &v, 1);
}
TM_TEST_HELPER void bb_u32(bb *b, uint32_t v) {
    bb_raw(b, &v, 4);
}
TM_TEST_HELPER void bb_u64(bb *b, uint64_t v) {
    bb_raw(b, &v, 8);
}
TM_TEST_HELPER void bb_str(bb *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_raw(b, s, strlen(s));
}
TM_TEST_HELPER void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_u32(b, TM_GGUF_MAGIC);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
TM_TEST_HELPER void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, TM_GGUF_TYPE_UINT32);
    bb_u32(b, v);
}
TM_TEST_HELPER void bb_tensor(bb *b, const char *name, uint32_t n_dims, const int64_t *ne,
                              uint32_t type, uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) bb_u64(b, (uint64_t)ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
TM_TEST_HELPER void bb_pad(bb *b, size_t align) {
    while (b->n % align) bb_u8(b, 0);
}
TM_TEST_HELPER void bb_zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_u8(b, 0);
}

/* Open a copy of exactly the buffer's size (so ASan sees any over-read). */
TM_TEST_HELPER tm_status open_exact(const uint8_t *p, size_t n, const char *name,
                                    tm_gguf_file **f) {
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
TM_TEST_HELPER void expect_bad_at(bb *b, const char *name, tm_status want, const char *needle1,
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

TM_TEST_HELPER uint8_t pattern_byte(size_t t, uint64_t i) {
    return (uint8_t)(i * 31u + t * 17u + (i >> 8));
}

TM_TEST_HELPER void write_tensor_file(const char *path, uint64_t alignment, size_t chunk) {
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

/* The tests' temporary folder under $TM_TEST_TMP. */
TM_TEST_HELPER void gguf_test_tmp_init(void) {
    const char *t = getenv("TM_TEST_TMP");
    if (t) mkdir(t, 0755);
    snprintf(tmp_dir, sizeof(tmp_dir), "%s/gguf_tmp", t ? t : "/tmp");
    mkdir(tmp_dir, 0755);
}

#endif
