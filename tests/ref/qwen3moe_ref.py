#!/usr/bin/env python3
"""Independent float64 reference forward pass for qwen3moe GGUF models.

What it implements: Qwen3-MoE (HF Qwen3MoeForCausalLM, llama.cpp arch
"qwen3moe") exactly as llama.cpp's converter stores it in GGUF, written as
plain numpy so it can be read line by line against the model's math. Every
weight is dequantized with the `gguf` PyPI package (gguf.quants.dequantize)
and widened to float64; every operation runs in float64. It shares no code
with the C engine, which is what makes it a reference.

GGUF layout (as written by convert_hf_to_gguf.py, class Qwen3MoeModel):
  ne[0] is the fastest (row) dimension. gguf.GGUFReader reports `shape` in ne
  order and gives `data` as a numpy array in the reversed order, so a matrix
  with ne = [n_in, n_out] is a numpy [n_out, n_in] array W and y = W @ x.
  token_embd            ne [n_embd, n_vocab]         (row t = embedding of t)
  output (optional)     ne [n_embd, n_vocab]         (absent → tied to token_embd)
  output_norm           ne [n_embd]
  blk.N.attn_norm       ne [n_embd]
  blk.N.attn_q          ne [n_embd, n_head * d_k]
  blk.N.attn_k          ne [n_embd, n_head_kv * d_k]
  blk.N.attn_v          ne [n_embd, n_head_kv * d_v]
  blk.N.attn_output     ne [n_head * d_v, n_embd]
  blk.N.attn_q_norm     ne [d_k]                     (per-head RMSNorm weight)
  blk.N.attn_k_norm     ne [d_k]
  blk.N.ffn_norm        ne [n_embd]
  blk.N.ffn_gate_inp    ne [n_embd, n_expert]        (router)
  blk.N.ffn_gate_exps   ne [n_embd, n_ff, n_expert]  (HF experts.E.gate_proj stacked)
  blk.N.ffn_up_exps     ne [n_embd, n_ff, n_expert]
  blk.N.ffn_down_exps   ne [n_ff, n_embd, n_expert]
  The converter does NOT permute q/k for the Qwen2/Qwen3 families (they use
  the NeoX rotary layout, pairs (i, i + d/2)), unlike the llama family.

Math per token position p (x is the residual stream):
  x = token_embd[tok]
  per layer:
    h = rmsnorm(x) * attn_norm
    q = Wq h, k = Wk h, v = Wv h            split into heads of d_k / d_v
    q_h = rmsnorm(q_h) * attn_q_norm ; k_h = rmsnorm(k_h) * attn_k_norm
    rope NeoX: theta_i = p * base^(-2i/d_k), rotate (q[i], q[i + d_k/2])
    att_h = softmax_causal(q_h . k_g / sqrt(d_k)) v_g, g = h // (n_head / n_head_kv)
    attn_out = Wo concat(att_h) ;  x = x + attn_out
    h = rmsnorm(x) * ffn_norm
    router_logits = Wr h ; p = softmax over ALL experts ; top-k by p
    w = p[topk] / sum(p[topk])              (Qwen3-MoE norm_topk_prob = true)
    ffn_out = sum_j w_j * down_j(silu(gate_j h) * up_j h) ; x = x + ffn_out
  logits = Wout (rmsnorm(x) * output_norm)
  rmsnorm(v) = v / sqrt(mean(v^2) + eps), eps = attention.layer_norm_rms_epsilon

Top-k order: by probability descending, ties to the lower expert id (stable).

Outputs (names are the golden-dump names, see docs/golden-format.md), all
numpy float64 [n_tok, ...] except topk_ids (int32):
  logits [n_tok, n_vocab]; per layer i: blk.i.attn_out [n_tok, n_embd],
  blk.i.router_logits [n_tok, n_expert], blk.i.topk_ids [n_tok, k],
  blk.i.topk_weights [n_tok, k], blk.i.ffn_out [n_tok, n_embd],
  blk.i.x_out [n_tok, n_embd].

Memory: weights are dequantized one layer at a time, experts one at a time
(expert-major over the tokens routed to them), embedding rows only for the
tokens used and the output matrix in row chunks, so the 30B-A3B shape runs
in a few GB.

CLI: python3 tests/ref/qwen3moe_ref.py MODEL.gguf --tokens 1,2,3 -o dump.gguf
"""

