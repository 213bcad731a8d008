#!/bin/sh
# Fuzz the GGUF reader with libFuzzer on one core.
#
# usage: scripts/fuzz_gguf.sh [SECONDS] [--merge]
#   SECONDS  how long to fuzz (default 600)
#   --merge  afterwards, minimise everything found into fuzz/corpus/gguf
# env: BUILD (default build-fuzz), WORK (default $BUILD/fuzz-work), CC (default clang)
# Crashes, leaks, timeouts and OOMs are copied to tests/data/gguf_bad/ as
# fuzz-<kind>-<hash>.gguf (they become regression inputs of test_gguf) and the
# script exits 1. Needs clang with libFuzzer (Debian: clang-14 libclang-rt-14-dev).
set -eu
cd "$(dirname "$0")/.."
SECS=600
MERGE=0
for a in "$@"; do
    case "$a" in
    --merge) MERGE=1 ;;
    *[!0-9]* | '') echo "usage: $0 [SECONDS] [--merge]" >&2; exit 2 ;;
    *) SECS=$a ;;
    esac
done
BUILD=${BUILD:-build-fuzz}
WORK=${WORK:-$BUILD/fuzz-work}
CC=${CC:-clang}
export CC

cmake -S . -B "$BUILD" -G Ninja -DTM_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" --target gguf_fuzz -j2
FUZZ=$BUILD/fuzz/gguf_fuzz

mkdir -p "$WORK/corpus" "$WORK/artifacts"
# new inputs go to the first directory; the committed corpus is only read
set +e
"$FUZZ" "$WORK/corpus" fuzz/corpus/gguf -dict=fuzz/gguf.dict -max_len=4096 -timeout=5 \
    -rss_limit_mb=2048 -max_total_time="$SECS" -print_final_stats=1 \
    -artifact_prefix="$WORK/artifacts/" 2>&1 | tee "$WORK/fuzz.log" | grep -v -e ' NEW ' -e ' REDUCE ' -e ' pulse '
set -e
echo "--- summary ($WORK/fuzz.log)"
grep -E '^Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb' "$WORK/fuzz.log" || true

found=0
for f in "$WORK"/artifacts/*; do
    [ -f "$f" ] || continue
    base=$(basename "$f")
    kind=${base%%-*}
    sum=$(sha1sum "$f" | cut -c1-12)
    cp "$f" "tests/data/gguf_bad/fuzz-$kind-$sum.gguf"
    echo "FOUND $kind: $f -> tests/data/gguf_bad/fuzz-$kind-$sum.gguf"
    found=1
done

if [ "$MERGE" = 1 ]; then
    rm -rf "$WORK/merged"
    mkdir -p "$WORK/merged"
    "$FUZZ" -merge=1 -max_len=4096 "$WORK/merged" fuzz/corpus/gguf "$WORK/corpus" 2>&1 | tail -2
    rm -f fuzz/corpus/gguf/*
    cp "$WORK"/merged/* fuzz/corpus/gguf/
    echo "fuzz/corpus/gguf: $(ls fuzz/corpus/gguf | wc -l) files, $(du -sb fuzz/corpus/gguf | cut -f1) bytes"
fi
exit $found
