#!/usr/bin/env bash
# One device call for the hybrid decode and the SSD tier:
#   1. build (Release, sm_90); the 30b-a3b preset with the Qwen3 routing
#      profile (/tmp/m30q.gguf, made unless there);
#   2. SSD tier (STAGES ssd): page cache dropped before each bench, pp512 /
#      tg64, SSD_RUNS pairs BUDGET:FETCH (BUDGET half: half the expert bytes,
#      all: every expert; FETCH: --moe-fetch, auto copying prompts' routed
#      experts from the store to the GPU, off leaving them to the CPU lane);
#      default "half:auto half:off all:auto all:off";
#   3. VRAM cache decode (STAGES cache): a learn pass, then tg128 with
#      --cpu-moe --moe-cache 4212 --moe-learn at several PCIe lane shares
#      (PCIE, default "auto 0 1 2 3"), one of them with --profile; llama.cpp
#      -ncmoe 35 on the same file for reference;
#   4. experts all in RAM (STAGES cpumoe): the uniform 30b-a3b (/tmp/m30.gguf),
#      --cpu-moe pp512 and tg128 at the PCIe shares of PCIE_ALL (default
#      "auto 0 2 3"), llama.cpp -ncmoe 48 (-lm none and mmap);
#   5. STAGES fetchshare: --cpu-moe pp512 with the prompts' CPU lane taking
#      fixed shares (FETCH_SHARES, default "0 0.05 0.1 0.2");
#   6. STAGES calib: tiermoe calibrate, then the auto share of 3 and 4 again;
#   8. STAGES lanerows (after cache): the CPU lane's decode item rows
#      (LANE_ROWS) with the cache and with --cpu-moe, calibrated;
#   9. STAGES ahead: decode steps' copies ahead with the cache (AHEAD: pairs
#      --moe-pcie:--moe-ahead, default "auto:off auto:1 auto:2") and with
#      --cpu-moe (AHEAD_ALL, "auto:off auto:2"), then a profile;
#   7. STAGES fetchcalib: tiermoe calibrate, then --cpu-moe pp512 with the
#      calibrated CPU share of copied-ahead prompts against fixed ones.
#   scripts/device_hybrid.sh [OUT]     STAGES ("ssd cache"), REPS (2)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=${BUILD:-build/device-hybrid}
STAGES=${STAGES:-ssd cache}
REPS=${REPS:-2}
PCIE=${PCIE:-auto 0 1 2 3}
PCIE_ALL=${PCIE_ALL:-auto 0 2 3}
M=/tmp/m30q.gguf
U=/tmp/m30.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe
has() { [[ " $STAGES " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
stamp "build"
device_build "$BUILD" tiermoe || exit 1
stamp "models"
device_models "$U" "$M" "$TM" || exit 1
rm -rf ~/.cache/tiermoe # no calibration profile until STAGES calib
export TIERMOE_CALIB=

if has ssd; then
    exp_gib=$($TM inspect "$M" 2>/dev/null | awk '/expert bytes/ {print $3; exit}')
    half=$(awk -v g="${exp_gib:-15.19}" 'BEGIN {printf "%d", g * 1024 / 2}')
    stamp "drive"
    timeout 60 $TM calibrate -m "$M" --drive --drive-seconds 1 2>&1 | grep -E "^drive|1 MiB" | head -3
    all=$(awk -v g="${exp_gib:-15.19}" 'BEGIN {printf "%d", g * 1024 * 1.05 + 64}')
    for run in ${SSD_RUNS:-half:auto half:off all:auto all:off}; do
        budget=${run%%:*} fetch=${run#*:}
        mib=$half
        [ "$budget" = all ] && mib=$all
        sync
        echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache)"
        stamp "ssd: --ram-cache $mib ($budget), --moe-fetch $fetch"
        timeout 300 $TM bench -m "$M" -p 512 -n 64 -r 1 -t 16 -ngl all --cpu-moe --moe-fetch "$fetch" \
            --ram-cache "$mib" > "$OUT/ssd_${budget}_$fetch.md" 2> "$OUT/ssd_${budget}_$fetch.err"
        grep -E "^\| qwen" "$OUT/ssd_${budget}_$fetch.md" | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c1-150
        grep -E "SSD tier|pinned for|prompts, |error" "$OUT/ssd_${budget}_$fetch.err" | cut -c1-260
    done
fi

[ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
cache_auto() {
    envs=()
    device_bench "cache-$1" -p 0 -n 128 --cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json
    grep -E "VRAM cache, routed|moe-pcie" /tmp/tm.err | cut -c1-160
}
cpumoe() { # name, --moe-pcie
    envs=()
    M=$U device_bench "cpumoe-$1" -p 512 -n 128 --cpu-moe --moe-pcie "$2"
    grep -E "moe-pcie|steal" /tmp/tm.err | cut -c1-160
}
learn_pass() { # /tmp/q.json: the routing of 16 random prompts on $M
    [ -f /tmp/q.json ] && return
    stamp "learn pass"
    python3 -c "
import random; r=random.Random(1)
print('\n'.join(','.join(str(r.randrange(151936)) for _ in range(64)) for _ in range(16)))" \
        > /tmp/prompts.txt
    $TM trace -m "$M" --prompts /tmp/prompts.txt -n 64 --cpu-moe -o /tmp/q.json > /dev/null 2>&1
}
if has cache; then
    learn_pass
    stamp "llama.cpp -ncmoe 35"
    timeout 200 /tmp/llamacpp-peer/llama-bench -m "$M" -fa 1 -p 0 -n 128 -r "$REPS" -t 16 \
        -ngl 99 -ncmoe 35 2>&1 | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
    envs=()
    for n in $PCIE; do
        device_bench "cache-pcie-$n" -p 0 -n 128 --cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json \
            --moe-pcie "$n"
        grep -E "VRAM cache, routed|steal" /tmp/tm.err | tr '\n' ' '
        echo
    done
    REPS=1 device_bench "cache-profile" -p 0 -n 128 --cpu-moe --moe-cache 4212 \
        --moe-learn /tmp/q.json --profile
    grep -E "time by part|CPU lane|class|RAM|VRAM cache" /tmp/tm.err | cut -c1-400
fi
if has cpumoe; then
    stamp "llama.cpp -ncmoe 48"
    for a in "-lm none" ""; do
        timeout 200 /tmp/llamacpp-peer/llama-bench -m "$U" -fa 1 -p 512 -n 128 -r "$REPS" -t 16 \
            -ngl 99 -ncmoe 48 $a 2>&1 | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
    done
    for n in $PCIE_ALL; do cpumoe "$n" "$n"; done
fi
if has fetchshare; then # prompts' fetch lane with a fixed CPU share (FETCH_SHARES)
    for f in ${FETCH_SHARES:-0 0.05 0.1 0.2}; do
        envs=(TIERMOE_FETCH_CPU_SHARE=$f)
        M=$U device_bench "fetch-cpu-$f" -p 512 -n 0 --cpu-moe
    done
    envs=()
fi
if has fetchcalib; then # the calibrated CPU share of copied-ahead prompts against fixed ones
    stamp "calibrate"
    unset TIERMOE_CALIB
    timeout 300 $TM calibrate -m "$U" -t 16 > "$OUT/calibrate.log" 2>&1
    grep -E "^decode|host->GPU pinned|^      32|profile:" "$OUT/calibrate.log"
    for f in auto 0 0.15 0.2 0.25 auto; do
        envs=()
        [ "$f" = auto ] || envs=(TIERMOE_FETCH_CPU_SHARE=$f)
        M=$U device_bench "fetch-$f" -p 512 -n 0 --cpu-moe
    done
    grep -E "moe-fetch" /tmp/tm.err | cut -c1-200
    envs=()
    has cache && cache_auto calibrated
fi
if has lanerows; then # the CPU lane's decode item size with a cache (few cold experts a layer)
    timeout 300 $TM calibrate -m "$U" -t 16 > "$OUT/calibrate.log" 2>&1
    for r in ${LANE_ROWS:-128 64 32 128}; do
        envs=(TIERMOE_LANE_ROWS=$r)
        device_bench "cache-rows-$r" -p 0 -n 128 --cpu-moe --moe-cache 4212 --moe-learn /tmp/q.json
        M=$U device_bench "cpumoe-rows-$r" -p 0 -n 128 --cpu-moe
    done
    envs=()
fi
if has ahead; then # decode steps' copies ahead: AHEAD counts with the cache, AHEAD_ALL --cpu-moe
    learn_pass
    for pa in ${AHEAD:-auto:off auto:1 auto:2}; do # --moe-pcie:--moe-ahead
        device_bench "cache-pcie-${pa%%:*}-ahead-${pa##*:}" -p 0 -n 128 --cpu-moe --moe-cache 4212 \
            --moe-learn /tmp/q.json --moe-pcie "${pa%%:*}" --moe-ahead "${pa##*:}"
        grep -E "VRAM cache, routed|copies ahead|steal" /tmp/tm.err | cut -c1-200
    done
    for pa in ${AHEAD_ALL:-auto:off auto:2}; do
        M=$U device_bench "cpumoe-pcie-${pa%%:*}-ahead-${pa##*:}" -p 0 -n 128 --cpu-moe \
            --moe-pcie "${pa%%:*}" --moe-ahead "${pa##*:}"
        grep -E "copies ahead" /tmp/tm.err | cut -c1-200
    done
    REPS=1 device_bench "ahead-profile" -p 0 -n 128 --cpu-moe --moe-cache 4212 \
        --moe-learn /tmp/q.json --profile
    grep -E "time by part|CPU lane|class|RAM|VRAM cache|copied ahead" /tmp/tm.err | cut -c1-400
fi
if has calib; then
    stamp "calibrate"
    unset TIERMOE_CALIB
    timeout 300 $TM calibrate -m "$U" -t 16 > "$OUT/calibrate.log" 2>&1
    grep -E "^decode|PCIe lane|alone|profile:" "$OUT/calibrate.log"
    has cpumoe && cpumoe calibrated auto
    has cache && cache_auto calibrated # the same expert shapes: the same profile
fi
stamp "done"
