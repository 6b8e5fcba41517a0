"""Concurrency and faults on a live server: 8 streaming clients, a full queue, a client killed mid-stream."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from edgespec.engine.engine import Engine
from tests.live import LiveServer, child_env

TOPICS = ["cats", "the sea", "bread", "winter", "trains", "music", "gardens", "the moon"]
N = 24


def _stream_chat(url: str, content: str) -> tuple[str, str]:
    """One streaming chat request read to the end: (text, finish_reason)."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": N, "temperature": 0, "stream": True}
    text, finish = [], ""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        choice = json.loads(line[6:])["choices"][0]
        text.append(choice["delta"].get("content", ""))
        finish = choice["finish_reason"] or finish
    return "".join(text), finish


def test_eight_concurrent_streams_match_their_solo_output(server: LiveServer, solo_engine: Engine) -> None:
    prompts = [f"Write one sentence about {t}." for t in TOPICS]
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(_stream_chat, server.url, p) for p in prompts]
        results = [f.result(timeout=180) for f in futures]
    for prompt, (text, finish) in zip(prompts, results, strict=True):
        solo = solo_engine.chat([{"role": "user", "content": prompt}], max_tokens=N, mode="none", gamma=0)
        assert (text, finish) == (solo.text, solo.finish_reason)
    assert server.metric('edgespec_queue_depth{model="smollm2-135m"}') == 0


@pytest.fixture
def one_slot() -> Iterator[LiveServer]:
    with LiveServer.start("--max-queue", "1", "--gamma", "4") as s:
        yield s


# A client that streams a long completion, says so on stdout, and then waits to be killed.
_KILLED_CLIENT = """
import httpx, sys
body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 3000, "temperature": 0, "stream": True}
with httpx.stream("POST", sys.argv[1] + "/v1/completions", json=body, timeout=120) as r:
    for line in r.iter_lines():
        if line.startswith("data: "):
            print("streaming", flush=True)
            sys.stdin.read()
"""


def _wait_for(condition: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_full_queue_429_and_killed_client_frees_its_slot(one_slot: LiveServer) -> None:
    depth = 'edgespec_queue_depth{model="smollm2-135m"}'
    killed = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, one_slot.url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=child_env())
    try:
        assert killed.stdout is not None and killed.stdout.readline() == b"streaming\n"
        # The worker is busy with it: one more request may wait, the next is turned away.
        waiting: dict[str, object] = {}
        body = {"prompt": "Hello", "max_tokens": 8, "temperature": 0}

        def wait_in_queue() -> None:
            waiting["response"] = httpx.post(one_slot.url + "/v1/completions", json=body, timeout=60)
            waiting["at"] = time.monotonic()

        waiter = threading.Thread(target=wait_in_queue)
        waiter.start()
        assert _wait_for(lambda: one_slot.metric(depth) == 2, 10)
        rejected = httpx.post(one_slot.url + "/v1/completions", json=body, timeout=10)
        assert rejected.status_code == 429 and int(rejected.headers["Retry-After"]) >= 1
        assert rejected.json()["error"]["code"] == "queue_full"
        killed_at = time.monotonic()
        killed.kill()
        waiter.join(30)
    finally:
        killed.kill()
        killed.wait()
    # The killed stream (3000 tokens, ~40 s) was cancelled within a step: the waiting request ran next.
    response = waiting["response"]
    assert isinstance(response, httpx.Response) and response.status_code == 200
    assert waiting["at"] - killed_at < 5  # type: ignore[operator]
    assert one_slot.metric('edgespec_requests_total{model="smollm2-135m",outcome="cancelled"}') == 1
    assert one_slot.metric('edgespec_requests_total{model="smollm2-135m",outcome="rejected"}') == 1
    assert one_slot.metric('edgespec_generated_tokens_total{model="smollm2-135m"}') < 1000
    assert _wait_for(lambda: one_slot.metric(depth) == 0, 5)


def test_client_gone_while_queued_leaves_the_queue(one_slot: LiveServer) -> None:
    depth = 'edgespec_queue_depth{model="smollm2-135m"}'
    long = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 3000, "temperature": 0, "stream": True}
    with httpx.stream("POST", one_slot.url + "/v1/completions", json=long, timeout=60) as running:
        lines = running.iter_lines()  # kept: a dropped iterator would close the stream
        next(lines)
        assert one_slot.metric(depth) == 1
        # A queued request whose client gives up (timeout) must not keep its place.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(one_slot.url + "/v1/completions", json={**long, "stream": False}, timeout=1.5)
        assert _wait_for(lambda: one_slot.metric(depth) == 1, 5)
    assert _wait_for(lambda: one_slot.metric(depth) == 0, 5)
    assert one_slot.metric('edgespec_requests_total{model="smollm2-135m",outcome="cancelled"}') == 2


def test_graceful_shutdown_finishes_in_flight_stream() -> None:
    with LiveServer.start("--gamma", "4") as s:
        body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 40, "temperature": 0, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            assert s.stop() == 0  # SIGINT while streaming: the stream completes, then the server exits
            rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_graceful_shutdown_cancels_what_cannot_finish_with_a_proper_ending() -> None:
    with LiveServer.start("--gamma", "4", "--shutdown-timeout", "1") as s:
        body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 3000, "temperature": 0, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            started = time.monotonic()
            assert s.stop() == 0
            assert time.monotonic() - started < 10
            rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["error"]["code"] == "cancelled"
