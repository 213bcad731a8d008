#!/usr/bin/env bash
# CPU kernel check on the device machine (Xeon with AVX-512 VNNI and AMX):
# Release build without CUDA, the CPU tests at every kernel level the CPU has,
# then the product bench with 16 threads at each level (compact tables).
#   scripts/device_cpu_check.sh [THREADS] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-16}
BUILD=${2:-build-devcpu}
echo "== machine"
lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|L2 cache|L3 cache" || true
echo "== build ($BUILD)"
# Others' files may warn at -O3 with this gcc; warnings stay visible but do not stop the build.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA=OFF \
    -DCMAKE_C_FLAGS="-Wno-error=format-truncation -Wno-error=maybe-uninitialized" > "$BUILD.cmake.log" 2>&1 \
    || { cat "$BUILD.cmake.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target test_cpu_gemm test_cpu_pool cpu_gemm_bench > "$BUILD.build.log" 2>&1 \
    || { tail -60 "$BUILD.build.log"; exit 1; }
status=0
echo "== test_cpu_gemm"
"$BUILD/tests/test_cpu_gemm" 2>&1 | grep -Ev "^\[ RUN|^\[       OK" || status=1
echo "== test_cpu_pool"
"$BUILD/tests/test_cpu_pool" 2>&1 | grep -Ev "^\[ RUN|^\[       OK" || status=1
for level in avx2 avx512 amx; do
    echo "== bench, level $level, $THREADS threads"
    "$BUILD/tests/cpu_gemm_bench" -t "$THREADS" -l "$level" -q -s 0.3 -m 2048 || true
done
echo "== bench, best level, all types, $THREADS threads"
"$BUILD/tests/cpu_gemm_bench" -t "$THREADS" -s 0.3 -m 1024 || true
echo "== bench, best level, 8 threads, decode cases"
"$BUILD/tests/cpu_gemm_bench" -t 8 -q -s 0.3 -m 2048 | head -10 || true
exit $status
