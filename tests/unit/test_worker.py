"""The engine worker: a thread that stops never leaves requests waiting, and /health says why."""

from __future__ import annotations

import threading

import pytest
from starlette.testclient import TestClient

from edgespec.engine.engine import Engine
from edgespec.server.app import create_app
from edgespec.server.metrics import Metrics
from edgespec.server.pool import ModelPool
from edgespec.server.worker import FAILED, EngineWorker, InternalError, Job
from tests.fake_backend import BOS, FakeModel, encode, scripted

SEQUENCE = [BOS, *encode("one two three four five six seven eight nine ten " * 3)]


class BrokenMetrics(Metrics):
    """Metrics whose bookkeeping fails: a bug outside any one generation's error handling."""

    def record(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("bookkeeping broke")


def job(ended: list[tuple[str, object]], done: threading.Event) -> Job:
    def on_end(outcome: str, error: object) -> None:
        ended.append((outcome, error))
        done.set()

    return Job(lambda engine, cancelled: engine.stream(SEQUENCE[:10], max_tokens=4, cancel=cancelled),
               lambda _: None, on_end)


def test_a_worker_that_stops_fails_requests_at_once_and_health_says_why() -> None:
    engine = Engine(FakeModel(scripted(SEQUENCE), n_ctx=256), mode="none", gamma=0)
    worker = EngineWorker("m", engine, BrokenMetrics())
    assert worker.ready.wait(30)
    ended: list[tuple[str, object]] = []
    done = threading.Event()
    worker.submit(job(ended, done))
    assert done.wait(30), "the job never ended"
    assert ended[0][0] == FAILED and "cannot serve" in str(ended[0][1])
    assert worker.failure is not None and "bookkeeping broke" in worker.failure
    with pytest.raises(InternalError, match="cannot serve"):
        worker.submit(job([], threading.Event()))
    pool = ModelPool()
    pool._workers["m"] = worker
    health = TestClient(create_app(pool, hosts=None)).get("/health")
    assert health.status_code == 503
    assert health.json()["status"] == "error" and "bookkeeping broke" in health.json()["models"]["m"]["error"]


def test_a_warm_up_that_fails_on_the_disk_leaves_the_worker_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up's generation wrote what the engine learned; an OSError there killed the thread before it served
    anything (every request then hung)."""
    engine = Engine(FakeModel(scripted(SEQUENCE), n_ctx=256), mode="none", gamma=0)
    calls = []

    def first_fails(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        return Engine.generate(engine, *args, **kwargs)

    monkeypatch.setattr(engine, "generate", first_fails)
    worker = EngineWorker("m", engine, Metrics())
    assert worker.ready.wait(30) and worker.failure is None
    ended: list[tuple[str, object]] = []
    done = threading.Event()
    worker.submit(job(ended, done))
    assert done.wait(30) and ended[0][0] == "done"
    worker.close()
