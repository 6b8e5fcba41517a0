"""Which backend runs a model. A new backend is a module with ``open_model``, ``claims`` and a ``Backend`` class
(edgespec/backends/base.py) plus one line in ``REGISTRY``; modules are imported only when chosen, so the ONNX path
never loads llama.cpp."""

from __future__ import annotations

import importlib
import os

from ..errors import InvalidParameterError
from .base import Backend, ModelOptions

# name → module. "auto" asks every module but the default whether it ``claims`` the path (an ONNX export
# directory), and falls back to the default (llama.cpp: GGUF files and model names).
REGISTRY = {"llamacpp": "edgespec.backends.llamacpp.model", "onnx": "edgespec.backends.onnx.model"}
DEFAULT = "llamacpp"
BACKENDS = ("auto", *REGISTRY)

__all__ = ["BACKENDS", "REGISTRY", "ModelOptions", "choose", "open_model"]


def choose(model: str | os.PathLike[str], backend: str = "auto") -> str:
    """The registered backend that runs ``model``."""
    if backend not in BACKENDS:
        raise InvalidParameterError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != "auto":
        return backend
    claimed = (name for name, module in REGISTRY.items()
               if name != DEFAULT and importlib.import_module(module).claims(model))
    return next(claimed, DEFAULT)


def open_model(model: str | os.PathLike[str], backend: str = "auto", options: ModelOptions | None = None) -> Backend:
    module = importlib.import_module(REGISTRY[choose(model, backend)])
    return module.open_model(model, options or ModelOptions())
