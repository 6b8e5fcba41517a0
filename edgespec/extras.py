"""edgespec's optional extras (pyproject.toml): a package one of them installs, imported where a command needs it,
or one line naming the ``pip install`` that adds it. Every command that needs an extra says it this way."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from .errors import MissingExtraError

_CHECKOUT = Path(__file__).resolve().parents[1]


def _shown(path: Path) -> str:
    """``path`` as a user would type it here: relative to the working directory where it lies under it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)
    return relative if not relative.startswith("..") else str(path)


def install_command(extra: str) -> str:
    """The command that adds ``extra`` to the Python running edgespec: from this checkout where edgespec runs from
    one (a source checkout or an editable install: PyPI's edgespec would be another copy), else from PyPI."""
    pip = f"{_shown(Path(sys.executable))} -m pip install"
    if (_CHECKOUT / "pyproject.toml").is_file():
        return f"{pip} -e '{_shown(_CHECKOUT)}[{extra}]'"
    return f"{pip} 'edgespec[{extra}]'"


def missing(module: str, extra: str, needed_by: str, alternative: str = "") -> MissingExtraError:
    """The error for ``needed_by`` (a command or feature) lacking ``module``, which ``extra`` installs."""
    return MissingExtraError(f"{needed_by} needs {module.split('.')[0]!r}, which is not installed: "
                             f"{install_command(extra)}{alternative}")


def require(module: str, extra: str, needed_by: str) -> ModuleType:
    """``module``, imported, or a ``MissingExtraError`` naming the install that adds it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise missing(e.name or module, extra, needed_by) from e


@contextlib.contextmanager
def needed(extra: str, needed_by: str, alternative: str = "") -> Iterator[None]:
    """For imports of several of an extra's packages (or of edgespec modules that import them): a package missing
    in the block becomes a ``MissingExtraError``. ``alternative`` ends the line (", or pass --no-plots")."""
    try:
        yield
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] in ("edgespec", "export"):
            raise  # one of edgespec's own modules: a broken install, not an extra to add
        raise missing(e.name, extra, needed_by, alternative) from e
