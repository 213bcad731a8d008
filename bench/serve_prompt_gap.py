#!/usr/bin/env python3
"""A decoding stream's inter-token gaps while other requests' prompts go in (not CI;
docs/server.md, "Steps").

    python3 bench/serve_prompt_gap.py MODEL.gguf [--build build/release] [--prompts 1,3]
        [--prompt-tokens 2400] [--label NAME] -- SERVE FLAGS...

Starts `tiermoe serve --parallel 4` (plus the flags after `--`: give -b, -c, --max-tokens
3000) on a free
loopback port. For each count K in --prompts: one client streams a greedy completion
(ignore_eos, a short prompt); once it has 20 tokens, K clients at once send prompts of
--prompt-tokens / K words each (distinct, nothing reused) for one token. It reports, for
the time from their send to the last one's reply: the stream's inter-token gaps (max,
median, how many), its median gap before (decode steps alone), the prompts' wall time,
and the server's prompt steps (/metrics) in that time. One line per K and a RESULT line.
Standard library only.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))

WORDS = ("river stone light garden market winter engine paper silver forest harbor lantern "
         "meadow signal castle thunder mirror valley orchard canyon").split()


def post(base, body):
    return urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                  method="POST", headers={"Content-Type": "application/json"})


def stream(base, stamps, stop, err):
    """Stream until stop is set (or max_tokens: give -c and --max-tokens room)."""
    body = {"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0,
            "ignore_eos": True, "stream": True, "cache_prompt": False}
    try:
        with urllib.request.urlopen(post(base, body), timeout=3600) as r:
            for line in r:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    stamps.append(time.perf_counter())
                if stop.is_set():
                    return
    except Exception as e:  # noqa: BLE001 (reported by the main thread)
        err.append(e)


def prompt_client(base, i, n_words, out):
    words = " ".join(WORDS[(i * 7 + k * (i + 3)) % len(WORDS)] for k in range(n_words))
    body = {"prompt": words, "max_tokens": 1, "temperature": 0, "cache_prompt": False}
    with urllib.request.urlopen(post(base, body), timeout=3600) as r:
        r.read()
    out[i] = time.perf_counter()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--prompts", default="1,3")
    ap.add_argument("--prompt-tokens", type=int, default=2400)
    ap.add_argument("--label", default="serve")
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    os.environ.setdefault("TM_BIN_DIR", a.build)
    os.environ.setdefault("TM_TEST_TMP", "/tmp/serve_prompt_gap")
    os.makedirs(os.environ["TM_TEST_TMP"], exist_ok=True)
    from server_harness import Server  # noqa: E402 (after TM_BIN_DIR)

    srv = Server(a.model, "--quiet", "--parallel", "4", *flags,
                 binary=os.path.join(a.build, "tiermoe"), timeout=3600)

    def steps():
        _, body = srv.request("GET", "/metrics")
        return {l.split()[0]: float(l.split()[1]) for l in body.splitlines()
                if l.split() and l.split()[0].startswith("tiermoe_prompt_")}

    res = []
    try:
        for k in [int(x) for x in a.prompts.split(",")]:
            stamps, stop, out, err = [], threading.Event(), {}, []
            s = threading.Thread(target=stream, args=(srv.base, stamps, stop, err))
            s.start()
            while len(stamps) < 20:
                if err or not s.is_alive():
                    raise SystemExit(f"{a.label}: the stream failed: {err}")
                time.sleep(0.005)
            m0 = steps()
            t0 = time.perf_counter()
            ps = [threading.Thread(target=prompt_client, args=(srv.base, i, a.prompt_tokens // k, out))
                  for i in range(k)]
            for t in ps:
                t.start()
            for t in ps:
                t.join()
            t1 = max(out.values())
            m1 = steps()
            time.sleep(0.2)
            stop.set()
            s.join()
            before = [b - a_ for a_, b in zip(stamps, stamps[1:]) if b <= t0][-15:]
            # the gaps that overlap [t0, t1]: the first ends after t0, the last starts before t1
            gaps = [b - a_ for a_, b in zip(stamps, stamps[1:]) if b > t0 and a_ < t1]
            n_steps = m1.get("tiermoe_prompt_steps_total", 0) - m0.get("tiermoe_prompt_steps_total", 0)
            line = (f"{a.label}: {k} prompt(s) of {a.prompt_tokens // k} words: in {1e3 * (t1 - t0):.0f} ms"
                    f" ({n_steps:.0f} prompt steps); the stream's gaps meanwhile: max "
                    f"{1e3 * max(gaps):.1f} ms, median {1e3 * statistics.median(gaps):.1f} ms "
                    f"({len(gaps)} tokens); before: median {1e3 * statistics.median(before):.1f} ms")
            print(line, flush=True)
            res.append((k, t1 - t0, max(gaps), statistics.median(gaps)))
    finally:
        srv.stop()
    print(f"RESULT {a.label}: " + "; ".join(f"K={k}: prompts {1e3 * w:.0f} ms, gap max {1e3 * g:.1f} "
                                            f"median {1e3 * m:.1f} ms" for k, w, g, m in res))


if __name__ == "__main__":
    main()
