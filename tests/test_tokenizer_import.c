/* The tokenizer.json importer (tokenizer_import_hf) on hostile input:
 * - fuzz/corpus/tokenizer replayed through the fuzz target itself
 *   (fuzz/tokenizer_fuzz.c is linked in: its invariants abort on a broken
 *   one); seeds in import mode must import;
 * - every file of tests/data/tokenizer_bad/ is refused with a message naming
 *   the file and the field;
 * - ids far past the entry count are refused, naming the id and the field,
 *   exactly at the documented bound (twice the entries plus 1024). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fuzz_corpus.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

/* fuzz/tokenizer_fuzz.c */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char g_path[1024];

static const char *tmp_path(const char *name) {
    const char *dir = getenv("TM_TEST_TMP");
    snprintf(g_path, sizeof(g_path), "%s/%s", dir ? dir : "/tmp", name);
    return g_path;
}

static void write_file(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(d, 1, n, f), n);
    fclose(f);
}

/* Import the tokenizer.json at path into a throwaway writer. */
static tm_status import_file(const char *path, uint32_t *n_tokens) {
    tm_gguf_writer *w;
    assert_int_equal(gguf_writer_init(&w, 3, 32), TM_OK);
    const tm_status st = tokenizer_import_hf_ex(path, w, NULL, n_tokens);
    gguf_writer_free(w);
    return st;
}

static int g_import_seeds;

static void corpus_tokenizer(const uint8_t *d, size_t n, bool seed) {
    if (seed && n && (d[0] & 1) == 0) { /* import mode: a seed tokenizer.json must import */
        const char *path = tmp_path("corpus_tokenizer.json");
        write_file(path, d + 1, n - 1);
        uint32_t n_tok = 0;
        if (import_file(path, &n_tok) != TM_OK) fail_msg("seed refused: %s", tm_error_message());
        assert_true(n_tok > 0);
        g_import_seeds++;
    }
    LLVMFuzzerTestOneInput(d, n);
}

static void test_fuzz_corpus(void **state) {
    (void)state;
    int argc = 0;
    char **argv = NULL;
    LLVMFuzzerInitialize(&argc, &argv);
    const int n = corpus_each("tokenizer", corpus_tokenizer);
    assert_true(n >= 59);             /* the seeds of make_tokenizer_seeds.py, at least */
    assert_true(g_import_seeds >= 5); /* qwen2, llama3 (two forms each), gpt2, SentencePiece */
}

/* Every file of tests/data/tokenizer_bad/ is refused, naming the file and the field. */
static void test_bad_files(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/tokenizer_bad", data && *data ? data : "tests/data");
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    int count = 0;
    for (struct dirent *de; (de = readdir(dp));) {
        if (de->d_name[0] == '.') continue;
        char path[1400];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        const tm_status st = import_file(path, NULL);
        const char *msg = tm_error_message();
        print_message("%s: %s\n", de->d_name, msg);
        if (st != TM_ERR_FORMAT) fail_msg("%s: expected a format error, got %d", path, st);
        if (!strstr(msg, de->d_name)) fail_msg("%s: message does not name the file", path);
        /* each file is named for the field it breaks: vocab-* or added-* */
        const char *field =
            !strncmp(de->d_name, "vocab-", 6) ? "model.vocab: id " : "added_tokens[1].id: id ";
        if (!strstr(msg, field)) fail_msg("%s: message does not name %s", path, field);
        count++;
    }
    closedir(dp);
    assert_true(count >= 2);
}

/* A byte-level tokenizer.json with `entries` vocab entries (ids 0..entries-2)
 * and one last entry of id `big`, in model.vocab or in added_tokens. */
static void write_sparse(const char *path, int entries, long big, bool in_added) {
    size_t cap = 64 * (size_t)entries + 1024, n = 0;
    char *j = malloc(cap), added[128] = "";
    assert_non_null(j);
    if (in_added)
        snprintf(added, sizeof(added), "{\"content\": \"<|big|>\", \"special\": true, \"id\": %ld}",
                 big);
    n += (size_t)snprintf(j + n, cap - n,
                          "{\"added_tokens\": [%s], \"decoder\": {\"type\": \"ByteLevel\"}, "
                          "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": true}, "
                          "\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {",
                          added);
    for (int i = 0; i < entries - 1; i++)
        n += (size_t)snprintf(j + n, cap - n, "%s\"t%d\": %d", i ? ", " : "", i, i);
    if (!in_added) n += (size_t)snprintf(j + n, cap - n, ", \"big\": %ld", big);
    n += (size_t)snprintf(j + n, cap - n, "}}}");
    write_file(path, j, n);
    free(j);
}

static void test_id_bound(void **state) {
    (void)state;
    const char *p = tmp_path("sparse_tokenizer.json");
    char want[64];
    for (int added = 0; added <= 1; added++) {
        /* 10 entries: ids up to 2 * 10 + 1024 - 1 = 1043 are accepted (holes padded) */
        uint32_t n_tok = 0;
        write_sparse(p, 10, 1043, added);
        if (import_file(p, &n_tok) != TM_OK) fail_msg("id 1043 refused: %s", tm_error_message());
        assert_int_equal(n_tok, 1044);
        write_sparse(p, 10, 1044, added);
        assert_int_equal(import_file(p, NULL), TM_ERR_FORMAT);
        const char *msg = tm_error_message();
        snprintf(want, sizeof(want), "%s: id 1044 ", added ? "added_tokens[0].id" : "model.vocab");
        if (!strstr(msg, want) || !strstr(msg, "below 1044"))
            fail_msg("message lacks '%s' or the bound: %s", want, msg);
        /* the fuzzer's finding: one id of 15,911,111 among a few entries */
        write_sparse(p, 6, 15911111, added);
        assert_int_equal(import_file(p, NULL), TM_ERR_FORMAT);
        assert_non_null(strstr(tm_error_message(), "id 15911111"));
    }
    remove(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_id_bound),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_fuzz_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
