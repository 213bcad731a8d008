#!/usr/bin/env python3
"""Routing profiles and temporal locality of `tiermoe mkmodel` (docs/mkmodel.md).

- Same bytes: the default tiny model is byte for byte what the build before
  --locality wrote (its sha256, recorded with that build), and --locality 0 does
  not change it.
- What locality changes, tensor row by tensor row, against a model without it
  (same seed): exactly the rows the design names (token embeddings, the recency
  head of layer 0, the writers of the topic subspace, the routers); every other
  row is byte-identical.
- The recency head, recomputed from the file with numpy (its q and k rows, QK-norm
  weights and NeoX RoPE): attention weights fall by e every `span` tokens and a
  4096-token context leaves under 2% of them beyond 6 spans.
- The profile's statistics through tiermoe's forward (tiny width, 128 experts
  top-8, random tokens): near the Qwen3-30B-A3B targets, and uniform far from
  them; the bands are stated below with why.
- The float64 reference (tests/ref/qwen3moe_ref.py) routes a short prompt of the
  profile model as tiermoe does: the file is a plain qwen3moe.
- tiermoe trace + report measure the same statistics and label the model's
  synthetic routing; bench and run --profile print the label.
- Bad knob values and --routing with a knob are refused, naming the flag.
"""
import hashlib
import os
import re
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import TIERMOE, TMP, TOOLS, check, failures, finish, run  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402
from routing_health import profile_stats  # noqa: E402

# sha256 of `tiermoe mkmodel -q -o x.gguf` (tiny preset, seed 42) written by the build
# before --locality existed (main at 9e17ffc). A deliberate change of the generator or the
# quantizers must update it; anything else that changes it is a bug.
TINY_SHA256 = "ea53e4f28606c86c83bb20b7b0395823b43deba13f949f179f10abf0c5d14f2c"
TARGETS = dict(top_half=0.90, top1=0.043, reuse_prev=0.45, reuse_win=0.80)


def mk(name, *flags):
    path = os.path.join(TMP, name + ".gguf")
    run([TIERMOE, "mkmodel", "-q", "-t", "2", "-o", path, *flags])
    return path


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def same_bytes():
    p0 = mk("plain")
    p1 = mk("loc0", "--locality", "0", "--locality-span", "3")
    check(sha(p0) == TINY_SHA256, f"the default tiny model changed: sha256 {sha(p0)}, the build before "
                                  f"--locality wrote {TINY_SHA256}")
    check(sha(p1) == sha(p0), "--locality 0 changed the file")
    print("  default tiny model: the bytes of the build before --locality; --locality 0 the same")
    return p0


def rows_of(t):
    """Raw bytes of a tensor as [rows, bytes per row]."""
    data = np.asarray(t.data)
    return data.reshape(int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1, -1).view(np.uint8)


def changed_rows(plain, loc_path, head_dim=64, n_q_group=2):
    """Rows locality may change, by the design in synth.h, and a check that no other changed."""
    a = {t.name: t for t in gguf.GGUFReader(plain).tensors}
    b = {t.name: t for t in gguf.GGUFReader(loc_path).tensors}
    T = set(range(1, 1 + head_dim))  # the topic subspace
    n_embd = int(a["token_embd.weight"].shape[0])
    touched = 0
    for name in a:
        ra, rb = rows_of(a[name]), rows_of(b[name])
        diff = set(np.nonzero(np.any(ra != rb, axis=1))[0].tolist())
        n = ra.shape[0]
        layer0 = name.startswith("blk.0.")
        kind = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        if kind == "token_embd":
            allowed = set(range(n))
        elif kind == "attn_q" and layer0:
            allowed = set(range(n_q_group * head_dim))
        elif kind in ("attn_k", "attn_v") and layer0:
            allowed = set(range(head_dim))
        elif kind == "attn_output":
            allowed = set(range(n)) if layer0 else T
        elif kind in ("attn_q_norm", "attn_k_norm") and layer0:
            allowed = {0}
        elif kind == "ffn_gate_inp":
            allowed = set(range(n))
        elif kind == "ffn_down_exps":
            allowed = {r for r in range(n) if r % n_embd in T}
        else:
            allowed = set()
        extra = diff - allowed
        check(not extra, f"--locality changed {name} rows {sorted(extra)[:5]} that the design leaves alone")
        touched += len(diff)
        # the rows it must change did change (all of them for the head and the writers of T)
        must = allowed if kind != "token_embd" else set()
        check(must <= diff, f"--locality left {name} rows {sorted(must - diff)[:5]} unchanged")
    print(f"  --locality changed {touched} rows, all of them where the design says, every other row identical")


