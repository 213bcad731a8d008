#!/usr/bin/env bash
# Short device call: build Release, make 30b-a3b, bench it on the CPU with a per-part profile.
#   scripts/device_bench.sh [OUT_DIR] [THREADS]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
THREADS=${2:-16}
mkdir -p "$OUT"
. scripts/device_env.sh
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA=OFF > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build/device -j"$(nproc)" --target tiermoe > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
[ -f /tmp/m30.gguf ] || build/device/tiermoe mkmodel --preset 30b-a3b -q -o /tmp/m30.gguf
build/device/tiermoe bench -m /tmp/m30.gguf -p 512 -n 128 -r 3 -t "$THREADS" --profile 2>&1 | tee "$OUT/bench.md"
