#!/usr/bin/env bash
# Keep one style: clang-format every C, CUDA and header file of the project.
#   scripts/format.sh          rewrite the files in place
#   scripts/format.sh --check  list the files that are not formatted; exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--check" ]; then
    bad=0
    for f in $files; do
        if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then echo "not formatted: $f"; bad=1; fi
    done
    exit $bad
fi
clang-format -i $files