import argparse
import math
import os
import sys

import numpy as np

import gguf

ARCH = "qwen3moe"
DUMP_FORMAT_VERSION = 1


class RefError(Exception):
    """Bad or unsupported model file: the message names the key or tensor."""


# ---------------------------------------------------------------- model file

class Qwen3MoeFile:
    """A qwen3moe GGUF opened read-only (memory-mapped by gguf.GGUFReader)."""

    def __init__(self, path):
        self.path = path
        self.reader = gguf.GGUFReader(path, "r")
        self.tensors = {t.name: t for t in self.reader.tensors}
        arch = self.get_str("general.architecture")
        if arch != ARCH:
            raise RefError(f"{path}: general.architecture is '{arch}', expected '{ARCH}'")
        self.n_ctx = self.get_int(f"{ARCH}.context_length")
        self.n_embd = self.get_int(f"{ARCH}.embedding_length")
        self.n_layer = self.get_int(f"{ARCH}.block_count")
        self.n_head = self.get_int(f"{ARCH}.attention.head_count")
        self.n_head_kv = self.get_int(f"{ARCH}.attention.head_count_kv")
        self.d_k = self.get_int(f"{ARCH}.attention.key_length", self.n_embd // self.n_head)
        self.d_v = self.get_int(f"{ARCH}.attention.value_length", self.d_k)
        self.eps = self.get_float(f"{ARCH}.attention.layer_norm_rms_epsilon")
        self.rope_base = self.get_float(f"{ARCH}.rope.freq_base", 10000.0)
        self.n_expert = self.get_int(f"{ARCH}.expert_count")
        self.n_expert_used = self.get_int(f"{ARCH}.expert_used_count")
        self.n_ff_exp = self.get_int(f"{ARCH}.expert_feed_forward_length")
        if self.n_head % self.n_head_kv != 0:
            raise RefError(f"{path}: head_count {self.n_head} is not a multiple of "
                           f"head_count_kv {self.n_head_kv}")
        if self.d_k % 2 != 0:
            raise RefError(f"{path}: attention.key_length {self.d_k} must be even for rope")
        if not 0 < self.n_expert_used <= self.n_expert:
            raise RefError(f"{path}: expert_used_count {self.n_expert_used} not in "
                           f"1..expert_count {self.n_expert}")
        embd = self.tensor_info("token_embd.weight")
        self.n_vocab = int(embd.shape[1]) if len(embd.shape) == 2 else -1
        self.check_shape("token_embd.weight", [self.n_embd, self.n_vocab])
        self.output_name = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"
        self.check_shape(self.output_name, [self.n_embd, self.n_vocab])
        self.check_shape("output_norm.weight", [self.n_embd])

    # -- metadata
    def _field(self, key):
        return self.reader.fields.get(key)

    def get_str(self, key):
        f = self._field(key)
        if f is None:
            raise RefError(f"{self.path}: missing key {key}")
        v = f.contents()
        if not isinstance(v, str):
            raise RefError(f"{self.path}: key {key} is not a string")
        return v

    def get_int(self, key, default=None):
        f = self._field(key)
        if f is None:
            if default is None:
                raise RefError(f"{self.path}: missing key {key}")
            return default
        v = f.contents()
        if isinstance(v, (list, str, float)) or v is None:
            raise RefError(f"{self.path}: key {key} is not an integer scalar")
        return int(v)

    def get_float(self, key, default=None):
        f = self._field(key)
        if f is None:
            if default is None:
                raise RefError(f"{self.path}: missing key {key}")
            return default
        v = f.contents()
        if isinstance(v, (list, str)) or v is None:
            raise RefError(f"{self.path}: key {key} is not a number")
        # f32 metadata widened exactly, as the C engine reads it
        return float(v)

    # -- tensors
    def tensor_info(self, name):
        t = self.tensors.get(name)
        if t is None:
            raise RefError(f"{self.path}: missing tensor {name}")
        return t

    def check_shape(self, name, ne):
        t = self.tensor_info(name)
        got = [int(d) for d in t.shape]
        if got != list(ne):
            raise RefError(f"{self.path}: tensor {name} has ne {got}, expected {list(ne)}")

    def weight(self, name, ne):
        """Whole tensor as float64, numpy order (reversed ne)."""
        self.check_shape(name, ne)
        t = self.tensors[name]
        return dequantize(t.data, t.tensor_type)

    def rows(self, name, idx):
        """Rows idx (numpy first axis) of a 2-D tensor as float64; reads only those rows."""
        t = self.tensors[name]
        return dequantize(t.data[idx], t.tensor_type)

    def expert(self, il, e):
        """(gate [n_ff, n_embd], up [n_ff, n_embd], down [n_embd, n_ff]) of expert e, float64."""
        out = []
        for kind in ("gate", "up", "down"):
            t = self.tensors[f"blk.{il}.ffn_{kind}_exps.weight"]
            out.append(dequantize(t.data[e], t.tensor_type))
        return out

    def check_layer(self, il):
        E, ne, ff = self.n_expert, self.n_embd, self.n_ff_exp
        p = f"blk.{il}."
        for name, shape in (
            ("attn_norm", [ne]),
            ("attn_q", [ne, self.n_head * self.d_k]),
            ("attn_k", [ne, self.n_head_kv * self.d_k]),
            ("attn_v", [ne, self.n_head_kv * self.d_v]),
            ("attn_output", [self.n_head * self.d_v, ne]),
            ("attn_q_norm", [self.d_k]),
            ("attn_k_norm", [self.d_k]),
            ("ffn_norm", [ne]),
            ("ffn_gate_inp", [ne, E]),
            ("ffn_gate_exps", [ne, ff, E]),
            ("ffn_up_exps", [ne, ff, E]),
            ("ffn_down_exps", [ff, ne, E]),
        ):
            self.check_shape(p + name + ".weight", shape)


def dequantize(data, qtype):
    """gguf-package dequantization (exact f32 values), widened to float64.

    F32 and F16 are widened straight to float64: that is what gguf.quants.dequantize
    does for them (a view, then an exact astype) without the float32 copy between."""
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.asarray(data, dtype=np.float32).astype(np.float64)
    if qtype == gguf.GGMLQuantizationType.F16:
        return np.asarray(data).view(np.float16).astype(np.float64)
    return np.asarray(gguf.quants.dequantize(np.ascontiguousarray(data), qtype), dtype=np.float64)


# ---------------------------------------------------------------- operations

def rmsnorm(x, w, eps):
    """x [..., n] / sqrt(mean(x^2) + eps) * w [n]."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_neox(x, pos, base):
    """x [n_tok, n_heads, d]; rotates pairs (i, i + d/2) by pos * base^(-2i/d)."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = base ** (-2.0 * np.arange(half, dtype=np.float64) / d)
    ang = pos.astype(np.float64)[:, None] * inv_freq[None, :]   # [n_tok, half]
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def silu(x):
    return x / (1.0 + np.exp(-x))


def attention(m, il, h, pos):
    """Grouped-query causal self-attention of layer il over all n_tok positions."""
    p = f"blk.{il}."
    n_tok = h.shape[0]
    H, G, dk, dv = m.n_head, m.n_head_kv, m.d_k, m.d_v
    wq = m.weight(p + "attn_q.weight", [m.n_embd, H * dk])
    wk = m.weight(p + "attn_k.weight", [m.n_embd, G * dk])
    wv = m.weight(p + "attn_v.weight", [m.n_embd, G * dv])
    wo = m.weight(p + "attn_output.weight", [H * dv, m.n_embd])
    qn = m.weight(p + "attn_q_norm.weight", [dk])
    kn = m.weight(p + "attn_k_norm.weight", [dk])

    q = (h @ wq.T).reshape(n_tok, H, dk)
    k = (h @ wk.T).reshape(n_tok, G, dk)
    v = (h @ wv.T).reshape(n_tok, G, dv)
    q = rope_neox(rmsnorm(q, qn, m.eps), pos, m.rope_base)
    k = rope_neox(rmsnorm(k, kn, m.eps), pos, m.rope_base)

    group = H // G
    scale = 1.0 / math.sqrt(dk)
    causal = np.tril(np.ones((n_tok, n_tok), dtype=bool))
    out = np.empty((n_tok, H, dv))
    for hd in range(H):
        g = hd // group
        s = (q[:, hd, :] @ k[:, g, :].T) * scale            # [n_tok(query), n_tok(key)]
        s = np.where(causal, s, -np.inf)
        out[:, hd, :] = softmax(s, axis=-1) @ v[:, g, :]
    return out.reshape(n_tok, H * dv) @ wo.T


def route(logits, k):
    """Softmax over all experts, top-k (stable, descending), renormalised weights."""
    probs = softmax(logits, axis=-1)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, ids, axis=-1)
    w = w / np.sum(w, axis=-1, keepdims=True)
    return ids.astype(np.int32), w


