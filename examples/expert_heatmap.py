#!/usr/bin/env python3
"""expert_heatmap: generate from some prompts with the tiermoe Python package, then
read the live expert statistics (each layer's selection counts) and draw them as a
layer x expert heatmap (each layer's share of its selections) into a PNG. The
hottest experts are the ones a VRAM cache (--moe-cache, apply_plan) should hold.

    python3 examples/expert_heatmap.py MODEL.gguf [-p PROMPT ...] [-n N] [-o experts.png]
        [--cpu-moe] [-ngl N|auto|all]

Needs matplotlib (pip install matplotlib)."""
import argparse
import sys

import tiermoe


def plot(counts, title, path):
    try:
        import matplotlib
        matplotlib.use("Agg")  # a file, no display
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        sys.exit("expert_heatmap: drawing needs matplotlib: pip install matplotlib")
    share = counts / counts.sum(axis=1, keepdims=True).clip(min=1)
    n_layer, n_expert = share.shape
    fig, ax = plt.subplots(figsize=(min(4 + n_expert / 8, 24), min(2 + n_layer / 4, 16)))
    im = ax.imshow(share, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="share of the layer's selections")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--prompt", action="append", help="a prompt (again for more)")
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-o", "--output", default="experts.png")
    ap.add_argument("-ngl", "--n-gpu-layers", default="0", help="N, auto or all (as tiermoe run)")
    ap.add_argument("--cpu-moe", action="store_true", help="every layer's experts in RAM")
    a = ap.parse_args()
    prompts = a.prompt or ["Why is the sky blue?", "Write a haiku about autumn.", "def fibonacci(n):"]
    ngl = int(a.n_gpu_layers) if a.n_gpu_layers.lstrip("-").isdigit() else a.n_gpu_layers
    with tiermoe.Model(a.model, n_gpu_layers=ngl, cpu_moe=a.cpu_moe) as model, \
            model.context(expert_stats=True) as ctx:
        for p in prompts:
            prompt = p if model.info.has_vocab else [1, 2, 3]  # a model without a vocabulary takes ids
            for _ in ctx.generate(prompt, a.n_predict, temp=0, tokens=True):
                pass
        counts = ctx.expert_counts().astype(float)  # [n_layer, n_expert]
        i = model.info
    tokens = counts[0].sum() / i.n_expert_used
    top = counts.argsort(axis=1)[:, ::-1][:, :3]
    for layer in range(min(i.n_layer, 8)):
        print(f"layer {layer:3}: top experts {top[layer].tolist()}, "
              f"{counts[layer][top[layer]].sum() / counts[layer].sum():.0%} of its selections")
    plot(counts, f"{i.arch}: {i.n_layer} layers x {i.n_expert} experts, {tokens:.0f} tokens", a.output)
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
