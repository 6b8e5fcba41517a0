"""Writing files and folders atomically: through a temporary name beside the target, replaced in one step, so
a reader (or a crash) never sees half an artefact. The one copy of that rule; and ``tomllib`` for reading the TOML
files edgespec reads (the manifests in models/, LM Studio's settings), the standard library's where it has one."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .home import sweep

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["staged", "tomllib", "write_text"]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def staged(dst: Path, tag: str = "tmp") -> Iterator[Path]:
    """A temporary path next to ``dst`` that becomes ``dst`` (a file, or a folder replaced whole) only if the
    block succeeds; the block creates it."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    sweep(dst.parent, dst.name)  # what a killed writer of the same file left
    tmp = dst.with_name(f".{dst.name}.{tag}{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if tmp.is_dir() and dst.is_dir():
            shutil.rmtree(dst)  # a folder cannot replace a non-empty one
        tmp.replace(dst)
    finally:
        _remove(tmp)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with staged(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
