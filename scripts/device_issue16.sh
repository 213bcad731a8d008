#!/usr/bin/env bash
# Issue 16's engine side on the device: several sequences decoded together
# without the server (`bench -np`), full GPU and --cpu-moe, and Nsight
# Compute's per-kernel times of one decode step of 8 rows against one of 1
# row (where the 8-row step's time goes).
#   scripts/device_issue16.sh [OUT]     TOKENS (64), NO_PROFILE=1
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-cuda
M=/tmp/m30.gguf
TOKENS=${TOKENS:-64}
. scripts/device_env.sh
TM=$BUILD/tiermoe
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
stamp "build"
device_build "$BUILD" tiermoe || exit 1
stamp "model"
device_models "$M" "" "$TM" || exit 1
b() { # label, bench args...
    local label=$1
    shift
    stamp "tiermoe $label: $*"
    timeout 300 $TM bench -m "$M" -t 16 -p 0 "$@" > /tmp/tm.md 2> /tmp/tm.err
    { echo "## $label: $*"; cat /tmp/tm.md; cat /tmp/tm.err; } >> "$OUT/bench.md"
    grep -E "^\| qwen" /tmp/tm.md | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c1-150 || tail -5 /tmp/tm.err
}
b "gpu" -ngl all -n "$TOKENS" -np 1,2,4,8 -r 2
b "cpu-moe" --cpu-moe -n $((TOKENS / 2)) -np 1,2,4,8 -r 2
b "cpu-moe profile" --cpu-moe -n 16 -np 1,2,8 -r 1 --profile
grep -E "^tg|CPU lane|class|hand-off" /tmp/tm.err | cut -c1-400
if [ "${NO_PROFILE:-0}" != 1 ]; then
    for np in 1 8; do
        stamp "ncu: one decode step of $np rows"
        SKIP=3000 COUNT=720 timeout 200 scripts/device_gpu_profile.sh "$M" "$OUT" -p 0 -n 4 -np $np \
            2>&1 | head -24
        cp "$OUT/ncu.csv" "$OUT/ncu_np$np.csv" 2> /dev/null
    done
    rm -f "$OUT/ncu.csv"
fi
stamp "done"
