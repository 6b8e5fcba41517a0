"""What a stored measurement or a cached conversion is keyed by: a file's identity (size, time, digest), this CPU's,
and a key's digest (a file name's share of it)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path


def file_digest(path: str | os.PathLike[str]) -> str:
    """A file's content in 16 hex digits (SHA-256): a file rewritten with other bytes of the same size and time
    differs."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


def file_identity(path: str | os.PathLike[str]) -> dict[str, object]:
    """Path, size and modification time; for a model directory (ONNX export) the sum of its files' sizes and
    the latest of their times, so rewriting any graph or the manifest makes the tuning stale."""
    p = Path(path).resolve()
    if p.is_dir():
        stats = [f.stat() for f in sorted(p.iterdir()) if f.is_file()]
        return {"path": str(p), "size": sum(st.st_size for st in stats),
                "mtime_ns": max((st.st_mtime_ns for st in stats), default=0)}
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def cpu_identity() -> str:
    """The CPU model and its feature flags (a digest): a choice measured on one CPU says nothing about another."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.machine())
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    return f"{model} [{hashlib.sha256(flags.encode()).hexdigest()[:8]}]"


def key_digest(key: dict[str, object]) -> str:
    """A key in 16 hex digits (a file name's share of it): equal keys, equal digests."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
