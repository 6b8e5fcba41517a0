"""edgespec: lossless speculative decoding for quantized local LLMs.

    import edgespec
    engine = edgespec.load()    # SmolLM2-135M-Instruct as measured fastest on this machine (first use: 1–5 min)
    out = engine.generate("The capital of France is", max_tokens=32)
    print(out.text, out.stats.decode_tokens_per_s, out.stats.acceptance_rate)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence

from .backends.llamacpp import preload as _preload  # noqa: F401  (first: it loads llama.cpp's library before anything imports numpy)
from .backends.registry import BACKENDS
from .backends.selfcheck import ExactnessWarning, NotExactError
from .catalog.models import DEFAULT_MODEL
from .cpu import physical_cores
from .engine import constraints  # the public way to make a request's constraint (README)
from .engine.engine import MODES, Completion, Engine, StreamChunk
from .engine.sampling import SamplingParams
from .engine.stats import GenerationStats
from .errors import ContextOverflowError, EdgespecError, InvalidParameterError, ModelLoadError, VocabMismatchError
from .loading import open_engine
from .tuning.default import open_default, open_own
from .tuning.own_model import own_gguf
from .tuning.store import DefaultChoice, Tuning
from .version import __version__ as __version__

# The concrete backends load their runtimes (llama.cpp, onnxruntime) on import: only on first use.
_LAZY = {"ContextOptions": "backends.llamacpp.model", "LlamaModel": "backends.llamacpp.model",
         "OnnxModel": "backends.onnx.model"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load(target: str | os.PathLike[str] | None = None, draft: str | os.PathLike[str] | None = None,
         mode: str | None = None, gamma: int | str | None = None, n_ctx: int = 4096, device: str = "cpu",
         n_threads: int | None = None, exact_numerics: bool = True, backend: str = "auto",
         layer_skip: Sequence[int] | None = None, tuning: bool = True, require_exact: bool = False) -> Engine:
    """Load a target model (a name such as ``smollm2-135m:q8_0``, a GGUF path or an ONNX export directory)
    and its drafters.

    Without a ``target`` (and without ``draft``, ``backend``, ``layer_skip`` or fast numerics), the default
    model is the one this machine's first such call measured fastest among the default family's variants
    that pass the quality bar, with and without n-gram drafting, and its ONNX export when onnxruntime is
    installed (``edgespec tune --default``; cached per files, threads, device and CPU). With ``tuning=False``
    or ``EDGESPEC_TUNING=off`` it is fixed instead: ``smollm2-135m`` (the shipped Q4_1) with n-gram γ auto.
    A GGUF of your own (a path, or ``ollama:NAME`` as ``edgespec models`` lists them) gets the same on first use
    with the same arguments left out: edgespec's export of its own blocks, checked and raced against llama.cpp on
    the same file with plain decoding, lookup and token trees, the quickest kept (edgespec/tuning/own_model.py);
    ``backend="llamacpp"`` runs the file on llama.cpp as it is.

    ``mode`` is the default drafter: ``ngram`` (prompt lookup, no second model), ``head`` (lookup, then the
    trained draft head shipped with the model where lookup has nothing or only a one-token match: the default
    model's choice), ``tree`` (a tree of lookup, suffix-trie and recycled-logits candidates verified in one pass),
    ``draft`` (needs ``draft=``, a model with the target's vocabulary), ``layerskip`` / ``hybrid`` (ONNX models: the
    target drafts with some layers skipped; hybrid tries prompt lookup first) or ``none``. ``gamma`` is ``"auto"``
    (chosen each step from measured costs and acceptance) or a fixed number of draft tokens.
    ``exact_numerics`` keeps logits batch-invariant, which greedy losslessness depends on
    (docs/exact-numerics.md). ``backend`` is ``llamacpp``, ``onnx`` or ``auto`` (from the path); ``layer_skip``
    overrides the layers an ONNX model's self-draft skips (default: the calibrated set in its manifest).
    With ``tuning`` (default), what ``edgespec tune`` measured for these files, threads and device
    replaces the start-up calibration, and its chosen mode and γ are the defaults (None) of ``mode``
    and ``gamma``; without a tuning file they are n-gram (or draft) and ``"auto"``.
    On first use per build and device a short probe checks that batched verification gives the target the
    same logits as one-token decoding (``edgespec.backends.selfcheck``); where it does not, edgespec warns once that
    greedy output may drift from target-only decoding, or with ``require_exact`` raises ``NotExactError``.
    """
    def open_chosen(chosen: DefaultChoice) -> Engine:
        return open_engine(chosen.target, None, mode or chosen.mode, chosen.gamma if gamma is None else gamma, n_ctx,
                           device, n_threads, exact_numerics, chosen.backend, None, tuning, require_exact)

    measured = draft is None and backend == "auto" and layer_skip is None and exact_numerics and tuning
    if target is None:
        if measured:
            return open_default(n_threads or physical_cores(), device, open_chosen)
        target = DEFAULT_MODEL
    elif measured and (source := own_gguf(target)) is not None:
        engine = open_own(source, n_threads or physical_cores(), device, open_chosen)
        if engine is not None:
            return engine
    return open_engine(target, draft, mode, gamma, n_ctx, device, n_threads, exact_numerics, backend, layer_skip,
                       tuning, require_exact)


__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "MODES",
    "Completion",
    "ContextOptions",
    "ContextOverflowError",
    "EdgespecError",
    "Engine",
    "ExactnessWarning",
    "GenerationStats",
    "InvalidParameterError",
    "LlamaModel",
    "ModelLoadError",
    "NotExactError",
    "OnnxModel",
    "SamplingParams",
    "StreamChunk",
    "Tuning",
    "VocabMismatchError",
    "constraints",
    "load",
]
