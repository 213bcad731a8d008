/* Expert selection shared by every architecture (see moe.h). */
#include <math.h>

#include "cpu/cpu_ops.h"
#include "moe/moe.h"

void moe_router_select(const tm_moe_router_params *p, const float *logits, int64_t n_tok,
                       int32_t *ids, float *weights) {
    const uint32_t E = p->n_expert, k = p->n_used;
    float prob[1024];
    for (int64_t t = 0; t < n_tok; t++) {
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