def router(m, il, h):
    """Router logits [n_tok, n_expert] of layer il."""
    wr = m.weight(f"blk.{il}.ffn_gate_inp.weight", [m.n_embd, m.n_expert])
    return h @ wr.T


def moe(m, il, h):
    """Router + SwiGLU experts of layer il; experts dequantized one at a time."""
    router_logits = router(m, il, h)
    ids, w = route(router_logits, m.n_expert_used)
    out = np.zeros_like(h)
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)                      # expert-major: every token of e
        gate, up, down = m.expert(il, int(e))
        he = h[tok]
        y = (silu(he @ gate.T) * (he @ up.T)) @ down.T        # [n_routed, n_embd]
        # tokens are distinct within one expert, so this accumulates without collisions
        out[tok] += w[tok, slot][:, None] * y
    return router_logits, ids, w, out


def output_logits(m, x, chunk_rows=8192):
    """Final norm and output projection, the vocab matrix read in row chunks."""
    xn = rmsnorm(x, m.weight("output_norm.weight", [m.n_embd]), m.eps)
    logits = np.empty((x.shape[0], m.n_vocab))
    for r0 in range(0, m.n_vocab, chunk_rows):
        r1 = min(m.n_vocab, r0 + chunk_rows)
        logits[:, r0:r1] = xn @ m.rows(m.output_name, slice(r0, r1)).T
    return logits


