/* The --profile report of a context (run and bench print it, the public API's
 * tm_context_profile returns it): where the time went, by part, on the CPU
 * lane's threads and in the MoE step by layer class, and the SSD tier's
 * counters. */
#ifndef TM_MODEL_PROFILE_H
#define TM_MODEL_PROFILE_H

#include <stdio.h>

#include "model/model.h"

/* Time by part, the CPU lane's thread time, the MoE step by layer class, the
 * VRAM cache and the copies ahead and prompt fetches; each since the marks
 * (NULL: since the start), per run. */
void model_profile_print(const tm_context *ctx, const uint64_t *prof0,
                         const tm_moe_lane_stats *lane0, const tm_tier_stats *tier0, int runs,
                         FILE *out);

/* The SSD tier's counters since s0 (NULL: the start) over wall_s seconds:
 * experts faulted and bytes read per token, hit rate, read rate. Nothing
 * without --ram-cache. */
void model_store_print(const tm_context *ctx, const tm_store_stats *s0, double wall_s, FILE *out);

#endif
