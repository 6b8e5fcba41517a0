"""The README's commands work as written. Every `edgespec` line in its code blocks parses with the real command
line; those that need no network and no long run (help, `models`, short generations) run, as does every Python
block; each `make` target it names exists; each extra it names is in pyproject.toml; each file it links exists.
Runs use EDGESPEC_TUNING=off (as every test): on a fresh clone the first generation without --model measures the
default model once first (1–5 minutes), which tests/model/test_default_choice.py covers."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.cli.main import build_parser
from edgespec.files import tomllib

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
QUICK_MAX_TOKENS = 64


def _blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block, and ("indented", text) of every 4-space indented one."""
    fenced = [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)]
    without = re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)
    indented = [("indented", re.sub(r"^ {4}", "", m[0], flags=re.M))
                for m in re.finditer(r"(?:^ {4}\S.*\n)+", without, re.M) if m.start() == 0 or
                without[m.start() - 2:m.start()] == "\n\n"]
    return fenced + indented


def _shell_lines() -> list[str]:
    lines = []
    for lang, text in _blocks():
        if lang in ("console", "sh", "shell", "bash", "indented"):
            for line in text.replace("\\\n", " ").splitlines():
                line = line.strip()
                if line.startswith((".venv/bin/edgespec", "edgespec ", "make ")):
                    lines.append(line)
    return lines


EDGESPEC = [line for line in _shell_lines() if not line.startswith("make ")]
MAKE = [line for line in _shell_lines() if line.startswith("make ")]
PYTHON = [text for lang, text in _blocks() if lang == "python"]


def _argv(line: str) -> list[str]:
    return shlex.split(line.split(" #", 1)[0])[1:]


def _quick(argv: list[str]) -> bool:
    if "--help" in argv or argv == ["models"]:
        return True
    if argv[0] == "generate" and "--max-tokens" in argv:
        return int(argv[argv.index("--max-tokens") + 1]) <= QUICK_MAX_TOKENS
    return False


def test_the_readme_is_short_and_names_its_commands() -> None:
    assert len(README.splitlines()) < 400
    assert "    make demo\n" in README and "    make test\n" in README  # the two commands, as they were
    assert len(EDGESPEC) >= 6 and any(_quick(_argv(line)) for line in EDGESPEC) and PYTHON


@pytest.mark.parametrize("line", EDGESPEC)
def test_every_edgespec_line_parses(line: str) -> None:
    try:
        build_parser().parse_args(_argv(line))
    except SystemExit as e:  # argparse's way of refusing a command line (0: it printed the help asked for)
        if e.code != 0:
            pytest.fail(f"{line!r} does not parse (exit {e.code})")


@pytest.mark.parametrize("line", [line for line in EDGESPEC if _quick(_argv(line))])
def test_quick_edgespec_lines_run(line: str) -> None:
    argv = _argv(line)
    run = subprocess.run([sys.executable, "-m", "edgespec.cli", *argv], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    if argv[0] == "generate" and "--json" in argv:
        assert json.loads(run.stdout)["text"].strip()
    elif argv[0] == "generate":
        assert run.stdout.strip() and "tok/s decode" in run.stderr


@pytest.mark.parametrize("code", PYTHON)
def test_python_blocks_run(code: str) -> None:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()


@pytest.mark.parametrize("line", MAKE)
def test_make_targets_exist(line: str) -> None:
    run = subprocess.run(["make", "-n", *_argv(line)], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         check=False)
    assert run.returncode == 0, run.stderr


def test_named_extras_exist_and_links_resolve() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = set(re.findall(r"\.\[([a-z-]+)\]", README)) | set(re.findall(r"`(export-hf|server|onnx|bench|dev)`",
                                                                          README))
    assert named and named <= set(extras), named - set(extras)
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", README) if "://" not in link]
    missing = [link for link in links if not (ROOT / link).exists()]
    assert links and not missing, missing
