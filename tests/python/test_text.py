"""Text through the package against the CLI's own commands on the same file:
tokenize equals `tiermoe tokenize --ids` (with and without control tokens parsed),
detokenize equals `tiermoe detokenize`, a token's piece is what the vocabulary
detokenizes it to, and a chat rendering tokenizes to the ids `tiermoe run --chat`
evaluates (its "prompt ids" line)."""
import pytest
from conftest import cli

import tiermoe

TEXTS = ["Hello world", "Hello <|im_start|> wörld 日本語\n\tcode = x**2  # ok", "  leading spaces",
         "emoji 🦊 and <|im_end|> tokens", "x"]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("parse_special", [True, False])
def test_tokenize_equals_cli(vocab_model, vocab_path, text, parse_special):
    flags = [] if parse_special else ["--no-parse-special"]
    out, _ = cli("tokenize", "-m", vocab_path, "--ids", *flags, text)
    want = [int(x) for x in out.split()]
    assert vocab_model.tokenize(text, parse_special=parse_special) == want


@pytest.mark.parametrize("text", TEXTS)
def test_detokenize_equals_cli(vocab_model, vocab_path, text):
    ids = vocab_model.tokenize(text)
    out, _ = cli("detokenize", "-m", vocab_path, *ids)
    assert vocab_model.detokenize(ids, render_special=True) == out.rstrip("\n")
    if "<|" not in text:
        assert vocab_model.detokenize(ids) == text


def test_pieces(vocab_model):
    ids = vocab_model.tokenize("Hello world 日本")
    assert b"".join(vocab_model.token_piece(t) for t in ids) == "Hello world 日本".encode()
    assert vocab_model.token_piece(151645) == b""  # <|im_end|>: a control token
    assert vocab_model.is_end(151645) and not vocab_model.is_end(9707)
    assert vocab_model.detokenize([]) == ""


def test_chat_template_equals_cli(vocab_model, vocab_path):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = vocab_model.apply_chat_template(msgs)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                    "<|im_start|>assistant\n")
    _, err = cli("run", "-m", vocab_path, "--chat", "-sys", "Be brief.", "-n", "1", "--temp", "0",
                 "--verbose-prompt", stdin=b"Hi there\n")
    want = next(line for line in err.splitlines() if line.startswith("prompt ids:"))
    assert vocab_model.tokenize(text) == [int(x) for x in want.split(":", 1)[1].split()]
    llama3 = vocab_model.apply_chat_template([("user", "Hi")], False, template="llama3")
    assert "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" in llama3


def test_model_info(vocab_model, plain_model):
    i = vocab_model.info
    assert (i.arch, i.n_layer, i.n_expert, i.n_expert_used, i.has_vocab, i.chat_format) == \
        ("qwen3moe", 3, 16, 4, True, "qwen3")
    assert i.n_vocab == 151669 and i.n_params > 0
    assert not plain_model.info.has_vocab and plain_model.info.chat_format is None
    with pytest.raises(tiermoe.TiermoeError) as e:
        plain_model.tokenize("Hello")
    assert e.value.status == tiermoe.Status.UNSUPPORTED and "no vocabulary" in e.value.message
