#!/usr/bin/env python3
"""Print the tables of bench/results/ (markdown), tiermoe next to llama.cpp.

    python3 bench/tables.py [FILE.jsonl|DIR ...] [--stage S] [--commands] [--wide]

Reads the records scripts/device.sh writes (bench/record.py: the raw output of
`tiermoe bench -o jsonl` or `llama-bench -o jsonl` under "result", with the engine,
stage, case, model, environment, exact command, commit, date, call and machine) from the
files named, or every *.jsonl of the folders named (default: bench/results/). A table a
file, call (one harness run) and stage; a row a case, model, environment and test. Where
both engines ran the same case, model and test at the same thread count in the same call,
the ratio column is tiermoe's t/s over llama.cpp's; where tiermoe ran with a VRAM cache, its
share of routed slots served from it follows. Repetitions of a case in a call (A/B rounds)
are averaged; the row then says how many and their range.

Records that carry the expert type of their file (scripts/device.sh qtypes: info
expert_type and expert_token_bytes, the routed experts' bytes a token reads) get one more
table a file, over all its calls: a row a type with one-sequence decode (tg) everything
on the GPU (cases gpu-T) and with the experts in RAM (cpu-moe-T) for both engines, the
RAM bound of --cpu-moe decode (tiermoe's probed CPU read bandwidth before the test, mem_gbs,
over the expert bytes a token), each engine's share of it, and tiermoe's --cpu-moe decode
over that of the Q4_K file. Standard library only.
"""
import argparse
import collections
import glob
import json
import os
import sys

ENGINES = ("llama.cpp", "tiermoe")
STEAL_MAX = 0.02  # the host's steal above which a row is marked (docs/executor.md)


def fmt(v):
    """t/s as the docs write them: 6,979 / 290.3."""
    if v is None:
        return ""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.1f}"


def test_name(engine, r):
    """The test a raw record measured, named as tiermoe's table does (pp512, tg128, tg64 x8)."""
    if engine == "llama.cpp":
        p, n, d = r.get("n_prompt", 0), r.get("n_gen", 0), r.get("n_depth", 0)
        t = f"pp{p}" if not n else (f"tg{n}" if not p else f"pp{p}+tg{n}")
        return t + (f" @ d{d}" if d else "")
    return r.get("test", "?")


def speed(engine, r):
    """(mean, stddev) t/s of a raw record."""
    if engine == "llama.cpp":
        return r.get("avg_ts"), r.get("stddev_ts")
    return r.get("ts_mean"), r.get("ts_stddev")


def threads(engine, r):
    return r.get("n_threads") if engine == "llama.cpp" else r.get("threads")


def env_str(env):
    return " ".join(f"{k}={v}" for k, v in sorted((env or {}).items()))


