"""tiermoe: Mixture-of-Experts GGUF models with experts tiered over VRAM, RAM and SSD,
through libtiermoe's C API (include/tiermoe.h) with ctypes. docs/library.md, "Python".

    with tiermoe.Model("model.gguf", cpu_moe=True, n_gpu_layers="auto") as model:
        ctx = model.context(n_ctx=4096, expert_stats=True)
        for text in ctx.generate("Why is the sky blue?", 64, temp=0):
            print(text, end="", flush=True)
        print(ctx.expert_counts())   # [n_layer, n_expert] selections
"""
from ._lib import LogLevel, Status, TiermoeError, library_path, set_log_callback, version
from .context import Context, ContextInfo, Sampler
from .model import PLACEMENT, TOKEN_TYPES, Detokenizer, Model, ModelInfo, TokenInfo, VocabInfo

__version__ = "0.1.0"
__all__ = ["Model", "ModelInfo", "TokenInfo", "VocabInfo", "Detokenizer", "TOKEN_TYPES", "Context", "ContextInfo", "Sampler", "TiermoeError", "Status", "LogLevel",
           "PLACEMENT", "library_path", "version", "set_log_callback"]
