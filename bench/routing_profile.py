#!/usr/bin/env python3
"""The routing statistics of a model against Qwen3-30B-A3B's published ones, through
tiermoe's own forward pass (what the `--routing` profiles of mkmodel are calibrated with).

    python3 bench/routing_profile.py MODEL.gguf [--build build/release] [--seqs 4]
        [--tokens 256] [--prompt 128] [--text FILE --vocab-json tokenizer.json[.xz]]
    python3 bench/routing_profile.py --make DIR [--routing qwen3-30b-a3b | --skew S ...]
        [--n-layer 4] [--n-vocab 4096]   (makes a 30b-a3b-width model first)

Each sequence: --prompt random tokens as one prompt batch, the rest decoded one at a time
(teacher-forced), a fresh context per sequence; with --text the sequences are consecutive
pieces of the text's tokens instead. Per layer: share of slots of the most used expert,
share of slots covered by the top half of the experts (counts summed over the sequences),
share of a token's experts the previous token also used, and share used by at least one of
the previous 8 tokens. Prints mean (min..max) over layers next to the targets.
"""
import argparse
import lzma
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
import qwen3moe_ref as ref  # noqa: E402
from routing_health import profile_stats  # noqa: E402

TARGETS = dict(top_half=0.90, top1=0.043, reuse_prev=0.45, reuse_win=0.80)  # synth_qwen3_targets
NAMES = dict(top_half="slots on the top 50% of experts", top1="top expert's share of slots",
             reuse_prev="experts shared with the previous token",
             reuse_win="experts used within the last 8 tokens")


def layer_ids(build, model, tokens, n_prompt, tmp):
    out = os.path.join(tmp, "route.gguf")
    subprocess.run([os.path.join(build, "tests", "forward_dump"), model, "--tokens",
                    ",".join(map(str, tokens)), "--prompt", str(n_prompt), "-o", out], check=True)
    d, _ = ref.read_dump(out)
    os.remove(out)
    layers = sorted(int(n.split(".")[1]) for n in d if n.endswith("topk_ids"))
    return [np.asarray(d[f"blk.{l}.topk_ids"], dtype=np.int64) for l in layers]


def text_tokens(path, vocab_json):
    """Token ids of a text with a HF tokenizer (the `tokenizers` package)."""
    from tokenizers import Tokenizer
    raw = lzma.open(vocab_json).read() if vocab_json.endswith(".xz") else open(vocab_json, "rb").read()
    tok = Tokenizer.from_str(raw.decode())
    return tok.encode(open(path, encoding="utf-8").read()).ids


def measure(build, model, seqs, tokens, prompt, seed=11, text=None):
    m = ref.Qwen3MoeFile(model)
    rng = np.random.default_rng(seed)
    per_layer = None
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(seqs):
            if text is not None:
                toks = text[s * tokens:(s + 1) * tokens]
            else:
                toks = rng.integers(0, m.n_vocab, tokens).tolist()
            ids = layer_ids(build, model, toks, prompt, tmp)
            per_layer = [[] for _ in ids] if per_layer is None else per_layer
            for l, a in enumerate(ids):
                per_layer[l].append(a)
    stats = [profile_stats(p, m.n_expert) for p in per_layer]
    for st, p in zip(stats, per_layer):
        st["reached"] = len(np.unique(np.concatenate([a.ravel() for a in p])))
    return m, stats


def print_table(stats, label):
    print(f"{label}: {len(stats)} layers")
    print(f"  {'statistic':<40} {'mean (min..max) over layers':<30} Qwen3-30B-A3B")
    for key in ("top_half", "top1", "reuse_prev", "reuse_win"):
        v = np.array([s[key] for s in stats])
        print(f"  {NAMES[key]:<40} {100 * v.mean():5.1f}% ({100 * v.min():.1f}..{100 * v.max():.1f})"
              f"{'':<10} {100 * TARGETS[key]:.1f}%")
    print(f"  experts reached per layer: {min(s['reached'] for s in stats)}..{max(s['reached'] for s in stats)}")
    for key in ("reuse_prev", "reuse_win"):
        print(f"  per layer {key}:", " ".join(f"{s[key]:.2f}" for s in stats))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--text")
    ap.add_argument("--vocab-json", default="tests/data/vocab/qwen3/tokenizer.json.xz")
    ap.add_argument("--make", metavar="DIR", help="make a 30b-a3b-width model in DIR first")
    ap.add_argument("--n-layer", default="4")
    ap.add_argument("--n-vocab", default="4096")
    ap.add_argument("--n-ff-exp", default=None)
    for k in ("--routing", "--skew", "--skew-offset", "--locality", "--locality-span", "--seed-model"):
        ap.add_argument(k, help="passed to mkmodel with --make" if k != "--seed-model" else "mkmodel --seed")
    a = ap.parse_args()
    knobs = []
    for k in ("routing", "skew", "skew_offset", "locality", "locality_span", "seed_model"):
        if getattr(a, k) is not None:
            knobs += ["--" + (k if k != "seed_model" else "seed").replace("_", "-"), getattr(a, k)]
    model = a.model
    if a.make:
        model = os.path.join(a.make, "profile.gguf")
        cmd = [os.path.join(a.build, "tiermoe"), "mkmodel", "--preset", "30b-a3b", "--n-layer", a.n_layer,
               "--n-vocab", a.n_vocab, "--type-embd", "q8_0", "-q", "-o", model] + knobs
        if a.n_ff_exp:
            cmd += ["--n-ff-exp", a.n_ff_exp]
        subprocess.run(cmd, check=True)
    elif knobs:
        ap.error(f"{' '.join(knobs)}: only with --make")
    text = text_tokens(a.text, a.vocab_json) if a.text else None
    if text is not None and len(text) < a.seqs * a.tokens:
        sys.exit(f"{a.text}: {len(text)} tokens, need {a.seqs * a.tokens}")
    m, stats = measure(a.build, model, a.seqs, a.tokens, a.prompt, a.seed, text)
    print_table(stats, f"{os.path.basename(model)} ({' '.join(knobs) or 'as made'}), {a.seqs} x {a.tokens} "
                       f"{'text' if text else 'random'} tokens ({a.prompt} prompt + {a.tokens - a.prompt} decoded)")


if __name__ == "__main__":
    main()
