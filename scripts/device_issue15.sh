#!/usr/bin/env bash
# The closing table of the fetch lane and the VRAM cache, one device call:
# llama.cpp (.peer/) and tiermoe on the same two 30b-a3b files (uniform
# routing /tmp/m30.gguf, the Qwen3 routing profile /tmp/m30q.gguf), pp512 /
# tg128, then `tiermoe calibrate` and the auto PCIe share it sets, A/B.
#   scripts/device_issue15.sh [OUT]     REPS (3)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-tier
REPS=${REPS:-3}
M=/tmp/m30.gguf
Q=/tmp/m30q.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
device_build "$BUILD" tiermoe || exit 1
device_models "$M" "$Q" "$TM" || exit 1
if [ ! -f /tmp/q.json ]; then
    stamp "learn pass on the Qwen3-routing model"
    python3 -c "
import random; r=random.Random(1)
print('\n'.join(','.join(str(r.randrange(151936)) for _ in range(64)) for _ in range(16)))" > /tmp/prompts.txt
    $TM trace -m "$Q" --prompts /tmp/prompts.txt -n 64 --cpu-moe -o /tmp/q.json > /dev/null 2>&1
fi
rm -rf ~/.cache/tiermoe # no calibration profile until the end
export TIERMOE_CALIB=
[ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
LB=/tmp/llamacpp-peer/llama-bench
for a in "-m $M -ngl 99 -ncmoe 48,35" "-m $Q -ngl 99 -ncmoe 35" "-m $M -ngl 99 -ncmoe 48 -lm none -n 0" "-m $M -ngl 99"; do
    stamp "llama.cpp $a"
    timeout 300 $LB -fa 1 -p 512 -n 128 -r "$REPS" -t 16 $a 2>&1 | tee -a "$OUT/peer.md" \
        | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
done
run() {
    local name=$1 file=$2
    shift 2
    stamp "tiermoe $name: $*"
    timeout 300 $TM bench -m "$file" -p 512 -n 128 -r "$REPS" -t 16 "$@" > /tmp/tm.md 2> /tmp/tm.err
    { echo "## $name: $*"; cat /tmp/tm.md; } >> "$OUT/tiermoe.md"
    { echo "## $name: $*"; cat /tmp/tm.err; } >> "$OUT/tiermoe.err"
    grep -E "^\| qwen" /tmp/tm.md | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c1-200 || tail -5 /tmp/tm.err
    grep -E "VRAM cache, routed|steal" /tmp/tm.err
}
run cpu-moe "$M" --cpu-moe
run ncmoe35 "$M" --n-cpu-moe 35
run cache "$M" --cpu-moe --moe-cache 4212
run q-ncmoe35 "$Q" --n-cpu-moe 35
run q-cache "$Q" --cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json
run q-cache-full "$Q" --cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json --moe-cache-update full
run gpu "$M" -ngl all
stamp "calibrate"
timeout 300 $TM calibrate -m "$M" -t 16 > "$OUT/calibrate.log" 2>&1
grep -E "^decode|alone|profile:" "$OUT/calibrate.log"
run cpu-moe-calibrated "$M" --cpu-moe
run q-cache-calibrated "$Q" --cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json
stamp "done"
