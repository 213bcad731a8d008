#!/usr/bin/env bash
# Device call for the CUDA kernels (issue 6, first slice): build test_cuda_ops
# for sm_90 only (fast), run the op harness, run it under compute-sanitizer
# memcheck when the tool is there, then run the perf mode, and end with a
# compact summary. Logs go to $OUT (or the first argument).
#   scripts/device_cuda_check.sh [OUT_DIR]
# Exit status: 0 when every stage that ran passed; the summary says which failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-cuda
if ! pkg-config --exists jansson libpcre2-8 libutf8proc cmocka 2>/dev/null; then
    mkdir -p /tmp/deps
    for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/deps; done
    export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
    export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PATH=$PATH:/usr/local/cuda/bin

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | head -2
nvcc --version 2>&1 | tail -1

echo "== build (Release, sm_90)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA_ARCHITECTURES=90-real \
    > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; echo "SUMMARY: cmake FAILED"; exit 1; }
grep -q "CUDA backend ON" "$OUT/cmake.log" || { grep "CUDA" "$OUT/cmake.log"; echo "SUMMARY: CUDA backend not found by cmake"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_ops > "$OUT/build.log" 2>&1 \
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

if command -v compute-sanitizer > /dev/null; then
    echo "== compute-sanitizer memcheck (out-of-bounds and misaligned device accesses)"
    timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$BUILD/tests/test_cuda_ops" > "$OUT/memcheck.log" 2>&1
    rc=$?
    grep -E "ERROR SUMMARY|Invalid|out of bounds|misaligned|PASSED|FAILED" "$OUT/memcheck.log" | head -20
    [ $rc -eq 0 ] && status_memcheck=PASS || status_memcheck="FAIL(rc=$rc)"
    # gVisor machines refuse the tool ("Device not supported"): that is no kernel bug
    grep -qi "device not supported" "$OUT/memcheck.log" && status_memcheck="unavailable(tool refused the device)"
else
    echo "== compute-sanitizer not found: memcheck skipped"
fi

echo "== bench (TM_CUDA_BENCH=1)"
TM_CUDA_BENCH=1 timeout 400 "$BUILD/tests/test_cuda_ops" > "$OUT/bench.log" 2>&1
rc=$?
grep -E "^bench upload" "$OUT/bench.log" | sort -u | head -5
[ $rc -eq 0 ] && status_bench=PASS || { status_bench="FAIL(rc=$rc)"; grep -E "FAIL|fail|error" "$OUT/bench.log" | head; }
echo
grep -E "^\||^\(H100" "$OUT/bench.log"
echo
echo "SUMMARY: checks $status_checks | memcheck $status_memcheck | bench $status_bench | logs in $OUT"
[[ $status_checks == PASS && $status_memcheck != FAIL* && $status_bench == PASS ]]
