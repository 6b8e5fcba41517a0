"""Issue 38: slow, stuck and careless clients against a live `edgespec bridge` and `edgespec serve`.

No client holds up the others (a bridge client that stops reading), every request can be cancelled (during a
long prefill too), half-sent requests are timed out, and a client that disconnects mid-upload is not a
server error. Everything runs against real subprocesses on the real model, over real sockets.
"""

from __future__ import annotations

import json
import socket
import threading
import time

from edgespec.engine import Engine
from tests.live import free_port
from tests.test_bridge import PROMPT, listening_bridge


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
                if event["event"] in ("stats", "cancelled", "error"):
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
    """The issue's reproduction: one client asks for a long generation and 20,000 stats and never reads; another
    session's generation runs as if it were alone, and the stuck client is disconnected once it is MAX_BACKLOG
    behind."""
    port = free_port()
    with listening_bridge("--port", str(port), address=f"tcp:127.0.0.1:{port}") as proc, \
            socket.create_connection(("127.0.0.1", port), timeout=60) as stuck, \
            socket.create_connection(("127.0.0.1", port), timeout=60) as other:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        lines = [json.dumps({"id": "long", "cmd": "generate", "prompt": PROMPT, "max_tokens": 3000})]
        lines += [json.dumps({"id": i, "cmd": "stats"}) for i in range(20_000)]
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