def recency_weights(path, n_ctx=4096):
    """Attention weights of layer 0's recency head by lag, from the file's own weights."""
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    base = float(r.fields["qwen3moe.rope.freq_base"].parts[-1][0])
    d = int(r.fields["qwen3moe.attention.key_length"].parts[-1][0])

    def col0(name, rows):
        w = gguf.quants.dequantize(t[name].data, t[name].tensor_type).reshape(-1, t[name].shape[0])
        v = w[:rows, 0].astype(np.float64) * 2.0  # what the bias channel (2) contributes
        return v

    def qk_norm(v, name):
        g = gguf.quants.dequantize(t[name].data, t[name].tensor_type).astype(np.float64).ravel()
        return v / np.sqrt(np.mean(v * v) + 1e-6) * g

    q = qk_norm(col0("blk.0.attn_q.weight", d), "blk.0.attn_q_norm.weight")
    k = qk_norm(col0("blk.0.attn_k.weight", d), "blk.0.attn_k_norm.weight")
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    lag = np.arange(n_ctx)[:, None] * theta[None, :]
    h = d // 2
    # NeoX: pair (i, i + d/2) rotated by lag*theta_i; q at position p, k at p - lag
    score = ((q[:h] * k[:h] + q[h:] * k[h:]) * np.cos(lag) + (q[:h] * k[h:] - q[h:] * k[:h]) * np.sin(lag)).sum(1)
    score /= np.sqrt(d)
    w = np.exp(score - score.max())
    return w / w.sum()


def recency(path, span):
    w = recency_weights(path)
    lags = np.arange(2, int(3 * span))
    slope = np.polyfit(lags, np.log(w[lags]), 1)[0]
    far = w[int(6 * span):].sum()
    print(f"  recency head: log-weight slope {slope:.4f} per token over lags 2..{3 * span:.0f} "
          f"(-1/span = {-1 / span:.4f}), weight beyond 6 spans in 4096 tokens {far:.4f}")
    check(abs(slope * span + 1) < 0.15, f"recency head decays as exp({slope:.4f} lag), want exp(-lag / {span})")
    check(far < 0.02, f"recency head leaves {far:.3f} of its attention beyond 6 spans")


def engine_ids(model, tokens, n_prompt, extra=()):
    out = os.path.join(TMP, "route.gguf")
    run([os.path.join(TOOLS, "forward_dump"), model, "--tokens", ",".join(map(str, tokens)),
         "--prompt", str(n_prompt), "-o", out, *extra])
    d, _ = ref.read_dump(out)
    os.remove(out)
    layers = sorted(int(n.split(".")[1]) for n in d if n.endswith("topk_ids"))
    return [np.asarray(d[f"blk.{l}.topk_ids"], dtype=np.int64) for l in layers], d


SEQS, N_TOK, N_PROMPT = 3, 192, 96


def stats_of(model, seed, n_seqs=SEQS):
    """Per-layer profile statistics over n_seqs sequences of random tokens (prompt + decode)."""
    rng = np.random.default_rng(seed)
    per_layer, seqs = None, []
    for _ in range(n_seqs):
        toks = rng.integers(0, 1024, N_TOK).tolist()
        seqs.append(toks)
        ids, _ = engine_ids(model, toks, N_PROMPT)
        per_layer = [[] for _ in ids] if per_layer is None else per_layer
        for l, a in enumerate(ids):
            per_layer[l].append(a)
    return [profile_stats(p, 128) for p in per_layer], seqs


