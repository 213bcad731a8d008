#!/usr/bin/env python3
"""`tiermoe serve` through the official openai client, and its other endpoints.

Against independent paths:
- greedy completions and chats equal `tiermoe run -p` / `run --chat` on the same
  model (the CLI tokenizes, templates, samples and decodes on its own path); a
  second chat turn reuses the cached prefix exactly as `run --chat` does (same
  tokens, fewer prompt tokens evaluated); seeded sampling equals `run -s`;
- streamed chunks add up to the unstreamed reply, the last carries finish_reason
  and usage, then `data: [DONE]`; stop strings cut where the reply first contains
  them (a property of the greedy text);
- /tokenize and /detokenize equal HF `tokenizers` on Qwen3's tokenizer.json;
- /moe-layer-perf is a valid learn file (checked here field by field as
  docs/trace-format.md says, and read by `tiermoe plan` / `report`, the C
  parser), and its token count grows by exactly what a request evaluated;
- /metrics parses with prometheus_client and counts what the replies say;
- errors: bad JSON, wrong types, huge numbers, invalid UTF-8, an over-long prompt,
  too many tokens, a too-large body, a bad API key: 4xx in OpenAI's error shape;
- a client that disconnects cancels its generation; SIGTERM ends the server
  (exit 0) while a stream runs.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

try:
    import openai
    from prometheus_client.parser import text_string_to_metric_families
    from tokenizers import Tokenizer
except ImportError:
    print("openai, prometheus_client or tokenizers not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import TIERMOE, TMP, check, finish  # noqa: E402
from server_harness import Server, error_shape, make_model, recv_until, wait_for  # noqa: E402

KEY = "test-key-123"
CTX = "1024"


def cli(model, *args, stdin=None):
    """Output bytes of `tiermoe run` (stdout) and its stderr."""
    p = subprocess.run([TIERMOE, "run", "-m", model, "-c", CTX, *args], input=stdin, capture_output=True)
    if p.returncode:
        raise SystemExit(f"tiermoe run {' '.join(args)}: {p.stderr.decode()}")
    return p.stdout, p.stderr.decode()


def text(b):
    """Bytes as the server sends them: invalid UTF-8 as U+FFFD."""
    return b.decode("utf-8", errors="replace")


def metrics(srv):
    status, body = srv.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def check_learn_file(j, n_layer, n_expert, k, what):
    """docs/trace-format.md, field by field."""
    ok = check(j.get("format") == "tiermoe-moe-layer-perf" and j.get("version") == 1, f"{what}: format/version")
    m = j.get("model", {})
    ok &= check((m.get("n_layer"), m.get("n_expert"), m.get("n_expert_used")) == (n_layer, n_expert, k),
                f"{what}: model shape {m}")
    layers = j.get("layers", [])
    ok &= check(len(layers) == n_layer and [L["layer"] for L in layers] == list(range(n_layer)),
                f"{what}: layers")
    for L in layers:
        ok &= check(len(L["experts"]) == n_expert and sum(L["experts"]) == L["expert_hits_total"]
                    == L["tokens"] * k, f"{what}: layer {L['layer']}: hits {sum(L['experts'])}, "
                    f"total {L['expert_hits_total']}, tokens {L['tokens']} x {k}")
        ok &= check(all(isinstance(v, int) and v >= 0 for key, v in L.items() if key.endswith(("_ns", "total"))),
                    f"{what}: negative or non-integer counters")
    ok &= check(layers and j["tokens"] == layers[0]["tokens"], f"{what}: tokens {j.get('tokens')}")
    return ok


def main():
    model, tok_json = make_model()
    hf = Tokenizer.from_file(tok_json)
    srv = Server(model, "--api-key", KEY, "-c", CTX, "--max-prompt", "200", "--max-tokens", "512",
                 "--max-body", "65536", "-n", "32")
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        c = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0, timeout=120)
        fresh = {"cache_prompt": False}  # evaluate the whole prompt, as a new `run` does

        # ---- models, health ----
        ms = c.models.list().data
        check(len(ms) == 1 and ms[0].id == "serve", f"/v1/models: {ms}")
        status, body = srv.request("GET", "/health")  # no key needed
        check(status == 200 and body == {"status": "ok"}, f"/health: {status} {body}")

        # ---- the command line: usage errors exit 2, a port in use 1 ----
        for args, code, words in ((["--parallel", "0"], 2, ["--parallel"]),
                                  (["--port", "70000"], 2, ["--port"]),
                                  (["--chat-template", "nope"], 2, ["--chat-template"]),
                                  (["--port", str(srv.port)], 1, ["cannot listen", str(srv.port)])):
            p = subprocess.run([TIERMOE, "serve", "-m", model, *args], capture_output=True, text=True, timeout=60)
            check(p.returncode == code and all(w in p.stderr for w in words),
                  f"serve {args}: exit {p.returncode}, want {code}: {p.stderr}")

        # ---- completions: greedy equals `tiermoe run -p` ----
        prompt = "The quick brown fox jumps over"
        r = c.completions.create(model="serve", prompt=prompt, max_tokens=24, temperature=0, extra_body=fresh)
        out, _ = cli(model, "-p", prompt, "-n", "24", "--temp", "0")
        want = text(out)[len(prompt):-1]  # run echoes the prompt and ends with a newline
        check(r.choices[0].text == want, f"completion {r.choices[0].text!r} != run -p {want!r}")
        ntok = r.usage.completion_tokens
        check(r.choices[0].finish_reason == ("length" if ntok == 24 else "stop") and r.usage.prompt_tokens ==
              len(hf.encode(prompt).ids) and r.usage.total_tokens == r.usage.prompt_tokens + ntok,
              f"completion usage {r.usage} finish {r.choices[0].finish_reason}")
        greedy = r.choices[0].text
        print(f"  completions: greedy equals run -p ({ntok} tokens, {r.choices[0].finish_reason})")

        # streamed: the chunks add up to the same text, the last has finish_reason; usage asked for
        # (stream_options.include_usage) comes in a chunk of its own with no choices, as OpenAI's
        chunks = list(c.completions.create(model="serve", prompt=prompt, max_tokens=24, temperature=0,
                                           stream=True, stream_options={"include_usage": True}, extra_body=fresh))
        usage, chunks = chunks[-1], chunks[:-1]
        check("".join(ch.choices[0].text for ch in chunks) == greedy, "streamed completion differs")
        check(chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason, f"last completion chunk {chunks[-1]}")
        check(usage.choices == [] and usage.usage and usage.usage.completion_tokens == ntok and
              usage.usage.prompt_tokens == r.usage.prompt_tokens, f"the usage chunk {usage}")
        check(all(ch.choices[0].finish_reason is None for ch in chunks[:-1]), "finish_reason before the end")

        # seeded sampling equals `run -s` (both start from the same defaults)
        r = c.completions.create(model="serve", prompt=prompt, max_tokens=24, temperature=0.8, seed=42,
                                 extra_body=fresh)
        out, _ = cli(model, "-p", prompt, "-n", "24", "--temp", "0.8", "-s", "42")
        check(r.choices[0].text == text(out)[len(prompt):-1], "seed 42 differs from run -s 42")
        print("  completions: streamed chunks add up; seeded sampling equals run -s")

        # stop strings: the reply ends where the greedy text first holds the stop string
        if len(greedy) >= 12:
            stop = greedy[6:9]
            cut = greedy[:greedy.find(stop)]
            r = c.completions.create(model="serve", prompt=prompt, max_tokens=24, temperature=0, stop=[stop, "zz-never-zz"],
                                     extra_body=fresh)
            check(r.choices[0].text == cut and r.choices[0].finish_reason == "stop",
                  f"stop {stop!r}: {r.choices[0].text!r} ({r.choices[0].finish_reason}), want {cut!r}")
            s = c.completions.create(model="serve", prompt=prompt, max_tokens=24, temperature=0, stop=stop,
                                     stream=True, extra_body=fresh)
            check("".join(ch.choices[0].text for ch in s) == cut, "streamed stop differs")
            print(f"  stop {stop!r}: cut at byte {len(cut.encode())} of the greedy text, streamed too")

        # ---- chat: greedy equals `run --chat`; a second turn reuses the prefix as run does ----
        turns = ["Hello there!", "What is 2+2?"]
        msgs = [{"role": "user", "content": turns[0]}]
        r1 = c.chat.completions.create(model="serve", messages=msgs, max_tokens=20, temperature=0, extra_body=fresh)
        a1 = r1.choices[0].message.content
        check(r1.choices[0].message.role == "assistant", "chat role")
        msgs += [{"role": "assistant", "content": a1}, {"role": "user", "content": turns[1]}]
        r2 = c.chat.completions.create(model="serve", messages=msgs, max_tokens=20, temperature=0)
        out, err = cli(model, "--chat", "-n", "20", "--temp", "0", stdin="\n".join(turns).encode() + b"\n")
        want = a1 + "\n" + r2.choices[0].message.content + "\n"
        check(text(out) == want, f"chat replies {text(out)!r} != served {want!r}")
        t2 = r2.model_extra.get("timings", {})
        check(t2.get("cache_n", 0) > 0 and t2["prompt_n"] + t2["cache_n"] == r2.usage.prompt_tokens,
              f"second turn did not reuse the cached prefix: {t2}, usage {r2.usage}")
        print(f"  chat: two turns equal run --chat; the second evaluated {t2.get('prompt_n')} of "
              f"{r2.usage.prompt_tokens} prompt tokens")

        # streamed chat: role first, content deltas, finish_reason last, the usage chunk, then [DONE]
        s = list(c.chat.completions.create(model="serve", messages=msgs[:1], max_tokens=20, temperature=0,
                                           stream=True, stream_options={"include_usage": True}, extra_body=fresh))
        usage, s = s[-1], s[:-1]
        check(s[0].choices[0].delta.role == "assistant", "first chunk has no role")
        check("".join(ch.choices[0].delta.content or "" for ch in s) == a1, "streamed chat differs")
        check(s[-1].choices[0].finish_reason == r1.choices[0].finish_reason and usage.choices == [] and
              usage.usage.completion_tokens == r1.usage.completion_tokens, f"last chat chunks {s[-1]} {usage}")
        s = list(c.chat.completions.create(model="serve", messages=msgs[:1], max_tokens=20, temperature=0,
                                           stream=True))
        check(s[-1].choices[0].finish_reason and all(ch.usage is None for ch in s),
              "usage streamed without stream_options.include_usage")
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        req = json.dumps({"messages": msgs[:1], "max_tokens": 4, "stream": True}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
                     KEY.encode() + b"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                     str(len(req)).encode() + b"\r\n\r\n" + req)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
        sock.close()
        check(b"text/event-stream" in raw and b"data: [DONE]\n\n" in raw and
              raw.count(b"chat.completion.chunk") >= 2, f"SSE framing: {raw[-200:]!r}")
        print("  chat: streamed deltas add up to the reply; SSE ends with data: [DONE]")

        # ---- tokenize / detokenize against HF tokenizers ----
        t = "Hello world's café 12345 日本語"
        status, body = srv.request("POST", "/tokenize", {"content": t}, auth)
        check(status == 200 and body["tokens"] == hf.encode(t, add_special_tokens=False).ids,
              f"/tokenize {body} != HF")
        status, pieces = srv.request("POST", "/tokenize", {"content": t, "with_pieces": True}, auth)
        check("".join(p["piece"] for p in pieces["tokens"]) == t, f"pieces {pieces}")
        status, body = srv.request("POST", "/detokenize", {"tokens": hf.encode(t).ids}, auth)
        check(status == 200 and body["content"] == t, f"/detokenize {body}")
        status, body = srv.request("POST", "/detokenize", {"tokens": [999999]}, auth)
        check(status == 400 and error_shape(body), f"/detokenize out of range: {status} {body}")
        print("  /tokenize and /detokenize equal HF tokenizers")

        # ---- /moe-layer-perf: a learn file whose counts grow by what a request evaluated ----
        status, a = srv.request("GET", "/moe-layer-perf", headers=auth)
        check(status == 200 and check_learn_file(a, 3, 16, 4, "GET /moe-layer-perf"), "perf before")
        m0 = metrics(srv)
        r = c.completions.create(model="serve", prompt="Counting tokens through the model", max_tokens=7,
                                 temperature=0, extra_body=fresh)
        m1 = metrics(srv)
        status, b = srv.request("GET", "/moe-layer-perf", headers=auth)
        tm = r.model_extra["timings"]
        decoded = tm["prompt_n"] + r.usage.completion_tokens - (r.choices[0].finish_reason == "length")
        check(check_learn_file(b, 3, 16, 4, "perf after") and b["tokens"] - a["tokens"] == decoded,
              f"perf tokens grew {b['tokens'] - a['tokens']}, the request decoded {decoded}")
        perf = os.path.join(TMP, "perf.json")
        with open(perf, "w") as f:
            json.dump(b, f)
        p = subprocess.run([TIERMOE, "plan", perf, "--budget", "1", "-m", model, "-o", os.path.join(TMP, "p.json")],
                           capture_output=True, text=True)
        check(p.returncode == 0, f"tiermoe plan on the served counters: {p.stderr}")
        p = subprocess.run([TIERMOE, "report", perf], capture_output=True, text=True)
        check(p.returncode == 0, f"tiermoe report on the served counters: {p.stderr}")
        status, snap = srv.request("POST", "/moe-layer-perf", {"action": "snapshot"}, auth)
        check(status == 200 and snap["tokens"] >= b["tokens"], "snapshot")
        status, z = srv.request("GET", "/moe-layer-perf", headers=auth)
        check(z["tokens"] == 0 and check_learn_file(z, 3, 16, 4, "after snapshot"), "snapshot did not reset")
        c.completions.create(model="serve", prompt="More", max_tokens=2, temperature=0)
        status, body = srv.request("POST", "/moe-layer-perf", {"action": "reset"}, auth)
        status, z = srv.request("GET", "/moe-layer-perf", headers=auth)
        check(z["tokens"] == 0, "reset did not zero the counters")
        status, body = srv.request("POST", "/moe-layer-perf", {"action": "explode"}, auth)
        check(status == 400 and error_shape(body), f"bad action: {status}")
        print(f"  /moe-layer-perf: a learn file (tiermoe plan and report read it); +{decoded} tokens for a request")

        # ---- /metrics counts what the replies said ----
        d = {k: metric(m1, k) - metric(m0, k) for k in ("tiermoe_tokens_predicted_total",
                                                        "tiermoe_prompt_tokens_total",
                                                        "tiermoe_prompt_tokens_evaluated_total")}
        check(d["tiermoe_tokens_predicted_total"] == r.usage.completion_tokens and
              d["tiermoe_prompt_tokens_total"] == r.usage.prompt_tokens and
              d["tiermoe_prompt_tokens_evaluated_total"] == tm["prompt_n"], f"metrics deltas {d}, usage {r.usage}")
        layers = sum(metric(m1, "tiermoe_tier_layers", **{"class": k}) for k in ("vram", "ram", "cached"))
        check(layers == 3 and metric(m1, "tiermoe_tier_slots_total", **{"class": "ram", "lane": "cold"}) > 0,
              f"tier metrics: {layers} layers")
        check(metric(m1, "tiermoe_requests_total", outcome="ok") >= 8, "requests_total")
        print("  /metrics: Prometheus text; token counters match the replies")

        # ---- /moe-hot-cache: no VRAM cache on a CPU context ----
        status, body = srv.request("POST", "/moe-hot-cache", {"format": "tiermoe-moe-plan"}, auth)
        check(status == 409 and error_shape(body) and "--moe-cache" in body["error"]["message"],
              f"/moe-hot-cache without a cache: {status} {body}")

        # ---- errors ----
        bad = openai.OpenAI(base_url=srv.base + "/v1", api_key="wrong", max_retries=0)
        try:
            bad.models.list()
            check(False, "a wrong API key was accepted")
        except openai.AuthenticationError as e:
            check(e.status_code == 401 and error_shape(e.response.json()), "401 shape")
        status, body = srv.request("GET", "/v1/models")
        check(status == 401 and error_shape(body), f"no API key: {status}")

        def expect(status_want, words, path="/v1/chat/completions", body=None, raw=None, method="POST"):
            status, got = srv.request(method, path, body, auth, raw=raw)
            msg = got["error"]["message"] if error_shape(got) else str(got)
            check(status == status_want and error_shape(got) and all(w in msg for w in words),
                  f"{path} {body if raw is None else raw[:40]}: {status} {got}, want {status_want} naming {words}")

        chat = {"messages": [{"role": "user", "content": "hi"}]}
        expect(400, ["not valid JSON"], raw=b'{"messages": [')
        expect(400, ["not valid JSON"], raw=b'{"messages": "\xff\xfe"}')  # invalid UTF-8
        expect(400, ["expected a JSON object"], raw=b'[1, 2]')
        expect(400, ["max_tokens", "integer"], body={**chat, "max_tokens": "x"})
        expect(400, ["max_tokens"], body={**chat, "max_tokens": 1e300})
        expect(400, ["not valid JSON"], raw=b'{"messages": [], "seed": 123456789012345678901234567890}')
        expect(400, ["max_tokens", "--max-tokens"], body={**chat, "max_tokens": 100000})
        expect(400, ["temperature"], body={**chat, "temperature": "hot"})
        expect(400, ["top_k"], body={**chat, "top_k": 1.5})
        expect(400, ["stream"], body={**chat, "stream": "yes"})
        expect(400, ["stop"], body={**chat, "stop": 5})
        expect(400, ["messages"], body={"messages": "hi"})
        expect(400, ["messages"], body={"messages": []})
        expect(400, ["messages[0].role"], body={"messages": [{"role": "tool", "content": "x"}]})
        expect(400, ["messages[0].content"], body={"messages": [{"role": "user", "content": 7}]})
        expect(400, ["n:"], body={**chat, "n": 2})
        expect(400, ["--max-prompt"], body={"messages": [{"role": "user", "content": "word " * 400}]})
        expect(400, ["--max-prompt"], path="/v1/completions", body={"prompt": "word " * 400})
        expect(400, ["prompt"], path="/v1/completions", body={"prompt": {"a": 1}})
        expect(400, ["prompt[1]"], path="/v1/completions", body={"prompt": [1, 99999999]})
        expect(413, ["--max-body"], body={**chat, "pad": "x" * 70000})
        expect(404, ["/v1/nothing"], path="/v1/nothing", method="GET")
        expect(405, ["GET"], method="GET")
        try:
            c.chat.completions.create(model="serve", messages=[{"role": "user", "content": "x"}], max_tokens="x")
            check(False, "openai client: bad max_tokens accepted")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and "max_tokens" in e.message, f"openai error {e}")
        status, body = srv.request("GET", "/health")
        check(status == 200, "the server died on bad requests")
        print("  errors: bad JSON, types, huge numbers, invalid UTF-8, limits, auth: 4xx in OpenAI's shape")

        # ---- a client that leaves cancels its generation ----
        m0 = metrics(srv)
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        req = json.dumps({"prompt": "Go on forever", "max_tokens": 500, "ignore_eos": True, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
                     b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(req)).encode() + b"\r\n\r\n" + req)
        got = recv_until(sock, lambda b: b.count(b"data: ") >= 3)
        sock.close()
        check(wait_for(lambda: metric(metrics(srv), "tiermoe_requests_total", outcome="cancelled") ==
                       metric(m0, "tiermoe_requests_total", outcome="cancelled") + 1), "disconnect did not cancel")
        gen = metric(metrics(srv), "tiermoe_tokens_predicted_total") - metric(m0, "tiermoe_tokens_predicted_total")
        check(0 < gen < 500, f"the cancelled request generated {gen} tokens")
        r = c.completions.create(model="serve", prompt="After", max_tokens=3, temperature=0)
        check(r.usage.completion_tokens >= 1, "no reply after a cancel")
        print(f"  a client that leaves is cancelled after {gen:.0f} of 500 tokens; the next request is served")

        # ---- SIGTERM while a stream runs: the stream ends, the server exits 0 ----
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
                     b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(req)).encode() + b"\r\n\r\n" + req)
        got = sock.recv(65536)
        t0 = time.time()
        rc = srv.stop(signal.SIGTERM)
        rest = b""
        try:
            while chunk := sock.recv(65536):
                rest += chunk
        except OSError:
            pass
        sock.close()
        check(rc == 0, f"SIGTERM: exit {rc}\n{srv.log()[-2000:]}")
        check(b"shutting down" in got + rest, "the stream did not say the server stops")
        print(f"  SIGTERM during a stream: exit {rc} after {time.time() - t0:.1f} s")
    finally:
        srv.stop(signal.SIGKILL if srv.p.poll() is None else signal.SIGTERM)
    check("ERROR: AddressSanitizer" not in srv.log() and "runtime error" not in srv.log(),
          f"sanitizer report:\n{srv.log()[-3000:]}")
    return finish("tiermoe serve agrees with run, HF tokenizers, the learn-file format and Prometheus")


if __name__ == "__main__":
    sys.exit(main())
