"""The export step: turns a model the user has (a GGUF file, a local Hugging Face folder, or a model name
from ``models/``) into every artefact the runtime can use — re-quantized GGUF, layer-skip drafts, ONNX with
INT8/INT4 weights — each with a quality report in its manifest.

The runtime never imports this package's heavy dependencies (torch, transformers, onnx): they live in the
``edgespec[export]`` extra and are imported inside the functions that need them, through ``require``.
"""

from __future__ import annotations

from types import ModuleType

from edgespec import extras
from edgespec.errors import EdgespecError


class UnsupportedArchitectureError(EdgespecError):
    """The model's architecture is not one the exporter can write."""


def require(module: str, extra: str = "export") -> ModuleType:
    """Import ``module`` or tell the user which extra installs it."""
    return extras.require(module, extra, "this export")
