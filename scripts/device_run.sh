#!/usr/bin/env bash
# One call on the lent GPU machine (16-core Xeon, no registry access): set up the
# libraries from Debian packages carried in .devdeps/, build Release, run the CPU
# kernel checks at every ISA level, make the 30b-a3b model and bench it on the CPU.
#   scripts/device_run.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
. scripts/device_env.sh
echo "== build"
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build/device -j"$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "== unit tests (C, every ISA level this CPU has)"
(cd build/device && ctest -R "^test_" --output-on-failure -j8 > "$OUT/ctest.log" 2>&1); tail -5 "$OUT/ctest.log"
echo "== cpu kernel check"
scripts/device_cpu_check.sh 16 build/device > "$OUT/cpu_check.log" 2>&1; echo "cpu check exit $?"; grep -E "PASSED|FAILED|skip" "$OUT/cpu_check.log" | head -20
echo "== mkmodel 30b-a3b"
/usr/bin/time -f "%e s, %M KB" build/device/tiermoe mkmodel --preset 30b-a3b -o /tmp/m30.gguf 2>&1 | tr '\r' '\n' | tail -3
ls -la /tmp/m30.gguf
echo "== bench"
build/device/tiermoe bench -m /tmp/m30.gguf -p 512 -n 128 -r 3 -t 16 2>&1 | tee "$OUT/bench.md"
