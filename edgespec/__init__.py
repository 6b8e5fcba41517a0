"""edgespec: lossless speculative decoding for quantized local LLMs.

    import edgespec
    engine = edgespec.load()    # SmolLM2-135M-Instruct as measured fastest on this machine (first use: ~2 min)
    out = engine.generate("The capital of France is", max_tokens=32)
    print(out.text, out.stats.decode_tokens_per_s, out.stats.acceptance_rate)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence

from . import _preload  # noqa: F401  (first: it loads llama.cpp's library before anything imports numpy)
from .backends import BACKENDS, ModelOptions, open_model
from .cpu import physical_cores
from .default_model import default_choice
from .engine import MODES, Completion, Engine, StreamChunk
from .errors import (
    ContextOverflowError,
    EdgespecError,
    InvalidParameterError,
    ModelLoadError,
    VocabMismatchError,
)
from .exactness import ExactnessWarning, NotExactError, enforce
from .exactness import check as check_exactness
from .models import DEFAULT_MODEL
from .sampling import SamplingParams
from .stats import GenerationStats
from .tuning import StoredCurve, Tuning, find_tuning

__version__ = "0.1.0"
# The concrete backends load their runtimes (llama.cpp, onnxruntime) on import: only on first use.
_LAZY = {"ContextOptions": "llama_backend", "LlamaModel": "llama_backend", "OnnxModel": "onnx_backend"}


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

    ``mode`` is the default drafter: ``ngram`` (prompt lookup, no second model), ``draft`` (needs
    ``draft=``, a model with the target's vocabulary), ``layerskip`` / ``hybrid`` (ONNX models: the target
    drafts with some layers skipped; hybrid tries prompt lookup first) or ``none``. ``gamma`` is ``"auto"``
    (chosen each step from measured costs and acceptance) or a fixed number of draft tokens.
    ``exact_numerics`` keeps logits batch-invariant, which greedy losslessness depends on (README, "Exact
    numerics"). ``backend`` is ``llamacpp``, ``onnx`` or ``auto`` (from the path); ``layer_skip`` overrides
    the layers an ONNX model's self-draft skips (default: the calibrated set in its manifest).
    With ``tuning`` (default), what ``edgespec tune`` measured for these files, threads and device
    replaces the start-up calibration, and its chosen mode and γ are the defaults (None) of ``mode``
    and ``gamma``; without a tuning file they are n-gram (or draft) and ``"auto"``.
    On first use per build and device a short probe checks that batched verification gives the target the
    same logits as one-token decoding (``edgespec.exactness``); where it does not, edgespec warns once that
    greedy output may drift from target-only decoding, or with ``require_exact`` raises ``NotExactError``.
    """
    if target is None:
        if draft is None and backend == "auto" and layer_skip is None and exact_numerics and tuning:
            chosen = default_choice(n_threads or physical_cores(), device)
            target, backend = chosen.target, chosen.backend
            mode, gamma = mode or chosen.mode, chosen.gamma if gamma is None else gamma
        else:
            target = DEFAULT_MODEL
    options = ModelOptions(n_ctx=n_ctx, n_threads=n_threads, device=device, exact_numerics=exact_numerics,
                           layer_skip=layer_skip)
    target_model = open_model(target, backend, options)
    try:
        enforce(check_exactness(target_model, device, exact_numerics), require_exact, target_model.path.name)
        draft_model = open_model(draft, backend, options) if draft is not None else None
    except BaseException:
        target_model.close()
        raise
    try:
        tuned = (find_tuning(target_model.path, draft_model.path if draft_model else None, target_model.n_threads,
                             device) if tuning and exact_numerics else None)
        if tuned is not None:
            mode = mode or tuned.mode
            gamma = tuned.gamma if gamma is None else gamma
        stored = (StoredCurve.find(target_model.path, target_model.n_threads, device) if tuning and exact_numerics
                  else None)
        return Engine(target_model, draft_model, mode=mode, gamma="auto" if gamma is None else gamma, tuning=tuned,
                      stored_curve=stored)
    except BaseException:
        target_model.close()
        if draft_model is not None:
            draft_model.close()
        raise


__all__ = [
    "BACKENDS", "DEFAULT_MODEL", "MODES", "Completion", "ContextOptions", "ContextOverflowError", "EdgespecError",
    "Engine", "ExactnessWarning", "GenerationStats", "InvalidParameterError", "LlamaModel", "ModelLoadError",
    "NotExactError", "OnnxModel", "SamplingParams", "StreamChunk", "Tuning", "VocabMismatchError", "load",
]
