/* The server's stop strings (srv_stop_scan), against a brute-force reference:
 * random texts over a small alphabet (so stop strings occur and overlap), cut
 * into random pieces as tokens would come, with 1-4 random stop strings. The
 * concatenation of what the scan lets through must equal the text up to where
 * generation stops: the earliest start of a stop string found whole at the
 * first piece that completes one (all of the text when none does); the tail
 * it holds back must be a proper prefix of some stop string. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifndef TM_HAVE_SERVER
int main(void) {
    return 77; /* built without libmicrohttpd: no server (skipped) */
}
#else
#include "core/rng.h"
#include "server/server_internal.h"

/* Where the reply ends (brute force): at the first piece end E where some stop
 * string lies whole in text[0..E), the earliest start of one there; else len. */
static size_t first_stop(char *const *stops, int n, const char *text, const size_t *ends,
                         int n_ends) {
    for (int e = 0; e < n_ends; e++) {
        size_t best = ends[e];
        for (size_t at = 0; at < ends[e]; at++)
            for (int i = 0; i < n; i++) {
                const size_t k = strlen(stops[i]);
                if (at + k <= ends[e] && !memcmp(text + at, stops[i], k) && at < best) best = at;
            }
        if (best < ends[e]) return best;
    }
    return ends[n_ends - 1];
}

static bool proper_prefix_of_a_stop(char *const *stops, int n, const char *tail, size_t len) {
    if (!len) return true;
    for (int i = 0; i < n; i++)
        if (len < strlen(stops[i]) && !memcmp(stops[i], tail, len)) return true;
    return false;
}

static void test_stop_scan_random(void **state) {
    (void)state;
    tm_rng rng;
    tm_rng_seed(&rng, 7);
    char text[96], sent[96], stop_buf[4][8];
    char *stops[4];
    int hits = 0;
    for (int trial = 0; trial < 20000; trial++) {
        const size_t len = 1 + (uint32_t)tm_rng_u64(&rng) % 64;
        for (size_t i = 0; i < len; i++) text[i] = "abc"[(uint32_t)tm_rng_u64(&rng) % 3];
        const int n = 1 + (int)((uint32_t)tm_rng_u64(&rng) % 4);
        for (int i = 0; i < n; i++) {
            const size_t k = 1 + (uint32_t)tm_rng_u64(&rng) % 5;
            for (size_t j = 0; j < k; j++) stop_buf[i][j] = "abc"[(uint32_t)tm_rng_u64(&rng) % 3];
            stop_buf[i][k] = '\0';
            stops[i] = stop_buf[i];
        }
        /* the text comes in pieces of 1-4 bytes, as tokens arrive */
        size_t ends[96];
        int n_ends = 0;
        for (size_t e = 0; e < len;) {
            e += 1 + (uint32_t)tm_rng_u64(&rng) % 4;
            ends[n_ends++] = e < len ? e : len;
        }
        const size_t want = first_stop(stops, n, text, ends, n_ends);
        size_t from = 0, n_sent = 0;
        bool hit = false;
        for (int e = 0; e < n_ends && !hit; e++) {
            const size_t have = ends[e];
            const size_t safe = srv_stop_scan(stops, n, text, have, from, &hit);
            assert_true(safe >= from && safe <= have);
            if (!hit) assert_true(proper_prefix_of_a_stop(stops, n, text + safe, have - safe));
            memcpy(sent + n_sent, text + from, safe - from);
            n_sent += safe - from, from = safe;
        }
        if (!hit) { /* the end: what was held back goes out */
            memcpy(sent + n_sent, text + from, len - from);
            n_sent += len - from;
        }
        hits += hit;
        if (n_sent != want || memcmp(sent, text, want))
            fail_msg("trial %d: sent %zu bytes, want %zu (text %.*s, stops %s %s %s %s of %d)",
                     trial, n_sent, want, (int)len, text, stops[0], n > 1 ? stops[1] : "",
                     n > 2 ? stops[2] : "", n > 3 ? stops[3] : "", n);
        assert_int_equal(hit, want < len);
    }
    assert_true(hits > 1000 && hits < 19000); /* both kinds of text were tried */
}

static void test_stop_scan_cases(void **state) {
    (void)state;
    char a[] = "</s>", b[] = "STOP";
    char *stops[] = {a, b};
    bool hit;
    /* a tail that may begin a stop string waits */
    assert_int_equal(srv_stop_scan(stops, 2, "hello </", 8, 0, &hit), 6);
    assert_false(hit);
    assert_int_equal(srv_stop_scan(stops, 2, "hello </s", 9, 6, &hit), 6);
    assert_int_equal(srv_stop_scan(stops, 2, "hello </x", 9, 6, &hit), 9);
    assert_false(hit);
    assert_int_equal(srv_stop_scan(stops, 2, "hello </s> more", 15, 6, &hit), 6);
    assert_true(hit);
    /* the earliest of two stop strings wins */
    assert_int_equal(srv_stop_scan(stops, 2, "aSTOPb</s>", 10, 0, &hit), 1);
    assert_true(hit);
    /* no stop strings: everything goes */
    assert_int_equal(srv_stop_scan(stops, 0, "abc", 3, 0, &hit), 3);
    assert_false(hit);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_scan_cases),
        cmocka_unit_test(test_stop_scan_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif /* TM_HAVE_SERVER */
