#!/usr/bin/env python3
"""gpt-oss with its real vocabulary (o200k_harmony) against bpe-openai.

- scripts/make_o200k_vocab.py writes tokenizer.json + tokenizer_config.json
  from bpe-openai's o200k_base ranks (merges recovered as transformers'
  TikTokenConverter does) and gpt-oss's special tokens (199998..201087).
- `mkmodel --preset tiny-gpt-oss --vocab` makes a model with 201088 tokens,
  pre-tokenizer gpt-4o.
- Ids: `tiermoe tokenize --ids` on every hand-written string of tok_corpus.py,
  and the tok_corpus tool on the whole corpus (its valid UTF-8 strings: about
  1,200), equal bpe-openai's o200k_base `encode_ordinary` (a Rust
  implementation, independent of ours and of HF tokenizers); decode gives the
  text back.
- `run --chat` with one user message: the prompt is the harmony format as
  OpenAI documents it (system block, `<|start|>user<|message|>…<|end|>`,
  `<|start|>assistant`), the special tokens are single ids (200006, 200008,
  200007, …), the other ids equal bpe-openai on the text between them, jinja2
  on the template in tokenizer_config.json gives the same text (when jinja2 is
  installed), and generation runs to -n.
Exit 77 when bpe_openai is not importable (pip install --no-deps bpe-openai).
"""
import datetime
import json
import os
import re
import subprocess
import sys

try:
    import bpe_openai
