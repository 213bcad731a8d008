#!/usr/bin/env bash
# Interleaved A/B on the device (noisy hosts: every case runs once per round,
# so host noise lands on all alike). Builds tiermoe (Release, sm_90) unless
# built, makes the models device_cache.sh uses unless present.
#   AB="name|model|flags|ENV=V ...;name|..." ROUNDS=3 P=0 N=128 scripts/device_ab.sh [OUT]
# model: m30 (uniform) or m30q (Qwen3 routing profile). Prints each run's
# t/s and, per case, the mean and the runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-tier
ROUNDS=${ROUNDS:-3}
P=${P:-0}
N=${N:-128}
. scripts/device_env.sh
TM=$BUILD/tiermoe
device_build "$BUILD" tiermoe || exit 1
device_models /tmp/m30.gguf /tmp/m30q.gguf "$TM" || exit 1
IFS=';' read -r -a cases <<< "$AB"
: > "$OUT/ab.txt"
for r in $(seq 1 "$ROUNDS"); do
    for c in "${cases[@]}"; do
        IFS='|' read -r name model flags envs <<< "$c"
        env $envs timeout 200 $TM bench -m "/tmp/$model.gguf" -p "$P" -n "$N" -r 2 -t 16 $flags \
            -o jsonl > /tmp/ab.jsonl 2> /tmp/ab.err
        python3 -c "
import json, sys
for l in open('/tmp/ab.jsonl'):
    o = json.loads(l); print('$name', o['test'] + ':' + str(o['ts_mean']))" | tee -a "$OUT/ab.txt"
        grep -E "VRAM cache, routed" /tmp/ab.err | sed "s/^/$name /"
        [ -s /tmp/ab.jsonl ] || tail -3 /tmp/ab.err
    done
done
echo "== means (t/s) per case and test"
awk '{split($2, a, ":"); k = $1 " " a[1]; s[k] += a[2]; n[k]++; v[k] = v[k] " " a[2]}
     END {for (k in s) printf "%-40s %8.2f  (%s )\n", k, s[k] / n[k], v[k]}' "$OUT/ab.txt" | sort
