"""The OpenAI-compatible HTTP server (Starlette): /v1/chat/completions, /v1/completions, /v1/models,
/health, /metrics and the chat page at /; and Ollama's API beside it (/api/chat, /api/generate, /api/tags,
/api/show, /api/ps, /api/version: ollama_api.py).

A request is parsed, queued on its model's worker and answered from the worker's chunks, which cross
from the worker thread into the event loop through an asyncio queue. The HTTP status is decided by the
first event (so a prompt too long for the context is a 400 even when streaming); after that the reply
streams as server-sent events (Ollama's: JSON lines). A client that goes away cancels its job, queued or
running.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import re
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection, Iterable
from importlib.resources import files
from types import FrameType
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn import Config, Server

from ..engine.engine import StreamChunk
from ..engine.stats import GenerationStats
from ..engine.tools import ToolReply
from ..errors import EdgespecError
from . import ollama_api as ollama
from .guard import LOOPBACK_HOSTS, RequestGuard, error_response
from .limits import ConnectionLimits, limited_protocol
from .metrics import Metrics
from .openai_api import (
    ApiError,
    GenerationRequest,
    LogprobsFormat,
    chunk_body,
    completion_body,
    draft_chars,
    join_logprobs,
    load_json,
    new_id,
    parse_chat,
    parse_completion,
    usage_chunk,
)
from .pool import ModelPool
from .worker import CANCELLED, FAILED, EngineWorker, Job

log = logging.getLogger("edgespec.server")
T = TypeVar("T")
# (chunk, (draft chars, its logprobs in OpenAI's shape)) or (outcome, error)
_Event = tuple[StreamChunk, tuple[int, dict[str, list[Any]] | None]] | tuple[str, EdgespecError | None]


class ClientGone(Exception):
    """The client disconnected before its reply could start."""


class _Generation:
    """A job on a worker whose chunks arrive in this event loop, in order, ending with (outcome, error)."""

    def __init__(self, worker: EngineWorker, req: GenerationRequest) -> None:
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[_Event] = asyncio.Queue()
        self.worker = worker
        piece = worker.engine.target.piece
        logprobs = LogprobsFormat(req.chat, piece)
        self.job = Job(req.start,
                       lambda c: loop.call_soon_threadsafe(self.events.put_nowait,
                                                           (c, (draft_chars(c, piece), logprobs(c.logprobs)))),
                       lambda outcome, err: loop.call_soon_threadsafe(self.events.put_nowait, (outcome, err)))
        worker.submit(self.job)

    def cancel(self) -> None:
        self.worker.cancel(self.job)


def create_app(pool: ModelPool, *, api_key: str | None = None, cors_origins: Iterable[str] = (),
               max_body: int = 1 << 20, hosts: Collection[str] | None = LOOPBACK_HOSTS) -> Starlette:
    """``hosts``: the Host names answered (None: any; see guard.allowed_hosts)."""
    page = files("edgespec.server").joinpath("static/index.html").read_text(encoding="utf-8")
    page_headers = _page_headers(page)

    async def index(_: Request) -> Response:
        return HTMLResponse(page, headers=page_headers)

    async def health(_: Request) -> Response:
        models = {w.name: {"ready": w.ready.is_set(), "queue_depth": w.depth,
                           **({"error": w.failure} if w.failure else {})} for w in pool.workers}
        failed = any("error" in m for m in models.values())
        ready = bool(models) and all(m["ready"] for m in models.values()) and not failed
        status = "ok" if ready else "error" if failed else "loading"
        return JSONResponse({"status": status, "models": models}, 200 if ready else 503)

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(pool.metrics.prometheus(pool.gauges()),
                                 media_type="text/plain; version=0.0.4")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": w.name, "object": "model", "created": 0, "owned_by": "edgespec",
             "n_ctx": w.engine.n_ctx, "modes": list(w.engine.modes), "mode": w.engine.mode}
            for w in pool.workers]})

    async def chat_completions(request: Request) -> Response:
        return await _generate(request, parse_chat(await _read_json(request, max_body)))

    async def completions(request: Request) -> Response:
        return await _generate(request, parse_completion(await _read_json(request, max_body)))

    async def _generate(request: Request, req: GenerationRequest) -> Response:
        worker = pool.get(req.model)
        rid, name = new_id(req.chat), worker.name
        return await _reply(request, _Generation(worker, req), req,
                            lambda text, finish, stats, logprobs, reply: completion_body(
                                req, rid, name, text, finish, stats, logprobs, reply),
                            lambda gen, first: _sse(gen, req, rid, name, first), "text/event-stream")

    # -- Ollama's API: the same generation path, Ollama's request and reply shapes ------------------------
    def _ollama_worker(model: str | None) -> EngineWorker:
        return pool.get(ollama.model_name(model, [w.name for w in pool.workers]))

    async def ollama_chat(request: Request) -> Response:
        return await _ollama_generate(request, ollama.parse_chat_request(await _read_json(request, max_body)))

    async def ollama_generate(request: Request) -> Response:
        return await _ollama_generate(request, ollama.parse_generate_request(await _read_json(request, max_body)))

    async def _ollama_generate(request: Request, req: ollama.OllamaRequest | ollama.LoadOnly) -> Response:
        worker = _ollama_worker(req.model)
        if isinstance(req, ollama.LoadOnly):
            return JSONResponse(ollama.load_body(worker.name, req.reply))
        name = worker.name
        return await _reply(request, _Generation(worker, req), req,
                            lambda text, finish, stats, _, reply: ollama.final_body(req, name, text, finish, stats,
                                                                                    reply),
                            lambda gen, first: _ndjson(gen, req, name, first), "application/x-ndjson")

    async def ollama_tags(_: Request) -> Response:
        return JSONResponse({"models": [ollama.tags_entry(w.name, w.engine.target.path) for w in pool.workers]})

    async def ollama_ps(_: Request) -> Response:
        return JSONResponse({"models": [ollama.ps_entry(w.name, w.engine.target.path, w.engine.n_ctx,
                                                        pool.spec(w.name).device) for w in pool.workers]})

    async def ollama_show(request: Request) -> Response:
        return JSONResponse(ollama.show_body(_ollama_worker(ollama.parse_show(await _read_json(request, max_body)))
                                             .engine))

    async def ollama_version(_: Request) -> Response:
        return JSONResponse(ollama.version_body())

    # HEAD / (the ollama CLI's health check) is answered as GET /: 200.
    routes = [Route("/", index), Route("/health", health), Route("/metrics", metrics),
              Route("/v1/models", models), Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/api/chat", ollama_chat, methods=["POST"]),
              Route("/api/generate", ollama_generate, methods=["POST"]),
              Route("/api/show", ollama_show, methods=["POST"]), Route("/api/tags", ollama_tags),
              Route("/api/ps", ollama_ps), Route("/api/version", ollama_version)]
    # The guard first (a foreign Host or Origin learns nothing, not even CORS headers); CORS outside the key
    # check, so that a browser can read a 401 too.
    cors_origins = list(cors_origins)
    middleware = [Middleware(RequestGuard, hosts=hosts, cors_origins=cors_origins, metrics=pool.metrics)]
    if cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"]))
    if api_key:
        middleware.append(Middleware(ApiKeyMiddleware, key=api_key, metrics=pool.metrics))

    async def refuse(request: Request, e: Exception) -> Response:
        return error_response(_as_api_error(e), request.url.path, pool.metrics)

    return Starlette(routes=routes, middleware=middleware, lifespan=_lifespan(pool),
                     exception_handlers={ApiError: refuse, EdgespecError: refuse, HTTPException: refuse,
                                         ClientDisconnect: _client_gone, Exception: refuse})


def _page_headers(page: str) -> dict[str, str]:
    """The chat page may not be framed by another site (clickjacking), and runs its own inline script and style
    only (their hashes), talking to this server alone."""
    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)

    policy = (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; connect-src 'self'; "
              "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return {"Content-Security-Policy": policy, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}


async def _reply(request: Request, gen: _Generation, req: GenerationRequest,
                 whole: Callable[[str, str, GenerationStats, dict[str, list[Any]] | None, ToolReply | None],
                                 dict[str, object]],
                 stream: Callable[[_Generation, _Event], AsyncGenerator[bytes, None]], media_type: str) -> Response:
    """The reply as one object, ``whole(text, finish_reason, stats, logprobs, tool reply)``, or streamed (``stream``)
    once the first event says the generation has started: until then an error still gets its status code."""
    try:
        if not req.stream:
            return JSONResponse(whole(*await _unless_disconnected(request, _collect(gen, req.prompt_param))))
        first = await _unless_disconnected(request, gen.events.get())
    except ClientGone:
        gen.cancel()
        return Response(status_code=499)  # nobody reads it: the client has gone
    except BaseException:
        gen.cancel()
        raise
    _raise_if_ended(first, req.prompt_param)
    return EventStream(stream(gen, first), on_disconnect=gen.cancel, media_type=media_type)


async def _collect(gen: _Generation, prompt_param: str
                   ) -> tuple[str, str, GenerationStats, dict[str, list[Any]] | None, ToolReply | None]:
    """The whole text, why it ended, the stats, the logprobs in OpenAI's shape (None: not asked for), and the text
    read for tool calls (None: no tools)."""
    pieces: list[str] = []
    logprobs: list[dict[str, list[Any]] | None] = []
    while True:
        event = await gen.events.get()
        _raise_if_ended(event, prompt_param)
        chunk, (_, chunk_logprobs) = event
        assert isinstance(chunk, StreamChunk)
        pieces.append(chunk.text)
        logprobs.append(chunk_logprobs)
        if chunk.stats is not None:
            assert chunk.finish_reason is not None
            return "".join(pieces), chunk.finish_reason, chunk.stats, join_logprobs(logprobs), chunk.reply


def _raise_if_ended(event: _Event, prompt_param: str) -> None:
    """An (outcome, error) event before the last chunk: the job failed or was cancelled (shutdown)."""
    outcome, error = event
    if outcome == FAILED:
        assert error is not None
        raise ApiError.from_engine(error, prompt_param)
    if outcome == CANCELLED:
        raise ApiError(503, "the generation was cancelled: the server is shutting down", type="server_error",
                       code="cancelled")


async def _sse(gen: _Generation, req: GenerationRequest, rid: str, model: str,
               first: _Event) -> AsyncGenerator[bytes, None]:
    if req.chat:
        yield _data(chunk_body(req, rid, model, None, first=True))
    event, stats = first, None
    while isinstance(event[0], StreamChunk):
        chunk, (n_draft, logprobs) = event
        stats = chunk.stats or stats
        yield _data(chunk_body(req, rid, model, chunk, n_draft, logprobs=logprobs))
        event = await gen.events.get()
    try:
        _raise_if_ended(event, req.prompt_param)
    except ApiError as e:  # too late for a status code: the error becomes the last event
        yield _data(e.body())
    if req.include_usage and stats is not None:
        yield _data(usage_chunk(req, rid, model, stats))
    yield b"data: [DONE]\n\n"


def _data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _ndjson(gen: _Generation, req: ollama.OllamaRequest, model: str,
                  first: _Event) -> AsyncGenerator[bytes, None]:
    """Ollama's stream: a line per chunk of text, then the last line, ``done``, with the stats (and, with tools, the
    whole reply: its text is read for calls once it is whole)."""
    event = first
    while isinstance(event[0], StreamChunk):
        chunk = event[0]
        if chunk.text and not req.calls_tools:
            yield _line(ollama.piece_body(req, model, chunk.text))
        if chunk.stats is not None:
            assert chunk.finish_reason is not None
            yield _line(ollama.final_body(req, model, "", chunk.finish_reason, chunk.stats, chunk.reply))
        event = await gen.events.get()
    try:
        _raise_if_ended(event, req.prompt_param)
    except ApiError as e:  # too late for a status code: Ollama's clients read an error line
        yield _line(ollama.error_body(e))


def _line(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


class EventStream(Response):
    """A streamed reply (server-sent events, or Ollama's JSON lines) that calls ``on_disconnect`` the moment the
    client goes away.

    Starlette's StreamingResponse only notices a disconnect on its next write (ASGI 2.4) or cancels the
    iterator without telling us; here a watcher task reads ``http.disconnect`` while events are written.
    """

    def __init__(self, events: AsyncGenerator[bytes, None], on_disconnect: Callable[[], None],
                 media_type: str = "text/event-stream") -> None:
        # Not Response.__init__: it would declare a Content-Length for an empty body.
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", f"{media_type}; charset=utf-8".encode()), (b"cache-control", b"no-cache"),
                            (b"x-accel-buffering", b"no")]
        self.events, self.on_disconnect = events, on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.ensure_future(self._write(send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({writer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not writer.done():
                self.on_disconnect()
            for task in (writer, watcher):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await writer
            await self.events.aclose()

    async def _write(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for data in self.events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away while we wrote (ASGI 2.4 servers raise)
            self.on_disconnect()


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, or raise ClientGone if the client disconnects first (e.g. while queued)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise ClientGone
    return task.result()


async def _read_json(request: Request, limit: int) -> object:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    try:
        return load_json(body)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors too
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


class ApiKeyMiddleware:
    """``Authorization: Bearer KEY`` on the APIs (OpenAI's and Ollama's) and metrics; the page and /health stay
    open."""

    def __init__(self, app: ASGIApp, key: str, metrics: Metrics) -> None:
        self.app, self.key, self.metrics = app, key.encode(), metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        protected = scope["type"] == "http" and scope.get("method") != "OPTIONS" and \
            (path.startswith(("/v1/", ollama.PREFIX)) or path == "/metrics")
        if protected:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, given = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                error = ApiError(401, "a valid API key is required: send 'Authorization: Bearer KEY'",
                                 type="authentication_error", code="invalid_api_key",
                                 headers={"WWW-Authenticate": 'Bearer realm="edgespec"'})
                await error_response(error, path, self.metrics)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _as_api_error(e: Exception) -> ApiError:
    """The error reply to what a route raised."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, EdgespecError):
        return ApiError.from_engine(e)
    if isinstance(e, HTTPException):
        # e.headers: a 405's Allow, naming the methods the path takes.
        return ApiError(e.status_code, e.detail, code="not_found" if e.status_code == 404 else None,
                        headers=dict(e.headers or {}))
    log.error("unhandled error", exc_info=e)
    return ApiError(500, "internal server error; see the server log", type="server_error", code="internal_error")


async def _client_gone(_: Request, e: Exception) -> Response:
    """The client went away while sending its request (or took longer than --body-timeout): nobody reads an
    answer, and it is not a server error."""
    return Response(status_code=499)


def _lifespan(pool: ModelPool) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        # uvicorn has let in-flight streams finish (up to its graceful-shutdown timeout): cancel the rest.
        await asyncio.to_thread(pool.close)

    return lifespan


class _DrainingServer(Server):
    """On a stop signal uvicorn lets open streams run for its graceful-shutdown timeout, then cuts them.
    Cancel their generations a little before that instead, so each stream still ends properly (an error
    event, then [DONE]) and the client can tell a shutdown from a network fault."""

    def __init__(self, config: Config, pool: ModelPool, grace: float) -> None:
        super().__init__(config)
        self._drain = threading.Timer(max(0.0, grace - 0.5), pool.cancel_all)
        self._drain.daemon = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self._drain.is_alive() and not self._drain.finished.is_set():
            self._drain.start()
        super().handle_exit(sig, frame)


def run(app: ASGIApp, pool: ModelPool, host: str, port: int, shutdown_timeout: float,
        limits: ConnectionLimits) -> None:
    config = Config(app, host=host, port=port, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=shutdown_timeout, http=limited_protocol(limits))
    # uvicorn re-raises the stop signal once it has shut down; Ctrl-C is how a server ends, not an error.
    with contextlib.suppress(KeyboardInterrupt):
        _DrainingServer(config, pool, shutdown_timeout).run()