except ImportError:
    print("skipped: bpe_openai not installed (pip install --no-deps bpe-openai==0.1.4)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import make_o200k_vocab as mk  # noqa: E402
from oracle_common import TIERMOE, TMP, TOOLS, check, finish, run  # noqa: E402
from tok_corpus import FIXED, make_corpus, write_corpus  # noqa: E402

HARMONY_IDS = {"<|start|>": 200006, "<|message|>": 200008, "<|end|>": 200007, "<|channel|>": 200005,
               "<|return|>": 200002, "<|call|>": 200012, "<|constrain|>": 200003}


def encode_with_specials(enc, text):
    """bpe-openai on the text between harmony special tokens, the specials' ids between."""
    ids = []
    for part in re.split("(" + "|".join(map(re.escape, HARMONY_IDS)) + ")", text):
        if part in HARMONY_IDS:
            ids.append(HARMONY_IDS[part])
        elif part:
            ids += enc.encode_ordinary(part)
    return ids


def tokenize_cli(model, data):
    path = os.path.join(TMP, "text.txt")
    with open(path, "wb") as f:
        f.write(data)
    out = run([TIERMOE, "tokenize", "-m", model, "--ids", "--no-parse-special", "-f", path]).strip()
    return [int(x) for x in out.split()] if out else []


def main():
    enc = bpe_openai.get_encoding("o200k_base")
    tok_json = mk.build(os.path.join(TMP, "o200k"))
    model = os.path.join(TMP, "oss_o200k.gguf")
    run([TIERMOE, "mkmodel", "--preset", "tiny-gpt-oss", "--n-layer", "1", "--vocab", tok_json, "-q",
         "-o", model])
    info = run([TIERMOE, "tokenize", "-m", model, "hi"])
    check("gpt2/gpt-4o" in info, f"tokenizer is not gpt2/gpt-4o: {info.strip()}")
    for s, i in HARMONY_IDS.items():
        check(tokenize_cli(model, s.encode()) != [i], f"{s} parsed as special with --no-parse-special")
        got = run([TIERMOE, "tokenize", "-m", model, "--ids", s]).split()
        check(got == [str(i)], f"{s}: ids {got}, want [{i}]")
    check(run([TIERMOE, "detokenize", "-m", model, "201087"]).strip() == "<|reserved_201087|>",
          "id 201087 is not <|reserved_201087|>")

    # tiermoe tokenize on the hand-written strings, plus a few more
    extra = ["12345678 1234567 0.000123 -42e10 3,141,592", "x = [i**2 for i in range(10)]\n\tif x:\n\t\tpass",
             "   leading and trailing   ", "\n\n\n", "a\r\nb\rc\n", "I'VE you'RE they'll", "🏳️‍🌈👨‍👩‍👧‍👦🇯🇵",
             "한국어 텍스트와 日本語 and 中文", "ÀÉÎÕÜ àéîõü ǅ Ǆ", "<|start|>user<|message|>hi<|end|>"]
    n_cli = 0
    for s in FIXED + extra:
        b = s.encode()
        got, want = tokenize_cli(model, b), enc.encode_ordinary(s)
        n_cli += check(got == want, f"tokenize {s!r}: {got[:20]} != bpe-openai {want[:20]}")
    print(f"  tiermoe tokenize: {n_cli} of {len(FIXED) + len(extra)} strings equal bpe-openai o200k_base")

    # the whole corpus through the batch tool
    tool = os.path.join(TOOLS, "tok_corpus")
    if os.path.exists(tool):
        corpus = []
        for b in make_corpus():
            try:
                corpus.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                pass  # bpe-openai takes text only; invalid UTF-8 is covered by test_tokenizer_oracle
        cpath, opath = os.path.join(TMP, "corpus.bin"), os.path.join(TMP, "corpus.out")
        write_corpus(cpath, [s.encode() for s in corpus])
        run([tool, model, cpath, opath, "--no-parse-special"])
        rows = open(opath).read().splitlines()
        check(len(rows) == len(corpus), f"tok_corpus: {len(rows)} rows for {len(corpus)} strings")
        n_eq = n_rt = 0
        for s, row in zip(corpus, rows):
            ids, dec, _ = row.split("\t")
            got, want = [int(x) for x in ids.split()], enc.encode_ordinary(s)
            n_eq += check(got == want, f"corpus {s[:60]!r}: {got[:16]} != bpe-openai {want[:16]}")
            n_rt += check(bytes.fromhex(dec) == s.encode(), f"corpus {s[:60]!r}: decode differs")
        print(f"  tok_corpus: {n_eq} of {len(corpus)} strings equal bpe-openai, {n_rt} decode back")
    else:
        print(f"  tok_corpus tool not built ({tool}): corpus comparison skipped")

    # run --chat: the harmony prompt for one user message
    user = "What is 2+2? Answer in one word."
    today = datetime.date.today().strftime("%Y-%m-%d")
    want_text = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                 f"Knowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: medium\n\n"
                 "# Valid channels: analysis, commentary, final. Channel must be included for every message."
                 f"<|end|><|start|>user<|message|>{user}<|end|><|start|>assistant")
    n_gen = 6
    c = subprocess.run([TIERMOE, "run", "-m", model, "--chat", "-n", str(n_gen), "--temp", "0",
                        "--verbose-prompt"], input=user + "\n", capture_output=True, text=True, timeout=600)
    check(c.returncode == 0, f"run --chat: exit {c.returncode}: {c.stderr[-2000:]}")
    got = [[int(x) for x in line.split(":", 1)[1].split()] for line in c.stderr.splitlines()
           if line.startswith("prompt ids:")]
    check(len(got) == 1, f"run --chat: {len(got)} prompts seen, want 1\n{c.stderr[-2000:]}")
    if got:
        want = encode_with_specials(enc, want_text)
        check(got[0] == want, f"run --chat prompt ids\n ours {got[0]}\n want {want}")
        text = run([TIERMOE, "detokenize", "-m", model, *map(str, got[0])])
        check(text.rstrip("\n") == want_text, f"run --chat prompt text:\n{text!r}\nwant\n{want_text!r}")
        n_special = sum(i in HARMONY_IDS.values() for i in got[0])
        check(n_special == 7, f"{n_special} harmony special ids in the prompt, want 7 (3 + 3 + 1)")
        print(f"  run --chat: {len(got[0])} prompt ids ({n_special} harmony specials) equal bpe-openai on "
              "the documented harmony format")
    runs = [int(line.split("/")[1].split()[0]) for line in c.stderr.splitlines() if line.startswith("eval time")]
    check(runs and 0 < runs[-1] <= n_gen, f"run --chat: generation runs {runs}, want 1..{n_gen}")
    print(f"  run --chat: generation ran ({runs[-1] if runs else 0} decode steps, -n {n_gen})")
    try:
        import jinja2  # noqa: F401
        from oracle_common import jinja_chat_render
        tmpl = json.load(open(os.path.join(TMP, "o200k", "tokenizer_config.json")))["chat_template"]
        j = jinja_chat_render(tmpl, [("user", user)], True)
        check(j == want_text, f"jinja2 on the written template:\n{j!r}\nwant\n{want_text!r}")
        print("  jinja2 on the written chat template gives the same text")
    except ImportError:
        print("  jinja2 not installed: template rendering not checked")
    return finish("gpt-oss with o200k_harmony: ids equal bpe-openai; run --chat renders harmony and runs")


if __name__ == "__main__":
    sys.exit(main())
