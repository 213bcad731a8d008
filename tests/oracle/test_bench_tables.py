#!/usr/bin/env python3
"""bench/record.py and bench/tables.py, the raw results of scripts/device.sh and the tables
printed from them:
  - tables.py on records with known speeds prints tiermoe / llama.cpp as the ratio of the
    two means computed here; only the same case, model, test and thread count of the same
    call pair (a second call's tiermoe row has no llama.cpp to compare with); A/B rounds
    are averaged (and the VRAM cache's hit shares); a case only llama.cpp ran has no ratio;
    a tiermoe test whose host took more than 2% of the CPU time is named below its table;
    a bad line is reported, skipped; --wide puts a case's tests on one row;
  - record.py wraps real raw output (`tiermoe bench -o jsonl` of a tiny model, and a line
    of llama-bench's JSONL as it prints one) unchanged under "result", with the command,
    environment, commit and machine (and --info KEY=VALUE as "info", numbers as numbers),
    and tables.py reads it back;
  - the expert types' table (records with info expert_type, as device.sh qtypes writes
    them) over two calls of a file: each engine's decode full GPU and --cpu-moe and their
    ratios, the RAM bound (tiermoe's mem_gbs over the expert bytes a token) and each
    engine's share of it, tiermoe's --cpu-moe over the Q4_K file's (from the other call),
    all as computed here; prompt tests and records without a type stay out of it.
"""
import json
import os
import subprocess
import sys

from oracle_common import TIERMOE, TMP, check, finish

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TABLES = os.path.join(ROOT, "bench", "tables.py")
RECORD = os.path.join(ROOT, "bench", "record.py")
MACHINE = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "gpu_mem_mib": 81559, "driver": "580",
           "cpu": "Intel Xeon", "cores": 16, "ram_gib": 125.0, "kernel": "6"}


def peer(case, p, n, ts, call="c1", model="m30", thr=16, sd=0.0):
    return {"engine": "llama.cpp", "stage": "s", "case": case, "round": 1, "model": model,
            "env": {}, "cmd": "llama-bench", "commit": "abc", "date": "d", "call": call,
            "machine": MACHINE, "result": {"n_prompt": p, "n_gen": n, "n_depth": 0,
                                           "n_threads": thr, "avg_ts": ts, "stddev_ts": sd,
                                           "build_commit": "deadbee"}}


def tm(case, test, ts, call="c1", model="m30", thr=16, env=None, rnd=1, hit=None, steal=None):
    return {"engine": "tiermoe", "stage": "s", "case": case, "round": rnd, "model": model,
            "env": env or {}, "cmd": "tiermoe bench", "commit": "abc", "date": "d", "call": call,
            "machine": MACHINE, "result": {"test": test, "threads": thr, "ts_mean": ts,
                                           "ts_stddev": 1.0, "vram_cache_hit": hit,
                                           "host_steal": steal}}


def rows(md):
    """Table rows as lists of cells (header and rule lines left out)."""
    out = []
    for l in md.splitlines():
        if l.startswith("| ") and not l.startswith("| case") and not l.startswith("| ---"):
            out.append([c.strip() for c in l.strip().strip("|").split("|")])
    return out


def tables(*args):
    r = subprocess.run([sys.executable, TABLES, *args], capture_output=True, text=True)
    check(r.returncode == 0, f"tables.py {args}: rc {r.returncode}: {r.stderr}")
    return r


