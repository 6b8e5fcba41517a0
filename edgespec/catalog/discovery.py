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

Only files are read, never written: stores belong to the tools that made them. What each file is (its header,
what edgespec can do with it) is ``info``'s.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import EdgespecError, ModelLoadError
from ..files import tomllib
from ..home import edgespec_home

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
    return edgespec_home() / "config.toml"


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
