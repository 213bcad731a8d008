#!/usr/bin/env python3
"""`tiermoe serve` never answers 5xx and never crashes, whatever it is sent.

1. schemathesis (property-based, offline) generates requests from docs/openapi.yaml,
   valid and invalid, for every operation, and checks every answer: no server error,
   a documented status code and content type, the documented response shape, and
   invalid requests refused (4xx). Not checked: that every schema-valid request is
   accepted (the server's limits, the vocabulary's size and jansson's refusal of NUL
   in object keys are not in the schema).
2. A loop of malformed requests on raw sockets: broken HTTP, bodies shorter or longer
   than their Content-Length, chunked bodies, invalid UTF-8, lone surrogates, deep
   nesting, huge and odd numbers, NUL bytes, long and many stop strings, and clients
   at once; each answer is 2xx/4xx (or a closed connection for broken HTTP).
Then /health is still ok, SIGTERM exits 0, and the sanitizers reported nothing.
Bounded: schemathesis runs a fixed number of examples per operation, the loop a fixed
list, the server generates at most 2 tokens a request.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

try:
    import schemathesis  # noqa: F401
except ImportError:
    print("schemathesis not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import HERE, TMP, check, finish  # noqa: E402
from server_harness import Server, make_model  # noqa: E402

KEY = "fuzz-key"
SPEC = os.path.join(HERE, "..", "..", "docs", "openapi.yaml")


def status_of(reply):
    """HTTP status of a raw reply (None when the connection closed without one)."""
    if not reply.startswith(b"HTTP/1."):
        return None
    return int(reply.split(b" ", 2)[1])


def post(path, body, extra=b""):
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer " +
            KEY.encode() + b"\r\nContent-Type: application/json\r\n" + extra + b"Content-Length: " +
            str(len(body)).encode() + b"\r\n\r\n" + body)


def malformed(srv):
    chat = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,'
    cases = {
        "garbage request line": b"\x00\xff\xfe GARBAGE\r\n\r\n",
        "HTTP/9": b"GET /health HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
        "no Host": b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n",
        "huge header": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n",
        "bad Content-Length": b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
        "Content-Length overflow": b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                                   b"99999999999999999999999\r\n\r\n",
        "body longer than declared": post("/v1/completions", b'{"prompt":"a","max_tokens":1}')[:-3] +
                                     b'1}  trailing junk',
        "chunked body": b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer " +
                        KEY.encode() + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"con\r\n" +
                        b"e\r\ntent\":\"hello\"}\r\n0\r\n\r\n",
        "bad chunk size": b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nTransfer-Encoding: "
                          b"chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        "empty body": post("/v1/chat/completions", b""),
        "NUL in body": post("/v1/chat/completions", b'{"messages":\x00[]}'),
        "invalid UTF-8": post("/v1/chat/completions", b'{"messages":[{"role":"user","content":"\xc3\x28\xa0\xa1"}]}'),
        "overlong UTF-8": post("/tokenize", b'{"content":"\xc0\xaf\xe0\x80\xaf"}'),
        "lone surrogate": post("/tokenize", b'{"content":"\\ud800x"}'),
        "NUL escape in content": post("/v1/chat/completions", chat + b'"stop":"a"}'.replace(b'"a"', b'"a\\u0000b"')),
        "NUL escape in message": post("/v1/chat/completions",
                                      b'{"messages":[{"role":"user","content":"a\\u0000b"}]}'),
        "NUL in key": post("/v1/chat/completions", b'{"mess\\u0000ages":[]}'),
        "deep nesting": post("/v1/chat/completions", b"[" * 60000 + b"]" * 60000),
        "deep object": post("/tokenize", b'{"content":"x","a":' + b'{"a":' * 3000 + b"1" + b"}" * 3001),
        "1e999": post("/v1/chat/completions", chat + b'"temperature":1e999}'),
        "-0 tokens": post("/v1/chat/completions", chat.replace(b'"max_tokens":2', b'"max_tokens":-0') + b'"n":1}'),
        "2^63": post("/v1/chat/completions", chat + b'"seed":9223372036854775808}'),
        "-2^63": post("/v1/chat/completions", chat + b'"seed":-9223372036854775808}'),
        "tiny float": post("/v1/chat/completions", chat + b'"top_p":1e-400}'),
        "NaN": post("/v1/chat/completions", chat + b'"temperature":NaN}'),
        "long stop": post("/v1/chat/completions", chat + b'"stop":"' + b"s" * 300 + b'"}'),
        "many stops": post("/v1/chat/completions", chat + b'"stop":' + json.dumps(["x"] * 1000).encode() + b"}"),
        "empty stop": post("/v1/chat/completions", chat + b'"stop":[""]}'),
        "many messages": post("/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "w"}] * 3000}).encode()),
        "image part": post("/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}).encode()),
        "tools": post("/v1/chat/completions", chat + b'"tools":[{"type":"function"}]}'),
        "prompt ids out of range": post("/v1/completions", b'{"prompt":[-1, 5]}'),
        "detokenize floats": post("/detokenize", b'{"tokens":[1.5, 2]}'),
        "detokenize huge": post("/detokenize", b'{"tokens":[99999999999999999999]}'),
        "perf bad action": post("/moe-layer-perf", b'{"action":["reset"]}'),
        "plan garbage": post("/moe-hot-cache", b'{"format":"tiermoe-moe-plan","version":1}'),
        "wrong key": post("/v1/models", b"").replace(KEY.encode(), b"nope"),
        "HEAD health": b"HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        "OPTIONS": b"OPTIONS /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        "path traversal": b"GET /../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    }
    statuses = {}
    t0 = time.time()
    for name, data in cases.items():
        t1 = time.time()
        # a request line that never ends: close our side so the server sees the end
        st = status_of(srv.raw(data, timeout=5, half_close=name == "garbage request line"))
        statuses[name] = st
        if time.time() - t1 > 1:
            print(f"    {name}: {time.time() - t1:.1f} s")
        # 505: libmicrohttpd's answer to an HTTP version it does not speak (RFC 9110)
        check(st is None or st < 500 or (name == "HTTP/9" and st == 505), f"{name}: status {st}")
    answered = sum(st is not None for st in statuses.values())
    check(statuses["chunked body"] == 200, f"a chunked body was not read: {statuses['chunked body']}")
    check(statuses["invalid UTF-8"] == 400 and statuses["deep nesting"] == 400 and statuses["1e999"] == 400 and
          statuses["NaN"] == 400 and statuses["2^63"] == 400 and statuses["-2^63"] == 200,
          f"statuses {statuses}")
    print(f"  {len(cases)} malformed requests: {answered} answered 2xx/4xx, "
          f"{len(cases) - answered} connections closed by the HTTP layer, none 5xx")

    # clients at once: every reply 2xx/4xx, the queue takes them in turn
    bodies = [post("/v1/completions", b'{"prompt":"Hi","max_tokens":2}'),
              post("/v1/chat/completions", chat + b'"stream":true}'),
              post("/v1/chat/completions", b'{"messages": 5}'),
              post("/tokenize", b'{"content":"abc"}'),
              b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\n\r\n"]
    seen, lock = [], threading.Lock()

    def client(i):
        for k in range(6):
            st = status_of(srv.raw(bodies[(i + k) % len(bodies)], timeout=60))
            with lock:
                seen.append(st)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(len(seen) == 48 and all(st is not None and st < 500 for st in seen), f"concurrent statuses {seen}")
    print(f"  8 clients x 6 requests at once: statuses {sorted(set(seen))}")


def main():
    model, _ = make_model("fuzz.gguf")
    srv = Server(model, "--api-key", KEY, "-c", "128", "--max-tokens", "2", "--max-prompt", "100",
                 "--max-body", "1048576", "--quiet")
    try:
        malformed(srv)
        st = os.path.join(os.path.dirname(sys.executable), "schemathesis")
        p = subprocess.run([st, "run", SPEC, "--url", srv.base, "--checks", "all", "--exclude-checks",
                            "positive_data_acceptance", "-H", f"Authorization: Bearer {KEY}", "--max-examples", "5",
                            "--seed", "1", "--no-color", "--generation-database", "none", "--workers", "1"],
                           capture_output=True, text=True, cwd=TMP, timeout=600)
        summary = [line for line in p.stdout.splitlines() if "generated" in line or "passed" in line
                   or "failures" in line]
        check(p.returncode == 0, f"schemathesis found failures:\n{p.stdout[-6000:]}\n{p.stderr[-2000:]}")
        print("  schemathesis over docs/openapi.yaml: " + "; ".join(s.strip(" =") for s in summary[-2:]))
        status, body = srv.request("GET", "/health")
        check(status == 200, f"/health after fuzzing: {status}")
    finally:
        rc = srv.stop(signal.SIGTERM)
    check(rc == 0, f"exit {rc}\n{srv.log()[-3000:]}")
    check("ERROR: AddressSanitizer" not in srv.log() and "runtime error" not in srv.log(),
          f"sanitizer report:\n{srv.log()[-3000:]}")
    return finish("no 5xx, no crash: schemathesis and malformed requests")


if __name__ == "__main__":
    sys.exit(main())
