/* AMX kernels: not written yet; the dispatcher falls back to AVX-512. */
#include "cpu/cpu_internal.h"

cpu_gemm_fn cpu_gemm_amx_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}

int64_t cpu_gemm_amx_min_tokens(void) { return 16; }
