/* Every placement of the executor and the tier, on a machine without a GPU:
 * linked with the host mock of the CUDA backend (tests/mock/), whose stream
 * is a thread of its own running the kernels' contracts in order, with real
 * graphs (capture and replay) and real flags between the stream and the host.
 *
 *   - the placement matrix (tests/matrix/) on the tiny model (3 layers, 16
 *     experts) and on a 4-layer, 32-expert one;
 *   - the matrix on a mixed-type tiny model (matrix_mixed): every layer's
 *     gate, up and down of another type than each other and than the next
 *     layer's, attention and embeddings of several types, with the types
 *     that have kernels (q4_K q5_K q6_K q8_0 q4_0 mxfp4 f16 bf16), chosen by
 *     all of mkmodel's means (--tensor-type rules, --type-up/down-exps, the
 *     classes);
 *   - the matrix on the tiny model in mkmodel's dynamic mix (matrix_dynamic:
 *     iq1_m / iq2_xxs experts, the first layer q4_K, q8_0 attention, q6_K
 *     embeddings and output); skipped (77) while a type of it has no quantizer
 *     or CPU kernel, the CPU-only case alone while one has no CUDA kernel (the
 *     mock runs the launchers' argument checks);
 *   - the GPU's precise-mode numbers of Gemma 4's files (matrix_gemma4_f16): the mock's
 *     cuda_gemm rounding its inputs to f16 as the GPU does, against check_model.c's
 *     tolerances;
 *   - bad input: a --moe-cache above the free VRAM (needed and free named), an
 *     explicit -ngl without a GPU (an error), --cpu-moe without one (CPU only),
 *     -ot errors naming the flag;
 *   - the VRAM cache rewritten between steps (tier_cache_set): same logits;
 *   - --profile: the MoE step's per-class times are measured, same logits;
 *   - a hand-off that times out fails the step with a message naming the
 *     layer, without hanging either side;
 *   - a fetch lane whose copies fail: the CPU lane computes those experts.
 *
 * Tolerances of the matrix (relative L2 of the logits against the f64
 * reference of tests/ref/ref_forward.h): in the precise mode the mock, like
 * the CPU, computes every product in double from the exactly dequantized
 * weights and stores floats, so what is left is float32 storage of
 * activations and the KV cache: about sqrt(n) u (u = 2^-24, n <= 512 here)
 * a stage, a few stages a layer, 3-4 layers: 1e-5, as
 * tests/oracle/test_forward_ref.py derives. With the CPU ops in their normal
 * mode (8-bit activations, f16 KV): 4e-2, the same file's derivation.
 * Router logits (their worst error over a token's experts, relative to the
 * RMS of the reference's): precise, bounded by the same 1e-5 (measured
 * 1.4e-6), so a routing may differ only where the reference's gap is below
 * twice that: tie 2e-5 (the matrix's trace has no such gap). With 8-bit
 * activations the worst entry of a token's router logits is off by about 4
 * sigma of a per-entry error of ~1% (0.7% a stage, test_forward_ref.py, over
 * 3-4 layers): 4-5%; bound 10% (measured 3.9%, the tiny gpt-oss whose
 * 64-wide rows quantize in two blocks), tie_quant 0.2. The other tests here
 * compare two contexts of the engine (the same code on other lanes) with the
 * precise tolerance. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "cuda/cuda_args.h"
#include "matrix/placement_matrix.h"
#include "model/model.h"
#include "model/synth.h"

#define ALL (1 << 20)

static const pm_tolerance mock_tol = {1e-5, 1e-5, 4e-2, 2e-5, 0.2, 0};

static char tiny_path[512], wide_path[512];

/* The models, named per TM_TEST_GROUP: the groups run at once, in one folder. */
static int setup(void **state) {
    (void)state;
    const char *group = getenv("TM_TEST_GROUP");
    char name[128];
    snprintf(name, sizeof(name), "mock_tiny%s%s.gguf", group ? "_" : "", group ? group : "");
    pm_model_write(tiny_path, sizeof(tiny_path), name, 3, 16, TM_TYPE_Q8_0);
    snprintf(name, sizeof(name), "mock_4x32%s%s.gguf", group ? "_" : "", group ? group : "");
    pm_model_write(wide_path, sizeof(wide_path), name, 4, 32,
                   TM_TYPE_Q4_K); /* q4_K attention, as Q4_K_M files */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(tiny_path), remove(wide_path);
    return 0;
}

static void test_matrix_tiny(void **state) {
    (void)state;
    placement_matrix_run(tiny_path, &mock_tol);
}

/* Spans over two GPUs, on both models (the wide one's q4_K attention). */
static void test_matrix_gpus(void **state) {
    (void)state;
    placement_matrix_run_gpus(tiny_path, &mock_tol);
    placement_matrix_run_gpus(wide_path, &mock_tol);
}

static void test_matrix_4x32(void **state) {
    (void)state;
    placement_matrix_run(wide_path, &mock_tol);
}

/* gpt-oss (tests/data/hf_gptoss: sinks, window 8, biases, clamped SwiGLU, YaRN)
 * under every placement: its experts' biases and activation on every GPU lane. */
static void gptoss_path(char *path, size_t len) {
    const char *data = getenv("TM_TEST_DATA");
    snprintf(path, len, "%s/hf_gptoss/tiny-mxfp4.gguf", data ? data : "tests/data");
}

/* ---- mixed types ---- */

