"""The repository stays small: its tracked files under 20 MB in all, benchmarks/reference/ under its own budgets,
every reference file named in that folder's index (which says what reads it), and no PNG committed (the bench
and the scripts draw their plots into benchmarks/results/, which git ignores). Historical results live in git history.
Reads `git ls-files`; skipped outside a git checkout of this repository."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "benchmarks/reference/"
INDEX = REFERENCE + "README.md"

TOTAL_BUDGET = 20_000_000  # 20 MB: every tracked file, the shipped draft head's weights (~9.6 MB) included
FILE_BUDGET = 1 << 20  # 1 MiB: any one file under benchmarks/reference/
FOLDER_BUDGET = 5 << 20  # 5 MiB: benchmarks/reference/ as a whole
# A file name the index cites: a backticked name with a data file's extension, no folder, no pattern or ellipsis.
CITED = re.compile(r"`([^`/*{}…\s]+\.(?:json|jsonl|csv|txt|png|npz|gz))`")


def _tracked() -> dict[str, int]:
    """Each tracked file's path (relative to the repository's root, as git names it) and its size in bytes in the
    working tree (a symbolic link's own size, as `du -b` counts it; a tracked file deleted from the tree: left out)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"git is not usable here ({e})")
    if top.returncode or listed.returncode or Path(top.stdout.strip()).resolve() != ROOT:
        pytest.skip(f"{ROOT} is not a git checkout of this repository")
    sizes = {}
    for name in listed.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if name:
            try:
                sizes[name] = os.lstat(ROOT / name).st_size
            except FileNotFoundError:
                continue
    if not sizes:
        pytest.skip("git lists no tracked files here")
    return sizes


def _largest(sizes: dict[str, int], n: int = 10) -> str:
    return "\n".join(f"  {size:>12,} {name}" for name, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:n])


def test_the_tracked_files_stay_under_20_mb() -> None:
    sizes = _tracked()
    total = sum(sizes.values())
    assert total <= TOTAL_BUDGET, (
        f"the repository's {len(sizes)} tracked files hold {total:,} bytes, over the budget of {TOTAL_BUDGET:,} "
        f"(20 MB). The largest:\n{_largest(sizes)}\nKeep results that nothing reads out of the repository (they "
        "live in git history), and write new ones compactly.")


def test_benchmarks_reference_stays_within_its_budgets() -> None:
    reference = {name: size for name, size in _tracked().items() if name.startswith(REFERENCE)}
    assert INDEX in reference, f"{INDEX} (the index of the reference data) is not tracked"
    too_big = {name: size for name, size in reference.items() if size > FILE_BUDGET}
    assert not too_big, (
        f"files in {REFERENCE} over the budget of {FILE_BUDGET:,} bytes (1 MiB) each:\n{_largest(too_big)}\n"
        "Keep what a reader needs (a Spec-Bench result without its per-generation records, say), written compactly.")
    total = sum(reference.values())
    assert total <= FOLDER_BUDGET, (
        f"{REFERENCE} holds {total:,} bytes in {len(reference)} files, over its budget of {FOLDER_BUDGET:,} "
        f"(5 MiB). The largest:\n{_largest(reference)}\nA new result replaces the one it supersedes; earlier ones "
        "live in git history.")


def test_every_reference_file_is_named_in_the_index() -> None:
    reference = sorted(name for name in _tracked() if name.startswith(REFERENCE) and name != INDEX)
    index = (ROOT / INDEX).read_text(encoding="utf-8")
    unnamed = [name for name in reference if f"`{name[len(REFERENCE):]}`" not in index]
    assert not unnamed, (
        f"files in {REFERENCE} that {INDEX} does not name (in backticks, in full), with what reads them:\n  "
        + "\n  ".join(unnamed))
    kept = {name[len(REFERENCE):] for name in reference}
    stale = sorted(set(CITED.findall(index)) - kept)
    assert not stale, f"{INDEX} names files that are not in {REFERENCE}:\n  " + "\n  ".join(stale)


def test_no_png_is_committed() -> None:
    plots = sorted(name for name in _tracked() if name.lower().endswith(".png"))
    assert not plots, (
        "tracked PNG files (plots are drawn by the bench and the scripts into benchmarks/results/, which git "
        "ignores; remove them with `git rm`):\n  " + "\n  ".join(plots))
