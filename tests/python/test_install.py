"""`pip install` of python/ as a user runs it: a copy of the folder (no checkout
around it) installed into a temporary target with TIERMOE_LIB naming the build's
library; the installed package, imported elsewhere with TIERMOE_LIB unset, loads
the copy of the library setup.py put beside it and tokenizes. Without TIERMOE_LIB
and any library, setup.py says what to build (TIERMOE_BUILD=0 skips the build)."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

import tiermoe

pytest.importorskip("setuptools")
if not (importlib.util.find_spec("wheel") or importlib.util.find_spec("setuptools.command.bdist_wheel")):
    pytest.skip("building a wheel offline needs the wheel package (setuptools < 70.1)", allow_module_level=True)


def pip_install(src, target, env):
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                           "--no-index", "--disable-pip-version-check", "--target", target, src],
                          capture_output=True, text=True, env=env, cwd=target)


def test_pip_install_bundles_the_library(tmp, vocab_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("pip is missing")
    work = os.path.join(tmp, "py-install")
    shutil.rmtree(work, ignore_errors=True)
    src, target = os.path.join(work, "src"), os.path.join(work, "site")
    shutil.copytree(os.path.join(ROOT, "python"), src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                                   "__pycache__"))
    os.makedirs(target)
    lib, _ = tiermoe.library_path()
    env = {**os.environ, "TIERMOE_LIB": lib}
    r = pip_install(src, target, env)
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(os.path.join(target, "tiermoe", "libtiermoe.so"))
    env.pop("TIERMOE_LIB")
    env["PYTHONPATH"] = target
    code = ("import tiermoe, sys; p, o = tiermoe.library_path(); print(o); "
            "print(tiermoe.Model(sys.argv[1]).tokenize('Hello world'))")
    r = subprocess.run([sys.executable, "-c", code, vocab_path], capture_output=True, text=True, env=env,
                       cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["bundled by pip install", "[9707, 1879]"]

    # no library anywhere, building refused: the message says what to do
    shutil.rmtree(target)
    os.makedirs(target)
    env = {k: v for k, v in os.environ.items() if k not in ("TIERMOE_LIB", "PYTHONPATH")}
    env["PKG_CONFIG_PATH"] = work  # no tiermoe.pc there
    r = pip_install(src, target, env)
    if r.returncode == 0:  # the system has a libtiermoe (ldconfig or pkg-config)
        assert "the system has libtiermoe" in r.stderr
    else:
        assert "TIERMOE_LIB" in r.stderr and "cmake" in r.stderr
