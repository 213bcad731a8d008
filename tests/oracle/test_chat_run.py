#!/usr/bin/env python3
"""A model with a real vocabulary end to end: `mkmodel --vocab`, `run -p`, `run --chat`.

- `mkmodel --vocab tokenizer.json` (Qwen3's, committed compressed) embeds the
  vocabulary the way llama.cpp's converter does: token_embd/output have one row
  per token; `--n-vocab` larger than the vocabulary pads the token list.
- `run -p TEXT` feeds the model exactly the ids HF `tokenizers` gives for TEXT.
- `run --chat -sys S` with two user turns on stdin: each turn's prompt ids equal
  HF `tokenizers` on jinja2's rendering of the model's own chat template over
  the whole conversation so far (system, user, our assistant reply, user), and
  the second turn reuses the cache (fewer prompt tokens evaluated than sent).
"""
import lzma
import os
import subprocess
import sys

try:
    import gguf
    import jinja2  # noqa: F401
    from tokenizers import Tokenizer
except ImportError:
    print("gguf, jinja2 or tokenizers not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import DATA, TIERMOE, TMP, check, finish, jinja_chat_render, run  # noqa: E402


def unpack(name):
    out = os.path.join(TMP, name)
    with lzma.open(os.path.join(DATA, "vocab", "qwen3", name + ".xz")) as f, open(out, "wb") as g:
        g.write(f.read())
    return out


def prompt_ids(stderr):
    return [[int(x) for x in line.split(":", 1)[1].split()] for line in stderr.splitlines()
            if line.startswith("prompt ids:")]


def main():
    tok_json = unpack("tokenizer.json")
    unpack("tokenizer_config.json")
    hf = Tokenizer.from_file(tok_json)
    n_tokens = hf.get_vocab_size(with_added_tokens=True)

    model = os.path.join(TMP, "vocab.gguf")
    run([TIERMOE, "mkmodel", "--preset", "tiny", "--n-layer", "1", "--vocab", tok_json, "-q", "-o", model])
    r = gguf.GGUFReader(model)
    tokens = r.fields["tokenizer.ggml.tokens"]
    embd = next(t for t in r.tensors if t.name == "token_embd.weight")
    check(len(tokens.data) == n_tokens and int(embd.shape[1]) == n_tokens,
          f"--vocab: {len(tokens.data)} tokens, {int(embd.shape[1])} embedding rows, want {n_tokens}")
    padded = os.path.join(TMP, "padded.gguf")
    run([TIERMOE, "mkmodel", "--preset", "tiny", "--n-layer", "1", "--n-embd", "256", "--vocab", tok_json,
         "--n-vocab", str(n_tokens + 100), "-q", "-o", padded])
    r = gguf.GGUFReader(padded)
    check(len(r.fields["tokenizer.ggml.tokens"].data) == n_tokens + 100, "--n-vocab did not pad the token list")
    template = bytes(r.fields["tokenizer.chat_template"].parts[-1]).decode()
    print(f"  mkmodel --vocab: {n_tokens} tokens and embedding rows; padding to --n-vocab works")

    text = "Hello world's café 12345 日本語"
    p = subprocess.run([TIERMOE, "run", "-m", model, "-p", text, "-n", "2", "--temp", "0", "--verbose-prompt"],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"run -p: {p.stderr}")
    got = prompt_ids(p.stderr)
    check(got and got[0] == hf.encode(text).ids, f"run -p ids {got[:1]} != HF {hf.encode(text).ids}")
    print("  run -p: prompt ids equal HF tokenizers")

    system, turns = "You are terse.", ["Hello there!", "What is 2+2?"]
    c = subprocess.run([TIERMOE, "run", "-m", model, "--chat", "-sys", system, "-n", "5", "--temp", "0",
                        "--verbose-prompt"], input="\n".join(turns) + "\n", capture_output=True, text=True)
    check(c.returncode == 0, f"run --chat: exit {c.returncode}: {c.stderr}")
    got = prompt_ids(c.stderr)
    replies = c.stdout.split("\n")
    check(len(got) == 2, f"--chat: {len(got)} turns seen, want 2\n{c.stderr}")
    msgs = [("system", system)]
    for i, user in enumerate(turns[:len(got)]):
        msgs.append(("user", user))
        want = hf.encode(jinja_chat_render(template, msgs, True), add_special_tokens=False).ids
        if not check(got[i] == want, f"--chat turn {i + 1}: ids differ from HF's render\n ours {got[i]}\n want {want}"):
            break
        msgs.append(("assistant", replies[i]))  # the reply as printed: one line per turn
    print("  run --chat: both turns' prompt ids equal HF tokenizers on jinja2's rendering of the template")
    evaluated = int(c.stderr.split("prompt eval time =")[1].split("/")[1].split()[0])
    check(evaluated < len(got[0]) + len(got[1]), f"--chat evaluated {evaluated} prompt tokens: the cache was not reused")

    bad = subprocess.run([TIERMOE, "run", "-m", model, "--chat", "--chat-template", "nope"], input="hi\n",
                         capture_output=True, text=True)
    check(bad.returncode == 2 and "--chat-template" in bad.stderr, f"unknown --chat-template: {bad.stderr}")
    return finish("vocabulary, -p and --chat agree with HF tokenizers and jinja2")


if __name__ == "__main__":
    sys.exit(main())
