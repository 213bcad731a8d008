#!/usr/bin/env python3
"""Turn a src/cuda/*.cu file into host C++ for scripts/cuda_emu_check.sh:
every launch `kernel<<<grid, block[, smem[, stream]]>>>(args)` becomes
`emu_launch([&] { kernel(args); }, grid, block[, smem[, stream]])` (the
kernel run on an emulated grid, tests/emu/cuda_warp_shim.h), and dynamic
shared memory `extern __shared__ T name[];` the launch's buffer. Everything
else, the launchers' host code included, stays as written.
    cuda_emu_extract.py FILE.cu > FILE.cpp"""
import re
import sys


def skip_back(s, i):
    """Index of the last character before i that is not blank or a line continuation."""
    while i >= 0 and (s[i].isspace() or s[i] == "\\"):
        i -= 1
    return i


def kernel_start(s, i):
    """Start of the kernel expression `name` or `name<...>` ending at s[i]."""
    if s[i] == ">":
        depth = 0
        while True:
            depth += {">": 1, "<": -1}.get(s[i], 0)
            if depth == 0:
                break
            i -= 1
        i = skip_back(s, i - 1)
    j = i
    while j >= 0 and (s[j].isalnum() or s[j] == "_"):
        j -= 1
    if j == i:
        sys.exit(f"cuda_emu_extract: no kernel name before <<< at offset {i}")
    return j + 1


def matching_paren(s, i):
    depth = 0
    for j in range(i, len(s)):
        depth += {"(": 1, ")": -1}.get(s[j], 0)
        if depth == 0:
            return j
    sys.exit(f"cuda_emu_extract: unbalanced launch arguments at offset {i}")


def extract(s):
    s = re.sub(r"extern\s+__shared__\s+([\w:<> ]+?)\s+(\w+)\s*\[\s*\]\s*;",
               r"\1 *\2 = (\1 *)g_dyn_smem;", s)
    out, pos = [], 0
    while True:
        at = s.find("<<<", pos)
        if at < 0:
            break
        k0 = kernel_start(s, skip_back(s, at - 1))
        end = s.index(">>>", at)
        cfg = s[at + 3:end]
        p = end + 3
        while s[p].isspace() or s[p] == "\\":
            p += 1
        if s[p] != "(":
            sys.exit(f"cuda_emu_extract: no arguments after >>> at offset {p}")
        q = matching_paren(s, p)
        kernel = s[k0:skip_back(s, at - 1) + 1]
        out.append(s[pos:k0])
        out.append(f"emu_launch([&] {{ {kernel}{s[p:q + 1]}; }}, {cfg})")
        pos = q + 1
    out.append(s[pos:])
    return "".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(f'#line 1 "{sys.argv[1]}"\n' + extract(f.read()))
