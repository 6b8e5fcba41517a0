"""What a web page must not be able to do to a server on this machine.

A page on any site can make the browser send requests to 127.0.0.1. Three checks stop it, before any
route runs:

- **Host** (DNS rebinding): a page whose own domain re-resolves to 127.0.0.1 talks to the server under
  its domain's name. A loopback-bound server answers only ``localhost``, ``127.0.0.1`` and ``[::1]`` (and
  the names given with ``--allowed-host``); others get 403, as Ollama, Jupyter and VS Code do.
- **Origin**: a browser names the page that sent a request; a page that is neither the server's own
  (the chat page) nor listed with ``--cors-origin`` gets 403.
- **Content type**: a cross-site ``text/plain`` POST is a "simple" request that no CORS preflight stops;
  the APIs (OpenAI's and Ollama's) take ``application/json`` only (415 otherwise), which a foreign page cannot
  send unasked.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from . import ollama_api
from .metrics import Metrics
from .openai_api import ApiError

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, extra: Collection[str] = ()) -> frozenset[str] | None:
    """The Host names a server bound to ``bind`` answers; None: any. A loopback server answers its loopback
    names and ``extra``; a server bound to a network address answers any name unless ``extra`` lists some
    ('*' in ``extra``: any)."""
    if "*" in extra:
        return None
    names = frozenset(filter(None, (_hostname(h) for h in extra)))
    if is_loopback(bind):
        return LOOPBACK_HOSTS | names
    return names or None


def _hostname(host: str) -> str | None:
    """``host[:port]`` → the lower-case name (IPv6 without brackets); None if it cannot be a host."""
    try:
        return urlsplit("//" + host).hostname
    except ValueError:
        return None


def _same_origin(origin: str, host: str) -> bool:
    """The page was served by this server (the chat page): its origin's host[:port] is the request's Host."""
    try:
        return bool(host) and urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:
        return False


def error_response(e: ApiError, path: str, metrics: Metrics) -> Response:
    """The reply to a refused or failed request, in the shape of the API ``path`` belongs to (Ollama's
    ``{"error": "..."}`` under its paths, else OpenAI's); every one is counted in /metrics by status and code."""
    metrics.count_error(e.status, e.code)
    body = ollama_api.error_body(e) if path.startswith(ollama_api.PREFIX) else e.body()
    return JSONResponse(body, e.status, headers=e.headers)


class RequestGuard:
    """ASGI middleware: the Host, Origin and content-type checks described above."""

    def __init__(self, app: ASGIApp, hosts: Collection[str] | None, cors_origins: Collection[str],
                 metrics: Metrics) -> None:
        self.app, self.hosts, self.cors_origins, self.metrics = app, hosts, frozenset(cors_origins), metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = self.check(scope["method"], scope["path"], Headers(scope=scope)) if scope["type"] == "http" else None
        if error is not None:
            await error_response(error, scope["path"], self.metrics)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def check(self, method: str, path: str, headers: Headers) -> ApiError | None:
        host = headers.get("host", "")
        if self.hosts is not None and host and _hostname(host) not in self.hosts:
            # No Host at all (HTTP/1.0) cannot come from a browser, so it is not refused.
            return ApiError(403, f"this server does not answer to the host name {host[:100]!r}; start it with "
                            "--allowed-host NAME to allow it", type="permission_error", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and "*" not in self.cors_origins and origin not in self.cors_origins and \
                not _same_origin(origin, host):
            return ApiError(403, f"requests from web pages at {origin[:100]!r} are not allowed; start the server "
                            "with --cors-origin ORIGIN to allow them", type="permission_error",
                            code="origin_not_allowed")
        media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if method == "POST" and path.startswith(("/v1/", ollama_api.PREFIX)) and media_type != "application/json":
            # Answered before CORSMiddleware runs: an allowed page gets its CORS header here, to read the error.
            cors = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"} if origin is not None and \
                not _same_origin(origin, host) else {}
            return ApiError(415, "the request body must be JSON, sent with 'Content-Type: application/json'",
                            code="unsupported_media_type", headers=cors)
        return None