# ---------------------------------------------------------------- forward

def forward(gguf_path, tokens, n_layers=None, want_logits=None, model=None, collect=True,
            route_only_last=False):
    """Reference forward over `tokens` at positions 0..n_tok-1 (causal, one batch).

    gguf_path: path of a qwen3moe GGUF (or pass an open Qwen3MoeFile as model).
    n_layers: run only the first n_layers blocks (for routing studies on big shapes).
    want_logits: default True when all layers run, False otherwise.
    collect: keep the per-layer arrays (False keeps only routing and logits).
    route_only_last: stop the last layer run after its router (routing studies:
        its experts cannot change any routing decision, so they are skipped).
    Returns a dict name -> numpy array, names as in docs/golden-format.md.
    """
    m = model if model is not None else Qwen3MoeFile(gguf_path)
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or tokens.size == 0:
        raise RefError("tokens must be a non-empty 1-D list")
    if tokens.min() < 0 or tokens.max() >= m.n_vocab:
        raise RefError(f"token id out of range 0..{m.n_vocab - 1}")
    L = m.n_layer if n_layers is None else min(n_layers, m.n_layer)
    if want_logits is None:
        want_logits = L == m.n_layer
    pos = np.arange(tokens.size)

    out = {}
    x = m.rows("token_embd.weight", tokens)                   # [n_tok, n_embd]
    for il in range(L):
        m.check_layer(il)
        p = f"blk.{il}."
        h = rmsnorm(x, m.weight(p + "attn_norm.weight", [m.n_embd]), m.eps)
        a = attention(m, il, h, pos)
        x = x + a
        h = rmsnorm(x, m.weight(p + "ffn_norm.weight", [m.n_embd]), m.eps)
        if route_only_last and il == L - 1:
            out[p + "router_logits"] = router(m, il, h)
            out[p + "topk_ids"], out[p + "topk_weights"] = route(out[p + "router_logits"], m.n_expert_used)
            want_logits = False
            break
        router_logits, ids, w, f = moe(m, il, h)
        x = x + f
        out[p + "router_logits"] = router_logits
        out[p + "topk_ids"] = ids
        out[p + "topk_weights"] = w
        if collect:
            out[p + "attn_out"] = a
            out[p + "ffn_out"] = f
            out[p + "x_out"] = x.copy()
    if want_logits:
        out["logits"] = output_logits(m, x)
    return out


