#!/usr/bin/env python3
"""`tiermoe trace --routing-log`, `tiermoe plan` and `tiermoe report --replay`
end to end on a tiny mkmodel model, checked here independently:

- the routing log is parsed with Python's struct module (docs/trace-format.md,
  "Routing log"): its per-expert counts equal the learn file's experts[] of
  the same run, its calls equal the learn file's calls, one sequence a prompt;
- `tiermoe plan --expert-bytes B --budget MIB` on that learn file: the plan is
  recomputed here from the documented flat rule (every layer's experts ranked
  together by share of their layer's slots, ties to the higher share, the
  lower layer, the lower id; experts without hits after, lowest id first;
  greedy into the budget); used_bytes and the printed expected hit rate match;
- --model gives the GGUF's expert bytes; --layers-in-vram N leaves the first N
  layers without slots; two learn files plan like their sum;
- `report --replay` prints a row per residency with belady >= every demand
  policy, and the held-out decode tokens of the log;
- usage errors exit 2; a damaged log exits 1 naming the offset.
"""
import json
import os
import re
import struct
import subprocess
import sys

from oracle_common import TIERMOE, TMP, check, finish, run

MIB = 1 << 20


def read_log(path):
    """The routing log as {layer: [(seq, n_tok, ids)]}, shape, n_seq."""
    d = open(path, "rb").read()
    assert d[:4] == b"TMRL", "magic"
    version, L, E, k, res0 = struct.unpack_from("<5I", d, 4)
    assert version == 1 and res0 == 0
    arch = d[24:56].split(b"\0")[0].decode()
    pos, seq, calls = 64, -1, {l: [] for l in range(L)}
    while pos < len(d):
        (tag,) = struct.unpack_from("<I", d, pos)
        if tag == 0xFFFFFFFF:
            seq += 1
            pos += 4
            continue
        (n_tok,) = struct.unpack_from("<I", d, pos + 4)
        ids = struct.unpack_from(f"<{n_tok * k}H", d, pos + 8)
        calls[tag].append((seq, n_tok, ids))
        pos += 8 + 2 * n_tok * k
    return calls, (arch, L, E, k), seq + 1


def flat_plan(learn, bytes_per_layer, budget, cacheable):
    """The documented flat plan, written from the definition."""
    cands = []
    for l, y in enumerate(learn["layers"]):
        if not cacheable[l] or not bytes_per_layer[l]:
            continue
        H = y["expert_hits_total"]
        for e, c in enumerate(y["experts"]):
            share = c / H if H else 0.0
            w = 1.0 / bytes_per_layer[l]
            if c > 0:
                key = (0, -w * share, -share, l, e)
            else:
                key = (1, -w, 0.0, e, l)
            cands.append((key, l, e))
    cands.sort()
    used, plan = 0, [[] for _ in learn["layers"]]
    for _, l, e in cands:
        b = bytes_per_layer[l]
        if used + b <= budget:
            used += b
            plan[l].append(e)
    return plan, used


