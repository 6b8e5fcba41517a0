"""What the repository says points somewhere real, and keeps its history in one place.

Every path a doc, comment, docstring or message names (``edgespec/engine/arena.py``, ``docs/kernels.md``,
``benchmarks/soak.py``, a glob of reference files) exists; every ``FILE.md#anchor``, and every section named as
README's or a doc's in quotes, is a heading there. The manual, the code and the tests hold no dates, commit ids,
tracker numbers or paths outside the repository: those belong to the history pages under docs/ (and the commit
log); the kept results' file names say what was measured and where, not when."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".py", ".md", ".cc", ".h", ".toml", ".java", ".kt", ".sh", ".txt", ""}
HISTORY = "docs/history/"
# Outputs and scratch that the tools write and git ignores: named as where things go, not as things that exist.
WRITTEN = ("benchmarks/results", "tests/artifacts", "edgespec/_models")

PATH = re.compile(r"(?<![\w./~$-])((?:edgespec|export|tests|docs|benchmarks|models|android_demo)/[\w./*{},-]*[\w*}])")
ANCHOR = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.md)#([\w-]+)")
SECTION = re.compile(r"""\b(README|docs/[\w-]+\.md)(?:'s)?,? ["“]([^"”]+)["”]""")
DATE = re.compile(r"\b20\d\d-[01]\d(?:-[0-3]\d)?\b")
TRACKER = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)
COMMIT = re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}\b")
# What lies beside the repository, each name written so that the pattern does not match its own text: this file is
# checked like any other.
OUTSIDE = re.compile(r"measured[-]facts|\.\./shared\b|/work[/]")
RULES = {"date": DATE, "tracker number": TRACKER, "commit id": COMMIT, "path outside the repository": OUTSIDE}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    # .ci/ is the checkout's CI, which runs beside the repository and may name what is there
    return [f for f in out.splitlines() if Path(f).suffix in SUFFIXES and (ROOT / f).is_file()
            and not f.startswith(("benchmarks/reference/", ".ci/"))]


def _text(name: str) -> str:
    try:
        return (ROOT / name).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""


def _alternatives(pattern: str) -> list[str]:
    """``a{b,c}d`` → ``abd``, ``acd`` (shell braces, as the docs write families of files)."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    return list(itertools.chain.from_iterable(
        _alternatives(pattern[:match.start()] + option + pattern[match.end():]) for option in match[1].split(",")))


def _exists(pointer: str) -> bool:
    for option in _alternatives(pointer.rstrip(".,")):
        if "*" in option:
            if not any(ROOT.glob(option)):
                return False
        elif not ((ROOT / option).exists() or (ROOT / f"{option}.py").exists()):
            return False
    return True


def _headings(doc: str) -> list[str]:
    return [line.lstrip("#").strip() for line in _text(doc).splitlines() if line.startswith("#")]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_named_path_exists() -> None:
    stale = []
    for name in _tracked():
        if name.startswith(HISTORY):
            continue
        for number, line in enumerate(_text(name).splitlines(), 1):
            for pointer in PATH.findall(line):
                template = "{" in pointer and "," not in pointer  # an f-string's field, or a placeholder
                if template or "<" in pointer or pointer.startswith(WRITTEN) or _exists(pointer):
                    continue
                stale.append(f"{name}:{number}: {pointer}")
    assert not stale, "pointers to nothing:\n" + "\n".join(stale)


def test_every_named_section_exists() -> None:
    stale = []
    for name in _tracked():
        if name.startswith(HISTORY):
            continue
        folder = Path(name).parent
        for number, line in enumerate(_text(name).splitlines(), 1):
            for doc, anchor in ANCHOR.findall(line):
                target = doc if (ROOT / doc).is_file() else str(folder / doc)
                if (ROOT / target).is_file() and anchor not in {_slug(h) for h in _headings(target)}:
                    stale.append(f"{name}:{number}: {doc}#{anchor}")
            for doc, section in SECTION.findall(line):
                target = "README.md" if doc == "README" else doc
                if not any(h.lower().startswith(section.lower()) for h in _headings(target)):
                    stale.append(f"{name}:{number}: {doc}, \"{section}\"")
    assert not stale, "sections that are not there:\n" + "\n".join(stale)


def _broken(rule: str, text: str) -> list[str]:
    """``NUMBER: HIT`` for each line of ``text`` that holds what ``rule`` keeps in the history pages."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        hits = [m for m in RULES[rule].findall(line) if rule != "commit id" or not _is_data(line)]
        if hits:
            found.append(f"{number}: {hits[0]}")
    return found


@pytest.mark.parametrize("rule", RULES)
def test_history_stays_in_docs_history(rule: str) -> None:
    found = [f"{name}:{hit}" for name in _tracked() if not name.startswith((HISTORY, "benchmarks/"))
             for hit in _broken(rule, _text(name))]
    assert not found, f"a {rule} outside {HISTORY}:\n" + "\n".join(found)


def test_each_rule_finds_what_it_keeps_out() -> None:
    """Each case is put together from parts, so that this file holds none of them."""
    cases = [("date", "2024-" + "05-01"), ("tracker number", "issue #" + "12"), ("commit id", "1c58" + "fc8"),
             *(("path outside the repository", hit) for hit in
               (".." + "/shared", "/wo" + "rk/", "measured" + "-facts"))]
    for rule, hit in cases:
        assert _broken(rule, f"fine\nsee {hit}, then\n") == [f"2: {hit}"], rule
    assert not _broken("commit id", "sha256 " + "1c58" + "fc8")  # a digest, not a revision


def _is_data(line: str) -> bool:
    """Hex that is data, not a revision: digests and ids the code computes or compares."""
    return bool(re.search(r"sha256|digest|hexdigest|SHA256|tool_call_id|\"id\"", line))
