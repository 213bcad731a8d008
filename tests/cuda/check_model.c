/* Whole models on the GPU, against the CPU engine on the same tokens.
 *
 * 1. The placement matrix (tests/matrix/placement_matrix.h) on the tiny model
 *    (3 layers, 16 experts), a 4-layer, 32-expert one, and the converter's tiny files of
 *    gpt-oss, qwen3next, qwen35moe, mixtral, olmoe, glm4moe and deepseek2 (tests/data/hf_*):
 *    CPU only, -ngl all,
 *    -ngl 2, --cpu-moe (PCIe lane off, auto, every slot), --n-cpu-moe 2,
 *    --moe-cache with a random hot set, an -ot mix; logits after prompt batches
 *    and decode steps against the double-precision reference forward
 *    (tests/ref/ref_forward.h), router logits within half the tie, routing
 *    identical except at near ties, 64 greedy steps as the reference's.
 * 2. -ngl all with an f16 KV cache against the same reference (precise GPU
 *    context: f32 activations, so the f16 rounding of K and V is all that
 *    differs; the normal mode's 8-bit activations are the matrix's TOL_QUANT).
 * 3. With TM_CUDA_MODEL=path (the 30b-a3b preset on the device machine): -ngl
 *    all, --cpu-moe (PCIe lane auto and off) and --n-cpu-moe 35 against the
 *    CPU's normal mode, first 16 tokens.
 *
 * Tolerances on the relative L2 error of the logits, ||gpu - cpu|| / ||cpu||:
 *   - decode in the precise mode: activations stay f32 (the normal mode's
 *     q8_0 products take 8-bit activations on the GPU too: TOL_QUANT below)
 *     and the weights are dequantized exactly,
 *     so what is left is f32 accumulation (sqrt(n) u, n <= 2048: 3e-6) and the
 *     keys and values of earlier positions: an f16 KV cache rounds them, and those
 *     of the prompt came from its tensor-core products (f16 inputs, below) even
 *     in an f32 cache: about 2^-11 = 4.9e-4 relative per value, averaging down
 *     over a head's dot product. TOL_DECODE = 5e-3 covers a few layers with a 10x
 *     margin over 4.9e-4 where the attention logits have the usual size (scale
 *     1/sqrt(D): those of unit-RMS q and k spread about 1). Gemma 4's are sqrt(D)
 *     rms(q_norm ⊙ k_norm) (scale 1 over RMS-normed heads: pm_attn_spread), 1 in
 *     mkmodel's file (gains D^-1/4) but 4.2 to 5.9 in the converter's (HF's gains
 *     near 1, heads of 16 and 32): a key's relative error e moves its logit by
 *     about e sqrt(2) times that spread, and the softmax passes it on, so the
 *     tolerance of decode steps after prompt batches is TOL_DECODE times the spread
 *     there; the greedy steps, token by token from the first (f32 products only),
 *     keep TOL_DECODE. Measured for the converter's file: 3.4e-3 to 4.0e-3 on an
 *     H200 at ca5d2ae; 3.8e-3 on the host mock rounding cuda_gemm's inputs to f16
 *     as the GPU does (test_mock_placement's matrix_gemma4_f16), 5.8e-4 there with
 *     the file's QK gains times D^-1/4;
 *   - prompt batches round activations and weights to f16 for the tensor
 *     cores: 2 x 2^-11 relative per product input pair, about 1e-3 per stage;
 *     four stages a layer (q/k/v, attention with f16 K/V, output, experts) over
 *     3 layers, added along the residual stream: TOL_PROMPT = 1.5e-2.
 *   - any CPU op in its normal mode (8-bit activations): TOL_QUANT = 4e-2, the
 *     error derived in tests/oracle/test_forward_ref.py.
 * Routing must match exactly except at a near tie: reference k-th and
 * (k+1)-th router logits closer than TIE (TIE_QUANT where either side runs the
 * CPU's 8-bit activations); such a step is reported and not compared. In the
 * matrix (against the f64 reference) the ties are relative to the RMS of the
 * token's router logits and twice the bound the matrix puts on their error:
 * REF_TIE = 2 TOL_PROMPT (the precise mode's worst stage, tensor-core prompts),
 * REF_TIE_QUANT = 0.2 (8-bit activations: test_mock_placement.c derives it);
 * the greedy steps' tie is 2 TOL_DECODE (placement_matrix.h). */
#ifdef TM_HAVE_CUDA
#include "cuda_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matrix/placement_matrix.h"
#include "model/model.h"
#include "model/synth.h"

#define TOL_DECODE PM_GPU_TOL_DECODE
#define TOL_PROMPT PM_GPU_TOL_PROMPT
#define TOL_QUANT  PM_GPU_TOL_QUANT
#define TIE        1e-3
#define TIE_QUANT  2e-2 /* 8-bit activations move router logits by up to ~1e-2 */

#define REF_TIE       PM_GPU_REF_TIE
#define REF_TIE_QUANT PM_GPU_REF_TIE_QUANT

static const pm_tolerance gpu_tol = {TOL_PROMPT, TOL_DECODE, TOL_QUANT, REF_TIE, REF_TIE_QUANT, 0};

static tm_context_params run_params(int ngl, bool cpu_moe, int n_cpu_moe, bool precise, tm_type kv,
                                    int64_t n_batch, int n_threads) {
    return (tm_context_params){.n_ctx = 256,
                               .n_batch = n_batch,
                               .n_threads = n_threads,
                               .kv_type = kv,
                               .precise = precise,
                               .n_gpu_layers = ngl,
                               .cpu_moe = cpu_moe,
                               .n_cpu_moe = n_cpu_moe};
}

