#!/usr/bin/env bash
# Check the CUDA kernels' index math and the op harness on a machine without
# a GPU: builds tests/test_cuda_ops.c against a host mock of src/cuda/cuda.h
# (tests/emu/cuda_mock.cpp) whose mmvq / grouped-expert / router code is the
# kernels' own device code run on the CPU, then runs the checks and the
# bench's code paths. Needs nvcc's headers (/usr/local/cuda/include) and a
# configured build dir (default build). Dev check only: the GPU run is
# scripts/device.sh checks.
#   scripts/cuda_emu_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
cmake --build "$BUILD" --target tiermoe_lib > /dev/null
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
awk '/^extern "C"/ {exit} {print}' src/cuda/router.cu \
    | sed -e 's/__global__ void __launch_bounds__([^)]*)/static void/' -e 's/^__global__ void/static void/' \
    > "$T/router_kernel.cpp"
# Checks in tests/cuda/check_*.c run whole models (the real backend): skipped
# here, through stubs for every check_* the harness declares.
sed -n 's/^void \(check_[a-z0-9_]*\)(void \*\*state);$/\1/p' tests/cuda/cuda_check.h \
    | awk 'BEGIN { print "#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <stdint.h>\n#include <cmocka.h>" }
           { print "void " $1 "(void **state);\nvoid " $1 "(void **state) { (void)state; skip(); }" }' > "$T/stubs.c"
gcc -std=c11 -O1 -Wall -Wextra -Werror -c "$T/stubs.c" -o "$T/stubs.o"
g++ -std=c++20 -O2 -w -Isrc -Itests/emu -I"$T" -I"$CUDA_INC" -c tests/emu/cuda_mock.cpp -o "$T/mock.o"
gcc -std=c11 -O1 -D_GNU_SOURCE -DTM_HAVE_CUDA=1 -Isrc -Iinclude -Wall -Wextra -Werror -Wshadow \
    -Wstrict-prototypes -Wmissing-prototypes -Wvla -Wno-unused-parameter -c tests/test_cuda_ops.c -o "$T/test.o"
gcc -std=c11 -O1 -D_GNU_SOURCE -DTM_HAVE_CUDA=1 -Isrc -Itests -Wall -Wextra -Werror -Wno-unused-parameter -c tests/cuda/cuda_check.c -o "$T/check.o"
g++ "$T/test.o" "$T/check.o" "$T/stubs.o" "$T/mock.o" "$BUILD/libtiermoe_lib.a" $(pkg-config --libs cmocka jansson libpcre2-8 libutf8proc) \
    -lm -lpthread -o "$T/test_cuda_ops_mock"
echo "== checks on the mock"
"$T/test_cuda_ops_mock"
echo "== bench code paths on the mock (no arithmetic; the checks fail by design there, only test_bench counts)"
MOCK_FAST=1 TM_CUDA_BENCH=1 "$T/test_cuda_ops_mock" 2>&1 | grep -E "test_bench" || true
