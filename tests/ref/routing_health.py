#!/usr/bin/env python3
"""Routing health of a qwen3moe GGUF, measured with the float64 reference forward.

Why: with plain small random weights a synthetic MoE loses token identity in a
few layers and the router sends almost every token to the same few experts,
which flatters every expert-offload benchmark (issue 2, `tiermoe mkmodel`).
This module measures, per layer, over a sequence of random tokens run as one
causal sequence (so position t sees exactly what decode step t would):

  distinct   experts reached by at least one token
  overlap    mean |S_t ∩ S_{t-1}| / k over consecutive positions (S_t = top-k set);
             independent uniform routing gives k/E (6.25% for 8 of 128)
  zipf_s     exponent of expert popularity: least-squares slope of log(count)
             against log(rank), counts sorted descending, zero counts left out,
             s = -slope (0 = flat)
  rank_corr  Spearman correlation of the expert counts with the previous layer
             (mkmodel ranks experts differently in each layer: should be near 0)

and gives the statistics those numbers should have under a hypothesis, so a
test can state its limits instead of tuning them:
  overlap_null(E, k, n_pairs)          mean and std of `overlap` for independent
                                       uniform top-k sets (hypergeometric)
  distinct_expected(E, k, n_tok)       expected `distinct` under uniform routing
  zipf_targets(E, k, s, cap, q)        per-rank selection frequencies of a Zipf
                                       (Mandelbrot) law (sum k, none above cap)
  profile_stats(seqs, E, window)       the routing profiles' four statistics: top-1
                                       share, top-half share, reuse with the previous
                                       token and within the last `window` tokens
  zipf_fit_null(E, k, s, n_tok, ...)   mean and std of `zipf_s` when each expert
                                       is picked with its target frequency
                                       independently per token (same estimator,
                                       same sample size, so the small-sample bias
                                       of the fit is in the null as well)

Cost: the forward dequantizes weights one layer at a time and experts lazily,
runs only `n_layers` layers and skips the last layer's experts (they cannot
change a routing decision), so 64 tokens through 4 layers of the 30B-A3B
shape (n_embd 2048, 128 experts of 768) take well under a minute.

CLI: python3 tests/ref/routing_health.py MODEL.gguf [--layers 4] [--tokens 64] [--seed 1]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3moe_ref as ref  # noqa: E402


# ---------------------------------------------------------------- measuring

def random_tokens(n_vocab, n_tok, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, n_tok)]


def routing_trace(gguf_path, tokens, n_layers=None, model=None):
    """Top-k expert ids per layer: list of int arrays [n_tok, k], one per layer run."""
    m = model if model is not None else ref.Qwen3MoeFile(gguf_path)
    L = m.n_layer if n_layers is None else min(n_layers, m.n_layer)
    out = ref.forward(None, tokens, n_layers=L, want_logits=False, model=m,
                      collect=False, route_only_last=True)
    return [out[f"blk.{il}.topk_ids"] for il in range(L)]


def expert_counts(ids, n_expert):
    """How many tokens selected each expert."""
    return np.bincount(np.asarray(ids).ravel(), minlength=n_expert)


def distinct_experts(ids):
    return int(np.unique(np.asarray(ids)).size)


def consecutive_overlap(ids):
    """Mean over t ≥ 1 of |S_t ∩ S_{t-1}| / k."""
    ids = np.asarray(ids)
    k = ids.shape[1]
    shared = [len(set(ids[t].tolist()) & set(ids[t - 1].tolist())) for t in range(1, ids.shape[0])]
    return float(np.mean(shared)) / k


def reuse_counts(ids, window):
    """Brute force, one sequence: (shared with the previous token, token pairs, shared with
    any of the previous `window` tokens, tokens that had `window` predecessors); what the
    tracer sums as reuse_shared / reuse_pairs and reuse_window_shared / reuse_window_tokens."""
    sets = [set(r) for r in np.asarray(ids).tolist()]
    prev = sum(len(sets[t] & sets[t - 1]) for t in range(1, len(sets)))
    win = sum(len(sets[t] & set().union(*sets[t - window:t])) for t in range(window, len(sets)))
    return prev, max(len(sets) - 1, 0), win, max(len(sets) - window, 0)


def top_shares(counts):
    """(share of slots of the most used expert, share covered by the top ceil(E/2) experts)."""
    c = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    half = int(np.ceil(0.5 * c.size - 1e-9))
    return float(c[0] / c.sum()), float(c[:half].sum() / c.sum())


def profile_stats(seqs, n_expert, window=8):
    """The four statistics of the routing profiles (docs/mkmodel.md) for one layer, over
    several sequences (each an int array [n_tok, k]): dict top1, top_half, reuse_prev,
    reuse_win (shares in [0, 1]; the counts are summed over the sequences as merged learn
    files sum them)."""
    k = np.asarray(seqs[0]).shape[1]
    counts = sum(expert_counts(s, n_expert) for s in seqs)
    tot = np.sum([reuse_counts(s, window) for s in seqs], axis=0)
    top1, top_half = top_shares(counts)
    return dict(top1=top1, top_half=top_half, reuse_prev=tot[0] / (tot[1] * k),
                reuse_win=tot[2] / (tot[3] * k) if tot[3] else float("nan"))


def zipf_fit(counts):
    """Zipf exponent s of a popularity vector: -slope of log(count) vs log(rank), counts > 0."""
    c = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    c = c[c > 0]
    if c.size < 2:
        return float("inf")   # everything on one expert: as skewed as it gets
    r = np.log(np.arange(1, c.size + 1, dtype=np.float64))
    y = np.log(c)
    slope = np.sum((r - r.mean()) * (y - y.mean())) / np.sum((r - r.mean()) ** 2)
    return float(-slope)


def rank_correlation(a, b):
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(v):
        v = np.asarray(v, dtype=np.float64)
        order = np.argsort(v, kind="stable")
        rk = np.empty(v.size)
        rk[order] = np.arange(v.size, dtype=np.float64)
        for val in np.unique(v):   # average the ranks of ties
            sel = v == val
            rk[sel] = rk[sel].mean()
        return rk
    ra, rb = ranks(a), ranks(b)
    da, db = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt(np.sum(da * da) * np.sum(db * db))
    return float(np.sum(da * db) / den) if den > 0 else 0.0


def layer_stats(trace, n_expert):
    """Per-layer dicts: layer, distinct, overlap, zipf_s, rank_corr (None for layer 0)."""
    rows = []
    prev = None
    for il, ids in enumerate(trace):
        c = expert_counts(ids, n_expert)
        rows.append(dict(layer=il, distinct=distinct_experts(ids), overlap=consecutive_overlap(ids),
                         zipf_s=zipf_fit(c), rank_corr=None if prev is None else rank_correlation(prev, c),
                         counts=c))
        prev = c
    return rows


def routing_health(gguf_path, n_tok=64, n_layers=None, seed=1, model=None):
    """Run n_tok random tokens (fixed seed) and return (model, tokens, per-layer stats)."""
    m = model if model is not None else ref.Qwen3MoeFile(gguf_path)
    tokens = random_tokens(m.n_vocab, n_tok, seed)
    trace = routing_trace(None, tokens, n_layers=n_layers, model=m)
    return m, tokens, layer_stats(trace, m.n_expert)


# ---------------------------------------------------------------- what to expect

def overlap_null(n_expert, k, n_pairs):
    """Mean and std of consecutive_overlap for independent uniform top-k sets.

    |S ∩ S'| of two independent uniform k-subsets of E is hypergeometric:
    mean k²/E, variance k·(k/E)·((E-k)/E)·((E-k)/(E-1)). Divided by k and
    averaged over n_pairs pairs (consecutive pairs are independent for
    independent sets: they share a set but not the randomness of the
    intersection given it), the std shrinks by sqrt(n_pairs)."""
    E = float(n_expert)
    mean = k * k / E
    var = k * (k / E) * ((E - k) / E) * ((E - k) / (E - 1)) if E > 1 else 0.0
    return mean / k, np.sqrt(var / max(n_pairs, 1)) / k


def distinct_expected(n_expert, k, n_tok):
    """Expected experts reached by n_tok independent uniform top-k sets."""
    return n_expert * (1.0 - (1.0 - k / n_expert) ** n_tok)


def zipf_targets(n_expert, k, s, cap=1.0, q=0.0):
    """Selection frequency of each popularity rank: ∝ (rank + q)^-s (q = 0: Zipf; q > 0:
    Zipf–Mandelbrot), summing to k, none above cap.

    The excess above the cap is spread over the others in proportion to their
    frequency (water-filling), as a router that cannot pick an expert twice does."""
    t = (np.arange(1, n_expert + 1, dtype=np.float64) + q) ** (-s)
    t *= k / t.sum()
    for _ in range(64):
        over = t > cap
        if not over.any():
            break
        excess = np.sum(t[over] - cap)
        t[over] = cap
        free = ~over & (t < cap)
        if not free.any():
            break
        t[free] += excess * t[free] / t[free].sum()
    return t


def zipf_fit_null(n_expert, k, s, n_tok, trials=400, seed=0, cap=1.0):
    """Mean and std of zipf_fit when expert r is chosen by each token with
    probability zipf_targets(...)[r], independently (counts ~ Binomial(n_tok, f_r))."""
    rng = np.random.default_rng(seed)
    f = zipf_targets(n_expert, k, s, cap)
    fits = [zipf_fit(rng.binomial(n_tok, f)) for _ in range(trials)]
    return float(np.mean(fits)), float(np.std(fits))


# ---------------------------------------------------------------- CLI

def print_table(m, stats, n_tok, out=sys.stdout):
    E, k = m.n_expert, m.n_expert_used
    ov_mean, ov_std = overlap_null(E, k, n_tok - 1)
    print(f"{n_tok} random tokens, {len(stats)} layer(s) of {m.n_layer}; {E} experts, top-{k}", file=out)
    print(f"uniform routing would give: distinct ≈ {distinct_expected(E, k, n_tok):.1f}, "
          f"overlap {ov_mean:.4f} ± {ov_std:.4f}, zipf_s {zipf_fit_null(E, k, 0.0, n_tok)[0]:.3f} "
          f"(small-sample bias of the fit)", file=out)
    print(f"{'layer':>5} {'distinct':>8} {'overlap':>8} {'zipf_s':>7} {'rank_corr':>9}  top-5 counts", file=out)
    for r in stats:
        rc = "" if r["rank_corr"] is None else f"{r['rank_corr']:.3f}"
        top = np.sort(r["counts"])[::-1][:5].tolist()
        print(f"{r['layer']:>5} {r['distinct']:>8} {r['overlap']:>8.4f} {r['zipf_s']:>7.3f} {rc:>9}  {top}",
              file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description="routing health of a qwen3moe GGUF (float64 reference)")
    ap.add_argument("model")
    ap.add_argument("--layers", type=int, default=None, help="layers to run (default all)")
    ap.add_argument("--tokens", type=int, default=64, help="random tokens (default 64)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        m, _tokens, stats = routing_health(args.model, n_tok=args.tokens, n_layers=args.layers, seed=args.seed)
    except (ref.RefError, OSError, ValueError) as e:
        print(f"routing_health: {e}", file=sys.stderr)
        return 1
    print_table(m, stats, args.tokens)
    print(f"({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