static char mixed_path[512], dynamic_path[512];
static char dynamic_skip[512];     /* why the dynamic mix cannot run yet ("" : it can) */
static char dynamic_cpu_only[512]; /* why it runs on the CPU only ("": every placement) */

/* Layer 0: gate q4_K, up q5_K, down q6_K, attention q6_K; layer 1: gate q8_0,
 * up mxfp4, down q4_0, q and k q4_0 (v and output q8_0: not stackable with
 * them); layer 2: gate f16, up q8_0, down q5_K, attn_output bf16. Embeddings
 * q5_K, output q6_K. */
static void mixed_config(tm_synth_config *sc) {
    pm_model_config(sc, 3, 16, TM_TYPE_Q8_0);
    static const char *const rules[] = {
        "blk\\.0\\.ffn_gate=q4_K",    "blk\\.0\\.ffn_up=q5_K",       "blk\\.0\\.ffn_down=q6_K",
        "blk\\.0\\.attn=q6_K",        "blk\\.1\\.ffn_gate=q8_0",     "blk\\.1\\.ffn_up=mxfp4",
        "blk\\.1\\.ffn_down=q4_0",    "blk\\.1\\.attn_[qk]\\.=q4_0", "blk\\.2\\.ffn_gate=f16",
        "blk\\.2\\.attn_output=bf16",
    };
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
        if (synth_config_tensor_type(sc, rules[i]) != TM_OK) fail_msg("%s", tm_error_message());
    sc->type_up_exps = TM_TYPE_Q8_0, sc->type_down_exps = TM_TYPE_Q5_K; /* layer 2's */
    sc->type_embd = TM_TYPE_Q5_K, sc->type_output = TM_TYPE_Q6_K;
}

/* The file's tensor types, as they must be: what the matrix runs on. */
static void mixed_check_types(const char *path) {
    static const struct {
        const char *name;
        tm_type type;
    } want[] = {
        {"blk.0.ffn_gate_exps.weight", TM_TYPE_Q4_K}, {"blk.0.ffn_up_exps.weight", TM_TYPE_Q5_K},
        {"blk.0.ffn_down_exps.weight", TM_TYPE_Q6_K}, {"blk.0.attn_v.weight", TM_TYPE_Q6_K},
        {"blk.1.ffn_gate_exps.weight", TM_TYPE_Q8_0}, {"blk.1.ffn_up_exps.weight", TM_TYPE_MXFP4},
        {"blk.1.ffn_down_exps.weight", TM_TYPE_Q4_0}, {"blk.1.attn_k.weight", TM_TYPE_Q4_0},
        {"blk.1.attn_v.weight", TM_TYPE_Q8_0},        {"blk.2.ffn_gate_exps.weight", TM_TYPE_F16},
        {"blk.2.ffn_up_exps.weight", TM_TYPE_Q8_0},   {"blk.2.ffn_down_exps.weight", TM_TYPE_Q5_K},
        {"blk.2.attn_output.weight", TM_TYPE_BF16},   {"blk.2.attn_q.weight", TM_TYPE_Q8_0},
        {"token_embd.weight", TM_TYPE_Q5_K},          {"output.weight", TM_TYPE_Q6_K},
    };
    tm_gguf_file *f;
    if (gguf_file_open(path, &f) != TM_OK) fail_msg("%s", tm_error_message());
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const tm_gguf_tensor *t = gguf_file_find_tensor(f, want[i].name);
        if (!t || t->type != (uint32_t)want[i].type)
            fail_msg("%s: %s has type %s, want %s", path, want[i].name,
                     t ? quant_type_name(t->type) : "(missing)", quant_type_name(want[i].type));
    }
    gguf_file_close(f);
}

static int setup_mixed(void **state) {
    (void)state;
    tm_synth_config sc;
    mixed_config(&sc);
    if (pm_model_write_config(mixed_path, sizeof(mixed_path), "mock_mixed.gguf", &sc) != TM_OK)
        fail_msg("mkmodel: %s", tm_error_message());
    return 0;
}

static int teardown_mixed(void **state) {
    (void)state;
    remove(mixed_path);
    return 0;
}

static void test_matrix_mixed(void **state) {
    (void)state;
    mixed_check_types(mixed_path);
    placement_matrix_run(mixed_path, &mock_tol);
}

/* Why the tiny dynamic-mix model cannot run here ("" when it can): a type
 * without a quantizer (mkmodel refuses it), a CPU kernel (the loader) or a
 * CUDA kernel (the mock's launchers check the types as the real ones do). */
static int setup_dynamic(void **state) {
    (void)state;
    tm_synth_config sc;
    pm_model_config(&sc, 3, 16, TM_TYPE_Q8_0);
    if (synth_config_mix(&sc, "dynamic") != TM_OK) fail_msg("%s", tm_error_message());
    tm_status st =
        pm_model_write_config(dynamic_path, sizeof(dynamic_path), "mock_dynamic.gguf", &sc);
    if (st == TM_ERR_UNSUPPORTED) {
        snprintf(dynamic_skip, sizeof(dynamic_skip), "mkmodel: %s", tm_error_message());
        return 0;
    }
    if (st != TM_OK) fail_msg("mkmodel: %s", tm_error_message());
    tm_model *m;
    st = model_load(dynamic_path, &m);
    if (st == TM_ERR_UNSUPPORTED) {
        snprintf(dynamic_skip, sizeof(dynamic_skip), "load: %s", tm_error_message());
        return 0;
    }
    if (st != TM_OK) fail_msg("load: %s", tm_error_message());
    for (uint64_t i = 0; i < m->file->n_tensors && !dynamic_cpu_only[0]; i++) {
        const tm_gguf_tensor *t = &m->file->tensors[i];
        size_t esz;
        if (t->n_dims >= 2 && !cuda_weight_block((tm_type)t->type, &esz))
            snprintf(dynamic_cpu_only, sizeof(dynamic_cpu_only),
                     "%.*s: type %s has no CUDA kernel yet", (int)t->name.len, t->name.data,
                     quant_type_name(t->type));
    }
    model_free(m);
    return 0;
}

