/* Device copies of the i-quant grids (src/quant/quant_grids.{h,c}) for the
 * decoders of dequant_lowbit.cuh.
 *
 * The tables are not retyped: quant_grids.c itself is compiled a second time
 * inside namespace tm_grid, with its integer types redefined to carry
 * __device__, so each table becomes a `const __device__` array of this
 * translation unit initialised from the same text (the build has no
 * relocatable device code, so every .cu that decodes needs its own copy; about
 * 33 KiB each). The host tables keep their C names outside the namespace.
 * Under the host emulation (tests/emu) __device__ expands to nothing and these
 * are ordinary host arrays. The table reads of the decoders are divergent
 * (each lane its own index), so global memory through the read-only cache
 * suits them better than __constant__ memory, which serialises them. */
#ifndef TM_CUDA_QUANT_GRIDS_DEV_CUH
#define TM_CUDA_QUANT_GRIDS_DEV_CUH

#include <stdint.h>

#include "quant/quant_grids.h" /* first: its include guard keeps it out of the namespace */

namespace tm_grid {
#define uint64_t __device__ uint64_t
#define uint32_t __device__ uint32_t
#define uint8_t  __device__ uint8_t
#define int8_t   __device__ int8_t
#include "quant/quant_grids.c"
#undef uint64_t
#undef uint32_t
#undef uint8_t
#undef int8_t
} // namespace tm_grid

#endif
