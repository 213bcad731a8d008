#!/usr/bin/env python3
"""Seeds for fuzz/tokenizer_fuzz.c in fuzz/corpus/tokenizer/: small
tokenizer.json files (first byte 0x00: import mode) of each supported kind,
and texts (first byte 0x01: encode mode) from tests/oracle/tok_corpus.py."""
import hashlib
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "oracle"))
from tok_corpus import FIXED, INVALID  # noqa: E402

sys.path.insert(0, os.path.join(here, "..", "scripts"))
from bpe_bytes import bytes_to_unicode  # noqa: E402

out = os.path.join(here, "corpus", "tokenizer")
os.makedirs(out, exist_ok=True)


def save(data):
    name = "seed-" + hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


B = bytes_to_unicode()
vocab = {B[b]: b for b in range(256)}
for i, t in enumerate(["he", "ll", "hel", "hell", "hello", "Ġw", "Ġwo"]):
    vocab[t] = 256 + i
merges = ["h e", "he l", "hel l", "l l", "hell o", "Ġ w", "Ġw o"]
added = [{"id": 263, "content": "<|im_start|>", "special": True}, {"id": 264, "content": "<think>", "special": False}]
regexes = {
    "qwen2": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "llama3": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
}
for name, rx in regexes.items():
    for form in ("str", "pair"):
        tj = {"added_tokens": added, "normalizer": {"type": "NFC"} if name == "qwen2" else None,
              "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                  {"type": "Split", "pattern": {"Regex": rx}, "behavior": "Isolated", "invert": False},
                  {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
              "decoder": {"type": "ByteLevel"},
              "model": {"type": "BPE", "byte_fallback": False, "vocab": vocab,
                        "merges": merges if form == "str" else [m.split(" ") for m in merges]}}
        save(b"\x00" + json.dumps(tj, ensure_ascii=False).encode())
gpt2 = {"added_tokens": [], "pre_tokenizer": {"type": "ByteLevel", "use_regex": True}, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges}}
save(b"\x00" + json.dumps(gpt2, ensure_ascii=False).encode())
# SentencePiece style
sv = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    sv["<0x%02X>" % b] = 3 + b
for i, t in enumerate(["▁", "a", "b", "▁a", "ab", "▁ab"]):
    sv[t] = 259 + i
spm = {"added_tokens": [{"id": 1, "content": "<s>", "special": True}, {"id": 2, "content": "</s>", "special": True}],
       "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                          {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
       "decoder": {"type": "Sequence", "decoders": []},
       "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>", "vocab": sv,
                 "merges": ["▁ a", "a b", "▁a b"]}}
save(b"\x00" + json.dumps(spm, ensure_ascii=False).encode())
for s in FIXED[:40]:
    save(b"\x01" + s.encode()[:512])
for bad in INVALID:
    save(b"\x01ab" + bad + "日本".encode())
print(len(os.listdir(out)), "seeds in", out)
