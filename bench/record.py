#!/usr/bin/env python3
"""Raw bench output with what it needs to be trusted later (scripts/device.sh calls it).

    python3 bench/record.py machine > machine.json
    python3 bench/record.py slug machine.json            # h100, h200, ... or cpu
    python3 bench/record.py wrap --out FILE --engine tiermoe|llama.cpp --stage S --case C
        --model NAME --model-file PATH --machine machine.json --commit C --call ID
        [--env 'VAR=V ...'] [--round N] [--info KEY=VALUE ...] -- COMMAND... < raw.jsonl

`wrap` reads the JSONL a bench printed (`tiermoe bench -o jsonl` or llama.cpp's
`llama-bench -o jsonl`: one object a test) and appends one line a test to FILE:
the object unchanged under "result", beside the engine, stage, case, model, the exact
command and environment, the commit, the date, the call and the machine, and what the
harness knows of the model file (--info KEY=VALUE, repeatable: "info", numbers as
numbers; e.g. expert_token_bytes, the expert bytes a token reads). It prints one
short line a test and exits 1 when the input held no result. Standard library only (the
GPU machine's Python).
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys

from tables import speed, test_name  # bench/tables.py: how a raw record is read


def machine():
    """The GPU(s), CPU, cores and RAM of this machine (what the numbers depend on)."""
    m = {"gpu": None, "gpu_count": 0, "gpu_mem_mib": None, "driver": None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30).stdout
        rows = [[f.strip() for f in l.split(",")] for l in out.splitlines() if l.strip()]
        if rows and len(rows[0]) == 3:
            m["gpu"], m["gpu_count"], m["driver"] = rows[0][0], len(rows), rows[0][2]
            m["gpu_mem_mib"] = int(float(rows[0][1])) if rows[0][1].replace(".", "").isdigit() else None
    except (OSError, subprocess.SubprocessError):
        pass
    cpu = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                ram = round(int(line.split()[1]) / 1048576, 1)
                break
    except OSError:
        pass
    m.update({"cpu": cpu, "cores": os.cpu_count(), "ram_gib": ram,
              "kernel": os.uname().release})
    return m


def slug(m):
    """A short machine name for file names: the GPU model (h100, h200, a100, l40s) or cpu."""
    g = m.get("gpu") or ""
    hit = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", g)
    if hit:
        return hit.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", g.lower()).strip("-")[:24] if g else "cpu"


def env_dict(s):
    out = {}
    for kv in shlex.split(s or ""):
        if "=" not in kv:
            raise SystemExit(f"record.py: --env: expected VAR=VALUE, got '{kv}'")
        k, v = kv.split("=", 1)
        out[k] = v
    return out


def info_dict(items):
    """--info KEY=VALUE words as a dict, numbers as numbers."""
    out = {}
    for kv in items or []:
        if "=" not in kv:
            raise SystemExit(f"record.py: --info: expected KEY=VALUE, got '{kv}'")
        k, v = kv.split("=", 1)
        for conv in (int, float):
            try:
                v = conv(v)
                break
            except ValueError:
                pass
        out[k] = v
    return out


def wrap(a):
    meta = json.load(open(a.machine))
    info = info_dict(a.info)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    recs = []
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            print(f"record.py: not JSON, kept out: {line[:120]}", file=sys.stderr)
            continue
        rec = {"engine": a.engine, "stage": a.stage, "case": a.case, "round": a.round,
               "model": a.model, "model_file": a.model_file, "env": env_dict(a.env),
               "cmd": shlex.join(cmd), "commit": a.commit, "date": date, "call": a.call,
               "machine": meta, "result": r}
        if info:
            rec["info"] = info
        recs.append(json.dumps(rec) + "\n")
        ts, sd = speed(a.engine, r)
        print(f"  {a.engine:9} {a.case:22} {test_name(a.engine, r):12} "
              f"{ts if ts is not None else '?':>10} t/s" + (f" ± {sd:.2f}" if sd else ""))
    if recs:  # no empty files for runs that measured nothing
        with open(a.out, "a") as out:
            out.writelines(recs)
    return 0 if recs else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("machine")
    s = sub.add_parser("slug")
    s.add_argument("machine_json")
    w = sub.add_parser("wrap")
    for k in ("out", "engine", "stage", "case", "model", "machine", "commit", "call"):
        w.add_argument("--" + k.replace("_", "-"), required=True)
    w.add_argument("--model-file", default="")
    w.add_argument("--env", default="")
    w.add_argument("--round", type=int, default=1)
    w.add_argument("--info", action="append", help="KEY=VALUE about the model file (repeatable)")
    w.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.what == "machine":
        print(json.dumps(machine()))
        return 0
    if a.what == "slug":
        print(slug(json.load(open(a.machine_json))))
        return 0
    if a.engine not in ("tiermoe", "llama.cpp"):
        raise SystemExit(f"record.py: --engine: expected tiermoe or llama.cpp, got '{a.engine}'")
    return wrap(a)


if __name__ == "__main__":
    sys.exit(main())
