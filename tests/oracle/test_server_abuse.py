#!/usr/bin/env python3
"""`tiermoe serve` under abuse, on raw sockets (127.0.0.1 only; other clients come from
other loopback source addresses, 127.0.0.0/8 being all loopback on Linux):

- idle connections and clients trickling a byte at a time (headers or body) are cut at
  --read-timeout (a 408 with a JSON error when their headers had not come), however often
  they send; one address holds at most --max-connections-per-ip connections, and /health
  answers meanwhile;
- overload is always an HTTP answer: past --max-connections requests in flight, and with
  the queue full, 503 with Retry-After and a JSON error, /health still 200; with the
  defaults and --parallel 4, 72 streaming clients at once get 64 full streams and 8 503s,
  none a closed connection;
- a state-changing request (POST) from another site's page is refused: a Content-Type that
  is not JSON (415), a foreign Origin (403), a Host that is not loopback on a loopback
  server (403, DNS rebinding), and nothing changes (the counters, no generation); the
  server's own origin and one --cors-origin allows are accepted (with CORS headers, and a
  preflight answered);
- an unparseable Content-Length is one JSON 400 (one status line);
- a "model" that is not one of the served names is OpenAI's 404 model_not_found;
  --alias names, the file's base name and general.name are served, /v1/models lists them;
- the Authorization scheme is case-insensitive; streamed usage comes only when
  stream_options.include_usage asks, in its own last chunk with empty choices.
"""
import json
import os
import select
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import check, finish  # noqa: E402
from server_harness import (Server, connect, error_shape, make_model, parse_reply, read_all,  # noqa: E402
                            recv_until, wait_for)

TIMEOUT = 2  # --read-timeout of the first server
KEY = "abuse-key"


def metric(srv, name):
    _, text = srv.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.split()[-1])
    return total


SOURCES = (f"127.1.{i // 250}.{1 + i % 250}" for i in range(250 * 250))


def reply(raw):
    """(status, headers, body) of a raw reply, the body parsed when it is JSON."""
    st, hd, body = parse_reply(raw)
    try:
        return st, hd, json.loads(body)
    except ValueError:
        return st, hd, body


def http(port, method, path, body=b"", headers=(), src=None, timeout=20):
    """One request on a fresh connection (Connection: close), from a loopback address of its
    own unless src is given (a closed connection may count against the per-address cap for
    a moment); (status, headers, body, raw)."""
    src = src or next(SOURCES)
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close", *headers]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    with connect(port, src, timeout) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        raw = read_all(s)
    return (*reply(raw), raw)


def is_503(st, hd, body):
    return st == 503 and hd.get("retry-after", "").isdigit() and error_shape(body)


def cut_after(sock, t0, deadline=8):
    """(seconds from t0 until the server ended the connection, what it sent)."""
    sock.settimeout(deadline)
    got = read_all(sock)
    return time.time() - t0, got


def trickle(port, src, head, out, key):
    """Send head one byte every 0.2 s (never finishing); out[key] = (seconds until the server
    ended the connection, what it sent)."""
    s = connect(port, src)
    t0 = time.time()
    got = b""
    for i in range(60):
        try:
            s.sendall(head[i % len(head):i % len(head) + 1] if i < len(head) else b"a")
        except OSError:
            break
        r, _, _ = select.select([s], [], [], 0.2)
        if r:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            got += chunk
            if not chunk:
                break
    out[key] = (time.time() - t0, got)
    s.close()


