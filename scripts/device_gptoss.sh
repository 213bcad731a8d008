#!/usr/bin/env bash
# One device call for gpt-oss (docs/gptoss.md): build Release for sm_90, run
# the GPU checks (test_cuda_ops: the attention cases with windows, sinks and
# YaRN tables, the bias op, the placement matrix on the real kernels, which
# now includes the tiny gpt-oss under CPU only and every --cpu-moe placement),
# make `mkmodel --preset gpt-oss-20b`, then bench llama.cpp (../shared/peer,
# carried in .peer/) and tiermoe on the same file: --cpu-moe (attention on the
# GPU, experts on the CPU lane: gpt-oss's experts have no GPU kernels yet) and
# CPU only; full GPU is expected to be refused with a message (printed).
# Stages are switched off to fit a call: NO_CHECKS=1, NO_PEER=1, NO_CPU=1,
# REPS (default 3). Logs and tables go to $OUT; the summary is printed last.
#   scripts/device_gptoss.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-gptoss
REPS=${REPS:-3}
M=/tmp/gptoss20b.gguf
. scripts/device_env.sh

stamp "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
lscpu | grep -E "Model name|^CPU\(s\)" | tr -s ' '

stamp "build (Release, sm_90)"
device_build "$BUILD" tiermoe test_cuda_ops || exit 1

status_checks=skipped
if [ "${NO_CHECKS:-0}" != 1 ]; then
    stamp "checks: every op and the placement matrix (test_cuda_ops)"
    TM_TEST_TMP=/tmp TM_TEST_DATA="$PWD/tests/data" timeout 300 "$BUILD/tests/test_cuda_ops" \
        > "$OUT/checks.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED|ERROR) |FAIL|attention|bias|gpt-oss|hf_gptoss|Failure" \
        "$OUT/checks.log" | head -60
    [ $rc -eq 0 ] && status_checks=PASS || status_checks="FAIL(rc=$rc)"
fi

stamp "model: mkmodel --preset gpt-oss-20b"
[ -f "$M" ] || "$BUILD/tiermoe" mkmodel --preset gpt-oss-20b -q -o "$M" \
    || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
ls -la "$M"

if [ "${NO_PEER:-0}" != 1 ] && [ -f .peer/llama-bench.tar.xz ]; then
    stamp "llama.cpp (peer)"
    [ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
    LB=/tmp/llamacpp-peer/llama-bench
    for args in "-ngl 99" "-ngl 99 -ncmoe 99" "-ngl 0"; do
        [ "$args" = "-ngl 0" ] && [ "${NO_CPU:-0}" = 1 ] && continue
        timeout 300 $LB -m "$M" -fa 1 -p 512 -n 128 -r "$REPS" -t 16 $args 2>&1 \
            | tee -a "$OUT/peer.md" | grep -E "^\|"
    done
fi

declare -A tm_pp tm_tg
cases=("gpu|-ngl all" "cpu-moe|--cpu-moe" "cpu|-ngl 0")
for c in "${cases[@]}"; do
    name=${c%%|*} flags=${c#*|}
    [ "$name" = cpu ] && [ "${NO_CPU:-0}" = 1 ] && continue
    stamp "tiermoe $name: $flags"
    timeout 300 "$BUILD/tiermoe" bench -m "$M" -p 512 -n 128 -r "$REPS" -t 16 $flags \
        > /tmp/tm.md 2> /tmp/tm.err
    { echo "## $name: $flags"; cat /tmp/tm.md; } >> "$OUT/tiermoe.md"
    { echo "## $name: $flags"; cat /tmp/tm.err; } >> "$OUT/tiermoe.err"
    grep -E "^\| gpt-oss" /tmp/tm.md || tail -3 /tmp/tm.err
    tm_pp[$name]=$(grep -E "pp512" /tmp/tm.md | awk -F'|' '{print $8}' | awk '{print $1}')
    tm_tg[$name]=$(grep -E "tg128" /tmp/tm.md | awk -F'|' '{print $8}' | awk '{print $1}')
done
stamp "done"
echo "SUMMARY: checks $status_checks | tiermoe pp512/tg128: gpu ${tm_pp[gpu]:-refused}/${tm_tg[gpu]:-refused}," \
    "cpu-moe ${tm_pp[cpu-moe]:--}/${tm_tg[cpu-moe]:--}, cpu ${tm_pp[cpu]:--}/${tm_tg[cpu]:--}" \
    "| llama.cpp in $OUT/peer.md | logs in $OUT"