def mean_stats(stats):
    return {k: float(np.mean([s[k] for s in stats])) for k in TARGETS}


def profile_case():
    shape = ["--n-expert", "128", "--n-expert-used", "8", "--n-layer", "2", "--seed", "5"]
    prof = mk("profile", *shape, "--routing", "qwen3-30b-a3b")
    uni = mk("uniform", *shape, "--routing", "uniform")
    # Bands: measured at this size (3 x 192 tokens, 2 layers of tiny width), the profile's
    # statistics land within about 1.5 points of the targets (top-1 share 0.5 point) and move
    # between seeds by about as much; a missing locality drops reuse by 30 points, a missing
    # skew the top-half share by 30. So: +-4 points, top-1 share 3.0..6.5%.
    bands = dict(top_half=(0.86, 0.94), top1=(0.030, 0.065), reuse_prev=(0.41, 0.49), reuse_win=(0.76, 0.84))
    ps, seqs = stats_of(prof, 21)
    us, _ = stats_of(uni, 21, 1)
    pm, um = mean_stats(ps), mean_stats(us)
    for key, (lo, hi) in bands.items():
        print(f"  {key:<10}: profile {100 * pm[key]:5.1f}% (per layer "
              f"{', '.join(f'{100 * s[key]:.1f}' for s in ps)}), uniform {100 * um[key]:5.1f}%, "
              f"target {100 * TARGETS[key]:.1f}%, band {100 * lo:.1f}..{100 * hi:.1f}")
        check(lo <= pm[key] <= hi, f"profile {key} {pm[key]:.4f} outside {lo}..{hi}")
    # uniform: what independent uniform routing gives (k/E = 6.25% shared with the previous token)
    check(um["reuse_prev"] < 0.10 and um["top_half"] < 0.65 and um["top1"] < 0.02,
          f"uniform profile is not uniform: {um}")
    return prof, seqs


def reference_case(prof):
    """The float64 reference routes a short prompt as tiermoe does (near ties aside)."""
    toks = np.random.default_rng(4).integers(0, 1024, 24).tolist()
    want = ref.forward(prof, toks, want_logits=False)
    ids, d = engine_ids(prof, toks, 12, ("--precise", "--kv", "f32"))
    same = total = flips = 0
    for l, g in enumerate(ids):
        w = np.sort(np.asarray(want[f"blk.{l}.topk_ids"]), axis=1)
        g = np.sort(g, axis=1)
        logits = np.asarray(want[f"blk.{l}.router_logits"])
        ours = np.asarray(d[f"blk.{l}.router_logits"]).reshape(logits.shape)
        for t in range(len(toks)):
            total += 1
            if np.array_equal(w[t], g[t]):
                same += 1
                continue
            srt = np.sort(logits[t])[::-1]
            gap = srt[7] - srt[8]
            if gap < 4 * np.abs(ours[t] - logits[t]).max():
                flips += 1  # a near tie: either answer is right
            else:
                failures.append(f"reference: layer {l} token {t}: ids {g[t].tolist()} != {w[t].tolist()}")
    # the reference sees the locality too: consecutive tokens share far more than k/E
    share = np.mean([len(set(want["blk.1.topk_ids"][t]) & set(want["blk.1.topk_ids"][t - 1])) / 8
                     for t in range(1, len(toks))])
    print(f"  float64 reference: {same} of {total} top-8 sets equal, {flips} near ties; reference's "
          f"layer 1 shares {100 * share:.0f}% with the previous token")
    check(share > 0.25, f"the reference's routing shows no locality ({share:.2f})")


