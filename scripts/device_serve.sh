#!/usr/bin/env bash
# Device call for tiermoe serve (docs/server.md) on a real GPU. Carry .devdeps with the
# libmicrohttpd12 and libmicrohttpd-dev debs (apt-get download them here) besides the others.
#   1. build (Release, sm_90) with serve;
#   2. the hot-cache apply test (tests/oracle/test_server_cache.py) against the real CUDA
#      backend instead of the mock;
#   3. on the 30b-a3b preset with Qwen3's vocabulary and routing profile (/tmp/m30v.gguf,
#      made unless present), decode and prompt speed through serve (bench/serve_bench.py)
#      next to `tiermoe bench` in the same call:
#        all-gpu:         -ngl all, with the live counters and --no-expert-trace (the tracer's
#                         callback makes the decode step run eagerly instead of as one graph)
#        cache:           --cpu-moe --moe-cache 4212, then a plan made by tiermoe plan from the
#                         server's own /moe-layer-perf applied with POST /moe-hot-cache
#   REQS (3), TOKENS (128), OUT dir.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=build/device-serve
REQS=${REQS:-3}
TOKENS=${TOKENS:-128}
MV=/tmp/m30v.gguf
. scripts/device_env.sh
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
TM=$BUILD/tiermoe

stamp "build (Release, sm_90)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA_ARCHITECTURES=90-real \
    > /tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; echo "SUMMARY: cmake FAILED"; exit 1; }
grep -q "libmicrohttpd not found" /tmp/cmake.log && {
    echo "SUMMARY: no libmicrohttpd: carry .devdeps/libmicrohttpd12_*.deb and libmicrohttpd-dev_*.deb"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target tiermoe > /tmp/build.log 2>&1 \
    || { grep -E "error" -A3 /tmp/build.log | head -40; echo "SUMMARY: build FAILED"; exit 1; }

stamp "hot-cache apply on the GPU (test_server_cache.py)"
mkdir -p /tmp/serve_cache
TM_BIN_DIR=$BUILD TM_SERVE_BINARY=$TM TM_TEST_DATA=tests/data TM_TEST_TMP=/tmp/serve_cache \
    timeout 600 python3 tests/oracle/test_server_cache.py > "$OUT/serve_cache.log" 2>&1
rc_cache=$?
tail -6 "$OUT/serve_cache.log"

device_vocab_model "$MV" "$TM" || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
bench() { # name, flags...
    local name=$1; shift
    stamp "tiermoe bench $name: $*"
    timeout 600 $TM bench -m "$MV" -p 512 -n "$TOKENS" -r "$REQS" -t 16 "$@" 2> /tmp/bench.err \
        | tee -a "$OUT/bench.md" | grep -E "^\| qwen" || tail -5 /tmp/bench.err
}
serve() { # name, serve_bench args..., -- serve flags...
    local name=$1; shift
    stamp "serve $name"
    timeout 900 python3 bench/serve_bench.py "$MV" --build "$BUILD" --reqs "$REQS" --tokens "$TOKENS" \
        --label "$name" "$@" 2>&1 | tee -a "$OUT/serve.log" | grep -E "mean|applied|error|exited"
}
bench all-gpu -ngl all
serve all-gpu -- -ngl all -t 16
serve all-gpu-no-trace -- -ngl all -t 16 --no-expert-trace
bench cache --cpu-moe --moe-cache 4212
serve cache --apply-plan -- --cpu-moe --moe-cache 4212 --moe-cache-update off -t 16
stamp "done"
echo "SUMMARY: cache test rc=$rc_cache | logs in $OUT"
