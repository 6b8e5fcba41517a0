"""Layer-skip drafts: a GGUF that keeps a subset of the target's transformer layers, same weights, same
vocabulary, so it drafts for the target at a fraction of its cost (Draft & Verify, SWIFT).

Written by llama.cpp's quantizer (``prune_layers`` + ``only_copy``); where the architecture decides
something per layer by index (Gemma 3's sliding-window layers and their RoPE base), the result's metadata
is then rewritten so every kept layer keeps the type it had in the target.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from edgespec.catalog.models import quantize
from edgespec.errors import InvalidParameterError
from edgespec.files import staged

from ..files import ensure_space
from ..gguf import ggufio


class LayerSetError(InvalidParameterError):
    """A layer set that is empty, malformed or outside the model."""


def parse_layers(spec: str, n_layers: int) -> list[int]:
    """``"0-11,20-29"`` → sorted layer indices, each checked against the model's ``n_layers``."""
    layers: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise LayerSetError(f"bad layer range {part!r} in {spec!r}: use e.g. 0-11,20-29")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo > hi:
            raise LayerSetError(f"bad layer range {part!r}: {lo} > {hi}")
        if hi >= n_layers:
            raise LayerSetError(f"layer {hi} is out of range: the model has layers 0-{n_layers - 1}")
        layers.update(range(lo, hi + 1))
    return sorted(layers)


def check_keep(keep: list[int], n_layers: int) -> list[int]:
    keep = sorted(set(keep))
    if not keep:
        raise LayerSetError("the layer set is empty: a draft needs at least one layer")
    if keep[0] < 0 or keep[-1] >= n_layers:
        raise LayerSetError(f"layers {keep} are out of range: the model has layers 0-{n_layers - 1}")
    return keep


def format_layers(keep: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] → "0-2,5,7-8"."""
    runs: list[list[int]] = []
    for layer in keep:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _prepare(src: Path, keep: list[int]) -> tuple[Any, list[int], int, int]:
    r = ggufio.reader(src)
    arch = ggufio.field(r, "general.architecture")
    if arch not in ggufio.DRAFT_ARCHITECTURES:
        raise ggufio.UnsupportedArchitectureError(
            f"layer-skip drafts support the {', '.join(ggufio.DRAFT_ARCHITECTURES)} architectures; {src} is {arch}")
    n_layers = int(ggufio.field(r, f"{arch}.block_count", 0))
    keep = check_keep(keep, n_layers)
    kept_bytes = sum(int(t.n_bytes) for t in r.tensors
                     if (b := ggufio.block_of(t.name)) is None or b in set(keep))
    return r, keep, kept_bytes, n_layers


def write_draft(src: Path, dst: Path, keep: list[int], quant: str | None = None) -> list[int]:
    """Write the layers ``keep`` of ``src`` to ``dst`` with llama.cpp (tensors copied, or re-quantized to
    ``quant``); returns the kept layers. Refuses bad sets and full disks before writing anything."""
    r, keep, kept_bytes, n_layers = _prepare(src, keep)
    ensure_space(dst, kept_bytes)
    prune = [il for il in range(n_layers) if il not in set(keep)]
    extra_kv = {k: v for k, v in ggufio.layer_subset_kv(r, keep).items() if not k.endswith(".block_count")}
    if not extra_kv:
        quantize(src, dst, quant, prune)
        return keep
    with staged(dst, "pruned") as pruned:
        quantize(src, pruned, quant, prune)
        # llama.cpp's pruning renumbers tensors but leaves per-layer metadata as it was: set it right.
        ensure_space(dst, kept_bytes)
        with staged(pruned, "patched") as patched:
            ggufio.copy(ggufio.reader(pruned), patched, extra_kv)
    return keep


def write_draft_reference(src: Path, dst: Path, keep: list[int]) -> list[int]:
    """The same draft written the other way, by the ``gguf`` package alone (tests compare the two)."""
    r, keep, kept_bytes, _ = _prepare(src, keep)
    ensure_space(dst, kept_bytes)
    with staged(dst) as tmp:
        ggufio.copy(r, tmp, ggufio.layer_subset_kv(r, keep), ggufio.renumber(keep))
    return keep
