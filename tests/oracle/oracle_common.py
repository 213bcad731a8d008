"""What the oracle tests share: where CTest puts the binaries and data, a
temporary folder, running a tool, and collecting failures so a test reports
all of them and exits non-zero (CTest's convention: 0 pass, 77 skipped)."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("TM_BIN_DIR", "build")
TOOLS = os.environ.get("TM_TOOLS_DIR", os.path.join(BIN, "tests"))
DATA = os.environ.get("TM_TEST_DATA", os.path.join(HERE, "..", "data"))
TMP = os.environ.get("TM_TEST_TMP") or tempfile.mkdtemp()
os.makedirs(TMP, exist_ok=True)
TIERMOE = os.path.join(BIN, "tiermoe")
sys.path.insert(0, os.path.join(HERE, "..", "ref"))

failures = []


def check(cond, msg):
    """Record msg as a failure unless cond holds; returns cond."""
    if not cond:
        failures.append(msg)
    return cond


CPU_LEVELS = ["scalar", "avx2", "avx512", "amx"]


def cpu_level():
    """The CPU kernel level tiermoe runs at here: TIERMOE_CPU_LEVEL capped at
    the machine's best, or the best (as src/cpu/cpu_features.c decides)."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    best = 0
    if {"avx2", "fma", "f16c"} <= flags:
        best = 1
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags:
            best = 3 if "amx_int8" in flags else 2
    want = os.environ.get("TIERMOE_CPU_LEVEL", "").lower()
    want = "avx512" if want in ("vnni", "avx512vnni", "avx512-vnni", "avx512_vnni") else want
    return CPU_LEVELS[min(best, CPU_LEVELS.index(want))] if want in CPU_LEVELS else CPU_LEVELS[best]


def run(cmd):
    """Run a command that must succeed; its stdout."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def finish(ok_msg):
    """Print the failures or ok_msg; the process exit code."""
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(ok_msg)
    return 0


def jinja_chat_render(template, msgs, add_gen, extra=None):
    """Render a model's chat template the way HF's apply_chat_template does
    (msgs: (role, content) pairs). Needs jinja2."""
    import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(m):
        raise jinja2.exceptions.TemplateError(m)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template).render(messages=[{"role": r, "content": c} for r, c in msgs],
                                            add_generation_prompt=add_gen, **(extra or {}))
