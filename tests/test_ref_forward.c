/* The double-precision reference forward (tests/ref/ref_forward.h) against
 * the HF transformers goldens of tests/data (docs/golden-format.md):
 * qwen3moe in f32 and q8_0 (tests/data/hf_qwen3moe) and gpt-oss with MXFP4
 * experts, sinks, a window of 8 and YaRN (tests/data/hf_gptoss), every
 * position of the dump one step at a time, every array the dump has.
 *
 * Tolerance: both sides compute in float64 from the same dequantized
 * weights, so they differ by summation order and libm only: about 1e-15
 * relative per operation, some thousand operations deep. Every float array
 * (max |ref - golden| / max |golden| over the whole array, as
 * docs/golden-format.md compares) within 1e-10, the limit
 * tests/oracle/test_ref_vs_hf.py uses for the numpy reference; top-k ids
 * identical (the dumps are checked for routing gaps >= 1e-8). Also: a bad
 * file and a bad token are errors naming what was wrong. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "ref/ref_forward.h"

#define TOL 1e-10

static void data_path(char *out, size_t len, const char *rel) {
    const char *d = getenv("TM_TEST_DATA");
    snprintf(out, len, "%s/%s", d ? d : "tests/data", rel);
}

/* Value i of a golden float tensor (F32 or F64). */
static double golden_at(const tm_gguf_tensor *t, int64_t i) {
    if (t->type == TM_TYPE_F64) {
        double v;
        memcpy(&v, (const char *)t->data + i * 8, 8);
        return v;
    }
    float v;
    memcpy(&v, (const char *)t->data + i * 4, 4);
    return v;
}

typedef struct golden_acc {
    double err, max; /* max |ref - golden| and max |golden| of an array */
} golden_acc;

static void check_model(const char *model_rel, const char *golden_rel) {
    char model_path[512], golden_path[512];
    data_path(model_path, sizeof(model_path), model_rel);
    data_path(golden_path, sizeof(golden_path), golden_rel);
    ref_model *m;
    tm_gguf_file *g;
    if (ref_model_load(model_path, &m) != TM_OK) fail_msg("%s", tm_error_message());
    if (gguf_file_open(golden_path, &g) != TM_OK) fail_msg("%s", tm_error_message());
    const tm_gguf_array *tok;
    if (gguf_file_get_array(g, "dump.tokens", &tok) != TM_OK) fail_msg("%s", tm_error_message());
    const int64_t n_tok = (int64_t)tok->n;
    ref_seq *s;
    if (ref_seq_create(m, n_tok, &s) != TM_OK) fail_msg("%s", tm_error_message());

    static const char *const names[] = {"attn_out", "router_logits", "topk_weights", "ffn_out",
                                        "x_out"};
    enum { N_NAMES = 5 };
    golden_acc *acc = calloc((size_t)(m->n_layer * N_NAMES + 1), sizeof(golden_acc));
    const tm_gguf_tensor *logits_t = gguf_file_find_tensor(g, "logits");
    if (!acc || !logits_t || logits_t->ne[0] != m->n_vocab) fail_msg("%s: no logits", golden_path);
    int compared = 0;
    for (int64_t p = 0; p < n_tok; p++) {
        if (ref_seq_step(s, gguf_array_get_i32(tok, (uint64_t)p)) != TM_OK)
            fail_msg("%s", tm_error_message());
        const ref_step_out *o = ref_seq_out(s);
        for (int l = 0; l < m->n_layer; l++) {
            const double *mine[N_NAMES] = {o->attn_out, o->router_logits, o->topk_w, o->ffn_out,
                                           o->x_out};
            const int64_t width[N_NAMES] = {m->n_embd, m->n_expert, m->n_used, m->n_embd,
                                            m->n_embd};
            for (int k = 0; k < N_NAMES; k++) {
                char name[64];
                snprintf(name, sizeof(name), "blk.%d.%s", l, names[k]);
                const tm_gguf_tensor *t = gguf_file_find_tensor(g, name);
                if (!t) continue;
                if (t->ne[0] != width[k])
                    fail_msg("%s: %s is %lld wide", golden_path, name, (long long)t->ne[0]);
                golden_acc *a = &acc[l * N_NAMES + k];
                for (int64_t i = 0; i < width[k]; i++) {
                    const double want = golden_at(t, p * width[k] + i);
                    a->err = fmax(a->err, fabs(mine[k][l * width[k] + i] - want));
                    a->max = fmax(a->max, fabs(want));
                }
                compared += p == 0;
            }
            char name[64];
            snprintf(name, sizeof(name), "blk.%d.topk_ids", l);
            const tm_gguf_tensor *t = gguf_file_find_tensor(g, name);
            if (!t) continue;
            for (int j = 0; j < m->n_used; j++) {
                int32_t want;
                memcpy(&want, (const char *)t->data + (p * m->n_used + j) * 4, 4);
                if (o->topk_ids[l * m->n_used + j] != want)
                    fail_msg("%s: layer %d position %lld: expert %d of the top-k is %d, HF's %d",
                             golden_path, l, (long long)p, j, o->topk_ids[l * m->n_used + j], want);
            }
        }
        golden_acc *a = &acc[m->n_layer * N_NAMES];
        for (int64_t i = 0; i < m->n_vocab; i++) {
            const double want = golden_at(logits_t, p * m->n_vocab + i);
            a->err = fmax(a->err, fabs(o->logits[i] - want));
            a->max = fmax(a->max, fabs(want));
        }
    }
    if (compared < m->n_layer * N_NAMES) fail_msg("%s: arrays missing", golden_path);
    double worst = 0;
    for (int i = 0; i <= m->n_layer * N_NAMES; i++) {
        const double rel = acc[i].err / fmax(acc[i].max, 1e-300);
        const char *what = i == m->n_layer * N_NAMES ? "logits" : names[i % N_NAMES];
        if (!(rel <= TOL))
            fail_msg("%s: %s of layer %d: relative error %.3g > %g", golden_path, what, i / N_NAMES,
                     rel, TOL);
        worst = fmax(worst, rel);
    }
    printf("  %s: %lld positions, %d layers, every array within %.2g of HF (tolerance %g)\n",
           model_rel, (long long)n_tok, m->n_layer, worst, TOL);
    free(acc);
    ref_seq_free(s);
    gguf_file_close(g);
    ref_model_free(m);
}

