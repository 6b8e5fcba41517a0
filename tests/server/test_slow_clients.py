"""Slow, stuck and careless clients against a live `edgespec bridge` and `edgespec serve`.

No client holds up the others (a bridge client that stops reading), every request can be cancelled (during a
long prefill too), half-sent requests are timed out, and a client that disconnects mid-upload is not a
server error. Everything runs against real subprocesses on the real model, over real sockets.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgespec.engine.arena import PREFILL_CHUNK
from edgespec.engine.engine import Engine
from tests.live import ROOT, LiveServer, child_env, edgespec_command, free_port
from tests.server.test_bridge import BRIDGE, ENDINGS, PROMPT, Lines, listening_bridge


def _read_events(conn: socket.socket, rid: object, timeout: float) -> list[dict]:
    """Events of request ``rid`` up to its ending one, read from a bridge connection within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    buffer, events = b"", []
    while True:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        data = conn.recv(1 << 16)
        assert data, "the bridge closed the connection"
        buffer += data
        *done, buffer = buffer.split(b"\n")
        for line in done:
            event = json.loads(line)
            if event.get("id") == rid:
                events.append(event)
                if event["event"] in ("stats", "cancelled", "error", "metrics"):
                    return events


def _closed_within(conn: socket.socket, timeout: float) -> bool:
    """Whether the peer closes ``conn`` within ``timeout`` s (what it sent before is read and dropped)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            if not conn.recv(1 << 20):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def test_a_bridge_client_that_stops_reading_stalls_no_other_session(solo_engine: Engine) -> None:
    """The issue's reproduction: one client asks for a long generation and 60,000 stats and never reads; another
    session's generation runs as if it were alone, and the stuck client is disconnected once it is MAX_BACKLOG
    behind."""
    port = free_port()
    with listening_bridge("--port", str(port), address=f"tcp:127.0.0.1:{port}") as proc, \
            socket.create_connection(("127.0.0.1", port), timeout=60) as stuck, \
            socket.create_connection(("127.0.0.1", port), timeout=60) as other:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        lines = [json.dumps({"id": "long", "cmd": "generate", "prompt": PROMPT, "max_tokens": 3000})]
        # The 20,000 answers (~8 MB) fit MAX_BACKLOG plus what the kernel's socket buffers absorb (up to
        # ~4 MB sending) only just: under load the client was sometimes never far enough behind to be dropped.
        lines += [json.dumps({"id": i, "cmd": "stats"}) for i in range(60_000)]
        # Sent from a thread: a bridge that stops reading the stuck client would block this send too.
        threading.Thread(target=stuck.sendall, args=("\n".join(lines).encode() + b"\n",), daemon=True).start()
        time.sleep(1.0)  # the stuck client's generation is running and its events pile up
        other.sendall(json.dumps({"id": "short", "cmd": "generate", "prompt": PROMPT, "max_tokens": 8}).encode()
                      + b"\n")
        events = _read_events(other, "short", timeout=60)
        assert events[-1]["event"] == "stats", events[-1]
        assert events[-1]["text"] == solo_engine.generate(PROMPT, max_tokens=8, mode="none", gamma=0).text
        assert _closed_within(stuck, timeout=60)
        assert proc.poll() is None


# -- 2. cancellation during a long prefill -----------------------------------------------------------------
def _long_prompt(engine: Engine, n: int) -> list[int]:
    """``n`` token ids of ordinary text (a prompt sent as ids, so that its length is exact)."""
    text = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(n // 8))
    tokens = engine.tokenize(text)
    assert len(tokens) >= n
    return tokens[:n]


@pytest.fixture(params=["solo_engine", "onnx_engine"])
def any_engine(request: pytest.FixtureRequest) -> Engine:
    """The default model on llama.cpp, and exported to ONNX (one thread each)."""
    return request.getfixturevalue(request.param)


def test_a_chunked_prefill_gives_the_logits_of_one_pass(any_engine: Engine) -> None:
    """The prompt goes in PREFILL_CHUNK tokens at a time: the first token's logits are those of one decode of the
    whole prompt, bit for bit (so no output changes)."""
    tokens = _long_prompt(any_engine, 2 * PREFILL_CHUNK + 77)
    arena, model = any_engine.arena, any_engine.target
    arena.reset([0], reuse=False)
    whole = model.decode(tokens, 0, 1).copy()
    model.truncate(0)
    arena.reset(tokens, reuse=False)
    assert arena.prefill("target") and len(arena.held["target"]) == 2 * PREFILL_CHUNK  # the rest comes with extend
    assert np.array_equal(arena.extend("target", [], 1), whole)


@pytest.mark.parametrize(("name", "cache"), [("solo_engine", "target"), ("onnx_engine", "target"),
                                           ("pair_engine", "draft")])
def test_cancel_stops_a_prefill_between_two_chunks(request: pytest.FixtureRequest, name: str, cache: str) -> None:
    """``cancel`` set while the prompt is being fed (to the target, or to a draft model after it): the stream ends
    with no chunk after at most one more chunk, and the engine's next generation is the one it gave before."""
    engine: Engine = request.getfixturevalue(name)
    short = "The days of the week are"
    before = engine.generate(short, max_tokens=8, mode="none").text
    tokens = _long_prompt(engine, min(engine.n_ctx - 16, 12 * PREFILL_CHUNK))
    cancel = threading.Event()
    held = engine.arena.held

    def cancel_after_one_chunk() -> None:
        while len(held[cache]) < PREFILL_CHUNK:
            time.sleep(0.001)
        cancel.set()

    threading.Thread(target=cancel_after_one_chunk, daemon=True).start()
    assert list(engine.stream(tokens, max_tokens=4, cache_prompt=False, cancel=cancel)) == []
    assert PREFILL_CHUNK <= len(held[cache]) <= 2 * PREFILL_CHUNK
    assert engine.generate(short, max_tokens=8, mode="none").text == before


