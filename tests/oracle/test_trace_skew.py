#!/usr/bin/env python3
"""`tiermoe trace` + `tiermoe report` on mkmodel models of known routing skew.

mkmodel calibrates the router so that expert popularity follows a Zipf law
(rank^-s, frequencies summing to k, capped at 0.9: synth.c synth_zipf_targets,
tests/ref/routing_health.py zipf_targets). This test makes models with 128
experts, top-8, at s = 0.6 and 1.2, traces random token-id prompts through the
C engine (`tiermoe trace`: prompt batches + greedy decode steps) and checks the
skew numbers `tiermoe report` prints per layer -- normalised entropy and the
share of routed slots covered by the top 10/25/50% of experts (13/32/64 of
128) -- against what the exponent predicts.

Prediction and tolerance (derived, not tuned): the report's statistics are
computed here by the same definitions on simulated counts, 2000 times:
  - expert of rank r has frequency f_r = zipf_targets(128, 8, s, 0.9)[r] times
    (1 + 0.125 z_r), z_r ~ N(0,1): the per-expert spread that random router row
    norms give (tests/oracle/test_routing_health.py documents it: ~13% std,
    allowance 25% = 2 std), renormalised so frequencies still sum to k;
  - counts ~ Binomial(n_tok, f_r) (sampling noise of n_tok tokens);
  - sort descending, shares of the top m, entropy -sum p log p / log 128.
The measured value must lie within the simulated mean +- 4 simulated std.
The two skews' predictions are many std apart, so a report that ignored the
counts (or a tracer that counted wrong) fails.

Also: learn files of two halves of the prompts, merged with `trace --merge`,
have exactly the per-expert counts, working sets and reuse of one run over all
prompts (each prompt is its own sequence and the forward is deterministic);
the CSV export has one row per layer and expert; the SVG heatmap is
well-formed XML with a cell per layer and expert.
"""
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

try:
    import numpy as np
except ImportError:
    print("numpy not installed: skipping")
    sys.exit(77)
from oracle_common import TIERMOE, TMP, check, finish, run  # noqa: E402 (puts tests/ref on the path)

try:
    from routing_health import zipf_targets  # noqa: E402 (imports the reference, which needs gguf)
except ImportError as e:
    print(f"reference not importable ({e}): skipping")
    sys.exit(77)

E, K, CAP = 128, 8, 0.9
SPREAD = 0.125
FRACS = (0.10, 0.25, 0.50)


def stats_of_counts(c):
    """The report's numbers for per-expert counts c: entropy, top shares."""
    c = np.sort(np.asarray(c, dtype=np.float64))[::-1]
    p = c / c.sum()
    nz = p[p > 0]
    ent = -np.sum(nz * np.log(nz)) / np.log(len(c))
    tops = [p[: int(np.ceil(f * len(c) - 1e-9))].sum() for f in FRACS]
    return np.array([ent] + tops)


def predicted(s, n_tok, trials=2000, seed=5):
    rng = np.random.default_rng(seed)
    t = zipf_targets(E, K, s, cap=CAP)
    out = []
    for _ in range(trials):
        f = t * (1 + SPREAD * rng.standard_normal(E))
        f = np.clip(f, 1e-6, None)
        f *= K / f.sum()
        f = np.clip(f, 0, 1)
        out.append(stats_of_counts(rng.binomial(n_tok, f)))
    out = np.array(out)
    return out.mean(axis=0), out.std(axis=0)


LINE = re.compile(r"layer\s+(\d+): calls (\d+) tokens (\d+) hits (\d+) used (\d+) \| entropy ([\d.]+) "
                  r"top10% ([\d.]+) top25% ([\d.]+) top50% ([\d.]+) \| ws ([\d.]+) max (\d+) \| reuse ([\d.]+)")


def report(learn, *extra):
    out = run([TIERMOE, "report", learn, *extra])
    rows = [m.groups() for m in map(LINE.search, out.splitlines()) if m]
    return out, rows


def write_prompts(path, rng, n_prompts, n_tok, vocab=1024):
    with open(path, "w") as f:
        for _ in range(n_prompts):
            f.write(",".join(str(x) for x in rng.integers(0, vocab, n_tok)) + "\n")


