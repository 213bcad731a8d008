/* The double-precision reference forward (tests/ref/ref_forward.h) against
 * the HF transformers goldens of tests/data (docs/golden-format.md):
 * qwen3moe in f32 and q8_0 (tests/data/hf_qwen3moe), gpt-oss with MXFP4
 * experts, sinks, a window of 8 and YaRN (tests/data/hf_gptoss), qwen3next
 * and qwen35moe in f16 (tests/data/hf_qwen3next, hf_qwen35moe: Gated DeltaNet
 * with grouped and tiled value heads, gated attention with partial RoPE, the
 * gated shared expert; 150 prompt tokens and 8 decode steps), every position
 * of the dump one step at a time, every array the dump has.
 *
 * Tolerance: both sides compute in float64 from the same dequantized
 * weights (f16, q8_0 and MXFP4 values are exact in double), so they differ
 * by summation order and libm only: about 1e-16 relative per operation, some
 * thousand operations deep, which the hybrids' recurrence (158 steps of a
 * decaying state) does not amplify (HF's chunked and recurrent delta rules
 * agree to 1.3e-15, hf.chunked_vs_recurrent_max_rel_diff in the dumps). Seen
 * (x86-64, glibc): 1.1e-15 qwen3moe, 2.2e-15 gpt-oss, 2.0e-15 qwen3next,
 * 2.9e-15 qwen35moe. Every float array (max |ref - golden| / max |golden|
 * over the whole array, as docs/golden-format.md compares) within 1e-12:
 * ~300x that, and below the smallest real slip seen (the file's float eps in
 * place of HF's 1e-6: 7e-11 on the hybrids' gated RMSNorm, 4.9e-13 on
 * gpt-oss; see ref_forward.c's ref_float_decimal); top-k
 * ids identical (the dumps are checked for routing gaps >= 1e-8). Also: a
 * bad file and a bad token are errors naming what was wrong, and a rewind
 * re-evaluates bit for bit (a hybrid's only to position 0). */
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

#define TOL 1e-12

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

/* Every array of the dump at every position within tol (relative to the array's largest
 * value); the worst relative error is returned. */
