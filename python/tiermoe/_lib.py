"""libtiermoe through ctypes: the library loaded once (on first use), the header's
structs and prototypes (include/tiermoe.h, ABI 0.1), and TiermoeError for a
failed call. Every function that returns tm_status raises TiermoeError with the
status and the library's message (tm_error_message) instead."""
import ctypes
import enum
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_double, c_float, c_int, c_int32,
                    c_int64, c_size_t, c_uint32, c_uint64, c_void_p)

from . import _find

ABI = (0, 1)  # the header's TIERMOE_VERSION_MAJOR.MINOR these bindings follow


class Status(enum.IntEnum):
    """tm_status."""
    OK = 0
    ARG = 1
    IO = 2
    FORMAT = 3
    UNSUPPORTED = 4
    NOMEM = 5
    DEVICE = 6


class LogLevel(enum.IntEnum):
    """tm_log_level."""
    ERROR = 0
    WARN = 1
    INFO = 2
    DEBUG = 3


class TiermoeError(Exception):
    """A libtiermoe call failed: status (Status) and the library's message."""

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        super().__init__(f"{message} ({_lib.tm_status_name(status).decode() if _lib else status})")


# ---- the header's structs (field for field; later library versions add at the end) ----

class ModelInfoC(Structure):
    _fields_ = [("arch", c_char_p), ("n_layer", c_uint32), ("n_embd", c_uint32), ("n_vocab", c_uint32),
                ("n_ctx_train", c_uint32), ("n_expert", c_uint32), ("n_expert_used", c_uint32),
                ("n_params", c_uint64), ("weight_bytes", c_uint64), ("has_vocab", c_bool),
                ("chat_format", c_char_p), ("name", c_char_p), ("path", c_char_p)]


