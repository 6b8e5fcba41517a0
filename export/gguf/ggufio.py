"""GGUF files through the ``gguf`` package: metadata, layers, and a streaming copy that renames tensors.

This is the second, independent way of writing a layer subset (llama.cpp's quantizer is the first); the
tests check that both give the same logits. It also reads back which source layers a draft holds.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.catalog.gguf_header import check_gguf
from edgespec.errors import EdgespecError, ModelLoadError

from .. import UnsupportedArchitectureError, require

_BLOCK = re.compile(r"^blk\.(\d+)\.")

# Architectures whose layer subsets edgespec can write
DRAFT_ARCHITECTURES = ("llama", "gemma3")
# llama.cpp's (as llama-cpp-python 0.3.36 pins it) sliding window where the file leaves it out: (window, period);
# with a window and no explicit per-layer pattern, layer il is sliding-window iff il % period < period - 1
# (gemma2: every other layer; gemma3: 5 local layers, then 1 global). Other architectures: no default.
SLIDING_WINDOW_DEFAULTS: dict[str, tuple[int, int]] = {"gemma2": (4096, 2), "gemma3": (0, 6)}


@dataclass(frozen=True)
class GgufInfo:
    path: Path
    architecture: str
    n_layers: int
    n_params: int
    tensor_bytes: int
    file_bytes: int


def reader(path: Path) -> Any:
    """A ``gguf.GGUFReader`` (memory-mapped), or a clear error for a file that is not a valid GGUF."""
    require("gguf")
    check_gguf(path)
    stat = path.stat()
    return _cached_reader(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _cached_reader(path: Path, _mtime_ns: int, _size: int) -> Any:
    # Parsing the metadata of a 262k-token vocabulary takes seconds in pure Python; a layer search reads its
    # source once per candidate. The key changes whenever the file does.
    import gguf

    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise ModelLoadError(f"{path} is not a valid GGUF file: {e}") from e


def field(r: Any, key: str, default: Any = None) -> Any:
    f = r.fields.get(key)
    return default if f is None else f.contents()


def info(path: Path) -> GgufInfo:
    r = reader(path)
    arch = field(r, "general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{path} has no general.architecture: not a model GGUF")
    n_layers = int(field(r, f"{arch}.block_count", 0))
    return GgufInfo(path, arch, n_layers, sum(int(t.n_elements) for t in r.tensors),
                    sum(int(t.n_bytes) for t in r.tensors), path.stat().st_size)


def sliding_window(r: Any) -> int:
    """The sliding window's length in the file's metadata, or llama.cpp's default (0: none)."""
    arch = field(r, "general.architecture")
    return int(field(r, f"{arch}.attention.sliding_window", SLIDING_WINDOW_DEFAULTS.get(arch, (0, 0))[0]) or 0)


def sliding_window_layers(r: Any) -> list[bool] | None:
    """Which layers llama.cpp runs with sliding-window attention (None: the model has no window)."""
    arch = field(r, "general.architecture")
    n_layers = int(field(r, f"{arch}.block_count", 0))
    if not sliding_window(r):
        return None
    pattern = field(r, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # explicit per-layer flags: llama.cpp honours them as they are
        return [bool(x) for x in pattern[:n_layers]]
    period = pattern if isinstance(pattern, int) else SLIDING_WINDOW_DEFAULTS.get(arch, (0, None))[1]
    if period is None:
        raise UnsupportedArchitectureError(f"{arch} has a sliding window but no known layer pattern")
    return [period == 0 or il % period < period - 1 for il in range(n_layers)]


def layer_subset_kv(r: Any, keep: list[int]) -> dict[str, tuple[Any, Any, Any]]:
    """Metadata a file holding only layers ``keep`` needs beyond llama.cpp's own pruning: the block count,
    every per-layer array cut to the kept layers, and the sliding-window flags of the ORIGINAL layers —
    llama.cpp decides them by layer index, so without this a renumbered layer changes its attention type
    and RoPE base and the draft silently computes something else."""
    gguf = require("gguf")
    vt = gguf.GGUFValueType
    arch = field(r, "general.architecture")
    n_layers = int(field(r, f"{arch}.block_count", 0))
    kv: dict[str, tuple[Any, Any, Any]] = {f"{arch}.block_count": (len(keep), vt.UINT32, None)}
    for key, f in r.fields.items():
        if (key.startswith(f"{arch}.") and f.types and f.types[0] == vt.ARRAY and f.types[-1] != vt.STRING
                and len(f.data) == n_layers):
            values = f.contents()
            kv[key] = ([values[i] for i in keep], vt.ARRAY, f.types[-1])
    swa = sliding_window_layers(r)
    if swa is not None:
        kv[f"{arch}.attention.sliding_window_pattern"] = ([swa[i] for i in keep], vt.ARRAY, vt.BOOL)
    return kv


def copy(r: Any, dst: Path, kv: Mapping[str, tuple[Any, Any, Any]] | None = None,
         rename: Callable[[str], str | None] = lambda name: name) -> None:
    """Write ``r``'s metadata (with ``kv`` replacing or adding keys) and its tensors, each under
    ``rename(name)`` or dropped when that is None, byte for byte into ``dst``."""
    gguf = require("gguf")
    vt = gguf.GGUFValueType
    kv = dict(kv or {})
    arch = field(r, "general.architecture")
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=r.endianess)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in kv:
            continue
        if f.types[0] == vt.ARRAY and f.types[-1] == vt.STRING:  # raw bytes: token texts need not be UTF-8
            writer.add_key_value(key, [bytes(f.parts[i]) for i in f.data], vt.ARRAY, sub_type=vt.STRING)
        elif f.types[0] == vt.ARRAY:
            writer.add_key_value(key, f.contents(), vt.ARRAY, sub_type=f.types[-1])
        else:
            writer.add_key_value(key, f.contents(), f.types[0])
    for key, (value, vtype, sub_type) in kv.items():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    kept = [(new, t) for t in r.tensors if (new := rename(t.name)) is not None]
    for new, t in kept:
        writer.add_tensor_info(new, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=r.endianess)
    writer.close()


def block_of(name: str) -> int | None:
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else None


def renumber(keep: Iterable[int]) -> Callable[[str], str | None]:
    """Tensor renaming for a layer subset: kept block ``keep[i]`` becomes ``blk.i``, the rest are dropped."""
    new_index = {old: new for new, old in enumerate(sorted(keep))}

    def rename(name: str) -> str | None:
        old = block_of(name)
        if old is None:
            return name
        if old not in new_index:
            return None
        return f"blk.{new_index[old]}." + name[_BLOCK.match(name).end():]  # type: ignore[union-attr]

    return rename


def _block_digests(r: Any) -> dict[int, str]:
    digests: dict[int, Any] = {}
    for t in sorted(r.tensors, key=lambda t: t.name):
        block = block_of(t.name)
        if block is None:
            continue
        h = digests.setdefault(block, hashlib.sha256())
        h.update(_BLOCK.sub("", t.name).encode() + int(t.tensor_type).to_bytes(4, "little"))
        h.update(memoryview(t.data).cast("B"))
    return {block: h.hexdigest() for block, h in digests.items()}


def kept_layers(draft: Path, source: Path) -> list[int]:
    """Which source layers a layer-subset draft holds, in order, read from the two files' tensor bytes."""
    by_digest = {d: block for block, d in _block_digests(reader(source)).items()}
    found = []
    for block, d in sorted(_block_digests(reader(draft)).items()):
        if d not in by_digest:
            raise EdgespecError(f"layer {block} of {draft} matches no layer of {source} byte for byte")
        found.append(by_digest[d])
    return found
