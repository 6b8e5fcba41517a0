"""One engine, one thread: generations wait in a bounded FIFO queue and run one at a time.

An ``Engine`` holds one KV arena and is not thread-safe, so every use of it goes through its worker.
Callers hand in a ``Job`` (how to start the stream, where its chunks go) and may cancel it at any
time: a waiting job leaves the queue at once, a running one stops after the current decode step (or the
current chunk of its prompt's prefill).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..engine.engine import Engine, StreamChunk
from ..errors import ContextOverflowError, EdgespecError, InvalidParameterError
from .memory import give_back_free_memory, limit_arenas
from .metrics import Metrics

log = logging.getLogger("edgespec.server")

DONE, CANCELLED, FAILED = "done", "cancelled", "error"
CLIENT_ERROR = "client_error"  # counted apart from FAILED: a bad request is not a server fault


class QueueFullError(EdgespecError):
    """Too many generations are waiting for this model; try again after ``retry_after`` seconds."""

    def __init__(self, model: str, retry_after: int) -> None:
        super().__init__(f"the queue for {model!r} is full; retry in {retry_after} s")
        self.retry_after = retry_after


class InternalError(EdgespecError):
    """A bug: reported to the client as a plain message, with the traceback kept in the server log."""


@dataclass(eq=False)
class Job:
    """One generation. ``on_end(outcome, error)`` is called exactly once, from the worker thread or ``cancel``.
    ``start(engine, cancelled)`` begins the stream; the engine stops a long prefill when ``cancelled`` is set."""

    start: Callable[[Engine, threading.Event], Iterator[StreamChunk]]
    on_chunk: Callable[[StreamChunk], None]
    on_end: Callable[[str, EdgespecError | None], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


class EngineWorker:
    def __init__(self, name: str, engine: Engine, metrics: Metrics, max_queue: int = 16) -> None:
        self.name, self.engine, self.metrics, self.max_queue = name, engine, metrics, max_queue
        self.ready = threading.Event()
        self._pending: deque[Job] = deque()
        self._running: Job | None = None
        self._stopping = False
        self._cond = threading.Condition()
        self._mean_job_s = 1.0  # running mean of job durations, for Retry-After
        self.failure: str | None = None  # why the worker thread stopped serving, if it did
        limit_arenas()
        self._thread = threading.Thread(target=self._serve, name=f"edgespec-{name}", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting plus the one running."""
        with self._cond:
            return len(self._pending) + (self._running is not None)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self.failure is not None:
                raise InternalError(f"model {self.name!r} cannot serve: {self.failure}; see the server log")
            if self._stopping:
                raise EdgespecError(f"model {self.name!r} is shutting down")
            if len(self._pending) >= self.max_queue:
                self.metrics.count_request(self.name, "rejected")
                # A place opens when the running generation ends: about one mean generation from now.
                raise QueueFullError(self.name, max(1, math.ceil(self._mean_job_s)))
            self._pending.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        job.cancelled.set()
        with self._cond:
            waiting = job in self._pending
            if waiting:
                self._pending.remove(job)
        if waiting:  # never started: end it here; a running job ends in the worker after this step
            self.metrics.count_request(self.name, CANCELLED)
            job.on_end(CANCELLED, None)

    def _fail_pending(self) -> None:
        with self._cond:
            jobs, self._running = [*self._pending, *([self._running] if self._running else [])], None
            self._pending.clear()
        for job in jobs:
            self.metrics.count_request(self.name, FAILED)
            job.on_end(FAILED, InternalError(f"model {self.name!r} cannot serve: {self.failure}"))

    def cancel_all(self) -> None:
        with self._cond:
            jobs = [*self._pending, *([self._running] if self._running else [])]
        for job in jobs:
            self.cancel(job)

    def close(self, timeout: float = 30.0) -> None:
        """Cancel everything queued or running, stop the thread and free the model."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self.cancel_all()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.engine.close()

    # -- the worker thread ----------------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            # The first generation with γ "auto" measures the verify-cost curve (seconds): do it now,
            # not on a client's time. A failure here is the first request's to meet, not the worker's end.
            self.engine.generate("Hello", max_tokens=2)
        except Exception as e:  # logged; the worker serves on
            log.warning("warm-up of %s failed: %s", self.name, e)
        self.ready.set()
        try:
            while (job := self._next()) is not None:
                started = time.perf_counter()
                self._run(job)
                self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (time.perf_counter() - started)
        except BaseException as e:  # a bug outside any one job's handling: say so, never leave requests waiting
            log.exception("the worker of %s stopped", self.name)
            self.failure = f"the worker stopped: {type(e).__name__}: {e}"
            self._fail_pending()

    def _next(self) -> Job | None:
        with self._cond:
            self._running = None
            while not self._pending and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            self._running = self._pending.popleft()
            return self._running

    def _run(self, job: Job) -> None:
        outcome, error, stats, n_tokens = CANCELLED, None, None, 0
        try:
            if not job.cancelled.is_set():
                stream = job.start(self.engine, job.cancelled)
                try:
                    for chunk in stream:
                        n_tokens += len(chunk.tokens)
                        job.on_chunk(chunk)
                        if chunk.stats is not None:
                            outcome, stats = DONE, chunk.stats
                        elif job.cancelled.is_set():
                            break
                finally:
                    stream.close()  # stops the engine's loop and leaves the arena reusable
        except EdgespecError as e:
            outcome, error = FAILED, e
        except Exception:  # a bug must neither reach the client as a traceback nor kill the worker
            log.exception("generation on %s failed", self.name)
            outcome, error = FAILED, InternalError("internal error while generating; see the server log")
        counted = CLIENT_ERROR if isinstance(error, InvalidParameterError | ContextOverflowError) else outcome
        self.metrics.record(self.name, counted, stats, n_tokens)
        job.on_end(outcome, error)
        give_back_free_memory()
