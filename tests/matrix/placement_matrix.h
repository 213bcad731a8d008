/* The placement matrix (docs/executor.md, "Tests"): one model under every
 * placement users have (CPU only, -ngl all, -ngl 2, --cpu-moe, --n-cpu-moe 2,
 * --moe-cache with a random hot set, --ram-cache, an -ot mix), each against an
 * independent reference: the double-precision forward of tests/ref/ref_forward.h
 * (no code shared with src/moe, src/cpu, src/exec, src/model; checked against
 * the HF goldens by test_ref_forward), computed once per model (pm_ref_make):
 *   - a prompt in two batches, then decode steps: after every call the logits
 *     within a tolerance (relative L2), every token's router logits within
 *     tie / 2 of the reference's and its top-k set the reference's; once with
 *     the CPU ops in their normal mode (8-bit activations, f16 KV), once
 *     precise (f32 activations and KV). Near ties: a run whose router logits
 *     are within tie / 2 cannot route otherwise where the reference's gap is
 *     >= tie, so any other routing there fails; the reference's trace has no
 *     gap below the precise tie (tokens are redrawn, pm_ref_make); with 8-bit
 *     activations (a larger tie) a token routed otherwise at a near tie is
 *     counted and its later layers (and the logits, when it is the call's
 *     last token) are not compared;
 *   - 64 greedy steps (no callback: the decode graph where the placement
 *     allows one), fed the reference's greedy tokens: logits within the decode
 *     tolerance at every step and the run's argmax the reference's token,
 *     except where the reference's top-2 margin is below 2 tol ||logits|| (a
 *     logit may move that much within the tolerance: either token); comparing
 *     stops at the first step whose reference routing has a gap below twice
 *     the decode tolerance (the run may route either way there and differ
 *     after it);
 *   - the tier's counters show each placement's lanes really ran;
 *   - several sequences decoded in one batch as each alone (pm_parallel_run:
 *     a property of the engine, compared with itself).
 * Linked into test_mock_placement (CI: the host mock of the CUDA backend) and
 * test_cuda_ops (the GPU machine: the real kernels). Test code only. */
#ifndef TM_TESTS_PLACEMENT_MATRIX_H
#define TM_TESTS_PLACEMENT_MATRIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "model/synth.h"

typedef struct pm_tolerance {
    double prompt; /* relative L2 of logits after a prompt batch, precise CPU ops */
    double decode; /* after a decode step, precise CPU ops */
    double quant;  /* either, CPU ops in their normal mode (8-bit activations) */
    /* Router-logit margin under which a routing may differ, relative to the RMS of the
     * reference's router logits of the token and layer (precise); twice the bound on the
     * router logits' error, which the matrix checks (pm_compare_ref). Also the greedy
     * steps' (precise) tie. */
    double tie;
    double tie_quant; /* the same with 8-bit activations */
    /* After a precise decode step that follows prompt batches (0: decode): it attends over
     * their keys and values, which the GPU's tensor-core products computed from f16 inputs
     * (check_model.c: decode times pm_attn_spread). The greedy steps, one token a call from
     * the first, keep decode. */
    double decode_kv;
} pm_tolerance;

/* The GPU's tolerances (tests/cuda/check_model.c derives them): precise prompt batches
 * (f16 tensor-core inputs), precise decode steps, the normal mode (8-bit activations), the
 * routing ties against the f64 reference (twice the prompt's bound; 8-bit: see
 * test_mock_placement.c). */
#define PM_GPU_TOL_PROMPT    1.5e-2
#define PM_GPU_TOL_DECODE    5e-3
#define PM_GPU_TOL_QUANT     4e-2
#define PM_GPU_REF_TIE       (2 * PM_GPU_TOL_PROMPT)
#define PM_GPU_REF_TIE_QUANT 0.2

/* How much larger than the usual (1/sqrt(D)-scaled) ones the attention logits of the model at
 * path are: gemma4's scale 1 over per-head RMS-normed q and k gives logits of spread
 * sqrt(D) rms(q_norm ⊙ k_norm); the largest of its layers, at least 1 (1 for the other
 * architectures). An error of the keys and values (a prompt's f16 tensor-core products)
 * moves the softmax that much more: check_model.c scales its decode tolerance by it. */
double pm_attn_spread(const char *path);

/* Write the tiny synthetic qwen3moe with n_layer layers and n_expert experts,
 * its attention matrices of type_attn, to $TM_TEST_TMP/name (or /tmp); path
 * gets where. */
void pm_model_write(char *path, size_t len, const char *name, uint32_t n_layer, uint32_t n_expert,
                    tm_type type_attn);
/* The same model's config (tiny preset, seed 11, 2 threads), for a test to change its types. */
void pm_model_config(tm_synth_config *sc, uint32_t n_layer, uint32_t n_expert, tm_type type_attn);
/* Write sc to $TM_TEST_TMP/name (or /tmp); returns synth_model_write's status
 * (a type without a quantizer: TM_ERR_UNSUPPORTED) for the caller to skip on. */
