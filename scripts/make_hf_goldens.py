#!/usr/bin/env python3
"""Build the tiny qwen3moe test model and its HuggingFace transformers goldens.

What it makes (committed under tests/data/hf_qwen3moe/, see docs/golden-format.md):
  tiny-f32.gguf            random-weight Qwen3-MoE in llama.cpp's qwen3moe GGUF layout, F32
  tiny-f32.golden.gguf     HF Qwen3MoeForCausalLM (float64) run on dump.tokens: logits and
                           per-layer attn_out, router_logits, topk_ids, topk_weights,
                           ffn_out, x_out, stored as F64 (I32 for ids)
  tiny-q8_0.gguf           the same model with matrices in Q8_0 (norms and router F32)
  tiny-q8_0.golden.gguf    HF run on the dequantized Q8_0 weights
  config.json              the HF config used

How: weights are drawn with numpy (fixed seed, scales chosen so that routing is
healthy: token identity dominates the residual stream and tokens spread over
the experts), written to GGUF exactly as convert_hf_to_gguf.py writes
Qwen3MoeForCausalLM (class Qwen3MoeModel → Qwen2MoeModel: no q/k permutation,
experts.E.{gate,up,down}_proj stacked into ffn_{gate,up,down}_exps), then each
GGUF is read back with gguf.GGUFReader, dequantized and loaded into the HF
model (the GGUF → HF direction), so HF computes on exactly the GGUF's values.

Float64: model.double() is not enough in transformers 5.x: RMSNorm casts to
float32, the router softmax and the rotary table are computed in float32 and
the eager attention softmax in float32. The script replaces those four spots
with the same formulas in the input dtype (float64) and uses SDPA attention,
so the golden is float64 end to end. It also runs the unpatched model and
records how far it is from the patched one ("hf.float32_islands_max_rel_diff"):
a difference of float32 size (~1e-7) shows the patches change precision only.

Needs torch and transformers (NOT needed by CI; the outputs are committed):
  pip install torch transformers gguf numpy
  python3 scripts/make_hf_goldens.py [--out tests/data/hf_qwen3moe]
"""

import argparse
import json
import os
import sys

import numpy as np

import gguf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from hf_dump import hf_run, max_rel_diff, patched_forwards, rms_forward_in_dtype  # noqa: E402  (beside this script)
import qwen3moe_ref  # noqa: E402  (the dump writer; the forward there is not used here)

SEED = 20250601
N_PROMPT = 16         # C tests: first 16 tokens as one prompt batch ...
N_DECODE = 8          # ... then 8 single-token decode steps through the KV cache

HP = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,      # dense FFN size; unused (every layer is MoE), written as the converter does
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=32,
    norm_topk_prob=True,
    tie_word_embeddings=False,
)


# ---------------------------------------------------------------- weights (HF names, numpy f32)

def make_weights(rng):
    """Random weights in HF's per-expert checkpoint naming and [out, in] layout."""
    H, L, E, I = HP["hidden_size"], HP["num_hidden_layers"], HP["num_experts"], HP["moe_intermediate_size"]
    nh, nkv, dk, V = HP["num_attention_heads"], HP["num_key_value_heads"], HP["head_dim"], HP["vocab_size"]

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_w(n):
        # not all ones, so a missing or misplaced norm weight shows up
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {}
    # std 1 embedding: token identity dominates the residual stream (mkmodel's lesson)
    w["model.embed_tokens.weight"] = normal((V, H), 1.0)
    for il in range(L):
        p = f"model.layers.{il}."
        w[p + "input_layernorm.weight"] = norm_w(H)
        w[p + "self_attn.q_proj.weight"] = normal((nh * dk, H), H ** -0.5)
        w[p + "self_attn.k_proj.weight"] = normal((nkv * dk, H), H ** -0.5)
        w[p + "self_attn.v_proj.weight"] = normal((nkv * dk, H), H ** -0.5)
        w[p + "self_attn.o_proj.weight"] = normal((H, nh * dk), 0.5 * (nh * dk) ** -0.5)
        w[p + "self_attn.q_norm.weight"] = norm_w(dk)
        w[p + "self_attn.k_norm.weight"] = norm_w(dk)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
        # router logits of std ~1.5: decisive but not collapsed
        w[p + "mlp.gate.weight"] = normal((E, H), 1.5 * H ** -0.5)
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            w[q + "gate_proj.weight"] = normal((I, H), H ** -0.5)
            w[q + "up_proj.weight"] = normal((I, H), H ** -0.5)
            w[q + "down_proj.weight"] = normal((H, I), 0.5 * I ** -0.5)
    w["model.norm.weight"] = norm_w(H)
    w["lm_head.weight"] = normal((V, H), H ** -0.5)
    return w


