"""Generation through the package against `tiermoe run` on the same file: the
same prompt, sampling parameters and seed give the same token ids (a model
without a vocabulary: the CLI prints ids) and the same text (with Qwen3's
vocabulary: the CLI prints the prompt, then the text); a two-turn chat gives the
CLI's `--chat` prompt ids and replies. Also: the greedy token is the logits'
argmax, sequences stepped together (eval_rows, after their prompts one at a time or
in one step: eval_batch) give the tokens of each alone,
and a prompt's shared prefix is not evaluated again."""
import numpy as np
import pytest
from conftest import cli

import tiermoe


def cli_ids(path, prompt, n, *flags):
    out, _ = cli("run", "-m", path, "--tokens", ",".join(map(str, prompt)), "-n", n, *flags)
    head, _, tail = out.partition("|")
    assert [int(x) for x in head.split()] == prompt
    return [int(x) for x in tail.split()]


SAMPLING = [
    ({"temp": 0}, ["--temp", "0"]),
    ({"temp": 0.9, "seed": 7}, ["--temp", "0.9", "-s", "7"]),
    ({"temp": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0, "seed": 11},
     ["--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p", "0", "-s", "11"]),
    ({"temp": 0, "repeat_penalty": 1.5, "repeat_last_n": 8}, ["--temp", "0", "--repeat-penalty", "1.5",
                                                               "--repeat-last-n", "8"]),
]


@pytest.mark.parametrize("params,flags", SAMPLING)
def test_ids_equal_cli(plain_model, plain_path, params, flags):
    prompt = [1, 2, 3, 500, 42]
    want = cli_ids(plain_path, prompt, 24, *flags)
    with plain_model.context() as ctx:
        got = list(ctx.generate(prompt, 24, tokens=True, **params))
        assert ctx.stop_reason == "length"
    assert got == want and len(got) == 24


@pytest.mark.parametrize("params,flags", SAMPLING[:2])
def test_text_equals_cli(vocab_model, vocab_path, params, flags):
    prompt = "Once upon a time"
    out, _ = cli("run", "-m", vocab_path, "-p", prompt, "-n", 20, *flags)
    with vocab_model.context() as ctx:
        text = "".join(ctx.generate(prompt, 20, **params))
        ids = ctx.tokens()
    assert prompt + text + "\n" == out
    # the chunks are the generated ids' text (the last one is not evaluated, so not in ids)
    n_prompt = len(vocab_model.tokenize(prompt))
    assert text.startswith(vocab_model.detokenize(ids[n_prompt:]))


def test_chat_equals_cli(vocab_model, vocab_path):
    turns = ["Hi there", "And then?"]
    out, err = cli("run", "-m", vocab_path, "--chat", "-sys", "Be brief.", "-n", 12, "--temp", "0",
                   "--verbose-prompt", stdin="".join(t + "\n" for t in turns).encode())
    want_ids = [[int(x) for x in line.split(":", 1)[1].split()] for line in err.splitlines()
                if line.startswith("prompt ids:")]
    msgs = [{"role": "system", "content": "Be brief."}]
    replies, evaluated = [], []
    with vocab_model.context() as ctx:
        for t in turns:
            msgs.append({"role": "user", "content": t})
            prompt = vocab_model.tokenize(vocab_model.apply_chat_template(msgs))
            assert prompt == want_ids[len(replies)]
            n_before = ctx.seq_length()
            reply = "".join(ctx.chat(msgs, 12, temp=0))
            evaluated.append(ctx.seq_length() - n_before)
            replies.append(reply)
            msgs.append({"role": "assistant", "content": reply})
    assert "".join(r + "\n" for r in replies) == out
    assert evaluated[1] < len(want_ids[1])  # the second turn reused the first's prefix


def test_greedy_is_argmax(plain_model):
    with plain_model.context() as ctx:
        ctx.eval([1, 2, 3])
        logits = ctx.logits()
        assert logits.dtype == np.float32 and logits.shape == (plain_model.info.n_vocab,)
        first = next(ctx.generate([1, 2, 3], 1, tokens=True, temp=0))
        assert first == int(np.argmax(logits))


def test_rows_equal_alone(plain_model):
    prompts = [[1, 2, 3], [7, 8, 9, 10]]
    alone = []
    for p in prompts:
        with plain_model.context() as ctx:
            alone.append(list(ctx.generate(p, 6, tokens=True, temp=0)))
    for batch in (False, True):  # the prompts one at a time, or in one step (eval_batch)
        assert rows_after_prompts(plain_model, prompts, batch) == alone


def rows_after_prompts(plain_model, prompts, batch):
    with plain_model.context(n_seq=2) as ctx:
        if batch:
            ctx.eval_batch([s for s, p in enumerate(prompts) for _ in p], [t for p in prompts for t in p])
        else:
            for s, p in enumerate(prompts):
                ctx.eval(p, seq=s)
        got = [[], []]
        for step in range(6):
            nxt = [int(np.argmax(ctx.logits(s))) for s in range(2)]
            for s in range(2):
                got[s].append(nxt[s])
            if step < 5:
                ctx.eval_rows([0, 1], nxt)
        assert ctx.tokens(1) == prompts[1] + got[1][:5]
    return got


def test_prefix_reuse_and_seeds(plain_model):
    with plain_model.context(seed=5) as ctx:
        assert ctx.feed([1, 2, 3, 4]) == 4
        assert ctx.feed([1, 2, 3, 4, 5, 6]) == 2  # 1..4 kept
        assert ctx.feed([1, 2, 9]) == 1
        assert ctx.tokens() == [1, 2, 9]
        assert ctx.feed([1, 2, 9]) == 1  # the last is evaluated again, for its logits
        a = list(ctx.generate([1, 2, 3], 12, tokens=True, temp=1.0))
        b = list(ctx.generate([1, 2, 3], 12, tokens=True, temp=1.0, seed=5))
        c = list(ctx.generate([1, 2, 3], 12, tokens=True, temp=1.0, seed=6))
        assert a == b and a != c
        assert ctx.rewind(2) == 2 and ctx.tokens() == [1, 2]


def test_full_context_stops(plain_model):
    with plain_model.context(n_ctx=16) as ctx:
        n = ctx.info.n_ctx
        got = list(ctx.generate([1, 2, 3], 10 * n, tokens=True, temp=0))
        assert ctx.stop_reason == "context"
        assert ctx.seq_length() == n and len(got) == n - 3 + 1


def test_sampler_by_hand(plain_model):
    with plain_model.context() as ctx, tiermoe.Sampler(plain_model, temp=0) as s:
        ctx.eval([1, 2, 3])
        t = s.sample(ctx)
        assert t == int(np.argmax(ctx.logits()))
