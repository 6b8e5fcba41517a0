"""A file of this checkout as another git revision has it: what the benchmarks that compare kernels across revisions
(benchmarks/products_kernel.py, benchmarks/kernels_in_model.py) compile beside the working tree's."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source_at(rev: str, path: Path) -> str:
    """The text of ``path`` (a file of this checkout) at git revision ``rev``; a clear exit where git has none (not
    a checkout, an unknown revision, a file the revision lacks)."""
    if not path.resolve().is_relative_to(ROOT) or not (ROOT / ".git").exists():
        raise SystemExit(f"{path} is not in a git checkout of edgespec: run this from a clone")
    name = path.resolve().relative_to(ROOT).as_posix()
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cannot read {name} at revision {rev!r}: {done.stderr.strip() or 'git failed'}")
    return done.stdout
