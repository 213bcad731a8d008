"""The vocabulary through the package against independent readers of the same file and
tokenizer: token types and the vocabulary's keys against the `gguf` package's reader,
token bytes against HF `tokenizers` (the tokenizer.json mkmodel embedded), the
streaming detokenizer against the whole-text one, a vocabulary-only load against the
full model, and the chat reply's cut against the documented formats."""
import lzma
import os

import pytest
from conftest import DATA

import tiermoe

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

# <|im_end|> (control), "Hello" (normal), "日" (its bytes), a byte-level piece
IDS = [151645, 151643, 9707, 14990, 8903, 220, 198, 0, 1, 151669 - 1]


@pytest.fixture(scope="module")
def reader(vocab_path):
    return gguf.GGUFReader(vocab_path)


def _field(reader, key):
    f = reader.fields[key]
    if len(f.data) == 1:  # a scalar or a string
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0]
    return [f.parts[i] for i in f.data]


def test_vocab_info_against_gguf(vocab_model, reader):
    v = vocab_model.vocab_info()
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert v.n_tokens == len(tokens)
    assert v.model == _field(reader, "tokenizer.ggml.model")
    assert v.pre == _field(reader, "tokenizer.ggml.pre")


def test_token_info_against_gguf_and_tokenizers(vocab_model, reader):
    types = [int(t[0]) for t in _field(reader, "tokenizer.ggml.token_type")]
    tokens = _field(reader, "tokenizer.ggml.tokens")
    with lzma.open(os.path.join(DATA, "vocab", "qwen3", "tokenizer.json.xz")) as f:
        hf = tokenizers.Tokenizer.from_str(f.read().decode())
    for i in IDS:
        info = vocab_model.token_info(i)
        assert info.type == types[i], i
        if info.type_name == "control":  # its own text, as the vocabulary writes it
            assert info.text == bytes(tokens[i]), i
            continue
        # a byte-level token: HF's decoding of it alone, where that is whole UTF-8
        text = hf.decode([i], skip_special_tokens=False)
        if "\ufffd" not in text:
            assert info.text == text.encode(), i
    with pytest.raises(tiermoe.TiermoeError):
        vocab_model.token_info(len(types))


def test_detokenizer_streams_the_text(vocab_model):
    text = "Hi 日本語 🦊 and \u00e9\u0301 <|im_end|> x"
    ids = vocab_model.tokenize(text, parse_special=True)
    for special in (False, True):
        with vocab_model.detokenizer(render_special=special) as d:
            pieces = [d.push(i) for i in ids] + [d.flush()]
        for p in pieces:  # never inside a character
            p.decode("utf-8")
        assert b"".join(pieces) == vocab_model.detokenize_bytes(ids, render_special=special)
    with vocab_model.detokenizer() as d, pytest.raises(tiermoe.TiermoeError):
        d.push(10**9)


def test_vocab_only(vocab_path, vocab_model):
    with tiermoe.Model(vocab_path, vocab_only=True) as v:
        assert v.info.has_vocab
        for text in ("Hello world", "<|im_start|>user\n日本<|im_end|>"):
            assert v.tokenize(text) == vocab_model.tokenize(text)
        assert v.apply_chat_template([("user", "Hi")]) == vocab_model.apply_chat_template(
            [("user", "Hi")])
        with pytest.raises(tiermoe.TiermoeError):
            v.context(n_ctx=64)


def test_chat_reply(vocab_model):
    assert vocab_model.chat_reply("The answer.<|im_end|>") == "The answer."
    assert vocab_model.chat_reply("No end token") == "No end token"
    assert vocab_model.chat_reply(b"bytes<|im_end|>") == b"bytes"
    harmony = ("<|channel|>analysis<|message|>thinking...<|end|><|start|>assistant"
               "<|channel|>final<|message|>Blue.<|return|>")
    assert vocab_model.chat_reply(harmony, template="harmony") == "Blue."
    assert vocab_model.chat_reply("Hi<|eot_id|>", template="llama3") == "Hi"
    with pytest.raises(tiermoe.TiermoeError):
        vocab_model.chat_reply("x", template="no-such-format")