static int teardown_dynamic(void **state) {
    (void)state;
    remove(dynamic_path);
    return 0;
}

static void test_matrix_dynamic(void **state) {
    (void)state;
    if (dynamic_skip[0]) {
        printf("  the dynamic mix cannot run yet: %s\n", dynamic_skip);
        skip();
    }
    /* the CPU's kernels before the GPU's: the CPU-only case against the reference meanwhile */
    const bool narrow = dynamic_cpu_only[0] && !getenv("TM_PM_ONLY");
    if (narrow) {
        printf("  the dynamic mix on the CPU only: %s\n", dynamic_cpu_only);
        setenv("TM_PM_ONLY", "CPU only", 1);
    }
    placement_matrix_run(dynamic_path, &mock_tol);
    if (narrow) unsetenv("TM_PM_ONLY");
}

static void test_matrix_gptoss(void **state) {
    (void)state;
    char path[512];
    gptoss_path(path, sizeof(path));
    placement_matrix_run(path, &mock_tol);
}

/* Qwen3-Next and Qwen3.5-MoE (tests/data/hf_qwen3next, hf_qwen35moe, written by
 * llama.cpp's converter): linear attention's states per sequence on the layer's
 * side, gated attention with partial RoPE, the gated shared expert beside the
 * tier's routed experts, under every placement. */
static void test_matrix_qwen3next(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    static const char *const files[] = {"hf_qwen3next", "hf_qwen35moe"};
    for (int i = 0; i < 2; i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s/tiny-f16.gguf", data ? data : "tests/data", files[i]);
        placement_matrix_run(path, &mock_tol);
    }
}

/* Mixtral (arch llama), OLMoE and GLM-4-MoE (tests/data/hf_mixtral, hf_olmoe, hf_glm4moe,
 * written by llama.cpp's converter): interleaved RoPE, q/k norms over the whole projection,
 * attention biases, partial RoPE, GLM's leading dense layer and shared expert beside
 * attention, its sigmoid router with a selection bias and groups, under every placement. */
static void test_matrix_moe_archs(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    static const char *const files[] = {"hf_mixtral", "hf_olmoe", "hf_glm4moe"};
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s/tiny-f16.gguf", data ? data : "tests/data", files[i]);
        placement_matrix_run(path, &mock_tol);
    }
}

/* DeepSeek-V3 (arch deepseek2, tests/data/hf_deepseek2, written by llama.cpp's converter):
 * MLA (absorbed: the per-head products of attn_k_b / attn_v_b, a batch's rows gathered a
 * head at a time on the GPU; latent attention over a cache of the latent and the RoPE key,
 * the mock's cuda_mla_* in double), YaRN, the leading dense layer and the shared expert
 * beside attention, the routed experts in the tier, under every placement. */
static void test_matrix_deepseek2(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    char path[512];
    snprintf(path, sizeof(path), "%s/hf_deepseek2/tiny-f16.gguf", data ? data : "tests/data");
    placement_matrix_run(path, &mock_tol);
    /* DeepSeek-V2-Lite's kind (mkmodel tiny-deepseek-v2-lite): a plain attn_q, the softmax
       router without selection bias, groups or renormalisation */
    tm_synth_config sc;
    if (synth_config_preset(&sc, "tiny-deepseek-v2-lite") != TM_OK ||
        pm_model_write_config(path, sizeof(path), "mock_ds_v2_lite.gguf", &sc) != TM_OK)
        fail_msg("mkmodel: %s", tm_error_message());
    placement_matrix_run(path, &mock_tol);
    remove(path);
}

/* mkmodel's tiny-gemma-4 with 2 of 16 experts and q8_0 matrices, to $TM_TEST_TMP/name. */
static void gemma4_mk_write(char *path, size_t len, const char *name) {
    tm_synth_config sc;
    if (synth_config_preset(&sc, "tiny-gemma-4") != TM_OK) fail_msg("%s", tm_error_message());
    sc.n_embd = 256, sc.n_expert = 16, sc.n_expert_used = 2, sc.n_ff_exp = 64, sc.n_ff = 256;
    sc.type_experts = sc.type_attn = sc.type_shexp = TM_TYPE_Q8_0, sc.seed = 11;
    if (pm_model_write_config(path, len, name, &sc) != TM_OK)
        fail_msg("mkmodel: %s", tm_error_message());
}

/* Gemma 4's MoE form (arch gemma4, tests/data/hf_gemma4 written by llama.cpp's converter, and
 * mkmodel's tiny-gemma-4 with 2 of 16 experts and q8_0 matrices): sliding and global layers of
 * their own heads and KV heads (a KV cache and a RoPE table each), K as V and the value norm,
 * the dense MLP beside the experts (GELU-tanh), the router's norm and per-expert scales, the
 * soft-cap, under every placement: the layers on the GPU too, the fused ffn_gate_up_exps
 * through every lane of the tier (its two views), the SSD tier's RAM cache included. */
