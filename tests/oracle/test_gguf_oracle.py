#!/usr/bin/env python3
"""Oracle test for tiermoe's GGUF reader and writer against the `gguf` package.

1. gguf.GGUFWriter writes files with every value type, string arrays, nested
   arrays, tensors of types F32/F16/Q8_0/Q4_K/I32 (raw bytes for the quantized
   ones), default and custom alignment, version 3 and (patched) version 2.
   Our gguf_dump reads each one; its view must equal gguf.GGUFReader's view
   exactly: keys, key offsets, value types, values (nested arrays element by
   element), alignment, data offset, tensor names, types, shapes (ne order),
   element and byte counts, absolute offsets and an FNV-1a 64 of the data.
2. Our gguf_copy rewrites each file with our writer. gguf.GGUFReader must see
   in the copy exactly what it saw in the original, and since both writers
   lay files out the same way (kv in order, infos, padding, tensors packed in
   order, each padded) the copy must be byte-identical.

Environment: TM_TOOLS_DIR (gguf_dump, gguf_copy), TM_TEST_TMP (scratch).
Exit 77 when numpy or gguf is not installed."""
import json
import math
import os
import struct
import subprocess
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGUFValueType as VT, GGMLQuantizationType as QT
except ImportError as e:  # the reference is not installed: skip
    print(f"skipped: {e}")
    sys.exit(77)

TOOLS = os.environ.get("TM_TOOLS_DIR", ".")
TMP = os.environ.get("TM_TEST_TMP", "/tmp/tm_gguf_oracle")
PSEUDO_FIELDS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL:", msg)
    return cond


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# ---- files written by the reference ----

