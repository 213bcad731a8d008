#!/usr/bin/env python3
"""The dashboard (GET /) in a real headless Chromium (Debian's), on a server with a VRAM
cache (the CLI linked with the mock CUDA backend, as test_server_cache.py):

- the page loads and fills in from the server: the model's id, "live", one cache row per
  cached layer with the experts /moe-hot-cache lists, the heatmap sized layers x experts;
- while a request streams, the live tokens/s is above 0 and the token count is above
  what it was before the request (the page's numbers follow the server's counters);
- its button (clicked by the page itself with ?autoapply=1, the same handler a click
  runs) applies a plan made from the live counters: afterwards each cached layer's slots
  hold its most selected experts in /moe-layer-perf (ties: the lower id), computed here;
- a screenshot is taken (docs/dashboard.png is one);
- over two mock GPUs (-ts 1,1, --moe-cache 1,1): /moe-hot-cache says each layer's GPU as
  llama.cpp's split puts it (layer l on the first GPU whose share passes l / n_layer),
  each GPU's slots are its layers' slots and add up with the bytes to the cache's, the
  residual crosses into GPU 1 alone (whole rows of n_embd floats); the page's GPU table
  and the cache table's GPU column show those numbers; /metrics' tiermoe_gpu_* say the
  same, and the GPUs' slots by lane add up to the cached class's.
Chromium's DOM after its JavaScript ran (--dump-dom, --virtual-time-budget) is parsed
with the standard library's HTML parser.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import TMP, TOOLS, check, finish  # noqa: E402
from server_harness import Server, make_model, wait_for  # noqa: E402

MOCK = os.environ.get("TM_SERVE_BINARY") or os.path.join(TOOLS, "tiermoe_mockgpu")


class Page(HTMLParser):
    """Text by element id, and the rows of the cache and GPU tables."""

    def __init__(self, html):
        super().__init__()
        self.text, self.stack, self.cache_rows, self.gpu_rows, self.canvas = {}, [], [], [], {}
        self.in_cache = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id") in ("cache", "gpus"):
            self.in_cache = self.cache_rows if a["id"] == "cache" else self.gpu_rows
        if self.in_cache is not None and tag == "tr":
            self.in_cache.append([])
        if tag == "canvas":
            self.canvas = a
        self.stack.append((tag, a.get("id")))

    def handle_endtag(self, tag):
        if tag == "table":
            self.in_cache = None
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for _, i in self.stack:
            if i:
                self.text[i] = self.text.get(i, "") + data
        if self.in_cache and self.stack and self.stack[-1][0] == "td":
            self.in_cache[-1].append(data)


class Stream:
    """A long streamed completion on a raw socket, read by a thread; running() starts
    another when it has ended, and returns once it has streamed a few chunks."""

    def __init__(self, port):
        self.port, self.sock, self.done, self.n = port, None, threading.Event(), 0

    def _read(self, sock, started):
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
                if got.count(b"data: ") >= 5:
                    started.set()
        except OSError:
            pass
        started.set()
        self.done.set()

    def running(self):
        if self.sock and not self.done.is_set():
            return
        self.close()
        self.done.clear()
        self.n += 1
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=120)
        req = json.dumps({"prompt": "Stream for a while", "max_tokens": 400, "ignore_eos": True,
                          "stream": True}).encode()
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(req)).encode() + b"\r\n\r\n" + req)
        started = threading.Event()
        threading.Thread(target=self._read, args=(self.sock, started), daemon=True).start()
        started.wait(120)

    def close(self):
        if self.sock:
            self.sock.close()
            self.sock = None


def chromium(*args, timeout=120):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    p = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--user-data-dir=" + os.path.join(TMP, "chromium"), *args],
                       capture_output=True, text=True, timeout=timeout)
    return p.stdout


def dom(url, budget_ms=3000):
    return Page(chromium(f"--virtual-time-budget={budget_ms}", "--dump-dom", url))


def two_gpus(model):
    """Each GPU's cache on the page and in /moe-hot-cache, over two mock GPUs."""
    srv = Server(model, "-dev", "CUDA0,CUDA1", "-ts", "1,1", "-ngl", "all", "--cpu-moe", "--moe-cache", "1,1",
                 "--moe-cache-update", "off", "-ot", r"output\.weight=CPU", "-c", "512", "--quiet", binary=MOCK,
                 env={"MOCK_GPUS": "2", "TIERMOE_CALIB": "none"})
    try:
        srv.request("POST", "/v1/completions", {"prompt": "Warm up the counters", "max_tokens": 4})
        _, cache = srv.request("GET", "/moe-hot-cache")
        _, perf = srv.request("GET", "/moe-layer-perf")
        n_layer, gpus = len(perf["layers"]), cache.get("gpus", [])
        check(len(gpus) == 2 and [g["device"] for g in gpus] == [0, 1], f"gpus {gpus}")
        for L in cache["layers"]:
            check(L["gpu"] == int(2 * L["layer"] >= n_layer), f"layer {L['layer']} on GPU {L['gpu']}")
        for g in gpus:
            mine = [L for L in cache["layers"] if L["gpu"] == g["gpu"]]
            check(g["cache_slots"] == sum(L["slots"] for L in mine) and g["cache_layers"] == len(mine),
                  f"GPU {g['gpu']}: {g} against its layers {mine}")
        check(sum(g["cache_bytes"] for g in gpus) == cache["cache_bytes"], f"bytes {gpus} {cache['cache_bytes']}")
        check(len(gpus) == 2 and gpus[0]["peer_copies"] == 0 and gpus[1]["peer_copies"] > 0 and
              gpus[1]["peer_bytes"] % (4 * 256) == 0, f"peer copies {gpus}")  # tiny: n_embd 256
        _, metrics = srv.request("GET", "/metrics")
        samples = {}
        for line in metrics.splitlines():
            if line.startswith(("tiermoe_gpu_", "tiermoe_tier_slots_total")):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        for g in gpus:
            at = f'gpu="{g["gpu"]}",device="CUDA{g["device"]}"'
            check(samples.get(f"tiermoe_gpu_cache_slots{{{at}}}") == g["cache_slots"] and
                  samples.get(f"tiermoe_gpu_peer_copies_total{{{at}}}") == g["peer_copies"],
                  f"/metrics of GPU {g['gpu']}: {samples}")
        for lane in ("hot", "pcie", "cold"):  # the GPUs' layers are all the cached class's
            by_gpu = sum(v for k, v in samples.items() if k.startswith("tiermoe_gpu_slots_total") and
                         f'lane="{lane}"' in k)
            check(by_gpu == samples.get(f'tiermoe_tier_slots_total{{class="cached",lane="{lane}"}}'),
                  f"{lane} slots by GPU {by_gpu} against the class's: {samples}")
        p = dom(srv.base + "/")
        want = [[str(g["gpu"]), f"CUDA{g['device']}", str(g["layers"]), str(g["cache_layers"]),
                 str(g["cache_slots"]), f"{g['cache_bytes'] / 1048576:.2f}"] for g in gpus]
        got = [r[:6] for r in p.gpu_rows if r]
        check(got == want, f"GPU table {got} != /moe-hot-cache {want}")
        col = [[r[0], r[2]] for r in p.cache_rows if r]
        check(col == [[str(L["layer"]), str(L["gpu"])] for L in cache["layers"]], f"cache table's GPUs {col}")
        chromium("--virtual-time-budget=3000", "--window-size=1100,900",
                 f"--screenshot={os.path.join(TMP, 'dashboard_gpus.png')}", srv.base + "/")
        print(f"  two GPUs: cached layers on GPUs {[L['gpu'] for L in cache['layers']]}, GPU table {got}")
    finally:
        rc = srv.stop()
    check(rc == 0, f"two GPUs: exit {rc}\n{srv.log()[-2000:]}")