def deadlines(srv):
    """Idle and trickling connections are cut at --read-timeout; the per-address cap."""
    port = srv.port
    t0 = time.time()
    idle = [connect(port, "127.0.0.2") for _ in range(3)]
    kept = connect(port, "127.0.4.1")  # one request answered, then idle between requests
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    first = recv_until(kept, lambda b: b.endswith(b"}"))
    t_kept = time.time()
    time.sleep(0.3)
    extra = connect(port, "127.0.0.2")
    dt, got = cut_after(extra, time.time(), 5)
    check(got == b"" and dt < TIMEOUT - 0.5, f"a 4th connection from one address (cap 3): {got[:80]!r} after {dt:.1f} s")
    status, body = srv.request("GET", "/health")
    check(status == 200, f"/health while one address holds its 3 connections: {status} {body}")
    out = {}
    ts = [threading.Thread(target=trickle, args=(port, "127.0.0.3", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                 b"X-Pad: ", out, "header")),
          threading.Thread(target=trickle, args=(port, "127.0.0.4", b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                 b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                                                 b'{"content":"', out, "body"))]
    for t in ts:
        t.start()
    for k, s in enumerate(idle):
        dt, got = cut_after(s, t0)
        st, hd, body = reply(got)
        check(TIMEOUT - 0.5 <= dt <= TIMEOUT + 2.5 and st == 408 and error_shape(body)
              and "--read-timeout" in body["error"]["message"],
              f"idle connection {k}: ended after {dt:.1f} s (--read-timeout {TIMEOUT}) with {got[:200]!r}")
        s.close()
    dt, got = cut_after(kept, t_kept)
    check(first.startswith(b"HTTP/1.1 200") and TIMEOUT - 0.5 <= dt <= TIMEOUT + 2.5 and got == b"",
          f"a kept-alive connection idle after its reply: ended after {dt:.1f} s with {got[:120]!r} (want nothing: "
          "a client may be sending its next request)")
    kept.close()
    for t in ts:
        t.join()
    for k in ("header", "body"):
        dt, got = out[k]
        # a byte every 0.2 s: never idle, so only a deadline on the whole request cuts it
        check(TIMEOUT - 0.5 <= dt <= TIMEOUT + 2.5 and (got == b"" or got.startswith(b"HTTP/1.1 408")),
              f"a client trickling its {k}: ended after {dt:.1f} s with {got[:120]!r}")
    n = metric(srv, "tiermoe_http_read_timeouts_total")
    check(n >= 6, f"tiermoe_http_read_timeouts_total {n}, want 6 or more")
    print(f"  3 idle connections cut after {TIMEOUT} s with a 408 (a kept-alive one silently), a 4th from their "
          "address refused at once, "
          f"/health answered; header and body trickles (a byte every 0.2 s) cut after "
          f"{out['header'][0]:.1f} and {out['body'][0]:.1f} s")


def overload(srv):
    """Past --max-connections (4) requests in flight, and with the queue (1) full: 503s."""
    port = srv.port
    # 4 requests whose bodies never come hold the 4 places (each from its own address) until
    # their read deadline; the checks must fall before it, so on a slow machine they are tried
    # again (at most 3 times)
    for attempt in range(3):
        holders = []
        for i in range(4):
            s = connect(port, f"127.0.{5 + attempt}.{1 + i}")
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 50\r\n\r\n".encode())
            holders.append(s)
        t0 = time.time()
        time.sleep(0.3)
        got = [http(port, "GET", "/v1/models"),
               http(port, "POST", "/v1/completions", b'{"prompt":"Hi","max_tokens":2}', ["Content-Type: application/json"]),
               http(port, "GET", "/metrics")]
        health = http(port, "GET", "/health")
        elapsed = time.time() - t0
        for s in holders:
            cut_after(s, t0)
            s.close()
        if elapsed < TIMEOUT - 0.2:
            break
    for st, hd, body, raw in got:
        check(is_503(st, hd, body) and "--max-connections" in body["error"]["message"],
              f"past --max-connections: {raw[:300]!r}")
    check(health[0] == 200 and health[2] == {"status": "ok"}, f"/health past --max-connections: {health[3][:200]!r}")
    check(elapsed < TIMEOUT - 0.2, f"the checks took {elapsed:.1f} s, past the holders' deadline, 3 times")
    st, _, body, raw = http(port, "POST", "/v1/completions", b'{"prompt":"Hi","max_tokens":2}',
                            ["Content-Type: application/json"])
    check(st == 200, f"a request once the holders were cut: {raw[:300]!r}")
    print("  4 requests in flight (--max-connections 4): GET, POST and /metrics 503 with Retry-After, "
          "/health 200; served again once they were cut")

    # the queue full: one request runs (-np 1), one waits (--max-queue 1), the next is a 503
    req = json.dumps({"prompt": "Stream for a while", "max_tokens": 300, "ignore_eos": True,
                      "stream": True}).encode()
    streams = []
    for i in range(2):
        # the holders' connections above are closed, but the server may count them a moment
        # longer (a loaded machine): a 503 for --max-connections then, so try again a while
        for _ in range(50):
            s = connect(port, f"127.0.0.{11 + i}", timeout=60)
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(req)}\r\n\r\n".encode() + req)
            if i:
                break
            first = recv_until(s, lambda b: b.count(b"data: ") >= 2)
            if first.count(b"data: ") >= 2 or not first.startswith(b"HTTP/1.1 503"):
                break
            s.close()
            time.sleep(0.2)
        streams.append(s)
        if i == 0:
            check(first.count(b"data: ") >= 2, f"the first stream ended early: {first[:400]!r}")
            if first.count(b"data: ") < 2:
                return
    queued = wait_for(lambda: metric(srv, "tiermoe_requests_deferred") == 1, timeout=20)
    st, hd, body, raw = http(port, "POST", "/v1/completions", b'{"prompt":"Hi","max_tokens":2}',
                             ["Content-Type: application/json"], src="127.0.0.13")
    check(queued and is_503(st, hd, body) and "--max-queue" in body["error"]["message"],
          f"the queue full: queued {queued}, {raw[:300]!r}")
    for s in streams:
        s.close()
    check(wait_for(lambda: metric(srv, "tiermoe_requests_processing") == 0 and
                   metric(srv, "tiermoe_requests_deferred") == 0, timeout=30), "the streams did not end")
    # the read deadline ends once a request is in: a reply may take longer
    t0 = time.time()
    st, _, body, raw = http(port, "POST", "/v1/completions", json.dumps(
        {"prompt": "Take your time", "max_tokens": 120, "ignore_eos": True, "stream": True}).encode(),
        ["Content-Type: application/json"], timeout=120)
    took = time.time() - t0
    check(st == 200 and b'"finish_reason":"length"' in body and body.endswith(b"data: [DONE]\n\n"),
          f"a stream of 120 tokens ({took:.1f} s, --read-timeout {TIMEOUT}): {body[-300:]!r}")
    print(f"  the queue full (-np 1, --max-queue 1): 503 with Retry-After; a {took:.1f} s stream is not cut")


