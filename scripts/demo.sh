#!/usr/bin/env bash
# The demo: make a small synthetic MoE model and show what is in it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
build/release/tiermoe mkmodel --preset tiny --skew 0.8 -o out/tiny.gguf
build/release/tiermoe inspect --no-tensors out/tiny.gguf
