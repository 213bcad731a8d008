#!/usr/bin/env python3
"""Mixtral (arch llama), OLMoE, GLM-4-MoE and DeepSeek-V3 (arch deepseek2) files that must be refused with an
error naming the tensor or key.

Each case is a converter-written tiny file of tests/data (hf_mixtral, hf_olmoe,
hf_glm4moe, hf_deepseek2) copied with the gguf package with one thing wrong: a missing expert,
norm, bias or selection-bias tensor, a dense llama file (no experts), expert or
group counts that do not fit (groups that do not divide the experts, more groups
used than there are, groups of one, too few experts in the kept groups for k), a
gating function llama.cpp does not have, all layers dense, a QK norm in some layers
only, a norm in a quantized type, a NextN layer without its projection; and, as
controls, the unchanged copies, which must load and give finite logits, and GLM with
a NextN layer appended (block_count + 1, nextn_predict_layers 1, the last layer's
tensors again plus nextn.eh_proj / enorm / hnorm), which must load, leave the layer
unrun and give the same logits bit for bit. DeepSeek-V3: a missing latent norm
(attn_kv_a_norm) or q_a norm, MLA ranks that disagree with the tensors (kv_lora_rank,
q_lora_rank), a latent key width that is not kv_lora_rank + the RoPE width, more than
one KV head, no q_lora_rank key beside q_a / q_b tensors, groups that do not divide the
experts, a missing selection bias under the sigmoid router, a RoPE scaling it does not
have; its NextN layer as GLM's. Gemma 4 (hf_gemma4): a sliding layer without attn_v, a
missing router scale, per-expert scale, layer scale or fused experts, KV heads a layer
that are too few, do not divide the heads or disagree with attn_k, a layer pattern of
the wrong length, per-layer input embeddings and KV-shared layers (E2B / E4B: not
supported), sliding heads that disagree with their norms, a norm in f16, a zero RoPE
factor, a negative soft-cap. No case may crash (a signal) or print NaN logits."""
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import DATA, TMP, TOOLS, check, finish  # noqa: E402
import qwen3moe_ref as ref  # noqa: E402
from test_qwen3next_bad import copy  # noqa: E402  (a converter file copied with changes)


