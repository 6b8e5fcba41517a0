"""A loaded model's weights on 2 MB pages (edgespec/huge_pages.py): the address ranges a load added, and, on a Linux
kernel that collapses on request, the real export's sessions in huge pages after loading."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from edgespec.huge_pages import added, anonymous_memory
from edgespec.onnx_backend import OnnxModel, OnnxOptions
from tests.conftest import onnx_export_dir


def test_the_ranges_a_load_added_are_new_spans_and_grown_ends() -> None:
    before = [(0x1000, 0x5000), (0x9000, 0xA000)]
    assert added(before, before) == []
    assert added(before, [(0x1000, 0x8000), (0x9000, 0xA000)]) == [(0x5000, 0x8000)]  # a heap grown
    assert added(before, [(0x1000, 0x5000), (0x6000, 0x7000), (0x9000, 0xA000)]) == [(0x6000, 0x7000)]
    assert added(before, [(0x0, 0xC000)]) == [(0x0, 0x1000), (0x5000, 0x9000), (0xA000, 0xC000)]  # merged spans
    assert added([], [(0x1000, 0x2000)]) == [(0x1000, 0x2000)]


def _anon_huge_bytes() -> int:
    return sum(int(line.split()[1]) << 10 for line in Path("/proc/self/smaps").read_text().splitlines()
               if line.startswith("AnonHugePages:"))


def _collapses_on_request() -> bool:
    """Linux 6.1 or later (MADV_COLLAPSE) with transparent huge pages not switched off."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return "[never]" not in enabled and (major, minor) >= (6, 1)


@pytest.mark.skipif(not _collapses_on_request(), reason="needs Linux >= 6.1 with transparent huge pages available")
def test_a_loaded_export_has_its_weights_on_huge_pages() -> None:
    export = onnx_export_dir(quant="int8")
    weights = sum(f.stat().st_size for f in export.glob("layer_*.onnx"))
    assert anonymous_memory(), "no anonymous mappings read from /proc/self/maps"
    huge_before = _anon_huge_bytes()
    model = OnnxModel(export, OnnxOptions(n_ctx=256, n_threads=1))
    try:
        assert model.huge_page_bytes >= weights * 0.9, (model.huge_page_bytes, weights)
        assert _anon_huge_bytes() - huge_before >= weights * 0.9  # collapsed now, not some time later
    finally:
        model.close()
