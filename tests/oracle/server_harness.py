"""What the server tests share: a model with Qwen3's vocabulary, a `tiermoe serve`
started on a free loopback port (--port 0; the port is read from its log) and
stopped with a signal, and plain HTTP requests (urllib / raw sockets) for what
the openai client cannot send."""
import json
import lzma
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

from oracle_common import DATA, TIERMOE, TMP, run


def unpack_vocab(name="tokenizer.json"):
    out = os.path.join(TMP, name)
    with lzma.open(os.path.join(DATA, "vocab", "qwen3", name + ".xz")) as f, open(out, "wb") as g:
        g.write(f.read())
    return out


def make_model(name="serve.gguf", *extra):
    """The tiny preset with Qwen3's vocabulary and chat template."""
    tok = unpack_vocab()
    unpack_vocab("tokenizer_config.json")
    model = os.path.join(TMP, name)
    run([TIERMOE, "mkmodel", "--preset", "tiny", "--vocab", tok, "-q", "-o", model, *extra])
    return model, tok


class Server:
    """`BINARY serve -m MODEL ARGS --port 0`, up once /health says ok."""

    def __init__(self, model, *args, binary=TIERMOE, env=None, timeout=120):
        cmd = [binary, "serve", "-m", model, "--port", "0", *args]
        self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, errors="replace",
                                  env={**os.environ, **(env or {})})
        self.lines = []
        self.port = None
        ready = threading.Event()

        def read():
            for line in self.p.stderr:
                self.lines.append(line)
                if "listening on http://" in line:
                    self.port = int(line.rsplit(":", 1)[1])
                if "ready (" in line:
                    ready.set()
            ready.set()
        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or self.port is None or self.p.poll() is not None:
            self.p.kill()
            if "left out of this build" in self.log():
                print("tiermoe serve is not in this build (no libmicrohttpd): skipping")
                raise SystemExit(77)
            raise SystemExit(f"server did not start: {' '.join(cmd)}\n{''.join(self.lines)}")
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self):
        return "".join(self.lines)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signal the server; its exit code (None if it did not exit in time: then killed)."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        """(status, parsed JSON or text) of one request; body: an object sent as JSON,
        raw: bytes sent as they are."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def raw(self, data, timeout=5, half_close=False):
        """Send bytes on a fresh connection; what came back until the server closed it or
        the timeout (b'' if nothing). half_close: shut our sending side after the bytes
        (the server then takes the client for gone)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            return read_all(s)


def error_shape(body):
    """True when body is {"error": {"code", "message", "type"}} (code: the status, or OpenAI's
    string such as "model_not_found")."""
    e = body.get("error") if isinstance(body, dict) else None
    return isinstance(e, dict) and isinstance(e.get("code"), (int, str)) and isinstance(e.get("message"), str) \
        and isinstance(e.get("type"), str)


def connect(port, src="127.0.0.1", timeout=10):
    """A connection to the server on 127.0.0.1 from a loopback source address (on Linux all
    of 127.0.0.0/8 is loopback: another source is another client to a per-address cap)."""
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(src, 0))


def read_all(sock):
    """Bytes until the peer closes (or resets) or the socket's timeout."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return out


def recv_until(sock, done):
    """Bytes from sock until done(bytes so far) holds or the peer closes the connection: a
    loop on recv alone would spin on the empty reads after a close (a server's early 503)."""
    got = b""
    while not done(got):
        more = sock.recv(65536)
        if not more:
            break
        got += more
    return got


def parse_reply(raw):
    """(status, {lower-case header: value}, body) of one raw HTTP reply; status None when
    there is none."""
    if not raw.startswith(b"HTTP/1."):
        return None, {}, raw
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":  # de-chunk
        out, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return int(lines[0].split(" ", 2)[1]), headers, body


def wait_for(cond, timeout=30, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(step)
    return False