def origins(srv):
    """State-changing requests from other sites' pages are refused and change nothing."""
    port = srv.port
    st, body = srv.request("POST", "/v1/completions", {"prompt": "Count these tokens", "max_tokens": 3})
    check(st == 200, f"a plain JSON POST: {st} {body}")
    tokens = srv.request("GET", "/moe-layer-perf")[1]["tokens"]
    reqs = metric(srv, "tiermoe_requests_total")
    reset = b'{"action":"reset"}'
    evil = "Origin: http://evil.example"
    for what, path, headers, status, word in (
            ("text/plain from another site", "/moe-layer-perf", ["Content-Type: text/plain", evil], 403, "Origin"),
            ("text/plain, no Origin", "/moe-layer-perf", ["Content-Type: text/plain"], 415, "Content-Type"),
            ("no Content-Type", "/moe-layer-perf", [], 415, "Content-Type"),
            ("a form", "/moe-layer-perf", ["Content-Type: application/x-www-form-urlencoded"], 415, "Content-Type"),
            ("JSON from another site", "/moe-layer-perf", ["Content-Type: application/json", evil], 403, "Origin"),
            ("Origin null", "/moe-layer-perf", ["Content-Type: application/json", "Origin: null"], 403, "Origin"),
            ("a completion from another site", "/v1/completions", ["Content-Type: text/plain", evil], 403, "Origin"),
            ("a plan from another site", "/moe-hot-cache", ["Content-Type: text/plain", evil], 403, "Origin")):
        body = reset if path == "/moe-layer-perf" else b'{"prompt":"Hi","max_tokens":2}'
        st, hd, b, raw = http(port, "POST", path, body, headers)
        check(st == status and error_shape(b) and word in b["error"]["message"],
              f"{what}: {raw[:300]!r}, want {status} naming {word}")
    # DNS rebinding: the page's own name resolves to 127.0.0.1; Origin and Host agree
    rebind = ["Host: evil.example:%d" % port, "Origin: http://evil.example:%d" % port, "Content-Type: application/json"]
    with connect(port) as s:
        s.sendall(f"POST /moe-layer-perf HTTP/1.1\r\n{rebind[0]}\r\n{rebind[1]}\r\n{rebind[2]}\r\nConnection: close\r\n"
                  f"Content-Length: {len(reset)}\r\n\r\n".encode() + reset)
        st, _, b = parse_reply(read_all(s))
    check(st == 403 and b"Host" in b, f"a rebound name as Host: {st} {b[:200]!r}")
    after = srv.request("GET", "/moe-layer-perf")[1]["tokens"]
    check(after == tokens and tokens > 0, f"the counters changed: {tokens} -> {after}")
    check(metric(srv, "tiermoe_requests_total") == reqs, "a refused request ran a generation")
    st, hd, b, raw = http(port, "GET", "/moe-layer-perf", headers=[evil])
    check(st == 200 and "access-control-allow-origin" not in hd, f"a cross-site GET: {raw[:200]!r}")
    # this server's own pages (also by the name localhost), and a page --cors-origin allows
    st, hd, b, raw = http(port, "POST", "/moe-layer-perf", reset,
                          ["Content-Type: Application/JSON; charset=utf-8", f"Origin: http://127.0.0.1:{port}"])
    check(st == 200 and srv.request("GET", "/moe-layer-perf")[1]["tokens"] == 0, f"a same-origin reset: {raw[:300]!r}")
    with connect(port) as s:
        s.sendall(f"POST /moe-layer-perf HTTP/1.1\r\nHost: localhost:{port}\r\nOrigin: http://localhost:{port}\r\n"
                  f"Content-Type: application/json\r\nConnection: close\r\nContent-Length: {len(reset)}\r\n\r\n".encode()
                  + reset)
        st, _, b = parse_reply(read_all(s))
    check(st == 200, f"Host and Origin localhost: {st} {b[:200]!r}")
    ui = "Origin: http://ui.example"
    st, hd, b, raw = http(port, "POST", "/moe-layer-perf", reset, ["Content-Type: application/json", ui])
    check(st == 200 and hd.get("access-control-allow-origin") == "http://ui.example",
          f"a POST from the --cors-origin page: {raw[:300]!r}")
    st, hd, b, raw = http(port, "OPTIONS", "/v1/chat/completions",
                          headers=[ui, "Access-Control-Request-Method: POST",
                                   "Access-Control-Request-Headers: content-type"])
    check(st == 204 and hd.get("access-control-allow-origin") == "http://ui.example" and
          "POST" in hd.get("access-control-allow-methods", "") and
          "content-type" in hd.get("access-control-allow-headers", "").lower(), f"preflight: {raw[:400]!r}")
    st, hd, b, raw = http(port, "OPTIONS", "/v1/chat/completions", headers=[evil])
    check(st == 403 and "access-control-allow-origin" not in hd, f"preflight from another site: {raw[:300]!r}")
    print("  POSTs from another site (text/plain, forms, foreign Origin, rebound Host) refused 403/415, counters "
          "and generations untouched; same-origin and --cors-origin accepted, preflight answered")


