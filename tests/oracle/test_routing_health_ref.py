#!/usr/bin/env python3
"""Routing health of synthetic models (issue 2, `tiermoe mkmodel`), measured with
the float64 numpy reference (tests/ref/routing_health.py) rather than the C
engine (test_routing_health.py measures the same through the C forward; this
one does not depend on the engine being right).

Part A, the measuring functions themselves (always; a second):
  - zipf_fit recovers the exponent of exact power-law counts (to 1e-9), and
    consecutive_overlap / distinct_experts match hand-computed cases;
  - overlap_null and distinct_expected agree with a Monte Carlo of random
    top-k sets (within 5 standard errors of the simulation);
  - on the HF tiny model (tests/data/hf_qwen3moe/tiny-f32.gguf) the routing
    trace equals the HF golden's topk_ids (so the layer-limited, last-layer-
    router-only path routes as the full forward does), and the model is healthy:
    all experts reached, consecutive overlap within the uniform null ± 4σ.

Part B, mkmodel's models (when $TM_BIN_DIR/tiermoe has mkmodel), Q8_0 weights:
  skew 0: the 30b-a3b shape at full width (n_embd 2048, 32×128 q heads, 4 kv
    heads, 128 experts of 768, top-8), 4 layers, a 4096-token vocabulary (the
    vocabulary size does not enter routing: embeddings are i.i.d. rows), 64
    random tokens as one causal sequence; every layer:
    distinct ≥ 115 of 128 (issue 2; uniform routing expects 125.9), and
    overlap within k/E ± 4σ, σ from the hypergeometric null (k/E = 0.0625,
    σ ≈ 0.0105 for 63 pairs; a collapsed model measured 0.73).
  skew 1: the tiny preset widened to 128 experts, top-8, 2 layers, 256 tokens;
    every layer: zipf_s within 4σ of the same estimator on counts drawn from
    the requested law (Binomial(256, f_r), f from zipf_targets with mkmodel's
    0.9 cap): about 1.08 ± 0.03, where uniform routing reads 0.23 and s = 0.5
    reads 0.64; and the ranking differs between layers: |Spearman ρ| ≤
    4/sqrt(E-1) = 0.355 (independent rankings have σ ≈ 1/sqrt(E-1)).
The files (2.7 GB and 10 MB) are written under $TM_TEST_TMP and removed.
Exit 77 when numpy or gguf is missing.
"""

import os
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import gguf  # noqa: F401  (the reference needs it)
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import qwen3moe_ref as ref  # noqa: E402
import routing_health as rh  # noqa: E402

DATA = os.environ.get("TM_TEST_DATA", os.path.join(HERE, "..", "data"))
TMP = os.environ.get("TM_TEST_TMP") or tempfile.mkdtemp(prefix="tm_routing_health_")
BIN = os.environ.get("TM_BIN_DIR")
N_SIGMA = 4.0
MKMODEL_CAP = 0.9   # mkmodel's SYNTH_ZIPF_CAP: no expert above 90% of tokens

failures = []


def check(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg)
    if not ok:
        failures.append(msg)


# ---------------------------------------------------------------- part A

