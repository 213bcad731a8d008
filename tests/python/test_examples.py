"""The Python examples run as a user runs them: examples/chat.py over stdin prints
what `tiermoe run --chat` prints for the same turns (greedy), and
examples/expert_heatmap.py writes a PNG (or, without matplotlib, says to install it)."""
import importlib.util
import os
import subprocess
import sys

from conftest import ROOT, cli


def example(name, *args, stdin=None):
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *map(str, args)], input=stdin,
                       capture_output=True, env=env)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def test_chat_example_equals_cli(vocab_path):
    turns = b"Hi there\nAnd then?\n"
    want, _ = cli("run", "-m", vocab_path, "--chat", "-sys", "Be brief.", "-n", 10, "--temp", "0", stdin=turns)
    rc, out, err = example("chat.py", vocab_path, "-sys", "Be brief.", "-n", 10, "--temp", 0, stdin=turns)
    assert rc == 0, err
    assert out == want


def test_heatmap_example(vocab_path, tmp):
    png = os.path.join(tmp, "py-experts.png")
    if os.path.exists(png):
        os.remove(png)
    rc, out, err = example("expert_heatmap.py", vocab_path, "-p", "Hello", "-n", 4, "-o", png)
    assert "layer   0: top experts" in out
    if importlib.util.find_spec("matplotlib") is None:
        assert rc != 0 and "pip install matplotlib" in err
        return
    assert rc == 0, err
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