def content_length(srv):
    for cl, status in ((b"abc", 400), (b"-5", 400), (b"1x", 400), (b"99999999999999999999999", 413)):
        with connect(srv.port) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + cl + b"\r\n\r\n")
            raw = read_all(s)
        st, hd, body = reply(raw)
        check(raw.count(b"HTTP/1.") == 1 and st == status and hd.get("content-type", "").startswith("application/json")
              and error_shape(body) and "Content-Length" in body["error"]["message"],
              f"Content-Length: {cl!r}: {raw[:400]!r}")
    print("  unparseable Content-Length: one JSON 400 (413 past 2^64), one status line")


def models(srv):
    st, body = srv.request("GET", "/v1/models")
    entry = body["data"][0]
    names = {"m", "other", "abuse", "abuse.gguf", "tiermoe tiny qwen3moe"}
    check(st == 200 and entry["id"] == "m" and set(entry.get("aliases", [])) | {"m"} == names,
          f"/v1/models: {body}")
    for name in sorted(names) + [None]:
        req = {"prompt": "Hi", "max_tokens": 1, **({"model": name} if name else {})}
        st, body = srv.request("POST", "/v1/completions", req)
        check(st == 200 and body["model"] == "m", f"model {name!r}: {st} {body}")
    for name in ("gpt-4o", "", "M", "abuse.gguf ", "m,other"):
        for path, req in (("/v1/completions", {"prompt": "Hi"}),
                          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
            st, body = srv.request("POST", path, {**req, "model": name, "max_tokens": 1})
            e = body.get("error", {}) if isinstance(body, dict) else {}
            check(st == 404 and e.get("code") == "model_not_found" and e.get("param") == "model" and
                  e.get("type") == "invalid_request_error" and isinstance(e.get("message"), str),
                  f"{path} model {name!r}: {st} {body}")
    try:
        import openai
    except ImportError:
        openai = None
    if openai:
        c = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=60)
        try:
            c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
            check(False, "the openai client: gpt-4o answered")
        except openai.NotFoundError as e:
            check(e.code == "model_not_found", f"the openai client's error: {e}")
    print(f"  model names: {sorted(names)} served, gpt-4o and others 404 model_not_found")