def main():
    model = os.path.join(TMP, "plan_tiny.gguf")
    run([TIERMOE, "mkmodel", "--preset", "tiny", "--n-layer", "4", "--n-expert", "32",
         "--n-expert-used", "4", "--skew", "0.8", "-q", "-o", model])
    prompts = os.path.join(TMP, "plan_prompts.txt")
    with open(prompts, "w") as f:
        for i in range(6):
            f.write(",".join(str((i * 37 + j * 11) % 1000 + 1) for j in range(5 + 3 * i)) + "\n")
    learn_p, log_p = os.path.join(TMP, "plan_learn.json"), os.path.join(TMP, "plan_route.bin")
    run([TIERMOE, "trace", "-m", model, "--prompts", prompts, "-n", "12", "-o", learn_p,
         "--routing-log", log_p])
    learn = json.load(open(learn_p))
    calls, (arch, L, E, k), n_seq = read_log(log_p)
    check((arch, L, E, k) == ("qwen3moe", 4, 32, 4), f"log shape {(arch, L, E, k)}")
    check(n_seq == 6, f"{n_seq} sequences in the log, 6 prompts")
    for l in range(L):
        counts = [0] * E
        for _, n_tok, ids in calls[l]:
            for e in ids:
                counts[e] += 1
        y = learn["layers"][l]
        check(counts == y["experts"], f"layer {l}: log counts differ from the learn file's")
        check(len(calls[l]) == y["calls"], f"layer {l}: {len(calls[l])} calls, learn file {y['calls']}")
        check(sum(n for _, n, _ in calls[l]) == y["tokens"], f"layer {l}: tokens")
        decode = [c for c in calls[l] if c[1] == 1]
        check(len(decode) == 6 * 12, f"layer {l}: {len(decode)} decode calls, expected 72")

    # plan with given expert bytes: recomputed here
    B = 100000
    for budget_mib, in_vram in ((0.5, 0), (1.5, 1), (100, 0)):
        plan_p = os.path.join(TMP, "plan_out.json")
        args = [TIERMOE, "plan", learn_p, "--expert-bytes", str(B), "--budget", str(budget_mib),
                "-o", plan_p]
        if in_vram:
            args += ["--layers-in-vram", str(in_vram)]
        out = run(args)
        plan = json.load(open(plan_p))
        cacheable = [l >= in_vram for l in range(L)]
        want, used = flat_plan(learn, [B] * L, int(budget_mib * MIB), cacheable)
        got = [y["experts"] for y in plan["layers"]]
        check(got == want, f"budget {budget_mib} MiB, {in_vram} in VRAM: plan {got}, expected {want}")
        check(plan["used_bytes"] == used, f"used_bytes {plan['used_bytes']}, expected {used}")
        check(plan["used_bytes"] <= plan["budget_bytes"], "over budget")
        hit = sum(learn["layers"][l]["experts"][e] for l in range(L) for e in want[l] if cacheable[l])
        tot = sum(learn["layers"][l]["expert_hits_total"] for l in range(L) if cacheable[l])
        m = re.search(r"expected hit rate on the learn data: ([\d.]+)%", out)
        check(m and abs(float(m.group(1)) - 100 * hit / tot) < 0.051,
              f"printed hit rate {m and m.group(1)}, expected {100 * hit / tot:.1f}")

    # the model's expert bytes: one expert = its layer's expert tensors / n_expert
    plan_p = os.path.join(TMP, "plan_model.json")
    run([TIERMOE, "plan", learn_p, "-m", model, "--budget", "2", "-o", plan_p,
         "--weighting", "balanced"])
    plan = json.load(open(plan_p))
    eb = {y["expert_bytes"] for y in plan["layers"]}
    check(len(eb) == 1 and min(eb) > 0, f"expert bytes from the model: {eb}")
    n = [len(y["experts"]) for y in plan["layers"]]
    check(max(n) - min(n) <= 1 and plan["weighting"] == "balanced", f"balanced slots {n}")
    check(plan["used_bytes"] <= 2 * MIB and plan["used_bytes"] + min(eb) > 2 * MIB,
          "the balanced plan fills the budget")

    # two learn files: the plan of their sum equals the plan of one learn file counted twice
    two_p, one_p = os.path.join(TMP, "plan_two.json"), os.path.join(TMP, "plan_one.json")
    run([TIERMOE, "plan", learn_p, learn_p, "--expert-bytes", str(B), "--budget", "1", "-o", two_p])
    run([TIERMOE, "plan", learn_p, "--expert-bytes", str(B), "--budget", "1", "-o", one_p])
    check(json.load(open(two_p))["layers"] == json.load(open(one_p))["layers"],
          "a learn file twice plans like once (shares unchanged)")

    # the replay
    out = run([TIERMOE, "report", "--replay", log_p, "--train-fraction", "0.5"])
    rows = re.findall(r"^\s+(\d+)%\s+(\d+)((?:\s+[\d.]+%){6})$", out, re.M)
    check(len(rows) == 4, f"replay rows: {len(rows)}\n{out}")
    for res, slots, cells in rows:
        v = [float(x) for x in re.findall(r"([\d.]+)%", cells)]
        check(all(v[5] >= x for i, x in enumerate(v[:5]) if i != 1),
              f"{res}%: belady below a demand policy: {v}")
    check("3 held out with 36 decode tokens" in out, f"held-out part:\n{out.splitlines()[0]}")

    # bad input
    for args in (["plan", learn_p, "--budget", "1", "-o", "x.json"],
                 ["plan", learn_p, "--expert-bytes", "0", "--budget", "1", "-o", "x.json"],
                 ["plan", learn_p, "--expert-bytes", "10", "--budget", "1", "-o", "x.json",
                  "--weighting", "hot"],
                 ["report", "--replay", log_p, "--lag", "-1"],
                 ["report", "--replay", log_p, "--residency", "0,0.5"],
                 ["report", "--replay", log_p, "--svg", "x.svg"]):
        r = subprocess.run([TIERMOE] + args, capture_output=True, text=True)
        check(r.returncode == 2, f"{args}: exit {r.returncode}, expected 2 ({r.stderr.strip()})")
    bad = os.path.join(TMP, "plan_bad.bin")
    d = bytearray(open(log_p, "rb").read())
    struct.pack_into("<I", d, 68, 99)  # the first call's layer
    open(bad, "wb").write(bytes(d))
    r = subprocess.run([TIERMOE, "report", "--replay", bad], capture_output=True, text=True)
    check(r.returncode == 1 and "offset 68: layer 99 of 4" in r.stderr, f"damaged log: {r.stderr}")
    return finish("plan and replay CLI: ok")


if __name__ == "__main__":
    sys.exit(main())
