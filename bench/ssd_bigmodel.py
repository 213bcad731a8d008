#!/usr/bin/env python3
"""A synthetic model larger than RAM, fast: repeat the layers of a small
`tiermoe mkmodel` file until it has N layers (blk.i of the copy is blk.(i mod
n) of the source), with block_count set to N. mkmodel generates random
weights at tens of MB/s on a small machine; this writes at the disk's speed.
The copy is a plain GGUF of the same architecture (the SSD tier's bench,
docs/ssd.md): the routing of layer i is layer (i mod n)'s.

usage: ssd_bigmodel.py SRC.gguf N_LAYER OUT.gguf
"""
import re
import sys

import gguf


def main():
    src, n_out, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    n_src = r.fields[f"{arch}.block_count"].contents()
    w = gguf.GGUFWriter(out, arch)
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        val = n_out if f.name == f"{arch}.block_count" else f.contents()
        w.add_key_value(f.name, val, vt, sub_type=sub)
    blk = re.compile(r"^blk\.(\d+)\.(.*)$")
    order = []  # (name, tensor)
    for t in r.tensors:
        if not blk.match(t.name):
            order.append((t.name, t))
    for i in range(n_out):
        for t in r.tensors:
            m = blk.match(t.name)
            if m and int(m.group(1)) == i % n_src:
                order.append((f"blk.{i}.{m.group(2)}", t))
    for name, t in order:
        w.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    done = 0
    for i, (name, t) in enumerate(order):
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
        done += t.n_bytes
        if i % 50 == 0:
            print(f"\r{done / 2**30:.1f} GiB", end="", file=sys.stderr, flush=True)
    w.close()
    print(f"\r{out}: {n_out} layers, {done / 2**30:.2f} GiB of tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