def rng_bytes(rng, n):
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def fill_values(w):
    w.add_key_value("s.u8", 255, VT.UINT8)
    w.add_key_value("s.i8", -128, VT.INT8)
    w.add_key_value("s.u16", 65535, VT.UINT16)
    w.add_key_value("s.i16", -32768, VT.INT16)
    w.add_key_value("s.u32", 4294967295, VT.UINT32)
    w.add_key_value("s.i32", -2147483648, VT.INT32)
    w.add_key_value("s.u64", 18446744073709551615, VT.UINT64)
    w.add_key_value("s.i64", -9223372036854775808, VT.INT64)
    w.add_key_value("s.f32", 0.1, VT.FLOAT32)  # not exact in binary: tests round-trip printing
    w.add_key_value("s.f32_neg0", -0.0, VT.FLOAT32)
    w.add_key_value("s.f32_inf", float("inf"), VT.FLOAT32)
    w.add_key_value("s.f32_nan", float("nan"), VT.FLOAT32)
    w.add_key_value("s.f32_tiny", 1e-45, VT.FLOAT32)  # subnormal
    w.add_key_value("s.f64", 1.0 / 3.0, VT.FLOAT64)
    w.add_key_value("s.f64_big", -1.7976931348623157e308, VT.FLOAT64)
    w.add_key_value("s.bool_t", True, VT.BOOL)
    w.add_key_value("s.bool_f", False, VT.BOOL)
    w.add_key_value("s.str", "Grüße, 世界 🙂", VT.STRING)
    w.add_key_value("s.str_empty", "", VT.STRING)
    w.add_key_value("s.str_escapes", 'q"b\\n\nt\tc\x01\x7f', VT.STRING)
    w.add_key_value("a.u8", [0, 1, 255], VT.ARRAY, VT.UINT8)
    w.add_key_value("a.i8", [-128, 0, 127], VT.ARRAY, VT.INT8)
    w.add_key_value("a.u16", [0, 65535], VT.ARRAY, VT.UINT16)
    w.add_key_value("a.i16", [-32768, 32767], VT.ARRAY, VT.INT16)
    w.add_key_value("a.u32", [0, 4294967295, 7], VT.ARRAY, VT.UINT32)
    w.add_key_value("a.i32", [-2147483648, 2147483647], VT.ARRAY, VT.INT32)
    w.add_key_value("a.u64", [18446744073709551615, 0], VT.ARRAY, VT.UINT64)
    w.add_key_value("a.i64", [-9223372036854775808, 9223372036854775807], VT.ARRAY, VT.INT64)
    w.add_key_value("a.f32", [0.1, -2.5, 3.4028234663852886e38], VT.ARRAY, VT.FLOAT32)
    w.add_key_value("a.f64", [0.1, -1e-300], VT.ARRAY, VT.FLOAT64)
    w.add_key_value("a.bool", [True, False, True], VT.ARRAY, VT.BOOL)
    w.add_key_value("a.str", ["<s>", "", "ünïcödé", "a b\nc", "\"q\""], VT.ARRAY, VT.STRING)
    # nested arrays (the package packs a list of lists as an array of arrays)
    w.add_key_value("a.nested_i32", [[1, 2, 3], [4], [5, 6]], VT.ARRAY)
    w.add_key_value("a.nested_str", [["x", "yy"], ["zzz"]], VT.ARRAY)
    w.add_key_value("a.nested3", [[[1.5], [2.5, 3.5]], [[4.5]]], VT.ARRAY)
    # tokenizer-like arrays of realistic size
    w.add_key_value("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)], VT.ARRAY, VT.STRING)
    w.add_key_value("tokenizer.ggml.scores", [float(-i) / 7 for i in range(300)], VT.ARRAY,
                    VT.FLOAT32)


def fill_tensors(w, rng):
    w.add_tensor("f32.2d", rng.standard_normal((3, 64), dtype=np.float32))  # ne = [64, 3]
    w.add_tensor("f32.3d", rng.standard_normal((2, 3, 5), dtype=np.float32))
    w.add_tensor("f16.1d", rng.standard_normal(37).astype(np.float16))
    w.add_tensor("i32.4d", rng.integers(-9, 9, size=(2, 1, 3, 4), dtype=np.int32))
    # quantized types as raw bytes: byte shape (rows, blocks*type_size) -> ne = [blocks*bs, rows]
    w.add_tensor("q8_0.2d", rng_bytes(rng, (4, 2 * 34)), raw_dtype=QT.Q8_0)
    w.add_tensor("q4_k.3d", rng_bytes(rng, (2, 3, 144)), raw_dtype=QT.Q4_K)
    w.add_tensor("blk.0.ffn_gate_exps.weight", rng_bytes(rng, (4, 2, 2 * 144)),
                 raw_dtype=QT.Q4_K)


def write_reference(path, *, alignment=None, values=True, tensors=True, version=None, seed=0):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "oracle")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    if values:
        fill_values(w)
    if tensors:
        fill_tensors(w, rng)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version is not None:  # the package writes v3 only; v2 has the same layout
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(struct.pack("<I", version))


# ---- the reference reader's view ----

def walk_value(parts, i, vtype):
    """Decode one value from GGUFReader field parts starting at parts[i]."""
    vtype = VT(vtype)
    if vtype == VT.STRING:
        return bytes(parts[i + 1]).decode("utf-8"), i + 2
    if vtype == VT.ARRAY:
        etype = VT(int(parts[i][0]))
        n = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            v, i = walk_value(parts, i, etype)
            items.append(v)
        return {"elem_type": etype.name.lower(), "items": items}, i
    x = parts[i][0]
    if vtype == VT.BOOL:
        return bool(x), i + 1
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return float(x), i + 1
    return int(x), i + 1


def reference_view(path):
    r = gguf.GGUFReader(path)
    kvs = []
    for name, field in r.fields.items():
        if name in PSEUDO_FIELDS:
            continue
        vtype = VT(int(field.parts[2][0]))
        value, end = walk_value(field.parts, 3, vtype)
        assert end == len(field.parts), f"{name}: parts not fully consumed"
        kvs.append({"key": name, "offset": int(field.offset), "type": vtype.name.lower(),
                    "value": value})
    tensors = []
    for t in r.tensors:
        data = bytes(np.ascontiguousarray(t.data).view(np.uint8).reshape(-1))
        tensors.append({"name": t.name, "type": int(t.tensor_type),
                        "ne": [int(x) for x in t.shape], "n_elements": int(t.n_elements),
                        "n_bytes": int(t.n_bytes), "file_offset": int(t.data_offset),
                        "fnv1a64": fnv1a64(data), "data": data})
    return {"version": int(r.fields["GGUF.version"].parts[0][0]), "alignment": int(r.alignment),
            "data_offset": int(r.data_offset), "kv": kvs, "tensors": tensors}


