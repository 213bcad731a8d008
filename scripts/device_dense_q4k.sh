#!/usr/bin/env bash
# 8-bit activations for the executor's dense q4_K products (attention of Q4_K_M files):
#   1. build (Release, sm_90): tiermoe and test_cuda_ops; test_cuda_ops (its 4x32 placement
#      model has q4_K attention) unless NO_CHECKS=1;
#   2. 30b-a3b with q4_K attention (/tmp/m30k.gguf, made unless there), -ngl all, tg64 at
#      1 and 8 sequences, the dense q4_K products with f32 activations (the default) against
#      8-bit ones (TIERMOE_MMVQ_Q8X=q4_K), alternating, ROUNDS (2) x REPS (2).
#   scripts/device_dense_q4k.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=${BUILD:-build/device-hybrid}
REPS=${REPS:-2}
. scripts/device_env.sh
TM=$BUILD/tiermoe
M=/tmp/m30k.gguf
stamp "build"
device_build_checks "$BUILD" "mmvq_q8x|-ngl all, normal" || exit 1
stamp "model"
[ -f "$M" ] || $TM mkmodel --preset 30b-a3b --type-attn q4_K -q -o "$M" || exit 1
device_bench_rounds TIERMOE_MMVQ_Q8X "1 q4_K" -ngl all -p 0 -n 64 -np 1,8
stamp "done"
