"""`edgespec bridge` as a subprocess, spoken to exactly as docs/bridge-protocol.md says."""

from __future__ import annotations

import json
import queue
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from edgespec.engine.engine import Engine
from tests.live import ROOT, child_env, edgespec_command, free_port

ENDINGS = {"stats", "cancelled", "error"}
PROMPT = "List the days of the week, one per line:\nMonday\nTuesday\n"
# A fixed γ needs no cost calibration: the bridge is ready in about a second.
BRIDGE = ("bridge", "--gamma", "4")


class Lines:
    """Events from a bridge (pipe or socket), read on a thread; every wait is bounded."""

    def __init__(self, reader: IO[bytes], writer: IO[bytes]) -> None:
        self.writer = writer
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.pending: list[dict[str, Any]] = []  # read while waiting for something else
        threading.Thread(target=self._read, args=(reader,), daemon=True).start()

    def _read(self, reader: IO[bytes]) -> None:
        for line in reader:
            self.events.put(json.loads(line))

    def send_raw(self, line: bytes) -> None:
        self.writer.write(line + b"\n")
        self.writer.flush()

    def send(self, **request: object) -> None:
        self.send_raw(json.dumps(request).encode())

    def next(self, timeout: float = 60) -> dict[str, Any]:
        return self.pending.pop(0) if self.pending else self.events.get(timeout=timeout)

    def until(self, rid: object, events: set[str], timeout: float = 60) -> list[dict[str, Any]]:
        """Events for ``rid`` up to and including the first whose kind is in ``events``."""
        deadline = time.monotonic() + timeout
        got, others = [], []
        while True:
            left = max(0.0, deadline - time.monotonic())
            event = self.pending.pop(0) if self.pending else self.events.get(timeout=left)
            if event.get("id") != rid:
                others.append(event)
                continue
            got.append(event)
            if event["event"] in events:
                self.pending = others + self.pending
                return got


