#!/usr/bin/env python3
"""`tiermoe run` and `tiermoe bench` as a user drives them.

- Greedy generation equals the argmax chain of the float64 reference's logits
  (teacher-forced on our own output; a near tie within the quantized path's
  error may flip, and then the rest is not compared).
- Same seed, same tokens; another seed, other tokens (temperature 1).
- Timings are printed in llama.cpp's format.
- Bad input: a prompt longer than the context, -n <= 0, unknown flags, a
  missing or unreadable file, a file that is not GGUF, a non-MoE or unknown
  architecture, a NaN RoPE base, a token id outside the vocabulary: a clear message and a
  non-zero exit, never a crash (the ASan build turns a crash into a failure).
- Placement flags: an -ot pattern that is not a regex or names an unknown
  buffer type, a bad --moe-pcie / --moe-cache / -ngl value: exit 2 naming the
  flag; an -ot pattern matching no tensor: a warning; --cpu-moe without a GPU:
  one line, then the CPU (the same tokens as CPU only).
- bench prints a llama-bench-shaped table; several values of -p/-n/-np/-t/-ngl/-ncmoe
  run every combination in order; -o csv, json and jsonl parse.
"""
import re
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import TIERMOE, TMP, TOOLS, check, finish  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402


def tm(*args):
    return subprocess.run([TIERMOE, *args], capture_output=True, text=True)


def generated(stdout):
    return [int(x) for x in stdout.split("|", 1)[1].split()]