def forward(path, tag):
    out = os.path.join(TMP, f"bad_out_{tag}.gguf")
    r = subprocess.run([os.path.join(TOOLS, "forward_dump"), path, "--tokens", "1,2,3,4,5,6", "-o", out],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr, out


def case(arch, label, expect, **kw):
    """expect: words the error must name, or None (must load; returns the logits)."""
    src = os.path.join(DATA, "hf_" + arch, "tiny-f16.gguf")
    path = os.path.join(TMP, f"bad_{arch}_{label}.gguf")
    copy(src, path, **kw)
    rc, out, dump = forward(path, label)
    check(rc >= 0, f"{arch} {label}: killed by signal {-rc}: {out.strip()[-400:]}")
    logits = None
    if expect is None:
        ok = rc == 0
        if ok:
            logits = ref.read_dump(dump)[0]["logits"]
            ok = np.isfinite(logits).all()
        check(ok, f"{arch} {label}: the valid file failed or gave non-finite logits: {out.strip()[-400:]}")
    else:
        check(rc > 0 and all(e in out for e in expect),
              f"{arch} {label}: rc {rc}, expected an error naming {expect}, got: {out.strip()[-400:]}")
    print(f"  {arch} {label}: {out.strip().splitlines()[-1] if out.strip() else '(no output)'}")
    return logits


def nextn_layer(arch, n_block):
    """The last layer's tensors again as layer n_block, and NextN's own (numpy order)."""
    r = gguf.GGUFReader(os.path.join(DATA, "hf_" + arch, "tiny-f16.gguf"))
    E = int(r.fields[f"{arch}.embedding_length"].contents())
    last, extra = f"blk.{n_block - 1}.", {}
    for t in r.tensors:
        if t.name.startswith(last):
            shape = [int(n) for n in reversed(t.shape)]
            vals = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
            extra[f"blk.{n_block}." + t.name[len(last):]] = vals
    rng = np.random.default_rng(5)
    extra[f"blk.{n_block}.nextn.eh_proj.weight"] = rng.standard_normal((E, 2 * E)) * 0.1
    extra[f"blk.{n_block}.nextn.enorm.weight"] = np.ones(E)
    extra[f"blk.{n_block}.nextn.hnorm.weight"] = np.ones(E)
    extra[f"blk.{n_block}.nextn.shared_head_norm.weight"] = np.ones(E)
    return extra


def nextn_cases(arch, base):
    """A NextN layer after the 4 of arch's tiny file: loaded and checked, not run (the logits
    equal base's, the file's without it); without its projection: refused. The keys that
    add it (block_count 5, nextn_predict_layers 1)."""
    k = arch + "."
    nextn = {k + "block_count": ("add_uint32", 5), k + "nextn_predict_layers": ("add_uint32", 1)}
    with_nextn = case(arch, "nextn", None, set_kv=nextn, extra=nextn_layer(arch, 4))
    if base is not None and with_nextn is not None:
        check(np.array_equal(base, with_nextn), f"{arch} nextn: the logits differ from the file without it")
    extra = nextn_layer(arch, 4)
    del extra["blk.4.nextn.eh_proj.weight"]
    case(arch, "nextn_no_proj", ["NextN layer 4", "missing tensor", "blk.4.nextn.eh_proj.weight"],
         set_kv=nextn, extra=extra)
    return nextn


def main():
    os.makedirs(TMP, exist_ok=True)
    k = "llama."
    case("mixtral", "valid", None)
    case("mixtral", "no_experts", ["missing tensor", "blk.1.ffn_gate_exps.weight"],
         skip_tensors=("blk.1.ffn_gate_exps.weight",))
    case("mixtral", "dense", ["'llama' without experts", "llama.expert_count", "dense model"],
         set_kv={k + "expert_count": ("add_uint32", 0)})
    case("mixtral", "dense_no_key", ["'llama' without experts"], skip_kv=(k + "expert_count",))
    case("mixtral", "used", [k + "expert_used_count", "at most", k + "expert_count"],
         set_kv={k + "expert_used_count": ("add_uint32", 9)})
    case("mixtral", "rope_dims", [k + "rope.dimension_count", "equal to", k + "attention.key_length"],
         set_kv={k + "rope.dimension_count": ("add_uint32", 8)})
    case("mixtral", "ff_width", ["blk.0.ffn_gate_exps.weight", "expected [64 x 16 x 8]"],
         set_kv={k + "feed_forward_length": ("add_uint32", 16)})

    k = "olmoe."
    case("olmoe", "valid", None)
    case("olmoe", "no_q_norm", ["missing tensor", "blk.2.attn_q_norm.weight"],
         skip_tensors=("blk.2.attn_q_norm.weight",))
    case("olmoe", "norm_type", ["blk.0.attn_k_norm.weight", "must be f32"],
         tensor_type={"blk.0.attn_k_norm.weight": gguf.GGMLQuantizationType.F16})

    k = "glm4moe."
    base = case("glm4moe", "valid", None)
    case("glm4moe", "no_sel_bias", ["missing tensor", "blk.1.exp_probs_b.bias"],
         skip_tensors=("blk.1.exp_probs_b.bias",))
    case("glm4moe", "no_q_bias", ["missing tensor", "blk.0.attn_q.bias"], skip_tensors=("blk.0.attn_q.bias",))
    case("glm4moe", "no_shexp", ["missing tensor", "blk.3.ffn_down_shexp.weight"],
         skip_tensors=("blk.3.ffn_down_shexp.weight",))
    case("glm4moe", "no_dense_ffn", ["missing tensor", "blk.0.ffn_up.weight"], skip_tensors=("blk.0.ffn_up.weight",))
    case("glm4moe", "groups", [k + "expert_count", "multiple of", k + "expert_group_count"],
         set_kv={k + "expert_group_count": ("add_uint32", 3)})
    case("glm4moe", "groups_used", [k + "expert_group_used_count", "at most", k + "expert_group_count"],
         set_kv={k + "expert_group_used_count": ("add_uint32", 5)})
    case("glm4moe", "groups_of_one", ["8 experts in 8 groups", k + "expert_"],
         set_kv={k + "expert_group_count": ("add_uint32", 8)})
    case("glm4moe", "groups_room", ["1 of 4 groups used", "3 experts a token"],
         set_kv={k + "expert_group_used_count": ("add_uint32", 1), k + "expert_used_count": ("add_uint32", 3)})
    case("glm4moe", "gating", [k + "expert_gating_func", "is 3"], set_kv={k + "expert_gating_func": ("add_uint32", 3)})
    case("glm4moe", "all_dense", [k + "leading_dense_block_count", "is 4"],
         set_kv={k + "leading_dense_block_count": ("add_uint32", 4)})
    case("glm4moe", "qk_norm_partly", ["layer 2 has an attn_q_norm and no attn_k_norm", "blk.2.attn_k_norm.weight"],
         skip_tensors=("blk.2.attn_k_norm.weight",))
    case("glm4moe", "bias_type", ["blk.2.exp_probs_b.bias", "must be f32"],
         tensor_type={"blk.2.exp_probs_b.bias": gguf.GGMLQuantizationType.F16})

    nextn = nextn_cases("glm4moe", base)
    extra = nextn_layer("glm4moe", 4)
    del extra["blk.4.exp_probs_b.bias"]
    case("glm4moe", "nextn_no_sel_bias", ["NextN layer 4", "blk.4.exp_probs_b.bias"], set_kv=nextn, extra=extra)

    k = "deepseek2."
    base = case("deepseek2", "valid", None)
    case("deepseek2", "no_kv_a_norm", ["missing tensor", "blk.2.attn_kv_a_norm.weight"],
         skip_tensors=("blk.2.attn_kv_a_norm.weight",))
    case("deepseek2", "no_q_a_norm", ["missing tensor", "blk.1.attn_q_a_norm.weight"],
         skip_tensors=("blk.1.attn_q_a_norm.weight",))
    case("deepseek2", "kv_lora_key", [k + "attention.value_length", "equal to", k + "attention.kv_lora_rank (16)"],
         set_kv={k + "attention.kv_lora_rank": ("add_uint32", 16)})
    case("deepseek2", "kv_lora_tensors", ["blk.0.attn_kv_a_mqa.weight", "expected [64 x 24]",
                                          k + "attention.kv_lora_rank 16"],
         set_kv={k + "attention.kv_lora_rank": ("add_uint32", 16), k + "attention.key_length": ("add_uint32", 24),
                 k + "attention.value_length": ("add_uint32", 16)})
    case("deepseek2", "q_lora", ["blk.0.attn_q_a.weight", k + "attention.q_lora_rank 16"],
         set_kv={k + "attention.q_lora_rank": ("add_uint32", 16)})
    case("deepseek2", "no_q_lora_key", ["missing tensor", "blk.0.attn_q.weight", "no " + k + "attention.q_lora_rank"],
         skip_kv=(k + "attention.q_lora_rank",))
    case("deepseek2", "key_length", [k + "attention.key_length is 48", k + "attention.kv_lora_rank 32",
                                     k + "rope.dimension_count 8"],
         set_kv={k + "attention.key_length": ("add_uint32", 48)})
    case("deepseek2", "kv_heads", [k + "attention.head_count_kv is 2", "expected 1"],
         set_kv={k + "attention.head_count_kv": ("add_uint32", 2)})
    case("deepseek2", "groups", [k + "expert_count", "multiple of", k + "expert_group_count"],
         set_kv={k + "expert_group_count": ("add_uint32", 3)})
    case("deepseek2", "groups_used", [k + "expert_group_used_count", "at most", k + "expert_group_count"],
         set_kv={k + "expert_group_used_count": ("add_uint32", 5)})
    case("deepseek2", "no_sel_bias", ["missing tensor", "blk.3.exp_probs_b.bias"],
         skip_tensors=("blk.3.exp_probs_b.bias",))
    case("deepseek2", "rope_scaling", [k + "rope.scaling.type", "'longrope'"],
         set_kv={k + "rope.scaling.type": ("add_string", "longrope")})
    nextn_cases("deepseek2", base)

    k = "gemma4."
    case("gemma4", "valid", None)
    case("gemma4", "no_v_sliding", ["sliding layer 0", "missing tensor", "blk.0.attn_v.weight"],
         skip_tensors=("blk.0.attn_v.weight",))
    for name in ("blk.1.ffn_gate_inp.scale", "blk.3.ffn_down_exps.scale", "blk.2.layer_output_scale.weight",
                 "blk.4.ffn_gate_up_exps.weight", "blk.0.pre_ffw_norm_2.weight"):
        case("gemma4", "no_" + name.split(".", 2)[2].replace(".", "_"), ["missing tensor", name],
             skip_tensors=(name,))
    case("gemma4", "kv_heads_len", [k + "attention.head_count_kv", "an array of 4", "expected 5"],
         set_kv={k + "attention.head_count_kv": ("add_array", [2, 2, 1, 2])})
    case("gemma4", "kv_heads_divide", [k + "attention.head_count_kv", "layer 2 has 3 KV heads"],
         set_kv={k + "attention.head_count_kv": ("add_array", [2, 2, 3, 2, 1])})
    case("gemma4", "kv_heads_tensor", ["blk.4.attn_k.weight", "expected [64 x 64]"],
         set_kv={k + "attention.head_count_kv": ("add_array", [2, 2, 1, 2, 2])})
    case("gemma4", "pattern_len", [k + "attention.sliding_window_pattern", "expected 5 bools"],
         set_kv={k + "attention.sliding_window_pattern": ("add_array", [True, True, False])})
    case("gemma4", "per_layer_embd", [k + "embedding_length_per_layer_input is 256", "not supported"],
         set_kv={k + "embedding_length_per_layer_input": ("add_uint32", 256)})
    case("gemma4", "kv_shared", [k + "attention.shared_kv_layers is 2", "not supported"],
         set_kv={k + "attention.shared_kv_layers": ("add_uint32", 2)})
    case("gemma4", "head_swa", ["blk.0.attn_q.weight", "expected [64 x 32]"],
         set_kv={k + "attention.key_length_swa": ("add_uint32", 8), k + "attention.value_length_swa":
                 ("add_uint32", 8), k + "rope.dimension_count_swa": ("add_uint32", 8)})
    case("gemma4", "rope_swa", [k + "rope.dimension_count_swa", "equal to", k + "attention.key_length_swa"],
         set_kv={k + "rope.dimension_count_swa": ("add_uint32", 8)})
    case("gemma4", "norm_type", ["blk.3.post_ffw_norm_2.weight", "must be f32"],
         tensor_type={"blk.3.post_ffw_norm_2.weight": gguf.GGMLQuantizationType.F16})
    case("gemma4", "rope_factor", ["rope_freqs.weight[3] is 0", "positive"], skip_tensors=("rope_freqs.weight",),
         extra={"rope_freqs.weight": np.array([1, 1, 1, 0] + [1e30] * 12)})
    case("gemma4", "softcap", [k + "final_logit_softcapping is -1"],
         set_kv={k + "final_logit_softcapping": ("add_float32", -1.0)})
    return finish("bad mixtral, olmoe, glm4moe, deepseek2 and gemma4 files are refused with a message naming the "
                  "tensor or key")


if __name__ == "__main__":
    sys.exit(main())
