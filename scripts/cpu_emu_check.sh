#!/usr/bin/env bash
# Check the AVX-512 and AMX kernels' logic on a machine without those ISAs:
# compiles src/cpu/cpu_gemm_avx512.c, cpu_gemm_lowbit_avx512.c, cpu_gemm_iq_avx512.c,
# cpu_gemm_amx.c and cpu_gemm_amx_bf16.c against scalar
# emulations of their intrinsics (tests/emu/emu512.h) and compares them with
# the scalar reference products (the AMX-INT8 kernel's low-bit unpacking,
# cpu_gemm_amx_lowbit.c, is AVX2 and comes from the library as it is). Needs a
# configured build dir (default build;
# a sanitizer build such as build/asan links with its sanitizers). Exits
# non-zero on any mismatch; also a CTest test (cpu_emu_check).
#   scripts/cpu_emu_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
# from ctest (TM_EMU_NOBUILD=1) the library is built already, and a second ninja in the
# build dir beside the tests would race them
[ -n "${TM_EMU_NOBUILD:-}" ] || cmake --build "$BUILD" --target tiermoe_lib > /dev/null
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for f in cpu_gemm_avx512 cpu_gemm_lowbit_avx512 cpu_gemm_iq_avx512 cpu_gemm_amx cpu_gemm_amx_bf16; do
    sed -e 's/#include <immintrin.h>/#include <math.h>\n#include "emu512.h"/' \
        -e 's|^#include "cpu/cpu_gemm_lowbit.h"|&\n#include <math.h>\n#include "emu512.h"|' \
        -e 's/^TM_LB_DEFINE_GET(cpu_gemm_lowbit_avx512_get)/TM_LB_DEFINE_GET(emu_lowbit_avx512_get)/' \
        -e 's/cpu_gemm_lowbit_avx512_get(wtype)/emu_lowbit_avx512_get(wtype)/' \
        -e '/^cpu_gemm_fn cpu_gemm_avx512_get/i cpu_gemm_fn emu_lowbit_avx512_get(tm_type wtype);' \
        -e 's/"avx2,fma,f16c,avx512f[^"]*"/"avx2,fma,f16c"/' \
        -e 's/^cpu_gemm_fn cpu_gemm_\(avx512\|amx\|amx_bf16\)_get/cpu_gemm_fn emu_\1_get/' \
        -e "s/^static cpu_gemm_fn amxbf_kernel/cpu_gemm_fn emu_amxbf_kernel/" -e "s/? amxbf_kernel(/? emu_amxbf_kernel(/" \
        -e 's/cpu_gemm_avx512_get(/emu_avx512_get(/g' -e 's/cpu_gemm_iq_avx512_get(/emu_iq_avx512_get(/g' \
        -e 's|^#include "cpu/cpu_internal.h"|&\ncpu_gemm_fn emu_iq_avx512_get(tm_type wtype);|' -e 's/cpu_amx_configure(/emu_amx_configure(/g' \
        -e 's/^int64_t cpu_gemm_amx_min_tokens/int64_t emu_amx_min_tokens/' src/cpu/$f.c > "$T/emu_$f.c"
done
CF="-O1 -std=c11 -D_GNU_SOURCE -Isrc -Itests/emu -mavx2 -mfma -mf16c -w"
if grep -q '^TM_SANITIZE:BOOL=ON' "$BUILD/CMakeCache.txt"; then
    CF="$CF -fsanitize=address,undefined -fno-sanitize-recover=undefined"
fi
gcc $CF -c "$T/emu_cpu_gemm_avx512.c" -o "$T/a.o"
gcc $CF -c "$T/emu_cpu_gemm_amx.c" -o "$T/b.o"
gcc $CF -c "$T/emu_cpu_gemm_amx_bf16.c" -o "$T/c.o"
gcc $CF -c "$T/emu_cpu_gemm_lowbit_avx512.c" -o "$T/d.o"
gcc $CF -c "$T/emu_cpu_gemm_iq_avx512.c" -o "$T/e.o"
gcc $CF tests/emu/emu_check.c "$T/a.o" "$T/b.o" "$T/c.o" "$T/d.o" "$T/e.o" "$BUILD/libtiermoe_lib.a" -lm -lpthread -o "$T/emu_check"
"$T/emu_check"
