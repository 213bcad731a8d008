"""Context (tm_context: KV caches, placement, expert tier) and Sampler (tm_sampler):
evaluation, generation, chat, the expert statistics and the VRAM cache's plan."""
import codecs
import ctypes
import json
import os
import pathlib
from ctypes import byref, c_int32, c_int64, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass

import numpy as np

from . import _lib
from .model import PLACEMENT

_SAMPLING = ("temp", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed")


@dataclass(frozen=True)
class ContextInfo:
    """tm_context_info: n_ctx is one sequence's positions; cache: a VRAM expert cache
    exists (apply_plan applies plans)."""
    n_ctx: int
    n_seq: int
    n_batch: int
    n_gpu_layers: int
    cache: bool


def _word(field, v, words):
    """v when it is an int, else the value of the word (ValueError naming field)."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise TypeError(f"{field}: expected an int or one of {', '.join(words)}, got {v!r}")
    if isinstance(v, int):
        return v
    if v not in words:
        raise ValueError(f"{field}: expected an int or one of {', '.join(words)}, got {v!r}")
    return words[v]


def _path(v):
    return None if v is None else os.fsencode(v)


def _opts(model, n_ctx, n_seq, n_batch, threads, expert_stats, profile, p):
    """tm_context_opts from the sizes and the placement p (PLACEMENT's keys). Values
    are passed on as they are: the library checks them and names a bad one."""
    o = _lib.ContextOptsC()
    _lib.lib().tm_context_opts_init(byref(o))
    auto, off = _lib.TM_AUTO, _lib.TM_OFF
    o.n_ctx, o.n_seq, o.n_batch, o.n_threads = n_ctx, n_seq, n_batch, threads
    o.kv_f32 = bool(p["kv_f32"])
    o.n_gpu_layers = _word("n_gpu_layers", p["n_gpu_layers"], {"auto": auto, "all": model.info.n_layer})
    o.cpu_moe = bool(p["cpu_moe"])
    o.n_cpu_moe = p["n_cpu_moe"]
    o.override_tensor = p["override_tensor"].encode() if p["override_tensor"] else None
    o.moe_cache_mib = _word("moe_cache", p["moe_cache"], {"auto": auto})
    o.moe_cache_plan = _path(p["moe_cache_plan"])
    o.moe_learn = _path(p["moe_learn"])
    o.moe_pcie = _word("moe_pcie", p["moe_pcie"], {"auto": auto, "off": off})
    o.moe_fetch = _word("moe_fetch", p["moe_fetch"], {"auto": auto, "off": off, "copy": _lib.TM_FETCH_COPY,
                                                      "pcie": _lib.TM_FETCH_PCIE})
    o.moe_ahead = _word("moe_ahead", p["moe_ahead"], {"auto": auto, "off": off})
    o.ram_cache_mib = _word("ram_cache", p["ram_cache"], {"auto": auto})
    o.devices = p["devices"].encode() if p["devices"] else None
    o.split_mode = _word("split_mode", p["split_mode"], {"layer": _lib.TM_SPLIT_LAYER, "none": _lib.TM_SPLIT_NONE})
    o.tensor_split = p["tensor_split"].encode() if p["tensor_split"] else None
    o.main_gpu = p["main_gpu"]
    o.moe_cache_gpus = p["moe_cache_gpus"].encode() if p["moe_cache_gpus"] else None
    o.expert_stats = bool(expert_stats)
    o.profile = bool(profile)
    return o


class Sampler(_lib.Handle):
    """tm_sampler: Sampler(model, temp=, top_k=, top_p=, min_p=, repeat_penalty=,
    repeat_last_n=, seed=); a parameter left None keeps the library's default (the
    CLI's: temp 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalty, seed 0). temp 0:
    greedy. The same seed and logits give the same tokens."""

    def __init__(self, model, **params):
        unknown = set(params) - set(_SAMPLING)
        if unknown:
            raise TypeError(f"Sampler: unknown parameter(s) {sorted(unknown)}; known: {', '.join(_SAMPLING)}")
        self.model = model
        lib = _lib.lib()
        p = _lib.SamplerParamsC()
        lib.tm_sampler_params_init(byref(p))
        for k, v in params.items():
            if v is not None:
                setattr(p, k, v)
        h = c_void_p()
        lib.tm_sampler_create(model.handle, byref(p), byref(h))
        self._h = h

    def sample(self, ctx, seq=0):
        """The next token of sequence seq from its last logits and its tokens (the
        penalty's history). It is not appended: evaluate it."""
        t = c_int32()
        _lib.lib().tm_sample(self.handle, ctx.handle, seq, byref(t))
        return t.value

    def _free(self, h):
        _lib.lib().tm_sampler_free(h)


class Context(_lib.Handle):
    """A context of model: Context(model, n_ctx=0, n_seq=1, n_batch=0, threads=0,
    seed=0, expert_stats=False, profile=False, **placement). 0 means the library's
    default (n_ctx: min(4096, trained); n_batch 512; threads: the physical cores). seed:
    the sampling seed generate() and chat() use unless given one. expert_stats: count
    each layer's expert selections (expert_counts, expert_summary, write_expert_stats).
    profile: time every part for profile() (`tiermoe run --profile`; on a GPU slower,
    no CUDA graph). placement: the Model's options (PLACEMENT), overriding the model's.
    One thread at a time."""

    def __init__(self, model, n_ctx=0, n_seq=1, n_batch=0, threads=0, seed=0, expert_stats=False,
                 profile=False, **placement):
        unknown = set(placement) - set(PLACEMENT)
        if unknown:
            raise TypeError(f"Context: unknown option(s) {sorted(unknown)}; placement options: "
                            f"{', '.join(PLACEMENT)}")
        self.model = model
        self.seed = seed
        self.stop_reason = None  # why the last generate() ended: "end", "length" or "context"
        o = _opts(model, n_ctx, n_seq, n_batch, threads, expert_stats, profile,
                  {**model.placement, **placement})
        h = c_void_p()
        _lib.lib().tm_context_create(model.handle, byref(o), byref(h))
        self._h = h
        model._contexts.add(self)
        i = _lib.ContextInfoC()
        _lib.lib().tm_context_describe(h, byref(i))
        self.info = ContextInfo(n_ctx=i.n_ctx, n_seq=i.n_seq, n_batch=i.n_batch, n_gpu_layers=i.n_gpu_layers,
                                cache=bool(i.cache))
        self._ids = [[] for _ in range(self.info.n_seq)]  # each sequence's tokens, as the library has them

    def _free(self, h):
        _lib.lib().tm_context_free(h)

    # ---- evaluation ----

    def _resync(self, seqs):
        """After a failed call: keep what the library still holds of each sequence."""
        for s in seqs:
            if 0 <= s < len(self._ids):
                del self._ids[s][self.seq_length(s):]

    def eval(self, tokens, seq=0):
        """Append tokens to sequence seq and evaluate them; logits(seq) is then the last's."""
        tokens = [int(t) for t in tokens]
        arr = (c_int32 * len(tokens))(*tokens)
        try:
            _lib.lib().tm_eval(self.handle, seq, arr, len(tokens))
        except _lib.TiermoeError:
            self._resync([seq])
            raise
        self._ids[seq].extend(tokens)

    def eval_rows(self, seqs, tokens):
        """One step: tokens[i] appended to sequence seqs[i] (distinct sequences)."""
        seqs, tokens = [int(s) for s in seqs], [int(t) for t in tokens]
        if len(seqs) != len(tokens):
            raise ValueError(f"eval_rows: {len(seqs)} sequences, {len(tokens)} tokens")
        n = len(seqs)
        try:
            _lib.lib().tm_eval_rows(self.handle, n, (c_int32 * n)(*seqs), (c_int32 * n)(*tokens))
        except _lib.TiermoeError:
            self._resync(seqs)
            raise
        for s, t in zip(seqs, tokens):
            self._ids[s].append(t)

    def eval_batch(self, seqs, tokens):
        """One prompt step: tokens[i] appended to sequence seqs[i], a sequence's rows
        consecutive; logits(seq) is then each run's last token's."""
        seqs, tokens = [int(s) for s in seqs], [int(t) for t in tokens]
        if len(seqs) != len(tokens):
            raise ValueError(f"eval_batch: {len(seqs)} sequences, {len(tokens)} tokens")
        n = len(seqs)
        try:
            _lib.lib().tm_eval_batch(self.handle, n, (c_int32 * n)(*seqs), (c_int32 * n)(*tokens))
        except _lib.TiermoeError:
            self._resync(seqs)
            raise
        for s, t in zip(seqs, tokens):
            self._ids[s].append(t)

    def logits(self, seq=0):
        """Sequence seq's last token's logits: a float32 array of n_vocab (a copy)."""
        p = ctypes.POINTER(ctypes.c_float)()
        _lib.lib().tm_logits(self.handle, seq, byref(p))
        return np.ctypeslib.as_array(p, shape=(self.model.info.n_vocab,)).copy()

    def seq_length(self, seq=0):
        """How many positions sequence seq holds."""
        n = c_int64()
        _lib.lib().tm_seq_length(self.handle, seq, byref(n))
        return n.value

    def tokens(self, seq=0):
        """The tokens sequence seq holds (a list)."""
        self.seq_length(seq)  # the library checks seq
        return list(self._ids[seq])

    def rewind(self, n_keep, seq=0):
        """Keep the first n_keep positions of sequence seq (0: forget it); returns what
        was kept (0 where the model's state cannot go back)."""
        kept = c_int64()
        _lib.lib().tm_seq_rewind(self.handle, seq, n_keep, byref(kept))
        del self._ids[seq][kept.value:]
        return kept.value

    def feed(self, ids, seq=0):
        """Make sequence seq hold exactly ids, reusing the prefix it already holds (at
        least the last token is evaluated, for its logits); returns how many were
        evaluated."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("feed: no tokens (an empty prompt)")
        n_eval = c_int64()
        try:
            _lib.lib().tm_seq_prompt(self.handle, seq, (c_int32 * len(ids))(*ids), len(ids),
                                     byref(n_eval))
        except _lib.TiermoeError:
            self._resync([seq])
            raise
        self._ids[seq] = ids
        return n_eval.value

    # ---- generation ----

    def generate(self, prompt, n_predict=64, *, seq=0, tokens=False, ignore_eos=False, **sampling):
        """Complete prompt (text, tokenized as `tiermoe run -p` does, or a list of ids):
        sequence seq is made to hold the prompt (its shared prefix is reused), then up to
        n_predict tokens are sampled (sampling: Sampler's parameters; seed defaults to
        the context's). Yields text chunks (whole UTF-8 characters), or the token ids
        with tokens=True. Stops after n_predict tokens, at an end-of-turn token (not
        yielded; ignore_eos: go on) or when the sequence is full; stop_reason says which.
        The last token yielded is not evaluated."""
        ids = self.model.tokenize(prompt) if isinstance(prompt, (str, bytes)) else list(prompt)
        sampling.setdefault("seed", self.seed)
        sampler = Sampler(self.model, **sampling)
        try:
            self.feed(ids, seq)
        except BaseException:
            sampler.close()
            raise
        return self._stream(sampler, seq, n_predict, tokens, ignore_eos)

    def _stream(self, sampler, seq, n_predict, want_ids, ignore_eos):
        m = self.model
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        first = True
        self.stop_reason = "length"
        try:
            for i in range(n_predict):
                t = sampler.sample(self, seq)
                if not ignore_eos and m.info.has_vocab and m.is_end(t):
                    self.stop_reason = "end"
                    break
                if want_ids:
                    yield t
                else:
                    b = m.token_piece(t)
                    if first and b:  # the stream's start as the CLI prints it (SPM: no leading space)
                        b, first = m.detokenize_bytes([t]), False
                    text = dec.decode(b)
                    if text:
                        yield text
                if i + 1 == n_predict:
                    break
                if self.seq_length(seq) >= self.info.n_ctx:
                    self.stop_reason = "context"
                    break
                self.eval([t], seq)
            if not want_ids:
                rest = dec.decode(b"", final=True)
                if rest:
                    yield rest
        finally:
            sampler.close()

    def chat(self, messages, n_predict=256, *, template=None, seq=0, **sampling):
        """The assistant's reply to messages (dicts {"role", "content"} or pairs),
        rendered by the model's chat template (or template), as text chunks; the
        conversation's prefix already in sequence seq is reused. Append the reply to
        messages as {"role": "assistant", ...} for the next turn."""
        text = self.model.apply_chat_template(messages, True, template)
        return self.generate(self.model.tokenize(text), n_predict, seq=seq, **sampling)

    # ---- experts ----

    def expert_counts(self, layer=None):
        """How often each expert was selected since the context was made or the counts
        reset: uint64 array [n_layer, n_expert] (or [n_expert] of one layer). Needs
        expert_stats=True."""
        info = self.model.info
        layers = range(info.n_layer) if layer is None else [layer]
        out = np.zeros((len(layers), info.n_expert), dtype=np.uint64)
        for row, l in enumerate(layers):
            _lib.lib().tm_expert_counts(self.handle, l, out[row].ctypes.data_as(ctypes.POINTER(c_uint64)),
                                        info.n_expert)
        return out if layer is None else out[0]

    def _text(self, call):
        buf, n = _lib.call_sized(ctypes.create_string_buffer, call, 4096)
        return buf.raw[:n].decode()

    def profile(self):
        """Where the time went since the context was made, as `tiermoe run --profile`
        prints it (needs profile=True)."""
        h = self.handle
        return self._text(lambda buf, cap, n: _lib.lib().tm_context_profile(h, buf, cap, n))

    def expert_summary(self, per_layer=False):
        """The expert counts' summary `tiermoe run --expert-trace-stats` prints
        (per_layer: with --expert-trace-per-layer's table). Needs expert_stats=True."""
        h = self.handle
        return self._text(
            lambda buf, cap, n: _lib.lib().tm_expert_stats_summary(h, per_layer, buf, cap, n))

    def write_expert_stats(self, path):
        """Write the expert counts as a learn file (a path ending in .csv: CSV), as
        --expert-trace-output does: the input of `tiermoe plan` and --moe-learn."""
        _lib.lib().tm_expert_stats_write(self.handle, os.fsencode(path))

    def reset_expert_counts(self):
        """Start the expert counts again from 0."""
        _lib.lib().tm_expert_counts_reset(self.handle)

    def cache_experts(self, layer=None):
        """The experts in the VRAM cache's slots, slot by slot (-1: empty): a list of
        int32 arrays, one a layer (empty for a layer without slots), or one layer's."""
        E = self.model.info.n_expert
        layers = range(self.model.info.n_layer) if layer is None else [layer]
        out = []
        for l in layers:
            buf, n = np.full(E, -1, dtype=np.int32), c_size_t()
            _lib.lib().tm_cache_experts(self.handle, l, buf.ctypes.data_as(ctypes.POINTER(c_int32)), E,
                                        byref(n))
            out.append(buf[:n.value].copy())
        return out if layer is None else out[0]

    def apply_plan(self, plan):
        """Put a plan's experts into the VRAM cache (docs/plan-format.md; per layer its
        first experts, as many as the layer has slots): plan is the JSON text (str or
        bytes), its dict, or a pathlib.Path of a plan file. Returns the slots rewritten.
        TiermoeError UNSUPPORTED for a context without a cache (after the plan is
        checked against the model)."""
        if isinstance(plan, pathlib.PurePath):
            plan = pathlib.Path(plan).read_bytes()
        elif isinstance(plan, dict):
            plan = json.dumps(plan)
        b = plan.encode("utf-8") if isinstance(plan, str) else bytes(plan)
        n = c_int32()
        _lib.lib().tm_cache_apply(self.handle, b, len(b), byref(n))
        return n.value
