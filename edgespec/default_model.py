"""Which model ``edgespec.load()`` runs when none is named: measured once per machine, then read back.

The candidates are the default family's variants that pass the quality bar (``ModelFamily.default_candidates``)
and, with onnxruntime installed, an ONNX export of its shipped GGUF; ``default_race`` races them (with and without
n-gram drafting, and the export with its shipped draft head too) and stores the fastest lossless one. With
``EDGESPEC_TUNING=off`` (the tests) nothing is measured: the default is the family's default quantization with
n-gram lookup, γ auto.
"""

from __future__ import annotations

from . import default_race
from .models import DEFAULT_MODEL, families
from .tuning import DefaultChoice, TuningError, find_default_choice, tuning_enabled

FIXED = DefaultChoice(key={}, target=DEFAULT_MODEL, backend="auto", mode="ngram", gamma="auto",
                      reason="fixed default (EDGESPEC_TUNING is off)", candidates=[], skipped={})


def default_choice(threads: int, device: str) -> DefaultChoice:
    """The stored choice for this machine, measured now if there is none (1–5 min on 2 cores, said first, with
    progress on stderr); ``FIXED`` when tuning is off."""
    key = default_race.choice_key(threads, device) if tuning_enabled() else None
    if key is None:
        return FIXED
    try:
        found = find_default_choice(key)
    except TuningError:
        found = None  # an unreadable or older file: measure again and overwrite it
    if found is not None and default_race.choice_holds(found):  # else measured again, not run as if raced
        return found
    return default_race.choose_default(families()[DEFAULT_MODEL], key, threads, device)
