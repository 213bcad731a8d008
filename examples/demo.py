#!/usr/bin/env python3
"""demo: scripts/demo.sh through the tiermoe Python package. The small synthetic MoE
model with Qwen3's vocabulary (out/demo.gguf, made with `tiermoe mkmodel` when
missing) generates text with its experts in RAM and attention on the GPU when this
machine has one (on the CPU otherwise); then tokens/s and which experts it used.

    python3 examples/demo.py [PROMPT]          (TIERMOE: the CLI to make the model with)
"""
import lzma
import os
import subprocess
import sys
import time

import tiermoe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def demo_model():
    """out/demo.gguf, made as scripts/demo.sh makes it when it is not there."""
    out = os.path.join(ROOT, "out")
    model = os.path.join(out, "demo.gguf")
    if os.path.exists(model):
        return model
    os.makedirs(out, exist_ok=True)
    tok = os.path.join(out, "tokenizer.json")
    if not os.path.exists(tok):
        with lzma.open(os.path.join(ROOT, "tests", "data", "vocab", "qwen3", "tokenizer.json.xz")) as f, \
                open(tok, "wb") as g:
            g.write(f.read())
    cli = os.environ.get("TIERMOE", os.path.join(ROOT, "build", "release", "tiermoe"))
    subprocess.run([cli, "mkmodel", "--preset", "tiny", "--skew", "0.8", "--vocab", tok, "-o", model],
                   check=True)
    return model


def main():
    prompt = sys.argv[1] if len(sys.argv) > 1 else "Once upon a time"
    path, origin = tiermoe.library_path()
    print(f"libtiermoe {tiermoe.version()}: {path} ({origin})")
    with tiermoe.Model(demo_model(), n_gpu_layers="auto", cpu_moe=True) as model, \
            model.context(expert_stats=True) as ctx:
        i = model.info
        print(f"{i.arch}: {i.n_layer} layers x {i.n_expert} experts (top-{i.n_expert_used}), "
              f"{i.n_params / 1e6:.0f}M parameters; {ctx.info.n_gpu_layers} layers on the GPU\n")
        print(prompt, end="", flush=True)
        t0 = time.perf_counter()
        for text in ctx.generate(prompt, 48, temp=0.8, seed=1):
            print(text, end="", flush=True)
        dt = time.perf_counter() - t0
        n = ctx.seq_length() - len(model.tokenize(prompt)) + 1  # the last token sampled is not evaluated
        print(f"\n\n{n} tokens in {dt:.2f} s, the prompt's evaluation included: {n / dt:.1f} tokens/s")
        counts = ctx.expert_counts()
        for layer, row in enumerate(counts):
            hot = row.argsort()[::-1][:4]
            print(f"layer {layer}: experts {hot.tolist()} took {row[hot].sum() / row.sum():.0%} "
                  f"of {row.sum()} selections")
    return 0


if __name__ == "__main__":
    sys.exit(main())