# ---- comparison ----

def same_value(a, b):
    """Exact equality; floats compare bit patterns' meaning (NaN == NaN, -0.0 != 0.0)."""
    if isinstance(a, float) or isinstance(b, float):
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
            return False
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def compare_views(label, ours, ref, keys_tensor):
    for k in ("version", "alignment", "data_offset"):
        check(ours[k] == ref[k], f"{label}: {k}: ours {ours[k]} vs reference {ref[k]}")
    check(len(ours["kv"]) == len(ref["kv"]),
          f"{label}: kv count ours {len(ours['kv'])} vs reference {len(ref['kv'])}")
    for a, b in zip(ours["kv"], ref["kv"]):
        for k in ("key", "offset", "type"):
            check(a[k] == b[k], f"{label}: kv {b['key']!r}: {k}: ours {a[k]!r} vs reference {b[k]!r}")
        check(same_value(a["value"], b["value"]),
              f"{label}: kv {b['key']!r}: value: ours {a['value']!r} vs reference {b['value']!r}")
    check(len(ours["tensors"]) == len(ref["tensors"]), f"{label}: tensor count differs")
    for a, b in zip(ours["tensors"], ref["tensors"]):
        for k in keys_tensor:
            check(a[k] == b[k],
                  f"{label}: tensor {b['name']!r}: {k}: ours {a[k]!r} vs reference {b[k]!r}")


def run_tool(name, *args):
    exe = os.path.join(TOOLS, name)
    p = subprocess.run([exe, *args], capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed ({p.returncode}): "
                           f"{p.stderr.decode(errors='replace')}")
    return p.stdout


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # metadata missing: not worth failing over
        return "?"


def our_view(path):
    return json.loads(run_tool("gguf_dump", path).decode("utf-8"))


def main():
    os.makedirs(TMP, exist_ok=True)
    cases = {
        "values_tensors_a32": dict(),
        "values_tensors_a64": dict(alignment=64),
        "tensors_a128": dict(alignment=128, values=False),
        "values_only": dict(tensors=False),
        "v2_a16": dict(alignment=16, version=2, seed=3),
    }
    tensor_keys = ("name", "type", "ne", "n_elements", "n_bytes", "file_offset", "fnv1a64")
    n_checked = 0
    for name, kw in cases.items():
        path = os.path.join(TMP, name + ".gguf")
        write_reference(path, **kw)
        ref = reference_view(path)

        # 1. reference writes, we read
        ours = our_view(path)
        compare_views(f"{name} (our reader)", ours, ref, tensor_keys)
        for t in ours["tensors"]:  # our offset + data offset = absolute offset
            check(t["file_offset"] == ours["data_offset"] + t["offset"],
                  f"{name}: tensor {t['name']}: file_offset != data_offset + offset")

        # 2. we write (copy), reference reads
        copy = os.path.join(TMP, name + ".copy.gguf")
        run_tool("gguf_copy", path, copy)
        check(not os.path.exists(copy + ".tmp"), f"{name}: temporary file left behind")
        ref_copy = reference_view(copy)
        compare_views(f"{name} (reference reader on our copy)", ref_copy, ref,
                      tensor_keys + ("data",))
        with open(path, "rb") as f1, open(copy, "rb") as f2:
            check(f1.read() == f2.read(), f"{name}: our copy is not byte-identical to the original")
        # and our reader on our own copy
        compare_views(f"{name} (our reader on our copy)", our_view(copy), ref, tensor_keys)
        n_checked += 1
        print(f"ok: {name}: {len(ref['kv'])} kv, {len(ref['tensors'])} tensors")

    if FAILURES:
        print(f"{len(FAILURES)} mismatches")
        return 1
    print(f"all {n_checked} files agree with gguf {gguf_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