# ---------------------------------------------------------------- HF → GGUF (as convert_hf_to_gguf.py)

# HF module path → GGUF name stem, for loading GGUF back into HF (inverse of gguf_name)
HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate": "ffn_gate_inp",
}


def gguf_name(hf_name):
    """The converter's map_tensor_name: gguf's own TensorNameMap for arch qwen3moe."""
    m = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, HP["num_hidden_layers"])
    name = m.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise KeyError(f"gguf has no qwen3moe name for {hf_name}")
    return name


def gguf_tensors(w):
    """(gguf name, numpy array in numpy order) like Qwen2MoeModel.modify_tensors."""
    L, E = HP["num_hidden_layers"], HP["num_experts"]
    out = []
    for hf, arr in w.items():
        if ".mlp.experts." not in hf:
            out.append((gguf_name(hf), arr))
    for il in range(L):
        p = f"model.layers.{il}."
        for proj in ("down_proj", "gate_proj", "up_proj"):
            # torch.stack(datas, dim=0): numpy [E, out, in] → ne [in, out, E]
            stacked = np.stack([w[f"{p}mlp.experts.{e}.{proj}.weight"] for e in range(E)], axis=0)
            out.append((gguf_name(f"{p}mlp.experts.{proj}.weight"), stacked))
    for name, _ in out:   # the names this file's loader and the reference expect
        assert name in EXPECTED_NAMES, name

    def file_order(item):   # token_embd, blk.0.*, blk.1.*, ..., output_norm, output
        n = item[0]
        return (int(n.split(".")[1]) + 1) if n.startswith("blk.") else (0 if n.startswith("token_embd") else 1 << 20)
    return sorted(out, key=file_order)   # stable: HF order inside a block, experts last


EXPECTED_NAMES = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
    f"blk.{il}.{stem}.weight" for il in range(HP["num_hidden_layers"])
    for stem in list(HF_TO_GGUF.values()) + ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]}


def tensor_type_for(name, arr, quant):
    """Q8_0 for matrices whose rows are multiples of 32; norms and router stay F32."""
    if quant is None or arr.ndim < 2 or name.endswith("ffn_gate_inp.weight"):
        return gguf.GGMLQuantizationType.F32
    if arr.shape[-1] % 32 != 0:
        return gguf.GGMLQuantizationType.F32
    return quant


def write_model_gguf(path, w, quant=None, name="tiermoe-tiny-qwen3moe"):
    arch = "qwen3moe"
    gw = gguf.GGUFWriter(path, arch)
    gw.add_name(name)
    gw.add_context_length(HP["max_position_embeddings"])
    gw.add_embedding_length(HP["hidden_size"])
    gw.add_feed_forward_length(HP["intermediate_size"])
    gw.add_block_count(HP["num_hidden_layers"])
    gw.add_head_count(HP["num_attention_heads"])
    gw.add_head_count_kv(HP["num_key_value_heads"])
    gw.add_rope_freq_base(HP["rope_theta"])
    gw.add_layer_norm_rms_eps(HP["rms_norm_eps"])
    gw.add_expert_used_count(HP["num_experts_per_tok"])
    gw.add_key_length(HP["head_dim"])
    gw.add_value_length(HP["head_dim"])
    gw.add_expert_count(HP["num_experts"])
    gw.add_expert_feed_forward_length(HP["moe_intermediate_size"])
    gw.add_file_type(gguf.LlamaFileType.ALL_F32 if quant is None else gguf.LlamaFileType.MOSTLY_Q8_0)
    gw.add_quantization_version(gguf.GGML_QUANT_VERSION)
    gw.add_tokenizer_model("none")   # llama.cpp: LLAMA_VOCAB_TYPE_NONE, token ids only
    for tname, arr in gguf_tensors(w):
        qt = tensor_type_for(tname, arr, quant)
        if qt == gguf.GGMLQuantizationType.F32:
            gw.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))
        else:
            data = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qt)
            gw.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=qt)
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()


# ---------------------------------------------------------------- GGUF → HF

