#!/usr/bin/env python3
"""`tiermoe calibrate` as a user drives it (no GPU here: the CPU parts).

- On the tiny model it prints the table (a row per tokens-per-expert point asked),
  writes a profile whose key is the model's expert shape (n_embd, n_ff, q4_K, bytes
  from q4_K's 144-byte blocks of 256) and whose CPU curve has the points asked,
  positive and non-decreasing; --quick measures fewer points and says so.
- Without --profile-out the profile goes to $XDG_CACHE_HOME/tiermoe/ (the path it
  prints), else ~/.cache/tiermoe/; --show prints a saved profile's table with the
  file's values.
- Bad input: unknown flags, missing or bad values, no -m: exit 2 naming the flag; a
  missing file or one that is not GGUF: exit 1 with a message, never a crash; an
  unwritable --profile-out: exit 1 naming the path.
"""
import json
import os
import re
import subprocess
import sys

from oracle_common import TIERMOE, TMP, check, finish  # noqa: E402


def tm(*args, env=None):
    return subprocess.run([TIERMOE, *args], capture_output=True, text=True, env=env)


def main():
    model = os.path.join(TMP, "calib.gguf")
    r = tm("mkmodel", "--preset", "tiny", "-q", "-o", model)
    check(r.returncode == 0, f"mkmodel: {r.stderr}")
    prof = os.path.join(TMP, "calib.json")

    r = tm("calibrate", "-m", model, "-t", "2", "--max-tokens", "32", "--profile-out", prof)
    check(r.returncode == 0, f"calibrate: rc {r.returncode}: {r.stderr}")
    rows = [int(m.group(1)) for m in re.finditer(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+", r.stdout, re.M)]
    check(rows == [1, 2, 4, 8, 16, 32], f"table rows {rows}:\n{r.stdout}")
    check(f"profile: {prof}" in r.stdout, f"no profile line:\n{r.stdout}")
    check("GPU: none" in r.stdout, f"no GPU line:\n{r.stdout}")
    with open(prof) as f:
        p = json.load(f)
    check(p["format"] == "tiermoe-calib" and p["version"] == 1 and p["quick"] is False, str(p)[:200])
    ex = p["key"]["expert"]
    check((ex["n_embd"], ex["n_ff"], ex["gate_type"], ex["down_type"]) == (256, 256, "q4_K", "q4_K"), str(ex))
    check(ex["bytes"] == 3 * 256 * (256 // 256 * 144), f"expert bytes {ex['bytes']}")
    check(p["key"]["threads"] == 2 and p["key"]["gpu"] == "" and "gpu" not in p, str(p["key"]))
    pts = p["cpu_expert_ns"]
    check([q["tokens"] for q in pts] == [1, 2, 4, 8, 16, 32], str(pts))
    ns = [q["ns"] for q in pts]
    check(all(x > 0 for x in ns) and all(b >= a for a, b in zip(ns, ns[1:])), f"curve {ns}")
    check(p["host"]["cpu_read_gbs"] > 0, str(p["host"]))

    r = tm("calibrate", "--show", prof)  # the saved profile's table, the same rows
    shown = [int(m.group(1)) for m in re.finditer(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+", r.stdout, re.M)]
    check(r.returncode == 0 and shown == [1, 2, 4, 8, 16, 32] and "expert: 256 x 256" in r.stdout,
          f"--show: rc {r.returncode}\n{r.stdout}{r.stderr}")
    us = [float(m.group(1)) for m in re.finditer(r"^\s+\d+\s+([\d.]+)\s", r.stdout, re.M)]
    check(all(abs(u - n / 1000) <= 0.051 for u, n in zip(us, ns)), f"--show us/expert {us} vs the file's {ns}")

    r = tm("calibrate", "-m", model, "-t", "1", "--quick", "--profile-out", prof)
    check(r.returncode == 0, f"calibrate --quick: {r.stderr}")
    with open(prof) as f:
        q = json.load(f)
    check(q["quick"] is True and q["host"]["cpu_read_gbs"] == 0 and len(q["cpu_expert_ns"]) >= 2,
          f"quick profile {str(q)[:300]}")
    check("; quick" in r.stdout, f"quick not said:\n{r.stdout}")

    # the cache directory
    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(TMP, "xdg"))
    r = tm("calibrate", "-m", model, "-t", "1", "--quick", env=env)
    m = re.search(r"^profile: (\S+) ", r.stdout, re.M)
    check(r.returncode == 0 and m, f"default path: rc {r.returncode}:\n{r.stdout}{r.stderr}")
    if m:
        path = m.group(1)
        check(path.startswith(os.path.join(TMP, "xdg", "tiermoe", "calib-")) and path.endswith(
            "--no-gpu--t1--256x256-q4-k-q4-k-q4-k.json") and os.path.isfile(path), path)

    # bad input
    for args, want in [
        (["--bogus"], "--bogus"),
        (["-m"], "-m"),
        (["-m", model, "-t", "0"], "-t"),
        (["-m", model, "-t", "x"], "-t"),
        (["-m", model, "--max-tokens", "0"], "--max-tokens"),
        (["-t", "2"], "-m FILE"),
        (["--show", prof, "-m", model], "--show"),
    ]:
        r = tm("calibrate", *args)
        check(r.returncode == 2 and want in r.stderr, f"{args}: rc {r.returncode}, {r.stderr!r}")
    r = tm("calibrate", "-m", os.path.join(TMP, "absent.gguf"))
    check(r.returncode == 1 and "absent.gguf" in r.stderr, f"missing file: {r.returncode} {r.stderr!r}")
    notgguf = os.path.join(TMP, "calib-not.gguf")
    with open(notgguf, "w") as f:
        f.write("hello")
    r = tm("calibrate", "-m", notgguf)
    check(r.returncode == 1 and "calib-not.gguf" in r.stderr, f"not GGUF: {r.returncode} {r.stderr!r}")
    bad_out = os.path.join(notgguf, "sub", "p.json")  # under a file: cannot be made
    r = tm("calibrate", "-m", model, "--quick", "--profile-out", bad_out)
    check(r.returncode == 1 and bad_out.split("/sub")[0] in r.stderr, f"unwritable: {r.returncode} {r.stderr!r}")
    r = tm("calibrate", "--show", notgguf)
    check(r.returncode == 1 and "not valid JSON" in r.stderr, f"--show of a bad file: {r.stderr!r}")
    r = tm("calibrate", "--help")
    check(r.returncode == 0 and "--profile-out" in r.stdout, "help")
    return finish("calibrate CLI: ok")


if __name__ == "__main__":
    sys.exit(main())
