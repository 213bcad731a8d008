#!/usr/bin/env bash
# One call that measures where the open issues stand on the GPU machine, on one
# build (build/device-cuda) and the 30b-a3b file with Qwen3's vocabulary and
# routing profile (/tmp/m30v.gguf, the one serve needs):
#   checks    test_cuda_ops (every op, the placement matrix on the real kernels);
#   gpu       issue 19: full GPU pp512 / tg128, both engines;
#   serve     issue 16: serve --parallel 1..8 streams, full GPU and --cpu-moe
#             (scripts/device_parallel.sh without its checks);
#   cpu       issue 19: CPU only, pp512 / tg128, llama.cpp -dev none at 16
#             threads against tiermoe -ngl 0 at 8 and 16 threads;
#   long      issue 19: full GPU pp2048 / tg512, both engines;
#   gptoss    issue 17: gpt-oss-20b CPU only, both engines (device_gptoss.sh).
# STAGES picks (default "serve cpu long"), REPS (2). Carry .devdeps and .peer.
#   scripts/device_survey.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
export BUILD=build/device-cuda
REPS=${REPS:-2}
STAGES=${STAGES:-serve cpu long}
M=/tmp/m30v.gguf
. scripts/device_env.sh
TM=$BUILD/tiermoe
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core\(s\)|Socket" | tr -s ' '
stamp "build"
device_build "$BUILD" tiermoe test_cuda_ops || exit 1
if has checks; then
    stamp "test_cuda_ops"
    TM_TEST_TMP=/tmp TM_TEST_DATA="$PWD/tests/data" timeout 300 "$BUILD/tests/test_cuda_ops" \
        > "$OUT/checks.log" 2>&1
    echo "test_cuda_ops rc $?: $(grep -E '^\[  (PASSED|FAILED|ERROR) ' "$OUT/checks.log" | tr '\n' ' ')"
fi
device_vocab_model "$M" "$TM" || { echo "SUMMARY: mkmodel FAILED"; exit 1; }
[ -x /tmp/llamacpp-peer/llama-bench ] || tar xJf .peer/llama-bench.tar.xz -C /tmp
peer() { # label, llama-bench args...
    local label=$1
    shift
    stamp "llama.cpp $label: $*"
    timeout 300 /tmp/llamacpp-peer/llama-bench -m "$M" -fa 1 -r "$REPS" "$@" 2>&1 \
        | tee -a "$OUT/peer.md" | grep -E "^\| qwen" | sed 's/ | [0-9.]* GiB | *[0-9.]* B//'
}
envs=()
if has serve; then
    NO_CHECKS=1 OUT="$OUT" timeout 420 scripts/device_parallel.sh "$OUT" 2>&1 | grep -v "^\[.*build"
fi
if has gpu; then
    peer "gpu" -ngl 99 -t 16 -p 512 -n 128
    device_bench "gpu" -ngl all -p 512 -n 128
fi
if has cpu; then
    peer "cpu" -dev none -t 16 -p 512 -n 128
    device_bench "cpu" -ngl 0 -t 8,16 -p 512 -n 128
fi
if has long; then
    peer "gpu long" -ngl 99 -t 16 -p 2048 -n 512
    device_bench "gpu long" -ngl all -p 2048 -n 512
fi
if has gptoss; then
    STAGES="peer bench" CASES=cpu OUT="$OUT" timeout 400 scripts/device_gptoss.sh "$OUT" 2>&1 \
        | grep -E "^\||SUMMARY|^\["
fi
stamp "done"
