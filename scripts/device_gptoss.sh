#!/usr/bin/env bash
# Device calls for gpt-oss (docs/gptoss.md): build Release for sm_90, run the
# GPU checks (test_cuda_ops: the grouped expert kernels with biases and the
# clamped SwiGLU, decode, fused and dequantize prompt paths; the attention
# cases with windows, sinks and YaRN; the placement matrix on the real kernels,
# the tiny gpt-oss under every placement), make `mkmodel --preset gpt-oss-20b`,
# then bench llama.cpp (../shared/peer, carried in .peer/) and tiermoe on the
# same file, pp512 / tg128, -fa 1, 16 threads, an f16 KV cache:
#   gpu      -ngl 99             / -ngl all
#   cpu-moe  -ngl 99 -ncmoe 99   / --cpu-moe
#   ncmoe12  -ngl 99 -ncmoe 12   / --n-cpu-moe 12 (half the 24 layers' experts in VRAM)
#   cache12  (none)              / --cpu-moe --moe-cache 5064 (ncmoe12's VRAM as a cache)
#   cpu      -dev none           / -ngl 0          (only with CPU=1)
# STAGES picks what runs (default "checks peer bench"), CASES the cases
# (default "gpu cpu-moe ncmoe12"), REPS (default 2). Carry .devdeps and .peer.
# Logs and tables go to $OUT; the summary is printed last.
#   scripts/device_gptoss.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=${BUILD:-build/device-gptoss}
REPS=${REPS:-2}
STAGES=${STAGES:-checks peer bench}
CASES=${CASES:-gpu cpu-moe ncmoe12}
[ "${CPU:-0}" = 1 ] && CASES="$CASES cpu"
M=/tmp/gptoss20b.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe
has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }

stamp "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
lscpu | grep -E "Model name|^CPU\(s\)" | tr -s ' '

stamp "build (Release, sm_90)"
device_build "$BUILD" tiermoe test_cuda_ops || exit 1

status_checks=skipped
if has "$STAGES" checks; then
    stamp "checks: every op and the placement matrix (test_cuda_ops)"
    TM_TEST_TMP=/tmp TM_TEST_DATA="$PWD/tests/data" timeout 420 "$BUILD/tests/test_cuda_ops" \
        > "$OUT/checks.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED|ERROR) |FAIL|^moe|clamped|gpt-oss|hf_gptoss|greedy|Failure" \
        "$OUT/checks.log" | cut -c1-200 | head -90
    [ $rc -eq 0 ] && status_checks=PASS || status_checks="FAIL(rc=$rc)"
fi

if has "$STAGES" peer || has "$STAGES" bench; then
    stamp "model: mkmodel --preset gpt-oss-20b"
    [ -f "$M" ] || "$TM" mkmodel --preset gpt-oss-20b -q -o "$M" \
        || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
    ls -la "$M"
fi

peer_args() {
    case $1 in
    gpu) echo "-ngl 99" ;; cpu-moe) echo "-ngl 99 -ncmoe 99" ;; ncmoe12) echo "-ngl 99 -ncmoe 12" ;;
    cpu) echo "-dev none" ;; # -ngl 0 still sends prompt products to the GPU
    esac
}
tm_args() {
    case $1 in
    gpu) echo "-ngl all" ;; cpu-moe) echo "--cpu-moe" ;; ncmoe12) echo "--n-cpu-moe 12" ;;
    cache12) echo "--cpu-moe --moe-cache 5064" ;; cpu) echo "-ngl 0" ;;
    esac
}

if has "$STAGES" peer && [ -f .peer/llama-bench.tar.xz ]; then
    [ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
    for c in $CASES; do
        [ -n "$(peer_args "$c")" ] || continue
        stamp "llama.cpp $c: $(peer_args "$c")"
        timeout 300 /tmp/llamacpp-peer/llama-bench -m "$M" -fa 1 -p 512 -n 128 -r "$REPS" -t 16 \
            $(peer_args "$c") 2>&1 | tee -a "$OUT/peer.md" | grep -E "^\| gpt" \
            | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
    done
fi

declare -A tm_pp tm_tg
if has "$STAGES" bench; then
    for c in $CASES; do
        stamp "tiermoe $c: $(tm_args "$c")"
        timeout 300 "$TM" bench -m "$M" -p 512 -n 128 -r "$REPS" -t 16 $(tm_args "$c") \
            ${PROFILE:+--profile} > /tmp/tm.md 2> /tmp/tm.err
        { echo "## $c: $(tm_args "$c")"; cat /tmp/tm.md; } >> "$OUT/tiermoe.md"
        { echo "## $c: $(tm_args "$c")"; cat /tmp/tm.err; } >> "$OUT/tiermoe.err"
        grep -E "^\| gpt" /tmp/tm.md | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c1-160 \
            || tail -5 /tmp/tm.err
        [ -n "${PROFILE:-}" ] && grep -E "^(tg|pp)|lane|hot|cold" /tmp/tm.err | head -20
        tm_pp[$c]=$(grep -E "pp512" /tmp/tm.md | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
        tm_tg[$c]=$(grep -E "tg128" /tmp/tm.md | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    done
fi
stamp "done"
line="SUMMARY: checks $status_checks | tiermoe pp512/tg128:"
for c in $CASES; do line="$line $c ${tm_pp[$c]:--}/${tm_tg[$c]:--},"; done
echo "$line | llama.cpp in $OUT/peer.md | logs in $OUT"
