#!/usr/bin/env python3
"""qwen3next and qwen35moe files that must be refused with an error naming the tensor or key.

Each case is a converter-written tiny file of tests/data (hf_qwen3next,
hf_qwen35moe) copied with the gguf package with one thing wrong: a missing
linear-attention tensor, a conv kernel width or state size that disagrees with
the tensors, a layer pattern key that does not match them, head counts that do
not divide, a norm in a quantized type; and, as a control, the unchanged copy,
which must load and give finite logits. No case may crash (a signal) or
print NaN logits."""
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

# the writer's call for each scalar field type
ADD = {
    gguf.GGUFValueType.UINT8: "add_uint8", gguf.GGUFValueType.INT8: "add_int8",
    gguf.GGUFValueType.UINT16: "add_uint16", gguf.GGUFValueType.INT16: "add_int16",
    gguf.GGUFValueType.UINT32: "add_uint32", gguf.GGUFValueType.INT32: "add_int32",
    gguf.GGUFValueType.FLOAT32: "add_float32", gguf.GGUFValueType.UINT64: "add_uint64",
    gguf.GGUFValueType.INT64: "add_int64", gguf.GGUFValueType.FLOAT64: "add_float64",
    gguf.GGUFValueType.BOOL: "add_bool", gguf.GGUFValueType.STRING: "add_string",
}


def copy(src, dst, skip_kv=(), set_kv=None, skip_tensors=(), tensor_type=None, extra=None):
    """Copy src to dst without the named keys and tensors, with keys set as
    set_kv {key: (writer method, value)}, tensors converted to tensor_type {name: type}
    and extra {name: array (numpy order)} appended as f32."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    set_kv = set_kv or {}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in skip_kv or name in set_kv:
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            getattr(w, ADD[t])(name, f.contents())
    for key, (method, value) in set_kv.items():
        getattr(w, method)(key, value)
    for t in r.tensors:
        if t.name in skip_tensors:
            continue
        shape = [int(n) for n in reversed(t.shape)]
        if tensor_type and t.name in tensor_type:
            vals = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
            q = gguf.quants.quantize(vals, tensor_type[t.name])
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=tensor_type[t.name])
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape, raw_dtype=t.tensor_type)
    for name, a in (extra or {}).items():
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def forward(path):
    out = os.path.join(TMP, "bad_out.gguf")
    r = subprocess.run([os.path.join(TOOLS, "forward_dump"), path, "--tokens", "1,2,3,4,5,6", "-o", out],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr, out


def case(arch, label, expect, **kw):
    src = os.path.join(DATA, "hf_" + arch, "tiny-f16.gguf")
    path = os.path.join(TMP, f"bad_{arch}_{label}.gguf")
    copy(src, path, **kw)
    rc, out, dump = forward(path)
    check(rc >= 0, f"{arch} {label}: killed by signal {-rc}: {out.strip()[-400:]}")
    if expect is None:
        ok = rc == 0 and np.isfinite(ref.read_dump(dump)[0]["logits"]).all()
        check(ok, f"{arch} {label}: the valid file failed or gave non-finite logits: {out.strip()[-400:]}")
    else:
        check(rc > 0 and all(e in out for e in expect),
              f"{arch} {label}: rc {rc}, expected an error naming {expect}, got: {out.strip()[-400:]}")
    print(f"  {arch} {label}: {out.strip().splitlines()[-1] if out.strip() else '(no output)'}")


def main():
    os.makedirs(TMP, exist_ok=True)
    for a in ("qwen3next", "qwen35moe"):
        k = a + "."
        case(a, "valid", None)
        case(a, "no_conv", ["missing tensor", "blk.2.ssm_conv1d.weight"], skip_tensors=("blk.2.ssm_conv1d.weight",))
        case(a, "no_ssm_a", ["missing tensor", "blk.0.ssm_a"], skip_tensors=("blk.0.ssm_a",))
        case(a, "no_ssm_norm", ["missing tensor", "blk.0.ssm_norm.weight"], skip_tensors=("blk.0.ssm_norm.weight",))
        case(a, "conv_width", ["blk.0.ssm_conv1d.weight", "shape [4 x 128]", "expected [3 x 128]"],
             set_kv={k + "ssm.conv_kernel": ("add_uint32", 3)})
        case(a, "conv_width_range", [k + "ssm.conv_kernel", "is 1"], set_kv={k + "ssm.conv_kernel": ("add_uint32", 1)})
        case(a, "state_size", ["blk.0.attn_qkv.weight", "shape [64 x 128]"],
             set_kv={k + "ssm.state_size": ("add_uint32", 32)})
        case(a, "inner_size", ["blk.0.attn_qkv.weight", "expected [64 x 192]"], set_kv={k + "ssm.inner_size": ("add_uint32", 128)})
        case(a, "value_heads", [k + "ssm.time_step_rank", "multiple of", k + "ssm.group_count"],
             set_kv={k + "ssm.time_step_rank": ("add_uint32", 3)})
        case(a, "pattern", ["layer 1 has attn_q", k + "attention.recurrent_layers", "linear"],
             set_kv={k + "attention.recurrent_layers": ("add_array", [True, True, True, False])})
        case(a, "pattern_len", [k + "attention.recurrent_layers", "expected 4 bools"],
             set_kv={k + "attention.recurrent_layers": ("add_array", [True, False])})
        case(a, "interval", ["layer 1 has attn_q", k + "full_attention_interval", "linear"],
             skip_kv=(k + "attention.recurrent_layers",), set_kv={k + "full_attention_interval": ("add_uint32", 3)})
        case(a, "rope_dims", [k + "rope.dimension_count", "at most", k + "attention.key_length"],
             set_kv={k + "rope.dimension_count": ("add_uint32", 64)})
        case(a, "norm_type", ["blk.0.ssm_norm.weight", "must be f32"],
             tensor_type={"blk.0.ssm_norm.weight": gguf.GGMLQuantizationType.F16})
    return finish("bad qwen3next and qwen35moe files are refused with a message naming the tensor or key")


if __name__ == "__main__":
    sys.exit(main())
