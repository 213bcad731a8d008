/* Routing logs: written by the writer and by the tracer (--routing-log),
 * read back equal; damaged files rejected naming the file and the offset:
 * - random calls (prompt batches and decode steps, several sequences,
 *   expert ids above 255) round-trip through a file;
 * - the tracer writes exactly the calls it was fed, sequence by sequence;
 *   a tracer freed before trace_finish leaves no file;
 * - every truncation of a valid log is an error naming an offset, except at
 *   record boundaries, where the prefix reads as a shorter valid log;
 * - bad magic, version, shape, reserved fields, arch, layer, token count,
 *   expert id, a repeated expert, a call before any sequence marker: each
 *   named with its offset;
 * - a writer fed a bad call fails at close and leaves no file;
 * - the fuzz corpus (fuzz/corpus/trace_log): seeds accepted, the rest handled. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "fuzz_corpus.h"
#include "routing_test_util.h"
#include "trace/trace.h"
#include "trace/trace_log.h"

static void tmp_path(char *buf, size_t n, const char *name) {
    const char *t = getenv("TM_TEST_TMP");
    snprintf(buf, n, "%s/tlog_%s", t && *t ? t : "/tmp", name);
}

static tm_trace_shape shape_of(uint32_t L, uint32_t E, uint32_t k) {
    tm_trace_shape s = {.n_layer = L, .n_expert = E, .n_expert_used = k};
    snprintf(s.arch, sizeof(s.arch), "qwen3moe");
    return s;
}

/* What was written, to compare with what is read: per layer the calls in order. */
typedef struct log_expect {
    uint32_t L, k, n_seq;
    uint64_t n_calls[8];
    uint32_t seq[8][256], n_tok[8][256];
    int32_t *ids[8]; /* concatenated */
    uint64_t n_ids[8];
} log_expect;

static void log_expect_call(log_expect *x, uint32_t l, const int32_t *ids, int64_t n_tok) {
    const uint64_t c = x->n_calls[l]++;
    x->seq[l][c] = x->n_seq - 1, x->n_tok[l][c] = (uint32_t)n_tok;
    x->ids[l] = realloc(x->ids[l], (x->n_ids[l] + (uint64_t)n_tok * x->k) * sizeof(int32_t));
    memcpy(x->ids[l] + x->n_ids[l], ids, (size_t)n_tok * x->k * sizeof(int32_t));
    x->n_ids[l] += (uint64_t)n_tok * x->k;
}

static void log_expect_check(const log_expect *x, const tm_trace_log *log) {
    assert_int_equal(log->n_seq, x->n_seq);
    for (uint32_t l = 0; l < x->L; l++) {
        const tm_trace_log_layer *ly = &log->layers[l];
        assert_int_equal(ly->n_calls, x->n_calls[l]);
        assert_int_equal(ly->n_ids, x->n_ids[l]);
        for (uint64_t c = 0; c < ly->n_calls; c++) {
            assert_int_equal(ly->calls[c].seq, x->seq[l][c]);
            assert_int_equal(ly->calls[c].n_tok, x->n_tok[l][c]);
        }
        if (x->n_ids[l]) assert_memory_equal(ly->ids, x->ids[l], x->n_ids[l] * sizeof(int32_t));
    }
}

static void log_expect_free(log_expect *x) {
    for (uint32_t l = 0; l < x->L; l++) free(x->ids[l]);
}

/* A log of a few sequences: a prompt call per layer, then decode steps. */
static void write_random_log(const char *path, const tm_trace_shape *sh, uint64_t seed,
                             log_expect *x) {
    memset(x, 0, sizeof(*x));
    x->L = sh->n_layer, x->k = sh->n_expert_used;
    tm_trace_log_writer *w;
    assert_int_equal(trace_log_writer_open(path, sh, &w), TM_OK);
    tm_rng r;
    tm_rng_seed(&r, seed);
    int32_t ids[20 * 8];
    for (int s = 0; s < 4; s++) {
        trace_log_writer_sequence(w);
        x->n_seq++;
        const int64_t prompt = 1 + (int64_t)(tm_rng_u64(&r) % 20),
                      dec = (int64_t)(tm_rng_u64(&r) % 12);
        for (uint32_t l = 0; l < sh->n_layer; l++) {
            test_random_ids(&r, ids, prompt, sh->n_expert, sh->n_expert_used);
            trace_log_writer_record(w, l, ids, prompt);
            log_expect_call(x, l, ids, prompt);
        }
        for (int64_t t = 0; t < dec; t++)
            for (uint32_t l = 0; l < sh->n_layer; l++) {
                test_random_ids(&r, ids, 1, sh->n_expert, sh->n_expert_used);
                trace_log_writer_record(w, l, ids, 1);
                log_expect_call(x, l, ids, 1);
            }
    }
    trace_log_writer_sequence(w); /* an empty sequence at the end */
    x->n_seq++;
    assert_int_equal(trace_log_writer_close(w, true), TM_OK);
}

