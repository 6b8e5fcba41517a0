"""Which backend runs a model: llama.cpp for GGUF files and model names, ONNX Runtime for exported directories."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import InvalidParameterError
from .llama_backend import ContextOptions, LlamaModel
from .models import resolve
from .onnx_backend import OnnxModel, OnnxOptions, is_onnx_model

BACKENDS = ("auto", "llamacpp", "onnx")


@dataclass(frozen=True)
class ModelOptions:
    """Load options shared by both backends (``layer_skip`` only means something to ONNX models)."""

    n_ctx: int = 4096
    n_threads: int | None = None
    device: str = "cpu"
    exact_numerics: bool = True
    layer_skip: Sequence[int] | None = None


def open_model(model: str | os.PathLike[str], backend: str = "auto",
               options: ModelOptions | None = None) -> LlamaModel | OnnxModel:
    if backend not in BACKENDS:
        raise InvalidParameterError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    o = options or ModelOptions()
    if backend == "onnx" or (backend == "auto" and is_onnx_model(model)):
        # Exact numerics are built into the exported graphs (docs/onnx-format.md): nothing to switch here.
        return OnnxModel(model, OnnxOptions(n_ctx=o.n_ctx, n_threads=o.n_threads, device=o.device,
                                            layer_skip=o.layer_skip))
    if o.layer_skip is not None:
        raise InvalidParameterError("layer_skip needs an ONNX model: llama.cpp cannot skip layers")
    return LlamaModel(resolve(model), ContextOptions(n_ctx=o.n_ctx, n_threads=o.n_threads, device=o.device,
                                                    exact_numerics=o.exact_numerics))
