#!/usr/bin/env bash
# Device calls for the VRAM cache (docs/executor.md, "The VRAM cache"), on
# the 30b-a3b preset with uniform routing (/tmp/m30.gguf) and with the
# Qwen3-30B-A3B routing profile (/tmp/m30q.gguf, synthetic routing). Stages,
# each skipped when its output is there (a warm machine keeps /tmp):
#   prep:    build, both models, the GPU checks (test_cuda_ops), calibrate
#            (the profile the executor then loads), a learn pass with a
#            routing log on the profile model (--cpu-moe), the policy replay
#            (report --replay), a plan for 4212 MiB;
#   bench:   llama.cpp -ncmoe 35 and tiermoe's cases on the same files.
#   STAGE=prep|bench|all (default all), CASES="name ...", REPS (3), OUT dir.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-tier
REPS=${REPS:-3}
STAGE=${STAGE:-all}
M=/tmp/m30.gguf
Q=/tmp/m30q.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe

stamp "build (Release, sm_90)"
device_build "$BUILD" tiermoe test_cuda_ops || exit 1
device_models "$M" "$Q" "$TM" || exit 1

status_checks=skipped
if [ "$STAGE" != bench ]; then
    if [ ! -f /tmp/checks.done ]; then
        stamp "checks (test_cuda_ops)"
        TM_TEST_TMP=/tmp timeout 300 "$BUILD/tests/test_cuda_ops" > "$OUT/checks.log" 2>&1
        rc=$?
        grep -E "^\[  (PASSED|FAILED|ERROR) |FAIL|Failure|moe-cache|fetch" "$OUT/checks.log" | grep -v "info:" | head -30
        [ $rc -eq 0 ] && status_checks=PASS && touch /tmp/checks.done || status_checks="FAIL(rc=$rc)"
    fi
    stamp "calibrate (full; saved where the executor looks)"
    timeout 300 $TM calibrate -m "$M" -t 16 > "$OUT/calibrate.log" 2>&1
    grep -E "^decode|share|GB/s|profile:" "$OUT/calibrate.log" | head -12
    if [ ! -f /tmp/q.json ]; then
        stamp "learn pass + routing log on the Qwen3-routing model (16 sequences, 64 + 64 tokens)"
        python3 -c "
import random; r=random.Random(1)
print('\n'.join(','.join(str(r.randrange(151936)) for _ in range(64)) for _ in range(16)))" > /tmp/prompts.txt
        timeout 300 $TM trace -m "$Q" --prompts /tmp/prompts.txt -n 64 --cpu-moe \
            --routing-log /tmp/q.log -o /tmp/q.json > /tmp/trace.log 2>&1 || tail -5 /tmp/trace.log
    fi
    $TM report /tmp/q.json --summary 2>&1 | tail -8
    stamp "policy replay (held-out half, lag 1, one upload a layer a step)"
    $TM report --replay /tmp/q.log --max-admit 1 2>&1 | tee "$OUT/replay.txt" | tail -14
    $TM plan /tmp/q.json --budget 4212 --model "$Q" -o /tmp/plan.json 2>&1 | tail -3
fi

if [ "$STAGE" != prep ]; then
    if [ "${NO_PEER:-0}" != 1 ] && [ -f .peer/llama-bench.tar.xz ]; then
        [ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
        for f in "$Q" "$M"; do
            [ -n "${CASES:-}" ] && [[ " $CASES " != *" peer "* ]] && continue
            stamp "llama.cpp -ncmoe 35 on $f"
            timeout 300 /tmp/llamacpp-peer/llama-bench -m "$f" -fa 1 -p 512 -n 128 -r "$REPS" \
                -t 16 -ngl 99 -ncmoe 35 2>&1 | tee -a "$OUT/peer.md" | grep -E "^\| qwen"
        done
    fi
    cases=(
        "q-ncmoe35|$Q|--n-cpu-moe 35"
        "q-cache|$Q|--cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json"
        "q-cache-off|$Q|--cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json --moe-cache-update off"
        "q-cache-nolearn|$Q|--cpu-moe --moe-cache 4212"
        "q-plan|$Q|--cpu-moe --moe-cache-plan /tmp/plan.json"
        "q-cache-admit4|$Q|--cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json --moe-cache-admit 4"
        "u-ncmoe35|$M|--n-cpu-moe 35"
        "u-cache|$M|--cpu-moe --moe-cache 4212"
        "u-cache-off|$M|--cpu-moe --moe-cache 4212 --moe-cache-update off"
    )
    for c in "${cases[@]}"; do
        IFS='|' read -r name file flags <<< "$c"
        [ -n "${CASES:-}" ] && [[ " $CASES " != *" $name "* ]] && continue
        stamp "tiermoe $name: $flags"
        timeout 300 $TM bench -m "$file" -p 512 -n 128 -r "$REPS" -t 16 $flags \
            > /tmp/tm.md 2> /tmp/tm.err
        { echo "## $name: $flags"; cat /tmp/tm.md; } >> "$OUT/tiermoe.md"
        { echo "## $name: $flags"; cat /tmp/tm.err; } >> "$OUT/tiermoe.err"
        grep -E "^\| qwen" /tmp/tm.md | sed 's/ | [0-9.]* GiB | [0-9.]* B//' || tail -5 /tmp/tm.err
        grep -E "VRAM cache|steal" /tmp/tm.err
    done
    if [[ -z "${CASES:-}" || " $CASES " == *" profile "* ]]; then
        stamp "profile: q-cache tg"
        timeout 200 $TM bench -m "$Q" -p 0 -n 64 -r 1 -t 16 --cpu-moe --moe-cache 4212 \
            --moe-learn /tmp/q.json --profile 2>&1 | grep -vE "^\| ---|info:" | tail -12
    fi
fi
stamp "done"
echo "SUMMARY: checks $status_checks | logs in $OUT"
