"""Output files: check the disk has room before writing (writing through a temporary name: edgespec.files)."""

from __future__ import annotations

import shutil
from pathlib import Path

from edgespec.errors import EdgespecError

_MARGIN = 1.05  # estimates are of tensor data; headers and alignment padding add a little


class NoSpaceError(EdgespecError):
    """The output's file system has not enough free space for the artefact."""


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def ensure_space(dst: Path, need_bytes: int) -> None:
    """Refuse to start a write that cannot finish: llama.cpp would fail half-way with a bare error."""
    folder = dst.parent
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    need = int(need_bytes * _MARGIN)
    if free < need:
        raise NoSpaceError(f"not enough disk space for {dst}: it needs about {human_size(need)}, "
                           f"{folder} has {human_size(free)} free")