def auth_and_usage(srv):
    port = srv.port
    for auth, status in ((f"Bearer {KEY}", 200), (f"bearer {KEY}", 200), (f"BEARER {KEY}", 200),
                         (f"Bearer   {KEY}", 200), (f"Basic {KEY}", 401), (f"Bearer{KEY}", 401),
                         ("bearer", 401), (f"bearer {KEY}x", 401), (None, 401)):
        st, _, body, raw = http(port, "GET", "/v1/models", headers=[f"Authorization: {auth}"] if auth else [])
        check(st == status, f"Authorization: {auth!r}: {raw[:200]!r}, want {status}")

    def stream(extra):
        req = json.dumps({"prompt": "The usage chunk", "max_tokens": 6, "temperature": 0, "stream": True,
                          **extra}).encode()
        st, _, body, raw = http(port, "POST", "/v1/completions", req,
                                ["Content-Type: application/json", f"Authorization: bearer {KEY}"])
        events = [e[6:] for e in body.decode().split("\n\n") if e.startswith("data: ")] if st == 200 else []
        return [json.loads(e) for e in events if e != "[DONE]"], events[-1:] == ["[DONE]"]
    _, ref = srv.request("POST", "/v1/completions", {"prompt": "The usage chunk", "max_tokens": 6, "temperature": 0},
                         headers={"Authorization": f"Bearer {KEY}"})
    plain, done = stream({})
    check(done and plain and all("usage" not in c for c in plain) and plain[-1]["choices"][0]["finish_reason"],
          f"a stream without include_usage: {plain}")
    for extra in ({"stream_options": {"include_usage": False}}, {"stream_options": None}):
        got, done = stream(extra)
        check(done and got and all("usage" not in c for c in got), f"{extra}: {got}")
    got, done = stream({"stream_options": {"include_usage": True}})
    last = got[-1] if got else {}
    check(done and last.get("choices") == [] and last.get("usage") == ref["usage"] and
          got[-2]["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"] and
          all(c.get("usage", 0) is None for c in got[:-1]),
          f"include_usage: {got[-2:]}, the reply's usage {ref['usage']}")
    print("  Authorization: the scheme in any case; usage only with include_usage, its own chunk, choices []")


def crowd(srv):
    """72 streaming clients at once with the defaults (--max-connections 64) and -np 4: 64 full
    streams and 8 503s with Retry-After, none a closed connection."""
    port = srv.port
    req = json.dumps({"prompt": "Crowd", "max_tokens": 2, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nConnection: close\r\nContent-Length: {len(req)}\r\n\r\n").encode()
    socks = [connect(port, timeout=60) for i in range(72)]  # all from 127.0.0.1, as local clients are
    for s in socks:
        s.sendall(head)  # the headers: each is a request in flight, its body still to come
    answered = set()
    end = time.time() + 8
    while len(answered) < 8 and time.time() < end:  # the 8 past the limit are answered at once
        r, _, _ = select.select([s for s in socks if s not in answered], [], [], 0.2)
        answered.update(r)
    for s in socks:
        if s not in answered:
            s.sendall(req)
    replies = [reply(read_all(s)) for s in socks]
    for s in socks:
        s.close()
    ok = sum(st == 200 and isinstance(body, bytes) and body.endswith(b"data: [DONE]\n\n") for st, _, body in replies)
    busy = sum(is_503(st, hd, body) for st, hd, body in replies)
    check(len(answered) == 8 and ok == 64 and busy == 8,
          f"72 clients: {ok} full streams, {busy} 503s, statuses {sorted(str(r[0]) for r in replies)}")
    print(f"  72 streaming clients, -np 4, default limits: {ok} full streams, {busy} 503 with Retry-After, "
          "no connection closed without an answer")


def main():
    model, _ = make_model("abuse.gguf")
    srv = Server(model, "-np", "1", "-c", "512", "--max-connections", "4", "--max-connections-per-ip", "3",
                 "--read-timeout", str(TIMEOUT), "--max-queue", "1", "--alias", "m,other", "--alias", "abuse",
                 "--cors-origin", "http://ui.example", "--quiet")
    try:
        deadlines(srv)
        overload(srv)
        origins(srv)
        content_length(srv)
        models(srv)
    finally:
        rc = srv.stop()
    check(rc == 0, f"exit {rc}\n{srv.log()[-2000:]}")
    srv2 = Server(model, "--api-key", KEY, "-np", "4", "-c", "1024", "--quiet")
    try:
        auth_and_usage(srv2)
        crowd(srv2)
    finally:
        rc2 = srv2.stop()
    check(rc2 == 0, f"exit {rc2}\n{srv2.log()[-2000:]}")
    for s in (srv, srv2):
        check("ERROR: AddressSanitizer" not in s.log() and "runtime error" not in s.log(),
              f"sanitizer report:\n{s.log()[-3000:]}")
    return finish("serve holds under abuse: deadlines, limits answered 503, cross-site POSTs refused, "
                  "model names, auth scheme, usage chunks")


if __name__ == "__main__":
    sys.exit(main())
