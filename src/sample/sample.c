#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>

void sample_params_default(tm_sampler_params *p) {
    *p = (tm_sampler_params){.temp = 0.8f,
                             .top_k = 40,
                             .top_p = 0.95f,
                             .min_p = 0.05f,
                             .repeat_penalty = 1.0f,
                             .repeat_last_n = 64,
                             .seed = 0};
}

tm_status sampler_init(tm_sampler *s, const tm_sampler_params *p, int32_t n_vocab) {
    if (!(p->temp >= 0) || !(p->temp < 100))
        return tm_error_set(TM_ERR_ARG, "--temp %g: expected 0..100", p->temp);
    if (!(p->top_p > 0) || p->top_p > 1)
        return tm_error_set(TM_ERR_ARG, "--top-p %g: expected (0, 1]", p->top_p);
    if (!(p->min_p >= 0) || p->min_p > 1)
        return tm_error_set(TM_ERR_ARG, "--min-p %g: expected [0, 1]", p->min_p);
    if (!(p->repeat_penalty > 0))
        return tm_error_set(TM_ERR_ARG, "--repeat-penalty %g: expected > 0", p->repeat_penalty);
    if (p->repeat_last_n < 0)
        return tm_error_set(TM_ERR_ARG, "--repeat-last-n %d: expected >= 0", p->repeat_last_n);
    s->p = *p;
    s->n_vocab = n_vocab;
    tm_rng_seed(&s->rng, p->seed);
    s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
    return s->cand ? TM_OK : tm_error_set(TM_ERR_NOMEM, "sampler: out of memory");
}

void sampler_free(tm_sampler *s) {
    free(s->cand);
    s->cand = NULL;
}

static int cand_desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    if (x != y) return x > y ? -1 : 1;
    const int32_t i = ((const int32_t *)a)[1], j = ((const int32_t *)b)[1];
    return (i > j) - (i < j); /* lower id first: stable across qsort implementations */
}

/* ---- the k best candidates without sorting all of them ---- */

static int cand_cmp(const tm_sampler *s, int32_t a, int32_t b) {
    return cand_desc(&s->cand[a], &s->cand[b]);
}

/* Sift cand[i] down a heap over cand[0..k) whose root is the worst candidate. */
static void cand_heap_down(tm_sampler *s, int32_t i, int32_t k) {
    for (;;) {
        int32_t w = i;
        const int32_t l = 2 * i + 1, r = l + 1;
        if (l < k && cand_cmp(s, l, w) > 0) w = l;
        if (r < k && cand_cmp(s, r, w) > 0) w = r;
        if (w == i) return;
        const float logit = s->cand[i].logit;
        const int32_t id = s->cand[i].id;
        s->cand[i] = s->cand[w];
        s->cand[w].logit = logit, s->cand[w].id = id;
        i = w;
    }
}

/* cand[0..k) := the first k of cand[0..n) in cand_desc's order (a total order: the
 * same set and order a full sort gives), in O(n log k) instead of O(n log n): a
 * 151k-token vocabulary sorted whole took ~28 ms a token on the development machine. */
static void cand_top_k(tm_sampler *s, int32_t k, int32_t n) {
    for (int32_t i = k / 2 - 1; i >= 0; i--) cand_heap_down(s, i, k);
    for (int32_t i = k; i < n; i++)
        if (cand_cmp(s, i, 0) < 0) {
            s->cand[0] = s->cand[i];
            cand_heap_down(s, 0, k);
        }
    qsort(s->cand, (size_t)k, sizeof(*s->cand), cand_desc);
}

int32_t sampler_sample(tm_sampler *s, const float *logits, const int32_t *history,
                       int64_t n_history) {
    const int32_t n = s->n_vocab;
    if (s->p.temp <= 0 && s->p.repeat_penalty == 1.0f) { /* greedy: first maximum, no copy */
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int32_t i = 0; i < n; i++) s->cand[i].logit = logits[i], s->cand[i].id = i;
    /* repetition penalty on the recent history (llama.cpp's rule: divide positive, multiply
     * negative) */
    if (s->p.repeat_penalty != 1.0f) {
        int64_t from = n_history - s->p.repeat_last_n > 0 ? n_history - s->p.repeat_last_n : 0;
        for (int64_t i = from; i < n_history; i++) {
            int32_t id = history[i];
            if (id < 0 || id >= n) continue;
            float *l = &s->cand[id].logit;
            /* penalise each id once, even when it repeats in the window */
            int64_t j = from;
            while (j < i && history[j] != id) j++;
            if (j < i) continue;
            *l = *l > 0 ? *l / s->p.repeat_penalty : *l * s->p.repeat_penalty;
        }
    }
    if (s->p.temp <= 0) { /* greedy: first maximum */
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (s->cand[i].logit > s->cand[best].logit) best = i;
        return best;
    }
    int32_t m = n;
    if (s->p.top_k > 0 && s->p.top_k < m) {
        m = s->p.top_k;
        cand_top_k(s, m, n);
    } else {
        qsort(s->cand, (size_t)n, sizeof(*s->cand), cand_desc);
    }
    /* probabilities of the kept candidates (at temperature 1 for the filters, as llama.cpp) */
    double sum = 0;
    const float top = s->cand[0].logit;
    double *prob = malloc((size_t)m * sizeof(double));
    if (!prob) return s->cand[0].id; /* out of memory: fall back to greedy, never crash */
    for (int32_t i = 0; i < m; i++) sum += prob[i] = exp((double)s->cand[i].logit - top);
    if (s->p.top_p < 1.0f) {
        double acc = 0;
        int32_t keep = m;
        for (int32_t i = 0; i < m; i++) {
            acc += prob[i] / sum;
            if (acc >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        m = keep;
    }
    if (s->p.min_p > 0) {
        int32_t keep = 1;
        while (keep < m && prob[keep] >= s->p.min_p * prob[0]) keep++;
        m = keep;
    }
    sum = 0;
    for (int32_t i = 0; i < m; i++)
        sum += prob[i] = exp(((double)s->cand[i].logit - top) / s->p.temp);
    double r = tm_rng_f64(&s->rng) * sum;
    int32_t pick = m - 1;
    for (int32_t i = 0; i < m; i++) {
        r -= prob[i];
        if (r < 0) {
            pick = i;
            break;
        }
    }
    free(prob);
    return s->cand[pick].id;
}
