#!/usr/bin/env python3
"""Build a tiny Gemma 4 MoE text model with llama.cpp's converter, and its HF float64 goldens.

What it makes (under tests/data/hf_gemma4/, see docs/golden-format.md):
  tiny-f16.gguf      random-weight Gemma4ForCausalLM written by llama.cpp's own convert_hf_to_gguf.py
                     (--outtype f16; GGUF arch `gemma4`)
  tiny.golden.gguf   HF transformers (float64) on dump.tokens = 40 random prompt tokens + the 8 tokens
                     HF's greedy decoding chooses after them (argmax of the float64 logits):
                     logits and per layer attn_out, router_logits, topk_ids, topk_weights, ffn_out,
                     dense_out, x_out (F64; I32 ids)
  config.json        the HF config the model was made from

The model: the features gemma-4-26B-A4B's text model uses (configuration_gemma4.py's defaults and
the MoE options), small:
  5 layers, sliding / full attention as layer_types [S, S, F, S, F] (the last must be full),
  sliding_window 8 (so the 48 tokens leave the window), n_embd 64, 4 query heads;
  sliding layers: head_dim 16, 2 KV heads, default RoPE theta 1e4 over the whole head;
  full layers: global_head_dim 32, num_global_key_value_heads 1, attention_k_eq_v (no v_proj: V is
  the K projection before k_norm / RoPE), proportional RoPE theta 1e6, partial_rotary_factor 0.25
  (the converter writes rope_freqs: 1 for the 4 rotated pairs, 1e30 for the rest);
  q_norm / k_norm per head with weights, v_norm without, attention scale 1;
  every layer: a dense GELU-tanh MLP (intermediate 48) beside 8 experts top-2 (moe_intermediate 16,
  gelu_pytorch_tanh(gate) * up), a router with its scale-free norm x learned scale x n_embd^-0.5,
  softmax, top-k renormalised, x per_expert_scale; the five FFN norms; layer_scalar per layer;
  embeddings x sqrt(n_embd), tied output, final_logit_softcapping 3.0 (the real model's 30 would not
  bend this tiny model's logits of a few units).
Left out, as gemma-4-26B-A4B has none of them: per-layer input embeddings
(hidden_size_per_layer_input 0), KV-shared layers (num_kv_shared_layers 0), the double-wide MLP,
bidirectional attention, attention biases.

Random values (numpy, fixed seed) for every parameter, the norms and layer_scalar included
(layer_scalar, a buffer, is saved and converted to blk.N.layer_output_scale). The tokenizer is a
tiny SentencePiece-style BPE (byte_fallback: the converter's Gemma 4 vocabulary reader wants one):
<pad> <eos> <bos> <unk>, the 256 byte tokens, "▁", a-z, "▁t" = 288 tokens.

The GGUF is read back and loaded into the HF model in float64; the round trip is asserted bit for bit
(f16 rounding where the tensor is F16) and every GGUF tensor is used (rope_freqs checked against the
proportional RoPE's rotated pairs). Float64 end to end: Gemma4RMSNorm's .float() casts, the router's
softmax dtype and the rotary table's float32 products are replaced (counted text replacements of
transformers' own source), and the rotary inv_freq buffers recomputed in float64 from the same
formulas (asserted equal to transformers' float32 ones within 1e-6). Run (a): the prompt with a
cache, then 8 single-token steps; run (b): all 48 tokens in one forward; they must agree to 1e-10.

Dump conventions: attn_out = self_attn's output (o_proj, before post_attention_norm);
router_logits = the router's proj output (before softmax); topk_ids by probability, highest first;
topk_weights = renormalised top-k probabilities x per_expert_scale (what the experts' outputs are
multiplied by); ffn_out = the experts' weighted sum (before post_ffw_norm_2); dense_out = the dense
MLP's output (before post_ffw_norm_1); x_out = the layer's output (after layer_scalar).

Needs (NOT needed by CI; the outputs are committed): torch, transformers 5.x, numpy, safetensors,
tokenizers, and llama.cpp's source tree:
  python3 scripts/make_gemma4_goldens.py --llama-cpp /path/to/llama.cpp
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hf_convert import convert, hook_catcher, load_and_check, read_gguf, recompile, run_hooked  # noqa: E402
from hf_dump import max_rel_diff  # noqa: E402

DEFAULT_LLAMA_CPP = "/work/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"
SEED = 20260440
N_PROMPT = 40
N_DECODE = 8
AGREE_LIMIT = 1e-10
MIN_MARGIN = 1e-6
VOCAB = 288

CONFIG = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=5, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=4096, rms_norm_eps=1e-6,
    tie_word_embeddings=True, sliding_window=8,
    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                     "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1000000.0}},
    final_logit_softcapping=3.0, hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB,
    attention_k_eq_v=True, num_kv_shared_layers=0, enable_moe_block=True, use_double_wide_mlp=False,
    num_experts=8, top_k_experts=2, moe_intermediate_size=16,
    pad_token_id=0, eos_token_id=1, bos_token_id=2)


# ---------------------------------------------------------------- tokenizer

def write_tokenizer(d):
    """SentencePiece-style BPE with byte fallback (what gguf.LlamaHfVocab reads)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for p in ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["▁t"]:
        vocab[p] = len(vocab)
    assert len(vocab) == VOCAB
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "t")], unk_token="<unk>", byte_fallback=True,
                              fuse_unk=True))
    tk.normalizer = normalizers.Replace(" ", "▁")
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tk.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
                   "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, f)


