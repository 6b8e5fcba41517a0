"""What a GGUF found in the stores (``discovery``) is, for ``edgespec models``: its header's facts (``gguf_header``,
not a model load), whether this llama.cpp build runs it, whether the exporter writes it, its cached ONNX exports."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError
from ..home import edgespec_home
from . import gguf_header
from .discovery import FoundModel, found_models


def _file_types() -> dict[int, str]:
    """llama.cpp's ``general.file_type`` values (llama_ftype) → quantization names, from the library itself."""
    import llama_cpp as lc

    names = {}
    for key, value in vars(lc).items():
        if key.startswith("LLAMA_FTYPE_") and isinstance(value, int) and key != "LLAMA_FTYPE_GUESSED":
            names[value] = key.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_").lower()
    return names


@dataclass(frozen=True)
class ModelInfo:
    """What the header says about a GGUF, and what edgespec can do with it."""

    architecture: str | None
    quant: str | None
    context_length: int | None
    llamacpp: bool  # this build of llama.cpp knows the architecture
    onnx: bool  # `edgespec export onnx` writes the architecture


def describe(path: Path) -> ModelInfo:
    meta = gguf_header.read_metadata(path)
    arch = gguf_header.text(meta, "general.architecture")
    context = meta.get(f"{arch}.context_length")
    return ModelInfo(arch, quant_name(meta), int(context) if isinstance(context, int) else None,
                     llamacpp_knows(path), onnx_exportable(meta))


def quant_name(meta: dict[str, object]) -> str | None:
    """The quantization a GGUF header (``gguf_header.read_metadata``) names, as llama.cpp calls it (``q4_1``)."""
    file_type = meta.get("general.file_type")
    return _file_types().get(file_type) if isinstance(file_type, int) else None


def llamacpp_knows(path: Path) -> bool:
    """Whether this llama.cpp build loads the file's architecture: a vocabulary-only load (no weights read)."""
    import llama_cpp as lc

    from ..backends.llamacpp import model as llama_backend  # noqa: F401  (routes llama.cpp's log into Python logging)

    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        return False
    lc.llama_model_free(model)
    return True


def onnx_exportable(meta: dict[str, object]) -> bool:
    """Whether the exporter's GGUF reader maps the architecture and every tensor of a file, from its header
    (``gguf_header.read_metadata``)."""
    from edgespec.export.onnx.gguf_source import ARCHITECTURES, unsupported_tensor

    architecture = gguf_header.text(meta, "general.architecture")
    if architecture not in ARCHITECTURES:
        return False
    layers = meta.get(f"{architecture}.block_count")
    tensors: Iterable[str] = meta[gguf_header.TENSORS]  # type: ignore[assignment]
    return unsupported_tensor(architecture, layers if isinstance(layers, int) else 0, tensors) is None


def onnx_exports(model: FoundModel) -> list[Path]:
    """ONNX exports under ``$EDGESPEC_HOME/onnx`` made from this model (by name or by path)."""
    found = []
    for manifest in sorted((edgespec_home() / "onnx").glob("*/edgespec-onnx.json")):
        try:
            src = json.loads(manifest.read_text())["source"]["src"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        src_path = Path(src).expanduser()
        if src == model.name or (src_path.exists() and src_path.resolve() == model.path.resolve()):
            found.append(manifest.parent)
    return found


def listing() -> list[dict[str, object]]:
    """``edgespec models``' rows for the stores: name, path, header facts, support per backend, cached exports."""
    rows: list[dict[str, object]] = []
    for model in found_models():
        row: dict[str, object] = {"name": model.name, "path": str(model.path), "size_bytes": model.size_bytes}
        try:
            info = describe(model.path)
        except ModelLoadError as e:  # a broken file is listed with the reason, not hidden or fatal
            rows.append({**row, "error": str(e)})
            continue
        rows.append({**row, "architecture": info.architecture, "quant": info.quant,
                     "context_length": info.context_length, "llamacpp": info.llamacpp, "onnx_export": info.onnx,
                     "onnx_cached": [str(p) for p in onnx_exports(model)]})
    return rows