void check_model(void **state) {
    (void)state;
    NEED_DEVICE();
    char tiny[512], wide[512];
    pm_model_write(tiny, sizeof(tiny), "cuda_tiny.gguf", 3, 16, TM_TYPE_Q8_0);
    pm_model_write(wide, sizeof(wide), "cuda_4x32.gguf", 4, 32,
                   TM_TYPE_Q4_K); /* q4_K attention, as Q4_K_M files */
    placement_matrix_run(tiny, &gpu_tol);
    placement_matrix_run(wide, &gpu_tol);
    /* gpt-oss (sinks, windows, biases, YaRN): CPU only and its --cpu-moe placements */
    const char *data = getenv("TM_TEST_DATA");
    char oss[512];
    snprintf(oss, sizeof(oss), "%s/hf_gptoss/tiny-mxfp4.gguf", data ? data : "tests/data");
    placement_matrix_run(oss, &gpu_tol);
    /* qwen3next and qwen35moe (linear attention's kernels, partial RoPE, the shared expert);
     * mixtral (interleaved RoPE), olmoe (q/k norm over the projection, no renormalisation),
     * glm4moe (biases, dense layers, shared expert, the biased grouped sigmoid router),
     * deepseek2 (latent attention: mla.cu, YaRN, the per-head products) */
    static const char *const hybrids[] = {"hf_qwen3next", "hf_qwen35moe", "hf_mixtral",
                                          "hf_olmoe",     "hf_glm4moe",   "hf_deepseek2"};
    for (size_t i = 0; i < sizeof(hybrids) / sizeof(hybrids[0]); i++) {
        char hy[512];
        snprintf(hy, sizeof(hy), "%s/%s/tiny-f16.gguf", data ? data : "tests/data", hybrids[i]);
        placement_matrix_run(hy, &gpu_tol);
    }
    /* gemma4 under every placement: attention with a shape a layer (sliding 16 / 2 KV heads,
     * global 32 / 1 with K as V), the value norm and the proportional RoPE's table in
     * cuda_attn_prepare, ew.cu's scale / soft-cap / GELU-tanh, its experts on the grouped
     * kernels (GELU-tanh gating) through the fused gate_up's two views on every lane; then
     * mkmodel's tiny-gemma-4 (16 experts, q8_0), as test_mock_placement's matrix_gemma4 */
    char g4[512];
    snprintf(g4, sizeof(g4), "%s/hf_gemma4/tiny-f16.gguf", data ? data : "tests/data");
    pm_tolerance g4_tol = gpu_tol; /* its attention logits' spread (4.2-5.9): see the top */
    g4_tol.decode_kv = TOL_DECODE * pm_attn_spread(g4);
    placement_matrix_run(g4, &g4_tol);
    tm_synth_config sc;
    CHECK(synth_config_preset(&sc, "tiny-gemma-4"));
    sc.n_embd = 256, sc.n_expert = 16, sc.n_expert_used = 2, sc.n_ff_exp = 64, sc.n_ff = 256;
    sc.type_experts = sc.type_attn = sc.type_shexp = TM_TYPE_Q8_0, sc.seed = 11;
    CHECK(pm_model_write_config(g4, sizeof(g4), "cuda_gemma4.gguf", &sc));
    placement_matrix_run(g4, &gpu_tol);
    remove(g4);

    /* -ngl all with an f16 KV cache */
    tm_model *m;
    CHECK(model_load(tiny, &m));
    tm_rng r;
    tm_rng_seed(&r, 7);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % m->cfg.n_vocab);
    tm_context_params rp = run_params(0, false, 0, true, TM_TYPE_F32, 24, 2),
                      gp = run_params(1 << 20, false, 0, true, TM_TYPE_F16, 24, 2);
    pm_run *cpu = pm_run_open(m, &rp), *gpu = pm_run_open(m, &gp);
    pm_compare(m, toks, 40, 16, cpu, gpu, TOL_PROMPT, TOL_DECODE, TIE, "ngl all, f16 KV");
    pm_run_close(cpu), pm_run_close(gpu);
    model_free(m);
    remove(tiny), remove(wide);

    const char *big = getenv("TM_CUDA_MODEL");
    if (!big) return;
    CHECK(model_load(big, &m));
    for (int i = 0; i < 16; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % m->cfg.n_vocab);
    static const struct {
        int ngl, n_cpu_moe;
        bool cpu_moe;
        int pcie;
        const char *what;
    } bigs[] = {{1 << 20, 0, false, 0, "-ngl all"},
                {1 << 20, 0, true, 0, "--cpu-moe"},
                {1 << 20, 0, true, TM_MOE_PCIE_OFF, "--cpu-moe --moe-pcie off"},
                {1 << 20, 35, false, 0, "--n-cpu-moe 35"}};
    for (size_t i = 0; i < sizeof(bigs) / sizeof(bigs[0]); i++) {
        rp = run_params(0, false, 0, false, TM_TYPE_F16, 16, 0);
        gp = run_params(bigs[i].ngl, bigs[i].cpu_moe, bigs[i].n_cpu_moe, false, TM_TYPE_F16, 16, 0);
        gp.moe_pcie = bigs[i].pcie;
        cpu = pm_run_open(m, &rp), gpu = pm_run_open(m, &gp);
        /* 12 prompt tokens (one tensor-core batch), then 4 decode steps */
        char what[256];
        snprintf(what, sizeof(what), "%s %s", big, bigs[i].what);
        pm_compare(m, toks, 12, 4, cpu, gpu, TOL_QUANT, TOL_QUANT, TIE_QUANT, what);
        pm_run_close(cpu), pm_run_close(gpu);
    }
    model_free(m);
}

#endif /* TM_HAVE_CUDA */
