#!/usr/bin/env bash
# Issue 19's prompt-attention call: the attention checks (tensor-core prompt
# path against the double reference; the f32 kernel for decode, precise and
# misaligned launches) and the whole-model check, then on the 30b-a3b file
# llama.cpp (.peer/, -fa 1) and tiermoe -ngl all at pp512 / pp2048 with the
# prompt attention on tensor cores and on the f32 kernel (TIERMOE_ATTN_TC=0)
# in alternation, and Nsight Compute on one launch of each attention kernel.
# With compute-sanitizer there, memcheck and racecheck of check_attention;
# pp8192 (llama.cpp, tiermoe with either kernel) unless NO_LONG=1.
#   scripts/device_attn.sh [OUT]    REPS (3), NO_CHECKS=1, NO_SANITIZER=1,
#                                   NO_LONG=1, NO_PROFILE=1
# Binaries in bin/ or bin.tar.xz (tiermoe, test_cuda_ops, built for sm_90
# with the same CUDA elsewhere, to save the call the build) are used when
# their libraries resolve; else it builds them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-cuda
REPS=${REPS:-3}
M=/tmp/m30.gguf
. scripts/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
[ -f bin.tar.xz ] && tar xJf bin.tar.xz
TM=bin/tiermoe
TEST=bin/test_cuda_ops
if ! { [ -x $TM ] && [ -x $TEST ] && ! ldd $TM $TEST | grep -q "not found"; }; then
    stamp "build"
    device_build "$BUILD" tiermoe test_cuda_ops || exit 1
    TM=$BUILD/tiermoe TEST=$BUILD/tests/test_cuda_ops
fi
checks=skipped
if [ "${NO_CHECKS:-0}" != 1 ]; then
    stamp "check_attention*"
    TM_CUDA_ONLY='check_attention*' timeout 150 $TEST > "$OUT/checks.log" 2>&1
    rc=$?
    grep -E "^attention|rows|FAIL|Failure|PASSED|FAILED|error" "$OUT/checks.log" | head -40
    stamp "check_model"
    TM_CUDA_ONLY='check_model' timeout 120 $TEST > "$OUT/check_model.log" 2>&1
    rc2=$?
    grep -E "FAIL|Failure|PASSED|FAILED|worst|prompt" "$OUT/check_model.log" | head -20
    [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && checks=PASS || checks="FAIL(rc=$rc/$rc2)"
fi
if [ "${NO_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer > /dev/null; then
    for tool in memcheck racecheck; do
        stamp "compute-sanitizer $tool: check_attention"
        TM_CUDA_ONLY='check_attention' timeout 150 compute-sanitizer --tool $tool \
            --error-exitcode 9 --print-limit 20 $TEST > "$OUT/$tool.log" 2>&1
        echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/$tool.log" | tr '\n' ' ')"
    done
fi
stamp "model"
device_models "$M" "" "$TM" || exit 1
[ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
stamp "llama.cpp -ngl 99 -fa 1"
timeout 120 /tmp/llamacpp-peer/llama-bench -fa 1 -p 512,2048 -n 0 -r "$REPS" -t 16 -m "$M" \
    -ngl 99 2>&1 | tee "$OUT/peer.md" | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
for round in 1 2; do
    envs=(TIERMOE_ATTN_TC=1)
    device_bench "attention tensor cores r$round" -ngl all -p 512,2048 -n 0
    envs=(TIERMOE_ATTN_TC=0)
    device_bench "attention f32 r$round" -ngl all -p 512,2048 -n 0
done
if [ "${NO_LONG:-0}" != 1 ]; then # where attention weighs most: 8,192 tokens in 16 batches
    stamp "llama.cpp pp8192"
    timeout 120 /tmp/llamacpp-peer/llama-bench -fa 1 -p 8192 -n 0 -r "$REPS" -t 16 -m "$M" \
        -ngl 99 2>&1 | tee -a "$OUT/peer.md" | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
    envs=(TIERMOE_ATTN_TC=1)
    device_bench "attention tensor cores pp8192" -ngl all -p 8192 -n 0
    envs=(TIERMOE_ATTN_TC=0)
    REPS=1 device_bench "attention f32 pp8192" -ngl all -p 8192 -n 0
fi
REPS=1
for e in 1 0; do
    envs=(TIERMOE_ATTN_TC=$e)
    device_bench "profile TIERMOE_ATTN_TC=$e" -ngl all -p 2048 -n 0 --profile
    sed -n "/## profile TIERMOE_ATTN_TC=$e/,\$p" "$OUT/tiermoe.err" | grep -vE "^## |^ *$" | head -16
done
if [ "${NO_PROFILE:-0}" != 1 ]; then
    # layer 8 of the second 512-token batch of pp2048 (pos0 512): the bench's
    # warm-up runs 8 tokens, a 512-token prompt and a decode step first (the
    # f32 kernel runs the 8-token and decode launches too: 3 x 48 more)
    for k in tm_atc_kernel tm_attn_kernel; do
        stamp "ncu $k"
        e=1 skip=104
        [ $k = tm_attn_kernel ] && e=0 skip=200
        TIERMOE_ATTN_TC=$e timeout 100 ncu --clock-control none --kernel-name regex:$k \
            --launch-skip $skip --launch-count 1 --section SpeedOfLight --section Occupancy \
            --section ComputeWorkloadAnalysis --section WarpStateStats \
            $TM bench -m "$M" -ngl all -p 2048 -n 0 -r 1 > "$OUT/ncu_$k.txt" 2>&1
        grep -E "Grid Size|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers|Block Limit|Executed Ipc|Pipe" \
            "$OUT/ncu_$k.txt" | head -14
    done
fi
stamp "done"
echo "SUMMARY: checks $checks"
