"""Model: a loaded GGUF file (tm_model), its vocabulary and chat template, and the
placement its contexts get unless they say otherwise."""
import ctypes
import os
import weakref
from ctypes import byref, c_bool, c_char_p, c_int32, c_size_t, c_void_p
from dataclasses import dataclass
from typing import Optional

from . import _lib

# The placement options (tm_context_opts' fields, as `tiermoe run`'s flags) a Model
# keeps for its contexts, with their defaults: docs/library.md and docs/placement.md.
PLACEMENT = {
    "n_gpu_layers": 0,        # -ngl: int, "auto" or "all"
    "cpu_moe": False,         # --cpu-moe
    "n_cpu_moe": 0,           # --n-cpu-moe N
    "override_tensor": None,  # -ot PATTERN=CPU|CUDA0[,...]
    "moe_cache": 0,           # --moe-cache: MiB or "auto"
    "moe_cache_plan": None,   # --moe-cache-plan FILE
    "moe_learn": None,        # --moe-learn FILE
    "moe_pcie": "auto",       # --moe-pcie: N, "auto" or "off"
    "moe_fetch": "auto",      # --moe-fetch: "auto", "off", "copy" or "pcie"
    "moe_ahead": "auto",      # --moe-ahead: N, "auto" or "off"
    "ram_cache": 0,           # --ram-cache: MiB or "auto"
    "kv_f32": False,          # --kv-type f32
    "devices": None,          # -dev "CUDA0,CUDA1" or "none" (None: every GPU)
    "split_mode": "layer",    # --split-mode: "layer" or "none"
    "tensor_split": None,     # --tensor-split "A,B"
    "main_gpu": 0,            # -mg N
    "moe_cache_gpus": None,   # --moe-cache "A,B": each GPU's MiB
}


@dataclass(frozen=True)
class TokenInfo:
    """tm_token_info: type is tokenizer.ggml.token_type's value (TOKEN_TYPES names
    them); text the bytes the token stands for, a control token's own text included."""
    type: int
    text: bytes

    @property
    def type_name(self):
        return TOKEN_TYPES.get(self.type, str(self.type))


# tm_token_type's values (llama.cpp's tokenizer.ggml.token_type)
TOKEN_TYPES = {0: "undefined", 1: "normal", 2: "unknown", 3: "control", 4: "user_defined",
               5: "unused", 6: "byte"}


@dataclass(frozen=True)
class VocabInfo:
    """tm_vocab_info."""
    n_tokens: int
    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str    # tokenizer.ggml.pre, or "default"


class Detokenizer(_lib.Handle):
    """A streaming detokenizer (tm_detokenizer): push(id) gives the bytes to print now,
    never ending inside a UTF-8 character; flush() the bytes still held. Made by
    Model.detokenizer(); closed with its model's own lifetime in mind: close it first."""

    def __init__(self, model, render_special=False, replace_invalid=True):
        h = c_void_p()
        _lib.lib().tm_detokenizer_create(model.handle, render_special, replace_invalid, byref(h))
        self._h, self._model = h, model

    def _free(self, h):
        _lib.lib().tm_detokenizer_free(h)

    def _take(self, fn, *args):
        p, n = c_void_p(), c_size_t(0)
        fn(self.handle, *args, byref(p), byref(n))
        return ctypes.string_at(p, n.value) if n.value else b""

    def push(self, token):
        """The bytes token completes (maybe b"")."""
        return self._take(_lib.lib().tm_detokenizer_push, int(token))

    def flush(self):
        """The bytes still held (the end of the text)."""
        return self._take(_lib.lib().tm_detokenizer_flush)


@dataclass(frozen=True)
class ModelInfo:
    """tm_model_info."""
    arch: Optional[str]  # None for a vocab_only model
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_expert: int
    n_expert_used: int
    n_params: int
    weight_bytes: int
    has_vocab: bool
    chat_format: Optional[str]


def _messages(messages):
    """(role, content) pairs from dicts {"role", "content"} or pairs."""
    out = []
    for m in messages:
        role, content = (m["role"], m["content"]) if isinstance(m, dict) else m
        out.append((str(role), str(content)))
    return out


