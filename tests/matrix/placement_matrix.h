/* The placement matrix (docs/executor.md, "Tests"): one model under every
 * placement users have (CPU only, -ngl all, -ngl 2, --cpu-moe, --n-cpu-moe 2,
 * --moe-cache with a random hot set, --ram-cache, an -ot mix), each against the CPU's
 * precise mode (double products from dequantized weights, f32 KV):
 *   - a prompt in two batches, then decode steps: logits after every call
 *     within a tolerance, routing (top-k ids) identical except at near ties;
 *     once with the CPU ops in their normal mode (8-bit activations), once
 *     precise (then only the GPU's arithmetic differs);
 *   - 64 greedy tokens (no callback: the decode graph where the placement
 *     allows one) identical to the reference's, activations f32 throughout;
 *   - the tier's counters show each placement's lanes really ran;
 *   - several sequences decoded in one batch as each alone (pm_parallel_run).
 * Linked into test_mock_placement (CI: the host mock of the CUDA backend) and
 * test_cuda_ops (the GPU machine: the real kernels). Test code only. */
#ifndef TM_TESTS_PLACEMENT_MATRIX_H
#define TM_TESTS_PLACEMENT_MATRIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct pm_tolerance {
    double prompt;    /* relative L2 of logits after a prompt batch, precise CPU ops */
    double decode;    /* after a decode step, precise CPU ops */
    double quant;     /* either, CPU ops in their normal mode (8-bit activations) */
    double tie;       /* router-logit margin under which a routing may differ (precise) */
    double tie_quant; /* the same with 8-bit activations */
} pm_tolerance;

/* Write the tiny synthetic qwen3moe with n_layer layers and n_expert experts,
 * its attention matrices of type_attn, to $TM_TEST_TMP/name (or /tmp); path
 * gets where. */
void pm_model_write(char *path, size_t len, const char *name, uint32_t n_layer, uint32_t n_expert,
                    tm_type type_attn);

/* Every placement on the model at path; cmocka failures name the placement,
 * the call and the error. Prints one line a placement. */
void placement_matrix_run(const char *path, const pm_tolerance *tol);

/* Several sequences decoded together (serve --parallel, parallel_matrix.c):
 * greedy requests on 4 sequences of a context made with p (n_seq set), of
 * different lengths and start steps, one reusing a sequence with prefix
 * reuse, against each request alone: the same tokens, logits within tol.
 * toks: 64 token ids to draw prompts from. */
void pm_parallel_run(tm_model *m, const tm_context_params *p, const int32_t *toks, double tol,
                     const char *what);

/* Relative L2 error ||a - ref|| / ||ref||. */
double pm_rel_l2(const float *a, const float *ref, int64_t n);

/* Logits and routing of a prompt (n_prompt tokens in batches) and n_decode
 * steps, a against the reference, compared after every call; returns the
 * number of near ties seen. */
typedef struct pm_run pm_run;
pm_run *pm_run_open(tm_model *m, const tm_context_params *p);
void pm_run_close(pm_run *r);
tm_context *pm_run_context(pm_run *r);
int pm_compare(tm_model *m, const int32_t *toks, int64_t n_prompt, int64_t n_decode, pm_run *ref,
               pm_run *run, double tol_prompt, double tol_decode, double tie, const char *what);

#endif
