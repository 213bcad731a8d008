#!/usr/bin/env python3
"""The GPU list's flags (-dev, --split-mode, --tensor-split, -mg, --moe-cache A,B)
as a user drives them, on the host mock with two devices (tiermoe_mockgpu,
MOCK_GPUS=2, MOCK_GPU_MIB each device's memory).

- One GPU of two: -dev CUDA1 and --split-mode none -mg 1 run on the second
  device (its log line names it; with 1 MiB on it the weights do not fit and
  the error names it), and route exactly as -dev CUDA0 does (the learn file's
  counts, timings left out: the same mock arithmetic on either device);
  -dev CUDA0,CUDA1 -ts 1,0 runs on the first after opening both. The mock,
  as CUDA, allocates and launches only on the thread's current device, so
  serve on -dev CUDA1 (steps on its slot threads, a cache plan applied from an
  HTTP thread) answers the same as on -dev CUDA0 only if those threads select
  the device.
- Bad input: -dev CUDA7, --tensor-split with a negative value or the wrong
  count, --moe-cache A,B with the wrong count, a cache above one GPU's free
  memory, -ot ...=CUDA1 when CUDA1 is not in the list: a non-zero exit and a
  message naming the flag and the GPU. run takes the flags through the public
  options (tm_context_opts.devices ...): -dev CUDA1 generates what -dev CUDA0
  does. Spans on both GPUs with experts in RAM and the SSD tier (--ram-cache):
  refused, naming the flag; --moe-cache A,B with one size above its GPU's free
  memory: the flag and the GPU named.
- Spans on both GPUs with every layer's experts on them (-ts 1,1 -ngl all):
  both GPUs hold weights and trace routes exactly as on -dev CUDA0; with the
  experts in RAM and the CPU lane alone (--cpu-moe --moe-pcie off --moe-fetch
  off, for both GPUs' layers) as -dev CUDA0 with the same flags; with
  --moe-cache 1,1 each GPU caches its own layers' experts (3 layers cached); run --profile
  prints a line a GPU, with a peer copy a step of n_embd floats a token into GPU 1 alone.
  --moe-ahead 2: each GPU copies ahead for its own layers (GPU 0 for layer 1,
  GPU 1's one layer none), routing as -dev CUDA0 with the same flags.
"""
import json
import os
import subprocess
import sys

from oracle_common import TIERMOE, TMP, TOOLS, check, finish  # noqa: E402
from server_harness import Server, make_model  # noqa: E402

MOCK = os.path.join(TOOLS, "tiermoe_mockgpu")


def trace(out, *args, mib="4096,4096"):
    env = dict(os.environ, MOCK_GPUS="2", MOCK_GPU_MIB=mib, TIERMOE_CALIB="none")
    return subprocess.run([MOCK, "trace", "-m", MODEL, "--prompts", PROMPTS, "-o", out, "-n", "8",
                           "-t", "2", *args], capture_output=True, text=True, env=env)


def counts(path):
    """The learn file without its timings."""
    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if not k.endswith("_ns") and "time" not in k}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    with open(path) as f:
        return strip(json.load(f))


