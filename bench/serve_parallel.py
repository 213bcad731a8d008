#!/usr/bin/env python3
"""Aggregate decode speed of `tiermoe serve --parallel P` at 1, 2, 4 ... streams (not CI;
scripts/device.sh parallel runs it).

    python3 bench/serve_parallel.py MODEL.gguf [--build build/release] [--streams 1,2,4,8]
        [--tokens 128] [--label NAME] -- SERVE FLAGS...

Starts `tiermoe serve --parallel MAX(streams)` (plus the flags after `--`) on a free
loopback port. For each stream count N, N clients at once each stream a greedy completion
of --tokens tokens (ignore_eos; distinct prompts of about 40 tokens, nothing reused). The
aggregate decode speed is all clients' generated tokens over the time from the first
client's first token to the last client's last one (the first prompt is left out, the
others, evaluated in turns with the first streams' steps, are in); "all decoding" counts
only the tokens that came while all N clients were decoding (after the last first token,
before the first client's end): the steady state of N streams. Also each client's own
decode speed. One line per N and a RESULT line. Standard library only (the GPU machine's Python).
"""
import argparse
import json
import os
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))

WORDS = ("river stone light garden market winter engine paper silver forest harbor lantern "
         "meadow signal castle thunder mirror valley orchard canyon").split()


def prompt(i):
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(40))


def client(base, i, n, out):
    body = json.dumps({"prompt": prompt(i), "max_tokens": n, "temperature": 0, "ignore_eos": True,
                       "stream": True, "cache_prompt": False,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    first = last = None
    toks = 0
    stamps = []  # arrival time of each chunk with text
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ch = json.loads(line[6:])
            now = time.perf_counter()
            if ch["choices"] and ch["choices"][0].get("text"):
                first = first or now
                stamps.append(now)
            last = now
            if ch.get("usage"):
                toks = ch["usage"]["completion_tokens"]
    out[i] = (first, last, toks, stamps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--label", default="serve")
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    os.environ.setdefault("TM_BIN_DIR", a.build)
    os.environ.setdefault("TM_TEST_TMP", "/tmp/serve_parallel")
    os.makedirs(os.environ["TM_TEST_TMP"], exist_ok=True)
    from server_harness import Server  # noqa: E402 (after TM_BIN_DIR)

    streams = [int(x) for x in a.streams.split(",")]
    srv = Server(a.model, "--quiet", "--parallel", str(max(streams)), *flags,
                 binary=os.path.join(a.build, "tiermoe"), timeout=3600)
    def counters():
        _, body = srv.request("GET", "/metrics")
        want = ("tiermoe_decode_steps_total", "tiermoe_decode_step_seconds_total")
        return {l.split()[0]: float(l.split()[1]) for l in body.splitlines()
                if l.split() and l.split()[0] in want}

    results = []
    try:
        client(srv.base, 99, 8, {})  # warm-up: first steps, graph captures
        for n in streams:
            out = {}
            ts = [threading.Thread(target=client, args=(srv.base, i, a.tokens, out)) for i in range(n)]
            c0 = counters()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if len(out) != n or any(v[0] is None for v in out.values()):
                raise SystemExit(f"{a.label}: {n} streams: a client got no tokens: {out}")
            c1 = counters()
            steps = c1["tiermoe_decode_steps_total"] - c0["tiermoe_decode_steps_total"]
            step_s = c1["tiermoe_decode_step_seconds_total"] - c0["tiermoe_decode_step_seconds_total"]
            total = sum(v[2] for v in out.values())
            span = max(v[1] for v in out.values()) - min(v[0] for v in out.values())
            agg = total / span
            # steady state: while all n clients decode (after the last first token, before the
            # first client ends), free of the other clients' prompts and of the ramps
            lo, hi = max(v[0] for v in out.values()), min(v[1] for v in out.values())
            inside = sum(sum(lo < t <= hi for t in v[3]) for v in out.values())
            steady = inside / (hi - lo) if hi > lo and inside else float("nan")
            each = [v[2] / (v[1] - v[0]) for v in out.values() if v[1] > v[0]]
            results.append((n, agg, steady))
            print(f"{a.label}: {n} streams: {total} tokens in {span:.2f} s = {agg:.1f} t/s aggregate "
                  f"({agg / results[0][1]:.2f}x of {streams[0]}); all {n} decoding: {steady:.1f} t/s "
                  f"({steady / results[0][2]:.2f}x); per stream {min(each):.1f}..{max(each):.1f} t/s; "
                  f"{steps:.0f} decode steps, {1e3 * step_s / max(steps, 1):.2f} ms each in the engine "
                  f"({100 * step_s / span:.0f}% of the span)", flush=True)
    finally:
        srv.stop()
    print(f"RESULT {a.label}: " + ", ".join(f"{n}={agg:.1f}" for n, agg, _ in results) +
          f" t/s; {results[-1][0]} vs {results[0][0]}: {results[-1][1] / results[0][1]:.2f}x; all decoding: " +
          ", ".join(f"{n}={st:.1f}" for n, _, st in results) +
          f" t/s, {results[-1][2] / results[0][2]:.2f}x")


if __name__ == "__main__":
    main()