def main():
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        print("chromium not installed: skipping")
        return 77
    if not os.path.exists(MOCK):
        print(f"{MOCK} not built: skipping")
        return 77
    model, _ = make_model("dash.gguf")
    srv = Server(model, "-ngl", "all", "--cpu-moe", "--moe-cache", "1", "--moe-cache-update", "off",
                 "-ot", r"output\.weight=CPU", "-c", "512", "--quiet", binary=MOCK)
    try:
        srv.request("POST", "/v1/completions", {"prompt": "Warm up the counters", "max_tokens": 4})
        status, cache = srv.request("GET", "/moe-hot-cache")
        p = dom(srv.base + "/")
        check(p.text.get("model") == "dash" and p.text.get("status") == "live", f"page header {p.text}")
        rows = [r for r in p.cache_rows if r]
        want = [[str(L["layer"]), str(L["slots"]), " ".join(map(str, L["experts"]))] for L in cache["layers"]]
        got = [[r[0], r[1], r[-1]] for r in rows]
        check(got == want, f"cache table {got} != /moe-hot-cache {want}")
        _, perf = srv.request("GET", "/moe-layer-perf")
        check(int(p.text.get("tokens", "-1")) == perf["tokens"], f"tokens {p.text.get('tokens')} != {perf['tokens']}")
        cell = int(p.canvas.get("width", 0)) // 16
        check(cell > 0 and int(p.canvas.get("height", 0)) == 3 * cell, f"heatmap {p.canvas}")
        print(f"  page: model, live, {len(rows)} cache rows equal /moe-hot-cache, heatmap 3 x 16")

        # a request streams: the page's live numbers move. The page's tokens/s comes from two
        # polls of the counters a second apart on the browser's clock; on a loaded machine one
        # load of the page may see no token between them, so the page is loaded again (with a
        # stream running each time) until it shows the numbers moving, within a deadline.
        before = perf["tokens"]
        stream = Stream(srv.port)
        end = time.time() + 120
        while True:
            stream.running()
            p = dom(srv.base + "/", 3500)
            tps, tokens = float(p.text.get("tps", "0")), int(p.text.get("tokens", "0"))
            q = p.text.get("queue", "")
            moving = tps > 0 and tokens > before and q.startswith("1 ")
            if moving or time.time() > end:
                break
        check(moving, f"while streaming: tokens/s {tps}, tokens {tokens} (before {before}), queue {q!r} "
              f"({stream.n} streams)")
        shot = os.path.join(TMP, "dashboard.png")
        stream.running()
        chromium("--virtual-time-budget=3000", "--window-size=1100,900", f"--screenshot={shot}", srv.base + "/")
        stream.close()
        check(wait_for(lambda: srv.request("GET", "/metrics")[1].count("tiermoe_requests_processing 0") == 1),
              "the stream did not end")
        check(os.path.exists(shot) and os.path.getsize(shot) > 10000, "no screenshot")
        print(f"  while a request streams: {tps:.1f} tokens/s, {tokens} tokens (before {before}); screenshot taken")

        # the button: a plan from the live counters
        _, perf = srv.request("GET", "/moe-layer-perf")
        p = dom(srv.base + "/?autoapply=1", 4000)
        res = p.text.get("apply-result", "")
        _, after = srv.request("GET", "/moe-hot-cache")
        check(res.startswith("applied:"), f"apply result {res!r}")
        for L in after["layers"]:
            hits = perf["layers"][L["layer"]]["experts"]
            top = sorted(range(len(hits)), key=lambda e: (-hits[e], e))[:L["slots"]]
            check(sorted(L["experts"]) == sorted(top), f"layer {L['layer']}: slots {L['experts']}, top {top}")
        print(f"  the button: {res}; every cached layer holds its most selected experts")
    finally:
        rc = srv.stop()
    check(rc == 0, f"exit {rc}\n{srv.log()[-2000:]}")
    check("ERROR: AddressSanitizer" not in srv.log() and "runtime error" not in srv.log(),
          f"sanitizer report:\n{srv.log()[-3000:]}")
    two_gpus(model)
    return finish("the dashboard shows the server's numbers live in Chromium and its button applies a plan")


if __name__ == "__main__":
    sys.exit(main())
