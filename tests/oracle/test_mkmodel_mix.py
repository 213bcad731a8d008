#!/usr/bin/env python3
"""`tiermoe mkmodel`'s types per tensor, read back with the gguf package.

- Every recipe (`--mix NAME`) on 16 layers (GQA 2; and GQA 4 for the recipes it
  changes): the type of each tensor is the one docs/quant.md's recipe table
  gives (restated here from the table, not from src/model/synth_mix.c), and
  general.file_type is the recipe's llama_ftype. A recipe that names a type
  without a quantizer in this build fails before writing, naming a tensor the
  table gives that type, the type and the recipe (exit 2, no file).
- Precedence: --tensor-type rules (first match wins) over --type-gate/up/down-exps
  over the class flags over the recipe; norms and routers stay f32.
- A file whose down experts are of a type the CPU cannot compute yet is refused
  at load naming the tensor and the type (exit 1); one it can compute runs.
- Bad flags: an unknown recipe, a rule without '=', an unknown type, a pattern
  that does not compile: exit 2 naming the flag.
"""
import os
import re
import subprocess
import sys

try:
    import gguf
except ImportError:
    print("gguf not installed: skipping")
    sys.exit(77)

from oracle_common import TIERMOE, TMP, check, finish  # noqa: E402

N_LAYER = 16


def more(l, n):  # llama.cpp's use_more_bits
    return l < n // 8 or l >= 7 * n // 8 or (l - n // 8) % 3 == 2