def test_an_abandoned_long_prompt_frees_the_server_within_one_prefill_chunk(solo_engine: Engine) -> None:
    """The issue's reproduction: a client sends a 4000-token prompt and disconnects after 1 s; the next small request
    waits for at most the prefill chunk being fed when the client left, not for the rest of the prompt."""
    tokens = _long_prompt(solo_engine, 4000)
    with LiveServer.start("--gamma", "4") as server, httpx.Client(base_url=server.url, timeout=120) as http:
        def ask(prompt: str | list[int], **body: object) -> tuple[float, dict]:
            started = time.monotonic()
            reply = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3, "temperature": 0, **body})
            assert reply.status_code == 200, reply.text
            return time.monotonic() - started, reply.json()

        # What a chunk and a small request cost here and now (the machine may be busy with other work).
        chunk_s = ask(tokens[:PREFILL_CHUNK], cache_prompt=False)[1]["usage"]["speculative"]["prefill_s"]
        small_s, _ = ask("1, 2, 3,")
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json={"prompt": tokens, "max_tokens": 3, "cache_prompt": False}, timeout=1)
        waited, _ = ask("1, 2, 3,")
        # Before prefills were cancellable the rest of the prompt, ~14 chunks, came first.
        assert waited < small_s + 2 * chunk_s + 1.0, (waited, small_s, chunk_s)
        assert server.metric('edgespec_requests_total{model="smollm2-135m",outcome="cancelled"}') == 1


def test_a_bridge_cancel_stops_a_long_prefill(solo_engine: Engine) -> None:
    tokens = _long_prompt(solo_engine, 3500)
    proc = subprocess.Popen(edgespec_command(*BRIDGE), cwd=ROOT, env=child_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        lines = Lines(proc.stdout, proc.stdin)
        assert lines.next(timeout=120)["event"] == "ready"
        lines.send(id="chunk", cmd="generate", prompt=tokens[:PREFILL_CHUNK], max_tokens=1, cache_prompt=False)
        chunk_s = lines.until("chunk", ENDINGS)[-1]["stats"]["prefill_s"]
        lines.send(id="long", cmd="generate", prompt=tokens, max_tokens=3, cache_prompt=False)
        time.sleep(1.0)
        lines.send(id="stop", cmd="cancel", target="long")
        asked = time.monotonic()
        assert lines.until("long", ENDINGS, timeout=120)[-1]["event"] == "cancelled"
        assert time.monotonic() - asked < 2 * chunk_s + 1.0, (time.monotonic() - asked, chunk_s)
    finally:
        proc.kill()
        proc.wait()


# -- 7, 8. half-sent requests, uploads cut short -------------------------------------------------------------
@pytest.fixture(scope="module")
def strict_server() -> Iterator[LiveServer]:
    with LiveServer.start("--gamma", "4", "--header-timeout", "2", "--body-timeout", "3",
                          "--max-connections", "6") as s:
        yield s


def _connect(server: LiveServer, data: bytes = b"") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    if data:
        conn.sendall(data)
    return conn


def _head(server: LiveServer, length: int) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


BODY = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}).encode()


