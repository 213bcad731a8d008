#!/usr/bin/env bash
# Check the CUDA kernels' arithmetic and the op harness on a machine without
# a GPU: builds tests/test_cuda_ops.c against a host mock of src/cuda/cuda.h
# (tests/emu/cuda_mock.cpp) and against the launchers and kernels of
# src/cuda/router.cu, norm_rope.cu, mmvq_q8x.cu, mmvq_lbx.cu, moe_fetch.cu, attention.cu,
# dequant.cu, ssm.cu and mla.cu themselves (tests/cuda/check_fetch.c, check_attention.c,
# check_dequant.c and check_ssm.c run on them too: attention's cases up to TM_CUDA_ATTN_WORK
# query-key pairs, prompts on its f32 kernel, as the tensor-core one is not
# emulated; every weight type's decoder bit for bit; check_lbx.c with its test
# kernels tests/cuda/check_lbx.cu: the 8-bit unpackers), compiled as
# host C++ with each launch run on an emulated grid (tests/emu/
# cuda_emu_extract.py, cuda_warp_shim.h); the mock's mmvq and grouped experts
# call the kernels' device functions lane by lane. Then runs the checks (any
# failure: non-zero exit) and the bench's code paths. Needs the CUDA
# toolkit's headers (no nvcc, no GPU; without them: exit 77, skipped) and a
# configured build dir (default build; an ASan build's library is linked with
# the sanitizers). About 100 s of CPU with build/asan, compiling included. The
# GPU run is scripts/device.sh checks.
#   scripts/cuda_emu_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
for d in "${CUDA_INC:-}" /usr/local/cuda/include /usr/include; do
    if [ -n "$d" ] && [ -f "$d/cuda_runtime.h" ]; then CUDA_INC=$d && break; fi
done
if [ ! -f "${CUDA_INC:-}/cuda_runtime.h" ]; then
    echo "skipped: no CUDA headers (cuda_runtime.h in /usr/local/cuda/include or /usr/include; or set CUDA_INC)"
    exit 77
fi
SAN=
if grep -q '^TM_SANITIZE:BOOL=ON' "$BUILD/CMakeCache.txt" 2> /dev/null; then
    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
fi
# from ctest (TM_EMU_NOBUILD=1) the library is built already, and a second ninja in the
# build dir beside the tests would race them
[ -n "${TM_EMU_NOBUILD:-}" ] || cmake --build "$BUILD" --target tiermoe_lib > /dev/null
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# The other checks in tests/cuda/check_*.c need what the mock lacks (cuBLAS,
# rows of several sequences, whole models): skipped here, through stubs.
sed -n 's/^void \(check_[a-z0-9_]*\)(void \*\*state);$/\1/p' tests/cuda/cuda_check.h \
    | grep -v '^check_fetch_ahead$\|^check_attention$\|^check_dequant$\|^check_lbx$\|^check_ssm$\|^check_ssm_gates$\|^check_attn_partial_rope$\|^check_mla$' \
    | awk 'BEGIN { print "#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <stdint.h>\n#include <cmocka.h>" }
           { print "void " $1 "(void **state);\nvoid " $1 "(void **state) { (void)state; skip(); }" }' > "$T/stubs.c"
CXX="g++ -std=c++20 -O2 -w -Isrc -Itests/emu -I$CUDA_INC"
CC="gcc -std=c11 -O1 -D_GNU_SOURCE -DTM_HAVE_CUDA=1 -Isrc -Iinclude -Itests -Wall -Wextra -Werror -Wno-unused-parameter $SAN"
pids=()
for f in router norm_rope mmvq_q8x mmvq_lbx moe_fetch attention dequant ssm mla; do
    python3 tests/emu/cuda_emu_extract.py src/cuda/$f.cu > "$T/$f.cpp"
    $CXX -include cuda_warp_shim.h -c "$T/$f.cpp" -o "$T/$f.o" & pids+=($!)
done
python3 tests/emu/cuda_emu_extract.py tests/cuda/check_lbx.cu > "$T/check_lbx_cu.cpp"
$CXX -Itests/cuda -include cuda_warp_shim.h -c "$T/check_lbx_cu.cpp" -o "$T/check_lbx_cu.o" & pids+=($!)
$CXX -c tests/emu/cuda_mock.cpp -o "$T/mock.o" & pids+=($!)
$CC -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla -c tests/test_cuda_ops.c -o "$T/test.o" & pids+=($!)
$CC -c tests/cuda/cuda_check.c -o "$T/check.o" & pids+=($!)
$CC -c tests/cuda/check_fetch.c -o "$T/check_fetch.o" & pids+=($!)
$CC -c tests/cuda/check_attention.c -o "$T/check_attention.o" & pids+=($!)
$CC -c tests/cuda/check_dequant.c -o "$T/check_dequant.o" & pids+=($!)
$CC -c tests/cuda/check_lbx.c -o "$T/check_lbx.o" & pids+=($!)
$CC -c tests/cuda/check_ssm.c -o "$T/check_ssm.o" & pids+=($!)
$CC -c tests/cuda/check_mla.c -o "$T/check_mla.o" & pids+=($!)
$CC -c "$T/stubs.c" -o "$T/stubs.o" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
g++ $SAN "$T"/*.o "$BUILD/libtiermoe_lib.a" $(pkg-config --libs cmocka jansson libpcre2-8 libutf8proc) \
    -lm -lpthread -o "$T/test_cuda_ops_mock"
echo "== compiled in ${SECONDS}s; the checks on the mock"
TM_CUDA_ATTN_WORK=${TM_CUDA_ATTN_WORK:-13000} "$T/test_cuda_ops_mock"
echo "== bench code paths on the mock (no arithmetic)"
MOCK_FAST=1 TM_CUDA_BENCH=1 TM_CUDA_ONLY=test_bench "$T/test_cuda_ops_mock" 2>&1 | grep -E "test_bench" || true
echo "== cuda_emu_check: passed in ${SECONDS}s"
