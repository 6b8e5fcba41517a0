"""An ONNX export's manifest (``edgespec-onnx.json``, docs/onnx-format.md): read, checked, and what it says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...errors import ModelLoadError

MANIFEST = "edgespec-onnx.json"


FORMAT = "edgespec-onnx/1"


KV_DTYPES = ("float32", "float16")  # the manifest's kv_dtype: what the layer graphs' past/present tensors hold


def head_folder(export: Path) -> Path:
    """Where ``edgespec export head`` writes the draft head of an export: beside it (a re-export replaces the export's
    directory, not the head, which took long to train)."""
    return export.with_name(export.name + ".head")


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelLoadError(f"{folder} is not an edgespec ONNX model directory (no {MANIFEST}); "
                             "make one with `edgespec export onnx`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e
    if not isinstance(manifest, dict):
        raise ModelLoadError(f"{path}: a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        raise ModelLoadError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}")
    missing = [k for k in ("num_layers", "num_kv_heads", "head_dim", "hidden_size", "vocab_size", "context_length",
                           "embed", "layers", "head") if k not in manifest]
    if missing:
        raise ModelLoadError(f"{path}: missing {', '.join(missing)}")
    if manifest.get("kv_dtype", "float32") not in KV_DTYPES:
        raise ModelLoadError(f"{path}: kv_dtype {manifest['kv_dtype']!r} is not supported ({' or '.join(KV_DTYPES)})")
    layers = manifest["layers"]
    if not isinstance(layers, list) or len(layers) != manifest["num_layers"]:
        raise ModelLoadError(f"{path}: layers {str(layers)[:60]} for num_layers={manifest['num_layers']}")
    return manifest


def is_draft_head(manifest: dict) -> bool:
    """A draft head's export (``edgespec export head``) reads rows of features, not token ids: its "embed" graph
    maps [the target's hidden state, a token's embedding] to its width, and it has no vocabulary of its own."""
    return manifest.get("input") == "features"


def kv_dtype_of(manifest: dict) -> np.dtype:
    """The element type of an export's KV buffer (``read_manifest`` checked it)."""
    return np.dtype(manifest.get("kv_dtype", "float32"))