def _errors(server: LiveServer) -> float:
    return server.metric('edgespec_requests_total{model="smollm2-135m",outcome="error"}')


def test_half_sent_requests_are_closed_after_their_timeout(strict_server: LiveServer) -> None:
    head = _head(strict_server, len(BODY))
    half_sent = [b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le",  # a partial head
                 b"GET /\r\n",  # an HTTP/0.9 request line, which h11 waits on for a version
                 head + BODY[:10]]  # a partial body
    conns = [_connect(strict_server, data) for data in half_sent]
    started = time.monotonic()
    for conn in conns:
        assert _closed_within(conn, timeout=10)
        conn.close()
    assert time.monotonic() - started < 8  # the body timeout (3 s) after the head, with room for a busy machine
    # A slow client that finishes in time is answered.
    with _connect(strict_server, head) as slow:
        for i in range(0, len(BODY), len(BODY) // 3 + 1):
            time.sleep(0.3)
            slow.sendall(BODY[i:i + len(BODY) // 3 + 1])
        assert slow.recv(1 << 16).startswith(b"HTTP/1.1 200")
    assert "Traceback" not in strict_server.log() and _errors(strict_server) == 0


def test_connections_beyond_the_cap_are_closed_unread(strict_server: LiveServer) -> None:
    idle = [_connect(strict_server) for _ in range(6)]
    try:
        with _connect(strict_server, _head(strict_server, len(BODY)) + BODY) as extra:
            assert _closed_within(extra, timeout=1.5)  # before the idle ones' header timeout (2 s)
    finally:
        for conn in idle:
            conn.close()
    time.sleep(0.2)
    reply = httpx.post(strict_server.url + "/v1/chat/completions", content=BODY,
                       headers={"content-type": "application/json"}, timeout=60)
    assert reply.status_code == 200, reply.text


def test_a_client_gone_during_upload_is_no_server_error(strict_server: LiveServer) -> None:
    """The issue's finding 8: each aborted upload logged ~80 lines of traceback (ClientDisconnect through the
    catch-all handler)."""
    for _ in range(3):
        with _connect(strict_server, _head(strict_server, 5000) + BODY[:20]):
            time.sleep(0.2)  # the app is reading the body when the client goes
    time.sleep(0.5)
    reply = httpx.post(strict_server.url + "/v1/chat/completions", content=BODY,
                       headers={"content-type": "application/json"}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert "Traceback" not in strict_server.log() and "ClientDisconnect" not in strict_server.log()
    assert _errors(strict_server) == 0


def test_a_bridge_client_that_resets_its_connection_is_no_error(tmp_path: Path) -> None:
    """A client closing with answers unread resets the connection: the client has gone both ways, so its session
    ends and its generation is cancelled, without a traceback, and the bridge serves the next one."""
    port, stderr = free_port(), tmp_path / "stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(edgespec_command(*BRIDGE, "--port", str(port)), cwd=ROOT, env=child_env(),
                                stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None and json.loads(proc.stdout.readline())["event"] == "listening"
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
                conn.sendall(b'{"id": 1, "cmd": "generate", "prompt": "1, 2, 3,", "max_tokens": 50}\n')
                time.sleep(0.3)  # answers arrive and are left unread
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
            conn.sendall(b'{"id": 2, "cmd": "stats"}\n')
            assert _read_events(conn, 2, timeout=60)[-1]["event"] == "metrics"
    finally:
        proc.kill()
        proc.wait()
    assert "Traceback" not in stderr.read_text()