static void test_qwen3moe_f32(void **state) {
    (void)state;
    check_model("hf_qwen3moe/tiny-f32.gguf", "hf_qwen3moe/tiny-f32.golden.gguf");
}

static void test_qwen3moe_q8_0(void **state) {
    (void)state;
    check_model("hf_qwen3moe/tiny-q8_0.gguf", "hf_qwen3moe/tiny-q8_0.golden.gguf");
}

static void test_gptoss_mxfp4(void **state) {
    (void)state;
    check_model("hf_gptoss/tiny-mxfp4.gguf", "hf_gptoss/tiny-mxfp4.golden.gguf");
}

static void test_errors(void **state) {
    (void)state;
    char path[512];
    ref_model *m;
    data_path(path, sizeof(path), "hf_qwen3moe/tiny-f32.golden.gguf"); /* a dump, not a model */
    assert_int_equal(ref_model_load(path, &m), TM_ERR_UNSUPPORTED);
    assert_non_null(strstr(tm_error_message(), "tiermoe.dump"));
    assert_null(m);
    data_path(path, sizeof(path), "hf_qwen3moe/tiny-f32.gguf");
    assert_int_equal(ref_model_load(path, &m), TM_OK);
    ref_seq *s;
    assert_int_equal(ref_seq_create(m, 1, &s), TM_OK);
    assert_int_equal(ref_seq_step(s, m->n_vocab), TM_ERR_ARG);
    assert_int_equal(ref_seq_step(s, 1), TM_OK);
    assert_int_equal(ref_seq_step(s, 1), TM_ERR_ARG); /* past its one position */
    ref_seq_free(s);
    ref_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3moe_f32),
        cmocka_unit_test(test_qwen3moe_q8_0),
        cmocka_unit_test(test_gptoss_mxfp4),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
