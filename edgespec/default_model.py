"""Which model ``edgespec.load()`` runs when none is named: measured once per machine, then read back.

The candidates are the default family's variants that pass the quality bar (``ModelFamily.default_candidates``)
and, with onnxruntime installed, an ONNX export of its shipped GGUF; ``edgespec/bench/choose.py`` races them
(with and without n-gram drafting) and stores the fastest lossless one. With ``EDGESPEC_TUNING=off`` (the tests)
nothing is measured: the default is the family's default quantization with n-gram lookup, γ auto.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from . import custom_ops
from .errors import EdgespecError
from .models import DEFAULT_MODEL, families
from .tuning import DefaultChoice, TuningError, default_choice_key, find_default_choice, tuning_enabled

FIXED = DefaultChoice(key={}, target=DEFAULT_MODEL, backend="auto", mode="ngram", gamma="auto",
                      reason="fixed default (EDGESPEC_TUNING is off)", candidates=[], skipped={})


def onnx_identity() -> str | None:
    """What an ONNX candidate's speed depends on beyond the machine: onnxruntime's version, the graph writer's
    revision and the attention op (edgespec's kernel once built); None without onnxruntime."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime

    from .export.onnx_graphs import GRAPHS_REVISION

    return f"{onnxruntime.__version__}, graphs {GRAPHS_REVISION}, {custom_ops.default_attention()} attention"


def current_export(export: Path) -> bool:
    """Whether ``export`` holds an export by today's graph writer (an older one may lack a later fix) with the
    attention op this machine runs best (edgespec's kernel where it can be built, else GroupQueryAttention)."""
    from .export.onnx_graphs import GRAPHS_REVISION
    from .onnx_backend import read_manifest  # here: importing the package loads no concrete backend

    try:
        manifest = read_manifest(export)
    except EdgespecError:  # none there, or unreadable
        return False
    wanted = custom_ops.default_attention() == "exact"
    return manifest["source"].get("graphs") == GRAPHS_REVISION and custom_ops.uses_exact_attention(manifest) == wanted


def choice_key(threads: int, device: str) -> dict[str, object] | None:
    """The key of this machine's choice, or None when the default family's weights are not installed (loading
    the fixed default then says which package to install)."""
    family = families()[DEFAULT_MODEL]
    source = family.source_path()
    if source is None:
        return None
    return default_choice_key(source, family.default_candidates(), onnx_identity(), threads, device)


def default_choice(threads: int, device: str) -> DefaultChoice:
    """The stored choice for this machine, measured now (1.5–2 min, with progress on stderr) if there is
    none; ``FIXED`` when tuning is off."""
    key = choice_key(threads, device) if tuning_enabled() else None
    if key is None:
        return FIXED
    try:
        found = find_default_choice(key)
    except TuningError:
        found = None  # an unreadable or older file: measure again and overwrite it
    # A stored ONNX choice holds while its export does: one deleted, or rewritten since (another op, an older
    # graph writer), is measured again rather than run as if it were what was raced.
    if found is not None and (found.backend != "onnx" or current_export(Path(found.target))):
        return found
    from .bench.choose import choose_default

    return choose_default(families()[DEFAULT_MODEL], key, threads, device)