static void test_matrix_gemma4(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    char path[512];
    snprintf(path, sizeof(path), "%s/hf_gemma4/tiny-f16.gguf", data ? data : "tests/data");
    placement_matrix_run(path, &mock_tol);
    /* --cpu-moe and --n-cpu-moe keep the fused ffn_gate_up_exps in RAM with the rest */
    tm_model *m;
    if (model_load(path, &m) != TM_OK) fail_msg("%s", tm_error_message());
    for (int i = 0; i < 2; i++) {
        tm_context *c = NULL;
        const tm_context_params p = {.n_ctx = 64,
                                     .n_batch = 8,
                                     .n_threads = 2,
                                     .n_gpu_layers = 99,
                                     .cpu_moe = i == 0,
                                     .n_cpu_moe = i == 0 ? 0 : 99};
        if (model_context_create(m, &p, &c) != TM_OK) fail_msg("%s", tm_error_message());
        for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
            char name[64];
            snprintf(name, sizeof(name), "blk.%u.ffn_gate_up_exps.weight", l);
            const int64_t id = gguf_file_find_tensor_index(m->file, name);
            if (id < 0 || c->placement.tensor_dev[id] != TM_DEV_CPU ||
                c->placement.layer_dev[l] != TM_DEV_GPU)
                fail_msg("%s: %s not in RAM beside its layer on the GPU",
                         i == 0 ? "--cpu-moe" : "--n-cpu-moe 99", name);
        }
        model_context_free(c);
    }
    model_free(m);
    gemma4_mk_write(path, sizeof(path), "mock_gemma4.gguf");
    placement_matrix_run(path, &mock_tol);
    remove(path);
}

/* The GPU's precise-mode numbers on the CPU: the converter's gemma4 file and mkmodel's under
 * every placement with the mock's cuda_gemm rounding its inputs to f16 as gemm.cu does
 * (MOCK_GEMM_F16=1), against check_model.c's tolerances, decode after prompt batches scaled
 * by the file's attention spread as there (pm_attn_spread: 5.9 and 1). The prompt's f16 q, k
 * and v carry into every later step through the cache, and Gemma 4's scale 1 over the
 * converter's QK gains near 1 magnifies their error: seen 3.8e-3 (decode) and 1.9e-5, as the
 * H200's 3.4e-3 to 4.0e-3 and 2.0e-5; seen failing with gemma4.c's attention scale 2% off. */
static void test_matrix_gemma4_f16(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    char path[512];
    snprintf(path, sizeof(path), "%s/hf_gemma4/tiny-f16.gguf", data ? data : "tests/data");
    char mk[512];
    gemma4_mk_write(mk, sizeof(mk), "mock_gemma4_f16.gguf");
    setenv("MOCK_GEMM_F16", "1", 1);
    const char *const paths[] = {path, mk};
    for (int i = 0; i < 2; i++) {
        const double spread = pm_attn_spread(paths[i]);
        printf("  %s: attention spread %.3g\n", paths[i], spread);
        const pm_tolerance tol = {PM_GPU_TOL_PROMPT,    PM_GPU_TOL_DECODE,
                                  PM_GPU_TOL_QUANT,     PM_GPU_REF_TIE,
                                  PM_GPU_REF_TIE_QUANT, PM_GPU_TOL_DECODE * spread};
        placement_matrix_run(paths[i], &tol);
    }
    unsetenv("MOCK_GEMM_F16");
    remove(mk);
}

static tm_context_params params(int ngl, bool cpu_moe, const char *ot, int64_t cache_mib);

static tm_context_params params(int ngl, bool cpu_moe, const char *ot, int64_t cache_mib) {
    return (tm_context_params){.n_ctx = 128,
                               .n_batch = 16,
                               .n_threads = 2,
                               .kv_type = TM_TYPE_F32,
                               .precise = true,
                               .n_gpu_layers = ngl,
                               .cpu_moe = cpu_moe,
                               .override_tensor = ot,
                               .moe_cache_mib = cache_mib};
}

static void expect_error(tm_model *m, const tm_context_params *p, tm_status want,
                         const char *const *words, const char *what) {
    tm_context *c = NULL;
    const tm_status st = model_context_create(m, p, &c);
    if (st != want)
        fail_msg("%s: status %d (%s), want %d", what, st, st ? tm_error_message() : "ok", want);
    for (const char *const *w = words; *w; w++)
        if (!strstr(tm_error_message(), *w))
            fail_msg("%s: message does not name '%s': %s", what, *w, tm_error_message());
    assert_null(c);
}

