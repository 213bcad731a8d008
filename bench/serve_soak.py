#!/usr/bin/env python3
"""Soak `tiermoe serve` with concurrent streaming clients on loopback (not CI).

    python3 bench/serve_soak.py MODEL.gguf [--build build/release] [--clients 64]
        [--seconds 600] [--tokens 64] -- SERVE FLAGS...

Starts the server on a free loopback port, measures one client alone for a few requests,
then runs --clients threads, each sending streaming chat completions one after another
(--tokens each, greedy, ignore_eos) until --seconds have passed; every request is
bounded by a timeout, and the run stops by itself. Prints: requests, errors (any status
but 200, a stream without `data: [DONE]`, a connection error), the server's resident
memory at the start and the end (/proc/PID/status VmRSS), and aggregate tokens/s against
one client's. Traffic goes to 127.0.0.1 only. Standard library only.
"""
import argparse
import json
import os
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def stream_once(port, tokens, i, timeout=600):
    """One streaming chat request: (ok, tokens streamed)."""
    body = json.dumps({"messages": [{"role": "user", "content": f"Tell me a story, number {i}."}],
                       "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\n\r\n" + body)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return False, 0
    ok = data.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in data
    return ok, data.count(b'"content":') - 1  # the first chunk has the role and an empty content


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--tokens", type=int, default=64)
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    os.environ.setdefault("TM_BIN_DIR", a.build)
    os.environ.setdefault("TM_TEST_TMP", "/tmp/serve_soak")
    from server_harness import Server  # noqa: E402 (after TM_BIN_DIR)

    srv = Server(a.model, "--quiet", "--max-connections", str(a.clients + 8), "--max-connections-per-ip",
                 str(2 * (a.clients + 8)), "--max-queue",
                 str(a.clients + 8), *flags, binary=os.path.join(a.build, "tiermoe"), timeout=3600)
    try:
        t0 = time.time()
        one = [stream_once(srv.port, a.tokens, i) for i in range(3)]
        one_tps = sum(n for _, n in one) / (time.time() - t0)
        rss0 = rss_kib(srv.p.pid)
        print(f"one client: {one_tps:.1f} tokens/s; server RSS {rss0 / 1024:.1f} MiB", flush=True)
        stats = {"requests": 0, "errors": 0, "tokens": 0}
        lock = threading.Lock()
        end = time.time() + a.seconds

        def client(c):
            i = 0
            while time.time() < end:
                ok, n = stream_once(srv.port, a.tokens, c * 100000 + i)
                i += 1
                with lock:
                    stats["requests"] += 1
                    stats["errors"] += not ok
                    stats["tokens"] += max(n, 0)
        t1 = time.time()
        threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(a.seconds + 900)
        dt = time.time() - t1
        rss1 = rss_kib(srv.p.pid)
        print(f"{a.clients} clients for {dt:.0f} s: {stats['requests']} requests, {stats['errors']} errors, "
              f"{stats['tokens'] / dt:.1f} tokens/s aggregate ({stats['tokens'] / dt / one_tps:.2f}x one client); "
              f"server RSS {rss0 / 1024:.1f} -> {rss1 / 1024:.1f} MiB", flush=True)
    finally:
        rc = srv.stop()
    print(f"server exit {rc}")
    return 1 if rc != 0 or stats["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
