#!/usr/bin/env bash
# Device call for serve --parallel (issue 16: several sequences decoded in one batch).
# Carry .devdeps (the libmicrohttpd debs besides the others, as device_serve.sh).
#   1. build (Release, sm_90): tiermoe and test_cuda_ops;
#   2. test_cuda_ops: check_attention_rows (rows of several sequences against each alone,
#      bit for bit up to 8 rows) and the placement matrix, whose every placement now also
#      decodes 5 requests on 4 sequences as each alone (the real kernels and graphs);
#   3. on the 30b-a3b preset with Qwen3's vocabulary and routing profile (/tmp/m30v.gguf,
#      made unless present): aggregate decode tokens/s of serve at 1, 2, 4, 8 streams
#      (bench/serve_parallel.py), full GPU and --cpu-moe, both --no-expert-trace (the
#      tracer's callback would make every decode step eager).
#   TOKENS (128; --cpu-moe takes half), CPU_MOE_THREADS ("16"; several: "16 14"), NO_CPU_MOE=1,
#   SERVE_ENVS ("VAR=VALUE ...": full GPU again under each),
#   NO_CHECKS=1 (bench only), FETCH_MODES ("copy pcie off": --cpu-moe prompts of 16-512
#   tokens with each --moe-fetch mode), OUT dir. Targets (reported, not asserted):
#   full GPU 8 streams >= 3x one; --cpu-moe: more streams, more tokens/s.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
BUILD=${BUILD:-build/device-par}
TOKENS=${TOKENS:-128}
MV=/tmp/m30v.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe

stamp "build (Release, sm_90)"
rc_checks=skipped
if [ "${NO_CHECKS:-0}" != 1 ]; then
    device_build "$BUILD" tiermoe test_cuda_ops || exit 1
    stamp "checks: test_cuda_ops"
    timeout 300 "$BUILD/tests/test_cuda_ops" > "$OUT/checks.log" 2>&1
    rc_checks=$?
    grep -E "attention rows|--parallel 4|\[  (PASSED|FAILED)|\[  ERROR" "$OUT/checks.log" | head -60
else
    device_build "$BUILD" tiermoe || exit 1
fi

device_vocab_model "$MV" "$TM" || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
par() { # label, tokens, serve flags...
    local label=$1 n=$2; shift 2
    stamp "serve --parallel 8, $label: $*"
    timeout 300 python3 bench/serve_parallel.py "$MV" --build "$BUILD" --tokens "$n" --label "$label" \
        -- "$@" 2>&1 | tee -a "$OUT/parallel.log" | grep -E "streams|RESULT|rror|exited"
}
stamp "the engine alone: bench -np (the same steps without the server)"
for pl in "-ngl all" "--cpu-moe"; do
    timeout 200 $TM bench -m "$MV" -t 16 -p 0 -n 64 -np 1,2,4,8 -r 2 $pl 2> /dev/null \
        | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c1-150
done
if [ -n "${FETCH_MODES:-}" ]; then # short prompts with every expert in RAM: which lane
    for f in $FETCH_MODES; do
        stamp "bench --cpu-moe --moe-fetch $f"
        timeout 200 $TM bench -m "$MV" -t 16 -p 16,40,128,512 -n 0 -r 2 --cpu-moe --moe-fetch "$f" 2> /dev/null \
            | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | [0-9.]* B//' | cut -c1-150
    done
fi
par all-gpu "$TOKENS" -ngl all -t 16 --no-expert-trace
if [ -n "${SERVE_ENVS:-}" ]; then # full GPU again under each VAR=VALUE of SERVE_ENVS
    for e in $SERVE_ENVS; do
        export "${e?}"
        par "all-gpu $e" "$TOKENS" -ngl all -t 16 --no-expert-trace
        unset "${e%%=*}"
    done
fi
[ "${NO_CPU_MOE:-0}" = 1 ] && CPU_MOE_THREADS=" "
for t in ${CPU_MOE_THREADS:-16}; do
    par "cpu-moe -t $t" $((TOKENS / 2)) --cpu-moe -t "$t" --no-expert-trace
done
stamp "done"
echo "SUMMARY: checks rc=$rc_checks | $(grep -h RESULT "$OUT/parallel.log" | tr '\n' ' ')| logs in $OUT"