class ChatMessageC(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class ChatParamsC(Structure):
    _fields_ = [("add_generation_prompt", c_bool), ("disable_thinking", c_bool)]


class ContextOptsC(Structure):
    _fields_ = [("n_ctx", c_int64), ("n_seq", c_int32), ("n_batch", c_int64), ("n_threads", c_int32),
                ("kv_f32", c_bool), ("n_gpu_layers", c_int32), ("cpu_moe", c_bool), ("n_cpu_moe", c_int32),
                ("override_tensor", c_char_p), ("moe_cache_mib", c_int64), ("moe_cache_plan", c_char_p),
                ("moe_learn", c_char_p), ("moe_pcie", c_int32), ("moe_fetch", c_int32),
                ("moe_ahead", c_int32), ("ram_cache_mib", c_int64), ("expert_stats", c_bool),
                ("profile", c_bool), ("moe_cache_weighting", c_char_p), ("moe_cache_curve", c_double),
                ("moe_cache_update", c_int32), ("moe_cache_policy", c_char_p),
                ("moe_cache_admit", c_int32), ("expert_trace_names", c_bool), ("devices", c_char_p),
                ("split_mode", c_int32), ("tensor_split", c_char_p), ("main_gpu", c_int32),
                ("moe_cache_gpus", c_char_p)]


class TokenInfoC(Structure):
    _fields_ = [("type", c_int), ("text", c_void_p), ("len", c_size_t)]


class VocabInfoC(Structure):
    _fields_ = [("n_tokens", c_uint32), ("model", c_char_p), ("pre", c_char_p)]


class ContextInfoC(Structure):
    _fields_ = [("n_ctx", c_int64), ("n_seq", c_int32), ("n_batch", c_int64), ("n_gpu_layers", c_int32),
                ("cache", c_bool)]


class SamplerParamsC(Structure):
    _fields_ = [("temp", c_float), ("top_k", c_int32), ("top_p", c_float), ("min_p", c_float),
                ("repeat_penalty", c_float), ("repeat_last_n", c_int32), ("seed", c_uint64)]


TM_AUTO = -1
TM_OFF = -2
TM_FETCH_COPY = 1
TM_FETCH_PCIE = 2
TM_SPLIT_LAYER = 0
TM_SPLIT_NONE = 1

LOG_FN = CFUNCTYPE(None, c_int, c_char_p, c_void_p)
_p = POINTER
_h = c_void_p  # every handle
_S = "status"  # returns tm_status: checked
PROTOTYPES = {
    "tm_version": (c_char_p, []),
    "tm_status_name": (c_char_p, [c_int]),
    "tm_error_message": (c_char_p, []),
    "tm_log_set_callback": (None, [LOG_FN, c_void_p]),
    "tm_model_load": (_S, [c_char_p, _p(_h)]),
    "tm_model_load_vocab": (_S, [c_char_p, _p(_h)]),
    "tm_model_free": (None, [_h]),
    "tm_model_describe": (_S, [_h, _p(ModelInfoC)]),
    "tm_tokenize": (_S, [_h, c_char_p, c_size_t, c_bool, c_bool, _p(c_int32), c_size_t, _p(c_size_t)]),
    "tm_detokenize": (_S, [_h, _p(c_int32), c_size_t, c_bool, c_void_p, c_size_t, _p(c_size_t)]),
    "tm_token_piece": (_S, [_h, c_int32, _p(c_void_p), _p(c_size_t)]),
    "tm_token_is_end": (_S, [_h, c_int32, _p(c_bool)]),
    "tm_token_describe": (_S, [_h, c_int32, _p(TokenInfoC)]),
    "tm_vocab_describe": (_S, [_h, _p(VocabInfoC)]),
    "tm_detokenizer_create": (_S, [_h, c_bool, c_bool, _p(_h)]),
    "tm_detokenizer_push": (_S, [_h, c_int32, _p(c_void_p), _p(c_size_t)]),
    "tm_detokenizer_flush": (_S, [_h, _p(c_void_p), _p(c_size_t)]),
    "tm_detokenizer_free": (None, [_h]),
    "tm_chat_apply": (_S, [_h, c_char_p, _p(ChatMessageC), c_size_t, c_bool, c_void_p, c_size_t,
                           _p(c_size_t)]),
    "tm_chat_format_check": (_S, [c_char_p]),
    "tm_chat_render": (_S, [_h, c_char_p, _p(ChatMessageC), c_size_t, _p(ChatParamsC), c_void_p,
                            c_size_t, _p(c_size_t)]),
    "tm_chat_reply": (_S, [_h, c_char_p, c_char_p, c_size_t, _p(c_size_t), _p(c_size_t)]),
    "tm_context_opts_init": (None, [_p(ContextOptsC)]),
    "tm_context_opts_check": (_S, [_p(ContextOptsC)]),
    "tm_context_create": (_S, [_h, _p(ContextOptsC), _p(_h)]),
    "tm_context_free": (None, [_h]),
    "tm_context_describe": (_S, [_h, _p(ContextInfoC)]),
    "tm_context_profile": (_S, [_h, c_void_p, c_size_t, _p(c_size_t)]),
    "tm_eval": (_S, [_h, c_int32, _p(c_int32), c_int64]),
    "tm_eval_rows": (_S, [_h, c_int64, _p(c_int32), _p(c_int32)]),
    "tm_eval_batch": (_S, [_h, c_int64, _p(c_int32), _p(c_int32)]),
    "tm_logits": (_S, [_h, c_int32, _p(_p(c_float))]),
    "tm_seq_length": (_S, [_h, c_int32, _p(c_int64)]),
    "tm_seq_rewind": (_S, [_h, c_int32, c_int64, _p(c_int64)]),
    "tm_seq_shared": (_S, [_h, c_int32, _p(c_int32), c_int64, _p(c_int64)]),
    "tm_seq_prompt": (_S, [_h, c_int32, _p(c_int32), c_int64, _p(c_int64)]),
    "tm_seq_tokens": (_S, [_h, c_int32, _p(_p(c_int32)), _p(c_int64)]),
    "tm_sampler_params_init": (None, [_p(SamplerParamsC)]),
    "tm_sampler_create": (_S, [_h, _p(SamplerParamsC), _p(_h)]),
    "tm_sampler_free": (None, [_h]),
    "tm_sample": (_S, [_h, _h, c_int32, _p(c_int32)]),
    "tm_sampler_sample": (_S, [_h, _p(c_float), _p(c_int32), c_size_t, _p(c_int32)]),
    "tm_expert_counts": (_S, [_h, c_uint32, _p(c_uint64), c_size_t]),
    "tm_expert_counts_reset": (_S, [_h]),
    "tm_expert_stats_summary": (_S, [_h, c_bool, c_void_p, c_size_t, _p(c_size_t)]),
    "tm_expert_stats_write": (_S, [_h, c_char_p]),
    "tm_cache_experts": (_S, [_h, c_uint32, _p(c_int32), c_size_t, _p(c_size_t)]),
    "tm_cache_apply": (_S, [_h, c_char_p, c_size_t, _p(c_int32)]),
    "tm_cache_update": (_S, [_h]),
    "tm_cache_plan": (_S, [_h, c_char_p, c_size_t, c_char_p, c_void_p, c_size_t, _p(c_size_t)]),
    "tm_expert_stats_json": (_S, [_h, c_void_p, c_size_t, _p(c_size_t)]),
    "tm_context_counters": (_S, [_h, c_void_p]),  # a tm_counters (not wrapped yet)
    "tm_context_gpus": (_S, [_h, c_void_p, c_size_t, _p(c_size_t)]),  # not wrapped yet
    "tm_layer_gpu": (_S, [_h, c_uint32, _p(c_int32)]),
}

_lock = threading.Lock()
_lib = None
_origin = None


def _errcheck(status, fn, args):
    if status != Status.OK:
        raise TiermoeError(status, _lib.tm_error_message().decode("utf-8", "replace"))
    return status


def _bind(lib):
    for name, (res, args) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        if res == _S:
            fn.restype = c_int
            fn.errcheck = _errcheck
        else:
            fn.restype = res


def _open(path, origin):
    """The library at path, or None with why it was passed over."""
    explicit = origin == "TIERMOE_LIB"
    if os.path.sep in path and not os.path.exists(path):
        if explicit:
            raise OSError(f"TIERMOE_LIB: {path} does not exist")
        return None, f"{path}: not there"
    if os.path.sep in path and _find.needs_asan(path) and not _find.asan_loaded():
        why = (f"{path} is built with AddressSanitizer: run Python with its runtime first, "
               f"LD_PRELOAD=$(cc -print-file-name=libasan.so)")
        if explicit:
            raise OSError(why)
        return None, why
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        if explicit:
            raise
        return None, f"{path}: {e}"
    lib.tm_version.restype = c_char_p
    ver = lib.tm_version().decode()
    if tuple(int(x) for x in ver.split(".")[:2]) != ABI:
        why = f"{path} is libtiermoe {ver}; this package is for {ABI[0]}.{ABI[1]}"
        if explicit:
            raise OSError(why)
        return None, why
    return lib, None


def lib():
    """The loaded library (loading it on the first call); OSError when none is found."""
    global _lib, _origin
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        pkg = os.path.dirname(os.path.abspath(__file__))
        passed = []
        for path, origin in _find.candidates(pkg):
            found, why = _open(path, origin)
            if found is None:
                passed.append(why)
                continue
            _bind(found)
            _lib, _origin = found, (getattr(found, "_name", path), origin)
            return _lib
        tried = "".join(f"\n  {w}" for w in passed if "not there" not in w)
        raise OSError(f"libtiermoe.so not found (TIERMOE_LIB, beside the package, the checkout's "
                      f"build/{{release,dev,debug,asan}}, the system).{tried}\nBuild it: "
                      f"{_find.build_hint(_find.repo_root(pkg))}\nor set TIERMOE_LIB=/path/to/libtiermoe.so")


def library_path():
    """(path, where it was found) of the loaded library, loading it if needed."""
    lib()
    return _origin


def version():
    """The loaded library's version ("0.1.0")."""
    return lib().tm_version().decode()


def call_sized(make, call, guess):
    """The header's size rule: call(buf, cap, n_ref) into make(guess); when the library
    says the buffer is too small (TM_ERR_ARG with the size written), again with that
    size. Returns (buf, n)."""
    unset = c_size_t(-1).value
    n = c_size_t(unset)
    buf = make(guess)
    try:
        call(buf, guess, ctypes.byref(n))
        return buf, n.value
    except TiermoeError as e:  # another bad argument leaves n as it was
        if e.status != Status.ARG or n.value == unset or n.value < guess:
            raise
    need = n.value + 1  # text wants its NUL; ids get one spare
    buf = make(need)
    call(buf, need, ctypes.byref(n))
    return buf, n.value


class Handle:
    """A library object (_h) freed by close() (idempotent; also on leaving a with block
    and on garbage collection); used after close, ValueError instead of a crash."""
    _h = None

    def _free(self, h):
        raise NotImplementedError

    @property
    def handle(self):
        """The C pointer (ValueError once closed)."""
        if self._h is None:
            raise ValueError(f"the {type(self).__name__} is closed")
        return self._h

    def close(self):
        """Free the C object (idempotent)."""
        if self._h is not None:
            h, self._h = self._h, None
            self._free(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


_log_fn = None  # the ctypes callback must outlive its use by the library


def set_log_callback(fn):
    """Send the library's log lines to fn(level: LogLevel, text: str); None: stderr (the
    default). fn may be called from the library's threads; TIERMOE_LOG sets the level."""
    global _log_fn
    if fn is None:
        lib().tm_log_set_callback(LOG_FN(), None)  # a NULL function pointer
        _log_fn = None
        return

    def tramp(level, text, user):
        fn(LogLevel(level), text.decode("utf-8", "replace"))
    _log_fn = LOG_FN(tramp)
    lib().tm_log_set_callback(_log_fn, None)