static void test_bad_input(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(tiny_path, &m), TM_OK);
    /* a cache larger than the free VRAM: an error stating both */
    setenv("MOCK_GPU_MIB", "64", 1);
    tm_context_params p = params(ALL, true, NULL, 1000);
    expect_error(m, &p, TM_ERR_DEVICE, (const char *const[]){"--moe-cache", "needed", "free", NULL},
                 "--moe-cache 1000 on 64 MiB");
    unsetenv("MOCK_GPU_MIB");
    /* -ot mistakes name the flag */
    p = params(ALL, false, "blk\\.(=CUDA0", 0);
    expect_error(m, &p, TM_ERR_ARG, (const char *const[]){"-ot", "offset", NULL}, "bad regex");
    p = params(ALL, false, "exps=GPU1", 0);
    expect_error(m, &p, TM_ERR_ARG, (const char *const[]){"-ot", "GPU1", "CUDA0", NULL},
                 "unknown buffer type");
    /* a host that cannot pin the experts: no PCIe lane, the CPU lane takes every cold slot */
    setenv("MOCK_NOREGISTER", "1", 1);
    p = params(ALL, true, NULL, 0);
    tm_context *np;
    assert_int_equal(model_context_create(m, &p, &np), TM_OK);
    unsetenv("MOCK_NOREGISTER");
    assert_int_equal(tier_pcie_slots(np->tier), 0);
    const int32_t one = 3;
    assert_int_equal(model_decode(np, &one, 1, TM_MOE_PHASE_DECODE, false), TM_OK);
    const tm_tier_stats *ns = &tier_stats(np->tier)[TM_TIER_RAM];
    assert_true(ns->cold_slots == ns->calls * m->cfg.n_expert_used && ns->pcie_slots == 0);
    model_context_free(np);
    /* no GPU: --cpu-moe (and -ngl auto) run on the CPU; an explicit -ngl is an error */
    setenv("MOCK_NODEV", "1", 1);
    p = params(TM_NGL_AUTO, true, NULL, 0);
    tm_context *c;
    assert_int_equal(model_context_create(m, &p, &c), TM_OK);
    assert_false(c->placement.any_gpu);
    assert_null(exec_gpu(c->exec));
    const int32_t tok[2] = {3, 5};
    assert_int_equal(model_decode(c, tok, 2, TM_MOE_PHASE_PROMPT, false), TM_OK);
    model_context_free(c);
    p = params(2, false, NULL, 0);
    expect_error(m, &p, TM_ERR_DEVICE, (const char *const[]){"no device", NULL}, "-ngl 2, no GPU");
    unsetenv("MOCK_NODEV");
    model_free(m);
}

/* Logits of a few prompt tokens and decode steps, greedy. */
static void run_tokens(tm_context *c, int n, int32_t *out, float *logits_last) {
    int32_t id = 7;
    for (int i = 0; i < n; i++) {
        if (model_decode(c, &id, 1, TM_MOE_PHASE_DECODE, false) != TM_OK)
            fail_msg("decode step %d: %s", i, tm_error_message());
        int64_t b = 0;
        for (int64_t v = 1; v < c->model->cfg.n_vocab; v++)
            if (c->logits[v] > c->logits[b]) b = v;
        out[i] = id = (int32_t)b;
    }
    if (logits_last) memcpy(logits_last, c->logits, c->model->cfg.n_vocab * sizeof(float));
}

static void test_cache_set(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(wide_path, &m), TM_OK);
    const int64_t V = m->cfg.n_vocab;
    tm_context_params p = params(0, false, NULL, 0);
    tm_context *ref, *c;
    assert_int_equal(model_context_create(m, &p, &ref), TM_OK);
    p = params(ALL, true, NULL, 1);
    p.moe_cache.update = TM_MOE_UPDATE_OFF; /* only the manual sets change the slots */
    assert_int_equal(model_context_create(m, &p, &c), TM_OK);
    const int32_t slots = tier_cache_slots(c->tier, 1);
    assert_true(slots > 0 && slots < 32);
    for (int32_t s = 0; s < slots; s++) assert_int_equal(tier_slot_of(c->tier, 1, s), s);
    int32_t a[12], b[12];
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    run_tokens(ref, 6, a, NULL);
    run_tokens(c, 6, b, NULL);
    /* other experts into every slot of layer 1 (the old ones become cold) */
    for (int32_t s = 0; s < slots; s++)
        if (tier_cache_set(c->tier, 1, s, 31 - s) != TM_OK)
            fail_msg("tier_cache_set: %s", tm_error_message());
    assert_int_equal(tier_slot_of(c->tier, 1, 0), -1);
    assert_int_equal(tier_slot_of(c->tier, 1, 31), 0);
    assert_int_equal(tier_cache_set(c->tier, 1, 0, 30), TM_ERR_ARG); /* 30 is in slot 1 */
    assert_int_equal(tier_cache_set(c->tier, 1, slots, 5), TM_ERR_ARG);
    run_tokens(ref, 6, a + 6, la);
    run_tokens(c, 6, b + 6, lb);
    for (int i = 0; i < 12; i++) assert_int_equal(a[i], b[i]);
    const double err = pm_rel_l2(lb, la, V);
    if (!(err <= mock_tol.decode)) fail_msg("after tier_cache_set: logits error %.3g", err);
    free(la), free(lb);
    model_context_free(ref), model_context_free(c);
    model_free(m);
}

/* The prompt batch when none is given (model_context_create): 512, or with experts in RAM
 * behind a GPU the largest of 4096, 2048, 1024 that fits the VRAM left; -b wins. The mock's
 * device has MOCK_GPU_MIB of memory. Then a 1,100-token prompt in that one batch through
 * the mock GPU against the CPU engine in a batch as large (the mock's arithmetic is its own,
 * in double). */
