#!/usr/bin/env python3
"""Make the llama.cpp interop goldens in tests/data/llamacpp/ (issue 33).

Two directions, both on tiny qwen3moe models (n_embd 256 so every 256-block
type fits, 2 layers, 4 experts of which 2 are used, 256 tokens):

1. llama.cpp -> tiermoe: an all-F16 mkmodel file, as users have a model before
   they quantize it, goes through llama.cpp's llama-quantize with one type per
   tensor (--tensor-type), so that two files carry all 16 low-bit types
   (lq-a: the i-quants that need an importance matrix on the experts; lq-b: the
   K- and ternary types on the experts, the legacy types on attention). The
   importance matrix is uniform (every column weight 1), written here in
   llama.cpp's imatrix GGUF layout: the files are test data, not a quality claim.
   Committed: the quantized files.
2. mkmodel -> llama.cpp: for each low-bit type one mkmodel file with every
   matrix (experts, attention, embedding, output) in that type. Not committed
   (mkmodel makes the same bytes from the same flags): its sha256 is recorded.

For every file llama.cpp's CPU backend (through its C API, via the ctypes
binding of the same source package) evaluates the prompt, then decodes
greedily; its logits at every position (f16) and its greedy tokens are the
goldens (llamacpp_logits.npz, manifest.json). tests/oracle/test_llamacpp_interop.py
compares tiermoe with them.

usage: scripts/make_llamacpp_goldens.py --llama-build DIR --llama-src DIR
           [--tiermoe build/asan/tiermoe] [--out tests/data/llamacpp]
  --llama-build  llama.cpp's CMake build folder (bin/llama-quantize, bin/libllama.so)
  --llama-src    the unpacked llama-cpp-python source package (its llama_cpp/ binding)

How the llama.cpp used for the committed goldens was built (CPU only):
  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
  tar xzf llama_cpp_python-0.3.36.tar.gz
  cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \\
        -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_OPENMP=OFF
  cmake --build build --target llama-quantize
"""
import argparse
import ctypes
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np
import gguf

# the model shape of every file here (mkmodel flags on top of --preset tiny)
SHAPE = ["--n-layer", "2", "--n-expert", "4", "--n-expert-used", "2", "--n-vocab", "256", "--seed", "11"]
F16_ALL = ["--type-experts", "f16", "--type-attn", "f16", "--type-embd", "f16", "--type-output", "f16"]

LOWBIT = ["q2_K", "q3_K", "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs", "iq3_xxs", "iq3_s",
          "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m", "tq1_0", "tq2_0"]

# llama-quantize files: tensor -> type (every 2-D tensor; norms and routers stay f32)
QUANT_FILES = {
    "lq-a": {
        "blk.0.ffn_gate_exps": "iq2_xxs", "blk.0.ffn_up_exps": "iq2_xs", "blk.0.ffn_down_exps": "iq1_s",
        "blk.1.ffn_gate_exps": "iq1_m", "blk.1.ffn_up_exps": "iq2_s", "blk.1.ffn_down_exps": "iq3_xxs",
        "blk.0.attn_q": "iq3_s", "blk.0.attn_k": "iq4_xs", "blk.0.attn_v": "iq4_nl", "blk.0.attn_output": "q2_K",
        "blk.1.attn_q": "q3_K", "blk.1.attn_k": "q5_1", "blk.1.attn_v": "q5_0", "blk.1.attn_output": "q4_1",
        "token_embd": "q4_1", "output": "q5_0",
    },
    "lq-b": {
        "blk.0.ffn_gate_exps": "q2_K", "blk.0.ffn_up_exps": "q3_K", "blk.0.ffn_down_exps": "iq3_s",
        "blk.1.ffn_gate_exps": "iq4_xs", "blk.1.ffn_up_exps": "tq1_0", "blk.1.ffn_down_exps": "tq2_0",
        "blk.0.attn_q": "q4_1", "blk.0.attn_k": "q5_0", "blk.0.attn_v": "q5_1", "blk.0.attn_output": "iq4_nl",
        "blk.1.attn_q": "iq2_xxs", "blk.1.attn_k": "iq1_m", "blk.1.attn_v": "iq2_s", "blk.1.attn_output": "iq1_s",
        "token_embd": "q5_1", "output": "iq4_nl",
    },
}

N_PROMPT = 10
N_GEN = 6
PROMPT = np.random.default_rng(33).integers(0, 256, N_PROMPT).tolist()