def skew_case(s):
    model = os.path.join(TMP, f"trace_skew{s}.gguf")
    run([TIERMOE, "mkmodel", "--preset", "tiny", "--n-expert", str(E), "--n-expert-used", str(K),
         "--n-layer", "2", "--skew", str(s), "-q", "-o", model])
    rng = np.random.default_rng(int(s * 10) + 1)
    prompts = os.path.join(TMP, f"prompts{s}.txt")
    write_prompts(prompts, rng, 64, 32)
    learn = os.path.join(TMP, f"learn{s}.json")
    run([TIERMOE, "trace", "-m", model, "--prompts", prompts, "-n", "1", "-t", "2", "-o", learn])
    _, rows = report(learn)
    check(len(rows) == 2, f"skew {s}: report printed {len(rows)} layer lines, want 2")
    for r in rows:
        layer, tokens = int(r[0]), int(r[2])
        meas = np.array([float(x) for x in r[5:9]])
        check(tokens == 64 * 33, f"skew {s} layer {layer}: {tokens} tokens traced, want {64 * 33}")
        check(int(r[3]) == tokens * K, f"skew {s} layer {layer}: hits {r[3]} != tokens * k")
        mean, std = predicted(s, tokens)
        dev = np.abs(meas - mean) / std
        names = ["entropy", "top10%", "top25%", "top50%"]
        print(f"    skew {s} layer {layer}: " + ", ".join(
            f"{n} {m:.4f} (predicted {p:.4f} +- {4 * d:.4f}, {x:.1f} std)"
            for n, m, p, d, x in zip(names, meas, mean, std, dev)))
        for n, m, p, d, x in zip(names, meas, mean, std, dev):
            check(x <= 4, f"skew {s} layer {layer}: {n} {m:.4f}, predicted {p:.4f} +- {4 * d:.4f}")
    if s == 0.6:
        merge_case(model, prompts, learn)
    os.remove(model)


def merge_case(model, prompts, learn):
    lines = open(prompts).read().splitlines()
    halves = []
    for i, part in enumerate((lines[:20], lines[20:])):
        p = os.path.join(TMP, f"half{i}.txt")
        open(p, "w").write("\n".join(part) + "\n")
        out = os.path.join(TMP, f"half{i}.json")
        run([TIERMOE, "trace", "-m", model, "--prompts", p, "-n", "1", "-t", "1", "-o", out])
        halves.append(out)
    merged = os.path.join(TMP, "merged.json")
    run([TIERMOE, "trace", "--merge", *halves, "-o", merged])
    a, b = json.load(open(learn)), json.load(open(merged))
    check(a["tokens"] == b["tokens"], f"merge: {b['tokens']} tokens, one run {a['tokens']}")
    for la, lb in zip(a["layers"], b["layers"]):
        for key in ("calls", "tokens", "expert_hits_total", "experts", "working_set_sum", "working_set_samples",
                    "working_set_max", "reuse_shared", "reuse_pairs"):
            check(la[key] == lb[key], f"merge: layer {la['layer']} {key} differs from one run over all prompts")
    h0, h1 = (json.load(open(h)) for h in halves)
    check(all(np.array_equal(np.add(x["experts"], y["experts"]), z["experts"])
              for x, y, z in zip(h0["layers"], h1["layers"], b["layers"])), "merge: experts[] are not the sums")
    # CSV and SVG
    csv, svg = os.path.join(TMP, "l.csv"), os.path.join(TMP, "l.svg")
    report(merged, "--csv", csv, "--svg", svg)
    rows = open(csv).read().splitlines()
    check(rows[0] == "layer,expert,hits,hot,cold,share" and len(rows) == 1 + 2 * E, f"CSV: {len(rows)} lines")
    hits = np.array([int(r.split(",")[2]) for r in rows[1:]]).reshape(2, E)
    check(np.array_equal(hits, np.array([x["experts"] for x in b["layers"]])), "CSV hits differ from the JSON")
    root = ET.parse(svg).getroot()
    cells = [e for e in root.iter() if e.tag.endswith("rect") and e.find("{http://www.w3.org/2000/svg}title") is not None]
    check(len(cells) == 2 * E, f"SVG: {len(cells)} cells, want {2 * E}")
    # a mismatched merge is refused
    bad = os.path.join(TMP, "bad.json")
    c = json.load(open(halves[0]))
    c["model"]["n_expert"] = 64
    for x in c["layers"]:
        for key in ("experts", "hot_experts", "cold_experts"):  # sums kept: only the shape differs
            x[key] = x[key][:63] + [sum(x[key][63:])]
        x["working_set_sum"] = x["working_set_samples"] = x["working_set_max"] = 0
    json.dump(c, open(bad, "w"))
    r = subprocess.run([TIERMOE, "trace", "--merge", halves[0], bad, "-o", os.path.join(TMP, "x.json")],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "bad.json" in r.stderr and "64 experts" in r.stderr, f"merge of another shape: rc {r.returncode}, {r.stderr!r}")


def main():
    for s in (0.6, 1.2):
        skew_case(s)
    return finish("trace/report skew numbers land where the Zipf exponent predicts; merge, CSV, SVG ok")


if __name__ == "__main__":
    sys.exit(main())