def load_gguf_into_hf(model, path, torch):
    """Dequantize every tensor of the GGUF (gguf package) and set the HF parameters."""
    r = gguf.GGUFReader(path, "r")
    t = {x.name: np.asarray(gguf.quants.dequantize(x.data, x.tensor_type), dtype=np.float64) for x in r.tensors}
    sd = {}
    sd["model.embed_tokens.weight"] = t["token_embd.weight"]
    sd["model.norm.weight"] = t["output_norm.weight"]
    sd["lm_head.weight"] = t["output.weight"]
    for il in range(HP["num_hidden_layers"]):
        p = f"model.layers.{il}."
        for hf, gg in HF_TO_GGUF.items():
            sd[p + hf + ".weight"] = t[f"blk.{il}.{gg}.weight"]
        # transformers 5.x keeps experts fused: gate_up_proj [E, 2I, H] = [gate; up], down_proj [E, H, I]
        sd[p + "mlp.experts.gate_up_proj"] = np.concatenate(
            [t[f"blk.{il}.ffn_gate_exps.weight"], t[f"blk.{il}.ffn_up_exps.weight"]], axis=1)
        sd[p + "mlp.experts.down_proj"] = t[f"blk.{il}.ffn_down_exps.weight"]
    params = dict(model.named_parameters())
    missing = set(params) - set(sd)
    if missing:
        raise RuntimeError(f"HF parameters not set from {path}: {sorted(missing)}")
    with torch.no_grad():
        for k, v in sd.items():
            if tuple(params[k].shape) != v.shape:
                raise RuntimeError(f"{k}: HF shape {tuple(params[k].shape)} vs GGUF {v.shape}")
            params[k].copy_(torch.from_numpy(v))


# ---------------------------------------------------------------- float64 patches

def float64_patches(mod, torch):
    """Swap transformers' float32 islands for the same formulas in the input dtype."""
    F = torch.nn.functional

    def router_forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = F.linear(hidden_states, self.weight)
        router_probs = F.softmax(router_logits, dim=-1)
        top_value, top_idx = torch.topk(router_probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_value = top_value / top_value.sum(dim=-1, keepdim=True)
        return router_logits, top_value, top_idx

    def rotary_forward(self, x, position_ids):
        base = self.config.rope_parameters["rope_theta"]
        dim = self.config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    return patched_forwards(((mod.Qwen3MoeRMSNorm, rms_forward_in_dtype(torch)),
                             (mod.Qwen3MoeTopKRouter, router_forward),
                             (mod.Qwen3MoeRotaryEmbedding, rotary_forward)))


# ---------------------------------------------------------------- HF run (hf_dump.hf_run)

def moe_router(layer):
    return layer.mlp.gate


def moe_out(o):  # Qwen3MoeSparseMoeBlock returns the output alone
    return o


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "hf_qwen3moe"))
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe import modeling_qwen3_moe as mod

    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    os.makedirs(args.out, exist_ok=True)

    cfg_kw = dict(HP)
    rope_theta = cfg_kw.pop("rope_theta")
    config = Qwen3MoeConfig(**cfg_kw, rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
                            hidden_act="silu", attention_bias=False, use_sliding_window=False,
                            decoder_sparse_step=1, mlp_only_layers=[])
    config._attn_implementation = "sdpa"
    config._experts_implementation = "eager"
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(json.loads(config.to_json_string()), f, indent=1, sort_keys=True)
        f.write("\n")

    weights = make_weights(rng)
    tokens = [int(t) for t in rng.integers(0, HP["vocab_size"], N_PROMPT + N_DECODE)]

    model = Qwen3MoeForCausalLM(config).double().eval()
    versions = {"hf.transformers_version": transformers.__version__,
                "hf.torch_version": torch.__version__,
                "hf.attn_implementation": "sdpa",
                "hf.float64_patches": "Qwen3MoeRMSNorm, Qwen3MoeTopKRouter softmax, Qwen3MoeRotaryEmbedding",
                "dump.n_prompt": N_PROMPT,
                "dump.seed": SEED}

    for tag, quant in (("f32", None), ("q8_0", gguf.GGMLQuantizationType.Q8_0)):
        mpath = os.path.join(args.out, f"tiny-{tag}.gguf")
        write_model_gguf(mpath, weights, quant=quant)
        load_gguf_into_hf(model, mpath, torch)
        with float64_patches(mod, torch):
            gold = hf_run(model, tokens, torch, moe_router, moe_out)
        raw = hf_run(model, tokens, torch, moe_router, moe_out)   # transformers as shipped, float32 islands included
        islands = max_rel_diff(raw["logits"], gold["logits"])
        meta = dict(versions)
        meta["hf.float32_islands_max_rel_diff"] = islands
        gpath = os.path.join(args.out, f"tiny-{tag}.golden.gguf")
        qwen3moe_ref.write_dump(gpath, gold, tokens, os.path.basename(mpath),
                                "HF transformers Qwen3MoeForCausalLM, float64 (scripts/make_hf_goldens.py)",
                                extra_meta=meta, float_type=np.float64)
        E = HP["num_experts"]
        used = [len(np.unique(gold[f"blk.{il}.topk_ids"])) for il in range(HP["num_hidden_layers"])]
        print(f"{mpath}: {os.path.getsize(mpath)} bytes; golden {os.path.getsize(gpath)} bytes; "
              f"experts reached per layer {used} of {E}; unpatched-vs-float64 logits {islands:.3g}")


if __name__ == "__main__":
    main()
