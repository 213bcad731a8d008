#!/usr/bin/env bash
# One device call for calibration (docs/calibrate.md): build Release for sm_90, make the
# 30b-a3b model unless present, then
#   1. tiermoe calibrate (full; the profile goes to the cache directory, as a user's would),
#   2. tiermoe calibrate --quick (what a run without a profile measures at load, and how long
#      it takes),
# and copy the profiles and the printed tables to $OUT (5 files at most).
#   scripts/device_calibrate.sh [OUT_DIR] [THREADS]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
THREADS=${2:-16}
mkdir -p "$OUT"
BUILD=build/device-calib
M=/tmp/m30.gguf
. scripts/device_env.sh
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

stamp "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
lscpu | grep -E "Model name|^CPU\(s\)|L3" | tr -s ' '

stamp "build (Release, sm_90)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA_ARCHITECTURES=90-real \
    > /tmp/calib-cmake.log 2>&1 \
    || { tail -30 /tmp/calib-cmake.log | tee "$OUT/build.log"; echo "SUMMARY: cmake FAILED"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target tiermoe > /tmp/calib-build.log 2>&1 \
    || { grep -E "error" -A3 /tmp/calib-build.log | head -40 | tee "$OUT/build.log"
         echo "SUMMARY: build FAILED"; exit 1; }

stamp "model"
[ -f "$M" ] || "$BUILD/tiermoe" mkmodel --preset 30b-a3b -q -o "$M" \
    || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
ls -la "$M"

stamp "tiermoe calibrate -t $THREADS (full)"
timeout 400 "$BUILD/tiermoe" calibrate -m "$M" -t "$THREADS" 2>&1 | tee "$OUT/calibrate.log"
rc_full=${PIPESTATUS[0]}
profile=$(sed -n 's/^profile: \(.*\) ([0-9.]* s in all)$/\1/p' "$OUT/calibrate.log" | tail -1)
[ -n "$profile" ] && [ -f "$profile" ] && cp "$profile" "$OUT/calib-full.json"

stamp "tiermoe calibrate -t $THREADS --quick"
timeout 120 "$BUILD/tiermoe" calibrate -m "$M" -t "$THREADS" --quick \
    --profile-out "$OUT/calib-quick.json" 2>&1 | tee "$OUT/calibrate-quick.log"
rc_quick=${PIPESTATUS[0]}

stamp "done"
share() { grep -E "^decode: " "$1" 2>/dev/null | tail -1; }
echo "SUMMARY: full rc=$rc_full ($(share "$OUT/calibrate.log")) | quick rc=$rc_quick" \
     "($(share "$OUT/calibrate-quick.log"); $(grep -E '^time: ' "$OUT/calibrate-quick.log" | tail -1))" \
     "| profile $profile"
