/* Expert selection shared by every architecture (see moe.h). */
#include <math.h>

#include "cpu/cpu_ops.h"
#include "moe/moe.h"

typedef struct router_job {
    const tm_moe_router_params *p;
    const float *logits;
    int32_t *ids;
    float *weights;
} router_job;

static void router_select_task(void *ctx, int64_t begin, int64_t end, int ith) {
    const router_job *job = ctx;
    const tm_moe_router_params *p = job->p;
    const uint32_t E = p->n_expert, k = p->n_used;
    const float *logits = job->logits;
    int32_t *ids = job->ids;
    float *weights = job->weights;
    float prob[1024];
    (void)ith;
    for (int64_t t = begin; t < end; t++) {
        const float *l = logits + t * E;
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        switch (p->gating) {
        case TM_MOE_GATING_SOFTMAX:
            for (uint32_t e = 0; e < E; e++) prob[e] = l[e];
            cpu_softmax(prob, E);
            cpu_topk(prob, E, k, id);
            for (uint32_t j = 0; j < k; j++) w[j] = prob[id[j]];
            break;
        case TM_MOE_GATING_SIGMOID:
            for (uint32_t e = 0; e < E; e++) prob[e] = 1.0f / (1.0f + expf(-l[e]));
            cpu_topk(prob, E, k, id);
            for (uint32_t j = 0; j < k; j++) w[j] = prob[id[j]];
            break;
        case TM_MOE_GATING_SOFTMAX_TOPK:
            cpu_topk(l, E, k, id);
            for (uint32_t j = 0; j < k; j++) w[j] = l[id[j]];
            cpu_softmax(w, k);
            break;
        }
        if (p->norm_topk) {
            double sum = 0;
            for (uint32_t j = 0; j < k; j++) sum += w[j];
            for (uint32_t j = 0; j < k; j++) w[j] = (float)(w[j] / sum);
        }
        if (p->scale != 1.0f)
            for (uint32_t j = 0; j < k; j++) w[j] *= p->scale;
    }
}

void moe_router_select(tm_pool *pool, const tm_moe_router_params *p, const float *logits,
                       int64_t n_tok, int32_t *ids, float *weights) {
    router_job j = {p, logits, ids, weights};
    if (n_tok <= 16) /* a decode step: not worth waking the pool */
        router_select_task(&j, 0, n_tok, 0);
    else
        cpu_pool_for(pool, n_tok, 8, router_select_task, &j);
}