def sh(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_imatrix(model_path, out_path):
    """A uniform importance matrix for every matrix a token's forward multiplies by."""
    r = gguf.GGUFReader(model_path)
    w = gguf.GGUFWriter(out_path, arch="imatrix")
    w.add_array("imatrix.datasets", ["uniform"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 1)
    for t in r.tensors:
        if len(t.shape) < 2 or t.name.startswith("token_embd") or "ffn_gate_inp" in t.name:
            continue
        ne0 = int(t.shape[0])
        n_mat = int(t.shape[2]) if len(t.shape) > 2 else 1
        w.add_tensor(t.name + ".in_sum2", np.ones((n_mat, ne0), dtype=np.float32))
        w.add_tensor(t.name + ".counts", np.ones((n_mat, 1), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_binding(llama_src, llama_build):
    """llama.cpp's C API through the ctypes module of llama-cpp-python, without
    its package __init__ (which wants the high-level API's extra dependencies)."""
    os.environ["LLAMA_CPP_LIB_PATH"] = os.path.join(llama_build, "bin")
    pkg = types.ModuleType("llama_cpp")
    pkg.__path__ = [os.path.join(llama_src, "llama_cpp")]
    sys.modules["llama_cpp"] = pkg
    return importlib.import_module("llama_cpp.llama_cpp")


class LlamaRun:
    def __init__(self, L):
        self.L = L
        L.llama_backend_init()
        self._quiet = L.llama_log_callback(lambda level, text, user: None)  # kept alive here
        L.llama_log_set(self._quiet, ctypes.c_void_p())

    def logits(self, path, prompt, n_gen):
        """Prompt in one batch (logits at every position), then n_gen greedy steps;
        (tokens [n_prompt + n_gen], logits [n_prompt + n_gen - 1 + 1, n_vocab])."""
        L = self.L
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            raise SystemExit(f"llama.cpp could not load {path}")
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
        cp.n_threads = cp.n_threads_batch = 2
        ctx = L.llama_init_from_model(model, cp)
        toks, rows = list(prompt), []
        batch = L.llama_batch_init(len(prompt), 0, 1)
        for i, t in enumerate(prompt):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, 1
        batch.n_tokens = len(prompt)
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit(f"llama_decode failed on {path}")
        for i in range(len(prompt)):
            rows.append(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), (n_vocab,)).copy())
        for _ in range(n_gen):
            nxt = int(np.argmax(rows[-1]))
            batch.token[0], batch.pos[0], batch.n_seq_id[0] = nxt, len(toks), 1
            batch.seq_id[0][0], batch.logits[0] = 0, 1
            batch.n_tokens = 1
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit(f"llama_decode failed on {path}")
            toks.append(nxt)
            rows.append(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), (n_vocab,)).copy())
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
        return np.array(toks, dtype=np.int32), np.stack(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-build", required=True)
    ap.add_argument("--llama-src", required=True)
    ap.add_argument("--tiermoe", default="build/asan/tiermoe")
    ap.add_argument("--out", default="tests/data/llamacpp")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    quantize = os.path.join(a.llama_build, "bin", "llama-quantize")
    run = LlamaRun(load_binding(a.llama_src, a.llama_build))
    vendor = os.path.join(a.llama_src, "vendor", "llama.cpp")
    commit = subprocess.run(["git", "-C", vendor, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    manifest = {"llama_cpp": {"source": "llama-cpp-python 0.3.36 (PyPI source package), vendor/llama.cpp",
                              "commit": commit, "backend": "CPU (GGML_NATIVE, AVX-512), 2 threads, f16 KV"},
                "shape_flags": SHAPE, "prompt": PROMPT, "n_gen": N_GEN, "quantized": {}, "mkmodel": {}}
    arrays = {}

    # 1. llama.cpp quantizes an F16 model
    src = os.path.join(tmp, "src-f16.gguf")
    sh([a.tiermoe, "mkmodel", "-q", "-o", src, *SHAPE, *F16_ALL])
    imat = os.path.join(tmp, "uniform.imatrix.gguf")
    write_imatrix(src, imat)
    for name, plan in QUANT_FILES.items():
        out = os.path.join(a.out, name + ".gguf")
        cmd = [quantize, "--imatrix", imat]
        for t, ty in plan.items():
            cmd += ["--tensor-type", f"^{t.replace('.', chr(92) + '.')}\\.weight$={ty}"]
        # the base type only decides what no rule names (nothing 2-D here)
        sh(cmd + [src, out, "Q8_0", "2"], stdout=subprocess.DEVNULL)
        got = {t.name[:-len(".weight")]: t.tensor_type.name.lower()
               for t in gguf.GGUFReader(out).tensors if len(t.shape) >= 2 and "gate_inp" not in t.name}
        wrong = {t: (plan[t], got.get(t)) for t in plan if got.get(t, "").lower() != plan[t].lower()}
        if wrong:
            raise SystemExit(f"{name}: llama-quantize chose other types (wanted, got): {wrong}")
        toks, logits = run.logits(out, PROMPT, N_GEN)
        arrays[name + ".tokens"], arrays[name + ".logits"] = toks, logits.astype(np.float16)
        manifest["quantized"][name] = {"types": plan, "sha256": sha256(out)}

    # 2. llama.cpp reads mkmodel's files of every type
    for ty in LOWBIT:
        flags = [*SHAPE, "--type-experts", ty, "--type-attn", ty, "--type-embd", ty, "--type-output", ty]
        path = os.path.join(tmp, f"mk-{ty}.gguf")
        sh([a.tiermoe, "mkmodel", "-q", "-o", path, *flags])
        toks, logits = run.logits(path, PROMPT, N_GEN)
        arrays[f"mk-{ty}.tokens"], arrays[f"mk-{ty}.logits"] = toks, logits.astype(np.float16)
        manifest["mkmodel"][ty] = {"flags": flags, "sha256": sha256(path)}

    np.savez_compressed(os.path.join(a.out, "llamacpp_logits.npz"), **arrays)
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
