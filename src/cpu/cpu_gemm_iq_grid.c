/* The iq1 grid (quant_grid_iq1_s) in the unsigned form the SIMD kernels
 * multiply (cpu_gemm_iq.h): byte k of entry e is 8 (g + 1) + 2 for the grid's
 * value g in {-1, 0, 1}, so a group's weights are one table load each and a
 * subtraction of the delta bytes. Built once, on the first iq1 kernel lookup. */
#include <pthread.h>

#include "cpu/cpu_internal.h"
#include "quant/quant_grids.h"

uint64_t cpu_iq1_grid_u[2048];

static pthread_once_t iq1_grid_once = PTHREAD_ONCE_INIT;

static void iq1_grid_build(void) {
    for (int e = 0; e < 2048; e++) {
        uint64_t u = 0;
        for (int k = 0; k < 8; k++) {
            const int g = (int8_t)(quant_grid_iq1_s[e] >> 8 * k);
            u |= (uint64_t)(uint8_t)(8 * (g + 1) + 2) << 8 * k;
        }
        cpu_iq1_grid_u[e] = u;
    }
}

void cpu_iq1_grid_init(void) {
    pthread_once(&iq1_grid_once, iq1_grid_build);
}