def load(paths):
    """Records by file, in the order read; bad lines are reported and skipped."""
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "*.jsonl"))) if os.path.isdir(p) else [p]
    out = collections.OrderedDict()
    for f in files:
        recs = []
        for i, line in enumerate(open(f), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if rec["engine"] not in ENGINES or not isinstance(rec["result"], dict):
                    raise ValueError(f"engine {rec['engine']!r}")
            except (ValueError, KeyError, TypeError) as e:
                print(f"tables.py: {f}:{i}: not a bench record ({e}), skipped", file=sys.stderr)
                continue
            recs.append(rec)
        out[f] = recs
    return out


def machine_line(m):
    if not m:
        return "machine unknown"
    gpu = "no GPU"
    if m.get("gpu"):
        gpu = m["gpu"] + (f" x{m['gpu_count']}" if (m.get("gpu_count") or 1) > 1 else "")
        if m.get("gpu_mem_mib"):
            gpu += f" ({m['gpu_mem_mib']:,} MiB, driver {m.get('driver')})"
    return f"{gpu}; {m.get('cpu')}, {m.get('cores')} cores, {m.get('ram_gib')} GiB RAM"


def cell(vals):
    """One engine's cell from the (mean, sd) of each repetition of the case."""
    if not vals:
        return "", None
    means = [v[0] for v in vals if v[0] is not None]
    if not means:
        return "?", None
    mean = sum(means) / len(means)
    if len(means) == 1:
        sd = vals[0][1]
        return fmt(mean) + (f" ± {fmt(sd)}" if sd else ""), mean
    return f"{fmt(mean)} ({len(means)} runs: {fmt(min(means))}-{fmt(max(means))})", mean


def table_head(test_col, show_env, show_hits):
    """A table's header and rule lines: text columns, then the numbers right-aligned."""
    text = ["case", "model"] + (["tiermoe env"] if show_env else []) + [test_col]
    nums = ["llama.cpp t/s", "tiermoe t/s", "tiermoe / llama.cpp"] + \
        (["VRAM cache hit"] if show_hits else [])
    return ["| " + " | ".join(text + nums) + " |",
            "| " + " | ".join(["---"] * len(text) + ["---:"] * len(nums)) + " |"]


def wide_table(rows, hits, show_env, show_threads):
    """The rows of one case, model and thread count side by side, as the docs' tables:
    | case | llama.cpp pp512 / tg128 | tiermoe pp512 / tg128 | ratios |."""
    groups = collections.OrderedDict()
    for key, by in rows.items():
        case, model, t, n_thr = key
        groups.setdefault((case, model, n_thr), []).append((key, t, by))
    lines = table_head("tests", show_env, bool(hits))
    for (case, model, n_thr), tests in groups.items():
        envs = []
        for _, _, by in tests:
            envs += [e for e in by["tiermoe"] if e not in envs]
        for env in envs or [""]:
            peer, tier, ratio, hit = [], [], [], []
            for key, t, by in tests:
                _, pm = cell([v for vs in by["llama.cpp"].values() for v in vs])
                _, tm = cell(by["tiermoe"].get(env, []))
                peer.append(fmt(pm) or "-")
                tier.append(fmt(tm) or "-")
                ratio.append(f"{tm / pm:.2f}" if tm is not None and pm else "-")
                h = hits.get((key, env))
                hit.append(f"{100 * sum(h) / len(h):.1f}%" if h else "-")
            label = " / ".join(t for _, t, _ in tests) + (f" (-t {n_thr})" if show_threads else "")
            lines.append("| " + " | ".join(
                [case, model] + ([env] if show_env else []) +
                [label, " / ".join(peer), " / ".join(tier), " / ".join(ratio)] +
                ([" / ".join(hit)] if hits else [])) + " |")
    return lines


def stage_table(recs, commands, wide=False):
    """The markdown lines of one stage of one call."""
    thread_counts = {threads(r["engine"], r["result"]) for r in recs}
    # (case, model, test, threads) -> engine -> env -> [(mean, sd)]
    rows = collections.OrderedDict()
    hits = collections.defaultdict(list)  # (key, env) -> tiermoe's VRAM cache hit shares
    stolen = collections.OrderedDict()  # (case, test, env) -> the host's steal above 2%
    for r in recs:
        res, eng = r["result"], r["engine"]
        t = test_name(eng, res)
        n_thr = threads(eng, res)
        key = (r.get("case", "?"), r.get("model", "?"), t, n_thr)
        env = env_str(r.get("env"))
        rows.setdefault(key, {e: collections.OrderedDict() for e in ENGINES})
        rows[key][eng].setdefault(env, []).append(speed(eng, res))
        if eng == "tiermoe" and res.get("vram_cache_hit") is not None:
            hits[(key, env)].append(res["vram_cache_hit"])
        if eng == "tiermoe" and (res.get("host_steal") or 0) > STEAL_MAX:
            k = (key[0], t, env)
            stolen[k] = max(stolen.get(k, 0), res["host_steal"])
    show_env = any(env for v in rows.values() for env in v["tiermoe"] if env)
    lines = table_head("test", show_env, bool(hits))
    for key, by in rows.items():
        case, model, t, n_thr = key
        peer_vals = [v for vs in by["llama.cpp"].values() for v in vs]
        pc, pm = cell(peer_vals)
        envs = list(by["tiermoe"].items()) or [("", [])]
        for env, vals in envs:
            tc, tm = cell(vals)
            ratio = f"{tm / pm:.2f}" if tm is not None and pm else ""
            label = t + (f" (-t {n_thr})" if len(thread_counts) > 1 else "")
            h = hits.get((key, env))
            lines.append("| " + " | ".join([case, model] + ([env] if show_env else []) +
                                           [label, pc, tc, ratio] +
                                           ([f"{100 * sum(h) / len(h):.1f}%" if h else ""]
                                            if hits else [])) + " |")
    if wide:
        lines = wide_table(rows, hits, show_env, len(thread_counts) > 1)
    if stolen:  # the host ran others on the CPUs: the CPU lane's numbers move more than any flag
        lines.append("")
        lines.append(f"The host took more than {100 * STEAL_MAX:.0f}% of the CPU time in (not a "
                     "comparison there): " + ", ".join(
                         f"{c} {t}{' ' + e if e else ''} {100 * s:.1f}%"
                         for (c, t, e), s in stolen.items()) + ".")
    if commands:
        lines.append("")
        seen = set()
        for r in recs:
            c = (env_str(r.get("env")) + " " + r.get("cmd", "")).strip()
            if c not in seen:
                seen.add(c)
                lines.append(f"- {r['engine']} {r.get('case')}: `{c}`")
    return lines


def qtypes_table(recs):
    """The expert types' table (see the module's help), or [] without such records."""
    by = collections.OrderedDict()  # type -> what its records measured
    for r in recs:
        info, res, eng = r.get("info") or {}, r["result"], r["engine"]
        ty, t = info.get("expert_type"), test_name(r["engine"], r["result"])
        if not ty or not t.startswith("tg") or " " in t:  # one-sequence decode only
            continue
        where = "cpu-moe" if r.get("case", "").startswith("cpu-moe") else "gpu"
        d = by.setdefault(ty, {"ts": collections.defaultdict(list), "mem": [], "bytes": None,
                               "test": t})
        mean = speed(eng, res)[0]
        if t != d["test"]:  # one decode length a type (the first seen)
            continue
        if mean is not None:
            d["ts"][(eng, where)].append(mean)
        d["bytes"] = info.get("expert_token_bytes") or d["bytes"]
        if eng == "tiermoe" and where == "cpu-moe" and res.get("mem_gbs"):
            d["mem"].append(res["mem_gbs"])
    if not by:
        return []
    avg = lambda v: sum(v) / len(v) if v else None
    ratio = lambda a, b: f"{a / b:.2f}" if a is not None and b else "-"
    share = lambda a, b: f"{100 * a / b:.0f}%" if a is not None and b else "-"
    base = by.get("Q4_K") or by.get("q4_K")
    base_cpu = avg(base["ts"][("tiermoe", "cpu-moe")]) if base else None
    lines = ["| experts | MiB a token | test | GPU llama.cpp | GPU tiermoe | GPU tiermoe / llama.cpp "
             "| --cpu-moe llama.cpp | --cpu-moe tiermoe | --cpu-moe tiermoe / llama.cpp | RAM GB/s "
             "| RAM bound t/s | tiermoe of bound | llama.cpp of bound | tiermoe / Q4_K's --cpu-moe |",
             "| --- | ---: | --- |" + " ---: |" * 11]
    for ty, d in by.items():
        g_p, g_t = avg(d["ts"][("llama.cpp", "gpu")]), avg(d["ts"][("tiermoe", "gpu")])
        c_p, c_t = avg(d["ts"][("llama.cpp", "cpu-moe")]), avg(d["ts"][("tiermoe", "cpu-moe")])
        mem = avg(d["mem"])
        bound = mem * 1e9 / d["bytes"] if mem and d["bytes"] else None
        lines.append("| " + " | ".join([
            ty, f"{d['bytes'] / 1048576:.1f}" if d["bytes"] else "-", d["test"],
            fmt(g_p) or "-", fmt(g_t) or "-", ratio(g_t, g_p), fmt(c_p) or "-", fmt(c_t) or "-",
            ratio(c_t, c_p), f"{mem:.1f}" if mem else "-", fmt(bound) or "-", share(c_t, bound),
            share(c_p, bound), ratio(c_t, base_cpu)]) + " |")
    return lines


def tables(by_file, stage=None, commands=False, wide=False):
    out = []
    for f, recs in by_file.items():
        calls = collections.OrderedDict()
        for r in recs:
            if stage and r.get("stage") != stage:
                continue
            calls.setdefault(r.get("call", "?"), []).append(r)
        for call, crecs in calls.items():
            first = crecs[0]
            commits = sorted({r.get("commit", "?") for r in crecs})
            peer_builds = sorted({str(r["result"].get("build_commit")) for r in crecs
                                  if r["engine"] == "llama.cpp" and r["result"].get("build_commit")})
            out.append(f"## {os.path.basename(f)}")
            out.append("")
            out.append(f"{machine_line(first.get('machine'))}. Call {call}; tiermoe commit "
                       f"{', '.join(commits)}" +
                       (f"; llama.cpp build {', '.join(peer_builds)}" if peer_builds else "") + ".")
            stages = collections.OrderedDict()
            for r in crecs:
                stages.setdefault(r.get("stage", "?"), []).append(r)
            for s, srecs in stages.items():
                out += ["", f"### {s}", ""] + stage_table(srecs, commands, wide)
            out.append("")
        qt = qtypes_table([r for r in recs if not stage or r.get("stage") == stage])
        if qt:
            out += [f"### {os.path.basename(f)}: expert types (every call of the file; the "
                    "RAM bound: tiermoe's probed read GB/s over the expert bytes a token)", ""]
            out += qt + [""]
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", default=[os.path.join(here, "results")])
    ap.add_argument("--stage", help="only this stage's tables")
    ap.add_argument("--commands", action="store_true", help="the exact command of every case")
    ap.add_argument("--wide", action="store_true",
                    help="a case's tests on one row (pp512 / tg128), as the docs' tables")
    a = ap.parse_args()
    by_file = load(a.paths)
    if not any(by_file.values()):
        print("tables.py: no records in " + " ".join(a.paths), file=sys.stderr)
        return 1
    print("\n".join(tables(by_file, a.stage, a.commands, a.wide)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
