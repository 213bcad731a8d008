/* Monotonic wall clock for timings and progress. */
#ifndef TM_CORE_TIMING_H
#define TM_CORE_TIMING_H

#include <stdint.h>
#include <time.h>

static inline uint64_t tm_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double tm_time_s(void) {
    return (double)tm_time_ns() * 1e-9;
}

#endif