static double check_model(const char *model_rel, const char *golden_rel, double tol) {
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
                                        "x_out",    "lin_core",      "shexp_out",    "dense_out"};
    enum { N_NAMES = 8 };
    const int hybrid = m->arch == REF_ARCH_QWEN3NEXT || m->arch == REF_ARCH_QWEN35MOE;
    /* the five of every layer; a hybrid's shexp_out, lin_core if linear; glm4moe's dense
       layers attn_out, dense_out, x_out, its MoE layers' five and shexp_out */
    int want_arrays = 0;
    for (int l = 0; l < m->n_layer; l++)
        want_arrays += m->layers[l].dense ? 3
                       : m->arch == REF_ARCH_GLM4MOE || m->arch == REF_ARCH_DEEPSEEK2 ||
                               m->arch == REF_ARCH_GEMMA4
                           ? 6
                           : 5 + (hybrid ? 1 + m->layers[l].linear : 0);
    golden_acc *acc = calloc((size_t)(m->n_layer * N_NAMES + 1), sizeof(golden_acc));
    const tm_gguf_tensor *logits_t = gguf_file_find_tensor(g, "logits");
    if (!acc || !logits_t || logits_t->ne[0] != m->n_vocab) fail_msg("%s: no logits", golden_path);
    int compared = 0;
    for (int64_t p = 0; p < n_tok; p++) {
        if (ref_seq_step(s, gguf_array_get_i32(tok, (uint64_t)p)) != TM_OK)
            fail_msg("%s", tm_error_message());
        const ref_step_out *o = ref_seq_out(s);
        for (int l = 0; l < m->n_layer; l++) {
            const double *mine[N_NAMES] = {o->attn_out,  o->router_logits, o->topk_w,
                                           o->ffn_out,   o->x_out,         o->lin_core,
                                           o->shexp_out, o->dense_out};
            const int64_t width[N_NAMES] = {m->n_embd, m->n_expert, m->n_used,
                                            m->n_embd, m->n_embd,   (int64_t)m->n_v_head * m->v_dim,
                                            m->n_embd, m->n_embd};
            for (int k = 0; k < N_NAMES; k++) {
                char name[64];
                snprintf(name, sizeof(name), "blk.%d.%s", l, names[k]);
                const tm_gguf_tensor *t = gguf_file_find_tensor(g, name);
                if (!t) continue;
                if (!mine[k]) fail_msg("%s: the reference has no %s", golden_path, name);
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
    if (compared != want_arrays)
        fail_msg("%s: %d arrays compared, want %d", golden_path, compared, want_arrays);
    double worst = 0;
    int worst_at = 0;
    for (int i = 0; i <= m->n_layer * N_NAMES; i++) {
        const double rel = acc[i].err / fmax(acc[i].max, 1e-300);
        const char *what = i == m->n_layer * N_NAMES ? "logits" : names[i % N_NAMES];
        if (!(rel <= tol))
            fail_msg("%s: %s of layer %d: relative error %.3g > %g", golden_path, what, i / N_NAMES,
                     rel, tol);
        if (rel > worst) worst = rel, worst_at = i;
    }
    printf("  %s: %lld positions, %d layers, %d arrays, every one within %.2g of HF (worst: %s "
           "of layer %d; tolerance %g)\n",
           model_rel, (long long)n_tok, m->n_layer, compared + 1, worst,
           worst_at == m->n_layer * N_NAMES ? "logits" : names[worst_at % N_NAMES],
           worst_at / N_NAMES, tol);
    free(acc);
    ref_seq_free(s);
    gguf_file_close(g);
    ref_model_free(m);
    return worst;
}

static void test_qwen3moe_f32(void **state) {
    (void)state;
    check_model("hf_qwen3moe/tiny-f32.gguf", "hf_qwen3moe/tiny-f32.golden.gguf", TOL);
}

static void test_qwen3moe_q8_0(void **state) {
    (void)state;
    check_model("hf_qwen3moe/tiny-q8_0.gguf", "hf_qwen3moe/tiny-q8_0.golden.gguf", TOL);
}

static void test_gptoss_mxfp4(void **state) {
    (void)state;
    check_model("hf_gptoss/tiny-mxfp4.gguf", "hf_gptoss/tiny-mxfp4.golden.gguf", TOL);
}

static void test_qwen3next(void **state) {
    (void)state;
    check_model("hf_qwen3next/tiny-f16.gguf", "hf_qwen3next/tiny.golden.gguf", TOL);
}

static void test_qwen35moe(void **state) {
    (void)state;
    check_model("hf_qwen35moe/tiny-f16.gguf", "hf_qwen35moe/tiny.golden.gguf", TOL);
}

/* Mixtral (arch llama: interleaved RoPE), OLMoE (q/k norms over the projection, not
 * renormalised), GLM-4-MoE (a dense layer, biases, partial RoPE, the shared expert, the
 * sigmoid router with a selection bias and groups) and DeepSeek-V3 (MLA with YaRN, GLM's
 * FFNs and router) in f16 (tests/data/hf_mixtral, hf_olmoe, hf_glm4moe, hf_deepseek2: 40
 * prompt tokens and 8 decode steps). */
static void test_moe_archs(void **state) {
    (void)state;
    check_model("hf_mixtral/tiny-f16.gguf", "hf_mixtral/tiny.golden.gguf", TOL);
    check_model("hf_olmoe/tiny-f16.gguf", "hf_olmoe/tiny.golden.gguf", TOL);
    check_model("hf_glm4moe/tiny-f16.gguf", "hf_glm4moe/tiny.golden.gguf", TOL);
    check_model("hf_deepseek2/tiny-f16.gguf", "hf_deepseek2/tiny.golden.gguf", TOL);
    check_model("hf_gemma4/tiny-f16.gguf", "hf_gemma4/tiny.golden.gguf", TOL);
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

/* Steps tokens [from, to) of the dump's; copies the logits and lin_core (or x_out) of the last. */
static void step_tokens(ref_seq *s, const ref_model *m, const tm_gguf_array *tok, int from, int to,
                        double *logits, double *inner) {
    for (int p = from; p < to; p++)
        if (ref_seq_step(s, gguf_array_get_i32(tok, (uint64_t)p)) != TM_OK)
            fail_msg("%s", tm_error_message());
    const ref_step_out *o = ref_seq_out(s);
    const int64_t n_inner = o->lin_core ? (int64_t)m->n_layer * m->n_v_head * m->v_dim
                                        : (int64_t)m->n_layer * m->n_embd;
    memcpy(logits, o->logits, (size_t)m->n_vocab * sizeof(double));
    memcpy(inner, o->lin_core ? o->lin_core : o->x_out, (size_t)n_inner * sizeof(double));
}

/* Rewind and step again: the same values bit for bit. A hybrid goes back to 0 only; a rewind
 * elsewhere is an error that leaves the sequence as it was (the next step equals a fresh
 * sequence's). qwen3moe, for contrast, goes back to any position. */
static void check_rewind(const char *model_rel, const char *golden_rel, int hybrid) {
    char model_path[512], golden_path[512];
    data_path(model_path, sizeof(model_path), model_rel);
    data_path(golden_path, sizeof(golden_path), golden_rel);
    ref_model *m;
    tm_gguf_file *g;
    const tm_gguf_array *tok;
    if (ref_model_load(model_path, &m) != TM_OK || gguf_file_open(golden_path, &g) != TM_OK ||
        gguf_file_get_array(g, "dump.tokens", &tok) != TM_OK)
        fail_msg("%s", tm_error_message());
    enum { N = 12, BACK = 5 };
    const size_t n_inner =
        (size_t)m->n_layer *
        (size_t)(m->n_embd > m->n_v_head * m->v_dim ? m->n_embd : m->n_v_head * m->v_dim);
    double *l0 = calloc((size_t)m->n_vocab, 8), *l1 = calloc((size_t)m->n_vocab, 8),
           *i0 = calloc(n_inner, 8), *i1 = calloc(n_inner, 8);
    ref_seq *s, *fresh;
    assert_int_equal(ref_seq_create(m, N + 1, &s), TM_OK);
    step_tokens(s, m, tok, 0, N, l0, i0);
    assert_int_equal(ref_seq_rewind(s, N), TM_OK); /* at the end: nothing to forget */
    assert_int_equal(ref_seq_rewind(s, -1), TM_ERR_ARG);
    const int back = hybrid ? 0 : BACK;
    if (hybrid) {
        assert_int_equal(ref_seq_rewind(s, BACK), TM_ERR_UNSUPPORTED);
        assert_non_null(strstr(tm_error_message(), "only a rewind to 0"));
        /* the sequence is as it was: its next step is a fresh sequence's */
        assert_int_equal(ref_seq_create(m, N + 1, &fresh), TM_OK);
        step_tokens(fresh, m, tok, 0, N + 1, l1, i1);
        step_tokens(s, m, tok, N, N + 1, l0, i0);
        assert_memory_equal(l0, l1, (size_t)m->n_vocab * 8);
        assert_memory_equal(i0, i1, n_inner * 8);
        ref_seq_free(fresh);
    }
    const int end = hybrid ? N + 1 : N; /* l0, i0: position end - 1's */
    assert_int_equal(ref_seq_rewind(s, back), TM_OK);
    step_tokens(s, m, tok, back, end, l1, i1);
    assert_memory_equal(l0, l1, (size_t)m->n_vocab * 8);
    assert_memory_equal(i0, i1, n_inner * 8);
    printf("  %s: rewound to %d and stepped to %d again: the same values bit for bit%s\n",
           model_rel, back, end, hybrid ? "; a rewind to 5 refused" : "");
    free(l0), free(l1), free(i0), free(i1);
    ref_seq_free(s);
    gguf_file_close(g);
    ref_model_free(m);
}

static void test_rewind(void **state) {
    (void)state;
    check_rewind("hf_qwen3moe/tiny-f32.gguf", "hf_qwen3moe/tiny-f32.golden.gguf", 0);
    check_rewind("hf_qwen3next/tiny-f16.gguf", "hf_qwen3next/tiny.golden.gguf", 1);
    check_rewind("hf_qwen35moe/tiny-f16.gguf", "hf_qwen35moe/tiny.golden.gguf", 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3moe_f32), cmocka_unit_test(test_qwen3moe_q8_0),
        cmocka_unit_test(test_gptoss_mxfp4), cmocka_unit_test(test_qwen3next),
        cmocka_unit_test(test_qwen35moe),    cmocka_unit_test(test_moe_archs),
        cmocka_unit_test(test_rewind),       cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
