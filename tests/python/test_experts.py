"""Expert statistics through the package: each layer's counts sum to the tokens
evaluated x experts per token, and equal, expert by expert, the counts the CLI's
tracer writes (`run --expert-trace-output`, layers[].experts) for the same run;
a reset starts them at 0; a context without expert_stats refuses (the C status);
the summary (timings aside) and the learn file equal the CLI's; the profile report."""
import json
import os
import re

import numpy as np
import pytest
from conftest import cli

import tiermoe


def test_counts_equal_cli_trace(plain_model, plain_path, tmp):
    prompt, n = [1, 2, 3, 500, 42], 10
    learn = os.path.join(tmp, "py-learn.json")
    cli("run", "-m", plain_path, "--tokens", ",".join(map(str, prompt)), "-n", n, "--temp", "0",
        "--expert-trace-output", learn)
    with open(learn) as f:
        want = np.array([layer["experts"] for layer in json.load(f)["layers"]], dtype=np.uint64)
    i = plain_model.info
    with plain_model.context(expert_stats=True) as ctx:
        assert not ctx.expert_counts().any()
        list(ctx.generate(prompt, n, tokens=True, temp=0))
        counts = ctx.expert_counts()
        tokens = ctx.seq_length()
        assert counts.shape == (i.n_layer, i.n_expert) and counts.dtype == np.uint64
        assert tokens == len(prompt) + n - 1  # the last token sampled is not evaluated
        assert (counts.sum(axis=1) == tokens * i.n_expert_used).all()
        assert int(counts.sum()) == tokens * i.n_layer * i.n_expert_used
        np.testing.assert_array_equal(counts, want)
        np.testing.assert_array_equal(ctx.expert_counts(1), counts[1])
        ctx.reset_expert_counts()
        assert not ctx.expert_counts().any()
        ctx.eval([7, 8])
        assert (ctx.expert_counts().sum(axis=1) == 2 * i.n_expert_used).all()


def test_counts_need_expert_stats(plain_model):
    with plain_model.context() as ctx:
        with pytest.raises(tiermoe.TiermoeError) as e:
            ctx.expert_counts()
        assert e.value.status == tiermoe.Status.UNSUPPORTED
        assert "without expert_stats" in e.value.message
        with pytest.raises(tiermoe.TiermoeError, match="without expert_stats"):
            ctx.reset_expert_counts()


def _untimed(text):
    """The summary's lines without their timings (which differ from run to run)."""
    return [re.sub(r"routing [0-9.]+ ms,? experts [0-9.]+ ms", "", line)
            for line in text.splitlines()
            if line.startswith(("layer ", "expert trace:")) and not line.startswith("expert trace: wrote")]


def test_summary_and_learn_file_equal_cli(plain_model, plain_path, tmp):
    prompt, n = [1, 2, 3, 500, 42], 6
    learn = os.path.join(tmp, "py-learn-cli.json")
    _, err = cli("run", "-m", plain_path, "--tokens", ",".join(map(str, prompt)), "-n", n, "--temp", "0",
                 "--expert-trace-stats", "--expert-trace-per-layer", "--expert-trace-output", learn)
    mine = os.path.join(tmp, "py-learn-mine.json")
    with plain_model.context(expert_stats=True) as ctx:
        list(ctx.generate(prompt, n, tokens=True, temp=0))
        summary = ctx.expert_summary(per_layer=True)
        ctx.write_expert_stats(mine)
        assert len(_untimed(ctx.expert_summary())) == 1  # the mean line alone
    want = _untimed(err)
    assert len(want) == plain_model.info.n_layer + 1
    assert _untimed(summary) == want
    with open(learn) as a, open(mine) as b:
        la, lb = json.load(a)["layers"], json.load(b)["layers"]
    assert [x["experts"] for x in la] == [x["experts"] for x in lb]


def test_profile(plain_model):
    with plain_model.context(profile=True) as ctx:
        ctx.eval([1, 2, 3])
        text = ctx.profile()
        assert text.startswith("time by part, per run") and "experts" in text
    with plain_model.context() as ctx:
        with pytest.raises(tiermoe.TiermoeError) as e:
            ctx.profile()
        assert e.value.status == tiermoe.Status.UNSUPPORTED
