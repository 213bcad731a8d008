#!/usr/bin/env bash
# Device call for the SSD tier (--ram-cache, docs/ssd.md), under 8 minutes:
#   1. build (Release, sm_90); whether liburing was found (carry .devdeps/liburing2_*.deb and
#      liburing-dev_*.deb, `apt-get download liburing2 liburing-dev`; without them the reader
#      uses pread and says so);
#   2. whether the machine has GPU Direct Storage (cuFile library, nvidia-fs module,
#      gdscheck) -- reported, not used;
#   3. the drive: tiermoe calibrate --drive on the model file (O_DIRECT, io_uring, depths 1-64);
#   4. 30b-a3b with the Qwen3 routing profile (/tmp/m30q.gguf, made unless there), the GPU
#      doing the dense part (-ngl all --cpu-moe) and the CPU lane reading experts from a RAM
#      cache of half the expert bytes (--ram-cache), page cache dropped before: pp512 and
#      decode (tg64); the SSD tier's line per test (experts faulted and MB read per token,
#      read MB/s); the decode bound = MB read per token / the drive's best MB/s;
#   5. the same without --ram-cache (the mapping; page cache dropped first) for reference.
# TOKENS (64), OUT dir.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-ssd
TOKENS=${TOKENS:-64}
M=/tmp/m30q.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe

stamp "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
lscpu | grep -E "Model name|^CPU\(s\)" | tr -s ' '
free -g | head -2
df -h /tmp | tail -1

stamp "build (Release, sm_90)"
device_build "$BUILD" tiermoe || exit 1
uring=no
grep -q "liburing not found" /tmp/cmake.log || uring=yes
echo "liburing in the build: $uring"

stamp "GPU Direct Storage (cuFile)"
gds=no
ls /usr/local/cuda/lib64/libcufile* /usr/lib/x86_64-linux-gnu/libcufile* 2>/dev/null | head -3 && gds=lib
lsmod 2>/dev/null | grep -q nvidia_fs && { echo "nvidia_fs module loaded"; gds="$gds+nvidia_fs"; }
for g in /usr/local/cuda/gds/tools/gdscheck /usr/local/cuda/gds/tools/gdscheck.py; do
    [ -x "$g" ] && { timeout 30 "$g" -p 2>&1 | grep -Ei "nvme|supported|platform|error" | head -12; break; }
done
echo "cuFile / GDS: $gds"

if [ ! -f "$M" ]; then
    stamp "model: 30b-a3b, Qwen3 routing profile"
    $TM mkmodel --preset 30b-a3b --routing qwen3-30b-a3b -q -o "$M" || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
fi
ls -la "$M"
exp_gib=$($TM inspect "$M" 2>/dev/null | awk '/expert bytes/ {print $3; exit}')
half_mib=$(awk -v g="${exp_gib:-15.19}" 'BEGIN {printf "%d", g * 1024 / 2}')
echo "expert bytes ${exp_gib:-?} GiB; --ram-cache $half_mib MiB (half)"

stamp "drive (tiermoe calibrate --drive)"
timeout 120 $TM calibrate -m "$M" --drive --drive-seconds 1 2>&1 | tee "$OUT/drive.md"
drive=$(awk '/^drive:/ {print $2}' "$OUT/drive.md")

drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache)"; }
bench() { # name, flags...
    local name=$1; shift
    drop
    stamp "bench $name: $*"
    timeout 240 $TM bench -m "$M" -p 512 -n "$TOKENS" -r 1 -t 16 "$@" > "$OUT/bench_$name.md" \
        2> "$OUT/bench_$name.err"
    grep -E "^\| " "$OUT/bench_$name.md" | tail -2
    grep -E "SSD tier|ram-cache|io_uring|O_DIRECT" "$OUT/bench_$name.err" | head -6
}
bench ssd -ngl all --cpu-moe --ram-cache "$half_mib"
bench mmap -ngl all --cpu-moe

tg=$(awk -F'|' '/tg'"$TOKENS"'/ {gsub(/ /, "", $8); split($8, a, "±"); print a[1]; exit}' "$OUT/bench_ssd.md")
pp=$(awk -F'|' '/pp512/ {gsub(/ /, "", $8); split($8, a, "±"); print a[1]; exit}' "$OUT/bench_ssd.md")
mbtok=$(grep -E "^tg" "$OUT/bench_ssd.err" | sed -nE 's/.* ([0-9.]+) MB read per token.*/\1/p' | head -1)
faults=$(grep -E "^tg" "$OUT/bench_ssd.err" | sed -nE 's/.*: ([0-9.]+) experts faulted per token.*/\1/p' | head -1)
bound=$(awk -v mb="${mbtok:-0}" -v d="${drive:-0}" 'BEGIN {if (mb > 0 && d > 0) printf "%.2f", d / mb; else print "n/a"}')
stamp "done"
echo "SUMMARY: drive ${drive:-?} MB/s (io_uring in build: $uring) | --ram-cache ${half_mib} MiB: pp512 ${pp:-?} t/s, tg$TOKENS ${tg:-?} t/s, ${faults:-?} experts faulted and ${mbtok:-?} MB read per token, drive bound ${bound} t/s | GDS: $gds | logs in $OUT"
