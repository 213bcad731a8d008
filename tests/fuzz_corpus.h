/* The fuzz corpora as regression inputs for the unit tests (test_plan,
 * test_trace_log, test_tokenizer_import): every file of fuzz/corpus/DIR, read into an exact-size
 * buffer (so ASan sees any over-read) and handed to fn; seeds (seed-*) are
 * marked, and there must be at least 4 of them. */
#ifndef TM_TESTS_FUZZ_CORPUS_H
#define TM_TESTS_FUZZ_CORPUS_H

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every file of fuzz/corpus/DIR: the seeds (seed-*) must be accepted, any other
 * (inputs the fuzzer kept) must be accepted or refused cleanly. Returns how
 * many files were handed to fn (all of them: an unreadable one fails). */
static inline int corpus_each(const char *dir, void (*fn)(const uint8_t *d, size_t n, bool seed)) {
    const char *data = getenv("TM_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof(path), "%s/../../fuzz/corpus/%s", data && *data ? data : "tests/data",
             dir);
    DIR *dp = opendir(path);
    assert_non_null(dp);
    int n_seed = 0, n_file = 0;
    for (struct dirent *de; (de = readdir(dp));) {
        if (de->d_name[0] == '.') continue;
        char f[1400];
        snprintf(f, sizeof(f), "%s/%s", path, de->d_name);
        FILE *fp = fopen(f, "rb");
        if (!fp) fail_msg("%s: cannot open", f);
        /* the whole file, into a buffer of exactly its size: ASan sees any over-read */
        assert_int_equal(fseek(fp, 0, SEEK_END), 0);
        const long size = ftell(fp);
        assert_true(size >= 0);
        rewind(fp);
        const size_t n = (size_t)size;
        uint8_t *copy = malloc(n ? n : 1);
        assert_non_null(copy);
        if (fread(copy, 1, n, fp) != n) fail_msg("%s: short read", f);
        fclose(fp);
        const bool seed = !strncmp(de->d_name, "seed-", 5);
        n_seed += seed;
        n_file++;
        fn(copy, n, seed);
        free(copy);
    }
    closedir(dp);
    print_message("fuzz/corpus/%s: %d files (%d seeds) replayed\n", dir, n_file, n_seed);
    assert_true(n_seed >= 4);
    return n_file;
}

#endif