def main():
    global MODEL, PROMPTS
    if not os.path.exists(MOCK):
        print("tiermoe_mockgpu not built: skipping")
        sys.exit(77)
    MODEL = os.path.join(TMP, "gpus.gguf")
    PROMPTS = os.path.join(TMP, "gpus.txt")
    r = subprocess.run([TIERMOE, "mkmodel", "--preset", "tiny", "-q", "-o", MODEL], capture_output=True,
                       text=True)
    check(r.returncode == 0, f"mkmodel: {r.stderr}")
    with open(PROMPTS, "w") as f:
        f.write("1,2,3,4,5,6\n9,8,7\n")

    # one GPU of two
    runs = {}
    for name, args in [("cuda0", ["-dev", "CUDA0"]), ("cuda1", ["-dev", "CUDA1"]),
                       ("mg1", ["-dev", "CUDA0,CUDA1", "-sm", "none", "-mg", "1"])]:
        out = os.path.join(TMP, f"gpus_{name}.json")
        r = trace(out, *args, "-ngl", "all")
        if check(r.returncode == 0, f"{name}: exit {r.returncode}: {r.stderr}"):
            runs[name] = counts(out)
            want = "GPU mock GPU 1:" if name != "cuda0" else "GPU mock GPU:"
            check(want in r.stderr, f"{name}: no '{want}' line in\n{r.stderr}")
    if len(runs) == 3:
        check(runs["cuda1"] == runs["cuda0"], "-dev CUDA1 routed otherwise than -dev CUDA0")
        check(runs["mg1"] == runs["cuda0"], "-sm none -mg 1 routed otherwise than -dev CUDA0")
    out = os.path.join(TMP, "gpus_ts10.json")
    r = trace(out, "-dev", "CUDA0,CUDA1", "-ts", "1,0", "-ngl", "all")
    check(r.returncode == 0 and "GPU mock GPU:" in r.stderr and os.path.exists(out) and
          counts(out) == runs.get("cuda0"), f"-ts 1,0: {r.returncode} {r.stderr}")
    # spans over both (experts on the GPUs): trace routes as on one GPU
    out = os.path.join(TMP, "gpus_ts11.json")
    r = trace(out, "-dev", "CUDA0,CUDA1", "-ts", "1,1", "-ngl", "all")
    check(r.returncode == 0 and "GPU mock GPU:" in r.stderr and "GPU mock GPU 1:" in r.stderr and
          os.path.exists(out) and counts(out) == runs.get("cuda0"),
          f"-ts 1,1 (spans): {r.returncode} {r.stderr}")
    # spans with the experts in RAM: the CPU lane for both GPUs' layers, as on one GPU
    lane = ["--cpu-moe", "--moe-pcie", "off", "--moe-fetch", "off", "--moe-ahead", "off"]
    r0 = trace(os.path.join(TMP, "gpus_cpumoe0.json"), "-dev", "CUDA0", "-ngl", "all", *lane)
    r = trace(os.path.join(TMP, "gpus_cpumoe11.json"), "-dev", "CUDA0,CUDA1", "-ts", "1,1", "-ngl",
              "all", *lane)
    check(r0.returncode == 0 and r.returncode == 0 and
          counts(os.path.join(TMP, "gpus_cpumoe11.json")) ==
          counts(os.path.join(TMP, "gpus_cpumoe0.json")),
          f"-ts 1,1 --cpu-moe (spans, experts in RAM): {r0.returncode} {r.returncode} {r.stderr}")
    # and each GPU's cache of its own layers' experts (--moe-cache A,B)
    r = trace(os.path.join(TMP, "gpus_cache11.json"), "-dev", "CUDA0,CUDA1", "-ts", "1,1", "-ngl",
              "all", "--cpu-moe", "--moe-cache", "1,1")
    check(r.returncode == 0 and "--moe-cache:" in r.stderr and "experts in VRAM over 3 layers" in r.stderr,
          f"-ts 1,1 --cpu-moe --moe-cache 1,1: {r.returncode} {r.stderr}")
    # each GPU's copies ahead for its own layers (the CPU lane beside them alone): as one GPU
    ahead = ["--cpu-moe", "--moe-pcie", "off", "--moe-fetch", "off", "--moe-ahead", "2"]
    r0 = trace(os.path.join(TMP, "gpus_ahead0.json"), "-dev", "CUDA0", "-ngl", "all", *ahead)
    r = trace(os.path.join(TMP, "gpus_ahead11.json"), "-dev", "CUDA0,CUDA1", "-ts", "1,1", "-ngl",
              "all", *ahead)
    check(r0.returncode == 0 and r.returncode == 0 and
          "each GPU copies for its own layers" in r.stderr and "CUDA0 1 layers, CUDA1 0 layers" in r.stderr and
          counts(os.path.join(TMP, "gpus_ahead11.json")) == counts(os.path.join(TMP, "gpus_ahead0.json")),
          f"-ts 1,1 --cpu-moe --moe-ahead 2: {r0.returncode} {r.returncode} {r.stderr}")
    # --moe-cache A,B is a cache as --moe-cache N is: without -ngl it means -ngl auto
    r = trace(os.path.join(TMP, "gpus_cache2.json"), "-dev", "CUDA0,CUDA1", "-ts", "1,0", "--moe-cache", "64,0")
    check(r.returncode == 0 and "-ngl auto" in r.stderr and "no GPU in use" not in r.stderr,
          f"--moe-cache 64,0 without -ngl: {r.returncode} {r.stderr}")
    r = trace(os.path.join(TMP, "gpus_small.json"), "-dev", "CUDA1", "-ngl", "all", mib="4096,1")
    check(r.returncode != 0 and "mock GPU 1" in r.stderr and "out of memory" in r.stderr,
          f"-dev CUDA1 with 1 MiB on it: {r.returncode} {r.stderr}")

    # serve on the second GPU: steps on slot threads, a plan applied from an HTTP thread
    smodel, _ = make_model("gpus_serve.gguf")
    answers = {}
    for dev in ("CUDA0", "CUDA1"):
        srv = Server(smodel, "-dev", dev, "-ngl", "all", "--cpu-moe", "--moe-cache", "1",
                     "--moe-cache-update", "off", "-ot", r"output\.weight=CPU", "-c", "256", binary=MOCK,
                     env={"MOCK_GPUS": "2", "TIERMOE_CALIB": "none"})
        try:
            r = srv.request("POST", "/v1/completions", {"prompt": "Hello world", "max_tokens": 6, "temperature": 0})
            check(r[0] == 200, f"serve -dev {dev}: {r}")
            plan = {"format": "tiermoe-moe-plan", "version": 1,
                    "model": {"arch": "qwen3moe", "n_layer": 3, "n_expert": 16, "n_expert_used": 4},
                    "weighting": "flat", "layer_curve": 1.0, "budget_bytes": 331776, "used_bytes": 331776,
                    "layers": [{"layer": l, "expert_bytes": 110592, "experts": e}
                               for l, e in enumerate([[5, 1, 7], [], []])]}
            status, body = srv.request("POST", "/moe-hot-cache", plan)
            check(status == 200 and body.get("applied"), f"serve -dev {dev}: plan apply {status} {body}")
            r2 = srv.request("POST", "/v1/completions", {"prompt": "Hello world", "max_tokens": 6, "temperature": 0})
            check(r2[0] == 200, f"serve -dev {dev} after the plan: {r2}")
            answers[dev] = (r[1].get("choices", [{}])[0].get("text") if r[0] == 200 else None,
                            r2[1].get("choices", [{}])[0].get("text") if r2[0] == 200 else None)
        finally:
            srv.stop()
        check(("mock GPU 1" in "".join(srv.lines)) == (dev == "CUDA1"), f"serve -dev {dev}: device line")
    check(answers.get("CUDA1") == answers.get("CUDA0") and None not in answers.get("CUDA0", (None,)),
          f"serve answers differ: {answers}")

    # bad input: the flag and the GPU named
    out = os.path.join(TMP, "gpus_bad.json")
    bad = [
        (["-dev", "CUDA7"], ["-dev: CUDA7: no such GPU", "2 present"]),
        (["-dev", "GPU1"], ["(-dev) 'GPU1'", "unknown device"]),
        (["--tensor-split", "1,-1"], ["(--tensor-split) '1,-1'", "not a proportion"]),
        (["-dev", "CUDA0,CUDA1", "-ts", "1,1,1", "-ngl", "all"], ["--tensor-split: 3 proportions for 2 GPUs"]),
        (["--moe-cache", "100,200,300", "--cpu-moe", "-dev", "CUDA0,CUDA1"], ["--moe-cache: 3 sizes for 2 GPUs"]),
        (["-dev", "CUDA1", "--cpu-moe", "--moe-cache", "3000"], ["--moe-cache 3000", "free on CUDA1"]),
        (["-ot", "exps=CUDA1", "-ngl", "all", "-dev", "CUDA0"], ["-ot 'exps=CUDA1'", "CUDA1 is not one of"]),
        (["-dev", "CUDA0,CUDA1", "-ts", "1,1", "-ngl", "all", "--cpu-moe", "--ram-cache", "64"],
         ["--ram-cache", "over 2 GPUs the SSD tier is one GPU's so far"]),
        (["-dev", "CUDA0,CUDA1", "-ts", "1,1", "-ngl", "all", "--cpu-moe", "--moe-cache", "1,3000"],
         ["--moe-cache A,B: 3000", "free on CUDA1"]),
        (["-sm", "row"], ["row: not supported"]),
        (["-mg", "x"], ["-mg", "'x'"]),
    ]
    for args, needles in bad:
        r = trace(out, *args, mib="4096,1024")
        check(r.returncode != 0, f"{' '.join(args)}: exit 0")
        for n in needles:
            check(n in r.stderr, f"{' '.join(args)}: '{n}' not in\n{r.stderr}")
    # run takes the GPU list through the public options (tm_context_opts.devices)
    env = dict(os.environ, MOCK_GPUS="2", TIERMOE_CALIB="none")
    got = {}
    for dev in ("CUDA0", "CUDA1"):
        r = subprocess.run([MOCK, "run", "-m", MODEL, "--tokens", "1,2,3", "-n", "12", "--temp", "0",
                            "--verbose-prompt", "-ngl", "all", "-dev", dev, "-t", "2"],
                           capture_output=True, text=True, env=env)
        check(r.returncode == 0, f"run -dev {dev}: exit {r.returncode}: {r.stderr}")
        check(("mock GPU 1" in r.stderr) == (dev == "CUDA1"), f"run -dev {dev}: device line in\n{r.stderr}")
        got[dev] = r.stdout
    check(got["CUDA0"] == got["CUDA1"] and got["CUDA0"], f"run -dev CUDA1 generated otherwise: {got}")
    # run --profile over spans: a line a GPU, the residual copied into GPU 1 once a step
    # (n_embd 256 floats a token), none into GPU 0
    r = subprocess.run([MOCK, "run", "-m", MODEL, "--tokens", "1,2,3", "-n", "6", "--temp", "0", "-ngl", "all",
                        "-dev", "CUDA0,CUDA1", "-ts", "1,1", "-t", "2", "--profile"],
                       capture_output=True, text=True, env=env)
    lines = {g: next((x for x in r.stderr.splitlines() if x.startswith(f"  GPU {g} (")), "") for g in (0, 1)}
    check(r.returncode == 0 and "peer copies: 0.00 a step, 0.00 KB a token" in lines[0] and
          "peer copies: 1.00 a step, 1.02 KB a token" in lines[1] and "its 1 layers'" in lines[1],
          f"run --profile -ts 1,1: {r.returncode}\n{r.stderr[-3000:]}")
    return finish(f"GPU list flags: one GPU of two routes as CUDA0 ({len(runs)} runs), {len(bad)} bad inputs named")


if __name__ == "__main__":
    sys.exit(main())
