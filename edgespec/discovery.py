"""GGUF models where users already keep them: Ollama's store, LM Studio's folders, the Hugging Face hub cache
and folders the user names. Each found file gets a name that works as ``--model``:

- ``ollama:NAME[:TAG]`` (tag ``latest`` when left out; ``ollama:USER/NAME:TAG`` outside Ollama's library),
  from ``$OLLAMA_MODELS`` or ``~/.ollama/models``: a manifest under ``manifests/HOST/NAMESPACE/NAME/TAG``
  names the model layer's blob (``blobs/sha256-…``), the layer of media type ``application/vnd.ollama.image.model``;
- ``lmstudio:PUBLISHER/REPO/FILE`` (the file name without ``.gguf``) from ``~/.lmstudio/models`` and
  ``~/.cache/lm-studio/models``;
- ``hf:ORG/NAME/FILE`` from the hub cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``):
  ``models--ORG--NAME/snapshots/REVISION/FILE.gguf``, the revision ``refs/main`` points at first;
- ``local:RELATIVE/PATH`` from the folders in ``$EDGESPEC_MODEL_PATH`` (separated like ``PATH``) and in
  ``$EDGESPEC_HOME/config.toml``'s ``[models] paths = [...]``.

Only files are read, never written: stores belong to the tools that made them. Metadata comes from the GGUF
header (``gguf_header``), not from loading the model.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import gguf_header
from .errors import EdgespecError, ModelLoadError
from .models import cache_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STORES = ("ollama", "lmstudio", "hf", "local")
_OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_OLLAMA_HOST, _OLLAMA_LIBRARY = "registry.ollama.ai", "library"
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's split files: the first shard names the model


@dataclass(frozen=True)
class FoundModel:
    """A GGUF file in a store, under the name that loads it."""

    name: str
    path: Path
    size_bytes: int  # all shards of a split model


def is_store_name(text: str) -> bool:
    store, sep, rest = text.partition(":")
    return bool(sep and rest) and store in STORES


def _home() -> Path:
    return Path.home()


def ollama_roots() -> list[Path]:
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return [Path(env).expanduser()]
    return [_home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]  # the Linux service's home


def lmstudio_roots() -> list[Path]:
    return [_home() / ".lmstudio" / "models", _home() / ".cache" / "lm-studio" / "models"]


def hf_hub_root() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else _home() / ".cache") / "huggingface" / "hub"


def config_path() -> Path:
    return cache_dir().parent / "config.toml"


def user_folders() -> list[Path]:
    """``$EDGESPEC_MODEL_PATH``'s folders, then the config file's ``[models] paths``."""
    folders = [Path(p).expanduser() for p in os.environ.get("EDGESPEC_MODEL_PATH", "").split(os.pathsep) if p]
    path = config_path()
    if path.is_file():
        try:
            paths = tomllib.loads(path.read_text()).get("models", {}).get("paths", [])
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise EdgespecError(f"cannot read {path}: {e}") from e
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise EdgespecError(f"{path}: [models] paths must be a list of folder names")
        folders += [Path(p).expanduser() for p in paths]
    return folders


def _gguf_files(root: Path) -> Iterator[tuple[Path, int]]:
    """GGUF files under ``root`` (symlinks followed, as the hub cache's are), first shards only, with the size of
    all shards, in name order."""
    for path in sorted(root.rglob("*.gguf")):
        shard = _SHARD.search(path.name)
        if shard and int(shard.group(1)) != 1:
            continue
        if not path.is_file():
            continue
        if shard:
            prefix = path.name[:shard.start()]
            size = sum(p.stat().st_size for p in path.parent.glob(f"{prefix}-*-of-{shard.group(2)}.gguf"))
        else:
            size = path.stat().st_size
        yield path, size


def _ollama(root: Path) -> Iterator[FoundModel]:
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        try:
            layers = json.loads(manifest.read_text()).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue  # not a manifest we understand; Ollama's own files are not ours to judge
        if not isinstance(layers, list):
            continue
        digest = next((layer.get("digest") for layer in layers if isinstance(layer, dict)
                       and layer.get("mediaType") == _OLLAMA_MODEL_LAYER), None)
        if not isinstance(digest, str):
            continue
        blob = root / "blobs" / digest.replace(":", "-")
        if not blob.is_file():
            continue
        name = model if namespace == _OLLAMA_LIBRARY else f"{namespace}/{model}"
        name = name if host == _OLLAMA_HOST else f"{host}/{name}"
        yield FoundModel(f"ollama:{name}:{tag}", blob, blob.stat().st_size)


def _folder(store: str, root: Path) -> Iterator[FoundModel]:
    for path, size in _gguf_files(root):
        yield FoundModel(f"{store}:{path.relative_to(root).with_suffix('').as_posix()}", path, size)


def _hf(root: Path) -> Iterator[FoundModel]:
    for repo in sorted(root.glob("models--*")):
        org_name = repo.name.removeprefix("models--").replace("--", "/")
        main = repo / "refs" / "main"
        revision = main.read_text().strip() if main.is_file() else None
        snapshots = sorted((repo / "snapshots").glob("*"), key=lambda p: p.name != revision)
        for snapshot in snapshots:  # refs/main's first: a name another revision also has means main's file
            for path, size in _gguf_files(snapshot):
                yield FoundModel(f"hf:{org_name}/{path.relative_to(snapshot).with_suffix('').as_posix()}",
                                 path, size)


def _stores() -> Iterator[FoundModel]:
    for root in ollama_roots():
        yield from _ollama(root)
    for root in lmstudio_roots():
        yield from _folder("lmstudio", root)
    yield from _hf(hf_hub_root())
    for root in user_folders():
        yield from _folder("local", root)


def found_models() -> list[FoundModel]:
    """Every GGUF in the stores, each name once (the first place it is found wins)."""
    seen: dict[str, FoundModel] = {}
    for model in _stores():
        seen.setdefault(model.name, model)
    return list(seen.values())


def find(name: str) -> Path:
    """A store name (``ollama:qwen2.5:0.5b``, ``hf:ORG/NAME/FILE``, …) → its GGUF file."""
    wanted = name
    if name.startswith("ollama:") and name.count(":") == 1:
        wanted = f"{name}:latest"
    models = found_models()
    for model in models:
        if model.name == wanted:
            return model.path
    store = name.partition(":")[0]
    known = ", ".join(m.name for m in models if m.name.startswith(f"{store}:"))
    raise ModelLoadError(f"no model {name!r} in the {store} store ({f'found: {known}' if known else 'none found'}); "
                         "`edgespec models` lists them")


# -- what each found file is -----------------------------------------------------------------------------
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
    file_type = meta.get("general.file_type")
    context = meta.get(f"{arch}.context_length")
    # Llama 3.x RoPE factors do not survive transformers' GGUF loader: the exporter refuses such files
    rope_factors = "rope_freqs.weight" in meta[gguf_header.TENSORS]  # type: ignore[operator]
    return ModelInfo(arch, _file_types().get(file_type) if isinstance(file_type, int) else None,
                     int(context) if isinstance(context, int) else None, llamacpp_knows(path),
                     onnx_exportable(arch) and not rope_factors)


def llamacpp_knows(path: Path) -> bool:
    """Whether this llama.cpp build loads the file's architecture: a vocabulary-only load (no weights read)."""
    import llama_cpp as lc

    from . import llama_backend  # noqa: F401  (routes llama.cpp's log into Python logging)

    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        return False
    lc.llama_model_free(model)
    return True


def onnx_exportable(architecture: str | None) -> bool:
    from edgespec.export.hf import ARCHITECTURES, FROM_GGUF

    return FROM_GGUF.get(architecture or "") in ARCHITECTURES


def onnx_exports(model: FoundModel) -> list[Path]:
    """ONNX exports under ``$EDGESPEC_HOME/onnx`` made from this model (by name or by path)."""
    found = []
    for manifest in sorted((cache_dir().parent / "onnx").glob("*/edgespec-onnx.json")):
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
