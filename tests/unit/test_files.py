"""Atomic writes (edgespec/files.py): the target changes whole or not at all, and no temporary is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.files import staged, write_text


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.json"
    write_text(path, "one")
    write_text(path, "two")
    assert path.read_text() == "two"
    with pytest.raises(RuntimeError), staged(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the writer failed")
    assert path.read_text() == "two" and sorted(p.name for p in path.parent.iterdir()) == ["a.json"]


def test_a_folder_is_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "export"
    for files in (["old.onnx", "manifest.json"], ["new.onnx"]):
        with staged(out) as tmp:
            tmp.mkdir()
            for name in files:
                (tmp / name).write_text(name)
    assert sorted(p.name for p in out.iterdir()) == ["new.onnx"] and [p.name for p in tmp_path.iterdir()] == ["export"]
