"""What the Python package's tests share: the CLI (the independent side of most
comparisons), the models (mkmodel's tiny preset, with Qwen3's vocabulary and
without one) and the package itself, imported from python/ of this checkout.

CTest (tests/CMakeLists.txt, python_api) sets TIERMOE_LIB to the build's library,
TM_BIN_DIR to the folder of its `tiermoe`, TM_API_MODEL to the api_model fixture's
model, TM_TEST_DATA and TM_TEST_TMP. Run by hand: TIERMOE_LIB=build/dev/libtiermoe.so
TM_BIN_DIR=build/dev python -m pytest tests/python."""
import lzma
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("TIERMOE_CALIB", "none")  # the tier's built-in lane shares, as the C tests

import tiermoe  # noqa: E402

BIN = os.environ.get("TM_BIN_DIR", os.path.join(ROOT, "build", "dev"))
DATA = os.environ.get("TM_TEST_DATA", os.path.join(ROOT, "tests", "data"))
TIERMOE = os.path.join(BIN, "tiermoe")


def cli(*args, stdin=None, exe=None):
    """Run the tiermoe CLI (or exe); (stdout, stderr), invalid UTF-8 replaced as Python
    decodes it (the package's text does the same). It must succeed."""
    r = subprocess.run([exe or TIERMOE, *map(str, args)], input=stdin, capture_output=True)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr.decode()}")
    return r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


@pytest.fixture(scope="session")
def tmp():
    d = os.environ.get("TM_TEST_TMP") or tempfile.mkdtemp()
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def vocab_path(tmp):
    """mkmodel's tiny model (3 layers, 16 experts, top-4) with Qwen3's vocabulary."""
    if os.environ.get("TM_API_MODEL"):
        return os.environ["TM_API_MODEL"]
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the chat template is in the config
        with lzma.open(os.path.join(DATA, "vocab", "qwen3", name + ".xz")) as f, \
                open(os.path.join(tmp, name), "wb") as g:
            g.write(f.read())
    tok = os.path.join(tmp, "tokenizer.json")
    out = os.path.join(tmp, "py-tiny-qwen3vocab.gguf")
    cli("mkmodel", "--preset", "tiny", "--vocab", tok, "-q", "-o", out)
    return out


@pytest.fixture(scope="session")
def plain_path(tmp):
    """mkmodel's tiny model without a vocabulary (ids in, ids out)."""
    out = os.path.join(tmp, "py-tiny.gguf")
    cli("mkmodel", "--preset", "tiny", "-q", "-o", out)
    return out


@pytest.fixture(scope="session")
def vocab_model(vocab_path):
    with tiermoe.Model(vocab_path) as m:
        yield m


@pytest.fixture(scope="session")
def plain_model(plain_path):
    with tiermoe.Model(plain_path) as m:
        yield m
