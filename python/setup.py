"""pip install ./python: the package plus a copy of libtiermoe.so beside it, so the
installed package finds the library wherever it goes. The library is the one
TIERMOE_LIB names, else the checkout's build (build/release, build/dev, build/debug);
when neither has one and the system has none (ldconfig, pkg-config), it is built
here with CMake (build/release, target tiermoe_shared). TIERMOE_BUILD=0: never
build, install without a copy (the package then looks at run time: tiermoe/_find.py)."""
import importlib.util
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("_find", os.path.join(HERE, "tiermoe", "_find.py"))
_find = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_find)


def say(msg):
    print(f"tiermoe setup: {msg}", file=sys.stderr)


def build(repo):
    """Build libtiermoe.so in repo/build/release with CMake; its path."""
    out = os.path.join(repo, "build", "release")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cmds = [["cmake", "--build", out, "--target", "tiermoe_shared", "-j", str(os.cpu_count() or 1)]]
    if not os.path.exists(os.path.join(out, "CMakeCache.txt")):  # configured already: keep its choices
        cmds.insert(0, ["cmake", "-S", repo, "-B", out, *gen, "-DCMAKE_BUILD_TYPE=Release"])
    for c in cmds:
        say("running " + " ".join(c))
        if subprocess.run(c).returncode != 0:
            raise SystemExit(f"tiermoe setup: {' '.join(c)} failed; build the library yourself "
                             f"({_find.build_hint(repo)}, scripts/deps.sh installs what it needs) "
                             f"or set TIERMOE_LIB=/path/to/libtiermoe.so")
    return os.path.join(out, _find.LIB)


def library():
    """The libtiermoe.so to copy into the package, or None (the system's is used)."""
    for path, origin in _find.candidates(HERE, bundled=False, system=False):
        if origin.endswith("build/asan"):
            continue  # needs the sanitizer runtime preloaded: not for an installed package
        if os.path.isfile(path):
            say(f"using {path} ({origin})")
            return path
        if origin == "TIERMOE_LIB":
            raise SystemExit(f"tiermoe setup: TIERMOE_LIB: {path} does not exist")
    for name, origin in _find._system():
        say(f"the system has libtiermoe ({name}, {origin}): using it at run time")
        return None
    repo = _find.repo_root(HERE)
    if os.environ.get("TIERMOE_BUILD") == "0":
        say("no libtiermoe.so found and TIERMOE_BUILD=0: installing without one (set TIERMOE_LIB "
            "at run time)")
        return None
    if not repo or not shutil.which("cmake"):
        raise SystemExit("tiermoe setup: no libtiermoe.so found (TIERMOE_LIB, the checkout's build/, "
                         "the system) and " + ("cmake is missing" if repo else "this is not a checkout")
                         + f": build it ({_find.build_hint(repo)}) and set TIERMOE_LIB, "
                         "or TIERMOE_BUILD=0 to install without it")
    return build(repo)


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = library()
        if lib:
            shutil.copyfile(os.path.realpath(lib), os.path.join(self.build_lib, "tiermoe", _find.LIB))


class BinaryDistribution(Distribution):
    """A wheel holding the library is for this platform only."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
