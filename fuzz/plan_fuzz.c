/* libFuzzer target for plan files: parse any bytes with plan_parse_json();
 * when a plan is accepted, check what the reader promises (every layer's ids
 * in range and distinct, at most n_expert of them, used_bytes the sum of
 * slots * expert bytes and within the budget), then write it back to JSON
 * and parse that: the same plan (abort() otherwise).
 * Build and run: see fuzz/README.md. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "plan_fuzz: invariant broken: %s\n", what);
        abort();
    }
}

static void check_plan(const tm_plan *p) {
    const uint32_t E = p->shape.n_expert;
    uint64_t used = 0;
    uint8_t *seen = malloc(E);
    for (uint32_t l = 0; l < p->shape.n_layer; l++) {
        check(p->n_slots[l] >= 0 && (uint32_t)p->n_slots[l] <= E, "slots per layer");
        memset(seen, 0, E);
        for (int32_t i = 0; i < p->n_slots[l]; i++) {
            const int32_t e = p->experts[l][i];
            check(e >= 0 && (uint32_t)e < E && !seen[e], "ids in range and distinct");
            seen[e] = 1;
        }
        used += (uint64_t)p->n_slots[l] * p->expert_bytes[l];
    }
    free(seen);
    check(used == p->used_bytes && used <= p->budget_bytes, "bytes");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tm_plan plan, back;
    if (plan_parse_json((const char *)data, size, "fuzz", NULL, &plan) != TM_OK) return 0;
    check_plan(&plan);
    json_t *j = plan_to_json(&plan);
    check(j != NULL, "to_json");
    check(plan_from_json(j, "again", &plan.shape, &back) == TM_OK, "reads its own output");
    json_decref(j);
    check(back.mode == plan.mode && back.layer_curve == plan.layer_curve &&
              back.budget_bytes == plan.budget_bytes && back.used_bytes == plan.used_bytes,
          "header round trip");
    for (uint32_t l = 0; l < plan.shape.n_layer; l++) {
        check(back.n_slots[l] == plan.n_slots[l] && back.expert_bytes[l] == plan.expert_bytes[l],
              "layer round trip");
        check(!plan.n_slots[l] || !memcmp(back.experts[l], plan.experts[l],
                                          (size_t)plan.n_slots[l] * sizeof(int32_t)),
              "ids round trip");
    }
    plan_free(&back);
    plan_free(&plan);
    return 0;
}
