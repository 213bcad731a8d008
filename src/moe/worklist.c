/* Worklists: the routed (token, expert, weight) slots of one layer step. */
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"

tm_status moe_worklist_build(tm_moe_worklist *wl, const int32_t *ids, const float *weights,
                             int64_t n_tok, uint32_t n_expert, uint32_t k, tm_moe_phase phase) {
    const int64_t n = n_tok * k;
    if (n > wl->cap_slots) {
        tm_moe_slot *s = realloc(wl->slots, (size_t)n * sizeof(*s));
        if (!s)
            return tm_error_set(TM_ERR_NOMEM, "worklist: out of memory for %lld slots",
                                (long long)n);
        wl->slots = s, wl->cap_slots = n;
    }
    if (n_expert > wl->cap_experts) {
        int64_t *b = realloc(wl->expert_begin, (n_expert + 1) * sizeof(*b));
        if (!b)
            return tm_error_set(TM_ERR_NOMEM, "worklist: out of memory for %u experts", n_expert);
        wl->expert_begin = b, wl->cap_experts = n_expert;
    }
    wl->n_tok = n_tok, wl->n_expert = n_expert, wl->k = k, wl->n_slots = n;
    wl->expert_major = phase != TM_MOE_PHASE_DECODE;
    int64_t *begin = wl->expert_begin;
    memset(begin, 0, (n_expert + 1) * sizeof(*begin));
    for (int64_t i = 0; i < n; i++) begin[ids[i] + 1]++;
    for (uint32_t e = 0; e < n_expert; e++) begin[e + 1] += begin[e];
    if (!wl->expert_major) {
        for (int64_t i = 0; i < n; i++)
            wl->slots[i] = (tm_moe_slot){(int32_t)(i / k), ids[i], weights[i]};
        return TM_OK;
    }
    /* Counting sort by expert; scanning tokens in order keeps them ascending. */
    int64_t *fill = malloc(n_expert * sizeof(*fill));
    if (!fill) return tm_error_set(TM_ERR_NOMEM, "worklist: out of memory");
    memcpy(fill, begin, n_expert * sizeof(*fill));
    for (int64_t i = 0; i < n; i++)
        wl->slots[fill[ids[i]]++] = (tm_moe_slot){(int32_t)(i / k), ids[i], weights[i]};
    free(fill);
    return TM_OK;
}

void moe_worklist_free(tm_moe_worklist *wl) {
    free(wl->slots);
    free(wl->expert_begin);
    memset(wl, 0, sizeof(*wl));
}