def report_case(prof, seqs):
    """trace + report on the profile model measure the statistics python counts here."""
    seqs = [s[:128] for s in seqs[:2]]
    prompts = os.path.join(TMP, "prompts.txt")
    with open(prompts, "w") as f:
        for s in seqs:
            f.write(",".join(map(str, s)) + "\n")
    learn = os.path.join(TMP, "learn.json")
    run([TIERMOE, "trace", "-m", prof, "--prompts", prompts, "-n", "0", "-t", "2", "-o", learn])
    out = run([TIERMOE, "report", learn, "--summary"])
    head = re.search(r"routing statistics, synthetic routing: (.*):", out)
    check(head is not None and head.group(1).startswith("qwen3-30b-a3b"),
          f"report does not label the profile:\n{out}")
    rows = re.findall(r"^  (\S.*?)\s{2,}\s*([\d.]+)% \(([\d.]+)\.\.([\d.]+)\)\s+([\d.]+)%$", out, re.M)
    check(len(rows) == 4, f"report: {len(rows)} statistic rows, want 4:\n{out}")
    # the same tokens as prompts only (no decode): python's statistics of the engine's routing
    per_layer = None
    for s in seqs:
        ids, _ = engine_ids(prof, s, len(s))
        per_layer = [[] for _ in ids] if per_layer is None else per_layer
        for l, a in enumerate(ids):
            per_layer[l].append(a)
    py = mean_stats([profile_stats(p, 128) for p in per_layer])
    for (name, mean, _lo, _hi, target), key in zip(rows, ("top_half", "top1", "reuse_prev", "reuse_win")):
        check(abs(float(mean) / 100 - py[key]) < 0.0011,
              f"report {name}: {mean}%, counted here {100 * py[key]:.2f}%")
        check(abs(float(target) / 100 - TARGETS[key]) < 1e-9, f"report {name}: target {target}%")
    print(f"  report: {', '.join(f'{r[1]}%' for r in rows)} (python: "
          f"{', '.join(f'{100 * py[k]:.2f}%' for k in ('top_half', 'top1', 'reuse_prev', 'reuse_win'))})")


def label_case(prof, plain):
    r = run_stderr([TIERMOE, "bench", "-m", prof, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "--no-membw"])
    check("synthetic routing: qwen3-30b-a3b: skew" in r, f"bench does not label the profile:\n{r}")
    r = run_stderr([TIERMOE, "bench", "-m", plain, "-p", "8", "-n", "2", "-r", "1", "-t", "1", "--no-membw"])
    check("synthetic routing: uniform" in r, f"bench does not label a plain mkmodel file:\n{r}")
    r = run_stderr([TIERMOE, "run", "-m", prof, "--tokens", "1,2,3", "-n", "2", "--temp", "0", "-t", "1",
                    "--profile"])
    check("synthetic routing: qwen3-30b-a3b" in r, f"run --profile does not label the profile:\n{r}")
    print("  bench and run --profile print the synthetic routing")


def bad_input():
    import subprocess
    bad = os.path.join(TMP, "bad.gguf")
    for flags, word in [(["--locality", "1"], "--locality"), (["--locality", "-0.1"], "--locality"),
                        (["--locality", "0.5", "--locality-span", "0.1"], "--locality-span"),
                        (["--skew-offset", "-3"], "--skew-offset"), (["--routing", "qwen9"], "qwen9"),
                        (["--routing", "uniform", "--skew", "1"], "--skew"),
                        (["--locality", "0.5", "--head-dim", "128", "--n-head", "2", "--n-head-kv", "1"],
                         "--n-embd >= 2 * --head-dim")]:
        r = subprocess.run([TIERMOE, "mkmodel", "-q", "-o", bad, *flags], capture_output=True, text=True)
        check(r.returncode == 2 and word in r.stderr,
              f"mkmodel {' '.join(flags)}: exit {r.returncode}, want 2 naming {word!r}: {r.stderr.strip()}")
    check(not os.path.exists(bad), "a refused mkmodel left a file behind")
    print("  bad knob values and combinations: exit 2 naming the flag")


def run_stderr(cmd):
    import subprocess
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr}")
    return r.stderr


def main():
    plain = same_bytes()
    loc = mk("loc", "--locality", "0.6", "--locality-span", "6")
    changed_rows(plain, loc)
    recency(loc, 6)
    prof, seqs = profile_case()
    reference_case(prof)
    report_case(prof, seqs)
    label_case(prof, plain)
    bad_input()
    return finish("routing profiles: same bytes without locality, the design's rows, the statistics, "
                  "the reference, report and labels")


if __name__ == "__main__":
    sys.exit(main())
