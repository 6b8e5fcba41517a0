"""What uvicorn does not bound by itself: how long a client may take to send its request, and how many
connections may be open at once.

uvicorn closes idle keep-alive connections (after ``timeout_keep_alive``, 5 s), but it waits forever for a request
whose head or body never finishes arriving, and it takes any number of connections: a client sending half
requests (a slowloris) ties up a file descriptor per connection for good. ``limited_protocol`` is uvicorn's own
h11 protocol with those three bounds added; a connection past one of them is closed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..errors import InvalidParameterError


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0  # seconds from a connection (or its first byte after a reply) to a whole request head
    body_timeout: float = 30.0  # seconds from the request head to the end of its body
    max_connections: int = 256  # open at once; a connection beyond them is closed unread

    def __post_init__(self) -> None:
        if not (self.header_timeout > 0 and self.body_timeout > 0 and self.max_connections >= 1):
            raise InvalidParameterError("--header-timeout and --body-timeout must be > 0, --max-connections >= 1")


def limited_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol under ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""
    import h11  # the server extra's (ConnectionLimits alone is the CLI's, which must not need it)
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class LimitedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _phase: str | None = None  # what the client is expected to finish sending: "head", "body" or nothing

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.close()
                return
            self._expect("head")

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            state = self.conn.their_state
            # IDLE after data: part of a (next) request's head has come; SEND_BODY: the head is in, the body not.
            self._expect("head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None)

        def connection_lost(self, exc: Exception | None) -> None:
            self._expect(None)
            super().connection_lost(exc)

        def _expect(self, phase: str | None) -> None:
            if phase == self._phase:
                return  # the deadline runs from the start of the phase, not from the last byte
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            self._phase = phase
            if phase is not None:
                timeout = limits.header_timeout if phase == "head" else limits.body_timeout
                self._deadline = self.loop.call_later(timeout, self._too_slow)

        def _too_slow(self) -> None:
            # The app, if one is reading the body, sees the client disconnect.
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return LimitedH11Protocol