# ---------------------------------------------------------------- weights

def init_weights(model, rng, torch):
    """Random float32 values for every parameter and the layer_scalar buffers."""
    H = model.config.hidden_size

    def normal(shape, std):
        return rng.standard_normal(shape) * std

    def norm_w(n):
        return np.clip(1.0 + 0.2 * rng.standard_normal(n), 0.5, 1.9)

    out = {}
    tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar")]
    for name, p in tensors:
        shp = tuple(p.shape)
        if name == "model.embed_tokens.weight":
            v = normal(shp, H ** -0.5)                  # x sqrt(H) in the forward: rows of norm ~sqrt(H)
        elif "norm" in name.split(".")[-2] or name.endswith("router.scale"):
            v = norm_w(shp)
        elif name.endswith("layer_scalar"):
            v = rng.uniform(0.6, 1.4, shp)
        elif name.endswith("per_expert_scale"):
            v = rng.uniform(0.5, 1.5, shp)
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            v = normal(shp, shp[1] ** -0.5)
        elif name.endswith("o_proj.weight"):
            v = normal(shp, 0.5 * shp[1] ** -0.5)
        elif name.endswith("router.proj.weight"):
            v = normal(shp, 1.5)                        # input is normed x n_embd^-0.5: logits of std ~1.5
        elif name.endswith("experts.gate_up_proj") or name.endswith(("gate_proj.weight", "up_proj.weight")):
            v = normal(shp, H ** -0.5)
        elif name.endswith("experts.down_proj") or name.endswith("down_proj.weight"):
            v = normal(shp, 0.5 * shp[-1] ** -0.5)
        else:
            raise RuntimeError(f"no init rule for {name} {shp}")
        out[name] = np.ascontiguousarray(v, dtype=np.float32)
    with torch.no_grad():
        for name, p in tensors:
            p.copy_(torch.from_numpy(out[name]))
    return out


# ---------------------------------------------------------------- GGUF -> HF

