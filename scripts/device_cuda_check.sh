#!/usr/bin/env bash
# Device call for the CUDA backend (issue 6): build test_cuda_ops and tiermoe
# for sm_90 only (fast), run the op harness (every kernel + the whole model vs
# the CPU), run it under compute-sanitizer memcheck when the tool is there,
# run the perf mode, then (unless NO_MODEL=1) make the 30b-a3b model, compare
# it GPU vs CPU (TM_CUDA_MODEL) and bench it with -ngl all (graph on and off,
# and a --profile run). Ends with a compact summary. Logs go to $OUT.
#   scripts/device_cuda_check.sh [OUT_DIR]
# Stages are switched off one by one to fit a call's time limit:
#   NO_MODEL=1 (no 30b-a3b), NO_MEMCHECK=1, NO_OPBENCH=1 (no TM_CUDA_BENCH run).
# Exit status: 0 when every stage that ran passed; the summary says which failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-cuda
. scripts/device_env.sh

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | head -2
nvcc --version 2>&1 | tail -1

echo "== build (Release, sm_90)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA_ARCHITECTURES=90-real \
    > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; echo "SUMMARY: cmake FAILED"; exit 1; }
grep -q "CUDA backend ON" "$OUT/cmake.log" || { grep "CUDA" "$OUT/cmake.log"; echo "SUMMARY: CUDA backend not found by cmake"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_ops tiermoe > "$OUT/build.log" 2>&1 \
    || { grep -E "error|Error" -A3 "$OUT/build.log" | head -60; echo "SUMMARY: build FAILED"; exit 1; }
# registers / stack per kernel (ptxas report): spills or stack frames would explain slow kernels
for f in src/cuda/*.cu; do
    nvcc -arch=sm_90 -std=c++17 -I src --resource-usage -c "$f" -o /dev/null 2>&1 \
        | awk '/Function properties for/ {f=$NF} /Used/ {sub(/.*Used/, "Used"); print "  " f ": " $0}'
done | sed 's/_Z[0-9]*//' | cut -c1-150 > "$OUT/resources.txt"
cat "$OUT/resources.txt"

status_checks=skipped status_memcheck=skipped status_bench=skipped
echo "== checks (test_cuda_ops)"
timeout 300 "$BUILD/tests/test_cuda_ops" > "$OUT/checks.log" 2>&1
rc=$?
grep -E "^device:|ok|worst|FAIL|fail|Failure|error|skipped|PASSED|FAILED|SKIPPED" "$OUT/checks.log" | head -60
[ $rc -eq 0 ] && ! grep -q "SKIPPED" "$OUT/checks.log" && status_checks=PASS || status_checks="FAIL(rc=$rc)"
grep -q "SKIPPED" "$OUT/checks.log" && [ $rc -eq 0 ] && status_checks="SKIPPED(no device?)"

if [ "${NO_MEMCHECK:-0}" = 1 ]; then
    echo "== memcheck skipped (NO_MEMCHECK=1)"
elif command -v compute-sanitizer > /dev/null; then
    echo "== compute-sanitizer memcheck (out-of-bounds and misaligned device accesses)"
    timeout ${MEMCHECK_TIMEOUT:-400} compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$BUILD/tests/test_cuda_ops" > "$OUT/memcheck.log" 2>&1
    rc=$?
    grep -E "ERROR SUMMARY|Invalid|out of bounds|misaligned|PASSED|FAILED" "$OUT/memcheck.log" | head -20
    [ $rc -eq 0 ] && status_memcheck=PASS || status_memcheck="FAIL(rc=$rc)"
    # gVisor machines refuse the tool ("Device not supported"): that is no kernel bug
    grep -qi "device not supported" "$OUT/memcheck.log" && status_memcheck="unavailable(tool refused the device)"
else
    echo "== compute-sanitizer not found: memcheck skipped"
fi

status_model=skipped
if [ "${NO_MODEL:-0}" != 1 ]; then
    echo "== 30b-a3b: GPU vs CPU logits (first 16 tokens), then bench -ngl all"
    [ -f /tmp/m30.gguf ] || "$BUILD/tiermoe" mkmodel --preset 30b-a3b -q -o /tmp/m30.gguf
    TM_CUDA_MODEL=/tmp/m30.gguf timeout 300 "$BUILD/tests/test_cuda_ops" > "$OUT/model30.log" 2>&1 \
        && status_model=PASS || status_model="FAIL(rc=$?)"
    grep -E "m30|near tie|FAIL|fail|error" "$OUT/model30.log" | head -20
    timeout 240 "$BUILD/tiermoe" bench -m /tmp/m30.gguf -ngl all -p 512 -n 128 -r 3 2>&1 | tee "$OUT/bench30.md" | grep -E "^\||GPU|rror"
    echo "-- decode without the CUDA graph"
    TIERMOE_CUDA_GRAPH=0 timeout 120 "$BUILD/tiermoe" bench -m /tmp/m30.gguf -ngl all -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|rror"
    echo "-- profile (a sync per part, no graph)"
    timeout 120 "$BUILD/tiermoe" bench -m /tmp/m30.gguf -ngl all -p 512 -n 64 -r 1 --profile 2>&1 | grep -vE "^\| ---" | tail -8
fi

if [ "${NO_OPBENCH:-0}" != 1 ]; then
    echo "== bench (TM_CUDA_BENCH=1)"
    TM_CUDA_BENCH=1 timeout 400 "$BUILD/tests/test_cuda_ops" > "$OUT/bench.log" 2>&1
    rc=$?
    grep -E "^bench upload" "$OUT/bench.log" | sort -u | head -5
    [ $rc -eq 0 ] && status_bench=PASS || { status_bench="FAIL(rc=$rc)"; grep -E "FAIL|fail|error" "$OUT/bench.log" | head; }
    echo
    grep -E "^\||^\(H100" "$OUT/bench.log"
    echo
fi
echo "SUMMARY: checks $status_checks | memcheck $status_memcheck | model30 $status_model | bench $status_bench | logs in $OUT"
[[ $status_checks == PASS && $status_memcheck != FAIL* && $status_bench != FAIL* && $status_model != FAIL* ]]