# ---------------------------------------------------------------- dumps

def write_dump(path, arrays, tokens, model_name, source, extra_meta=None, float_type=np.float32):
    """Write arrays as a golden dump GGUF (docs/golden-format.md).

    Float arrays are stored as F32 (default) or F64 (float_type=np.float64),
    integer arrays as I32. A numpy [n_tok, n] array is a tensor with ne [n, n_tok].
    """
    w = gguf.GGUFWriter(path, "tiermoe.dump")
    w.add_uint32("dump.version", DUMP_FORMAT_VERSION)
    w.add_string("dump.model", model_name)
    w.add_string("dump.source", source)
    w.add_array("dump.tokens", [int(t) for t in tokens])
    for k, v in (extra_meta or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            if -(1 << 31) <= v < (1 << 31):
                w.add_int32(k, v)
            else:
                w.add_int64(k, v)
        elif isinstance(v, float):
            w.add_float64(k, v)
        else:
            raise TypeError(f"metadata {k}: unsupported value type {type(v)}")
    for name in sorted(arrays, key=dump_sort_key):
        a = np.asarray(arrays[name])
        if np.issubdtype(a.dtype, np.integer):
            a = np.ascontiguousarray(a, dtype=np.int32)
        else:
            a = np.ascontiguousarray(a, dtype=float_type)
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dump_sort_key(name):
    """Layer order, then stage order within a layer, logits last."""
    stages = ["attn_out", "router_logits", "topk_ids", "topk_weights", "ffn_out", "x_out"]
    if name.startswith("blk."):
        _, il, stage = name.split(".", 2)
        return (int(il), stages.index(stage) if stage in stages else len(stages), stage)
    return (1 << 30, 0, name)


def _tokens_field(reader):
    f = reader.fields.get("dump.tokens")
    if f is None:
        return None
    return [int(v) for v in f.contents()]


def read_dump(path):
    """Read a golden dump: (dict name -> numpy array in [n_tok, ...] order, metadata dict)."""
    r = gguf.GGUFReader(path, "r")
    meta = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = f.contents()
    meta["dump.tokens"] = _tokens_field(r)
    arrays = {}
    for t in r.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            arrays[t.name] = np.array(t.data, dtype=np.int32)
        elif t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F64):
            arrays[t.name] = np.array(t.data, dtype=np.float64)
        else:
            raise RefError(f"{path}: dump tensor {t.name} has type {t.tensor_type.name}, "
                           "expected F32, F64 or I32")
    return arrays, meta


def parse_tokens(s):
    try:
        return [int(v) for v in s.split(",") if v.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens expects comma-separated integers, got '{s}'")


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 numpy reference forward for qwen3moe GGUF")
    ap.add_argument("model", help="qwen3moe GGUF file")
    ap.add_argument("--tokens", type=parse_tokens, required=True, help="e.g. 1,2,3")
    ap.add_argument("-o", "--output", required=True, help="dump GGUF to write")
    ap.add_argument("--layers", type=int, default=None, help="run only the first N layers")
    ap.add_argument("--f64", action="store_true", help="store float tensors as F64 (default F32)")
    args = ap.parse_args(argv)
    try:
        m = Qwen3MoeFile(args.model)
        arrays = forward(None, args.tokens, n_layers=args.layers, model=m)
    except (RefError, OSError, ValueError) as e:
        print(f"qwen3moe_ref: {e}", file=sys.stderr)
        return 1
    write_dump(args.output, arrays, args.tokens, os.path.basename(args.model),
               "tiermoe tests/ref/qwen3moe_ref.py (numpy float64)",
               extra_meta={"dump.n_layer": int(min(args.layers or m.n_layer, m.n_layer)),
                           "dump.numpy_version": np.__version__},
               float_type=np.float64 if args.f64 else np.float32)
    print(f"wrote {args.output}: {len(arrays)} tensors, {len(args.tokens)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
