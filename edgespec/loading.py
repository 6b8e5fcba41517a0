"""Opening a named model and its drafters into an ``Engine``: what ``edgespec.load`` does once the model is known.
The default model's race (``tuning/race.py``) loads its candidates through here, so it needs nothing of the package
that asks it for the default."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .backends.registry import ModelOptions, open_model
from .backends.selfcheck import check as check_exactness
from .backends.selfcheck import enforce
from .engine.engine import Engine
from .tuning.store import StoredCurve, find_tuning


def open_engine(target: str | os.PathLike[str], draft: str | os.PathLike[str] | None = None, mode: str | None = None,
                gamma: int | str | None = None, n_ctx: int = 4096, device: str = "cpu", n_threads: int | None = None,
                exact_numerics: bool = True, backend: str = "auto", layer_skip: Sequence[int] | None = None,
                tuning: bool = True, require_exact: bool = False) -> Engine:
    """``edgespec.load`` for a given ``target`` (its docstring says what each argument does)."""
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
