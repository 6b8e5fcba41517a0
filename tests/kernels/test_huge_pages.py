"""A loaded model's weights on 2 MB pages (edgespec/backends/onnx/huge_pages.py): the address ranges a load added,
and, on a Linux kernel that collapses on request, the real export's sessions in huge pages after loading."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.backends.onnx.huge_pages import added, anonymous_memory
from tests.conftest import onnx_export_dir


def test_the_ranges_a_load_added_are_new_spans_and_grown_ends() -> None:
    before = [(0x1000, 0x5000), (0x9000, 0xA000)]
    assert added(before, before) == []
    assert added(before, [(0x1000, 0x8000), (0x9000, 0xA000)]) == [(0x5000, 0x8000)]  # a heap grown
    assert added(before, [(0x1000, 0x5000), (0x6000, 0x7000), (0x9000, 0xA000)]) == [(0x6000, 0x7000)]
    assert added(before, [(0x0, 0xC000)]) == [(0x0, 0x1000), (0x5000, 0x9000), (0xA000, 0xC000)]  # merged spans
    assert added([], [(0x1000, 0x2000)]) == [(0x1000, 0x2000)]


def _collapses_on_request() -> bool:
    """Linux 6.1 or later (MADV_COLLAPSE) with transparent huge pages not switched off."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    version = re.match(r"(\d+)\.(\d+)", platform.release())  # "6.18.44-fc-v595", "6.1-rc3"
    return "[never]" not in enabled and version is not None and (int(version[1]), int(version[2])) >= (6, 1)


_LOAD = """
import json, sys
from pathlib import Path
from edgespec.backends.onnx.model import OnnxModel, OnnxOptions

def anon_huge():
    return sum(int(line.split()[1]) << 10 for line in Path("/proc/self/smaps").read_text().splitlines()
               if line.startswith("AnonHugePages:"))

before = anon_huge()
model = OnnxModel(sys.argv[1], OnnxOptions(n_ctx=256, n_threads=1))
print(json.dumps({"collapsed": model.huge_page_bytes, "grown": anon_huge() - before}))
"""


@pytest.mark.skipif(not _collapses_on_request(), reason="needs Linux >= 6.1 with transparent huge pages available")
def test_a_loaded_export_has_its_weights_on_huge_pages() -> None:
    """In a process of its own, as a user's is (a process that loaded and closed models before may reuse their
    memory, which keeps the pages it had)."""
    export = onnx_export_dir(quant="int8")
    weights = sum(f.stat().st_size for f in export.glob("layer_*.onnx"))
    assert anonymous_memory(), "no anonymous mappings read from /proc/self/maps"
    done = subprocess.run([sys.executable, "-c", _LOAD, str(export)], capture_output=True, text=True, timeout=300,
                          check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["collapsed"] >= weights * 0.9, (result, weights)
    assert result["grown"] >= weights * 0.9, (result, weights)  # collapsed now, not some time later
