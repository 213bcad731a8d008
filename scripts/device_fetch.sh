#!/usr/bin/env bash
# Device call for prompt steps' experts in RAM (docs/executor.md, "Prompts"):
# build Release for sm_90, run the GPU checks (every op and the placement
# matrix on the real kernels, fetch lane included), make the 30b-a3b model,
# then bench --cpu-moe prompts with each --moe-fetch mode (and, unless
# NO_PEER=1, llama.cpp from .peer/ on the same file, mmap'd and pinned).
# Stages: NO_CHECKS=1, NO_PEER=1, CASES="name ..." (tiermoe cases by name),
# P (prompt sizes, default 512), N (tg, default 0), REPS (default 3).
#   scripts/device_fetch.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-tier
REPS=${REPS:-3}
P=${P:-512}
N=${N:-0}
M=/tmp/m30.gguf
. scripts/device_env.sh

stamp "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
lscpu | grep -E "Model name|^CPU\(s\)" | tr -s ' '

stamp "build (Release, sm_90)"
device_build "$BUILD" tiermoe test_cuda_ops || exit 1

stamp "model"
device_models "$M" "" "$BUILD/tiermoe" || { echo "SUMMARY: mkmodel FAILED"; exit 1; }

status_checks=skipped
if [ "${NO_CHECKS:-0}" != 1 ]; then
    stamp "checks: every op, the placement matrix (test_cuda_ops)"
    TM_TEST_TMP=/tmp timeout 300 "$BUILD/tests/test_cuda_ops" > "$OUT/checks.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED|ERROR) |FAIL|^\[  ERROR|greedy|worst logits|Failure" "$OUT/checks.log" | head -70
    [ $rc -eq 0 ] && status_checks=PASS || status_checks="FAIL(rc=$rc)"
fi

if [ "${NO_PEER:-0}" != 1 ] && [ -f .peer/llama-bench.tar.xz ]; then
    stamp "llama.cpp (peer): -ncmoe 48, mmap and pinned (-lm none)"
    [ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
    LB=/tmp/llamacpp-peer/llama-bench
    for lm in "" "-lm none"; do
        timeout 300 $LB -m "$M" -fa 1 -p "$P" -n "$N" -r "$REPS" -t 16 -ngl 99 -ncmoe 48 $lm 2>&1 \
            | tee -a "$OUT/peer.md" | grep -E "^\|"
    done
fi

cases=(
    "off|--cpu-moe --moe-fetch off"
    "copy|--cpu-moe --moe-fetch copy"
    "pcie|--cpu-moe --moe-fetch pcie"
    "copy-cpu0|--cpu-moe --moe-fetch copy|TIERMOE_FETCH_CPU_SHARE=0"
    "pcie-cpu0|--cpu-moe --moe-fetch pcie|TIERMOE_FETCH_CPU_SHARE=0"
    "auto|--cpu-moe"
    "ncmoe35|--n-cpu-moe 35"
    "gpu|-ngl all"
)
for c in "${cases[@]}"; do
    IFS='|' read -r name flags env <<< "$c"
    [ -n "${CASES:-}" ] && [[ " $CASES " != *" $name "* ]] && continue
    stamp "tiermoe $name: $flags $env"
    env $env timeout 300 "$BUILD/tiermoe" bench -m "$M" -p "$P" -n "$N" -r "$REPS" -t 16 $flags \
        > /tmp/tm.md 2> /tmp/tm.err
    { echo "## $name: $flags $env"; cat /tmp/tm.md; } >> "$OUT/tiermoe.md"
    { echo "## $name: $flags $env"; cat /tmp/tm.err; } >> "$OUT/tiermoe.err"
    grep -E "^\| qwen" /tmp/tm.md || tail -5 /tmp/tm.err
done
if [[ -z "${CASES:-}" || " $CASES " == *" profile "* ]]; then
    stamp "tiermoe --cpu-moe --profile (auto)"
    timeout 200 "$BUILD/tiermoe" bench -m "$M" -p 512 -n 0 -r 2 -t 16 --cpu-moe --profile \
        > /tmp/tm.md 2> "$OUT/profile.err"
    grep -vE "^\| ---|^tiermoe: info" "$OUT/profile.err" | head -20
fi
stamp "done"
echo "SUMMARY: checks $status_checks | logs in $OUT"
