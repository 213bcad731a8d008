#!/usr/bin/env python3
"""Bits per weight and round-trip error of every compute type, for docs/quant.md.

For each type the library can quantize and the gguf package can dequantize
(the list comes from `quant_tool types`, so new types appear by themselves):
N(0, 1) rows of 4096 values go through OUR quantizer (quant_tool quant) and the
PACKAGE's dequantizer (gguf.quants.dequantize); the table gives the relative
RMSE sqrt(mean (x - y)^2 / mean x^2) over all rows. q8_K (activations only) has
no dequantizer in the package and is left out.

    .venv/bin/python scripts/quant_rmse.py [--tool build/rel/tests/quant_tool] [--rows 256]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default=os.path.join(os.environ.get("TM_TOOLS_DIR", "build/tests"),
                                                   "quant_tool"))
    ap.add_argument("--rows", type=int, default=256, help="rows of 4096 values (default 256)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    out = subprocess.run([args.tool, "types"], check=True, capture_output=True, text=True).stdout
    x = np.random.default_rng(args.seed).standard_normal(4096 * args.rows).astype(np.float32)
    x64 = x.astype(np.float64)
    print(f"| type | bits/weight | rel. RMSE on N(0,1) | ({args.rows} rows of 4096, seed {args.seed})")
    print("|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "x.f32"), os.path.join(tmp, "q.bin")
        x.tofile(src)
        for line in out.splitlines():
            tid, name, block, size, compute = line.split()
            if compute != "1" or int(tid) == T.Q8_K:
                continue
            subprocess.run([args.tool, "quant", name, src, dst], check=True)
            y = quants.dequantize(np.fromfile(dst, dtype=np.uint8), T(int(tid)))
            err = x64 - y.astype(np.float64).reshape(-1)
            rel = np.sqrt(np.mean(err ** 2) / np.mean(x64 ** 2))
            print(f"| {name} | {8 * int(size) / int(block):.4g} | {rel:.5f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