# docs/quant.md, "Recipes": (tensor kind, layer, n, gqa) -> type
def recipe(name, kind, l, n, gqa):
    first = max(1, n // 16)
    table = {
        "Q2_K": {"token_embd": "q2_K", "output": "q6_K", "attn_q": "q2_K", "attn_k": "q2_K",
                 "attn_v": "q4_K" if gqa >= 4 else "q3_K", "attn_output": "q3_K",
                 "ffn_gate_exps": "q2_K", "ffn_up_exps": "q2_K", "ffn_down_exps": "q3_K"},
        "Q3_K_M": {"token_embd": "q3_K", "output": "q6_K", "attn_q": "q3_K", "attn_k": "q3_K",
                   "attn_v": "q5_K" if l < 2 else "q4_K", "attn_output": "q4_K",
                   "ffn_gate_exps": "q3_K", "ffn_up_exps": "q3_K",
                   "ffn_down_exps": "q5_K" if l < n // 16 else "q4_K"},
        "Q4_K_M": {"token_embd": "q4_K", "output": "q6_K", "attn_q": "q4_K", "attn_k": "q4_K",
                   "attn_v": "q6_K" if more(l, n) else "q4_K", "attn_output": "q4_K",
                   "ffn_gate_exps": "q4_K", "ffn_up_exps": "q4_K",
                   "ffn_down_exps": "q6_K" if more(l, n) else "q4_K"},
        "IQ4_XS": {"token_embd": "iq4_xs", "output": "q6_K", "attn_q": "iq4_xs", "attn_k": "iq4_xs",
                   "attn_v": "q5_K" if gqa >= 4 else "iq4_xs", "attn_output": "iq4_xs",
                   "ffn_gate_exps": "iq4_xs", "ffn_up_exps": "iq4_xs",
                   "ffn_down_exps": "q5_K" if l < n // 8 else "iq4_xs"},
        "IQ2_XXS": {"token_embd": "q2_K", "output": "q5_K", "attn_q": "iq2_xxs", "attn_k": "iq2_xxs",
                    "attn_v": "q4_K", "attn_output": "iq2_xxs", "ffn_gate_exps": "iq2_xxs",
                    "ffn_up_exps": "iq2_xxs", "ffn_down_exps": "q2_K" if l < n // 8 else "iq2_xxs"},
        "dynamic": {"token_embd": "q6_K", "output": "q6_K", "attn_q": "q8_0", "attn_k": "q8_0",
                    "attn_v": "q8_0", "attn_output": "q8_0",
                    "ffn_gate_exps": "q4_K" if l < first else "iq1_m",
                    "ffn_up_exps": "q4_K" if l < first else "iq1_m",
                    "ffn_down_exps": "q4_K" if l < first else "iq2_xxs"},
    }[name]
    return table.get(kind, "f32")


FTYPE = {"Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "IQ4_XS": 30, "IQ2_XXS": 19, "dynamic": 31}


def mk(tag, *flags):
    path = os.path.join(TMP, f"mix_{tag}.gguf")
    if os.path.exists(path):
        os.remove(path)
    r = subprocess.run([TIERMOE, "mkmodel", "-q", "-t", "2", "-o", path, *flags],
                       capture_output=True, text=True)
    return path, r


def types_of(path):
    rd = gguf.GGUFReader(path)
    ft = rd.fields["general.file_type"].contents()
    return {t.name: t.tensor_type.name.lower() for t in rd.tensors}, ft


def main():
    checked = 0
    for gqa_kv, gqa in ((2, 2), (1, 4)):
        shape = ["--n-layer", str(N_LAYER), "--n-head", "4", "--n-head-kv", str(gqa_kv),
                 "--n-expert", "2", "--n-expert-used", "1", "--n-vocab", "256"]
        for name in FTYPE:
            if gqa == 4 and name not in ("Q2_K", "IQ4_XS"):  # the recipes GQA changes
                continue
            path, r = mk(f"{name}_{gqa}", "--mix", name, *shape)
            want = {}
            for l in range(N_LAYER):
                for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps",
                             "ffn_up_exps", "ffn_down_exps"):
                    want[f"blk.{l}.{kind}.weight"] = recipe(name, kind, l, N_LAYER, gqa)
            want["token_embd.weight"] = recipe(name, "token_embd", 0, N_LAYER, gqa)
            want["output.weight"] = recipe(name, "output", 0, N_LAYER, gqa)
            if r.returncode != 0:
                m = re.search(r"(\S+): type (\S+) \(--mix (\S+)\) has no quantizer", r.stderr)
                check(r.returncode == 2 and m is not None,
                      f"--mix {name}: exit {r.returncode}, message {r.stderr!r}")
                if m:
                    check(want.get(m.group(1)) == m.group(2) and m.group(3) == name,
                          f"--mix {name}: refused {m.group(1)} as {m.group(2)}, the table gives "
                          f"{want.get(m.group(1))}")
                check(not os.path.exists(path), f"--mix {name}: a refused recipe wrote {path}")
                print(f"  --mix {name} (GQA {gqa}): refused: {r.stderr.strip()}")
                continue
            got, ft = types_of(path)
            check(ft == FTYPE[name], f"--mix {name}: general.file_type {ft}, want {FTYPE[name]}")
            for t, ty in got.items():
                w = want.get(t, "f32").lower()
                check(ty == w, f"--mix {name} (GQA {gqa}): {t} is {ty}, the table gives {w}")
                checked += 1
            print(f"  --mix {name} (GQA {gqa}): {len(got)} tensors as the table gives")

    # precedence: rules > projection flags > class flags > recipe
    path, r = mk("prec", "--n-layer", "4", "--mix", "Q4_K_M", "--type-attn", "q8_0",
                 "--tensor-type", r"blk\.1\.ffn_(gate|down)=q5_K", "--tensor-type", r"blk\.1\.=f16",
                 "--type-down-exps", "q8_0", "--type-embd", "q6_K")
    check(r.returncode == 0, f"precedence model: {r.stderr}")
    if r.returncode == 0:
        got, ft = types_of(path)
        want = {"token_embd.weight": "q6_K", "output.weight": "q6_K", "blk.0.attn_v.weight": "q8_0",
                "blk.0.ffn_gate_exps.weight": "q4_K", "blk.0.ffn_down_exps.weight": "q8_0",
                "blk.1.ffn_gate_exps.weight": "q5_K", "blk.1.ffn_down_exps.weight": "q5_K",
                "blk.1.ffn_up_exps.weight": "f16", "blk.1.attn_q.weight": "f16",
                "blk.1.attn_norm.weight": "f32", "blk.1.ffn_gate_inp.weight": "f32",
                "blk.2.ffn_up_exps.weight": "q4_K", "blk.3.attn_output.weight": "q8_0"}
        for t, w in want.items():
            check(got.get(t) == w.lower(), f"precedence: {t} is {got.get(t)}, want {w}")
        check(ft == 15, f"precedence: general.file_type {ft}, want 15")

    # per-projection flags without a recipe; the file type follows --type-experts
    path, r = mk("proj", "--n-layer", "2", "--type-gate-exps", "q8_0", "--type-up-exps", "q5_K",
                 "--type-down-exps", "q6_K", "--type-experts", "q4_0")
    check(r.returncode == 0, f"projection flags: {r.stderr}")
    if r.returncode == 0:
        got, ft = types_of(path)
        for l in range(2):
            for kind, w in (("gate", "q8_0"), ("up", "q5_K"), ("down", "q6_K")):
                t = f"blk.{l}.ffn_{kind}_exps.weight"
                check(got.get(t) == w.lower(), f"projection flags: {t} is {got.get(t)}, want {w}")
        check(ft == 2, f"projection flags: general.file_type {ft}, want 2 (q4_0)")

    # a file of a type the CPU cannot compute yet is refused at load, naming the tensor and the
    # type; one it can compute runs (whichever this build has)
    for ty in ("q2_K", "iq2_xxs", "q4_1"):
        path, r = mk(f"load_{ty}", "--n-layer", "1", "--type-down-exps", ty)
        check(r.returncode == 0, f"--type-down-exps {ty}: {r.stderr}")
        r = subprocess.run([TIERMOE, "run", "-m", path, "--tokens", "1,2", "-n", "1", "-t", "2"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            check("blk.0.ffn_down_exps.weight" in r.stderr and ty in r.stderr
                  and "cannot compute" in r.stderr and r.returncode == 1,
                  f"run on {ty} down experts: exit {r.returncode}, message {r.stderr!r}")
        print(f"  ffn_down_exps in {ty}: " + ("runs" if r.returncode == 0 else r.stderr.strip()))

    # bad flags: exit 2 naming the flag
    for flags, words in ((["--mix", "Q9_K"], ["--mix", "Q9_K", "Q4_K_M"]),
                         (["--tensor-type", "ffn_down"], ["--tensor-type", "PATTERN=TYPE"]),
                         (["--tensor-type", "ffn_down=q9_K"], ["--tensor-type", "q9_K"]),
                         (["--tensor-type", r"blk\.(=q8_0"], ["--tensor-type", "regular expression"]),
                         (["--type-down-exps", "q9_K"], ["--type-down-exps", "q9_K"])):
        _, r = mk("bad", *flags)
        check(r.returncode == 2 and all(w in r.stderr for w in words),
              f"{flags}: exit {r.returncode}, message {r.stderr!r} should name {words}")
    finish(f"mkmodel types per tensor: {checked} recipe tensors as docs/quant.md's tables give")


if __name__ == "__main__":
    main()
