"""Where libtiermoe.so is, in the order the package looks (setup.py uses it too,
so it imports nothing of the package and nothing outside the standard library):

1. ``TIERMOE_LIB``: a path to the library, or to the folder holding it;
2. the copy ``pip install`` put beside the package (setup.py);
3. the build folders of the checkout the package lies in (python/ of the repo):
   build/release, build/dev, build/debug, build/asan;
4. the system: ``ctypes.util.find_library`` (ldconfig), then ``pkg-config tiermoe``.
"""
import ctypes.util
import mmap
import os
import shutil
import subprocess

LIB = "libtiermoe.so"
REPO_BUILDS = ("release", "dev", "debug", "asan")


def repo_root(start):
    """The tiermoe checkout holding folder start (the one with include/tiermoe.h), or None."""
    d = os.path.abspath(start)
    for _ in range(3):
        if os.path.isfile(os.path.join(d, "include", "tiermoe.h")) and os.path.isfile(
                os.path.join(d, "CMakeLists.txt")):
            return d
        d = os.path.dirname(d)
    return None


def _system():
    name = ctypes.util.find_library("tiermoe")
    if name:
        yield name, "system (ldconfig)"
    if shutil.which("pkg-config"):
        r = subprocess.run(["pkg-config", "--variable=libdir", "tiermoe"], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            yield os.path.join(r.stdout.strip(), LIB), "pkg-config tiermoe"


def candidates(pkg_dir, bundled=True, system=True):
    """(path or name, where it came from) for each place to look, best first."""
    env = os.environ.get("TIERMOE_LIB")
    if env:
        yield os.path.abspath(os.path.join(env, LIB) if os.path.isdir(env) else env), "TIERMOE_LIB"
        return  # an explicit choice: nothing else is tried
    if bundled:
        yield os.path.join(pkg_dir, LIB), "bundled by pip install"
    repo = repo_root(pkg_dir)
    if repo:
        for b in REPO_BUILDS:
            yield os.path.join(repo, "build", b, LIB), f"the checkout's build/{b}"
    if system:
        yield from _system()


def needs_asan(path):
    """Whether the library was linked with AddressSanitizer (its runtime must then be
    loaded first: LD_PRELOAD), read from the file without loading it."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b"libasan.so") >= 0
    except (OSError, ValueError):
        return False


def asan_loaded():
    """Whether this process already has the AddressSanitizer runtime."""
    try:
        with open("/proc/self/maps") as f:
            return "libasan" in f.read()
    except OSError:
        return False


def build_hint(repo):
    """The commands that build the library, for messages."""
    src = repo or "TIERMOE_SOURCE"
    return (f"cmake -S {src} -B {src}/build/release -G Ninja -DCMAKE_BUILD_TYPE=Release && "
            f"cmake --build {src}/build/release --target tiermoe_shared")
