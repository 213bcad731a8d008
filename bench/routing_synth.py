#!/usr/bin/env python3
"""Synthetic routing logs (docs/trace-format.md, "Routing log") with the locality
real MoE routing has, for `tiermoe report --replay` (docs/plan-format.md).

Per layer, experts have a Zipf popularity (exponent --zipf, a random ranking per
layer). Each sequence picks one of --topics topics: per layer a set of --topic
experts whose weight is multiplied by --boost; within a sequence each token's
weights are also multiplied by --persist for the experts the previous token used.
A token's k experts are drawn without replacement from those weights. A sequence
is a prompt (one call of P tokens per layer) then D decode steps (one token each).

  python3 bench/routing_synth.py OUT.bin [--layers 8 --experts 128 --k 8 --seqs 40
      --topic 16 --boost 15 --persist 30 --zipf 0.6 --seed 3]

The docs' "topic" log: --topic 16 --boost 15 --persist 30 --seed 3; "mild topic":
--topic 24 --boost 10 --persist 10 --seed 4 (both 40 sequences, 8 x 128 x top-8).
Needs numpy.
"""
import argparse
import struct

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=40)
    ap.add_argument("--prompt", type=int, nargs=2, default=(16, 64), help="prompt tokens: lo hi")
    ap.add_argument("--decode", type=int, nargs=2, default=(64, 192), help="decode steps: lo hi")
    ap.add_argument("--zipf", type=float, default=0.6)
    ap.add_argument("--topics", type=int, default=12)
    ap.add_argument("--topic", type=int, default=16)
    ap.add_argument("--boost", type=float, default=15.0)
    ap.add_argument("--persist", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    L, E, k = a.layers, a.experts, a.k
    rng = np.random.default_rng(a.seed)
    pop = []
    for _ in range(L):
        g = np.empty(E)
        g[rng.permutation(E)] = 1.0 / np.arange(1, E + 1) ** a.zipf
        pop.append(g)
    topics = [[rng.choice(E, a.topic, replace=False) for _ in range(L)] for _ in range(a.topics)]
    out = bytearray(b"TMRL" + struct.pack("<5I", 1, L, E, k, 0) + b"qwen3moe".ljust(32, b"\0")
                    + struct.pack("<2I", 0, 0))
    for _ in range(a.seqs):
        tp = topics[rng.integers(a.topics)]
        P, D = rng.integers(*a.prompt), rng.integers(*a.decode)
        out += struct.pack("<I", 0xFFFFFFFF)
        prev = [None] * L

        def token(l):
            w = pop[l].copy()
            w[tp[l]] *= a.boost
            if prev[l] is not None:
                w[prev[l]] *= a.persist
            ids = rng.choice(E, k, replace=False, p=w / w.sum())
            prev[l] = ids
            return ids

        rows = [[token(l) for _ in range(P)] for l in range(L)]
        for l in range(L):
            out += struct.pack("<II", l, P) + np.array(rows[l], dtype="<u2").tobytes()
        for _ in range(D):
            for l in range(L):
                out += struct.pack("<II", l, 1) + np.array(token(l), dtype="<u2").tobytes()
    open(a.out, "wb").write(bytes(out))


if __name__ == "__main__":
    main()