static void test_batch_auto(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(wide_path, &m), TM_OK);
    static const struct {
        const char *what;
        int ngl;
        bool cpu_moe;
        int64_t batch, cache_mib;
        const char *mock_mib;
        int64_t want;
    } cases[] = {
        {"CPU only", 0, false, 0, 0, "4096", 512},
        {"-ngl all: every expert in VRAM", ALL, false, 0, 0, "4096", 512},
        {"--cpu-moe", ALL, true, 0, 0, "4096", 4096},
        {"--cpu-moe -b 256", ALL, true, 256, 0, "4096", 256},
        {"--cpu-moe on a device without room", ALL, true, 0, 0, "800", 512},
        {"--cpu-moe --moe-cache taking the room", ALL, true, 0, 3300, "4096", 512},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        setenv("MOCK_GPU_MIB", cases[i].mock_mib, 1);
        tm_context_params p = params(cases[i].ngl, cases[i].cpu_moe, NULL, cases[i].cache_mib);
        p.n_ctx = 8192, p.n_batch = cases[i].batch;
        tm_context *c;
        if (model_context_create(m, &p, &c) != TM_OK)
            fail_msg("%s: %s", cases[i].what, tm_error_message());
        printf("    %s: prompt batch %lld\n", cases[i].what, (long long)c->params.n_batch);
        if (c->params.n_batch != cases[i].want)
            fail_msg("%s: prompt batch %lld, expected %lld", cases[i].what,
                     (long long)c->params.n_batch, (long long)cases[i].want);
        model_context_free(c);
    }
    unsetenv("MOCK_GPU_MIB");
    tm_context_params rp = params(0, false, NULL, 0), gp = params(ALL, true, NULL, 0);
    rp.n_ctx = gp.n_ctx = 2048, rp.n_batch = 2048, gp.n_batch = 0;
    pm_run *ref = pm_run_open(m, &rp), *run = pm_run_open(m, &gp);
    assert_int_equal(pm_run_context(run)->params.n_batch, 2048); /* n_ctx caps it */
    int32_t *toks = malloc(1104 * sizeof(int32_t));
    tm_rng r;
    tm_rng_seed(&r, 11);
    for (int i = 0; i < 1104; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % m->cfg.n_vocab);
    pm_compare(m, toks, 1100, 4, ref, run, mock_tol.prompt, mock_tol.decode, 1e-3,
               "--cpu-moe, a 1,100-token prompt in one batch");
    free(toks);
    pm_run_close(ref), pm_run_close(run);
    model_free(m);
}

/* Every cached layer's slots hold distinct experts that the maps agree on. */
static void check_slots_mapped(const tm_context *c) {
    const tm_model_config *cfg = &c->model->cfg;
    for (uint32_t l = 0; l < cfg->n_layer; l++) {
        const int32_t slots = tier_cache_slots(c->tier, l);
        int32_t mapped = 0;
        uint8_t seen[64] = {0};
        for (uint32_t e = 0; e < cfg->n_expert; e++) {
            const int32_t s = tier_slot_of(c->tier, l, (int32_t)e);
            if (s < 0) continue;
            if (s >= slots || seen[s])
                fail_msg("layer %u: expert %u in slot %d (of %d) twice", l, e, s, slots);
            seen[s] = 1, mapped++;
        }
        if (mapped != slots) fail_msg("layer %u: %d of %d slots mapped", l, mapped, slots);
    }
}

/* The cache while running: lru admits every miss after each step (uploads
 * in flight across steps, slots superseded), the updater exchanges slots
 * between requests; the tokens stay the reference's, and once settled every
 * slot holds one mapped expert. */
static void test_cache_update(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(wide_path, &m), TM_OK);
    tm_context_params p = params(0, false, NULL, 0);
    tm_context *ref, *c;
    assert_int_equal(model_context_create(m, &p, &ref), TM_OK);
    p = params(ALL, true, NULL, 1);
    p.moe_cache.update = TM_MOE_UPDATE_FULL;
    p.moe_cache.policy_set = true, p.moe_cache.policy = TM_CACHE_LRU, p.moe_cache.max_admit = -1;
    setenv("MOCK_GPU_LATENCY_US", "200", 1); /* copies still running when the next step starts */
    assert_int_equal(model_context_create(m, &p, &c), TM_OK);
    unsetenv("MOCK_GPU_LATENCY_US");
    int32_t a[24], b[24];
    run_tokens(ref, 12, a, NULL);
    run_tokens(c, 12, b, NULL);
    const tm_tier_stats *s = &tier_stats(c->tier)[TM_TIER_CACHED];
    assert_true(s->admits > 0 && s->upload_bytes > 0);
    assert_int_equal(tier_cache_settle(c->tier), TM_OK);
    check_slots_mapped(c);
    assert_int_equal(tier_cache_update(c->tier, 0.5), TM_OK);
    assert_int_equal(tier_cache_update(c->tier, 2), TM_ERR_ARG);
    assert_int_equal(tier_cache_settle(c->tier), TM_OK);
    check_slots_mapped(c);
    run_tokens(ref, 12, a + 12, NULL);
    run_tokens(c, 12, b + 12, NULL);
    for (int i = 0; i < 24; i++) assert_int_equal(a[i], b[i]);
    model_context_free(c);
    /* uploads that cannot be queued: the slots keep serving their experts */
    setenv("MOCK_FAIL_SIDE_COPY", "1", 1);
    assert_int_equal(model_context_create(m, &p, &c), TM_OK);
    run_tokens(c, 12, b, NULL);
    unsetenv("MOCK_FAIL_SIDE_COPY");
    for (int i = 0; i < 12; i++) assert_int_equal(a[i], b[i]);
    assert_int_equal(tier_stats(c->tier)[TM_TIER_CACHED].admits, 0);
    assert_int_equal(tier_cache_settle(c->tier), TM_OK);
    check_slots_mapped(c);
    model_context_free(ref), model_context_free(c);
    model_free(m);
}

