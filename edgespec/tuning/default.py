"""Which model ``edgespec.load()`` runs when none is named: measured once per machine, then read back.

The candidates are the default family's variants that pass the quality bar (``ModelFamily.default_candidates``)
and, with onnxruntime installed, an ONNX export of its shipped GGUF; ``race`` races them (with and without
n-gram drafting, and the export with its shipped draft head too) and stores the fastest lossless one. With
``EDGESPEC_TUNING=off`` (the tests) nothing is measured: the default is the family's default quantization with
n-gram lookup, γ auto. The stored choice is a cache entry like any other in the home: one that is damaged, names
what edgespec does not know, or whose export cannot be opened is measured again, saying why; a home that cannot
be written gets the fixed default, since nothing measured there could be kept.
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
    found, _ = _stored(key)
    if found is not None:
        return found
    if not writable():
        say_once("fixed default", f"{edgespec_home()} cannot be written: running the fixed default "
                                  f"({DEFAULT_MODEL}, n-gram lookup) without measuring which build is quickest here")
        return dataclasses.replace(FIXED, reason="fixed default (the home cannot be written)")
    for part in ("onnx", "models", "tuning", "exactness"):  # what killed processes left half-written
        sweep(home_dir(part))
    with measuring("default-choice"):
        found, stale = _stored(key)  # measured by another process while this one waited
        if found is not None:
            return found
        return default_race.choose_default(families()[DEFAULT_MODEL], key, threads, device,
                                           why=stale or "first use on this machine")


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
    """The engine of this machine's default (``open_choice`` loads a choice). Where the chosen export is the cache's
    own and cannot be opened (a damaged file), it is removed and the default measured again (exporting it anew)."""
    choice = default_choice(threads, device)
    try:
        return open_choice(choice)
    except ModelLoadError as e:
        export = default_race.onnx_export_path(families()[DEFAULT_MODEL])
        if choice.backend != "onnx" or Path(choice.target) != export:
            raise
        say_once(f"damaged {export}", f"the default's export {export} cannot be opened ({e}): exporting it again")
        default_race.discard_export(export)
    return open_choice(default_choice(threads, device))
