#!/usr/bin/env bash
# First command of the README: install what is missing, build, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release
scripts/demo.sh