def main():
    model = os.path.join(TMP, "run.gguf")
    r = tm("mkmodel", "--preset", "tiny", "-q", "-o", model)
    check(r.returncode == 0, f"mkmodel: {r.stderr}")
    prompt = [5, 77, 301, 12, 900, 44]

    # greedy vs the reference's argmax chain
    r = tm("run", "-m", model, "--tokens", ",".join(map(str, prompt)), "-n", "12", "--temp", "0", "-t", "2")
    check(r.returncode == 0, f"run greedy: {r.stderr}")
    out = generated(r.stdout)
    check(len(out) == 12, f"greedy run gave {len(out)} tokens, want 12")
    seq = prompt + out
    logits = ref.forward(model, seq[:-1])["logits"]
    for i, tok in enumerate(out):
        row = logits[len(prompt) - 1 + i]
        best = int(np.argmax(row))
        if tok != best:
            gap = row[best] - row[tok]
            check(gap < 0.05 * np.abs(row).max(), f"greedy token {i}: ours {tok}, reference argmax {best} (gap {gap:.3g})")
            print(f"  near tie at step {i} (gap {gap:.2g}); stopping the comparison there")
            break
    else:
        print(f"  greedy: 12 tokens equal the reference's argmax chain: {out}")
    for line in ("load time", "prompt eval time", "eval time", "total time", "tokens per second"):
        check(line in r.stderr, f"timings: '{line}' missing from\n{r.stderr}")

    # the expert tracer's switches: every evaluated token's k routing decisions, per layer
    trace_json = os.path.join(TMP, "trace.json")
    r = tm("run", "-m", model, "--tokens", "1,2,3,4", "-n", "6", "--temp", "0", "--expert-trace-stats",
           "--expert-trace-output", trace_json)
    check(r.returncode == 0 and os.path.exists(trace_json), f"run --expert-trace-stats: {r.stderr}")
    if os.path.exists(trace_json):
        import json
        layers = json.load(open(trace_json))["layers"]
        k = gguf.GGUFReader(model).fields["qwen3moe.expert_used_count"].contents()
        hits = {l["expert_hits_total"] for l in layers}
        check(hits == {(4 + 5) * k}, f"trace: hits per layer {hits}, want {(4 + 5) * k} (4 prompt + 5 decoded tokens)")
        print(f"  run --expert-trace-stats: {len(layers)} layers of {(4 + 5) * k} hits each")

    # sampling: seeds
    def sample(seed):
        r = tm("run", "-m", model, "--tokens", "1,2,3", "-n", "24", "--temp", "1", "--top-k", "0",
               "--top-p", "1", "--min-p", "0", "-s", str(seed))
        check(r.returncode == 0, f"run sampled: {r.stderr}")
        return generated(r.stdout)
    a, b, c = sample(7), sample(7), sample(8)
    check(a == b, "same seed gave different tokens")
    check(a != c, "different seeds gave the same 24 tokens")
    print("  sampling: same seed same tokens, other seed other tokens")

    # bad input
    not_gguf = os.path.join(TMP, "not.gguf")
    open(not_gguf, "wb").write(b"hello, this is not a model")
    unreadable = os.path.join(TMP, "unreadable.gguf")
    open(unreadable, "wb").write(open(model, "rb").read(4096))
    dense = os.path.join(TMP, "dense.gguf")
    w = gguf.GGUFWriter(dense, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    noexp = os.path.join(TMP, "noexp.gguf")
    w = gguf.GGUFWriter(noexp, "qwen3moe")
    for k, v in [("block_count", 1), ("embedding_length", 32), ("attention.head_count", 2),
                 ("attention.head_count_kv", 1), ("context_length", 64), ("expert_count", 0),
                 ("expert_used_count", 0), ("expert_feed_forward_length", 0)]:
        w.add_uint32(f"qwen3moe.{k}", v)
    w.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("qwen3moe.rope.freq_base", 1e4)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    # the tiny model with rope.freq_base NaN (patched in place: the f32 after the key's name
    # and type), which loaded and printed tokens from NaN logits with exit 0
    nan_rope = os.path.join(TMP, "nan_rope.gguf")
    data = bytearray(open(model, "rb").read())
    at = data.find(b"qwen3moe.rope.freq_base") + len("qwen3moe.rope.freq_base")
    check(data[at:at + 4] == (6).to_bytes(4, "little"), "rope.freq_base is not an f32 in the tiny model")
    data[at + 4:at + 8] = np.float32("nan").tobytes()
    open(nan_rope, "wb").write(data)
    long_prompt = ",".join(["1"] * 40)
    cases = [
        (["run", "-m", model, "--tokens", long_prompt, "-c", "32"], 2, "context"),
        (["run", "-m", model, "--tokens", "1,2", "-n", "0"], 2, "-n"),
        (["run", "-m", model, "--tokens", "1,2", "-n", "-5"], 2, "-n"),
        (["run", "-m", model, "--tokens", "1,2", "--frobnicate", "3"], 2, "--frobnicate"),
        (["run", "-m", model, "--tokens", "1,x"], 2, "--tokens"),
        (["run", "-m", model, "--tokens", "1,99999"], 1, "99999"),
        (["run", "-m", model, "-p", "hello"], 1, "vocabulary"),
        (["run", "-m", os.path.join(TMP, "nope.gguf"), "--tokens", "1"], 1, "nope.gguf"),
        (["run", "-m", not_gguf, "--tokens", "1"], 1, "not.gguf"),
        (["run", "-m", unreadable, "--tokens", "1"], 1, "unreadable.gguf"),
        (["run", "-m", dense, "--tokens", "1"], 1, "llama"),
        (["run", "-m", noexp, "--tokens", "1"], 1, "qwen3moe.expert_count is 0"),
        (["run", "-m", nan_rope, "--tokens", "1"], 1, "qwen3moe.rope.freq_base is nan"),
        (["run", "--tokens", "1"], 2, "-m"),
        (["run", "-m", model, "--tokens", "1", "--temp", "abc"], 2, "--temp"),
        (["bench", "-m", model, "-o", "xml"], 2, "-o"),
        (["bench", "-m", model, "-p", "8,x"], 2, "-p"),
        (["bench", "-m", model, "-n", "4,"], 2, "-n"),
        (["bench", "-m", model, "-t", ",".join(["1"] * 17)], 2, "-t"),
        (["bench", "-m", model, "-ngl", "0,many"], 2, "-ngl"),
        (["run", "-m", model, "--tokens", "1", "-ot", "blk\\.(=CPU"], 2, "-ot"),
        (["run", "-m", model, "--tokens", "1", "-ot", "exps=GPU1"], 2, "GPU1"),
        (["bench", "-m", model, "--override-tensor", "exps"], 2, "--override-tensor"),
        (["trace", "-m", model, "-o", "x.json", "-ot", "a=CPU,(=CPU"], 2, "-ot"),
        (["run", "-m", model, "--tokens", "1", "--moe-pcie", "x"], 2, "--moe-pcie"),
        (["run", "-m", model, "--tokens", "1", "--moe-pcie", "99"], 2, "--moe-pcie"),
        (["run", "-m", model, "--tokens", "1", "--moe-cache", "-3"], 2, "--moe-cache"),
        (["run", "-m", model, "--tokens", "1", "--moe-fetch", "always"], 2, "--moe-fetch"),
        (["run", "-m", model, "--tokens", "1", "--moe-cache-update", "x"], 2, "--moe-cache-update"),
        (["run", "-m", model, "--tokens", "1", "--moe-cache-weighting", "x"], 2,
         "--moe-cache-weighting"),
        (["run", "-m", model, "--tokens", "1", "--moe-cache-policy", "fifo"], 2,
         "--moe-cache-policy"),
        (["run", "-m", model, "--tokens", "1", "--moe-cache-curve", "99"], 2, "--moe-cache-curve"),
        (["run", "-m", model, "--tokens", "1", "--moe-cache-frob", "1"], 2, "--moe-cache-frob"),
        (["run", "-m", model, "--tokens", "1", "--moe-cache-plan", not_gguf], 1,
         "--moe-cache-plan"),
        (["run", "-m", model, "--tokens", "1", "-ngl", "abc"], 2, "-ngl"),
        (["run", "-m", model, "--tokens", "1", "--n-cpu-moe"], 2, "--n-cpu-moe"),
        (["frob"], 2, "unknown command"),
    ]
    for args, code, word in cases:
        r = tm(*args)
        ok = check(r.returncode == code, f"{' '.join(args[:1] + args[3:])}: exit {r.returncode}, want {code}: {r.stderr.strip()}")
        ok = ok and check(word in r.stderr, f"{' '.join(args[:1] + args[3:])}: message does not name {word!r}: {r.stderr.strip()}")
        check("AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, f"{args}: sanitizer report")
    print(f"  {len(cases)} bad inputs: clear messages, non-zero exits")

    # placement flags that still run: a pattern matching nothing warns; --cpu-moe
    # without a GPU says so once and gives CPU only's tokens
    base = tm("run", "-m", model, "--tokens", "1,2,3", "-n", "6")
    r = tm("run", "-m", model, "--tokens", "1,2,3", "-n", "6", "-ot", "nomatch=CPU")
    check(r.returncode == 0 and "matches no tensor" in r.stderr, f"-ot nomatch: {r.stderr}")
    r = tm("run", "-m", model, "--tokens", "1,2,3", "-n", "6", "--cpu-moe", "--moe-pcie", "2")
    check(r.returncode == 0, f"--cpu-moe: {r.stderr}")
    if "no usable GPU" in r.stderr:
        lines = [l for l in r.stderr.splitlines() if "GPU" in l]
        check(len(lines) == 1 and "running on the CPU" in lines[0], f"--cpu-moe, no GPU: {lines}")
        check(generated(r.stdout) == generated(base.stdout), "--cpu-moe without a GPU: other tokens")

    # bench table
    r = tm("bench", "-m", model, "-p", "16", "-n", "4", "-r", "2", "-t", "1,2", "--no-membw")
    check(r.returncode == 0, f"bench: {r.stderr}")
    rows = [l for l in r.stdout.splitlines() if l.startswith("| qwen3moe")]
    check(len(rows) == 4, f"bench: want 4 rows (pp16, tg4 at 1 and 2 threads), got\n{r.stdout}")
    check(all("±" in l for l in rows), "bench rows lack mean ± stddev")
    # the host's steal per test (where /proc/stat has it): one share per row, 0..100%
    if os.path.exists("/proc/stat"):
        steal = [l for l in r.stderr.splitlines() if l.startswith("host steal")]
        shares = re.findall(r" (pp16|tg4) ([0-9.]+)%", steal[0]) if steal else []
        check([t for t, _ in shares] == ["pp16", "tg4", "pp16", "tg4"]
              and all(0 <= float(v) <= 100 for _, v in shares),
              f"bench: want a host steal share per test, got {steal}")
    # with the probe: each test's own bandwidth, and "of mem" = weights / mem
    r = tm("bench", "-m", model, "-p", "16", "-n", "4", "-r", "1", "-t", "1")
    check(r.returncode == 0, f"bench with the probe: {r.stderr}")
    for l in [l for l in r.stdout.splitlines() if l.startswith("| qwen3moe")]:
        cells = [c.strip() for c in l.strip("|").split("|")]
        weights, mem, share = float(cells[7]), float(cells[8]), float(cells[9].rstrip("%"))
        # each cell is rounded (0.05 GB/s, 0.5%): the share must fit some pair
        # of true values that round to the printed ones
        lo = 100 * max(weights - 0.05, 0) / (mem + 0.05)
        hi = 100 * (weights + 0.05) / max(mem - 0.05, 1e-9)
        check(mem > 0 and lo - 0.5 <= share <= hi + 0.5,
              f"bench: bandwidth columns disagree: {l}")
    print(f"  bench: {len(rows)} rows")

    # several values: a context per (-ngl, -ncmoe, -t), every -p then every -n in it
    r = tm("bench", "-m", model, "-p", "8,16", "-n", "2,3", "-t", "1,2", "-r", "1", "--no-membw")
    tests = [(c[4], c[5]) for c in ([x.strip() for x in l.strip("|").split("|")]
                                    for l in r.stdout.splitlines() if l.startswith("| qwen3moe"))]
    want = [(t, n) for t in ("1", "2") for n in ("pp8", "pp16", "tg2", "tg3")]
    check(r.returncode == 0 and tests == want, f"bench lists: {tests}, want {want}: {r.stderr}")
    import json
    r = tm("bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "-ngl", "0", "-ncmoe", "0,1",
           "-o", "jsonl", "--no-membw")
    objs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    check(r.returncode == 0 and [(o["n_cpu_moe"], o["test"]) for o in objs]
          == [(0, "pp8"), (0, "tg2"), (1, "pp8"), (1, "tg2")]
          and all(o["ts_mean"] > 0 and o["n_gpu_layers"] == 0 for o in objs),
          f"bench -o jsonl: {r.stdout} {r.stderr}")
    # -np: tg tests over N sequences decoded together (a row each a step)
    r = tm("bench", "-m", model, "-p", "0", "-n", "3", "-np", "1,4", "-r", "1", "-o", "jsonl",
           "--no-membw")
    objs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    check(r.returncode == 0 and [(o["n_parallel"], o["test"]) for o in objs]
          == [(1, "tg3"), (4, "tg3 x4")] and all(o["ts_mean"] > 0 for o in objs),
          f"bench -np: {r.stdout} {r.stderr}")
    # -d: each test after an untimed prompt of that many tokens, named as llama-bench's; the
    # prompt's weight bytes are not the test's (bytes a token as at depth 0, within noise)
    r = tm("bench", "-m", model, "-p", "8", "-n", "2", "-d", "0,24", "-r", "2", "-o", "jsonl",
           "--no-membw")
    objs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    check(r.returncode == 0 and [(o["n_depth"], o["test"]) for o in objs]
          == [(0, "pp8"), (0, "tg2"), (24, "pp8 @ d24"), (24, "tg2 @ d24")],
          f"bench -d: {r.stdout} {r.stderr}")
    if r.returncode == 0:
        per_tok = {o["test"]: o["cpu_gbs"] / o["ts_mean"] for o in objs}
        check(per_tok["tg2 @ d24"] < 1.5 * per_tok["tg2"],
              f"bench -d: the depth's prompt counted in the test's bytes: {per_tok}")
    r = tm("bench", "-m", model, "-n", "2", "-d", "8", "-np", "2")
    check(r.returncode == 2 and "-d" in r.stderr, f"bench -d with -np 2: {r.returncode} {r.stderr}")
    r = tm("bench", "-m", model, "-n", "2", "-np", "0")
    check(r.returncode == 2 and "-np" in r.stderr, f"bench -np 0: {r.returncode} {r.stderr}")
    r = tm("bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "-o", "json", "--no-membw")
    arr = json.loads(r.stdout) if r.returncode == 0 else []
    check([o["test"] for o in arr] == ["pp8", "tg2"], f"bench -o json: {r.stdout}")
    # the shares stderr prints are in the records too (bench/results keeps only stdout):
    # the host's steal; the VRAM cache's share of routed slots, null without a cache
    check(all((o["host_steal"] is None or 0 <= o["host_steal"] <= 1)
              and o["vram_cache_hit"] is None and o["ahead_share"] is None for o in arr),
          f"bench -o json shares: {r.stdout}")
    mock = os.path.join(TOOLS, "tiermoe_mockgpu")
    if os.path.exists(mock):  # a VRAM cache on the host mock of the GPU
        r = subprocess.run([mock, "bench", "-m", model, "-p", "8", "-n", "4", "-r", "1", "-o",
                            "jsonl", "--no-membw", "--cpu-moe", "--moe-cache", "1"],
                           capture_output=True, text=True)
        objs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
        line = re.search(r"VRAM cache, routed slots served from it: pp8 ([0-9.]+)%, tg4 ([0-9.]+)%",
                         r.stderr)
        check(r.returncode == 0 and line is not None and len(objs) == 2
              and all(o["vram_cache_hit"] is not None
                      and abs(100 * o["vram_cache_hit"] - float(line.group(i + 1))) <= 0.05
                      for i, o in enumerate(objs)),
              f"bench -o jsonl vram_cache_hit against stderr's line: {r.stdout} {r.stderr}")
    r = tm("bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "-o", "csv", "--no-membw")
    lines = r.stdout.splitlines()
    check(r.returncode == 0 and len(lines) == 3 and lines[0].startswith("model,")
          and all(len(l.split(",")) == len(lines[0].split(",")) for l in lines[1:]),
          f"bench -o csv: {r.stdout}")

    # --profile: per-part times, and the CPU lane's thread time whose parts and
    # idle share add up to 100% of threads x wall
    r = tm("bench", "-m", model, "-p", "32", "-n", "2", "-r", "1", "-t", "2", "--no-membw",
           "--profile")
    check(r.returncode == 0, f"bench --profile: {r.stderr}")
    lanes = [l for l in r.stderr.splitlines() if "CPU lane, thread time" in l]
    check(len(lanes) == 2, f"bench --profile: want a CPU lane line per test, got\n{r.stderr}")
    for l in lanes:
        shares = [int(x) for x in re.findall(r"\((\d+)%\)", l)]
        ms = dict(re.findall(r"(gate\+up|down|idle) ([0-9.]+) ms", l))
        check(len(shares) == 7 and abs(sum(shares) - 100) <= 4,
              f"lane shares should sum to ~100%: {l}")
        check(float(ms.get("gate+up", 0)) > 0 and float(ms.get("down", 0)) > 0,
              f"lane line lacks product time: {l}")
    print(f"  bench --profile: {len(lanes)} lane lines")

    return finish("run and bench behave")


if __name__ == "__main__":
    sys.exit(main())
