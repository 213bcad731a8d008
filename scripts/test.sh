#!/usr/bin/env bash
# Second command of the README (and CI): build with ASan+UBSan and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/format.sh --check   # one style: run scripts/format.sh to fix
scripts/build.sh asan
TM_CUDA=OFF scripts/build.sh debug   # -O0 must compile too (intrinsics that want immediates)
scripts/fuzz_smoke.sh                # every libFuzzer target 15 s from its corpus (clang-14)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir build/asan --output-on-failure -j "$(nproc)" --timeout 900
