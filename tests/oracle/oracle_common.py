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


def cpu_level():
    """The CPU kernel level tiermoe runs at here (TIERMOE_CPU_LEVEL capped at the
    machine's best), as the library decides it: tests/tools/cpu_level_run --print."""
    tool = os.path.join(os.environ["TM_TOOLS_DIR"], "cpu_level_run")
    return subprocess.run([tool, "--print"], capture_output=True, text=True, check=True).stdout.strip()


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
