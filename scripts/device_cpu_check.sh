#!/usr/bin/env bash
# CPU kernel check on the device machine (Xeon with AVX-512 VNNI and AMX).
# Builds only what the CPU kernels need (src/core, src/quant, src/cpu and the
# two tests and the bench) with gcc -O3 directly, so it needs neither CMake's
# other dependencies nor pkg-config; cmocka comes from the system or from the
# .deb files in .devdeps/ (carry it), unpacked into a temporary root.
# Then runs the CPU tests at every kernel level the CPU has and the product
# bench with THREADS threads at each level (compact tables). LEVELS picks
# the levels benched; QUICK=1 skips the 8-thread and other-type tables.
#   scripts/device_cpu_check.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-16}
OUTDIR=$(mktemp -d)
trap 'rm -rf "$OUTDIR"' EXIT
echo "== machine"
lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|L2 cache|L3 cache|NUMA node\(s\)" || true
CM_INC="" CM_LIB=""
if ! echo '#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>' | gcc -E -x c - > /dev/null 2>&1; then
    ls .devdeps/libcmocka*.deb > /dev/null 2>&1 || { echo "no cmocka: carry .devdeps with libcmocka0 and libcmocka-dev debs"; exit 1; }
    for f in .devdeps/libcmocka*.deb; do dpkg -x "$f" "$OUTDIR/root"; done
    CM_INC="-I$OUTDIR/root/usr/include"
    CM_LIB="-L$OUTDIR/root/usr/lib/x86_64-linux-gnu -Wl,-rpath,$OUTDIR/root/usr/lib/x86_64-linux-gnu"
fi
echo "== build (gcc $(gcc -dumpversion), -O3, no -march)"
CF="-std=c11 -O3 -DNDEBUG -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Isrc -Iinclude -Wall -Wextra -Wno-unused-parameter"
objs=()
for src in src/core/*.c src/quant/*.c src/cpu/*.c; do
    o="$OUTDIR/$(echo "$src" | tr / _).o"
    gcc $CF -c "$src" -o "$o"
    objs+=("$o")
done
ar rcs "$OUTDIR/libcpu.a" "${objs[@]}"
gcc $CF $CM_INC tests/test_cpu_gemm.c "$OUTDIR/libcpu.a" $CM_LIB -lcmocka -lm -lpthread -o "$OUTDIR/test_cpu_gemm"
gcc $CF $CM_INC tests/test_cpu_pool.c "$OUTDIR/libcpu.a" $CM_LIB -lcmocka -lm -lpthread -o "$OUTDIR/test_cpu_pool"
gcc $CF $CM_INC tests/test_cpu_ops.c "$OUTDIR/libcpu.a" $CM_LIB -lcmocka -lm -lpthread -o "$OUTDIR/test_cpu_ops"
gcc $CF tests/tools/cpu_gemm_bench.c "$OUTDIR/libcpu.a" -lm -lpthread -o "$OUTDIR/cpu_gemm_bench"
status=0
echo "== test_cpu_gemm"
"$OUTDIR/test_cpu_gemm" 2>&1 | grep -Ev "^\[ RUN|^\[       OK" || status=1
echo "== test_cpu_ops"
"$OUTDIR/test_cpu_ops" 2>&1 | grep -Ev "^\[ RUN|^\[       OK" || status=1
echo "== test_cpu_pool"
"$OUTDIR/test_cpu_pool" 2>&1 | grep -Ev "^\[ RUN|^\[       OK" || status=1
for level in ${LEVELS:-avx2 avx512 amx}; do
    echo "== bench, level $level, $THREADS threads (Qwen3-30B-A3B shapes)"
    "$OUTDIR/cpu_gemm_bench" -t "$THREADS" -l "$level" -q -s 0.3 -m 2048 || true
done
if [ -z "${QUICK:-}" ]; then
    echo "== bench, best level, 8 threads"
    "$OUTDIR/cpu_gemm_bench" -t 8 -q -s 0.3 -m 2048 || true
    echo "== bench, best level, other types, $THREADS threads"
    "$OUTDIR/cpu_gemm_bench" -t "$THREADS" -s 0.2 -m 1024 | sed -n '1,4p;17,$p' || true
fi
echo "== status $status"
exit $status
