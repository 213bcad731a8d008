#!/usr/bin/env bash
# Issue 19's device call: build, run the op checks (test_cuda_ops, the
# integer q8_0 decode kernel among them), then on the 30b-a3b file llama.cpp
# (.peer/) and tiermoe -ngl all, pp512 / tg128, with the 8-bit-activation
# decode products on and off (TIERMOE_MMVQ_Q8X=0) in alternation, the same
# for --cpu-moe, and a per-kernel decode profile under Nsight Compute.
#   scripts/device_kernels.sh [OUT]      REPS (3), NO_PROFILE=1, NO_CHECKS=1
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-cuda
REPS=${REPS:-3}
M=/tmp/m30.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
stamp "build"
device_build "$BUILD" tiermoe test_cuda_ops || exit 1
checks=skipped
if [ "${NO_CHECKS:-0}" != 1 ]; then
    stamp "test_cuda_ops"
    timeout 300 "$BUILD/tests/test_cuda_ops" > "$OUT/checks.log" 2>&1
    rc=$?
    grep -E "q8x|mmvq q8_0|FAIL|Failure|PASSED|FAILED|tokens identical|worst" "$OUT/checks.log" | head -40
    [ $rc -eq 0 ] && ! grep -q SKIPPED "$OUT/checks.log" && checks=PASS || checks="FAIL(rc=$rc)"
fi
if [ "${NO_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer > /dev/null; then
    # the prompt products (check_gemm: fused grouped GEMM included) and the q8x kernels
    for tool in memcheck racecheck; do
        stamp "compute-sanitizer $tool"
        TM_CUDA_ONLY="${SAN_ONLY:-*gemm*}" timeout 240 compute-sanitizer --tool $tool \
            --error-exitcode 9 --print-limit 20 "$BUILD/tests/test_cuda_ops" > "$OUT/$tool.log" 2>&1
        echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/$tool.log" | tr '\n' ' ')"
    done
    TM_CUDA_ONLY='*q8x*' timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$BUILD/tests/test_cuda_ops" > "$OUT/memcheck_q8x.log" 2>&1
    echo "memcheck q8x rc $?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_q8x.log")"
fi
stamp "model"
device_models "$M" "" "$TM" || exit 1
[ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
stamp "llama.cpp -ngl 99"
timeout 300 /tmp/llamacpp-peer/llama-bench -fa 1 -p 512,2048 -n 128,512 -r "$REPS" -t 16 -m "$M" \
    -ngl 99 2>&1 | tee "$OUT/peer.md" | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
for round in 1 2; do
    envs=(TIERMOE_MMVQ_Q8X=0)
    device_bench "gpu f32-act r$round" -ngl all -p 512 -n 128
    envs=(TIERMOE_MMVQ_Q8X=1)
    device_bench "gpu q8-act r$round" -ngl all -p 512 -n 128
done
device_bench "gpu q8-act long" -ngl all -p 2048 -n 512
envs=(TIERMOE_MMVQ_Q8X=0)
device_bench "cpu-moe f32-act" --cpu-moe -p 0 -n 128
envs=(TIERMOE_MMVQ_Q8X=1)
device_bench "cpu-moe q8-act" --cpu-moe -p 0 -n 128
if [ "${NO_PROFILE:-0}" != 1 ]; then
    stamp "ncu decode profile"
    SKIP=3000 COUNT=700 timeout 240 scripts/device_gpu_profile.sh "$M" "$OUT" -p 0 -n 4 \
        2>&1 | head -30
fi
if [ "${NO_PROFILE:-0}" != 1 ]; then
    stamp "ncu: the expert kernels' limits"
    timeout 180 ncu --clock-control none --kernel-name regex:'tm_moe_(gate_up|down)_fast' \
        --launch-skip 200 --launch-count 2 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        "$TM" bench -m "$M" -ngl all -p 0 -n 4 -r 1 > "$OUT/ncu_moe.txt" 2>&1
    grep -E "tm_moe|Throughput|Achieved Occupancy|Theoretical Occupancy|Stall|Warp Cycles|Registers|L2 Hit|DRAM" \
        "$OUT/ncu_moe.txt" | head -50
fi
stamp "done"
echo "SUMMARY: checks $checks"