class Model(_lib.Handle):
    """A GGUF model: Model(path, vocab_only=False, **placement). vocab_only: only the
    vocabulary and chat template (tokenizing, templates; no contexts). The placement
    keywords (PLACEMENT:
    n_gpu_layers, cpu_moe, n_cpu_moe, override_tensor, moe_cache, moe_cache_plan,
    moe_learn, moe_pcie, moe_fetch, moe_ahead, ram_cache, kv_f32) mean what the
    `tiermoe run` flags of those names mean; each context made from the model
    takes them unless it overrides them. Closing the model closes its contexts."""

    def __init__(self, path, vocab_only=False, **placement):
        unknown = set(placement) - set(PLACEMENT)
        if unknown:
            raise TypeError(f"Model: unknown placement option(s) {sorted(unknown)}; "
                            f"known: {', '.join(PLACEMENT)}")
        self.placement = {**PLACEMENT, **placement}
        self.path = os.fspath(path)
        self._contexts = weakref.WeakSet()
        lib = _lib.lib()
        h = c_void_p()
        # vocab_only: the vocabulary and chat template alone (tm_model_load_vocab: no
        # weights checked or mapped; a context of it is refused)
        (lib.tm_model_load_vocab if vocab_only else lib.tm_model_load)(os.fsencode(self.path), byref(h))
        self._h = h
        i = _lib.ModelInfoC()
        lib.tm_model_describe(h, byref(i))
        self.info = ModelInfo(
            arch=i.arch.decode() if i.arch else None, n_layer=i.n_layer, n_embd=i.n_embd, n_vocab=i.n_vocab,
            n_ctx_train=i.n_ctx_train, n_expert=i.n_expert, n_expert_used=i.n_expert_used,
            n_params=i.n_params, weight_bytes=i.weight_bytes, has_vocab=bool(i.has_vocab),
            chat_format=i.chat_format.decode() if i.chat_format else None)

    def _free(self, h):
        for c in list(self._contexts):  # a model outlives its contexts
            c.close()
        _lib.lib().tm_model_free(h)

    def __repr__(self):
        state = "closed" if self._h is None else f"{self.info.arch}, {self.info.n_layer} layers"
        return f"Model({self.path!r}, {state})"

    def context(self, **kw):
        """A Context of this model: Context(self, **kw)."""
        from .context import Context
        return Context(self, **kw)

    # ---- text ----

    def tokenize(self, text, add_special=True, parse_special=True):
        """The token ids of text (a list). add_special: BOS/EOS as the vocabulary asks;
        parse_special: control tokens written in the text become their ids (as
        `tiermoe tokenize` and `run -p` do by default)."""
        lib, h = _lib.lib(), self.handle
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids, n = _lib.call_sized(
            lambda cap: (c_int32 * cap)(),
            lambda buf, cap, n: lib.tm_tokenize(h, b, len(b), add_special, parse_special, buf, cap, n),
            len(b) + 8)
        return list(ids[:n])

    def detokenize(self, ids, render_special=False):
        """The text of ids (invalid UTF-8 replaced by U+FFFD)."""
        return self.detokenize_bytes(ids, render_special).decode("utf-8", "replace")

    def detokenize_bytes(self, ids, render_special=False):
        """The bytes of ids (as the vocabulary has them; may end inside a character)."""
        lib, h = _lib.lib(), self.handle
        ids = [int(i) for i in ids]
        arr = (c_int32 * len(ids))(*ids)
        buf, n = _lib.call_sized(
            ctypes.create_string_buffer,
            lambda buf, cap, n: lib.tm_detokenize(h, arr, len(ids), render_special, buf, cap, n),
            16 * len(ids) + 64)
        return buf.raw[:n]

    def token_piece(self, token):
        """The bytes one token stands for (control tokens: b"")."""
        p, n = c_void_p(), c_size_t(0)
        _lib.lib().tm_token_piece(self.handle, token, byref(p), byref(n))
        return ctypes.string_at(p, n.value) if n.value else b""

    def token_info(self, token):
        """A token's type and bytes (TokenInfo; tm_token_describe)."""
        i = _lib.TokenInfoC()
        _lib.lib().tm_token_describe(self.handle, int(token), byref(i))
        return TokenInfo(type=i.type, text=ctypes.string_at(i.text, i.len) if i.len else b"")

    def vocab_info(self):
        """The vocabulary's size and kind (VocabInfo; tm_vocab_describe)."""
        v = _lib.VocabInfoC()
        _lib.lib().tm_vocab_describe(self.handle, byref(v))
        return VocabInfo(n_tokens=v.n_tokens, model=v.model.decode(), pre=v.pre.decode())

    def detokenizer(self, render_special=False, replace_invalid=True):
        """A streaming Detokenizer of this model's vocabulary."""
        return Detokenizer(self, render_special, replace_invalid)

    def chat_reply(self, reply, template=None):
        """What of a generated reply goes back into the conversation as the assistant's
        content (tm_chat_reply): harmony's final channel only, the end-of-turn token
        written as text cut. reply: str or bytes; returns the same type."""
        b = reply.encode("utf-8") if isinstance(reply, str) else bytes(reply)
        start, n = c_size_t(0), c_size_t(0)
        fmt = c_char_p(template.encode() if template else None)
        _lib.lib().tm_chat_reply(self.handle, fmt, b, len(b), byref(start), byref(n))
        out = b[start.value:start.value + n.value]
        return out.decode("utf-8", "replace") if isinstance(reply, str) else out

    def is_end(self, token):
        """Whether token ends a generated turn (eos, eot, <|im_end|>, ...)."""
        end = c_bool(False)
        _lib.lib().tm_token_is_end(self.handle, token, byref(end))
        return end.value

    def apply_chat_template(self, messages, add_generation_prompt=True, template=None):
        """The conversation rendered by the model's chat template (template None) or a
        named one ("chatml", "qwen3", "llama3", "mistral", "harmony", "gemma4"). messages: dicts
        {"role": ..., "content": ...} or (role, content) pairs. Tokenize the result
        with add_special and parse_special (the defaults)."""
        lib, h = _lib.lib(), self.handle
        pairs = [(r.encode("utf-8"), c.encode("utf-8")) for r, c in _messages(messages)]
        arr = (_lib.ChatMessageC * len(pairs))(*[_lib.ChatMessageC(r, c) for r, c in pairs])
        fmt = c_char_p(template.encode() if template else None)
        buf, n = _lib.call_sized(
            ctypes.create_string_buffer,
            lambda buf, cap, n: lib.tm_chat_apply(h, fmt, arr, len(pairs), add_generation_prompt, buf,
                                                  cap, n),
            sum(len(r) + len(c) for r, c in pairs) + 1024)
        return buf.raw[:n].decode("utf-8", "replace")
