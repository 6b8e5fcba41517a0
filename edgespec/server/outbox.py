"""One client's outgoing lines and the thread that writes them, so that nobody else ever waits on its socket.

The engine's worker thread hands a session's events to its outbox and goes on with the next step: a client
that stops reading fills its own outbox, not the worker's time (as the HTTP server's per-request event queues
do). An outbox holding more than ``limit`` unwritten bytes gives up on its client (``on_lost`` is called, and
the bridge drops the connection), so a stuck reader costs at most that much memory.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import IO


class Outbox:
    def __init__(self, out: IO[str], limit: int, on_lost: Callable[[], None], name: str) -> None:
        self._out, self._limit, self._on_lost = out, limit, on_lost
        self._lines: deque[str] = deque()
        self._unwritten = 0  # bytes queued or being written
        self._closed = False  # no more lines are taken; the writer ends once the queue is empty
        self._lost = False  # the client stopped reading or went away: its lines are dropped
        self._cond = threading.Condition()
        self._writer = threading.Thread(target=self._write, name=name, daemon=True)
        self._writer.start()

    def put(self, line: str) -> None:
        """Queue one line (never blocks); dropped once the client is lost or the outbox closed."""
        size = len(line.encode("utf-8"))
        with self._cond:
            if self._closed:
                return
            if self._unwritten + size <= self._limit:
                self._lines.append(line)
                self._unwritten += size
                self._cond.notify()
                return
        self._lose()  # the client is this far behind: it is not reading

    def close(self, timeout: float) -> None:
        """Take no more lines; wait up to ``timeout`` seconds for the queued ones to be written."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._writer.join(timeout)

    def _lose(self) -> None:
        with self._cond:
            first = not self._lost
            self._lost = self._closed = True
            self._lines.clear()
            self._cond.notify()
        if first:
            self._on_lost()

    def _write(self) -> None:
        while True:
            with self._cond:
                while not self._lines and not self._closed:
                    self._cond.wait()
                if not self._lines:
                    return
                batch = "".join(self._lines)
                size = self._unwritten
                self._lines.clear()
            try:
                self._out.write(batch)
                self._out.flush()
            except (OSError, ValueError):  # broken pipe, reset or closed stream: the client has gone
                self._lose()
                return
            with self._cond:
                self._unwritten -= size