def part_a():
    rng = np.random.default_rng(7)
    for s in (0.0, 0.7, 1.3):
        counts = 1000.0 * np.arange(1, 65, dtype=np.float64) ** (-s)
        got = rh.zipf_fit(rng.permutation(counts))
        check(abs(got - s) < 1e-9, f"zipf_fit of exact rank^-{s} counts = {got:.12f}")

    ids = np.array([[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [4, 5, 6, 7]])
    check(abs(rh.consecutive_overlap(ids) - (2 + 2 + 4) / 3 / 4) < 1e-15,
          f"consecutive_overlap hand case = {rh.consecutive_overlap(ids)}")
    check(rh.distinct_experts(ids) == 8, "distinct_experts hand case")
    check(rh.expert_counts(ids, 10).tolist() == [1, 1, 2, 2, 3, 3, 2, 2, 0, 0], "expert_counts hand case")

    E, k, n_tok, trials = 128, 8, 64, 2000
    sims_ov, sims_d = [], []
    for _ in range(trials):
        sets = np.array([rng.choice(E, k, replace=False) for _ in range(n_tok)])
        sims_ov.append(rh.consecutive_overlap(sets))
        sims_d.append(rh.distinct_experts(sets))
    mean, std = rh.overlap_null(E, k, n_tok - 1)
    se = np.std(sims_ov) / np.sqrt(trials)
    check(abs(np.mean(sims_ov) - mean) < 5 * se and abs(np.std(sims_ov) - std) < 0.1 * std,
          f"overlap_null {mean:.5f} ± {std:.5f} vs Monte Carlo {np.mean(sims_ov):.5f} ± {np.std(sims_ov):.5f}")
    dexp = rh.distinct_expected(E, k, n_tok)
    check(abs(np.mean(sims_d) - dexp) < 5 * np.std(sims_d) / np.sqrt(trials),
          f"distinct_expected {dexp:.3f} vs Monte Carlo {np.mean(sims_d):.3f}")
    t = rh.zipf_targets(E, k, 1.0, cap=MKMODEL_CAP)
    check(abs(t.sum() - k) < 1e-9 and t.max() <= MKMODEL_CAP + 1e-12 and np.all(np.diff(t) <= 1e-12),
          f"zipf_targets: sum {t.sum():.6f}, max {t.max():.3f}, non-increasing")

    model_path = os.path.join(DATA, "hf_qwen3moe", "tiny-f32.gguf")
    gold, meta = ref.read_dump(os.path.join(DATA, "hf_qwen3moe", "tiny-f32.golden.gguf"))
    m = ref.Qwen3MoeFile(model_path)
    trace = rh.routing_trace(None, meta["dump.tokens"], model=m)
    check(all(np.array_equal(trace[il], gold[f"blk.{il}.topk_ids"]) for il in range(m.n_layer)),
          "routing_trace (last layer router only) equals the HF golden topk_ids")
    _, toks, stats = rh.routing_health(None, n_tok=64, model=m, seed=3)
    mean, std = rh.overlap_null(m.n_expert, m.n_expert_used, len(toks) - 1)
    for r in stats:
        check(r["distinct"] == m.n_expert and abs(r["overlap"] - mean) <= N_SIGMA * std,
              f"HF tiny layer {r['layer']}: {r['distinct']}/{m.n_expert} experts, overlap "
              f"{r['overlap']:.4f} (null {mean:.4f} ± {std:.4f})")


# ---------------------------------------------------------------- part B

def mkmodel(tiermoe, path, skew, shape):
    cmd = [tiermoe, "mkmodel"] + shape + [
        "--type-experts", "q8_0", "--type-attn", "q8_0", "--type-embd", "q8_0", "--type-output", "q8_0",
        "--skew", str(skew), "--seed", "42", "-q", "-o", path]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(f"     {' '.join(cmd[1:])}: rc {r.returncode}, {time.time() - t0:.1f} s")
    if r.returncode != 0:
        check(False, f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
        return False
    return True


def part_b(tiermoe):
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "rh_skew0.gguf")
    try:
        if mkmodel(tiermoe, path, 0, ["--preset", "30b-a3b", "--n-layer", "4", "--n-vocab", "4096"]):
            t0 = time.time()
            m, toks, stats = rh.routing_health(path, n_tok=64, seed=1)
            rh.print_table(m, stats, len(toks))
            print(f"     forward {time.time() - t0:.1f} s")
            mean, std = rh.overlap_null(m.n_expert, m.n_expert_used, len(toks) - 1)
            for r in stats:
                check(r["distinct"] >= 115, f"skew 0 layer {r['layer']}: {r['distinct']} of {m.n_expert} "
                      "experts reached (need ≥ 115)")
                check(abs(r["overlap"] - mean) <= N_SIGMA * std,
                      f"skew 0 layer {r['layer']}: overlap {r['overlap']:.4f} within {mean:.4f} ± "
                      f"{N_SIGMA:g}·{std:.4f}")
    finally:
        if os.path.exists(path):
            os.remove(path)

    skew = 1.0
    path = os.path.join(TMP, "rh_skew1.gguf")
    try:
        if mkmodel(tiermoe, path, skew, ["--preset", "tiny", "--n-expert", "128", "--n-expert-used", "8",
                                         "--n-layer", "2"]):
            t0 = time.time()
            m, toks, stats = rh.routing_health(path, n_tok=256, seed=1)
            rh.print_table(m, stats, len(toks))
            print(f"     forward {time.time() - t0:.1f} s")
            mean, std = rh.zipf_fit_null(m.n_expert, m.n_expert_used, skew, len(toks), cap=MKMODEL_CAP)
            rho_max = N_SIGMA / np.sqrt(m.n_expert - 1)
            for r in stats:
                check(abs(r["zipf_s"] - mean) <= N_SIGMA * std,
                      f"skew {skew} layer {r['layer']}: fitted exponent {r['zipf_s']:.3f} within "
                      f"{mean:.3f} ± {N_SIGMA:g}·{std:.3f}")
                if r["rank_corr"] is not None:
                    check(abs(r["rank_corr"]) <= rho_max,
                          f"skew {skew} layer {r['layer']}: popularity ranking differs from the previous "
                          f"layer's (Spearman {r['rank_corr']:.3f}, limit {rho_max:.3f})")
    finally:
        if os.path.exists(path):
            os.remove(path)


def have_mkmodel(tiermoe):
    if not tiermoe or not os.access(tiermoe, os.X_OK):
        return False
    r = subprocess.run([tiermoe, "mkmodel", "--help"], capture_output=True, text=True)
    return r.returncode == 0 and "--skew" in r.stdout


def main():
    part_a()
    tiermoe = os.path.join(BIN, "tiermoe") if BIN else None
    if have_mkmodel(tiermoe):
        part_b(tiermoe)
    else:
        print(f"note: part B (mkmodel models) not run: no tiermoe with mkmodel in TM_BIN_DIR={BIN}")
    if failures:
        print(f"test_routing_health: {len(failures)} check(s) failed")
        return 1
    print("test_routing_health: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
