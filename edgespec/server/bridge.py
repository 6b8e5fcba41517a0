"""The JSON-lines bridge: edgespec for programs that are not Python (an Android app, an editor plugin).

One JSON object per line in each direction, over stdin/stdout or a local socket; the protocol is
specified in docs/bridge-protocol.md. Requests carry ids so that several generations can be in flight;
their events interleave, each tagged with its request's id. A bad line gets an error event and the
bridge reads on.
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
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from ..engine import StreamChunk
from ..errors import EdgespecError
from .openai_api import ApiError, LogprobsFormat, draft_chars, load_json, parse_chat, parse_completion
from .outbox import Outbox
from .pool import EngineSpec, ModelPool
from .worker import CANCELLED, DONE, EngineWorker, Job

log = logging.getLogger("edgespec.bridge")
PROTOCOL = 1
MAX_LINE = 1 << 20  # bytes; a longer line is an error, not a memory problem
# Unwritten event bytes a client may fall behind by before it is disconnected (a 4096-token generation's
# events are ~0.6 MB): a client that stops reading costs this much memory, and nobody else any time.
MAX_BACKLOG = 4 << 20
DRAIN_S = 10.0  # how long a closing session waits for its last events to be written
# A browser made to POST to the TCP port sends an HTTP request whose body could hold valid request lines.
_HTTP_REQUEST_LINE = re.compile(rb"^[A-Z]+ \S+ HTTP/\d")
_LOAD_FIELDS = {"model": str, "draft": str, "mode": str, "gamma": (str, int), "ctx": int, "cache_mb": (int, float)}


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

    def serve_unix(self, path: str) -> int:
        Path(path).unlink(missing_ok=True)
        server = socketserver.ThreadingUnixStreamServer(path, self._handler())
        try:
            return self._serve(server, f"unix:{path}")
        finally:
            Path(path).unlink(missing_ok=True)

    def serve_tcp(self, port: int) -> int:
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        server = socketserver.ThreadingTCPServer(("127.0.0.1", port), self._handler())
        return self._serve(server, f"tcp:127.0.0.1:{server.server_address[1]}")

    def _serve(self, server: socketserver.BaseServer, address: str) -> int:
        server.daemon_threads = True  # type: ignore[attr-defined]
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


class Session:
    """One client: reads its request lines, writes its events, owns its in-flight generations."""

    def __init__(self, bridge: Bridge, out: IO[str], drop: Callable[[], None] = lambda: None) -> None:
        """``drop`` disconnects the client (a socket's; stdin cannot be closed under its reader)."""
        self.bridge, self._drop = bridge, drop
        # Events are written by the session's own thread: the engine's worker never waits on this client.
        self.outbox = Outbox(out, MAX_BACKLOG, self._lost, f"edgespec-bridge-writer-{id(self):x}")
        self._inflight: dict[object, tuple[EngineWorker, Job]] = {}
        self._lock = threading.Condition()  # notified when a generation ends
        self._gone = False

    def run(self, lines: IO[bytes]) -> None:
        self.send({"event": "ready", "protocol": PROTOCOL, "models": [w.name for w in self.bridge.pool.workers]})
        try:
            for n, line in enumerate(_lines(lines)):
                if n == 0 and line is not None and _HTTP_REQUEST_LINE.match(line):
                    self.error(None, "not_http", "this is edgespec's JSON-lines bridge, not an HTTP server; "
                                                 "the connection is closed")
                    break
                if line is None:
                    self.send({"id": None, "event": "error", "code": "line_too_long",
                               "message": f"a request line may hold at most {MAX_LINE} bytes"})
                elif line.strip():
                    self.handle(line)
                if self.bridge.stopped.is_set() or self._gone:
                    break
        finally:
            self.cancel_all()  # the client has gone: nobody will read these
            self.outbox.close(DRAIN_S)

    def send(self, event: dict[str, object]) -> None:
        self.outbox.put(json.dumps(event, ensure_ascii=False) + "\n")

    def _lost(self) -> None:
        """The client went away or fell MAX_BACKLOG behind: stop its generations and disconnect it."""
        self._gone = True
        self.cancel_all()
        self._drop()

    def error(self, rid: object, code: str, message: str) -> None:
        self.send({"id": rid, "event": "error", "code": code, "message": message})

    def handle(self, line: bytes) -> None:
        try:
            request = load_json(line)
        except ValueError as e:
            self.error(None, "bad_json", f"not a JSON line: {e}")
            return
        rid = request.get("id") if isinstance(request, dict) else None
        if not isinstance(request, dict) or not isinstance(rid, str | int) or isinstance(rid, bool):
            self.error(rid, "bad_request", "a request is an object with an 'id' (string or integer) and a 'cmd'")
            return
        commands: dict[str, Callable[[object, dict[str, Any]], None]] = {
            "load": self.load, "generate": self.generate, "chat": self.generate, "cancel": self.cancel,
            "stats": self.stats, "shutdown": self.shutdown}
        cmd = request.get("cmd")
        command = commands.get(cmd) if isinstance(cmd, str) else None
        if command is None:
            self.error(rid, "unknown_command", f"unknown cmd {request.get('cmd')!r}; one of {', '.join(commands)}")
            return
        try:
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

        def run() -> None:  # loading takes seconds: keep reading (cancel, stats) meanwhile
            try:
                worker = self.bridge.pool.load(spec)
            except EdgespecError as e:
                self.error(rid, "load_failed", str(e))
                return
            except Exception as e:  # llama.cpp or the file system may fail in ways we did not name
                log.exception("loading %s failed", spec.name)
                self.error(rid, "load_failed", f"could not load {spec.name!r}: {e}")
                return
            worker.ready.wait()
            self.send({"id": rid, "event": "loaded", "model": worker.name, "n_ctx": worker.engine.n_ctx,
                       "mode": worker.engine.mode, "modes": list(worker.engine.modes)})

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
            if chunk.stats is not None:
                self.send({"id": rid, "event": "stats", "finish_reason": chunk.finish_reason,
                           "text": "".join(pieces), "stats": chunk.stats.to_dict()})

        def on_end(outcome: str, error: EdgespecError | None) -> None:
            with self._lock:
                self._inflight.pop(rid, None)
                self._lock.notify_all()
            if outcome == CANCELLED:
                self.send({"id": rid, "event": "cancelled"})
            elif outcome != DONE:
                assert error is not None
                self.error(rid, _code(error), str(error))

        job = Job(req.start, on_chunk, on_end)
        with self._lock:
            if rid in self._inflight:
                raise ApiError(400, f"request id {rid!r} is already in flight", code="duplicate_id")
            self._inflight[rid] = (worker, job)
        try:
            worker.submit(job)
        except EdgespecError:
            with self._lock:
                self._inflight.pop(rid, None)
            raise

    def cancel(self, rid: object, request: dict[str, Any]) -> None:
        target = request.get("target")
        with self._lock:
            entry = self._inflight.get(target) if isinstance(target, str | int) else None
        if entry is None:
            raise ApiError(400, f"no request {target!r} is in flight", code="unknown_id")
        worker, job = entry
        self.send({"id": rid, "event": "ok", "target": target})
        worker.cancel(job)  # the target's own "cancelled" event follows, within one decode step

    def stats(self, rid: object, _: dict[str, Any]) -> None:
        self.send({"id": rid, "event": "metrics", "models": self.bridge.pool.metrics.snapshot(
            self.bridge.pool.queue_depths())})

    def shutdown(self, rid: object, _: dict[str, Any]) -> None:
        self.cancel_all()
        with self._lock:  # let each cancelled generation say so before "bye" (one decode step each)
            self._lock.wait_for(lambda: not self._inflight, timeout=10)
        self.send({"id": rid, "event": "bye"})
        self.bridge.stop()

    def cancel_all(self) -> None:
        with self._lock:
            entries = list(self._inflight.values())
        for worker, job in entries:
            worker.cancel(job)


def _lines(stream: IO[bytes]) -> Iterator[bytes | None]:
    """Request lines; None for a line longer than MAX_LINE (whose rest is skipped)."""
    while True:
        try:
            line = stream.readline(MAX_LINE + 1)
        except OSError:  # the connection was reset: the client has gone, as at the end of its input
            return
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while (rest := stream.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def _code(e: EdgespecError | ApiError) -> str:
    api = e if isinstance(e, ApiError) else ApiError.from_engine(e)
    return {"invalid_value": "invalid_parameter"}.get(api.code or "", api.code or "bad_request")
