#!/usr/bin/env python3
"""gpt-oss files that must be refused with an error naming the tensor or key.

Each case is the tiny gpt-oss of scripts/make_gptoss_goldens.py (numpy weights,
no torch needed) with one thing wrong: a missing sink tensor, output head or
expert bias, a window key that disagrees with the fixed layer pattern (a
sliding_window_pattern other than 2, a window of 0), experts in a type tiermoe
cannot compute, and, as a control, the unchanged file, which must load and run."""
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("numpy or gguf not installed: skipping")
    sys.exit(77)

from oracle_common import HERE, TMP, TOOLS, check, finish  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import make_gptoss_goldens as mk  # noqa: E402


def forward(path):
    r = subprocess.run([os.path.join(TOOLS, "forward_dump"), path, "--tokens", "1,2,3", "-o",
                        os.path.join(TMP, "bad_out.gguf")], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def case(label, expect, **kw):
    path = os.path.join(TMP, f"bad_{label}.gguf")
    mk.write_model_gguf(path, mk.make_weights(np.random.default_rng(1)), **kw)
    rc, out = forward(path)
    if expect is None:
        check(rc == 0, f"{label}: the valid file failed: {out.strip()[-400:]}")
    else:
        check(rc != 0 and all(e in out for e in expect),
              f"{label}: rc {rc}, expected an error naming {expect}, got: {out.strip()[-400:]}")
    print(f"  {label}: {out.strip().splitlines()[-1] if out.strip() else '(no output)'}")


def main():
    case("valid", None)
    case("no_sinks", ["missing tensor", "blk.1.attn_sinks.weight"], skip=("blk.1.attn_sinks.weight",))
    case("no_output", ["missing tensor", "output.weight"], skip=("output.weight",))
    case("no_expert_bias", ["missing tensor", "blk.3.ffn_down_exps.bias"], skip=("blk.3.ffn_down_exps.bias",))
    case("pattern", ["gpt-oss.attention.sliding_window_pattern", "is 3"],
         extra_kv={"gpt-oss.attention.sliding_window_pattern": ("add_uint32", 3)})
    case("window0", ["gpt-oss.attention.sliding_window", "is 0"], window=0)
    # q4_1 experts were refused before the low-bit types; now they load and run (the
    # refusal of a type without kernels is test_mkmodel_mix's and test_gguf_bad's)
    case("expert_type_q4_1", None, expert_type=gguf.GGMLQuantizationType.Q4_1)
    return finish("bad gpt-oss files are refused with a message naming the tensor or key")


if __name__ == "__main__":
    sys.exit(main())
