/* Synthetic random-weight models for tests and benchmarks (`tiermoe mkmodel`).
 *
 * Writes a qwen3moe GGUF with the tensor names, shapes and metadata keys that
 * llama.cpp's converter writes for Qwen3-MoE. Weights are random but scaled
 * so the model stays healthy: token identity dominates the residual stream
 * (embedding std 1, small attention-output and expert-down projections), so
 * the router spreads tokens over the experts the way a trained model does
 * instead of collapsing onto a few.
 *
 * Routing skew: qwen3moe has no router bias tensor, so the bias lives in the
 * weights. Every token embedding carries a constant value `beta` in one
 * "bias channel" (dimension 0); the router's column for that channel holds
 * b_e / beta, which adds b_e to expert e's logit for every token. The b_e are
 * calibrated (on simulated Gaussian router noise) so that expert selection
 * frequencies follow a Zipf law rank^-s, with a different ranking per layer.
 * s = 0 gives b = 0: uniform routing. */
#ifndef TM_MODEL_SYNTH_H
#define TM_MODEL_SYNTH_H

#include <stdint.h>

#include "core/status.h"
#include "quant/quant.h"

typedef struct tm_synth_config {
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used, n_ff_exp, n_ff; /* n_ff: dense FFN length (metadata only) */
    uint32_t n_vocab, n_ctx;
    float rope_base, rms_eps;
    tm_type type_experts, type_attn, type_embd, type_output; /* norms and router are f32 */
    uint64_t seed;
    double skew;            /* Zipf exponent of expert popularity; 0 = uniform */
    int n_threads;          /* generation threads (0 = all cores) */
    const char *name;       /* general.name */
    const char *vocab_json; /* HF tokenizer.json to embed, or NULL for no vocabulary */
    int progress;           /* print progress and rate to stderr */
} tm_synth_config;

/* Fill `cfg` from a preset: "tiny" or "30b-a3b". */
tm_status synth_config_preset(tm_synth_config *cfg, const char *preset);

/* Check dimensions against each other and the quant types' block sizes. */
tm_status synth_config_validate(const tm_synth_config *cfg);

/* With vocab_json set: grow n_vocab to the vocabulary's size (a larger n_vocab
 * is kept: the token list is padded to it, as llama.cpp does up to
 * config.json's vocab_size). Fails naming the file when it cannot be imported. */
tm_status synth_config_apply_vocab(tm_synth_config *c);

/* Total bytes the file will have (approximately: metadata not counted). */
uint64_t synth_config_tensor_bytes(const tm_synth_config *cfg);

/* Write the model to `path` (atomically: temp file, then rename). */
tm_status synth_model_write(const tm_synth_config *cfg, const char *path);

/* Router biases per layer [n_layer][n_expert] for the configured skew (what
 * the writer bakes into the weights; tests use it to check the law). */
tm_status synth_router_biases(const tm_synth_config *cfg, float *bias);

/* Expected selection frequency of each expert (sums to n_expert_used), in the
 * same order as synth_router_biases' layer 0 ranking before permutation:
 * target[r] for popularity rank r. */
void synth_zipf_targets(uint32_t n_expert, uint32_t k, double s, double *target);

#endif
