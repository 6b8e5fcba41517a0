"""Where edgespec keeps what it makes and measures: ``$EDGESPEC_HOME``, default ``~/.cache/edgespec`` (the Makefile
keeps its llama.cpp wheels there too, under ``wheels/``).

The home is a cache. Everything in it (prepared variants, exports, kernels, measured choices, curves, learned
state) can be made again, so any entry may be missing, stale, damaged, half-written or unwritable and the runtime
still runs: records are written atomically (``files.staged``) through ``keep``, which carries on without keeping
when the home cannot be written (one line per process, not per request); a record that cannot be read, or has the
wrong shape, is read as absent by ``read_record`` (one line saying it is measured again); ``sweep`` removes the
temporaries of processes that died mid-write; ``measuring`` keeps two processes from measuring the same thing at
once. Paths recorded inside the home are relative to it (``relative`` / ``resolve``), so a home copied or moved
elsewhere still finds its own files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import shutil
import sys
import tempfile
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
_said: set[str] = set()
# files.staged's temporaries: ".NAME.TAGPID" beside the file or folder being written.
_STAGED = re.compile(r"^\.(?P<name>.+)\.[a-z]+(?P<pid>\d+)$")


def edgespec_home() -> Path:
    return Path(os.environ.get("EDGESPEC_HOME") or Path.home() / ".cache" / "edgespec")


def home_dir(name: str) -> Path:
    """One part of the home (``models``, ``onnx``, ``tuning``, ``exactness``, ...); not created here: writers create
    what they write (``files.staged``), readers find nothing."""
    return edgespec_home() / name


def downloads_dir() -> Path:
    """Files fetched from the network, each checked against a pinned SHA-256 and fetched once."""
    return home_dir("downloads")


def say_once(key: str, message: str) -> None:
    """One line on stderr, once per process for ``key``: a server must not repeat it on every request."""
    if key not in _said:
        _said.add(key)
        print(f"edgespec: {message}", file=sys.stderr, flush=True)


def unwritable(e: OSError) -> bool:
    """An error that says the home cannot take a write now (read-only, full, not ours), not a bug."""
    return e.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM)


def writable() -> bool:
    """Whether the home can take a new file now (a full disk is found only when writing: ``keep``)."""
    home = edgespec_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=home):
            return True
    except OSError:
        return False


def keep(path: Path, write: Callable[[Path], None]) -> bool:
    """Run ``write(path)`` (an atomic writer of a file in the home); False, with one line per process, when the
    home cannot be written (read-only, full): what was measured serves this process and is measured again by the
    next. Other errors are raised."""
    try:
        write(path)
    except OSError as e:
        if not unwritable(e):
            raise
        say_once("unwritable", f"cannot write to {edgespec_home()} ({e.strerror or e}): running without keeping what "
                               "is measured (make it writable, free space, or set EDGESPEC_HOME to another folder)")
        return False
    return True


def read_record(path: Path, parse: Callable[[dict], T], then: str = "measuring again") -> T | None:
    """A JSON record of the home parsed by ``parse``: None when there is none, and None too, with one line saying so
    and what happens ``then``, when it cannot be read or ``parse`` refuses its shape (``ValueError``, ``TypeError``,
    ``KeyError``, ``AttributeError``): the caller measures it again and overwrites it."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        say_once(f"unreadable {path}", f"cannot read {path} ({e.strerror or e}): {then}")
        return None
    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise TypeError(f"a JSON {type(value).__name__}, not an object")
        return parse(value)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        say_once(f"damaged {path}", f"{path} is damaged ({str(e)[:120]}): {then}")
        return None


def fields_of(cls: type[T], d: dict[str, Any]) -> T:
    """A dataclass of the home's records from its JSON fields, each of its annotated type (``int``, ``float``,
    ``str``, ``bool``, ``dict``, ``list``, unions of those and None); ``TypeError`` for a missing, unknown or
    mistyped field, so that a record of the wrong shape reads as damaged rather than failing later."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise TypeError(f"unknown field {unknown[0]!r}")
    for name, f in fields.items():
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"no {name!r}")
        elif not _is(d[name], hints[name]):
            raise TypeError(f"{name!r} is {json.dumps(d[name])[:40]}, not {hints[name]}")
    return cls(**d)


def _is(value: object, hint: object) -> bool:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_is(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin = typing.get_origin(hint) or hint
    return isinstance(value, origin)  # type: ignore[arg-type]


_IN_HOME = "$EDGESPEC_HOME/"


def relative(path: str) -> str:
    """``path`` as recorded in the home: ``$EDGESPEC_HOME/...`` where it lies inside the home, else as it is (a
    model's name, a file of the user's)."""
    with contextlib.suppress(ValueError, OSError):
        return _IN_HOME + Path(path).resolve().relative_to(edgespec_home().resolve()).as_posix()
    return path


def resolve(recorded: str) -> str:
    """A path ``relative`` recorded, back as a path of this home."""
    return os.fspath(edgespec_home() / recorded[len(_IN_HOME):]) if recorded.startswith(_IN_HOME) else recorded


def sweep(folder: Path, name: str | None = None) -> None:
    """Remove what processes that died mid-write left in ``folder`` (of ``name`` only, if given): ``files.staged``'s
    temporaries whose process is gone (a killed export's folder can be hundreds of MB)."""
    try:
        entries = list(folder.glob(f".{name}.*") if name else folder.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _STAGED.match(entry.name)
        if match and (name is None or match["name"] == name) and not _alive(int(match["pid"])):
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


@contextlib.contextmanager
def measuring(name: str) -> Iterator[None]:
    """Held while one process measures ``name`` (the default's race, an export): a second process waits here, then
    finds the first's result. Without a writable home there is no lock, and nothing kept to share either."""
    path = home_dir("locks") / f"{name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = path.open("a")
    except OSError:
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
