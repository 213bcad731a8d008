#!/usr/bin/env python3
"""Seed corpora for plan_fuzz and trace_log_fuzz (fuzz/corpus/plan, fuzz/corpus/trace_log):
small valid plan files of each weighting mode and small valid routing logs
(docs/plan-format.md, docs/trace-format.md), written from the formats' definitions."""
import json
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ["flat", "pressure", "smooth_pressure", "time", "balanced"]


def plan(seed, L, E, k, mode):
    r = random.Random(seed)
    layers, used = [], 0
    for l in range(L):
        b = r.choice([0, 1, 2654208, 100000])
        n = 0 if b == 0 else r.randint(0, E)
        ids = r.sample(range(E), n)
        used += n * b
        layers.append({"layer": l, "expert_bytes": b, "experts": ids})
    return {"format": "tiermoe-moe-plan", "version": 1,
            "model": {"arch": "qwen3moe", "n_layer": L, "n_expert": E, "n_expert_used": k},
            "weighting": mode, "layer_curve": r.choice([0, 0.5, 1.0, 8]),
            "budget_bytes": used + r.choice([0, 1, 1 << 30]), "used_bytes": used, "layers": layers}


def log(seed, L, E, k, n_seq):
    r = random.Random(seed)
    arch = b"qwen3moe".ljust(32, b"\0")
    out = bytearray(b"TMRL" + struct.pack("<5I", 1, L, E, k, 0) + arch + struct.pack("<2I", 0, 0))
    for _ in range(n_seq):
        out += struct.pack("<I", 0xFFFFFFFF)
        for step in range(r.randint(0, 4)):
            n_tok = r.randint(2, 5) if step == 0 else 1
            for l in range(L):
                ids = [e for _ in range(n_tok) for e in r.sample(range(E), k)]
                out += struct.pack(f"<II{len(ids)}H", l, n_tok, *ids)
    return bytes(out)


def main():
    pd, ld = os.path.join(HERE, "corpus", "plan"), os.path.join(HERE, "corpus", "trace_log")
    os.makedirs(pd, exist_ok=True)
    os.makedirs(ld, exist_ok=True)
    for i, mode in enumerate(MODES):
        with open(os.path.join(pd, f"seed-{mode}.json"), "w") as f:
            json.dump(plan(i, 1 + i, 4 + 4 * i, 2, mode), f)
    for i, (L, E, k) in enumerate([(1, 4, 1), (2, 8, 2), (3, 16, 4), (2, 300, 3)]):
        with open(os.path.join(ld, f"seed-{L}x{E}x{k}.bin"), "wb") as f:
            f.write(log(i, L, E, k, 1 + i))


if __name__ == "__main__":
    main()
