#!/usr/bin/env bash
# Configure and build one flavour: release (default, for running and benchmarks),
# asan (AddressSanitizer + UndefinedBehaviorSanitizer, for tests) or debug (-O0,
# for a debugger; intrinsics that want immediates must still compile there).
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
case "$flavour" in
    release) flags=(-DCMAKE_BUILD_TYPE=Release) ;;
    asan)    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTM_SANITIZE=ON) ;;
    debug)   flags=(-DCMAKE_BUILD_TYPE=Debug) ;;
    *) echo "usage: scripts/build.sh [release|asan|debug]" >&2; exit 2 ;;
esac
# TM_CUDA=OFF in the environment leaves the CUDA backend out (scripts/test.sh's debug build)
[ -n "${TM_CUDA:-}" ] && flags+=(-DTM_CUDA="$TM_CUDA")
py=()
[ -x .venv/bin/python ] && py=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python")
cmake -S . -B "build/$flavour" -G Ninja "${flags[@]}" "${py[@]}" > "build-$flavour.log" 2>&1 \
    || { cat "build-$flavour.log"; exit 1; }
cmake --build "build/$flavour" -j "$(nproc)"