tm_status pm_model_write_config(char *path, size_t len, const char *name,
                                const tm_synth_config *sc);

/* Every placement on the model at path; cmocka failures name the placement,
 * the call and the error. Prints one line a placement. */
void placement_matrix_run(const char *path, const pm_tolerance *tol);
/* The same with the placements that keep every layer on the CPU (CPU only, with --ram-cache
 * 1, and with the experts in VRAM): an architecture whose layers have no GPU path yet
 * (gemma4). */
void placement_matrix_run_cpu(const char *path, const pm_tolerance *tol);
/* The placements of spans over two GPUs (the host mock's MOCK_GPUS=2 while they run). */
void placement_matrix_run_gpus(const char *path, const pm_tolerance *tol);

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
 * steps, run against ref (two engine contexts: check_model.c's GPU against
 * CPU), compared after every call; tie is absolute here (a margin of ref's
 * router logits); returns the number of near ties seen. */
typedef struct pm_run {
    tm_context *ctx;
    int n_layer, k, n_expert;
    int64_t n_tok;
    int32_t *ids;  /* [n_layer][n_tok][k] of the last call */
    float *logits; /* [n_layer][n_tok][n_expert]: router logits of the last call */
} pm_run;
pm_run *pm_run_open(tm_model *m, const tm_context_params *p);
void pm_run_close(pm_run *r);
tm_context *pm_run_context(pm_run *r);
int pm_compare(tm_model *m, const int32_t *toks, int64_t n_prompt, int64_t n_decode, pm_run *ref,
               pm_run *run, double tol_prompt, double tol_decode, double tie, const char *what);

/* The independent reference (tests/ref/ref_forward.h: double precision, no
 * code shared with the engine), computed once per model: n_pos positions of
 * toks and n_greedy greedy steps from toks[0]. The trace has no near ties:
 * where the reference's routing of position p has a gap below tie (its k-th
 * and (k+1)-th router logits closer than tie in some layer), toks[p] is
 * replaced by another token (drawn from a fixed seed; redrawn counts them),
 * so every run must route exactly as the reference. Gaps are relative to the
 * RMS of the layer's router logits (ref_step_route_gap). The greedy steps are
 * the reference's own; greedy_tie_at is the first whose routing has a gap
 * below tie_greedy (comparing stops there: the run may route either way and
 * go on from different values). */
typedef struct pm_ref {
    int n_layer, k, n_expert;
    int64_t n_vocab, n_pos;
    int n_greedy, greedy_tie_at, redrawn;
    double tie, tie_greedy;
    double *logits;     /* [n_pos + n_greedy][n_vocab] */
    double *router;     /* [n_pos + n_greedy][n_layer][n_expert] */
    double *gap;        /* [n_pos + n_greedy][n_layer] its routing gaps (ref_layer_route_gap) */
    int32_t *ids;       /* [n_pos + n_greedy][n_layer][k] */
    int32_t *greedy;    /* [n_greedy] the reference's greedy tokens */
    double *greedy_gap; /* [n_greedy] its top-2 logit margin at each */
} pm_ref;
pm_ref *pm_ref_make(const char *path, int32_t *toks, int64_t n_pos, int n_greedy, double tie,
                    double tie_greedy);
void pm_ref_free(pm_ref *r);
/* A prompt of n_prompt tokens (batches of the run's n_batch) and n_decode steps of toks on
 * run, after every call against the reference: logits within tol_prompt / tol_decode
 * (relative L2), every token's router logits within tie / 2 of their RMS (max abs), so its
 * top-k set must be the reference's wherever the reference's gap is >= tie: always where
 * tie <= ref->tie (the trace has no smaller gap); with a larger tie (8-bit activations) a
 * token routed otherwise at a smaller gap is a near tie: its later layers are not compared,
 * nor the logits when it is the call's last token (those of later tokens are: they see it
 * only through attention, diluted over the positions). Returns the number of near ties. */
int pm_compare_ref(tm_model *m, const int32_t *toks, int64_t n_prompt, int64_t n_decode,
                   const pm_ref *ref, pm_run *run, double tol_prompt, double tol_decode, double tie,
                   const char *what);
/* The reference's greedy steps on ctx (one token a step, no callback), teacher-forced with
 * the reference's tokens up to ref->greedy_tie_at: logits within tol (relative L2) at every
 * step, and the run's argmax the reference's token except where the reference's top-2
 * margin is below 2 tol ||logits|| (the most a logit may move within tol: then either);
 * returns how many steps took the other token. */
int pm_greedy_ref(tm_context *ctx, const int32_t *toks, const pm_ref *ref, double tol,
                  const char *what);

#endif
