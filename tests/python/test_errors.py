"""Errors through the package: a bad argument raises TiermoeError carrying the C
status and the library's message (naming the argument); a closed handle raises
ValueError instead of reaching the library; the bindings declare every function
the header does (a function added to tiermoe.h without one fails here)."""
import os
import re

import pytest
from conftest import ROOT

import tiermoe
from tiermoe import _lib

ARG = tiermoe.Status.ARG


def raises(status, words, fn, *args, **kw):
    with pytest.raises(tiermoe.TiermoeError) as e:
        fn(*args, **kw)
    assert e.value.status == status, e.value
    for w in words:
        assert w in e.value.message, e.value.message
    assert e.value.message in str(e.value)
    return e.value


def test_model_errors(tmp):
    raises(tiermoe.Status.IO, ["/nonexistent/x.gguf"], tiermoe.Model, "/nonexistent/x.gguf")
    bad = os.path.join(tmp, "py-not-gguf.gguf")
    with open(bad, "wb") as f:
        f.write(b"this is not a GGUF file at all" * 4)
    e = raises(tiermoe.Status.FORMAT, [bad], tiermoe.Model, bad)
    assert "FORMAT" not in str(e) and "(" in str(e)  # the library's status name: "... (malformed ...)"
    with pytest.raises(TypeError, match="n_gpu_layer"):
        tiermoe.Model(bad, n_gpu_layer=3)


def test_argument_errors(vocab_model, plain_model):
    m = vocab_model
    raises(ARG, ["ids[0]", "-5"], m.detokenize, [-5])
    raises(ARG, ["tm_token_piece", "999999"], m.token_piece, 999999)
    raises(ARG, ["format"], m.apply_chat_template, [("user", "Hi")], template="nonsense")
    raises(ARG, ["n_ctx", "negative"], m.context, n_ctx=-1)
    raises(ARG, ["n_cpu_moe", "-3"], m.context, n_cpu_moe=-3)
    raises(ARG, ["moe_pcie", "12345"], m.context, moe_pcie=12345)
    raises(ARG, ["override_tensor"], m.context, override_tensor="no-equals-sign")
    raises(tiermoe.Status.IO, ["nope.json"], m.context, moe_cache_plan="/nonexistent/nope.json")
    with pytest.raises(ValueError, match="moe_fetch"):
        m.context(moe_fetch="sideways")
    with pytest.raises(TypeError, match="cpu_moee"):
        m.context(cpu_moee=True)
    with plain_model.context(n_ctx=16) as ctx:
        raises(ARG, ["tokens[1]", "not in"], ctx.eval, [1, 10 ** 8])
        assert ctx.tokens() == []  # nothing evaluated
        raises(ARG, ["seq 3"], ctx.eval, [1], seq=3)
        raises(ARG, ["no logits"], ctx.logits)
        raises(ARG, ["more do not fit"], ctx.eval, list(range(1, ctx.info.n_ctx + 2)))
        raises(ARG, ["layer 9"], ctx.cache_experts, 9)
        raises(ARG, ["n_keep", "negative"], ctx.rewind, -1)
        raises(ARG, ["twice"], ctx.eval_rows, [0, 0], [1, 2])
        raises(ARG, ["--temp"], ctx.generate, [1, 2], 4, temp=-1)
        assert ctx.tokens() == []  # a refused sampler: the prompt was not evaluated


def test_closed_handles(plain_path):
    m = tiermoe.Model(plain_path)
    ctx = m.context()
    ctx.eval([1, 2])
    gen = ctx.generate([1, 2, 3], 5, tokens=True, temp=0)
    next(gen)
    m.close()  # closes the context too
    m.close()
    with pytest.raises(ValueError, match="Context is closed"):
        next(gen)
    with pytest.raises(ValueError, match="Context is closed"):
        ctx.eval([1])
    with pytest.raises(ValueError, match="Model is closed"):
        m.context()
    with tiermoe.Model(plain_path) as m2, m2.context() as c2:
        c2.eval([1])
    assert c2._h is None and m2._h is None


def test_bindings_cover_the_header():
    with open(os.path.join(ROOT, "include", "tiermoe.h")) as f:
        declared = set(re.findall(r"\b(tm_[a-z_]+)\(", f.read()))
    assert declared == set(_lib.PROTOTYPES)
    path, origin = tiermoe.library_path()
    assert os.path.exists(path) and origin
    assert tiermoe.version() == tiermoe.__version__


def test_log_callback(plain_model):
    lines = []
    tiermoe.set_log_callback(lambda level, text: lines.append((level, text)))
    try:
        plain_model.context().close()
    finally:
        tiermoe.set_log_callback(None)
    assert any(level == tiermoe.LogLevel.INFO and "KV cache" in text for level, text in lines), lines
