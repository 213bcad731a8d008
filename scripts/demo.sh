#!/usr/bin/env bash
# The demo: a small synthetic MoE model with Qwen3's real vocabulary generates
# text on the tiers this machine has. With a GPU: attention and routing there,
# experts in RAM, computed by the CPU lane and the GPU's PCIe lane at once
# (--cpu-moe); without one, --cpu-moe says so and runs on the CPU. It prints
# tokens/s and where the time went.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
[ -f out/tokenizer.json ] || xz -dc tests/data/vocab/qwen3/tokenizer.json.xz > out/tokenizer.json
${TIERMOE:-build/release/tiermoe} mkmodel --preset tiny --skew 0.8 --vocab out/tokenizer.json -o out/demo.gguf
${TIERMOE:-build/release/tiermoe} inspect --no-tensors out/demo.gguf | sed -n 1,12p
echo
echo "The demo model's weights are random: the text it writes is noise, the speed is real."
echo "Run a model you have the same way: tiermoe run -m model.gguf --cpu-moe -p \"...\""
echo
${TIERMOE:-build/release/tiermoe} run -m out/demo.gguf --cpu-moe -p "Once upon a time" \
    -n 48 --profile
