"""What the golden scripts share (make_hf_goldens.py, make_gptoss_goldens.py; max_rel_diff also the converter-based ones): patching
HF modules' float32 islands for the run, and one HF forward with hooks on every layer,
returned as the golden arrays of docs/golden-format.md."""
import contextlib

import numpy as np


@contextlib.contextmanager
def patched_forwards(pairs):
    """Replace cls.forward by fn for each (cls, fn) while the block runs, then restore."""
    saved = [(cls, cls.forward) for cls, _ in pairs]
    for cls, fn in pairs:
        cls.forward = fn
    try:
        yield
    finally:
        for cls, fn in saved:
            cls.forward = fn


def rms_forward_in_dtype(torch):
    """An RMSNorm forward in the input's dtype (transformers' computes in float32)."""
    def rms_forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))
    return rms_forward


def hf_run(model, tokens, torch, router, ffn_out):
    """Run HF over tokens with forward hooks; returns {name: numpy [n_tok, ...]}: logits
    (float64), and per layer attn_out, router_logits, topk_ids (int32), topk_weights,
    ffn_out, x_out. router(layer) is the module returning (logits, weights, ids);
    ffn_out(output) picks the MoE block's output from what its forward returns."""
    caught, hooks = {}, []

    def grab(name, fn):
        def hook(_m, _inp, out):
            caught[name] = fn(out)
        return hook

    for il, layer in enumerate(model.model.layers):
        p = f"blk.{il}."
        hooks.append(layer.self_attn.register_forward_hook(grab(p + "attn_out", lambda o: o[0])))
        hooks.append(router(layer).register_forward_hook(grab(p + "router", lambda o: o)))
        hooks.append(layer.mlp.register_forward_hook(grab(p + "ffn_out", ffn_out)))
        hooks.append(layer.register_forward_hook(
            grab(p + "x_out", lambda o: o[0] if isinstance(o, tuple) else o)))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([tokens], dtype=torch.long), use_cache=False)
    finally:
        for h in hooks:
            h.remove()

    def np2(x):
        return x.detach().reshape(len(tokens), -1).numpy()

    arrays = {"logits": np2(out.logits).astype(np.float64)}
    for il in range(len(model.model.layers)):
        p = f"blk.{il}."
        rl, rw, ri = caught[p + "router"]
        arrays[p + "attn_out"] = np2(caught[p + "attn_out"])
        arrays[p + "router_logits"] = np2(rl)
        arrays[p + "topk_ids"] = np2(ri).astype(np.int32)
        arrays[p + "topk_weights"] = np2(rw)
        arrays[p + "ffn_out"] = np2(caught[p + "ffn_out"])
        arrays[p + "x_out"] = np2(caught[p + "x_out"])
    return arrays


def max_rel_diff(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))
