"""The models a server or bridge has loaded: one engine and one worker thread per model name."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, fields, replace

from .. import load
from ..catalog.models import DEFAULT_MODEL
from ..engine.engine import MODES, Engine
from ..engine.prompt_cache import DEFAULT_CACHE_MB
from ..errors import EdgespecError, InvalidParameterError
from .metrics import Metrics
from .worker import EngineWorker


class ModelNotFoundError(EdgespecError):
    """A request named a model that is not loaded."""


@dataclass(frozen=True)
class EngineSpec:
    """What to load, as on the command line: ``draft`` is a mode (``ngram``, ``layerskip``, ``hybrid``,
    ``none``), a draft model name/path or ``auto`` (a local draft model where one pays); None (and ``gamma``
    None) take what ``edgespec tune`` chose, else n-gram lookup with γ auto."""

    model: str | None  # None: the default model (measured on first use, see edgespec.load)
    draft: str | None = None
    mode: str | None = None  # the default mode; None: "draft" with a draft model, else what --draft says
    gamma: int | str | None = None
    ctx: int = 4096
    threads: int | None = None
    device: str = "cpu"
    fast_numerics: bool = False
    backend: str = "auto"
    cache_mb: float = DEFAULT_CACHE_MB  # saved conversation states (edgespec/engine/prompt_cache.py)
    require_exact: bool = False

    @property
    def name(self) -> str:
        """What clients call the model."""
        return self.model or DEFAULT_MODEL

    def load_engine(self) -> Engine:
        if self.draft == "auto":  # a draft model only where it measurably pays here (catalog/pairing.py)
            from ..catalog.pairing import choose_draft

            choice = choose_draft(self.name, self.threads, self.device)
            print(f"edgespec: --draft auto: {choice.reason}", file=sys.stderr)
            return replace(self, draft=choice.draft, mode=self.mode or choice.mode).load_engine()
        has_draft = self.draft is not None and self.draft not in MODES
        engine = load(self.model, draft=self.draft if has_draft else None,
                      mode=self.mode or ("draft" if has_draft else self.draft), gamma=self.gamma,
                      n_ctx=self.ctx, n_threads=self.threads, device=self.device,
                      exact_numerics=not self.fast_numerics, backend=self.backend, require_exact=self.require_exact)
        try:
            engine.prompt_cache.resize(self.cache_mb)
        except EdgespecError:
            engine.close()
            raise
        return engine

    def load_worker(self, metrics: Metrics, max_queue: int) -> EngineWorker:
        return EngineWorker(self.name, self.load_engine(), metrics, max_queue)


class ModelPool:
    def __init__(self, max_queue: int = 16) -> None:
        if max_queue < 1:
            raise InvalidParameterError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self.metrics = Metrics()
        self._workers: dict[str, EngineWorker] = {}
        self._specs: dict[str, EngineSpec] = {}  # what each was loaded with
        self._lock = threading.Lock()

    def load(self, spec: EngineSpec) -> EngineWorker:
        """Load a model under its name; loading a name again returns the engine already there, if asked for with
        the settings it was loaded with (others would be ignored, so they are refused)."""
        with self._lock:  # held while loading: two clients loading one name must not get two engines
            if spec.name not in self._workers:
                self._workers[spec.name] = spec.load_worker(self.metrics, self.max_queue)
                self._specs[spec.name] = spec
            loaded = self._specs[spec.name]
            differ = [f.name for f in fields(spec) if f.name != "model" and
                      getattr(spec, f.name) != getattr(loaded, f.name)]
            if differ:
                had = ", ".join(f"{name}={getattr(loaded, name)!r}" for name in differ)
                asked = ", ".join(f"{name}={getattr(spec, name)!r}" for name in differ)
                raise InvalidParameterError(f"{spec.name!r} is already loaded with {had}; loading it again cannot "
                                            f"change that (asked: {asked})")
            return self._workers[spec.name]

    def get(self, name: str | None) -> EngineWorker:
        """The named model; with no name, the only (or first) one loaded."""
        with self._lock:
            if name is None and self._workers:
                return next(iter(self._workers.values()))
            if name in self._workers:
                return self._workers[name]
            loaded = ", ".join(self._workers) or "none"
        raise ModelNotFoundError(f"model {name!r} is not loaded (loaded: {loaded})" if name is not None else
                                 "no model is loaded; send a load command first")

    def spec(self, name: str) -> EngineSpec:
        """What the model loaded under ``name`` was loaded with."""
        with self._lock:
            return self._specs[name]

    @property
    def workers(self) -> list[EngineWorker]:
        with self._lock:
            return list(self._workers.values())

    def gauges(self) -> dict[str, dict[str, int]]:
        """Each model's current values for /metrics and the bridge's stats (metrics._GAUGES)."""
        return {w.name: {"queue_depth": w.depth, "prompt_cache_bytes": w.engine.prompt_cache.nbytes}
                for w in self.workers}

    def cancel_all(self) -> None:
        for w in self.workers:
            w.cancel_all()

    def close(self) -> None:
        with self._lock:
            workers, self._workers, self._specs = list(self._workers.values()), {}, {}
        for w in workers:
            w.close()