static void test_profile(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(tiny_path, &m), TM_OK);
    const int64_t V = m->cfg.n_vocab;
    /* the CPU lane times its threads in the normal mode (8-bit activations) */
    tm_context_params p = params(ALL, true, NULL, 1);
    p.profile = true, p.precise = false;
    p.moe_fetch = TM_MOE_FETCH_COPY; /* auto reads 16 tokens of 4-of-32 routing in place */
    p.moe_ahead = 2;                 /* and decode steps copy experts ahead */
    p.moe_pcie = 1; /* a fixed count: auto's follows each token's cold slots, which the copies
                       ahead may leave at one (then the CPU's: tm_cuda_mapped_count) */
    tm_context *c, *ref;
    assert_int_equal(model_context_create(m, &p, &c), TM_OK);
    p = params(0, false, NULL, 0);
    assert_int_equal(model_context_create(m, &p, &ref), TM_OK);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = i * 37 % 1000;
    assert_int_equal(model_decode(c, prompt, 20, TM_MOE_PHASE_PROMPT, false), TM_OK);
    assert_int_equal(model_decode(ref, prompt, 20, TM_MOE_PHASE_PROMPT, false), TM_OK);
    for (int i = 0; i < 8; i++) { /* the reference's greedy tokens into both */
        int32_t id = 0;
        for (int64_t v = 1; v < V; v++)
            if (ref->logits[v] > ref->logits[id]) id = (int32_t)v;
        assert_int_equal(model_decode(c, &id, 1, TM_MOE_PHASE_DECODE, false), TM_OK);
        assert_int_equal(model_decode(ref, &id, 1, TM_MOE_PHASE_DECODE, false), TM_OK);
        const double err = pm_rel_l2(c->logits, ref->logits, V);
        if (!(err <= mock_tol.quant)) fail_msg("--profile, step %d: logits error %.3g", i, err);
    }
    const tm_tier_stats *s = &tier_stats(c->tier)[TM_TIER_CACHED];
    assert_int_equal(s->layers, 3);
    assert_int_equal(s->calls, 3 * 10); /* two prompt batches of 16 and 8 decode steps a layer */
    assert_int_equal(s->hot_slots + s->pcie_slots + s->cold_slots + s->fetch_slots + s->ahead_slots,
                     3 * (20 + 8) * m->cfg.n_expert_used);
    assert_true(s->cold_ns > 0 && s->hot_ns > 0 && s->gpu_wait_ns > 0 && s->merge_ns > 0);
    /* decode steps' copies ahead (the layers after the first) and their time */
    assert_true(s->ahead_experts > 0 && s->ahead_used <= s->ahead_experts && s->ahead_ns > 0);
    assert_true(s->ahead_bytes > 0 && s->ahead_slots >= s->ahead_used);
    assert_true(s->pcie_slots > 0 && s->pcie_ns > 0); /* the PCIe lane and its time */
    /* the prompt's fetch lane (the ring) */
    assert_true(s->fetch_slots > 0 && s->fetch_ns > 0 && s->copy_ns > 0);
    const uint64_t *prof = model_prof_ns(c);
    assert_true(prof[TM_PROF_EXPERTS] > 0 && prof[TM_PROF_ATTENTION] > 0);
    assert_true(model_lane_stats(c)->thread_ns > 0);
    model_context_free(c), model_context_free(ref);
    model_free(m);
}

/* A fetch lane whose copies cannot be queued: the CPU lane computes those
 * experts (counted as fallbacks), the logits stay right. */
static void test_fetch_fallback(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(tiny_path, &m), TM_OK);
    const int64_t V = m->cfg.n_vocab;
    setenv("MOCK_FAIL_SIDE_COPY", "1", 1);
    setenv("TIERMOE_FETCH_CPU_SHARE", "0", 1); /* the CPU lane takes nothing by choice */
    tm_context_params p = params(ALL, true, NULL, 0);
    p.moe_fetch = TM_MOE_FETCH_COPY; /* the ring (auto reads so few tokens in place) */
    tm_context *c, *ref;
    assert_int_equal(model_context_create(m, &p, &c), TM_OK);
    p = params(0, false, NULL, 0);
    assert_int_equal(model_context_create(m, &p, &ref), TM_OK);
    int32_t prompt[32];
    for (int i = 0; i < 32; i++) prompt[i] = i * 53 % 1000;
    assert_int_equal(model_decode(c, prompt, 32, TM_MOE_PHASE_PROMPT, false), TM_OK);
    assert_int_equal(model_decode(ref, prompt, 32, TM_MOE_PHASE_PROMPT, false), TM_OK);
    unsetenv("MOCK_FAIL_SIDE_COPY");
    unsetenv("TIERMOE_FETCH_CPU_SHARE");
    const double err = pm_rel_l2(c->logits, ref->logits, V);
    if (!(err <= mock_tol.prompt)) fail_msg("copies refused: logits error %.3g", err);
    const tm_tier_stats *s = &tier_stats(c->tier)[TM_TIER_RAM];
    /* every routed slot of the two batches went to the CPU lane */
    assert_int_equal(s->fallback_slots, 3 * 32 * m->cfg.n_expert_used);
    assert_int_equal(s->fetch_slots, 0);
    model_context_free(c), model_context_free(ref);
    model_free(m);
}

