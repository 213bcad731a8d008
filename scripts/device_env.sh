# Sourced by the device scripts: the libraries the GPU machine's image lacks
# (jansson, PCRE2, utf8proc, cmocka, libmicrohttpd for serve, liburing for the SSD tier), from the Debian packages carried in
# .devdeps/ (apt-get download them here; the machine reaches no registry).
if ! pkg-config --exists jansson libpcre2-8 libutf8proc cmocka libmicrohttpd liburing 2>/dev/null; then
    mkdir -p /tmp/deps
    for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/deps; done
    # libmicrohttpd's .pc names gnutls for static links only; the image has the library, not its .pc
    sed -i '/^Requires.private/d' /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc 2>/dev/null || true
    export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
    export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PATH=$PATH:/usr/local/cuda/bin

# Seconds since this file was sourced, before a message.
device_t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - device_t0 )) s] $*"; }

# Configure and build targets in build dir $1 (Release, sm_90); logs in /tmp.
device_build() {
    local dir=$1
    shift
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTM_CUDA_ARCHITECTURES=90-real \
        > /tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; echo "SUMMARY: cmake FAILED"; return 1; }
    cmake --build "$dir" -j"$(nproc)" --target "$@" > /tmp/build.log 2>&1 \
        || { grep -E "error" -A3 /tmp/build.log | head -40; echo "SUMMARY: build FAILED"; return 1; }
}

# Build tiermoe in $1 and, unless NO_CHECKS=1, test_cuda_ops, then run it (log in
# $OUT/checks.log) and print its lines that match the pattern $2 and its verdicts.
device_build_checks() {
    if [ "${NO_CHECKS:-0}" = 1 ]; then
        device_build "$1" tiermoe
        return
    fi
    device_build "$1" tiermoe test_cuda_ops || return 1
    stamp "checks: test_cuda_ops"
    TM_TEST_DATA=$PWD/tests/data timeout 400 "$1/tests/test_cuda_ops" > "$OUT/checks.log" 2>&1
    echo "test_cuda_ops rc=$?"
    grep -E "$2|\[  (PASSED|FAILED)|\[  ERROR|ERROR:" "$OUT/checks.log" | head -40
}

# The 30b-a3b preset, uniform routing ($1) and with the Qwen3 routing profile
# ($2, optional), made by tiermoe ($3) unless there.
device_models() {
    [ -f "$1" ] || "$3" mkmodel --preset 30b-a3b -q -o "$1" || return 1
    [ -z "$2" ] || [ -f "$2" ] || "$3" mkmodel --preset 30b-a3b --routing qwen3-30b-a3b -q -o "$2"
}

# The 30b-a3b preset with the Qwen3 routing profile and Qwen3's vocabulary and chat
# template (what serve needs) at $1, made by tiermoe ($2) unless there.
device_vocab_model() {
    [ -f "$1" ] && return 0
    stamp "model: 30b-a3b, Qwen3 routing profile and vocabulary"
    python3 -c "
import lzma
for n in ('tokenizer.json', 'tokenizer_config.json'):
    open('/tmp/' + n, 'wb').write(lzma.open('tests/data/vocab/qwen3/' + n + '.xz').read())" || return 1
    "$2" mkmodel --preset 30b-a3b --routing qwen3-30b-a3b --vocab /tmp/tokenizer.json -q -o "$1"
}

# One `tiermoe bench` on $M under the environment in the array envs (may be
# empty), named $1, the rest its options: the table appended to
# $OUT/tiermoe.md, its log to $OUT/tiermoe.err, the result rows printed.
# Needs TM, M, REPS, OUT set.
device_bench() {
    local name=$1
    shift
    stamp "tiermoe $name: $*"
    timeout 300 env "${envs[@]}" $TM bench -m "$M" -r "$REPS" -t 16 "$@" > /tmp/tm.md 2> /tmp/tm.err
    { echo "## $name: $*"; cat /tmp/tm.md; } >> "$OUT/tiermoe.md"
    { echo "## $name: $*"; cat /tmp/tm.err; } >> "$OUT/tiermoe.err"
    grep -E "^\| qwen" /tmp/tm.md | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c1-160 || tail -5 /tmp/tm.err
}

# device_bench under VAR=VALUE for each of VALUES in turn, ROUNDS (2) times over (same-call
# comparisons): $1 VAR, $2 VALUES, the rest device_bench's options.
device_bench_rounds() {
    local var=$1 values=$2 round v
    shift 2
    for round in $(seq "${ROUNDS:-2}"); do
        for v in $values; do
            envs=("$var=$v")
            device_bench "round $round, $var=$v" "$@"
        done
    done
}
