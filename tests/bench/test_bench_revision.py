"""edgespec.bench.revision: another revision's copy of a file, for the benchmarks that compare kernels; and bench
configurations run by another revision's edgespec (``NAME@REV``), side by side with this checkout's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from edgespec.bench.configs import select
from edgespec.bench.revision import ROOT, files_at, source_at
from edgespec.cli.main import main
from edgespec.kernels import library as custom_ops
from tests.conftest import SPEC_BENCH

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_file_at_a_revision_and_a_clear_exit_where_git_has_none() -> None:
    assert "BlockInt8MatMul" in source_at("HEAD", custom_ops.KERNELS / "block_int8_matmul.cc")
    with pytest.raises(SystemExit, match="at revision 'no-such-revision'"):
        source_at("no-such-revision", custom_ops.KERNELS / "block_int8_matmul.cc")
    kernels = files_at("HEAD", custom_ops.KERNELS)  # a revision's own kernel files (benchmarks/kernels_in_model.py)
    assert custom_ops.KERNELS / "block_int8_matmul.cc" in kernels
    assert all(p.parent == custom_ops.KERNELS for p in kernels)
    with pytest.raises(SystemExit, match="at revision 'no-such-revision'"):
        files_at("no-such-revision", custom_ops.KERNELS)


def test_a_configuration_at_a_revision_keeps_this_checkouts_baseline() -> None:
    configs, skipped = select(["default@HEAD"], {})
    assert [c.name for c in configs] == ["default-target", "default@HEAD"] and not skipped
    assert configs[0].revision is None and configs[1].revision == _head()
    assert configs[1].baseline == "default-target" and configs[1].auto


def test_a_configuration_at_a_revision_runs_beside_this_checkouts(tmp_path: Path) -> None:
    """The default as HEAD's edgespec runs it (the worker checks that it imported the revision's package, written
    apart) beside this checkout's, against this checkout's default target: the same tokens, the run says which
    commit ran and compares the two, and the revision's kernels were built apart (this environment's build is still
    there). A working tree whose numerics differ from HEAD's (an uncommitted kernel change) fails the "same tokens"
    check here until it is committed: HEAD's outputs are compared with this checkout's target."""
    build = custom_ops.library()
    assert main(["bench", "--questions", str(SPEC_BENCH), "--threads", "1", "--out", str(tmp_path), "--limit", "1",
                 "--max-tokens", "8", "--no-plots", "--configs", "default,default@HEAD"]) == 0
    (path,) = tmp_path.glob("spec_bench-*.json")
    result = json.loads(path.read_text())
    assert [(c["name"], c["revision"]) for c in result["configs"]] == [("default-target", None), ("default", None),
                                                                      ("default@HEAD", _head())]
    at_head = [r for r in result["records"] if r["config"] == "default@HEAD"]
    assert at_head and all(r["same_as_baseline"] and r["n_tokens"] > 0 for r in at_head)
    assert len(at_head) == len(result["records"]) / 3
    assert custom_ops.library() == build
    versions = result["versions"]["default@HEAD"]  # printed under the table: this checkout over the revision
    assert versions["this_checkout"] == "default" and versions["revision"] == _head()


def test_a_revision_that_is_not_there_or_a_peer_at_one_is_a_clear_error(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    def bench(configs: str) -> int:
        return main(["bench", "--questions", str(SPEC_BENCH), "--out", str(tmp_path), "--configs", configs])

    assert bench("target@no-such-revision") == 2
    assert "target@no-such-revision: no git revision 'no-such-revision'" in capsys.readouterr().err
    assert bench("lcpp-plain@HEAD") == 2
    err = capsys.readouterr().err
    assert "only edgespec's configurations run at a revision" in err and "Traceback" not in err
    assert bench("warp-drive@HEAD") == 2
    assert "unknown configurations warp-drive@HEAD" in capsys.readouterr().err
