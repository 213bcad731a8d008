#!/usr/bin/env python3
"""The SSD tier through the CLI, on a real file on disk (no mocks of the disk):

- `run --ram-cache 1` (1 MiB: fewer slots a layer than the experts a token
  uses, so every layer evicts every step) generates the same greedy tokens
  as the run that reads the mapping, on the CPU and, with the host mock of
  the GPU backend, with --cpu-moe; --profile prints the SSD tier's line
  (experts faulted per token > 0, bytes read per token).
- `bench --ram-cache` prints the faults per test.
- A read that keeps failing (TIERMOE_STORE_FAIL_READ) ends the run with exit
  1 and a message naming the offset, and no generated token; one that a
  retry fixes changes nothing.
- Bad values of --ram-cache: exit 2 naming the flag.
- `calibrate --drive` prints MB/s and reads/s by queue depth.
"""
import os
import re
import subprocess
import sys

from oracle_common import TIERMOE, TOOLS, TMP, check, finish  # noqa: E402

MOCK = os.path.join(TOOLS, "tiermoe_mockgpu")


def tm(*args, binary=TIERMOE, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([binary, *args], capture_output=True, text=True, env=e)


def generated(stdout):
    return stdout.split("|", 1)[1].split()


def main():
    model = os.path.join(TMP, "ssd.gguf")
    r = tm("mkmodel", "--preset", "tiny", "--n-expert", "32", "-q", "-o", model)
    check(r.returncode == 0, f"mkmodel: {r.stderr}")
    gen = ["-m", model, "--tokens", "5,77,301,12,900,44,8,19,250,3,61,700", "-n", "10",
           "--temp", "0", "-t", "2"]

    ref = tm("run", *gen)
    check(ref.returncode == 0, f"run: {ref.stderr}")
    want = generated(ref.stdout)
    r = tm("run", *gen, "--ram-cache", "1", "--profile")
    check(r.returncode == 0, f"run --ram-cache 1: {r.stderr}")
    if r.returncode == 0:
        check(generated(r.stdout) == want,
              f"--ram-cache 1 gave {generated(r.stdout)}, the mapping {want}")
        m = re.search(r"SSD tier \(--ram-cache\): ([0-9.]+) experts faulted per token.*?"
                      r"([0-9.]+) MB read per token", r.stderr)
        check(m is not None, f"no SSD tier line in --profile: {r.stderr}")
        if m:
            check(float(m.group(1)) > 0 and float(m.group(2)) > 0,
                  f"faults and bytes per token should be > 0: {m.group(0)}")

    if os.path.exists(MOCK):  # --cpu-moe on the mock GPU: the decode hand-off reads the store
        # the lanes --ram-cache turns off are off in the reference: the same CPU lane sums
        ref_gpu = tm("run", *gen, "--cpu-moe", "--moe-pcie", "off", "--moe-fetch", "off",
                     binary=MOCK)
        check(ref_gpu.returncode == 0, f"mock --cpu-moe: {ref_gpu.stderr}")
        r = tm("run", *gen, "--cpu-moe", "--ram-cache", "1", binary=MOCK)
        check(r.returncode == 0, f"mock --cpu-moe --ram-cache 1: {r.stderr}")
        if r.returncode == 0 and ref_gpu.returncode == 0:
            check(generated(r.stdout) == generated(ref_gpu.stdout),
                  f"mock --cpu-moe --ram-cache: {generated(r.stdout)} vs {generated(ref_gpu.stdout)}")

    r = tm("bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "-t", "2", "--ram-cache", "1")
    check(r.returncode == 0, f"bench --ram-cache: {r.stderr}")
    check(len(re.findall(r"experts faulted per token", r.stderr)) == 2,
          f"bench should print the SSD tier for pp and tg: {r.stderr}")

    r = tm("run", *gen, "--ram-cache", "1", env={"TIERMOE_STORE_FAIL_READ": "3:once"})
    check(r.returncode == 0 and generated(r.stdout) == want,
          f"a read that a retry fixes changed the run: {r.returncode} {r.stdout} {r.stderr}")
    r = tm("run", *gen, "--ram-cache", "1", env={"TIERMOE_STORE_FAIL_READ": "3"})
    check(r.returncode == 1, f"a failing read: exit {r.returncode}, want 1")
    check("offset" in r.stderr and "failed 3 times" in r.stderr,
          f"a failing read should name the offset and the tries: {r.stderr}")
    check("|" not in r.stdout or not generated(r.stdout),
          f"a failing read generated tokens: {r.stdout}")

    for bad in ["0", "-5", "abc", "1.5"]:
        r = tm("run", *gen, "--ram-cache", bad)
        check(r.returncode == 2 and "--ram-cache" in r.stderr,
              f"--ram-cache {bad}: exit {r.returncode}, {r.stderr}")

    r = tm("calibrate", "-m", model, "--drive", "--drive-seconds", "0.05")
    check(r.returncode == 0, f"calibrate --drive: {r.stderr}")
    rows = re.findall(r"^\| (\d+) KiB \| (\d+) \| (\d+) \| (\d+) \|", r.stdout, re.M)
    check(len(rows) == 10 and all(int(x[3]) > 0 for x in rows),
          f"calibrate --drive should print 10 rows of MB/s and reads/s: {r.stdout}")
    # serve --ram-cache: /metrics shows the SSD tier's counters
    if tm("serve", "--help").returncode == 0:  # a build with libmicrohttpd
        from server_harness import Server, make_model  # noqa: E402
        vmodel, _ = make_model("ssd_serve.gguf")
        srv = Server(vmodel, "--ram-cache", "1", "-t", "2")
        try:
            st, _ = srv.request("POST", "/v1/completions", {"prompt": "Hello there", "max_tokens": 4})
            check(st == 200, f"serve --ram-cache: completion status {st}")
            st, text = srv.request("GET", "/metrics")
            m = re.search(r"^tiermoe_ssd_experts_faulted_total (\d+)$", str(text), re.M)
            check(st == 200 and m is not None and int(m.group(1)) > 0,
                  f"/metrics should count faulted experts: {str(text)[-600:]}")
        finally:
            srv.stop()
        os.remove(vmodel)
    os.remove(model)
    return finish("ssd cli: ok")


if __name__ == "__main__":
    sys.exit(main())
