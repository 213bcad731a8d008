#!/usr/bin/env bash
# One device call for the tiered executor (docs/executor.md): build Release
# for sm_90, make the 30b-a3b model, run the GPU checks (every op, the
# placement matrix on the real kernels, the model's placements against the
# CPU), then bench llama.cpp (../shared/peer, carried in .peer/) and tiermoe
# on the same file in the same call:
#   -ngl all, --cpu-moe (PCIe lane auto, off, 2, 4), --n-cpu-moe 35 (PCIe lane auto,
#   off), the same bytes as a --moe-cache, CPU only.
# Stages are switched off to fit a call: NO_CHECKS=1, NO_PEER=1, NO_CPU=1,
# ONLY="cpu-moe ncmoe35 ..." (tiermoe cases by name), REPS (default 3).
# Logs and tables go to $OUT; the summary is printed last.
#   scripts/device_tier.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-tier
REPS=${REPS:-3}
M=/tmp/m30.gguf
. scripts/device_env.sh
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

stamp "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
lscpu | grep -E "Model name|^CPU\(s\)" | tr -s ' '

stamp "build (Release, sm_90)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA_ARCHITECTURES=90-real \
    > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; echo "SUMMARY: cmake FAILED"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target tiermoe test_cuda_ops > "$OUT/build.log" 2>&1 \
    || { grep -E "error" -A3 "$OUT/build.log" | head -40; echo "SUMMARY: build FAILED"; exit 1; }

stamp "model"
[ -f "$M" ] || "$BUILD/tiermoe" mkmodel --preset 30b-a3b -q -o "$M" || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
ls -la "$M"

status_checks=skipped
if [ "${NO_CHECKS:-0}" != 1 ]; then
    stamp "checks: every op, the placement matrix (test_cuda_ops)"
    TM_TEST_TMP=/tmp TM_CUDA_MODEL="$M" timeout 400 "$BUILD/tests/test_cuda_ops" > "$OUT/checks.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED|ERROR) |FAIL|^\[  ERROR|greedy|worst logits|skipped|Failure" "$OUT/checks.log" | head -70
    [ $rc -eq 0 ] && status_checks=PASS || status_checks="FAIL(rc=$rc)"
fi

if [ "${NO_PEER:-0}" != 1 ] && [ -f .peer/llama-bench.tar.xz ]; then
    stamp "llama.cpp (peer)"
    [ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
    LB=/tmp/llamacpp-peer/llama-bench
    for args in "-ngl 99 -ncmoe 48,35" "-ngl 99"; do
        timeout 300 $LB -m "$M" -fa 1 -p 512 -n 128 -r "$REPS" -t 16 $args 2>&1 \
            | tee -a "$OUT/peer.md" | grep -E "^\|" 
    done
fi

# tiermoe: name, flags
cases=(
    "cpu-moe|--cpu-moe"
    "cpu-moe-nopcie|--cpu-moe --moe-pcie off"
    "cpu-moe-p2|--cpu-moe --moe-pcie 2"
    "cpu-moe-p4|--cpu-moe --moe-pcie 4"
    "ncmoe35|--n-cpu-moe 35"
    "ncmoe35-nopcie|--n-cpu-moe 35 --moe-pcie off"
    "cache13|--cpu-moe --moe-cache 4212"
    "cache13-p3|--cpu-moe --moe-cache 4212 --moe-pcie 3"
    "cache13-p2|--cpu-moe --moe-cache 4212 --moe-pcie 2"
    "gpu|-ngl all"
    "cpu|-ngl 0"
)
for c in "${cases[@]}"; do
    name=${c%%|*} flags=${c#*|}
    [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && continue
    [ "$name" = cpu ] && [ "${NO_CPU:-0}" = 1 ] && continue
    stamp "tiermoe $name: $flags"
    timeout 300 "$BUILD/tiermoe" bench -m "$M" -p 512 -n 128 -r "$REPS" -t 16 $flags \
        > /tmp/tm.md 2> /tmp/tm.err
    { echo "## $name: $flags"; cat /tmp/tm.md; } >> "$OUT/tiermoe.md"
    { echo "## $name: $flags"; cat /tmp/tm.err; } >> "$OUT/tiermoe.err"
    grep -E "^\| qwen" /tmp/tm.md || tail -5 /tmp/tm.err
done
if [[ -z "${ONLY:-}" || " $ONLY " == *" graph0 "* ]]; then
    stamp "tiermoe --cpu-moe without the decode graph (TIERMOE_CUDA_GRAPH=0)"
    TIERMOE_CUDA_GRAPH=0 timeout 120 "$BUILD/tiermoe" bench -m "$M" -p 0 -n 128 -r "$REPS" -t 16 \
        --cpu-moe 2>&1 | grep -E "^\| qwen|rror"
fi
if [[ -z "${ONLY:-}" || " $ONLY " == *" profile "* ]]; then
    stamp "tiermoe --cpu-moe --profile"
    timeout 120 "$BUILD/tiermoe" bench -m "$M" -p 512 -n 32 -r 1 -t 16 --cpu-moe --profile \
        > /tmp/tm.md 2> "$OUT/profile.err"
    cat /tmp/tm.md >> "$OUT/profile.err"
    grep -vE "^\| ---|^tiermoe: info" "$OUT/profile.err" | head -30
fi
stamp "done"
echo "SUMMARY: checks $status_checks | logs in $OUT"