def main():
    os.makedirs(TMP, exist_ok=True)
    # 1. known speeds
    recs = [peer("gpu", 512, 0, 1000.0), peer("gpu", 0, 128, 200.0),
            tm("gpu", "pp512", 1500.0, steal=0.01), tm("gpu", "tg128", 250.0, steal=0.09),
            peer("pinned", 512, 0, 1234.0),                      # llama.cpp alone
            tm("gpu", "pp512", 3000.0, thr=8),                   # another thread count
            tm("ab", "tg64", 90.0, env={"X": "0"}, rnd=1, hit=0.7),
            tm("ab", "tg64", 110.0, env={"X": "1"}, rnd=1),
            tm("ab", "tg64", 100.0, env={"X": "0"}, rnd=2, hit=0.8),
            tm("ab", "tg64", 130.0, env={"X": "1"}, rnd=2),
            peer("ab", 0, 64, 50.0),
            tm("gpu", "pp512", 999.0, call="c2")]               # a second call: no pair
    f = os.path.join(TMP, "2026-11-27-h100-s.jsonl")
    with open(f, "w") as out:
        for r in recs:
            out.write(json.dumps(r) + "\n")
        out.write("{not json\n")
    r = tables(f, "--commands")
    check("not a bench record" in r.stderr and ":13:" in r.stderr,
          f"the bad line is not reported with its number: {r.stderr!r}")
    got = {}
    parts = r.stdout.split("## 2026-11-27-h100-s.jsonl")[1:]
    check(len(parts) == 2, f"{len(parts)} call headers, want 2:\n{r.stdout}")
    part1, part2 = (parts + ["", ""])[:2]
    for row in rows(part1):
        # case, model, env, test, llama.cpp, tiermoe, ratio (env shown: the ab case has one)
        got[(row[0], row[2], row[3])] = row
    want = {("gpu", "", "pp512 (-t 16)"): f"{1500 / 1000:.2f}",
            ("gpu", "", "tg128 (-t 16)"): f"{250 / 200:.2f}",
            ("gpu", "", "pp512 (-t 8)"): "",
            ("pinned", "", "pp512 (-t 16)"): "",
            ("ab", "X=0", "tg64 (-t 16)"): f"{(90 + 100) / 2 / 50:.2f}",
            ("ab", "X=1", "tg64 (-t 16)"): f"{(110 + 130) / 2 / 50:.2f}"}
    check(set(got) == set(want), f"rows {sorted(got)}, want {sorted(want)}:\n{r.stdout}")
    for k, ratio in want.items():
        row = got.get(k)
        check(row is not None and row[6] == ratio, f"{k}: ratio {row and row[6]!r}, want {ratio!r}")
    ab = got.get(("ab", "X=1", "tg64 (-t 16)"))
    check(ab is not None and "2 runs: 110.0-130.0" in ab[5] and ab[7] == "",
          f"A/B rounds not averaged: {ab}")
    ab0 = got.get(("ab", "X=0", "tg64 (-t 16)"))
    check(ab0 is not None and ab0[7] == f"{100 * (0.7 + 0.8) / 2:.1f}%",
          f"VRAM cache hit of the rounds: {ab0}")
    check(got.get(("pinned", "", "pp512 (-t 16)"), [""] * 7)[4] == "1,234",
          f"llama.cpp alone: {got.get(('pinned', '', 'pp512 (-t 16)'))}")
    r2 = rows(part2)
    # case, model, test, llama.cpp, tiermoe, ratio (one thread count, no env: no such columns)
    check(len(r2) == 1 and r2[0][3] == "" and r2[0][5] == "" and r2[0][4].startswith("999.0"),
          f"second call paired with the first call's llama.cpp: {r2}")
    check("H100" in part1 and "llama.cpp build deadbee" in part1 and "`tiermoe bench`" in part1,
          f"machine, llama.cpp build or commands missing:\n{part1}")
    # the host's steal: marked above 2% (tg128's 9%), not at 1% (pp512's), never in call 2
    stolen = [l for l in r.stdout.splitlines() if l.startswith("The host took more than 2%")]
    check(len(stolen) == 1 and "gpu tg128 9.0%" in stolen[0] and "pp512" not in stolen[0],
          f"the host's steal: {stolen}")
    # --wide: a case's tests on one row, as the docs' tables
    w = tables(f, "--wide").stdout.split("## 2026-11-27-h100-s.jsonl")[1:2] or [""]
    gpu = [row for row in rows(w[0]) if row[0] == "gpu" and row[3].startswith("pp512 / tg128")]
    check(len(gpu) == 1 and gpu[0][4:7] == ["1,000 / 200.0", "1,500 / 250.0",
                                             f"{1500 / 1000:.2f} / {250 / 200:.2f}"],
          f"--wide: {gpu}")
    print(f"  tables.py: {len(got)} rows of call 1, ratios as computed here; call 2 unpaired")

    # 2. the expert types' table: Q4_K in call c1, IQ2_XXS in c2, as device.sh qtypes splits them
    def q(rec, ty, nbytes, mem=None):
        rec["stage"], rec["info"] = "qtypes", {"expert_type": ty, "expert_token_bytes": nbytes}
        if mem is not None:
            rec["result"]["mem_gbs"] = mem
        return rec
    b4, b2 = 1_019_215_872, 465_567_744  # 30b-a3b: 48 x 8 x one expert's bytes
    speeds = {  # type -> (call, gpu llama.cpp, gpu tiermoe, cpu-moe llama.cpp, cpu-moe tiermoe, mem)
        "Q4_K": ("c1", 290.0, 320.0, 43.0, 92.0, 104.0),
        "IQ2_XXS": ("c2", 250.0, 280.0, 40.0, 170.0, 100.0)}
    recs = []
    for ty, (call, gp, gt, cp, ct, mem) in speeds.items():
        nb = b4 if ty == "Q4_K" else b2
        recs += [q(tm(f"cpu-moe-{ty}", "pp512", 9999.0, call=call), ty, nb, mem=1.0),
                 q(peer(f"gpu-{ty}", 0, 128, gp, call=call), ty, nb),
                 q(tm(f"gpu-{ty}", "tg128", gt, call=call), ty, nb, mem=0.0),
                 q(peer(f"cpu-moe-{ty}", 0, 128, cp, call=call), ty, nb),
                 q(tm(f"cpu-moe-{ty}", "tg128", ct, call=call), ty, nb, mem=mem),
                 q(tm(f"cpu-moe-{ty}", "tg128 x8", 999.0, call=call), ty, nb, mem=mem)]
    recs.append(tm("cpu-moe", "tg128", 1.0, call="c2"))  # no type: not in the table
    fq = os.path.join(TMP, "2026-11-27-h100-qtypes.jsonl")
    with open(fq, "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in recs)
    r = tables(fq)
    part = r.stdout.split("expert types")[1:2] or [""]
    qt = {row[0]: row for row in rows(part[0]) if row[0] != "experts"}
    check(set(qt) == set(speeds), f"expert types' rows {sorted(qt)}, want {sorted(speeds)}:\n{r.stdout}")
    _, _, _, _, ct4, _ = speeds["Q4_K"]
    for ty, (call, gp, gt, cp, ct, mem) in speeds.items():
        nb = b4 if ty == "Q4_K" else b2
        bound = mem * 1e9 / nb
        want = [ty, f"{nb / 1048576:.1f}", "tg128", f"{gp:,.1f}", f"{gt:,.1f}", f"{gt / gp:.2f}",
                f"{cp:,.1f}", f"{ct:,.1f}", f"{ct / cp:.2f}", f"{mem:.1f}", f"{bound:,.1f}",
                f"{100 * ct / bound:.0f}%", f"{100 * cp / bound:.0f}%", f"{ct / ct4:.2f}"]
        check(qt.get(ty) == want, f"expert types, {ty}: {qt.get(ty)}, want {want}")
    print(f"  tables.py: expert types' table over two calls as computed here "
          f"(IQ2_XXS / Q4_K --cpu-moe {qt.get('IQ2_XXS', ['?'] * 14)[13]})")

    # 3. record.py on real raw output
    machine = os.path.join(TMP, "machine.json")
    with open(machine, "w") as out:
        json.dump(MACHINE, out)
    res = os.path.join(TMP, "wrapped.jsonl")
    if os.path.exists(res):
        os.remove(res)
    raw_peer = json.dumps({"build_commit": "deadbee", "model_filename": "/tmp/m30.gguf",
                           "n_prompt": 16, "n_gen": 0, "n_depth": 0, "n_threads": 2,
                           "avg_ns": 1, "stddev_ns": 0, "avg_ts": 400.0, "stddev_ts": 3.5,
                           "samples_ts": [400.0]})
    model = os.path.join(TMP, "tiny.gguf")
    have_tm = os.path.exists(TIERMOE)
    if have_tm:
        if not os.path.exists(model):
            subprocess.run([TIERMOE, "mkmodel", "--preset", "tiny", "-q", "-o", model], check=True)
        cmd = [TIERMOE, "bench", "-m", model, "-p", "16", "-n", "0", "-r", "1", "-t", "2", "-o",
               "jsonl", "--no-membw"]
        raw_tm = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    else:  # what `tiermoe bench -o jsonl` prints, where this build has no binary
        cmd = ["tiermoe", "bench", "-p", "16", "-n", "0", "-t", "2", "-o", "jsonl"]
        raw_tm = json.dumps({"model": "qwen3moe 0.0B q4_K", "test": "pp16", "threads": 2,
                             "n_parallel": 1, "ts_mean": 600.0, "ts_stddev": 0.0}) + "\n"
    info = ["--info", "expert_type=IQ2_XXS", "--info", "expert_token_bytes=465567744",
            "--info", "x=1.5"]
    for eng, raw, c, env, inf in (("llama.cpp", raw_peer + "\n", ["llama-bench", "-p", "16", "-m", "a b"], "", []),
                                  ("tiermoe", raw_tm, cmd, "TIERMOE_X=1 TIERMOE_Y='a b'", info)):
        r = subprocess.run([sys.executable, RECORD, "wrap", "--out", res, "--engine", eng,
                            "--stage", "cpu", "--case", "cpu", "--model", "tiny", "--machine",
                            machine, "--commit", "abc123", "--call", "c9", "--env", env, *inf,
                            "--", *c],
                           input=raw, capture_output=True, text=True)
        check(r.returncode == 0 and "cpu" in r.stdout, f"record.py wrap {eng}: {r.stdout} {r.stderr}")
    r = subprocess.run([sys.executable, RECORD, "wrap", "--out", res, "--engine", "tiermoe",
                        "--stage", "cpu", "--case", "none", "--model", "tiny", "--machine", machine,
                        "--commit", "abc123", "--call", "c9", "--", "x"],
                       input="tiermoe bench: error\n", capture_output=True, text=True)
    check(r.returncode == 1, f"record.py wrap of no result: rc {r.returncode}, want 1")
    wrapped = [json.loads(l) for l in open(res)]
    check(len(wrapped) == 2, f"{len(wrapped)} records, want 2")
    if len(wrapped) == 2:
        wp, wt = wrapped
        check(wp["result"] == json.loads(raw_peer) and wt["result"] == json.loads(raw_tm.splitlines()[0]),
              "the raw record is not kept unchanged under 'result'")
        check(wt["env"] == {"TIERMOE_X": "1", "TIERMOE_Y": "a b"} and wp["cmd"] == "llama-bench -p 16 -m 'a b'"
              and wt["commit"] == "abc123" and wt["machine"] == MACHINE and wt["call"] == "c9",
              f"meta: {wt['env']} {wp['cmd']!r} {wt['commit']}")
        check("info" not in wp and wt.get("info") == {"expert_type": "IQ2_XXS",
                                                       "expert_token_bytes": 465567744, "x": 1.5},
              f"--info: {wp.get('info')} / {wt.get('info')}")
        r = tables(res)
        tr = [row for row in rows(r.stdout) if row[3] == "pp16"]
        want = f"{json.loads(raw_tm.splitlines()[0])['ts_mean'] / 400.0:.2f}"
        check(len(tr) == 1 and tr[0][6] == want, f"wrapped real output: {tr}, want ratio {want}")
    return finish("bench tables: ratios, pairing by call and rounds as computed here; record.py "
                  f"keeps raw output ({'real' if have_tm else 'fixed'} tiermoe bench output)")


if __name__ == "__main__":
    sys.exit(main())
