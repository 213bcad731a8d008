#!/usr/bin/env bash
# A short, bounded fuzz run of every libFuzzer target (part of scripts/test.sh).
#
# usage: scripts/fuzz_smoke.sh
# env: FUZZ_SECONDS (per target, default 15), BUILD (default build-fuzz), CC (default clang,
#      else clang-14), JOBS (build jobs, default all cores)
# Builds gguf_fuzz, tokenizer_fuzz, plan_fuzz and trace_log_fuzz in $BUILD (ASan + UBSan +
# libFuzzer), runs each from its corpus in fuzz/corpus/ for FUZZ_SECONDS with a 5 s per-input
# timeout and a 2 GB RSS limit, and exits 1 if any of them finds a crash, leak, timeout or
# out-of-memory (the input is left in $BUILD/smoke/TARGET/ with the line that reproduces it).
# Without clang and its libFuzzer runtime (Debian: clang-14 libclang-rt-14-dev, which
# scripts/deps.sh installs) it says so and exits 0. Longer runs: scripts/fuzz_gguf.sh and
# fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-15}
BUILD=${BUILD:-build-fuzz}
JOBS=${JOBS:-$(nproc)}

# a clang that links -fsanitize=fuzzer
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return d && n > 99; }' \
    >"$probe/p.c"
CC_FOUND=""
for cc in ${CC:-} clang clang-14; do
    if command -v "$cc" >/dev/null && "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" \
        -o "$probe/p" >/dev/null 2>&1; then
        CC_FOUND=$cc
        break
    fi
done
if [ -z "$CC_FOUND" ]; then
    echo "fuzz_smoke: no clang with libFuzzer (Debian: apt-get install clang-14" \
        "libclang-rt-14-dev, or scripts/deps.sh): skipped"
    exit 0
fi

start=$(date +%s)
mkdir -p "$BUILD"
CC=$CC_FOUND cmake -S . -B "$BUILD" -G Ninja -DTM_FUZZ=ON -DTM_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log"; exit 1; }
cmake --build "$BUILD" -j "$JOBS" --target gguf_fuzz tokenizer_fuzz plan_fuzz trace_log_fuzz
echo "fuzz_smoke: built with $CC_FOUND in $(($(date +%s) - start)) s; ${SECS} s per target"

# libFuzzer's own leak check; the per-input limits are its flags below
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
for t in gguf tokenizer plan trace_log; do
    work=$BUILD/smoke/$t
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts"
    extra=()
    max_len=4096
    [ "$t" = gguf ] && extra=(-dict=fuzz/gguf.dict)
    [ "$t" = tokenizer ] && max_len=8192
    # new inputs go to the first directory; the committed corpus is only read
    rc=0
    "$BUILD/fuzz/${t}_fuzz" "$work/corpus" "fuzz/corpus/$t" "${extra[@]}" -max_len=$max_len \
        -timeout=5 -rss_limit_mb=2048 -max_total_time="$SECS" -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/" >"$work/fuzz.log" 2>&1 || rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")
    found=$(find "$work/artifacts" -type f | head -1)
    if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
        failed=1
        echo "fuzz_smoke: ${t}_fuzz FAILED (exit $rc, ${runs:-?} executions): $work/fuzz.log"
        grep -E 'ERROR|SUMMARY|invariant|artifact|Test unit written' "$work/fuzz.log" | head -20
        [ -n "$found" ] && echo "  reproduce: $BUILD/fuzz/${t}_fuzz $found"
    else
        echo "fuzz_smoke: ${t}_fuzz ${SECS} s, ${runs:-?} executions, no finding"
    fi
done
echo "fuzz_smoke: $(($(date +%s) - start)) s in all"
exit $failed