def gguf_to_hf(cfg, t):
    """{HF name: (float64 array, [source GGUF tensor names])}; rope_freqs checked, not loaded."""
    sd = {}

    def put(hf, val, *srcs):
        sd[hf] = (val, list(srcs))

    def same(hf, gg):
        put(hf, t[gg], gg)

    same("model.embed_tokens.weight", "token_embd.weight")
    same("model.norm.weight", "output_norm.weight")
    assert "output.weight" not in t, "tied output expected"
    for il in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        a = p + "self_attn."
        full = cfg.layer_types[il] == "full_attention"
        same(p + "input_layernorm.weight", b + "attn_norm.weight")
        same(p + "post_attention_layernorm.weight", b + "post_attention_norm.weight")
        same(p + "pre_feedforward_layernorm.weight", b + "ffn_norm.weight")
        same(p + "post_feedforward_layernorm.weight", b + "post_ffw_norm.weight")
        same(p + "pre_feedforward_layernorm_2.weight", b + "pre_ffw_norm_2.weight")
        same(p + "post_feedforward_layernorm_1.weight", b + "post_ffw_norm_1.weight")
        same(p + "post_feedforward_layernorm_2.weight", b + "post_ffw_norm_2.weight")
        put(p + "layer_scalar", t[b + "layer_output_scale.weight"].reshape(1), b + "layer_output_scale.weight")
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("o_proj", "attn_output")):
            same(a + hf + ".weight", b + gg + ".weight")
        if full and cfg.attention_k_eq_v:
            assert b + "attn_v.weight" not in t, f"{b}attn_v present in a k_eq_v layer"
        else:
            same(a + "v_proj.weight", b + "attn_v.weight")
        same(a + "q_norm.weight", b + "attn_q_norm.weight")
        same(a + "k_norm.weight", b + "attn_k_norm.weight")
        same(p + "mlp.gate_proj.weight", b + "ffn_gate.weight")
        same(p + "mlp.up_proj.weight", b + "ffn_up.weight")
        same(p + "mlp.down_proj.weight", b + "ffn_down.weight")
        same(p + "router.proj.weight", b + "ffn_gate_inp.weight")
        same(p + "router.scale", b + "ffn_gate_inp.scale")
        same(p + "router.per_expert_scale", b + "ffn_down_exps.scale")
        if b + "ffn_gate_up_exps.weight" in t:
            same(p + "experts.gate_up_proj", b + "ffn_gate_up_exps.weight")
        else:
            put(p + "experts.gate_up_proj",
                np.concatenate([t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]], axis=1),
                b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight")
        same(p + "experts.down_proj", b + "ffn_down_exps.weight")
    # rope_freqs: the full layers' proportional RoPE as freq factors over the whole head
    hd = cfg.per_layer_config[cfg.layer_types.index("full_attention")].head_dim
    n_rot = int(cfg.rope_parameters["full_attention"]["partial_rotary_factor"] * hd // 2)
    want = np.array([1.0] * n_rot + [1e30] * (hd // 2 - n_rot))
    assert np.array_equal(t["rope_freqs.weight"], want.astype(np.float32).astype(np.float64)), t["rope_freqs.weight"]
    used = {s for _, srcs in sd.values() for s in srcs} | {"rope_freqs.weight"}
    assert used == set(t), f"GGUF tensors not used: {sorted(set(t) - used)}; missing: {sorted(used - set(t))}"
    return sd


# ---------------------------------------------------------------- float64

PATCHES = {
    "Gemma4RMSNorm": [("self._norm(hidden_states.float())", "self._norm(hidden_states)"),
                      ("normed_output * self.weight.float()", "normed_output * self.weight")],
    "Gemma4TextRouter": [("softmax(expert_scores, dim=-1, dtype=torch.float32)", "softmax(expert_scores, dim=-1)")],
    "Gemma4TextRotaryEmbedding": [
        ("position_ids[..., None].float() * inv_freq.to(device=x.device, dtype=torch.float)",
         "position_ids[..., None].to(x.dtype) * inv_freq.to(device=x.device, dtype=x.dtype)")],
}


def inv_freq64(cfg, layer_type, torch):
    """The two RoPE tables in float64: default (theta^(-2i/d), i < d/2) and proportional
    (theta^(-2i/d) for the int(factor d / 2) rotated pairs, 0 for the rest), d the layer type's head."""
    rp = cfg.rope_parameters[layer_type]
    d = cfg.per_layer_config[layer_type].head_dim
    base = rp["rope_theta"]
    i = np.arange(d // 2, dtype=np.float64)
    inv = base ** (-2.0 * i / d)
    if rp["rope_type"] == "proportional":
        inv[int(rp["partial_rotary_factor"] * d // 2):] = 0.0
    else:
        assert rp["rope_type"] == "default"
    return torch.from_numpy(inv)


class Float64:
    def __init__(self, mod, model, torch):
        self.mod, self.model, self.torch, self.counter = mod, model, torch, {}

    def __enter__(self):
        g = vars(self.mod)
        self.saved = {k: getattr(self.mod, k).forward for k in PATCHES}
        for k, reps in PATCHES.items():
            getattr(self.mod, k).forward = recompile(self.saved[k], reps, g, self.counter, k)
        rot = self.model.model.rotary_emb
        self.saved_inv = {}
        for lt in rot.layer_types:
            old = getattr(rot, f"{lt}_inv_freq")
            new = inv_freq64(self.model.config, lt, self.torch)
            assert torch_allclose(self.torch, new, old.double()), (lt, new, old)
            assert getattr(rot, f"{lt}_attention_scaling") == 1.0
            self.saved_inv[lt] = old
            setattr(rot, f"{lt}_inv_freq", new)
        return sorted(k + ".forward" for k in PATCHES) + ["rotary inv_freq (default, proportional; float64)"]

    def __exit__(self, *exc):
        for k, f in self.saved.items():
            getattr(self.mod, k).forward = f
        rot = self.model.model.rotary_emb
        for lt, v in self.saved_inv.items():
            setattr(rot, f"{lt}_inv_freq", v)


def torch_allclose(torch, a, b):
    return bool(torch.allclose(a, b, rtol=1e-6, atol=0))


# ---------------------------------------------------------------- HF runs

def run_hf(model, tokens, n_prompt, torch, cached=True):
    caught, hooks, add, fwd = hook_catcher()

    for il, layer in enumerate(model.model.layers):
        p = f"blk.{il}."
        fwd(layer.self_attn, lambda i, o, p=p: add(p + "attn_out", o[0]))
        fwd(layer.mlp, lambda i, o, p=p: add(p + "dense_out", o))

        def router(i, o, p=p, layer=layer):
            # the logits: proj's output, recomputed from the router's own input (its forward returns probs)
            add(p + "topk_weights", o[1])
            add(p + "topk_ids", o[2])
        fwd(layer.router, router)
        fwd(layer.router.proj, lambda i, o, p=p: add(p + "router_logits", o))
        fwd(layer.experts, lambda i, o, p=p: add(p + "ffn_out", o))
        fwd(layer, lambda i, o, p=p: add(p + "x_out", o[0] if isinstance(o, tuple) else o))

    logits, cache = run_hooked(model, tokens, n_prompt, cached, hooks, torch)
    arrays = {"logits": logits}
    for k, v in caught.items():
        arrays[k] = torch.cat(v, dim=0).numpy()
    for il in range(len(model.model.layers)):
        p = f"blk.{il}."
        arrays[p + "topk_ids"] = arrays[p + "topk_ids"].astype(np.int32)
    for k, v in arrays.items():
        assert v.shape[0] == len(tokens), (k, v.shape)
    return arrays


def greedy(model, prompt, n, torch):
    """HF's greedy continuation of prompt (n tokens, through the cache) and the smallest gap
    between the best and second logit of the choices."""
    toks, cache, gap = list(prompt), None, np.inf
    with torch.no_grad():
        step = list(prompt)
        for _ in range(n):
            kw = dict(use_cache=True)
            if cache is not None:
                kw["cache"] = cache
            out = model(input_ids=torch.tensor([step], dtype=torch.long), **kw)
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            lg = out.logits[0, -1].numpy()
            srt = np.sort(lg)
            gap = min(gap, float(srt[-1] - srt[-2]))
            step = [int(np.argmax(lg))]
            toks += step
    return toks, gap


def routing_health(arrays, model):
    """Per layer: tokens per expert and the min gap between the k-th and (k+1)-th probability;
    numpy's selection and weights (softmax, top-k, renormalised, x per_expert_scale) against HF's."""
    c = model.config
    k = c.top_k_experts
    res = []
    for il in range(c.num_hidden_layers):
        p = f"blk.{il}."
        ids, lg, w = arrays[p + "topk_ids"], arrays[p + "router_logits"], arrays[p + "topk_weights"]
        pr = np.exp(lg - lg.max(axis=1, keepdims=True))
        pr /= pr.sum(axis=1, keepdims=True)
        srt = -np.sort(-pr, axis=1)
        gap = float(np.min(srt[:, k - 1] - srt[:, k]))
        want_ids = np.argsort(-pr, axis=1, kind="stable")[:, :k]
        tw = np.take_along_axis(pr, want_ids, axis=1)
        tw = tw / tw.sum(axis=1, keepdims=True)
        tw = tw * model.model.layers[il].router.per_expert_scale.detach().double().numpy()[want_ids]
        assert np.array_equal(want_ids, ids), f"layer {il}: numpy selection differs from HF's"
        werr = max_rel_diff(w, tw)
        assert werr < 1e-14, f"layer {il}: numpy weights differ from HF's: {werr}"
        fr = np.bincount(ids.reshape(-1), minlength=lg.shape[1]) / ids.shape[0]
        res.append(dict(layer=il, fractions=fr, gap=gap, experts_used=int(np.sum(fr > 0))))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR", DEFAULT_LLAMA_CPP))
    ap.add_argument("--data", default=os.path.join(HERE, "..", "tests", "data"))
    ap.add_argument("--keep-hf", default=None, help="also keep the HF model folder here (debugging)")
    args = ap.parse_args()
    lcpp = os.path.abspath(args.llama_cpp)
    sys.path.insert(0, os.path.join(lcpp, "gguf-py"))
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
    import gguf
    import torch
    import transformers
    import qwen3moe_ref  # noqa: E402  (the dump writer / reader only)
    from transformers.models.gemma4 import modeling_gemma4 as mod
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
    torch.set_num_threads(1)

    out_dir = os.path.join(args.data, "hf_gemma4")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    config = Gemma4TextConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    config._experts_implementation = "eager"
    model = mod.Gemma4ForCausalLM(config).eval()
    orig = init_weights(model, rng, torch)
    prompt = [int(t) for t in rng.integers(4, VOCAB, N_PROMPT)]

    tmp = tempfile.mkdtemp(prefix="tiermoe-")
    hf_dir = os.path.join(tmp, "tiny-gemma4")
    try:
        model.save_pretrained(hf_dir)
        write_tokenizer(hf_dir)
        with open(os.path.join(hf_dir, "config.json")) as f:
            saved_cfg = json.load(f)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(saved_cfg, f, indent=1, sort_keys=True)
            f.write("\n")
        mpath = os.path.join(out_dir, "tiny-f16.gguf")
        log = convert(hf_dir, mpath, "gemma4", "default", lcpp)
        for line in log.splitlines():
            if line.startswith("WARNING"):
                print(f"   converter: {line}")
    finally:
        if args.keep_hf:
            dst = os.path.join(args.keep_hf, "tiny-gemma4")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(hf_dir, dst)
        shutil.rmtree(tmp, ignore_errors=True)

    reader, t, types = read_gguf(mpath, gguf)
    assert reader.fields["general.architecture"].contents() == "gemma4"
    sd = gguf_to_hf(config, t)
    model = model.double()
    n_f16 = load_and_check(model, sd, orig, types, torch, buffers=("layer_scalar",))

    f64 = Float64(mod, model, torch)
    with f64 as patched:
        tokens, greedy_gap = greedy(model, prompt, N_DECODE, torch)
        assert greedy_gap >= MIN_MARGIN, f"a near tie in the greedy choices: {greedy_gap}"
        gold = run_hf(model, tokens, N_PROMPT, torch, cached=True)
        want = [int(np.argmax(gold["logits"][t])) for t in range(N_PROMPT - 1, len(tokens) - 1)]
        assert want == tokens[N_PROMPT:], "the golden's logits do not choose the greedy tokens"
        missing = [k for k in PATCHES if f64.counter.get(k, 0) == 0]
        assert not missing, f"patched but never called: {missing}"
        full = run_hf(model, tokens, N_PROMPT, torch, cached=False)
    raw = run_hf(model, tokens, N_PROMPT, torch, cached=True)   # transformers as shipped
    islands = max_rel_diff(raw["logits"], gold["logits"])

    assert set(gold) == set(full)
    agree = 0.0
    for name in gold:
        if name.endswith("topk_ids"):
            assert np.array_equal(gold[name], full[name]), name
        else:
            agree = max(agree, max_rel_diff(gold[name], full[name]))
    assert agree < AGREE_LIMIT, f"cached (a) vs one-pass (b): {agree}"
    health = routing_health(gold, model)
    for h in health:
        assert h["gap"] >= MIN_MARGIN, h

    meta = {"dump.n_prompt": N_PROMPT, "dump.seed": SEED,
            "hf.transformers_version": transformers.__version__,
            "hf.torch_version": torch.__version__,
            "hf.attn_implementation": "sdpa",
            "hf.float64_patches": ", ".join(patched),
            "hf.float32_islands_max_rel_diff": islands,
            "hf.cached_vs_full_max_rel_diff": agree,
            "hf.converter": "llama.cpp convert_hf_to_gguf.py --outtype f16",
            "hf.router_logits": "the router's proj output, before softmax",
            "hf.topk_order": "probability, highest first",
            "hf.decode_tokens": "greedy: argmax of the previous position's float64 logits",
            "hf.greedy_min_gap": greedy_gap,
            "hf.topk_weights": "renormalised top-k probabilities x per_expert_scale",
            "hf.stages": "attn_out before post_attention_norm; dense_out before post_ffw_norm_1; "
                         "ffn_out before post_ffw_norm_2; x_out after layer_scalar"}
    gpath = os.path.join(out_dir, "tiny.golden.gguf")
    qwen3moe_ref.write_dump(gpath, gold, tokens, os.path.basename(mpath),
                            "HF transformers Gemma4ForCausalLM, float64 (scripts/make_gemma4_goldens.py)",
                            extra_meta=meta, float_type=np.float64)
    back, _ = qwen3moe_ref.read_dump(gpath)
    for name in gold:
        assert np.array_equal(back[name], gold[name].astype(back[name].dtype)), name

    print(f"== gemma4: {mpath} {os.path.getsize(mpath)} bytes, golden {os.path.getsize(gpath)} bytes; "
          f"{n_f16} HF params from F16")
    print(f"   cached (a) vs one-pass (b): max rel diff {agree:.3g}; unpatched-vs-float64 logits {islands:.3g}")
    print(f"   greedy tokens {tokens[N_PROMPT:]}; min top-2 logit gap {greedy_gap:.3g}")
    for h in health:
        print(f"   layer {h['layer']}: tokens per expert " + " ".join(f"{x:.3f}" for x in h["fractions"])
              + f"; experts used {h['experts_used']}; min selection gap {h['gap']:.3g}")
    xo = [np.linalg.norm(gold[f"blk.{il}.x_out"], axis=1).mean() for il in range(config.num_hidden_layers)]
    lg = gold["logits"]
    print("   mean |x_out| per layer " + " ".join(f"{v:.2f}" for v in xo)
          + f"; logits range [{lg.min():.2f}, {lg.max():.2f}]; patched calls {f64.counter}")


if __name__ == "__main__":
    main()
