"""Current: a tool the manual uses.
What a bridge client that stops reading costs the other sessions: their tokens/s with and without one.

    python benchmarks/stalled_client.py [--model M] [--threads 1] [--rounds 5] [--max-tokens 64] [--out FILE]

Starts `edgespec bridge --port P` and, in each round, times one session's greedy generation alone, then beside
another client that asked first for a --busy-tokens generation and --stats-lines `stats` answers and reads them,
then beside one that asked the same and reads nothing (before each session had its own
writer, the engine's worker blocked on the stalled client's full socket and every other session waited until it
disconnected; here that would be never). Per scenario: the generating session's decode tokens/s (the engine's
own clock) and end-to-end tokens/s (from sending its request to its last event, waiting included), medians over
the rounds. Run it on a quiet machine: the figures are only comparable within one run, where the scenarios
alternate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

PROMPT = "1, 2, 3, 4, 5,"  # counting on: the greedy output runs to max_tokens
# The generating session runs alone, after a client that reads its answers, and after one that reads none: the
# last two wait alike for the busy client's generation, queued first, so their difference is what the stall costs.
SCENARIOS = {"alone": None, "beside a reading client": "reads", "beside a stalled client": "stalls"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _generate(port: int, max_tokens: int, rid: str) -> dict[str, float]:
    """One greedy generation on a connection of its own: decode and end-to-end tokens/s."""
    with socket.create_connection(("127.0.0.1", port), timeout=600) as conn:
        stream = conn.makefile("rwb")
        json.loads(stream.readline())  # ready
        started = time.perf_counter()
        stream.write(json.dumps({"id": rid, "cmd": "generate", "prompt": PROMPT, "max_tokens": max_tokens,
                                 "speculative": {"mode": "none"}}).encode() + b"\n")
        stream.flush()
        while (event := json.loads(stream.readline()))["event"] not in ("stats", "error", "cancelled"):
            pass
        elapsed = time.perf_counter() - started
    if event["event"] != "stats":
        raise RuntimeError(f"the generation ended with {event}")
    stats = event["stats"]
    return {"decode_tokens_per_s": stats["decode_tokens_per_s"],
            "end_to_end_tokens_per_s": stats["generated_tokens"] / elapsed, "seconds": elapsed}


def _busy_client(port: int, max_tokens: int, stats_lines: int, reads: bool) -> socket.socket:
    """A client that asks for a generation and many stats, and reads the answers (on a thread) or never does."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=600)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    if reads:
        threading.Thread(target=_drain, args=(conn,), daemon=True).start()
    lines = [json.dumps({"id": "busy", "cmd": "generate", "prompt": PROMPT, "max_tokens": max_tokens,
                         "speculative": {"mode": "none"}})]
    lines += [json.dumps({"id": i, "cmd": "stats"}) for i in range(stats_lines)]
    data = ("\n".join(lines) + "\n").encode()
    # Sent on a thread: a bridge that stops reading this client would leave the rest unsent.
    threading.Thread(target=_send, args=(conn, data), daemon=True).start()
    return conn


def _send(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # closed under it at the end of the round
        conn.sendall(data)


def _drain(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed under it at the end of the round
        while conn.recv(1 << 16):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="(named: no default-model race first)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--busy-tokens", type=int, default=128, help="the busy client's generation")
    parser.add_argument("--stats-lines", type=int, default=2_000,
                        help="stats the busy client asks for (their answers stay below the bridge's 4 MB backlog "
                             "bound, so the stalled client stays connected throughout)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().with_name("results") / "stalled_client.json")
    args = parser.parse_args()

    port = _free_port()
    command = [sys.executable, "-m", "edgespec.cli", "bridge", "--port", str(port), "--threads", str(args.threads),
               "--gamma", "4", "--model", args.model]
    bridge = subprocess.Popen(command, stdout=subprocess.PIPE)
    try:
        assert bridge.stdout is not None
        json.loads(bridge.stdout.readline())  # listening
        _generate(port, 4, "warm-up")
        results: dict[str, list[dict[str, float]]] = {name: [] for name in SCENARIOS}
        for r in range(args.rounds):
            for name, busy in SCENARIOS.items():
                other = None if busy is None else _busy_client(port, args.busy_tokens, args.stats_lines,
                                                               reads=busy == "reads")
                time.sleep(0.5)  # its generation is running and its answers are being read, or piling up
                results[name].append(_generate(port, args.max_tokens, f"{name}-{r}"))
                if other is not None:
                    other.close()
                time.sleep(0.5)  # the busy client's session has ended
    finally:
        bridge.kill()
        bridge.wait()

    summary = {name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
               for name, runs in results.items()}
    print(f"{'scenario':<26} {'decode tok/s':>13} {'end-to-end tok/s':>17} {'seconds':>8}")
    for name, s in summary.items():
        print(f"{name:<26} {s['decode_tokens_per_s']:>13.1f} {s['end_to_end_tokens_per_s']:>17.1f} "
              f"{s['seconds']:>8.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "median": summary,
                                    "rounds": results}, indent=1))
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
