"""edgespec.bench.revision: another revision's copy of a file, for the benchmarks that compare kernels."""

from __future__ import annotations

import pytest

from edgespec import custom_ops
from edgespec.bench.revision import ROOT, source_at


def test_a_file_at_a_revision_and_a_clear_exit_where_git_has_none() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert "BlockInt8MatMul" in source_at("HEAD", custom_ops.KERNELS / "block_int8_matmul.cc")
    with pytest.raises(SystemExit, match="at revision 'no-such-revision'"):
        source_at("no-such-revision", custom_ops.KERNELS / "block_int8_matmul.cc")
