#!/usr/bin/env bash
# One call for a session's closing numbers on the GPU machine: build; on the
# 30b-a3b preset llama.cpp (.peer/, -fa 1) and tiermoe (f16 KV cache, as
# llama-bench) at pp512 / tg128 with every expert on the GPU, experts in RAM
# (-ncmoe 48 / --cpu-moe) and 13 layers' experts in VRAM (-ncmoe 35 /
# --n-cpu-moe 35); then the SSD tier on the Qwen3-routing-profile file with
# half the expert bytes as RAM cache, decode with the next-layer prediction on
# and off (TIERMOE_STORE_PREDICT), the page cache dropped before each.
# Carry .devdeps and .peer.
#   scripts/device_final.sh [OUT]      REPS (2), NO_SSD=1, NO_PEER=1
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-cuda
REPS=${REPS:-2}
M=/tmp/m30.gguf
MQ=/tmp/m30q.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
stamp "build"
device_build "$BUILD" tiermoe || exit 1
stamp "models"
device_models "$M" "" "$TM" || exit 1
if [ "${NO_PEER:-0}" != 1 ]; then
    [ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
    for args in "-ngl 99" "-ngl 99 -ncmoe 48,35"; do
        stamp "llama.cpp $args"
        timeout 300 /tmp/llamacpp-peer/llama-bench -m "$M" -fa 1 -p 512 -n 128 -r "$REPS" -t 16 \
            $args 2>&1 | tee -a "$OUT/peer.md" | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
    done
fi
envs=()
device_bench "gpu" -ngl all -p 512 -n 128
device_bench "cpu-moe" --cpu-moe -p 512 -n 128
device_bench "ncmoe35" --n-cpu-moe 35 -p 512 -n 128
if [ "${NO_SSD:-0}" != 1 ]; then
    [ -f "$MQ" ] || { stamp "model: Qwen3 routing profile"; $TM mkmodel --preset 30b-a3b --routing qwen3-30b-a3b -q -o "$MQ"; }
    half_mib=$(awk -v g="$($TM inspect "$MQ" 2>/dev/null | awk '/expert bytes/ {print $3; exit}')" \
        'BEGIN {if (g == "") g = 15.19; printf "%d", g * 1024 / 2}')
    stamp "drive"
    timeout 60 $TM calibrate -m "$MQ" --drive --drive-seconds 1 2>&1 | grep -E "^drive:" | tee "$OUT/drive.md"
    for pr in 1 0 1; do
        sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null
        stamp "SSD tier, --ram-cache $half_mib, TIERMOE_STORE_PREDICT=$pr"
        TIERMOE_STORE_PREDICT=$pr timeout 200 $TM bench -m "$MQ" -p 0 -n 48 -r 1 -t 16 --cpu-moe \
            --ram-cache "$half_mib" > /tmp/ssd.md 2> /tmp/ssd.err
        grep -E "^\| qwen" /tmp/ssd.md | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c1-150
        grep -E "^tg" /tmp/ssd.err | cut -c1-420
        cat /tmp/ssd.md /tmp/ssd.err >> "$OUT/ssd.md"
    done
fi
stamp "done"
