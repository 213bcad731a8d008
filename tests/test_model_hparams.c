/* Hyper-parameters checked at load (src/model/hparams.c): a tiny qwen3moe
 * and a tiny gpt-oss are written once, then copied with one key set to a bad
 * value (NaN, inf, 0, negative, out of range, inconsistent with another key,
 * another type) or removed; every copy must fail to load with a message naming
 * the key ("qwen3moe.rope.freq_base") and its value, and copies with edge
 * values that are valid, and the files themselves, must still load. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/status.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"

static char qwen_path[600], gptoss_path[600], edit_path[600];

static void tmp_file(char *buf, size_t n, const char *name) {
    const char *t = getenv("TM_TEST_TMP");
    snprintf(buf, n, "%s/hparams_%s", t && *t ? t : "/tmp", name);
}

static int setup(void **state) {
    (void)state;
    tmp_file(qwen_path, sizeof(qwen_path), "qwen3moe.gguf");
    tmp_file(gptoss_path, sizeof(gptoss_path), "gptoss.gguf");
    tmp_file(edit_path, sizeof(edit_path), "edit.gguf");
    tm_synth_config c;
    if (synth_config_preset(&c, "tiny") || (c.n_layer = 1, synth_model_write(&c, qwen_path)) ||
        synth_config_preset(&c, "tiny-gpt-oss") ||
        (c.n_layer = 2, synth_model_write(&c, gptoss_path))) {
        fprintf(stderr, "writing the models: %s\n", tm_error_message());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(qwen_path), remove(gptoss_path), remove(edit_path);
    return 0;
}

typedef enum edit_kind { E_U32, E_I32, E_F32, E_F64, E_STR, E_REMOVE } edit_kind;

typedef struct edit {
    const char *key; /* after "<arch>." */
    edit_kind kind;
    double v;
    const char *expect; /* besides the key, in the message (NULL: the load must succeed) */
} edit;

/* Copy the file at path with key set as e says; model_load's status. */
static tm_status load_edited(const char *path, const char *arch, const edit *e, char *key,
                             size_t key_len) {
    snprintf(key, key_len, "%s.%s", arch, e->key);
    tm_gguf_file *f;
    assert_int_equal(gguf_file_open(path, &f), TM_OK);
    tm_gguf_value v = {0};
    switch (e->kind) {
    case E_U32:
        v.type = TM_GGUF_TYPE_UINT32, v.v.u32 = (uint32_t)e->v;
        break;
    case E_I32:
        v.type = TM_GGUF_TYPE_INT32, v.v.i32 = (int32_t)e->v;
        break;
    case E_F32:
        v.type = TM_GGUF_TYPE_FLOAT32, v.v.f32 = (float)e->v;
        break;
    case E_F64:
        v.type = TM_GGUF_TYPE_FLOAT64, v.v.f64 = e->v;
        break;
    case E_STR:
        v.type = TM_GGUF_TYPE_STRING, v.v.str = (tm_gguf_str){"ten", 3};
        break;
    case E_REMOVE:
        break;
    }
    const tm_status st = gguf_file_copy_edit(f, edit_path, key, e->kind == E_REMOVE ? NULL : &v);
    gguf_file_close(f);
    assert_int_equal(st, TM_OK);
    tm_model *m = NULL;
    const tm_status ls = model_load(edit_path, &m);
    model_free(m);
    return ls;
}

static void run_edits(const char *arch, const edit *edits, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const edit *e = &edits[i];
        char key[128];
        const tm_status st = load_edited(strcmp(arch, "gpt-oss") ? qwen_path : gptoss_path, arch, e,
                                         key, sizeof(key));
        const char *msg = st ? tm_error_message() : "";
        if (!e->expect) {
            if (st) printf("FAIL %s = %g: a valid value was refused: %s\n", key, e->v, msg);
            bad += st != TM_OK;
            continue;
        }
        const bool ok = st != TM_OK && strstr(msg, key) && strstr(msg, e->expect);
        printf("%s %s = %g: %s\n", ok ? "ok  " : "FAIL", key, e->v, st ? msg : "loaded");
        bad += !ok;
    }
    assert_int_equal(bad, 0);
}