@pytest.fixture
def bridge() -> Iterator[tuple[subprocess.Popen[bytes], Lines]]:
    proc = subprocess.Popen(edgespec_command(*BRIDGE), cwd=ROOT, env=child_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    lines = Lines(proc.stdout, proc.stdin)
    try:
        assert lines.next(timeout=60) == {"event": "ready", "protocol": 1, "models": ["smollm2-135m"]}
        yield proc, lines
    finally:
        proc.kill()
        proc.wait()


def _generation(lines: Lines, rid: object) -> tuple[str, dict[str, Any]]:
    return _streamed(lines.until(rid, ENDINGS))


def _streamed(events: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Token events then one stats event, as the protocol says: (the text, the stats event)."""
    *tokens, end = events
    assert end["event"] == "stats", end
    assert all(e["event"] == "token" and 0 <= e["accepted"] <= len(e["tokens"]) for e in tokens)
    text = "".join(e["text"] for e in tokens)
    assert text == end["text"]
    return text, end


@contextmanager
def listening_bridge(*where: str, address: str) -> Iterator[subprocess.Popen[bytes]]:
    """A bridge listening on a socket (``--socket PATH`` or ``--port N``) that announced ``address``."""
    proc = subprocess.Popen(edgespec_command(*BRIDGE, *where), cwd=ROOT, env=child_env(), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"event": "listening", "address": address, "protocol": 1}
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_generate_and_chat_stream_target_only_output(bridge: tuple[subprocess.Popen[bytes], Lines],
                                                     solo_engine: Engine) -> None:
    _, lines = bridge
    lines.send(id=1, cmd="generate", prompt=PROMPT, max_tokens=24)
    text, end = _generation(lines, 1)
    assert text == solo_engine.generate(PROMPT, max_tokens=24, mode="none", gamma=0).text
    assert end["finish_reason"] == "length" and end["stats"]["generated_tokens"] == 24
    assert end["stats"]["mode"] == "ngram" and end["stats"]["accepted"] > 0
    messages = [{"role": "user", "content": "Say hello."}]
    lines.send(id="c", cmd="chat", messages=messages, max_tokens=16, speculative={"mode": "none"})
    text, end = _generation(lines, "c")
    assert text == solo_engine.chat(messages, max_tokens=16, mode="none", gamma=0).text
    assert end["stats"]["mode"] == "none"


def test_concurrent_ids_cancel_and_stats(bridge: tuple[subprocess.Popen[bytes], Lines], solo_engine: Engine) -> None:
    _, lines = bridge
    prompts = {"a": "The capital of France is", "b": "Water boils at", "long": "1, 2, 3, 4, 5,"}
    lines.send(id="long", cmd="generate", prompt=prompts["long"], max_tokens=3000)
    lines.send(id="a", cmd="generate", prompt=prompts["a"], max_tokens=16)
    lines.send(id="b", cmd="generate", prompt=prompts["b"], max_tokens=16)
    assert lines.until("long", {"token"})[0]["event"] == "token"
    lines.send(id="stop-it", cmd="cancel", target="long")
    assert lines.until("stop-it", {"ok", "error"}) == [{"id": "stop-it", "event": "ok", "target": "long"}]
    cancelled = lines.until("long", ENDINGS, timeout=10)
    assert cancelled[-1] == {"id": "long", "event": "cancelled"} and len(cancelled) < 200
    # The two waiting behind it then run, in order, each exactly as it would alone.
    for rid in ("a", "b"):
        text, _ = _generation(lines, rid)
        assert text == solo_engine.generate(prompts[rid], max_tokens=16, mode="none", gamma=0).text
    lines.send(id=9, cmd="stats")
    counters = lines.until(9, {"metrics"})[0]["models"]["smollm2-135m"]
    assert counters["requests"] == {"cancelled": 1, "done": 2} and counters["queue_depth"] == 0
    assert counters["generated_tokens"] >= 32 and len(counters["acceptance_by_position"]) == 16


def test_malformed_lines_get_errors_and_the_bridge_keeps_running(
        bridge: tuple[subprocess.Popen[bytes], Lines]) -> None:
    proc, lines = bridge

    def error(code: str, rid: object = None) -> str:
        event = lines.until(rid, {"error"})[-1]
        assert event["code"] == code, event
        return event["message"]

    lines.send_raw(b"this is not json")
    error("bad_json")
    # A line refused as bad JSON still names its request when its id can be read.
    lines.send_raw(b'{"id": 0, "cmd": "generate", "prompt": "\\udfff"}')
    assert "surrogate" in error("bad_json", 0)
    lines.send_raw(b'{"id": "latin-1", "cmd": "generate", "prompt": "caf\xe9"}')
    error("bad_json", "latin-1")
    lines.send_raw(b'{"id": 0, "cmd": "generate", "prompt": NaN}')
    error("bad_json", 0)
    lines.send_raw(b'["generate"]')
    error("bad_request")
    lines.send(cmd="generate", prompt="no id")
    error("bad_request")
    lines.send(id=1, cmd="fly")
    assert "generate" in error("unknown_command", 1)
    lines.send(id=1, cmd=["generate"])
    error("unknown_command", 1)
    lines.send(id=2, cmd="generate", prompt="x", max_tokens=-1)
    assert "max_tokens" in error("invalid_parameter", 2)
    lines.send(id=3, cmd="generate", prompt="x", temperature="warm")
    error("invalid_type", 3)
    lines.send(id=4, cmd="generate", prompt="x", model="nope")
    error("model_not_found", 4)
    lines.send(id=5, cmd="generate", prompt="go " * 5000)
    error("context_length_exceeded", 5)
    lines.send(id=6, cmd="cancel", target="never-sent")
    error("unknown_id", 6)
    lines.send(id=6, cmd="cancel", target={"not": "an id"})
    error("unknown_id", 6)
    lines.send(id=7, cmd="generate", prompt="1, 2, 3,", max_tokens=3000)
    lines.send(id=7, cmd="generate", prompt="again")
    error("duplicate_id", 7)
    lines.send(id=7, cmd="stats")  # any command: its events would be mistaken for the generation's
    error("duplicate_id", 7)
    lines.send(id=7, cmd="cancel", target=7)
    error("duplicate_id", 7)
    for rid, request in enumerate([{"cmd": "load", "model": "smollm2-135m", "ctxx": 2048},
                                   {"cmd": "stats", "verbose": True}, {"cmd": "cancel", "target": 7, "force": True},
                                   {"cmd": "shutdown", "now": 1}, {"cmd": "generate", "prompt": "x", "temprature": 0}]):
        lines.send(id=f"unknown-{rid}", **request)
        name = next(iter(set(request) - {"cmd", "model", "target", "prompt"}))
        assert repr(name) in error("unknown_parameter", f"unknown-{rid}")
    lines.send(id=12, cmd="stats", verbose=None)  # a null is the key left out, on every command
    assert lines.until(12, {"metrics", "error"})[-1]["event"] == "metrics"
    lines.send_raw(b"x" * (1 << 20) + b"y\n")  # longer than a line may be
    error("line_too_long")
    lines.send(id=8, cmd="load", model="no-such-model")
    assert "unknown model" in error("load_failed", 8)
    # Still serving; shutdown cancels the generation in flight, says bye and exits cleanly.
    lines.send(id=10, cmd="generate", prompt=PROMPT, max_tokens=8)
    lines.send(id=11, cmd="shutdown")
    assert lines.until(7, ENDINGS)[-1] == {"id": 7, "event": "cancelled"}
    assert lines.until(10, ENDINGS)[-1]["event"] == "cancelled"
    assert lines.until(11, {"bye"}) == [{"id": 11, "event": "bye"}]
    assert proc.wait(timeout=30) == 0


def test_a_pipe_is_a_client(solo_engine: Engine) -> None:
    """`echo REQUESTS | edgespec bridge`: at the end of its input the bridge finishes each generation, writes its
    events and exits 0."""
    requests = [{"id": 1, "cmd": "generate", "prompt": PROMPT, "max_tokens": 8},
                {"id": 2, "cmd": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}]
    run = subprocess.run(edgespec_command(*BRIDGE), cwd=ROOT, env=child_env(), capture_output=True, timeout=120,
                         input=b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    assert run.returncode == 0, run.stderr.decode()
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert events[0]["event"] == "ready"
    text, _ = _streamed([e for e in events if e.get("id") == 1])
    assert text == solo_engine.generate(PROMPT, max_tokens=8, mode="none", gamma=0).text
    assert _streamed([e for e in events if e.get("id") == 2])[1]["stats"]["generated_tokens"] <= 4


def test_closing_stdin_during_a_generation_lets_it_end_with_its_event(
        bridge: tuple[subprocess.Popen[bytes], Lines]) -> None:
    proc, lines = bridge
    lines.send(id="running", cmd="generate", prompt=PROMPT, max_tokens=32)
    lines.send(id="queued", cmd="generate", prompt=PROMPT, max_tokens=4)
    first = lines.until("running", {"token"})
    lines.writer.close()
    assert _streamed(first + lines.until("running", ENDINGS))[1]["stats"]["generated_tokens"] == 32
    assert _generation(lines, "queued")[1]["stats"]["generated_tokens"] == 4
    assert proc.wait(timeout=30) == 0


def test_end_of_input_with_the_output_gone_cancels_and_exits() -> None:
    proc = subprocess.Popen(edgespec_command(*BRIDGE), cwd=ROOT, env=child_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps({"id": 1, "cmd": "generate", "prompt": "1, 2, 3,", "max_tokens": 4000}).encode()
                         + b"\n")
        proc.stdin.flush()
        while json.loads(proc.stdout.readline()).get("event") != "token":
            pass
        proc.stdout.close()  # the client has gone: nobody reads the rest of a 4000-token generation
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(60)
    sock.connect(str(path))
    return sock


def test_unix_socket_takes_a_burst_of_connects_and_caps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "bridge.sock"
    with listening_bridge("--socket", str(path), "--no-preload", "--max-connections", "2", address=f"unix:{path}"):
        # A burst of connects waits in the listen backlog; none is refused by the kernel.
        burst = [socket.socket(socket.AF_UNIX) for _ in range(40)]
        refused = 0
        for sock in burst:
            sock.setblocking(False)
            try:
                sock.connect(str(path))
            except BlockingIOError:
                refused += 1
        for sock in burst:
            sock.close()
        assert refused == 0
        held = []
        deadline = time.monotonic() + 30
        while len(held) < 2:  # the burst's sessions end as their clients are found gone
            assert time.monotonic() < deadline, "the burst's sessions never ended"
            sock = _connect(path)
            if json.loads(sock.makefile("rb").readline())["event"] == "ready":
                held.append(sock)
            else:
                sock.close()
                time.sleep(0.1)
        # One beyond the cap gets one error line, and the connection is closed.
        with _connect(path) as extra:
            events = [json.loads(line) for line in extra.makefile("rb")]
        assert [(e["event"], e["code"], e["id"]) for e in events] == [("error", "too_many_connections", None)]
        assert "2" in events[0]["message"]
        held.pop().close()  # frees a place
        deadline = time.monotonic() + 30
        while json.loads(_connect(path).makefile("rb").readline())["event"] != "ready":
            assert time.monotonic() < deadline, "a closed session's place was not freed"
            time.sleep(0.1)


def test_a_socket_client_that_half_closes_gets_its_events(tmp_path: Path) -> None:
    """End of a connection's input is the end of a pipe's: its generations finish and write their events."""
    path = tmp_path / "bridge.sock"
    with listening_bridge("--socket", str(path), address=f"unix:{path}"), _connect(path) as sock:
        sock.sendall(json.dumps({"id": 1, "cmd": "generate", "prompt": PROMPT, "max_tokens": 8}).encode() + b"\n")
        sock.shutdown(socket.SHUT_WR)
        events = [json.loads(line) for line in sock.makefile("rb")]  # until the bridge closes the connection
    assert events[0]["event"] == "ready"
    assert _streamed(events[1:])[1]["stats"]["generated_tokens"] == 8


def test_load_a_second_model_and_serve_sessions_on_a_unix_socket(tmp_path: Path, solo_engine: Engine) -> None:
    path = tmp_path / "bridge.sock"
    with listening_bridge("--socket", str(path), address=f"unix:{path}") as proc:
        sessions = []
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(path))
            lines = Lines(sock.makefile("rb"), sock.makefile("wb"))
            assert lines.next()["event"] == "ready"
            sessions.append(lines)
        first, second = sessions
        first.send(id=1, cmd="load", model="smollm2-135m:q8_0")
        loaded = first.until(1, {"loaded", "error"})[-1]
        assert loaded == {"id": 1, "event": "loaded", "model": "smollm2-135m:q8_0", "n_ctx": 4096, "mode": "ngram",
                          "modes": ["none", "ngram", "tree"]}
        # Same ids in two sessions do not collide; each session sees only its own events.
        first.send(id=1, cmd="generate", prompt=PROMPT, max_tokens=12, model="smollm2-135m:q8_0")
        second.send(id=1, cmd="generate", prompt=PROMPT, max_tokens=12)
        q8_text, _ = _generation(first, 1)
        q4_text, _ = _generation(second, 1)
        assert q4_text == solo_engine.generate(PROMPT, max_tokens=12, mode="none", gamma=0).text
        assert q8_text.strip()
        second.send(id=2, cmd="shutdown")
        assert second.until(2, {"bye"})[-1]["event"] == "bye"
        assert proc.wait(timeout=30) == 0
        assert not path.exists()


@pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK (javac and java)")
def test_android_app_protocol_client_against_a_tcp_bridge(tmp_path: Path, solo_engine: Engine) -> None:
    """The app's own Java client (android_demo/…/bridge/*.java), compiled here, drives a real bridge."""
    sources = [*sorted((ROOT / "android_demo/app/src/main/java/org/edgespec/bridge").glob("*.java")),
               ROOT / "tests/java/BridgeClientCheck.java"]
    subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", str(tmp_path), *map(str, sources)], check=True, timeout=120)
    port = free_port()
    with listening_bridge("--port", str(port), address=f"tcp:127.0.0.1:{port}") as proc:
        prompt = "In French, « naïve café » is written"  # non-ASCII both ways
        run = subprocess.run(["java", "-cp", str(tmp_path), "BridgeClientCheck", str(port), prompt],
                             capture_output=True, timeout=120)
        assert run.returncode == 0, run.stderr.decode()
        assert proc.wait(timeout=30) == 0  # the client's shutdown stopped the bridge
