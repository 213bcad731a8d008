/* The fuzz corpora as regression inputs for the unit tests (test_plan,
 * test_trace_log): every file of fuzz/corpus/DIR, read into an exact-size
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
 * (inputs the fuzzer kept) must be accepted or refused cleanly. */
static inline void corpus_each(const char *dir, void (*fn)(const uint8_t *d, size_t n, bool seed)) {
    const char *data = getenv("TM_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof(path), "%s/../../fuzz/corpus/%s", data && *data ? data : "tests/data",
             dir);
    DIR *dp = opendir(path);
    assert_non_null(dp);
    int n_seed = 0;
    for (struct dirent *de; (de = readdir(dp));) {
        if (de->d_name[0] == '.') continue;
        char f[1400];
        snprintf(f, sizeof(f), "%s/%s", path, de->d_name);
        FILE *fp = fopen(f, "rb");
        assert_non_null(fp);
        uint8_t buf[1 << 16];
        const size_t n = fread(buf, 1, sizeof(buf), fp);
        fclose(fp);
        uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan sees any over-read */
        memcpy(copy, buf, n);
        const bool seed = !strncmp(de->d_name, "seed-", 5);
        n_seed += seed;
        fn(copy, n, seed);
        free(copy);
    }
    closedir(dp);
    assert_true(n_seed >= 4);
}

#endif