static void test_handoff_timeout(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(tiny_path, &m), TM_OK);
    /* every kernel takes 30 ms; the host gives up on a hand-off after 20 */
    setenv("MOCK_GPU_LATENCY_US", "30000", 1);
    setenv("TIERMOE_HANDOFF_TIMEOUT_MS", "20", 1);
    tm_context_params p = params(ALL, true, NULL, 0);
    tm_context *c;
    assert_int_equal(model_context_create(m, &p, &c), TM_OK);
    unsetenv("MOCK_GPU_LATENCY_US");
    unsetenv("TIERMOE_HANDOFF_TIMEOUT_MS");
    const int32_t tok = 9;
    assert_int_not_equal(model_decode(c, &tok, 1, TM_MOE_PHASE_DECODE, false), TM_OK);
    if (!strstr(tm_error_message(), "layer"))
        fail_msg("a failed hand-off should name the layer: %s", tm_error_message());
    assert_int_equal(c->seq_past[0], 0);
    model_context_free(c);
    model_free(m);
}

/* TM_TEST_GROUP=matrix_tiny|matrix_4x32|matrix_gptoss|matrix_qwen3next|matrix_moe_archs|
 * matrix_deepseek2|matrix_gemma4|matrix_gemma4_f16|matrix_mixed|matrix_dynamic|rest runs
 * one part (CTest runs
 * the parts as tests of their own, in parallel); unset: everything. */
int main(void) {
    const struct CMUnitTest matrix_tiny[] = {cmocka_unit_test(test_matrix_tiny)};
    const struct CMUnitTest matrix_4x32[] = {cmocka_unit_test(test_matrix_4x32)};
    const struct CMUnitTest matrix_gpus[] = {cmocka_unit_test(test_matrix_gpus)};
    const struct CMUnitTest matrix_gptoss[] = {cmocka_unit_test(test_matrix_gptoss)};
    const struct CMUnitTest matrix_qwen3next[] = {cmocka_unit_test(test_matrix_qwen3next)};
    const struct CMUnitTest matrix_moe_archs[] = {cmocka_unit_test(test_matrix_moe_archs)};
    const struct CMUnitTest matrix_deepseek2[] = {cmocka_unit_test(test_matrix_deepseek2)};
    const struct CMUnitTest matrix_gemma4[] = {cmocka_unit_test(test_matrix_gemma4)};
    const struct CMUnitTest matrix_gemma4_f16[] = {cmocka_unit_test(test_matrix_gemma4_f16)};
    const struct CMUnitTest matrix_mixed[] = {cmocka_unit_test(test_matrix_mixed)};
    const struct CMUnitTest matrix_dynamic[] = {cmocka_unit_test(test_matrix_dynamic)};
    const struct CMUnitTest rest[] = {
        cmocka_unit_test(test_bad_input),       cmocka_unit_test(test_cache_set),
        cmocka_unit_test(test_batch_auto),      cmocka_unit_test(test_profile),
        cmocka_unit_test(test_handoff_timeout), cmocka_unit_test(test_fetch_fallback),
        cmocka_unit_test(test_cache_update),
    };
    /* each case's line out before a crash's report (CI keeps the head of a failing test's
       output: the case that failed shows) */
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *group = getenv("TM_TEST_GROUP");
    const bool all = !group || !*group;
    int failed = 0;
    if (all || !strcmp(group, "matrix_tiny"))
        failed += cmocka_run_group_tests(matrix_tiny, setup, teardown);
    if (all || !strcmp(group, "matrix_4x32"))
        failed += cmocka_run_group_tests(matrix_4x32, setup, teardown);
    if (all || !strcmp(group, "matrix_gpus"))
        failed += cmocka_run_group_tests(matrix_gpus, setup, teardown);
    if (all || !strcmp(group, "matrix_gptoss"))
        failed += cmocka_run_group_tests(matrix_gptoss, setup, teardown);
    if (all || !strcmp(group, "matrix_qwen3next"))
        failed += cmocka_run_group_tests(matrix_qwen3next, setup, teardown);
    if (all || !strcmp(group, "matrix_moe_archs"))
        failed += cmocka_run_group_tests(matrix_moe_archs, setup, teardown);
    if (all || !strcmp(group, "matrix_deepseek2"))
        failed += cmocka_run_group_tests(matrix_deepseek2, setup, teardown);
    if (all || !strcmp(group, "matrix_gemma4"))
        failed += cmocka_run_group_tests(matrix_gemma4, setup, teardown);
    if (all || !strcmp(group, "matrix_gemma4_f16"))
        failed += cmocka_run_group_tests(matrix_gemma4_f16, setup, teardown);
    if (all || !strcmp(group, "matrix_mixed"))
        failed += cmocka_run_group_tests(matrix_mixed, setup_mixed, teardown_mixed);
    if (all || !strcmp(group, "matrix_dynamic"))
        failed += cmocka_run_group_tests(matrix_dynamic, setup_dynamic, teardown_dynamic);
    if (all || !strcmp(group, "rest")) failed += cmocka_run_group_tests(rest, setup, teardown);
    /* the dynamic mix's group alone, while it cannot run: skipped, not passed */
    if (!failed && !all && !strcmp(group, "matrix_dynamic") && dynamic_skip[0]) return 77;
    return failed;
}
