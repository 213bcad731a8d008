#!/usr/bin/env bash
# Where a GPU decode step's time goes, per kernel: runs `tiermoe bench -ngl
# all` under Nsight Compute (one metric, gpu__time_duration, caches and clocks
# left alone, graph nodes profiled one by one) after the warm-up, and sums the
# durations by kernel and grid. Needs a build made by
# scripts/device_cuda_check.sh (build/device-cuda) and the model it made.
#   scripts/device_gpu_profile.sh [MODEL] [OUT_DIR] [BENCH ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-/tmp/m30.gguf}
OUT=${2:-${OUT:-/tmp/out}}
shift 2 2> /dev/null
ARGS=${*:--p 0 -n 4}
B=build/device-cuda/tiermoe
export PATH=$PATH:/usr/local/cuda/bin
SKIP=${SKIP:-2000} COUNT=${COUNT:-640}
timeout 300 ncu --graph-profiling node --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum --csv --launch-skip "$SKIP" --launch-count "$COUNT" \
    "$B" bench -m "$MODEL" -ngl all $ARGS -r 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc $? ($(wc -l < "$OUT/ncu.csv") lines)"
python3 - "$OUT/ncu.csv" << 'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ix = {n: i for i, n in enumerate(head)}
agg = collections.defaultdict(lambda: [0.0, 0])
for r in rows:
    if r[ix["Metric Name"]] != "gpu__time_duration.sum": continue
    v = float(r[ix["Metric Value"]].replace(",", ""))
    us = v * {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}[r[ix["Metric Unit"]]]
    k = (r[ix["Kernel Name"]].split("(")[0][:60], r[ix["Grid Size"]], r[ix["Block Size"]])
    agg[k][0] += us; agg[k][1] += 1
tot = sum(a[0] for a in agg.values())
n = sum(a[1] for a in agg.values())
print("%d kernels, %.1f us in all" % (n, tot))
for k, a in sorted(agg.items(), key=lambda kv: -kv[1][0])[:30]:
    print("%5.1f%% %9.1f us  x%4d  avg %7.2f us  %s grid %s block %s" % (100 * a[0] / tot, a[0], a[1], a[0] / a[1], *k))
PY
