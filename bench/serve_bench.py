#!/usr/bin/env python3
"""Decode and prompt speed through `tiermoe serve` (not CI; scripts/device.sh serve runs it).

    python3 bench/serve_bench.py MODEL.gguf [--build build/release] [--reqs 3] [--tokens 128]
        [--apply-plan] [--budget MIB] -- SERVE FLAGS...

Starts `tiermoe serve` on a free loopback port with the flags after `--`, sends --reqs
completions one after the other (the same prompt of 512 random-word tokens, no prefix
reuse: cache_prompt false; --tokens generated with ignore_eos, greedy) and prints the
server's own timings: prompt and decode tokens/s per request and their mean. With
--apply-plan it then reads the live counters (GET /moe-layer-perf), plans the cache with
`tiermoe plan` (--budget MiB, default: the cache's size), applies the plan (POST
/moe-hot-cache) and measures again. Standard library only (the GPU machine's Python).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))


def measure(srv, prompt, n, reqs, what):
    rows = []
    for i in range(reqs):
        status, r = srv.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                            "ignore_eos": True, "cache_prompt": False}, timeout=3600)
        if status != 200:
            raise SystemExit(f"{what}: request {i}: {status} {r}")
        t = r["timings"]
        rows.append((t["prompt_n"], t["prompt_per_second"], t["predicted_n"], t["predicted_per_second"]))
        print(f"  {what} #{i + 1}: prompt {t['prompt_n']} tokens {t['prompt_per_second']:.1f} t/s, "
              f"decode {t['predicted_n']} tokens {t['predicted_per_second']:.2f} t/s", flush=True)
    pp = sum(r[1] for r in rows) / len(rows)
    tg = sum(r[3] for r in rows) / len(rows)
    print(f"{what}: mean prompt {pp:.1f} t/s, decode {tg:.2f} t/s over {len(rows)} requests", flush=True)
    return pp, tg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--reqs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--apply-plan", action="store_true")
    ap.add_argument("--budget", type=float, default=0)
    ap.add_argument("--label", default="serve")
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    os.environ.setdefault("TM_BIN_DIR", a.build)
    os.environ.setdefault("TM_TEST_TMP", "/tmp/serve_bench")
    from server_harness import Server  # noqa: E402 (after TM_BIN_DIR)

    tm = os.path.join(a.build, "tiermoe")
    srv = Server(a.model, "--quiet", *flags, binary=tm, timeout=3600)
    try:
        words = " ".join(f"w{i % 97}" for i in range(400))
        status, tok = srv.request("POST", "/tokenize", {"content": words})
        prompt = tok["tokens"][:512]
        measure(srv, prompt, a.tokens, a.reqs, a.label)
        if a.apply_plan:
            status, cache = srv.request("GET", "/moe-hot-cache")
            if status != 200:
                raise SystemExit(f"--apply-plan: no cache: {status} {cache}")
            budget = a.budget or cache["cache_bytes"] / 2**20
            status, perf = srv.request("GET", "/moe-layer-perf")
            learn, plan = "/tmp/serve_bench_learn.json", "/tmp/serve_bench_plan.json"
            with open(learn, "w") as f:
                json.dump(perf, f)
            subprocess.run([tm, "plan", learn, "-m", a.model, "--budget", f"{budget:.3f}", "-o", plan], check=True)
            with open(plan) as f:
                body = json.load(f)
            t0 = time.time()
            status, r = srv.request("POST", "/moe-hot-cache", body, timeout=3600)
            if status != 200:
                raise SystemExit(f"POST /moe-hot-cache: {status} {r}")
            print(f"applied a plan of {budget:.0f} MiB from the live counters in {time.time() - t0:.2f} s: "
                  f"{r['changed']} slots changed", flush=True)
            measure(srv, prompt, a.tokens, a.reqs, a.label + " after the plan")
    finally:
        rc = srv.stop()
    if rc != 0:
        print(srv.log()[-3000:])
        raise SystemExit(f"serve exited {rc}")


if __name__ == "__main__":
    main()
