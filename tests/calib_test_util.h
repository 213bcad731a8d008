/* Shared by the calibration tests (test_calib.c: profiles, costs, the CPU
 * measurement; test_mock_calib.c: the GPU parts on the host mock): the tiny
 * synthetic model (tiermoe mkmodel --preset tiny) written to $TM_TEST_TMP,
 * loaded, with its experts and a thread pool as a tm_calib_source. */
#ifndef TM_TESTS_CALIB_TEST_UTIL_H
#define TM_TESTS_CALIB_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/synth.h"
#include "tier/calib.h"

typedef struct calib_fixture {
    char path[512];
    tm_model *m;
    tm_moe_experts *layers;
    uint32_t n_layer, n_expert;
    tm_pool *pool;
    tm_calib_source src;
} calib_fixture;

/* $TM_TEST_TMP/name (or /tmp/name). */
static void calib_test_path(char *out, size_t n, const char *name) {
    const char *tmp = getenv("TM_TEST_TMP");
    snprintf(out, n, "%s/%s", tmp && *tmp ? tmp : "/tmp", name);
}

/* The tiny model at name (written once per program), its experts, a pool of
 * `threads`; gpu may be NULL. */
static void calib_fixture_open(calib_fixture *f, const char *name, int threads,
                               tm_cuda_device *gpu) {
    memset(f, 0, sizeof(*f));
    calib_test_path(f->path, sizeof(f->path), name);
    FILE *exists = fopen(f->path, "rb");
    if (exists) {
        fclose(exists);
    } else {
        tm_synth_config sc;
        if (synth_config_preset(&sc, "tiny") != TM_OK) fail_msg("%s", tm_error_message());
        sc.n_threads = 2;
        if (synth_model_write(&sc, f->path) != TM_OK) fail_msg("mkmodel: %s", tm_error_message());
    }
    if (model_load(f->path, &f->m) != TM_OK) fail_msg("%s", tm_error_message());
    if (calib_experts_from_gguf(f->m->file, &f->layers, &f->n_layer, &f->n_expert) != TM_OK)
        fail_msg("%s", tm_error_message());
    if (cpu_pool_create(threads, &f->pool) != TM_OK) fail_msg("%s", tm_error_message());
    f->src = (tm_calib_source){.pool = f->pool,
                               .gpu = gpu,
                               .layers = f->layers,
                               .n_layer = f->n_layer,
                               .n_expert = f->n_expert,
                               .n_used = f->m->cfg.n_expert_used};
}

static void calib_fixture_close(calib_fixture *f) {
    cpu_pool_free(f->pool);
    free(f->layers);
    model_free(f->m);
    memset(f, 0, sizeof(*f));
}

/* A curve has the first n points of tm_calib_tokens, each positive and none
 * below the one before. */
static void calib_check_curve(const tm_calib_curve *cv, int n, const char *what) {
    if (cv->n != n) fail_msg("%s: %d points, want %d", what, cv->n, n);
    for (int i = 0; i < cv->n; i++) {
        if (cv->tokens[i] != tm_calib_tokens[i])
            fail_msg("%s: point %d at %d tokens, want %d", what, i, cv->tokens[i],
                     tm_calib_tokens[i]);
        if (!(cv->ns[i] > 0) || (i && cv->ns[i] < cv->ns[i - 1]))
            fail_msg("%s: point %d: %g ns after %g", what, i, cv->ns[i], i ? cv->ns[i - 1] : 0.0);
    }
}

static void calib_check_curves_equal(const tm_calib_curve *a, const tm_calib_curve *b) {
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        assert_int_equal(a->tokens[i], b->tokens[i]);
        assert_true(a->ns[i] == b->ns[i]);
    }
}

/* Every field the same (doubles exactly: JSON keeps 17 digits). */
static void calib_check_equal(const tm_calib *a, const tm_calib *b) {
    assert_string_equal(a->key.cpu, b->key.cpu);
    assert_string_equal(a->key.gpu, b->key.gpu);
    assert_int_equal(a->key.threads, b->key.threads);
    const tm_calib_expert *x = &a->key.expert, *y = &b->key.expert;
    assert_int_equal(x->n_embd, y->n_embd);
    assert_int_equal(x->n_ff, y->n_ff);
    assert_int_equal(x->gate_type, y->gate_type);
    assert_int_equal(x->up_type, y->up_type);
    assert_int_equal(x->down_type, y->down_type);
    assert_int_equal(x->bytes, y->bytes);
    assert_int_equal(a->quick, b->quick);
    assert_string_equal(a->created, b->created);
    assert_string_equal(a->cpu_level, b->cpu_level);
    assert_int_equal(a->experts_per_call, b->experts_per_call);
    const double da[] = {a->cpu_read_gbs,
                         a->copy.h2d_pinned_expert_gbs,
                         a->copy.h2d_pinned_big_gbs,
                         a->copy.h2d_pageable_expert_gbs,
                         a->copy.h2d_pageable_big_gbs,
                         a->copy.d2h_pinned_big_gbs,
                         a->pcie_read_gbs,
                         a->pcie_read_concurrent_gbs,
                         a->cpu_lane_gbs,
                         a->cpu_lane_concurrent_gbs,
                         a->handoff_round_trip_ns};
    const double db[] = {b->cpu_read_gbs,
                         b->copy.h2d_pinned_expert_gbs,
                         b->copy.h2d_pinned_big_gbs,
                         b->copy.h2d_pageable_expert_gbs,
                         b->copy.h2d_pageable_big_gbs,
                         b->copy.d2h_pinned_big_gbs,
                         b->pcie_read_gbs,
                         b->pcie_read_concurrent_gbs,
                         b->cpu_lane_gbs,
                         b->cpu_lane_concurrent_gbs,
                         b->handoff_round_trip_ns};
    for (size_t i = 0; i < sizeof(da) / sizeof(*da); i++)
        if (da[i] != db[i]) fail_msg("value %zu: %.17g, read back %.17g", i, da[i], db[i]);
    assert_int_equal(a->copy.expert_bytes, b->copy.expert_bytes);
    assert_int_equal(a->copy.big_bytes, b->copy.big_bytes);
    calib_check_curves_equal(&a->cpu_expert, &b->cpu_expert);
    calib_check_curves_equal(&a->gpu_expert, &b->gpu_expert);
    for (int i = 0; i < TM_CALIB_PHASE_COUNT; i++) assert_true(a->measure_s[i] == b->measure_s[i]);
}

/* Written to path and read back (with the profile's own key): the same profile. */
static void calib_check_round_trip(const tm_calib *c, const char *path) {
    tm_calib back;
    if (calib_write_json(c, path) != TM_OK) fail_msg("write: %s", tm_error_message());
    if (calib_read_json(path, &c->key, &back) != TM_OK) fail_msg("read: %s", tm_error_message());
    calib_check_equal(c, &back);
}

#endif
