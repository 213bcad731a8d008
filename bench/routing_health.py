#!/usr/bin/env python3
"""Routing health of a whole model, every layer, through tiermoe's own forward pass.

    python3 bench/routing_health.py MODEL.gguf [--build build/release] [--tokens 96] [--prompt 64]

Random tokens: the first --prompt go through one prompt batch, the rest are decoded one at a
time. Prints, per layer, the distinct experts the prompt tokens reach and the share of experts
consecutive decode tokens have in common (uniform routing: k/E). A healthy model reaches
nearly every expert; a collapsed one reaches a few and shares most of them.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import qwen3moe_ref as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    n_vocab = ref.Qwen3MoeFile(a.model).n_vocab
    tokens = np.random.default_rng(a.seed).integers(0, n_vocab, a.tokens).tolist()
    out = os.path.join(tempfile.mkdtemp(), "route.gguf")
    subprocess.run([os.path.join(a.build, "tests", "forward_dump"), a.model, "--tokens", ",".join(map(str, tokens)),
                    "--prompt", str(a.prompt), "-o", out], check=True)
    d, _ = ref.read_dump(out)
    layers = sorted(int(n.split(".")[1]) for n in d if n.endswith("topk_ids"))
    reached, overlap = [], []
    for l in layers:
        ids = np.asarray(d[f"blk.{l}.topk_ids"])
        k, dec = ids.shape[1], ids[a.prompt:]
        reached.append(len(np.unique(ids[:a.prompt])))
        overlap.append(np.mean([len(set(dec[i]) & set(dec[i + 1])) / k for i in range(len(dec) - 1)]))
    print(f"{len(layers)} layers, {a.prompt} prompt tokens, {a.tokens - a.prompt} decode steps, top-{k}")
    print(f"experts reached: min {min(reached)} max {max(reached)} mean {np.mean(reached):.1f}")
    print(f"consecutive decode overlap: min {min(overlap):.3f} max {max(overlap):.3f} mean {np.mean(overlap):.3f}")
    print("per layer reached:", reached)


if __name__ == "__main__":
    main()
