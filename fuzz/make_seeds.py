#!/usr/bin/env python3
"""Write the GGUF fuzzer's seed corpus (each file < 4 KB) with the gguf package.

usage: python3 fuzz/make_seeds.py OUTDIR
Seeds cover every value type, string arrays, nested arrays, custom alignment,
version 2, and tensors of types F32/F16/Q8_0/Q4_K/I32 and one block of each low-bit type."""
import os
import sys

import numpy as np
import gguf
from gguf import GGUFValueType as VT, GGMLQuantizationType as QT


def write(path, fill, alignment=None, version=None):
    w = gguf.GGUFWriter(path, "seed")
    if alignment:
        w.add_custom_alignment(alignment)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version is not None:
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(version.to_bytes(4, "little"))
    assert os.path.getsize(path) < 4096, path


def minimal(w):
    w.add_tensor("t", np.arange(4, dtype=np.float32))


def all_values(w):
    for i, vt in enumerate([VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32,
                            VT.UINT64, VT.INT64]):
        w.add_key_value(f"v.int{i}", 7 if i % 2 == 0 else -7, vt)
    w.add_key_value("v.f32", 1.5, VT.FLOAT32)
    w.add_key_value("v.f64", -2.25, VT.FLOAT64)
    w.add_key_value("v.bool", True, VT.BOOL)
    w.add_key_value("v.str", "héllo", VT.STRING)
    w.add_key_value("v.empty", "", VT.STRING)
    w.add_key_value("a.i32", [1, -2, 3], VT.ARRAY, VT.INT32)
    w.add_key_value("a.f32", [0.5, 2.0], VT.ARRAY, VT.FLOAT32)
    w.add_key_value("a.str", ["a", "", "ünï"], VT.ARRAY, VT.STRING)
    w.add_key_value("a.bool", [True, False], VT.ARRAY, VT.BOOL)
    w.add_key_value("a.nested", [[1, 2], [3]], VT.ARRAY)
    w.add_key_value("a.nested2", [[["x"], ["y", "z"]]], VT.ARRAY)
    w.add_tensor("h", np.ones(8, dtype=np.float16))
    w.add_tensor("q8", np.zeros(34, dtype=np.uint8), raw_dtype=QT.Q8_0)


def aligned(w):
    w.add_tensor("a", np.ones((2, 3), dtype=np.float32))
    w.add_tensor("b", np.arange(5, dtype=np.int32))


def q4k(w):
    w.add_tensor("blk.0.ffn_down_exps.weight", np.full(144, 0x11, dtype=np.uint8),
                 raw_dtype=QT.Q4_K)
    w.add_uint32("general.quantization_version", 2)


def lowbit(w):
    """One block of each low-bit type (issue 33), random bytes: the reader's size
    rules for block sizes 32 and 256 and every type size."""
    rng = np.random.default_rng(33)
    for qt in (QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.IQ4_NL, QT.Q2_K, QT.Q3_K, QT.IQ4_XS, QT.IQ3_XXS,
               QT.IQ3_S, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ1_S, QT.IQ1_M, QT.TQ1_0, QT.TQ2_0):
        _, type_size = gguf.GGML_QUANT_SIZES[qt]
        w.add_tensor(qt.name.lower(), rng.integers(0, 256, type_size, dtype=np.uint8), raw_dtype=qt)


def kv_only(w):
    w.add_key_value("tokenizer.ggml.tokens", ["<s>", "</s>", "hi"], VT.ARRAY, VT.STRING)
    w.add_key_value("tokenizer.ggml.scores", [0.0, -1.0, -2.0], VT.ARRAY, VT.FLOAT32)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "minimal.gguf"), minimal)
    write(os.path.join(out, "all_values.gguf"), all_values)
    write(os.path.join(out, "align64.gguf"), aligned, alignment=64)
    write(os.path.join(out, "v2.gguf"), minimal, version=2)
    write(os.path.join(out, "q4k.gguf"), q4k)
    write(os.path.join(out, "kv_only.gguf"), kv_only)
    write(os.path.join(out, "lowbit.gguf"), lowbit)


if __name__ == "__main__":
    main()
