/* AVX2 kernels: not written yet. */
#include "cpu/cpu_internal.h"

cpu_gemm_fn cpu_gemm_avx2_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
