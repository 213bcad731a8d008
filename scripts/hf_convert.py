"""What the golden scripts that go through llama.cpp's converter share
(make_qwen3next_goldens.py, make_moe_goldens.py): a tiny byte-level tokenizer
for the HF model directory, the converter run as a tool (only its pre-tokenizer
identification patched), the GGUF read back in float64 and loaded into the HF
model with its round trip checked (make_gemma4_goldens.py too), HF functions
re-compiled from their own source with counted text replacements (the float64
patches), and the HF model run with forward hooks catching its intermediates
(all three)."""
import functools
import inspect
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

# convert_hf_to_gguf.py with TextModel.get_vocab_base_pre returning argv[2]: the tiny
# tokenizer's hash is unknown to it; everything else runs unchanged
CONVERTER_WRAPPER = r"""
import runpy, sys
lcpp, tokpre = sys.argv[1], sys.argv[2]
sys.path[:0] = [lcpp, lcpp + "/gguf-py"]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: tokpre
sys.argv = [lcpp + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(lcpp + "/convert_hf_to_gguf.py", run_name="__main__")
"""

MERGES = [("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("Ġ", "a"), ("o", "n"), ("r", "e"),
          ("Ġ", "s"), ("e", "n"), ("Ġt", "he"), ("a", "t"), ("o", "r"), ("e", "s"), ("Ġ", "w")]


def write_tokenizer(d, specials, vocab_size, model_max_length):
    """Byte-level BPE in d: bytes 0..239 + merges + the special tokens = vocab_size tokens
    (the specials last; the first of them is the end of text)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(240)}
    merges = MERGES[:16 - len(specials)]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert tk.get_vocab_size() == vocab_size and tk.token_to_id(specials[0]) == vocab_size - len(specials)
    tk.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
                   "eos_token": specials[0], "pad_token": specials[0]}, f)


def convert(hf_dir, out_path, name, tokpre, lcpp, extra_args=()):
    """convert_hf_to_gguf.py of the llama.cpp source tree lcpp on hf_dir, f16 (CONVERTER_WRAPPER);
    returns its output."""
    cmd = [sys.executable, "-c", CONVERTER_WRAPPER, lcpp, tokpre, hf_dir, "--outtype", "f16",
           "--outfile", out_path, "--model-name", f"tiermoe-tiny-{name}", *extra_args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise RuntimeError(f"convert_hf_to_gguf.py failed for {name}")
    return r.stdout + r.stderr


def read_gguf(path, gguf):
    """The reader, every tensor dequantized to float64, and every tensor's type name."""
    r = gguf.GGUFReader(path, "r")
    tensors, types = {}, {}
    for x in r.tensors:
        tensors[x.name] = np.asarray(gguf.quants.dequantize(x.data, x.tensor_type), dtype=np.float64)
        types[x.name] = x.tensor_type.name
    return r, tensors, types


def load_and_check(model, sd, orig, types, torch, buffers=(), special=None):
    """Load sd {HF name: (float64 array, [GGUF tensors])} into the float64 model (its parameters
    and the buffers whose names end with one of buffers), each value first asserted equal to
    the original float32 one orig[name], rounded to f16 where its GGUF tensor is F16; a name
    in special {name: check(value, original, type)} is asserted by its own check instead.
    Returns how many came from F16."""
    params = dict(model.named_parameters())
    params.update({n: b for n, b in model.named_buffers() if n.endswith(tuple(buffers))} if buffers else {})
    assert set(params) == set(sd), sorted(set(params) ^ set(sd))
    n_f16 = 0
    for name, (val, srcs) in sd.items():
        ts = {types[s] for s in srcs}
        assert len(ts) == 1, (name, ts)
        ty = ts.pop()
        o = orig[name]
        assert val.shape == o.shape, (name, val.shape, o.shape)
        if special and name in special:
            special[name](val, o, ty)
            continue
        if ty == "F16":
            expect = o.astype(np.float16).astype(np.float64)
            n_f16 += 1
        else:
            assert ty == "F32", (name, ty)
            expect = o.astype(np.float64)
        assert np.array_equal(val, expect), f"round trip differs for {name} ({ty})"
    with torch.no_grad():
        for k, (v, _) in sd.items():
            assert params[k].dtype == torch.float64, (k, params[k].dtype)
            params[k].copy_(torch.from_numpy(np.ascontiguousarray(v)))
    return n_f16


def recompile(fn, replacements, globs, counter, key):
    """fn re-compiled from its own source with exact, counted text replacements, wrapped to count calls."""
    src = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    if src.startswith("@staticmethod\n"):
        src = src[len("@staticmethod\n"):]
    for old, new in replacements:
        n = src.count(old)
        if n != 1:
            raise RuntimeError(f"float64 patch of {key}: '{old}' found {n} times (transformers changed?)")
        src = src.replace(old, new)
    ns = {}
    exec(compile(src, f"<float64 patch of {key}>", "exec"), globs, ns)
    new_fn = ns[fn.__name__]

    @functools.wraps(new_fn)
    def counted(*a, **kw):
        counter[key] = counter.get(key, 0) + 1
        return new_fn(*a, **kw)
    return counted


def hook_catcher():
    """(caught, hooks, add, fwd): add(name, x) appends x detached to caught[name], a
    [batch, tokens, ...] tensor flattened to [batch * tokens, ...]; fwd(module, fn)
    registers fn(inputs, output) as module's forward hook (its handle in hooks)."""
    caught, hooks = {}, []

    def add(name, x):
        x = x.detach()
        caught.setdefault(name, []).append(x.reshape(-1, *x.shape[2:]) if x.dim() == 3 else x)

    def fwd(module, fn):
        hooks.append(module.register_forward_hook(lambda _m, inp, out: fn(inp, out)))
    return caught, hooks, add, fwd


def run_hooked(model, tokens, n_prompt, cached, hooks, torch):
    """The model on tokens, its hooks removed afterwards. cached: the first n_prompt
    tokens as one step, then one token a step through the model's cache; else one
    forward without a cache. Returns (logits [len(tokens), vocab] as numpy, the cache)."""
    logits, cache = [], None
    try:
        with torch.no_grad():
            if cached:
                for step in [tokens[:n_prompt]] + [[t] for t in tokens[n_prompt:]]:
                    kw = dict(use_cache=True)
                    if cache is not None:
                        kw["cache"] = cache
                    out = model(input_ids=torch.tensor([step], dtype=torch.long), **kw)
                    cache = out.cache if hasattr(out, "cache") else out.past_key_values
                    assert cache is not None
                    logits.append(out.logits[0])
            else:
                out = model(input_ids=torch.tensor([tokens], dtype=torch.long), use_cache=False)
                logits.append(out.logits[0])
    finally:
        for h in hooks:
            h.remove()
    return torch.cat(logits, dim=0).numpy(), cache