#define INF INFINITY

static void test_qwen3moe_bad_keys(void **state) {
    (void)state;
    static const edit edits[] = {
        {"rope.freq_base", E_F32, NAN, "is nan"},
        {"rope.freq_base", E_F32, INF, "is inf"},
        {"rope.freq_base", E_F32, -INF, "is -inf"},
        {"rope.freq_base", E_F32, 0, "is 0"},
        {"rope.freq_base", E_F32, -10000, "is -10000"},
        {"rope.freq_base", E_F32, 1, "is 1,"},      /* every pair would rotate alike */
        {"rope.freq_base", E_F64, 1e300, "is inf"}, /* f64 beyond float */
        {"rope.freq_base", E_STR, 0, "float"},
        {"rope.freq_base", E_REMOVE, 0, "missing"},
        {"attention.layer_norm_rms_epsilon", E_F32, NAN, "is nan"},
        {"attention.layer_norm_rms_epsilon", E_F32, 0, "is 0"},
        {"attention.layer_norm_rms_epsilon", E_F32, -1e-6, "is -1e-06"},
        {"attention.layer_norm_rms_epsilon", E_F32, 0.5, "is 0.5"},
        {"attention.layer_norm_rms_epsilon", E_F32, INF, "is inf"},
        {"block_count", E_U32, 0, "is 0"},
        {"block_count", E_I32, -1, "-1"},
        {"block_count", E_U32, 100000, "is 100000"},
        {"block_count", E_F32, 1, "integer"},
        {"embedding_length", E_U32, 0, "is 0"},
        {"attention.head_count", E_U32, 0, "is 0"},
        {"attention.head_count_kv", E_U32, 0, "is 0"},
        {"attention.head_count_kv", E_U32, 3, "multiple of"}, /* 4 heads */
        {"attention.head_count_kv", E_U32, 8, "multiple of"},
        {"context_length", E_U32, 0, "is 0"},
        {"expert_count", E_U32, 0, "is 0"},
        {"expert_count", E_U32, 2000, "is 2000"},
        {"expert_used_count", E_U32, 0, "is 0"},
        {"expert_used_count", E_U32, 17, "at most qwen3moe.expert_count (16)"},
        {"expert_used_count", E_U32, 33, "is 33"},
        {"expert_feed_forward_length", E_U32, 0, "is 0"},
        {"attention.key_length", E_U32, 0, "is 0"},
        {"attention.key_length", E_U32, 63, "even"},
        {"attention.key_length", E_U32, 1024, "is 1024"},
        {"attention.value_length", E_U32, 32, "equal to qwen3moe.attention.key_length (64)"},
        {"rope.dimension_count", E_U32, 32, "equal to"},
        {"rope.dimension_count", E_U32, 0, "is 0"},
        /* valid edges: the checks must not refuse real models */
        {"rope.freq_base", E_F32, 10000, NULL},
        {"rope.freq_base", E_F64, 1e6, NULL},
        {"attention.layer_norm_rms_epsilon", E_F32, 1e-5, NULL},
        {"expert_used_count", E_U32, 16, NULL},
        {"expert_used_count", E_U32, 1, NULL},
        {"rope.dimension_count", E_U32, 64, NULL},
        {"context_length", E_U32, 1, NULL},
        {"block_count", E_I32, 1, NULL},
    };
    run_edits("qwen3moe", edits, sizeof(edits) / sizeof(edits[0]));
}

