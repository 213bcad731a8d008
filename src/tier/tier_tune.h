/* The PCIe lane's decode share, tuned by timing decode steps (tier_tune.c):
 * the search over the candidates, which knows nothing of GPUs or clocks. */
#ifndef TM_TIER_TUNE_H
#define TM_TIER_TUNE_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda.h"

#define TIER_TUNE_WINDOW 9 /* decode steps a candidate is timed over (their median) */

typedef struct tier_tune {
    bool on;                         /* tuning or tuned (the router reads the mailbox's share) */
    bool done;                       /* settled on cur */
    int64_t rows;                    /* rows of the step the host task saw (0: none) */
    int32_t cur;                     /* the candidate timed now: PCIe slots of k all cold */
    int32_t first;                   /* the calibration's */
    int32_t n;                       /* periods of cur so far; -1: the next one is left out */
    int32_t window;                  /* periods a candidate (TIERMOE_PCIE_TUNE) */
    uint64_t last_ns;                /* the end of the previous one-row decode step */
    double period[TIER_TUNE_WINDOW]; /* ms */
    double ms[TM_CUDA_ROUTER_MAX_USED + 1]; /* each candidate's median step, 0: not timed */
} tier_tune;

/* The share (1/256) that gives the PCIe lane i of k cold slots (tm_cuda_mapped_count). */
int32_t tier_tune_share(int32_t k, int32_t i);
/* Start the search at candidate first of 0..n_max (<= TM_CUDA_ROUTER_MAX_USED). */
void tier_tune_start(tier_tune *u, int32_t first, int32_t window);
/* One one-row decode step of the current candidate took ms: whether the search moved
 * (to u->cur; u->done once it settled). */
bool tier_tune_period(tier_tune *u, int32_t n_max, double ms);
/* How many candidates were timed. */
int32_t tier_tune_count(const tier_tune *u);

#endif
