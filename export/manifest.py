"""Exported-artefact manifests: what an artefact is, how it was made, how well it agrees with its source.

Each artefact gets one JSON file beside it (``model.gguf`` → ``model.gguf.json``; a folder → its
``edgespec-manifest.json``), and a copy in the registry ``$EDGESPEC_HOME/exports.json`` that
``edgespec models`` lists. Both are validated on write and on read. Nothing here imports heavy packages:
the runtime's ``edgespec models`` reads the registry.
"""

from __future__ import annotations

import importlib.metadata as md
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgespec.errors import EdgespecError
from edgespec.files import write_text
from edgespec.home import home_dir, keep, read_record

FORMAT = "edgespec-artefact/1"
KINDS = ("gguf", "draft", "onnx")


class ManifestError(EdgespecError):
    """A manifest that is missing fields or has fields of the wrong type."""


# field → allowed types (None allowed where listed); nested dicts are checked one level down.
_SCHEMA: dict[str, tuple[type, ...]] = {
    "format": (str,), "kind": (str,), "artefact": (str,), "file_bytes": (int,), "architecture": (str,),
    "n_layers": (int,), "source": (dict,), "made": (dict,), "quality": (dict, type(None)),
}
_SOURCE = {"path": (str,), "name": (str, type(None)), "architecture": (str,), "n_layers": (int,)}
_MADE = {"method": (str,), "quant": (str, type(None)), "kept_layers": (list, type(None)), "tools": (dict,),
         "created": (str,)}


def _check(d: Any, schema: dict[str, tuple[type, ...]], where: str) -> None:
    if not isinstance(d, dict):
        raise ManifestError(f"{where}: expected an object, got {type(d).__name__}")
    for key, types in schema.items():
        if key not in d:
            raise ManifestError(f"{where}: missing field {key!r}")
        if not isinstance(d[key], types) or (isinstance(d[key], bool) and bool not in types):
            raise ManifestError(f"{where}: field {key!r} has type {type(d[key]).__name__}, expected "
                                f"{' or '.join(t.__name__ for t in types)}")


def validate(d: Any, where: str = "manifest") -> dict[str, Any]:
    _check(d, _SCHEMA, where)
    if d["format"] != FORMAT:
        raise ManifestError(f"{where}: format {d['format']!r} is not {FORMAT!r}")
    if d["kind"] not in KINDS:
        raise ManifestError(f"{where}: kind {d['kind']!r} is not one of {', '.join(KINDS)}")
    _check(d["source"], _SOURCE, f"{where}.source")
    _check(d["made"], _MADE, f"{where}.made")
    kept = d["made"]["kept_layers"]
    if kept is not None and not all(isinstance(x, int) and 0 <= x < d["source"]["n_layers"] for x in kept):
        raise ManifestError(f"{where}.made.kept_layers: {kept} are not layers of the source")
    return d


def tool_versions(*packages: str) -> dict[str, str]:
    versions = {}
    for name in ("edgespec", "llama-cpp-python", *packages):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return versions


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def manifest_path(artefact: Path) -> Path:
    return artefact / "edgespec-manifest.json" if artefact.is_dir() else artefact.with_name(artefact.name + ".json")


def registry_path() -> Path:
    return home_dir("exports.json")


def _write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _read_registry() -> dict[str, Any]:
    """The home's list of exports; empty when there is none, or it is damaged (said once: the next export writes a
    new one)."""
    return read_record(registry_path(), lambda d: d, "the next export writes a new one") or {}


def save(manifest: dict[str, Any]) -> Path:
    """Validate, write beside the artefact, and register; returns the manifest's path."""
    validate(manifest)
    artefact = Path(manifest["artefact"])
    path = manifest_path(artefact)
    _write_json(path, manifest)
    registry = _read_registry()
    registry[str(artefact)] = manifest
    keep(registry_path(), lambda p: _write_json(p, registry))  # the artefact is made; the list is the home's cache
    return path


def load(path: Path) -> dict[str, Any]:
    try:
        return validate(json.loads(path.read_text()), str(path))
    except (OSError, json.JSONDecodeError) as e:
        raise ManifestError(f"cannot read manifest {path}: {e}") from e


def exported() -> list[dict[str, Any]]:
    """Registered artefacts that still exist, each validated (an invalid entry is reported, not skipped)."""
    return [validate(m, f"{registry_path()}[{key!r}]") for key, m in sorted(_read_registry().items())
            if Path(key).exists()]
