/* Token sampling from logits: greedy, or temperature with top-k, top-p and
 * min-p filters and a repetition penalty, in llama.cpp's order (penalty,
 * top-k, top-p, min-p, temperature). Seeded: the same seed and logits give
 * the same tokens. */
#ifndef TM_SAMPLE_SAMPLE_H
#define TM_SAMPLE_SAMPLE_H

#include <stdint.h>

#include "core/rng.h"
#include "core/status.h"

/* tm_sampler_params is the public API's (include/tiermoe.h). */

typedef struct tm_sampler {
    tm_sampler_params p;
    tm_rng rng;
    int32_t n_vocab;
    struct {
        float logit;
        int32_t id;
    } * cand; /* [n_vocab] */
} tm_sampler;

void sample_params_default(tm_sampler_params *p);
/* Checks the parameters (a message names the bad one). */
tm_status sampler_init(tm_sampler *s, const tm_sampler_params *p, int32_t n_vocab);
void sampler_free(tm_sampler *s);

/* Pick the next token. history: the tokens so far (prompt and output). */
int32_t sampler_sample(tm_sampler *s, const float *logits, const int32_t *history,
                       int64_t n_history);

#endif
