"""This checkout's files as another git revision has them: what the benchmarks that compare kernels across revisions
(benchmarks/products_kernel.py, benchmarks/kernels_in_model.py) compile beside the working tree's, and the edgespec
package that runs a bench configuration ``NAME@REV`` (edgespec/bench/worker.py)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)


def source_at(rev: str, path: Path) -> str:
    """The text of ``path`` (a file of this checkout) at git revision ``rev``; a clear exit where git has none (not
    a checkout, an unknown revision, a file the revision lacks)."""
    if not path.resolve().is_relative_to(ROOT) or not (ROOT / ".git").exists():
        raise SystemExit(f"{path} is not in a git checkout of edgespec: run this from a clone")
    name = path.resolve().relative_to(ROOT).as_posix()
    done = _git("show", f"{rev}:{name}")
    if done.returncode != 0:
        raise SystemExit(f"cannot read {name} at revision {rev!r}: {done.stderr.decode().strip() or 'git failed'}")
    return done.stdout.decode()


def files_at(rev: str, folder: Path) -> list[Path]:
    """The files of ``folder`` (a folder of this checkout) at git revision ``rev``, as this checkout's paths (a
    revision's kernels: sources added or removed since included or left out); a clear exit where git has none."""
    name = folder.resolve().relative_to(ROOT).as_posix()
    done = _git("ls-tree", "--name-only", f"{rev}:{name}")
    if done.returncode != 0:
        raise SystemExit(f"cannot list {name} at revision {rev!r}: {done.stderr.decode().strip() or 'git failed'}")
    return [folder / line for line in done.stdout.decode().splitlines()]


def commit_of(rev: str) -> str:
    """The commit ``rev`` names; ValueError where there is none (not a checkout, an unknown revision)."""
    if not (ROOT / ".git").exists():
        raise ValueError(f"{ROOT} is not a git checkout of edgespec: revisions need a clone")
    done = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if done.returncode != 0:
        raise ValueError(f"no git revision {rev!r} in {ROOT}")
    return done.stdout.decode().strip()


def write_package(commit: str, folder: Path) -> None:
    """The ``edgespec`` package as ``commit`` has it, written to ``folder / "edgespec"`` with what it reads beside it
    in a checkout (the exporter, ``export/``, and the model manifests, ``models/``), its kernels' sources included."""
    done = _git("archive", "--format=tar", commit, "edgespec", "export", "models")
    if done.returncode != 0:
        raise ValueError(f"cannot read edgespec at {commit}: {done.stderr.decode().strip() or 'git failed'}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(folder, filter="data")
