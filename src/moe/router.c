/* Expert selection shared by every architecture (see moe.h). */
#include <math.h>

#include "cpu/cpu_ops.h"
#include "moe/moe.h"

#define ROUTER_MAX_EXPERT 1024 /* TM_MODEL_MAX_EXPERTS: the scratch below */

tm_status moe_router_check(const tm_moe_router_params *p, const char *what) {
    const uint32_t E = p->n_expert, G = p->n_group;
    if (E < 1 || E > ROUTER_MAX_EXPERT || p->n_used < 1 || p->n_used > E)
        return tm_error_set(TM_ERR_FORMAT, "%s: %u experts, %u used (want 1..%d, 1..experts)", what,
                            E, p->n_used, ROUTER_MAX_EXPERT);
    if (p->gating != TM_MOE_GATING_SOFTMAX && p->gating != TM_MOE_GATING_SIGMOID &&
        p->gating != TM_MOE_GATING_SOFTMAX_TOPK)
        return tm_error_set(TM_ERR_FORMAT, "%s: unknown gating %d", what, (int)p->gating);
    if (G <= 1) return TM_OK;
    if (E % G || E / G < 2)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: %u experts in %u groups: the groups must be equal and of 2 or "
                            "more (a group's score is its best two)",
                            what, E, G);
    if (p->n_group_used < 1 || p->n_group_used > G || p->n_used > p->n_group_used * (E / G))
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: %u of %u groups used, %u experts each, for %u experts a token "
                            "(want 1..groups, and room for the token's experts)",
                            what, p->n_group_used, G, E / G, p->n_used);
    return TM_OK;
}

/* sel of the experts outside the n_group_used best groups to -inf (group score: the sum of
   its two largest sel, in float; ties to the lower group). */
static void router_groups(const tm_moe_router_params *p, float *sel) {
    const uint32_t G = p->n_group, per = p->n_expert / G;
    float gs[ROUTER_MAX_EXPERT / 2];
    int32_t keep[ROUTER_MAX_EXPERT / 2];
    for (uint32_t g = 0; g < G; g++) {
        float a = -INFINITY, b = -INFINITY; /* the largest two */
        for (uint32_t i = 0; i < per; i++) {
            const float v = sel[g * per + i];
            if (v > a)
                b = a, a = v;
            else if (v > b)
                b = v;
        }
        gs[g] = a + b;
    }
    cpu_topk(gs, G, p->n_group_used, keep);
    bool kept[ROUTER_MAX_EXPERT / 2] = {false};
    for (uint32_t j = 0; j < p->n_group_used; j++) kept[keep[j]] = true;
    for (uint32_t g = 0; g < G; g++)
        if (!kept[g])
            for (uint32_t i = 0; i < per; i++) sel[g * per + i] = -INFINITY;
}

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
    const bool groups = p->n_group > 1 && p->n_group_used < p->n_group;
    const float *logits = job->logits;
    int32_t *ids = job->ids;
    float *weights = job->weights;
    float prob[ROUTER_MAX_EXPERT], sel[ROUTER_MAX_EXPERT];
    (void)ith;
    for (int64_t t = begin; t < end; t++) {
        const float *l = logits + t * E;
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        const float *score = prob; /* what the experts are weighed by */
        switch (p->gating) {
        case TM_MOE_GATING_SOFTMAX:
            for (uint32_t e = 0; e < E; e++) prob[e] = l[e];
            cpu_softmax(prob, E);
            break;
        case TM_MOE_GATING_SIGMOID:
            for (uint32_t e = 0; e < E; e++) prob[e] = 1.0f / (1.0f + expf(-l[e]));
            break;
        case TM_MOE_GATING_SOFTMAX_TOPK:
            score = l;
            break;
        }
        const float *choose = score; /* what the experts are chosen by */
        if (p->sel_bias || groups) {
            for (uint32_t e = 0; e < E; e++)
                sel[e] = p->sel_bias ? score[e] + p->sel_bias[e] : score[e];
            if (groups) router_groups(p, sel);
            choose = sel;
        }
        cpu_topk(choose, E, k, id);
        for (uint32_t j = 0; j < k; j++) w[j] = score[id[j]];
        if (p->gating == TM_MOE_GATING_SOFTMAX_TOPK) cpu_softmax(w, k);
        if (p->norm_topk) {
            double sum = 0;
            for (uint32_t j = 0; j < k; j++) sum += w[j];
            for (uint32_t j = 0; j < k; j++) w[j] = (float)(w[j] / sum);
        }
        if (p->scale != 1.0f)
            for (uint32_t j = 0; j < k; j++) w[j] *= p->scale;
        if (p->expert_scale)
            for (uint32_t j = 0; j < k; j++) w[j] *= p->expert_scale[id[j]];
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
