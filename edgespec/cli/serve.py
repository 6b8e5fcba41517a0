"""The ``serve`` and ``bridge`` subcommands, registered into the main parser by ``add_service_commands``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ..engine.engine import MODES
from ..engine.prompt_cache import DEFAULT_CACHE_MB
from ..errors import EdgespecError
from ..extras import needed
from ..server.bridge import MAX_SESSIONS, Bridge
from ..server.limits import ConnectionLimits
from ..server.pool import EngineSpec, ModelPool

_CACHE_HELP = ("memory in MB for the KV states of recent conversations, so that several chats alternate without "
               "re-reading their history (0: only the last one's; default %(default)s)")


def add_service_commands(sub: argparse._SubParsersAction, add_model_args: Callable[[argparse.ArgumentParser], None]
                         ) -> None:
    """``add_model_args`` is the CLI's own --model/--draft/--gamma/--ctx/... so every command loads alike."""
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with a chat page")
    add_model_args(s)
    s.add_argument("--mode", choices=MODES, default=None,
                   help="default drafter for requests (default: 'draft' with a draft model, else --draft)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: loopback only; see --allow-unauthenticated)")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--api-key", default=os.environ.get("EDGESPEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 and /metrics (default: $EDGESPEC_API_KEY)")
    s.add_argument("--max-queue", type=int, default=16, help="requests that may wait per model (then 429)")
    s.add_argument("--cors-origin", action="append", default=[],
                   help="allow browser pages from this origin (repeatable; '*' for any)")
    s.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer requests addressed to this host name (repeatable; '*' for any); a loopback "
                        "server answers only localhost, 127.0.0.1 and [::1] otherwise (DNS rebinding)")
    s.add_argument("--allow-unauthenticated", action="store_true",
                   help="listen on a non-loopback --host without --api-key (anyone on the network may use it)")
    s.add_argument("--max-body", type=int, default=1 << 20, help="largest request body in bytes (then 413)")
    s.add_argument("--cache-mb", type=float, default=DEFAULT_CACHE_MB, help=_CACHE_HELP)
    s.add_argument("--header-timeout", type=float, default=ConnectionLimits.header_timeout,
                   help="seconds a client may take to send a request's head; then the connection is closed "
                        "(default %(default)s)")
    s.add_argument("--body-timeout", type=float, default=ConnectionLimits.body_timeout,
                   help="seconds a client may take to send a request's body once its head is in; then the "
                        "connection is closed (default %(default)s)")
    s.add_argument("--max-connections", type=int, default=ConnectionLimits.max_connections,
                   help="open connections at once; one beyond them is closed unread (default %(default)s)")
    s.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight streams may take to finish on shutdown before they are cancelled")
    s.set_defaults(func=_serve)

    b = sub.add_parser("bridge", help="JSON lines over stdin/stdout or a local socket (docs/bridge-protocol.md)")
    add_model_args(b)
    b.add_argument("--mode", choices=MODES, default=None, help="default drafter, as for serve")
    b.add_argument("--no-preload", action="store_true", help="load nothing until a 'load' command")
    where = b.add_mutually_exclusive_group()
    where.add_argument("--socket", metavar="PATH", help="listen on this unix socket instead of stdin/stdout")
    where.add_argument("--port", type=int, help="listen on 127.0.0.1:PORT instead of stdin/stdout")
    b.add_argument("--max-queue", type=int, default=16, help="requests that may wait per model")
    b.add_argument("--max-connections", type=int, default=MAX_SESSIONS,
                   help="with --socket/--port: connections served at once; one beyond them gets an error line and "
                        "is closed (default %(default)s)")
    b.add_argument("--cache-mb", type=float, default=DEFAULT_CACHE_MB, help=_CACHE_HELP)
    b.set_defaults(func=_bridge)


def _spec(args: argparse.Namespace) -> EngineSpec:
    return EngineSpec(args.model, args.draft, args.mode, args.gamma, args.ctx, args.threads, args.device,
                      args.fast_numerics, args.backend, cache_mb=args.cache_mb, require_exact=args.require_exact)


def _serve(args: argparse.Namespace) -> int:
    with needed("server", "edgespec serve"):
        from ..server.app import create_app, run
        from ..server.guard import allowed_hosts, is_loopback

    if not is_loopback(args.host) and not args.api_key:
        if not args.allow_unauthenticated:
            raise EdgespecError(f"--host {args.host} lets other machines in, and there is no --api-key: set one "
                                "(or $EDGESPEC_API_KEY), or pass --allow-unauthenticated to serve anyone")
        print(f"edgespec: WARNING: serving on {args.host} WITHOUT an API key: anyone who can reach this address "
              "can use the model", file=sys.stderr, flush=True)
    limits = ConnectionLimits(args.header_timeout, args.body_timeout, args.max_connections)
    pool = ModelPool(args.max_queue)
    pool.load(_spec(args))
    app = create_app(pool, api_key=args.api_key, cors_origins=args.cors_origin, max_body=args.max_body,
                     hosts=allowed_hosts(args.host, args.allowed_host))
    print(f"edgespec: serving {_spec(args).name} on http://{args.host}:{args.port}/ (ready when /health says ok)",
          file=sys.stderr, flush=True)
    run(app, pool, args.host, args.port, args.shutdown_timeout, limits)
    return 0


def _bridge(args: argparse.Namespace) -> int:
    pool = ModelPool(args.max_queue)
    bridge = Bridge(pool, _spec(args))
    if not args.no_preload:
        pool.load(_spec(args))
    if args.socket:
        return bridge.serve_unix(args.socket, args.max_connections)
    if args.port is not None:
        return bridge.serve_tcp(args.port, args.max_connections)
    return bridge.serve_stdio()
