"""Where edgespec's kernel library is built and how long other builds stay (no compiler run: the compile is a stub)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgespec.kernels import library


def test_a_build_keeps_the_most_recent_builds_of_other_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another checkout of the same environment (a worktree, a benchmark's other revision) keeps its library while
    this one builds; only the oldest beyond KEPT_BUILDS, and the libraries of the old layout, are removed."""
    monkeypatch.setattr(library, "kernels_dir", lambda: tmp_path)
    monkeypatch.setattr(library, "compile_library", lambda out, **_: out.write_bytes(b"built"))
    others = [tmp_path / f"{library.LIBRARY}-other{i}.so" for i in range(6)]
    for age, other in enumerate(others):
        other.write_bytes(b"old")
        os.utime(other, (1000.0 - age, 1000.0 - age))  # others[0] the newest
    legacy = tmp_path / "exact_attention-abc.so"
    legacy.write_bytes(b"older layout")
    target = library.build(say=lambda _line: None)
    assert target.read_bytes() == b"built" and target.parent == tmp_path
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted([target.name, *(o.name for o in others[:library.KEPT_BUILDS - 1])])
    assert library.build(say=lambda _line: None) == target  # built once per source
