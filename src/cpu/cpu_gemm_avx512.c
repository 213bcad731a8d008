/* AVX-512 kernels: not written yet; the dispatcher falls back to AVX2. */
#include "cpu/cpu_internal.h"

cpu_gemm_fn cpu_gemm_avx512_get(tm_type wtype) {
    (void)wtype;
    return NULL;
}