static void test_round_trip(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "round.bin");
    const tm_trace_shape shapes[2] = {shape_of(3, 40, 5), shape_of(2, 300, 8)};
    for (int i = 0; i < 2; i++) {
        log_expect x;
        write_random_log(path, &shapes[i], 10 + (uint64_t)i, &x);
        tm_trace_log log;
        assert_int_equal(trace_log_read(path, &log), TM_OK);
        assert_string_equal(log.shape.arch, "qwen3moe");
        assert_int_equal(log.shape.n_layer, shapes[i].n_layer);
        assert_int_equal(log.shape.n_expert, shapes[i].n_expert);
        assert_int_equal(log.shape.n_expert_used, shapes[i].n_expert_used);
        log_expect_check(&x, &log);
        trace_log_free(&log);
        log_expect_free(&x);
    }
    remove(path);
}

static void test_tracer_writes_log(void **state) {
    (void)state;
    const tm_trace_shape shape = {
        .arch = "qwen3moe", .n_layer = 3, .n_expert = 24, .n_expert_used = 3};
    char path[512];
    tmp_path(path, sizeof(path), "tracer.bin");
    remove(path);
    FILE *sink = tmpfile();
    tm_trace_config cfg = {.stats = true, .routing_log = path, .log = sink};
    tm_trace *tr;
    /* freed without trace_finish: no log */
    assert_int_equal(trace_create(&cfg, &shape, NULL, &tr), TM_OK);
    trace_sequence_begin(tr);
    int32_t ids[16 * 3];
    tm_rng r;
    tm_rng_seed(&r, 4);
    test_random_ids(&r, ids, 1, 24, 3);
    trace_record(tr, 0, ids, 1);
    trace_free(tr);
    assert_null(fopen(path, "rb"));
    /* the calls the tracer counts are the calls the log holds */
    log_expect x = {.L = 3, .k = 3};
    assert_int_equal(trace_create(&cfg, &shape, NULL, &tr), TM_OK);
    for (int s = 0; s < 3; s++) {
        trace_sequence_begin(tr);
        x.n_seq++;
        for (int step = 0; step < 6; step++)
            for (uint32_t l = 0; l < 3; l++) {
                const int64_t n = step ? 1 : 16;
                test_random_ids(&r, ids, n, 24, 3);
                trace_record(tr, l, ids, n);
                log_expect_call(&x, l, ids, n);
            }
    }
    assert_int_equal(trace_finish(tr), TM_OK);
    trace_free(tr);
    tm_trace_log log;
    assert_int_equal(trace_log_read(path, &log), TM_OK);
    log_expect_check(&x, &log);
    trace_log_free(&log);
    log_expect_free(&x);
    fclose(sink);
    remove(path);
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len);
    assert_int_equal(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

static void expect_bad(const uint8_t *d, size_t len, tm_status want, const char *msg) {
    tm_trace_log log;
    const tm_status st = trace_log_parse(d, len, "log.bin", &log);
    if (st != want || !strstr(tm_error_message(), msg) ||
        strncmp(tm_error_message(), "log.bin: ", 9)) {
        fprintf(stderr, "status %d, message: %s (wanted '%s')\n", st, tm_error_message(), msg);
        fail();
    }
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void test_damage(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "damage.bin");
    /* header, marker, a prompt call of 2 tokens (layer 0), a decode call (layer 1), marker,
     * a decode call (layer 0): boundaries at 64, 68, 68+8+2*2*3, +8+2*3, +4, +8+2*3 */
    const tm_trace_shape sh = shape_of(2, 10, 3);
    tm_trace_log_writer *w;
    assert_int_equal(trace_log_writer_open(path, &sh, &w), TM_OK);
    const int32_t p2[6] = {1, 2, 3, 9, 8, 7}, d1[3] = {4, 5, 6}, d2[3] = {0, 9, 5};
    trace_log_writer_record(w, 0, p2, 2); /* writes the first marker itself */
    trace_log_writer_record(w, 1, d1, 1);
    trace_log_writer_sequence(w);
    trace_log_writer_record(w, 0, d2, 1);
    assert_int_equal(trace_log_writer_close(w, true), TM_OK);
    size_t len;
    uint8_t *d = read_all(path, &len);
    const size_t bounds[] = {64, 68, 88, 102, 106, 120};
    assert_int_equal(len, 120);
    for (size_t cut = 0; cut < len; cut++) {
        bool boundary = false;
        for (size_t i = 0; i < sizeof(bounds) / sizeof(bounds[0]); i++)
            boundary |= cut == bounds[i];
        uint8_t *c = malloc(cut ? cut : 1); /* exact size: ASan sees any over-read */
        memcpy(c, d, cut);
        tm_trace_log log;
        const tm_status st = trace_log_parse(c, cut, "log.bin", &log);
        if (boundary) {
            assert_int_equal(st, TM_OK);
            trace_log_free(&log);
        } else {
            assert_int_equal(st, TM_ERR_FORMAT);
            assert_non_null(strstr(tm_error_message(), "log.bin: "));
            assert_true(strstr(tm_error_message(), "offset") ||
                        strstr(tm_error_message(), "header"));
        }
        free(c);
    }
    tm_trace_log log;
    assert_int_equal(trace_log_parse(d, len, "log.bin", &log), TM_OK);
    assert_int_equal(log.n_seq, 2);
    assert_int_equal(log.layers[0].n_calls, 2);
    assert_int_equal(log.layers[0].calls[1].seq, 1);
    assert_int_equal(log.layers[1].n_calls, 1);
    trace_log_free(&log);
    expect_bad(d, 63, TM_ERR_FORMAT, "63 bytes, shorter than the 64-byte header");
    expect_bad(d, 100, TM_ERR_FORMAT,
               "offset 88: truncated record (3 ids of layer 1, 4 bytes left)");
    uint8_t *b = malloc(len);
#define DAMAGE(pos, val, want, msg)                                                                \
    do {                                                                                           \
        memcpy(b, d, len);                                                                         \
        put32(b + (pos), (val));                                                                   \
        expect_bad(b, len, want, msg);                                                             \
    } while (0)
    DAMAGE(0, 0x4c524d55, TM_ERR_FORMAT, "offset 0: not a routing log");
    DAMAGE(4, 2, TM_ERR_UNSUPPORTED, "offset 4: version 2");
    DAMAGE(8, 0, TM_ERR_FORMAT, "offset 8: unsupported shape 0 layers");
    DAMAGE(12, 5000, TM_ERR_FORMAT, "offset 8: unsupported shape 2 layers, 5000 experts");
    DAMAGE(16, 11, TM_ERR_FORMAT, "offset 8: unsupported shape 2 layers, 10 experts, 11 used");
    DAMAGE(20, 1, TM_ERR_FORMAT, "offset 20: reserved field not 0");
    DAMAGE(60, 1, TM_ERR_FORMAT, "offset 60: reserved field not 0");
    DAMAGE(68, 7, TM_ERR_FORMAT, "offset 68: layer 7 of 2");
    DAMAGE(72, 0, TM_ERR_FORMAT, "offset 72: 0 tokens");
    DAMAGE(72, 1u << 30, TM_ERR_FORMAT, "offset 72: 1073741824 tokens");
    DAMAGE(64, 0, TM_ERR_FORMAT, "offset 64: a call before the first sequence marker");
    /* expert ids: 10 of 10 in the second id of the first call; a repeat in the second token */
    memcpy(b, d, len);
    b[78] = 10, b[79] = 0;
    expect_bad(b, len, TM_ERR_FORMAT, "offset 78: expert 10 of 10");
    memcpy(b, d, len);
    b[86] = 9, b[87] = 0; /* token 1: 9, 8, 9 */
    expect_bad(b, len, TM_ERR_FORMAT, "offset 86: expert 9 twice in one token");
    memcpy(b, d, len);
    memset(b + 24, 'a', 32);
    expect_bad(b, len, TM_ERR_FORMAT, "offset 24: arch not NUL-terminated");
#undef DAMAGE
    free(b);
    free(d);
    /* a missing file */
    remove(path);
    assert_int_equal(trace_log_read(path, &log), TM_ERR_IO);
    assert_non_null(strstr(tm_error_message(), "tlog_damage.bin"));
}

static void test_writer_errors(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "bad_writer.bin");
    remove(path);
    const tm_trace_shape sh = shape_of(2, 10, 2);
    tm_trace_log_writer *w;
    assert_int_equal(trace_log_writer_open(path, &sh, &w), TM_OK);
    const int32_t ids[2] = {1, 2}, bad[2] = {1, 10};
    trace_log_writer_record(w, 2, ids, 1);
    assert_int_equal(trace_log_writer_close(w, true), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "routing log not written"));
    assert_null(fopen(path, "rb"));
    assert_int_equal(trace_log_writer_open(path, &sh, &w), TM_OK);
    trace_log_writer_record(w, 0, bad, 1);
    assert_int_equal(trace_log_writer_close(w, true), TM_ERR_ARG);
    assert_null(fopen(path, "rb"));
    const tm_trace_shape huge = shape_of(2, 70000, 2);
    assert_int_equal(trace_log_writer_open(path, &huge, &w), TM_ERR_ARG);
    char dir_path[600];
    tmp_path(dir_path, sizeof(dir_path), "no/such/dir.bin");
    assert_int_equal(trace_log_writer_open(dir_path, &sh, &w), TM_ERR_IO);
    assert_non_null(strstr(tm_error_message(), "cannot create"));
}

static void corpus_log(const uint8_t *d, size_t n, bool seed) {
    tm_trace_log log;
    const tm_status st = trace_log_parse(d, n, "corpus", &log);
    if (seed) assert_int_equal(st, TM_OK);
    if (st == TM_OK) trace_log_free(&log);
}

static void test_fuzz_corpus(void **state) {
    (void)state;
    corpus_each("trace_log", corpus_log);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),  cmocka_unit_test(test_tracer_writes_log),
        cmocka_unit_test(test_damage),      cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_fuzz_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
