/* The launcher of tests/cuda/check_lbx.cu for check_lbx.c: every unit of
 * n_blocks blocks of a low-bit type with an 8-bit unpacker (lbx_unit.cuh),
 * the blocks `stride` bytes apart from w (device memory, aligned as
 * cuda_mmvq_q8x_ok asks of the type's rows). */
#ifndef TM_TESTS_CUDA_CHECK_LBX_H
#define TM_TESTS_CUDA_CHECK_LBX_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "cuda/cuda.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One unit as tm_lbx_unit holds it. */
typedef struct check_lbx_unit {
    int32_t q[8];
    float d[2], m[2];
} check_lbx_unit;

/* Whether `type` has an unpacker; *min: whether its m can be non-zero (tm_lbx::MIN). */
bool check_lbx_has(tm_type type, bool *min);
/* units[b * (BS/32) + j] = unit j of block b; dq[b * BS + i] = value i of block
 * b as tm_lb<type>::dq8 gives it (the f32 decoders of dequant_lowbit.cuh). */
tm_status check_lbx_units(tm_type type, const void *w, size_t stride, int64_t n_blocks,
                          check_lbx_unit *units, float *dq, tm_cuda_stream stream);

#ifdef __cplusplus
}
#endif
#endif
