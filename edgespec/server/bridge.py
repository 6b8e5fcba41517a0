"""The JSON-lines bridge: edgespec for programs that are not Python (an Android app, an editor plugin).

One JSON object per line in each direction, over stdin/stdout or a local socket; the protocol is
specified in docs/bridge-protocol.md. Requests carry ids so that several generations can be in flight;
their events interleave, each tagged with its request's id. A bad line gets an error event and the
bridge reads on. The end of a client's input is not a cancel: what it started still finishes and is
written, so that a pipe (``echo REQUEST | edgespec bridge``) is a client like any other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from ..engine.engine import StreamChunk
from ..errors import EdgespecError
from .openai_api import ApiError, LogprobsFormat, draft_chars, load_json, parse_chat, parse_completion
from .outbox import Outbox
from .parameters import refused_key
from .pool import EngineSpec, ModelPool
from .worker import CANCELLED, FAILED, Job

log = logging.getLogger("edgespec.bridge")
PROTOCOL = 1
MAX_LINE = 1 << 20  # bytes; a longer line is an error, not a memory problem
# Unwritten event bytes a client may fall behind by before it is disconnected (a 4096-token generation's
# events are ~0.6 MB): a client that stops reading costs this much memory, and nobody else any time.
MAX_BACKLOG = 4 << 20
DRAIN_S = 10.0  # how long a closing session waits for its last events to be written
MAX_SESSIONS = 64  # connections served at once on a socket (--max-connections); each holds two threads
# A browser made to POST to the TCP port sends an HTTP request whose body could hold valid request lines.
_HTTP_REQUEST_LINE = re.compile(rb"^[A-Z]+ \S+ HTTP/\d")
_LOAD_FIELDS = {"model": str, "draft": str, "mode": str, "gamma": (str, int), "ctx": int, "cache_mb": (int, float)}
# Each command's keys besides "id" and "cmd"; generate and chat take the OpenAI request's, which its parser checks.
_KEYS = {"load": frozenset(_LOAD_FIELDS), "cancel": frozenset({"target"}), "stats": frozenset(),
         "shutdown": frozenset()}


class Bridge:
    """The models (shared by every connection) and the transports."""

    def __init__(self, pool: ModelPool, defaults: EngineSpec) -> None:
        self.pool, self.defaults = pool, defaults
        self.stopped = threading.Event()
        self._on_stop: list[Callable[[], None]] = []

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            for callback in self._on_stop:
                callback()

    def serve_stdio(self) -> int:
        # Protocol lines own the real stdout; anything else printing to fd 1 (a C library) goes to stderr.
        out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8", buffering=1)
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        Session(self, out).run(sys.stdin.buffer)
        self.stop()
        self.pool.close()
        return 0

    def serve_unix(self, path: str, max_sessions: int = MAX_SESSIONS) -> int:
        Path(path).unlink(missing_ok=True)
        server = _UnixServer(path, self._handler(), max_sessions)
        try:
            return self._serve(server, f"unix:{path}")
        finally:
            Path(path).unlink(missing_ok=True)

    def serve_tcp(self, port: int, max_sessions: int = MAX_SESSIONS) -> int:
        server = _TcpServer(("127.0.0.1", port), self._handler(), max_sessions)
        return self._serve(server, f"tcp:127.0.0.1:{server.server_address[1]}")

    def _serve(self, server: socketserver.BaseServer, address: str) -> int:
        # shutdown() waits for serve_forever to return, so it must run on another thread.
        self._on_stop.append(lambda: threading.Thread(target=server.shutdown, daemon=True).start())
        print(json.dumps({"event": "listening", "address": address, "protocol": PROTOCOL}), flush=True)
        with server:
            server.serve_forever(poll_interval=0.2)
        self.pool.close()
        return 0

    def _handler(self) -> type[socketserver.StreamRequestHandler]:
        bridge = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                out = open(self.wfile.fileno(), "w", encoding="utf-8", closefd=False)  # noqa: SIM115
                Session(bridge, out, self._drop).run(self.rfile)

            def _drop(self) -> None:
                """Disconnect the client: its reader sees the end of input, its blocked writer an error."""
                with contextlib.suppress(OSError):
                    self.request.shutdown(socket.SHUT_RDWR)

        return Handler


class _Sessions(socketserver.ThreadingMixIn):
    """Each connection a session on threads of its own, at most ``max_sessions`` at once: one beyond them is
    told so in one error line and closed, before a thread is spent on it."""

    daemon_threads = True
    request_queue_size = socket.SOMAXCONN  # a burst of connects waits to be accepted rather than fail (EAGAIN)

    def __init__(self, address: Any, handler: type[socketserver.BaseRequestHandler], max_sessions: int) -> None:
        if max_sessions < 1:
            raise EdgespecError(f"--max-connections must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._slots = threading.BoundedSemaphore(max_sessions)
        super().__init__(address, handler)  # type: ignore[call-arg]

    def process_request(self, request: Any, client_address: Any) -> None:
        if self._slots.acquire(blocking=False):
            try:
                super().process_request(request, client_address)
            except BaseException:  # no thread started (none left?): nothing will free the place
                self._slots.release()
                raise
            return
        line = json.dumps({"id": None, "event": "error", "code": "too_many_connections",
                           "message": f"the bridge serves at most {self.max_sessions} connections at once "
                                      "(--max-connections); this one is closed"}) + "\n"
        with contextlib.suppress(OSError):  # a new connection's empty send buffer takes one line without blocking
            request.setblocking(False)
            request.send(line.encode())
        self.shutdown_request(request)  # type: ignore[attr-defined]

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _UnixServer(_Sessions, socketserver.UnixStreamServer):
    pass


class _TcpServer(_Sessions, socketserver.TCPServer):
    allow_reuse_address = True


@dataclass(eq=False)
class _Request:
    """A request of a session that has not ended yet (its final event not queued): a generation or a load."""

    cancel: Callable[[], None] | None = None  # None: it cannot be stopped (a load)


class Session:
    """One client: reads its request lines, writes its events, owns its in-flight generations."""

    def __init__(self, bridge: Bridge, out: IO[str], drop: Callable[[], None] = lambda: None) -> None:
        """``drop`` disconnects the client (a socket's; stdin cannot be closed under its reader)."""
        self.bridge, self._drop = bridge, drop
        # Events are written by the session's own thread: the engine's worker never waits on this client.
        self.outbox = Outbox(out, MAX_BACKLOG, self._lost, f"edgespec-bridge-writer-{id(self):x}")
        self._running: dict[object, _Request] = {}  # by id; added only by the reader thread
        self._lock = threading.Condition()  # notified when a request ends or the client is lost
        self._gone = False
        self._commands: dict[str, Callable[[object, dict[str, Any]], None]] = {
            "load": self.load, "generate": self.generate, "chat": self.generate, "cancel": self.cancel,
            "stats": self.stats, "shutdown": self.shutdown}

    def run(self, lines: IO[bytes]) -> None:
        self.send({"event": "ready", "protocol": PROTOCOL, "models": [w.name for w in self.bridge.pool.workers]})
        input_ended = False
        try:
            for n, line in enumerate(_lines(lines)):
                if n == 0 and line is not None and _HTTP_REQUEST_LINE.match(line):
                    self.error(None, "not_http", "this is edgespec's JSON-lines bridge, not an HTTP server; "
                                                 "the connection is closed")
                    break
                if line is None:
                    self.error(None, "line_too_long", f"a request line may hold at most {MAX_LINE} bytes")
                elif line.strip():
                    self.handle(line)
                if self.bridge.stopped.is_set() or self._gone:
                    break
            else:
                input_ended = True
        except OSError:  # the connection was reset: the client has gone both ways
            self._gone = True
        finally:
            if input_ended:
                self._wait_for_requests()
            self.cancel_all()  # the client has gone (or the bridge is stopping): nobody will read these
            self._wait_for_generations(DRAIN_S)
            self.outbox.close(DRAIN_S)

    def _wait_for_requests(self) -> None:
        """At the end of the input: until every request has ended and queued its final event, unless the client
        turns out to be gone (its events cannot be written) or the bridge stops meanwhile."""
        def settled() -> bool:
            return not self._running or self._gone or self.bridge.stopped.is_set()

        with self._lock:
            while not self._lock.wait_for(settled, timeout=1.0):  # a stop by another session notifies nobody here
                pass

    def _wait_for_generations(self, timeout: float) -> None:
        """Until no generation is running (a cancelled one ends within a decode step); loads are not waited for."""
        with self._lock:
            self._lock.wait_for(lambda: not any(r.cancel for r in self._running.values()), timeout)

    def send(self, event: dict[str, object]) -> None:
        self.outbox.put(json.dumps(event, ensure_ascii=False) + "\n")

    def _lost(self) -> None:
        """The client went away or fell MAX_BACKLOG behind: stop its generations and disconnect it."""
        with self._lock:
            self._gone = True
            self._lock.notify_all()
        self.cancel_all()
        self._drop()

    def error(self, rid: object, code: str, message: str) -> None:
        self.send(_error(rid, code, message))

    def handle(self, line: bytes) -> None:
        try:
            request = load_json(line)
        except ValueError as e:
            self.error(_readable_id(line), "bad_json", f"not a JSON line: {e}")
            return
        rid = request.get("id") if isinstance(request, dict) else None
        if not isinstance(request, dict) or not _is_id(rid):
            self.error(rid, "bad_request", "a request is an object with an 'id' (string or integer) and a 'cmd'")
            return
        request = {key: value for key, value in request.items() if value is not None}  # a null is the key left out
        cmd = request.get("cmd")
        command = self._commands.get(cmd) if isinstance(cmd, str) else None
        if command is None:
            self.error(rid, "unknown_command", f"unknown cmd {request.get('cmd')!r}; one of "
                                               f"{', '.join(self._commands)}")
            return
        with self._lock:
            running = rid in self._running
        if running:  # any command: its events would be taken for the running request's
            self.error(rid, "duplicate_id", f"request id {rid!r} is still running; choose another")
            return
        try:
            refused = refused_key(request, _KEYS[cmd] | {"id", "cmd"}, unsupported={}, inert=()) \
                if cmd in _KEYS else None
            if refused is not None:
                name, code, message = refused
                raise ApiError(400, message, param=name, code=code)
            command(rid, request)
        except ApiError as e:
            self.error(rid, _code(e), e.message)
        except EdgespecError as e:
            self.error(rid, _code(e), str(e))
        except Exception:  # a bug in one command must not end the session
            log.exception("bridge command %r failed", request.get("cmd"))
            self.error(rid, "internal_error", "internal error; see the bridge's stderr")

    # -- commands -------------------------------------------------------------------------------------
    def load(self, rid: object, request: dict[str, Any]) -> None:
        for key, kind in _LOAD_FIELDS.items():
            if key in request and not isinstance(request[key], kind):
                raise ApiError(400, f"'{key}' has the wrong type", code="bad_request")
        spec = replace(self.bridge.defaults, **{k: request[k] for k in _LOAD_FIELDS if k in request})
        running = self._start(rid, _Request())

        def run() -> None:  # loading takes seconds: keep reading (cancel, stats) meanwhile
            try:
                worker = self.bridge.pool.load(spec)
                worker.ready.wait()
                event: dict[str, object] = {
                    "id": rid, "event": "loaded", "model": worker.name, "n_ctx": worker.engine.n_ctx,
                    "mode": worker.engine.mode, "modes": list(worker.engine.modes)}
            except EdgespecError as e:
                event = _error(rid, "load_failed", str(e))
            except Exception as e:  # llama.cpp or the file system may fail in ways we did not name
                log.exception("loading %s failed", spec.name)
                event = _error(rid, "load_failed", f"could not load {spec.name!r}: {e}")
            self._end(rid, running, event)

        threading.Thread(target=run, name=f"edgespec-load-{rid}", daemon=True).start()

    def generate(self, rid: object, request: dict[str, Any]) -> None:
        parse = parse_chat if request["cmd"] == "chat" else parse_completion
        req = parse(request, temperature=0.0, extra=("id", "cmd"))  # greedy unless asked: the demo shows exact output
        worker = self.bridge.pool.get(req.model)
        piece = worker.engine.target.piece
        pieces: list[str] = []
        logprobs = LogprobsFormat(True, piece)  # chat's shape for both commands: one entry per token

        def on_chunk(chunk: StreamChunk) -> None:
            pieces.append(chunk.text)
            event = {"id": rid, "event": "token", "text": chunk.text, "tokens": chunk.tokens,
                     "drafted": chunk.drafted, "accepted": chunk.accepted, "draft_chars": draft_chars(chunk, piece)}
            if chunk.logprobs is not None:
                event["logprobs"] = logprobs(chunk.logprobs)["content"]  # type: ignore[index]
            self.send(event)
            if chunk.stats is not None:  # the last chunk: its stats event ends the request
                final = {"id": rid, "event": "stats", "finish_reason": chunk.finish_reason, "text": "".join(pieces),
                         "stats": chunk.stats.to_dict()}
                if chunk.reply is not None:  # a chat with tools: the text read as content and calls
                    final |= {"content": chunk.reply.content,
                              "tool_calls": [call.openai() for call in chunk.reply.calls]}
                self._end(rid, running, final)

        def on_end(outcome: str, error: EdgespecError | None) -> None:
            if outcome == CANCELLED:
                self._end(rid, running, {"id": rid, "event": "cancelled"})
            elif outcome == FAILED:
                assert error is not None
                self._end(rid, running, _error(rid, _code(error), str(error)))

        job = Job(req.start, on_chunk, on_end)
        running = self._start(rid, _Request(lambda: worker.cancel(job)))
        try:
            worker.submit(job)
        except EdgespecError:
            with self._lock:
                del self._running[rid]
            raise

    def cancel(self, rid: object, request: dict[str, Any]) -> None:
        target = request.get("target")
        with self._lock:
            running = self._running.get(target) if _is_id(target) else None
        if running is None or running.cancel is None:
            raise ApiError(400, f"no generation {target!r} is running", code="unknown_id")
        self.send({"id": rid, "event": "ok", "target": target})
        running.cancel()  # the target's own "cancelled" event follows, within one decode step

    def stats(self, rid: object, _: dict[str, Any]) -> None:
        self.send({"id": rid, "event": "metrics", "models": self.bridge.pool.metrics.snapshot(
            self.bridge.pool.gauges())})

    def shutdown(self, rid: object, _: dict[str, Any]) -> None:
        self.cancel_all()
        self._wait_for_generations(10)  # let each cancelled generation say so before "bye" (one decode step each)
        self.send({"id": rid, "event": "bye"})
        self.bridge.stop()

    def cancel_all(self) -> None:
        with self._lock:
            cancels = [r.cancel for r in self._running.values() if r.cancel is not None]
        for cancel in cancels:
            cancel()

    def _start(self, rid: object, request: _Request) -> _Request:
        """Record a request as running (on the reader thread, after ``handle`` found the id free)."""
        with self._lock:
            self._running[rid] = request
        return request

    def _end(self, rid: object, request: _Request, event: dict[str, object]) -> None:
        """Queue ``request``'s final event and forget it, in one step: whoever waits for the session's requests to
        end finds the event queued, and a client may reuse the id as soon as it reads it. Only the first call counts:
        a request has exactly one final event."""
        with self._lock:
            if self._running.get(rid) is not request:
                return
            del self._running[rid]
            self.send(event)
            self._lock.notify_all()


def _lines(stream: IO[bytes]) -> Iterator[bytes | None]:
    """Request lines; None for a line longer than MAX_LINE (whose rest is skipped). A reset connection raises
    OSError."""
    while True:
        line = stream.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while (rest := stream.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def _is_id(value: object) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _readable_id(line: bytes) -> object:
    """The id of a line refused as bad JSON, read leniently (bytes that are not UTF-8 replaced, NaN allowed, no
    depth limit) so that the client learns which request was refused; None where even that finds none. The line
    stays refused."""
    try:
        request = json.loads(line.decode("utf-8", "replace"))
        rid = request.get("id") if isinstance(request, dict) else None
        json.dumps(rid, ensure_ascii=False).encode("utf-8")  # an id spelling a lone surrogate cannot be sent back
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return None
    return rid if _is_id(rid) else None


def _error(rid: object, code: str, message: str) -> dict[str, object]:
    return {"id": rid, "event": "error", "code": code, "message": message}


def _code(e: EdgespecError | ApiError) -> str:
    api = e if isinstance(e, ApiError) else ApiError.from_engine(e)
    return {"invalid_value": "invalid_parameter"}.get(api.code or "", api.code or "bad_request")