/* key_length absent: the width is embedding_length / head_count, checked too. */
static void test_qwen3moe_derived_width(void **state) {
    (void)state;
    static const edit ok = {"attention.key_length", E_REMOVE, 0, NULL}; /* 256 / 4 = 64 */
    run_edits("qwen3moe", &ok, 1);
    char key[128], path[600];
    tmp_file(path, sizeof(path), "heads3.gguf");
    tm_synth_config c;
    assert_int_equal(synth_config_preset(&c, "tiny"), TM_OK);
    /* 256 / 3 heads = 85, odd: named as key_length, and where it came from */
    c.n_layer = 1, c.n_head = 3, c.n_head_kv = 1;
    assert_int_equal(synth_model_write(&c, path), TM_OK);
    const edit drop = {"attention.key_length", E_REMOVE, 0, "absent"};
    assert_int_not_equal(load_edited(path, "qwen3moe", &drop, key, sizeof(key)), TM_OK);
    printf("%s\n", tm_error_message());
    assert_non_null(strstr(tm_error_message(), "qwen3moe.attention.key_length is 85 (absent"));
    remove(path);
}

static void test_gptoss_bad_keys(void **state) {
    (void)state;
    static const edit edits[] = {
        {"rope.freq_base", E_F32, NAN, "is nan"},
        {"rope.freq_base", E_F32, 0.5, "is 0.5"},
        {"rope.scaling.factor", E_F32, NAN, "is nan"},
        {"rope.scaling.factor", E_F32, 0.5, "is 0.5"},
        {"rope.scaling.factor", E_F32, INF, "is inf"},
        {"rope.scaling.factor", E_REMOVE, 0, "missing"},
        {"rope.scaling.original_context_length", E_U32, 0, "is 0"},
        {"rope.scaling.yarn_beta_fast", E_F32, NAN, "is nan"},
        {"rope.scaling.yarn_beta_fast", E_F32, 0.5,
         "less than gpt-oss.rope.scaling.yarn_beta_fast"},
        {"rope.scaling.yarn_beta_slow", E_F32, -1, "is -1"},
        {"rope.scaling.yarn_beta_slow", E_F32, 40, "is 40, expected less than"},
        {"attention.sliding_window", E_U32, 0, "is 0"},
        {"attention.sliding_window", E_I32, -128, "-128"},
        {"attention.sliding_window", E_REMOVE, 0, "missing"},
        {"attention.sliding_window_pattern", E_U32, 3, "is 3"},
        {"attention.layer_norm_rms_epsilon", E_F32, NAN, "is nan"},
        {"attention.head_count_kv", E_U32, 3, "multiple of"},
        {"expert_used_count", E_U32, 17, "at most gpt-oss.expert_count (16)"},
        {"attention.key_length", E_U32, 1024, "is 1024"},
        /* valid: the optional keys at their defaults, written */
        {"attention.sliding_window_pattern", E_U32, 2, NULL},
        {"rope.scaling.yarn_beta_fast", E_F32, 32, NULL},
        {"rope.scaling.yarn_beta_slow", E_F32, 1, NULL},
        {"rope.scaling.factor", E_F32, 1, NULL},
    };
    run_edits("gpt-oss", edits, sizeof(edits) / sizeof(edits[0]));
}

/* The files as written load, with the values they were written with. */
static void test_good_files_load(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(qwen_path, &m), TM_OK);
    assert_int_equal(m->cfg.head_dim, 64);
    assert_int_equal(m->cfg.n_expert_used, 4);
    assert_true(m->cfg.rope_base == 1e6f && m->cfg.rms_eps == 1e-6f);
    model_free(m);
    assert_int_equal(model_load(gptoss_path, &m), TM_OK);
    assert_int_equal(m->cfg.window, 16);
    assert_int_equal(m->window[0], 16);
    assert_int_equal(m->window[1], 0);
    assert_true(m->cfg.rope_factor == 32 && m->cfg.rope_orig_ctx == 4096);
    assert_true(m->cfg.yarn_beta_fast == 32 && m->cfg.yarn_beta_slow == 1); /* defaults */
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_files_load),
        cmocka_unit_test(test_qwen3moe_bad_keys),
        cmocka_unit_test(test_gptoss_bad_keys),
        cmocka_unit_test(test_qwen3moe_derived_width),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
