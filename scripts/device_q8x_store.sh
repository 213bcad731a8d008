#!/usr/bin/env bash
# One device call for what was built without a GPU (2026-11-26, late session):
#   1. build (Release, sm_90): tiermoe and test_cuda_ops;
#   2. test_cuda_ops: the q4_K x 8-bit activation product (mmvq_q8x q4_K), the grouped
#      experts' q8x path (moe ... 8-bit activations), and the placement matrix with its
#      new cases: `--ram-cache 1 --moe-fetch copy` (prompts' experts copied from the
#      store's pinned slots) and `-ngl all, TIERMOE_MOE_Q8X=1`;
#   3. bench, 30b-a3b uniform routing (/tmp/m30.gguf), -ngl all: tg64 at 1 and 8
#      sequences (-np 1,8), f32 against 8-bit expert activations (TIERMOE_MOE_Q8X=1),
#      alternating, REPS each;
#   4. STAGES ssd of scripts/device_hybrid.sh when SSD=1 (prompts copied from the store
#      against the CPU lane; a second call is safer: the drive makes it long).
#   scripts/device_q8x_store.sh [OUT]     REPS (2), ROUNDS (2), NO_CHECKS=1, SSD=1
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=${BUILD:-build/device-hybrid}
REPS=${REPS:-2}
. scripts/device_env.sh
TM=$BUILD/tiermoe
M=/tmp/m30.gguf

# issue 18's optional CUDA virtual memory: does the driver offer cuMemCreate/cuMemMap here
python3 -c "
import ctypes
c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0)
d, v, g = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
c.cuDeviceGet(ctypes.byref(d), 0)
c.cuDeviceGetAttribute(ctypes.byref(v), 102, d)  # VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
c.cuDeviceGetAttribute(ctypes.byref(g), 116, d)  # GPU_DIRECT_RDMA_SUPPORTED
print('CUDA virtual memory management:', v.value, '| GPUDirect RDMA:', g.value)" 2>&1 | tail -1
stamp "build"
device_build_checks "$BUILD" "mmvq_q8x|8-bit|ram-cache|Q8X" || exit 1
stamp "model"
device_models "$M" "" "$TM" || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
device_bench_rounds TIERMOE_MOE_Q8X "0 1" -ngl all -p 0 -n 64 -np 1,8
if [ "${SSD:-0}" = 1 ]; then
    STAGES=ssd BUILD=$BUILD scripts/device_hybrid.sh "$OUT" # its build is incremental
fi
stamp "done"
