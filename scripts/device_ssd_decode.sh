#!/usr/bin/env bash
# SSD tier decode on the device: tg64 of 30b-a3b (Qwen3 routing profile) with -ngl all
# --cpu-moe --ram-cache 7777 (half the experts), page cache dropped before each, under
# each setting of RUNS ("THREADS:VAR=VALUE ...", default "16: 12: 8:": threads, no
# variable), after calibrate --drive's 1 MiB reads (the drive's rate differs from call to
# call on the lent machines: 1,383-2,291 MB/s at best on 2026-11-27).
#   scripts/device_ssd_decode.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/device_env.sh
B=build/device-hybrid
TM=$B/tiermoe
device_build $B tiermoe || exit 1
device_models /tmp/m30.gguf /tmp/m30q.gguf $TM || exit 1
timeout 60 $TM calibrate -m /tmp/m30q.gguf --drive --drive-seconds 1 2>&1 | grep -E "^drive|^\| 1024 KiB" | head -8
for cfg in ${RUNS:-16: 12: 8:}; do
    t=${cfg%%:*} e=${cfg#*:}
    sync
    echo 3 > /proc/sys/vm/drop_caches
    stamp "-t $t $e"
    env $e timeout 120 $TM bench -m /tmp/m30q.gguf -p 0 -n 64 -r 1 -t "$t" -ngl all --cpu-moe \
        --ram-cache 7777 > /tmp/b.md 2> /tmp/b.err
    grep -E "^\| qwen" /tmp/b.md | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c60-200
    grep -E "^tg64:" /tmp/b.err | sed 's/.*SSD tier (--ram-cache): //' | cut -c1-400
done
