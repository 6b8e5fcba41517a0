"""Current: a tool the manual uses.
Soak: a real `edgespec serve` and `edgespec bridge` under a long bounded loop of mixed requests, watching memory.

    python benchmarks/soak.py [--minutes 60] [--clients 3] [--sample-s 5] [--flat-mb 5] [--out FILE]

Starts `edgespec serve` and `edgespec bridge --socket` on the shipped default model with one thread each, as the
tests do (tests/live.py), all on 127.0.0.1 or a unix socket. For --minutes, --clients HTTP clients and one bridge
client each send one request at a time, chosen at random (seeded) from: chat streams and plain completions, greedy
and sampled; streams cancelled mid-way by closing the connection; prompts of token ids near the context (half
sharing a prefix the prompt cache can reuse); and requests meant to be refused with a 400. The bridge client also
cancels with `cancel`, sends bad lines (bytes that are not UTF-8, unknown keys, a duplicate id) and ends each
session by half-closing it with a generation running, which must still end with its `stats` event.

Every --sample-s seconds it records the RSS of both processes (psutil) and the server's prompt-cache bytes
(`edgespec_prompt_cache_bytes` in /metrics: bounded by --cache-mb, 256 MB, it explains early growth). At the end it
prints per-10-minute RSS (min/median/max), the requests by kind and outcome, whether each request ended exactly
once (one finish and one [DONE] per HTTP stream, one ending event per bridge request), whether /metrics agrees with
what the clients saw (the server's /metrics, the bridge's `stats`), and whether the server's RSS is flat over the
second half of the run (the last 30 minutes of an hour): the slope of a linear fit in MB per 10 minutes, the growth
that fit makes over the half (flat: within --flat-mb), and max - min. The slope with the cache's bytes taken out
says whether any growth is the cache's. Results are saved as JSON (--out; by default under
benchmarks/results/, which git ignores). Exit status 0 when every check holds and RSS is flat. A run of a few
minutes checks the machinery only: the cache fills during the first minutes, so RSS is not yet flat.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' way of starting servers and bridges, reused

from tests.live import LiveServer  # noqa: E402
from tests.server.test_bridge import ENDINGS, listening_bridge  # noqa: E402

MB = 1 << 20
WINDOW_S = 600  # the RSS table's rows: 10 minutes each
TIMEOUT_S = 600  # any one request, waiting in the queue included; a longer one is a failure, never a hang
COUNTING = "1, 2, 3, 4, 5,"  # greedy output runs to max_tokens: a stream long enough to cancel mid-way
MESSAGES = [[{"role": "user", "content": "Name three colours of the rainbow."}],
            [{"role": "system", "content": "You answer in one sentence."},
             {"role": "user", "content": "Why is the sky blue?"}],
            [{"role": "user", "content": "Write a haiku about memory."}]]
PROMPTS = ["The capital of France is", "List the days of the week, one per line:\nMonday\n", COUNTING,
           "def fibonacci(n):"]
# Requests meant to be refused: (body, raw body instead of JSON, the expected code, whether the engine refuses it
# on its worker, counting it in edgespec_requests_total{outcome="client_error"} too).
BAD = [({"prompt": "x", "temprature": 0.5}, None, "unknown_parameter", False),
       ({"prompt": "x", "temperature": "hot"}, None, "invalid_type", False),
       ({"prompt": "x", "n": 2}, None, "unsupported", False),
       (None, b'{"prompt": ', "invalid_json", False),
       ({"prompt": "x", "max_tokens": -1}, None, "invalid_value", True),
       ({"prompt": "overflow"}, None, "context_length_exceeded", True)]  # prompt: token ids beyond the context


@dataclass
class Outcome:
    transport: str  # http or bridge
    kind: str
    outcome: str  # done, cancelled, refused or failed
    code: str | None = None  # a refusal's error code; a failure's description
    engine_refused: bool = False
    seconds: float = 0.0


@dataclass
class Soak:
    n_ctx: int
    deadline: float
    outcomes: list[Outcome] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # requests that did not end exactly once
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)


# -- HTTP clients ------------------------------------------------------------------------------------------------
def _sampling(rng: random.Random) -> dict[str, Any]:
    return {"temperature": 0} if rng.random() < 0.5 else {"temperature": 0.8, "seed": rng.randrange(1 << 30)}


def _read_stream(response: httpx.Response, stop_after: int | None = None) -> tuple[int, int, int]:
    """(data chunks, chunks with a finish_reason, [DONE]s) of an SSE reply; with ``stop_after``, stop reading after
    that many chunks (the caller then closes the connection)."""
    chunks = finishes = done = 0
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done += 1
            continue
        body = json.loads(line[6:])
        if "error" in body:
            raise RuntimeError(f"the stream ended with an error: {body['error']}")
        chunks += 1
        finishes += sum(c.get("finish_reason") is not None for c in body["choices"])
        if stop_after is not None and chunks >= stop_after and not finishes:
            break
    return chunks, finishes, done


def http_request(soak: Soak, client: httpx.Client, rng: random.Random, kind: str) -> Outcome:
    if kind == "stream":
        body = {"messages": rng.choice(MESSAGES), "max_tokens": rng.randint(8, 48), "stream": True,
                **_sampling(rng)}
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            _, finishes, done = _read_stream(response)
        if (finishes, done) != (1, 1):
            soak.violation(f"a stream ended with {finishes} finishes and {done} [DONE]s")
        return Outcome("http", kind, "done")
    if kind == "complete":
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(8, 48), **_sampling(rng)}
        reply = client.post("/v1/completions", json=body)
        reply.raise_for_status()
        if reply.json()["choices"][0]["finish_reason"] not in ("stop", "length"):
            soak.violation(f"a completion finished with {reply.json()['choices'][0]['finish_reason']!r}")
        return Outcome("http", kind, "done")
    if kind == "cancel":  # on a connection of its own: closing it unread is the cancel
        body = {"prompt": COUNTING, "max_tokens": 512, "stream": True, "temperature": 0}
        with httpx.stream("POST", client.base_url.join("/v1/completions"), json=body, timeout=TIMEOUT_S) as response:
            response.raise_for_status()
            _, finishes, _ = _read_stream(response, stop_after=3)
        return Outcome("http", kind, "done" if finishes else "cancelled")
    if kind == "long":  # token ids near the context; half share a long prefix the prompt cache can hand back
        length = soak.n_ctx - 16 - rng.randrange(200)
        shared = random.Random(0).choices(range(1000, 40000), k=length) if rng.random() < 0.5 else []
        prompt = shared[:length - 50] + rng.choices(range(1000, 40000), k=length - len(shared[:length - 50]))
        reply = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0})
        reply.raise_for_status()
        return Outcome("http", kind, "done")
    body, raw, code, engine = rng.choice(BAD)
    if code == "context_length_exceeded":
        body = {"prompt": [1000] * (soak.n_ctx + 10)}
    reply = client.post("/v1/completions", json=body) if raw is None else \
        client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    got = reply.json().get("error", {}).get("code") if reply.status_code == 400 else None
    if got != code:
        return Outcome("http", kind, "failed", f"expected a 400 {code}, got {reply.status_code} {reply.text[:200]}")
    return Outcome("http", kind, "refused", code, engine)


def http_client(soak: Soak, url: str, seed: int) -> None:
    rng = random.Random(seed)
    kinds, weights = ["stream", "complete", "cancel", "long", "bad"], [3, 3, 2, 1, 2]
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
        while time.monotonic() < soak.deadline:
            kind = rng.choices(kinds, weights)[0]
            started = time.monotonic()
            try:
                outcome = http_request(soak, client, rng, kind)
            except Exception as e:  # any failure is a finding: recorded and reported
                outcome = Outcome("http", kind, "failed", f"{type(e).__name__}: {e}"[:300])
            outcome.seconds = round(time.monotonic() - started, 3)
            soak.record(outcome)


# -- the bridge client -------------------------------------------------------------------------------------------
class BridgeSession:
    """One connection; every event read is kept by id, so that each request's ending events can be counted."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(path)
        self.reader = self.sock.makefile("rb")
        self.events: dict[object, list[dict[str, Any]]] = {}
        first = self.read()
        if first is None or first["event"] != "ready":
            raise RuntimeError(f"the session began with {first}")

    def send(self, line: bytes | dict[str, Any]) -> None:
        self.sock.sendall(line + b"\n" if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")

    def read(self) -> dict[str, Any] | None:
        line = self.reader.readline()
        if not line:
            return None
        event = json.loads(line)
        self.events.setdefault(event.get("id"), []).append(event)
        return event

    def until(self, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        while (event := self.read()) is not None:
            if done(event):
                return event
        raise RuntimeError("the bridge closed the connection")

    def end(self, rid: object) -> dict[str, Any]:
        return self.until(lambda e: e.get("id") == rid and e["event"] in ENDINGS)

    def close(self, soak: Soak, generations: list[object]) -> None:
        """Half-close with ``generations`` still running: each must end with one event all the same. Then check
        every generation of the session ended exactly once."""
        self.sock.shutdown(socket.SHUT_WR)
        while self.read() is not None:  # until the bridge closes the connection
            pass
        self.sock.close()
        for rid, events in self.events.items():
            endings = [e["event"] for e in events if e["event"] in ("stats", "cancelled")]
            if isinstance(rid, str) and rid.startswith("g") and len(endings) != 1:
                soak.violation(f"bridge request {rid} ended {len(endings)} times: {endings}")
        for rid in generations:
            if self.events.get(rid, [{}])[-1].get("event") != "stats":
                soak.violation(f"bridge generation {rid}, running at the half-close, ended {self.events.get(rid)}")


def bridge_request(session: BridgeSession, rng: random.Random, kind: str, n: int) -> Outcome:
    rid = f"g{n}"
    if kind in ("generate", "chat"):
        request = {"id": rid, "cmd": kind, "max_tokens": rng.randint(8, 32), **_sampling(rng)}
        request.update({"prompt": rng.choice(PROMPTS)} if kind == "generate" else {"messages": rng.choice(MESSAGES)})
        session.send(request)
        end = session.end(rid)
        return Outcome("bridge", kind, "done" if end["event"] == "stats" else "failed",
                       None if end["event"] == "stats" else json.dumps(end)[:300])
    if kind == "cancel":
        session.send({"id": rid, "cmd": "generate", "prompt": COUNTING, "max_tokens": 512})
        session.until(lambda e: e.get("id") == rid and e["event"] in {"token", *ENDINGS})
        session.send({"id": f"c{n}", "cmd": "cancel", "target": rid})
        end = session.end(rid)
        return Outcome("bridge", kind, end["event"] if end["event"] == "cancelled" else "failed",
                       None if end["event"] == "cancelled" else json.dumps(end)[:300])
    # Bad lines, each answered with an error naming its id.
    bad = rng.choice(["utf8", "unknown_key", "duplicate"])
    if bad == "utf8":
        session.send(b'{"id": "b%d", "cmd": "generate", "prompt": "caf\xe9"}' % n)
        expected = "bad_json"
    elif bad == "unknown_key":
        session.send({"id": f"b{n}", "cmd": "load", "model": "smollm2-135m", "ctxx": 2048})
        expected = "unknown_parameter"
    else:  # a stats under the id of a generation still running
        session.send({"id": rid, "cmd": "generate", "prompt": COUNTING, "max_tokens": 200})  # still running
        session.send({"id": rid, "cmd": "stats"})
        expected = "duplicate_id"
    error = session.until(lambda e: e["event"] == "error")
    ok = error.get("code") == expected and error.get("id") == (rid if bad == "duplicate" else f"b{n}")
    if bad == "duplicate":
        session.end(rid)
    return Outcome("bridge", f"bad_{bad}", "refused" if ok else "failed", expected if ok else json.dumps(error))


def bridge_client(soak: Soak, path: str, seed: int, per_session: int = 25) -> None:
    rng = random.Random(seed)
    kinds, weights = ["generate", "chat", "cancel", "bad"], [3, 2, 2, 2]
    n = 0
    while time.monotonic() < soak.deadline:
        try:
            session = BridgeSession(path)
        except (OSError, RuntimeError) as e:
            soak.record(Outcome("bridge", "connect", "failed", f"{type(e).__name__}: {e}"[:300]))
            time.sleep(1)
            continue
        try:
            for _ in range(per_session):
                if time.monotonic() >= soak.deadline:
                    break
                kind = rng.choices(kinds, weights)[0]
                n += 1
                started = time.monotonic()
                outcome = bridge_request(session, rng, kind, n)
                outcome.seconds = round(time.monotonic() - started, 3)
                soak.record(outcome)
            n += 1
            session.send({"id": f"g{n}", "cmd": "generate", "prompt": rng.choice(PROMPTS), "max_tokens": 16})
            session.close(soak, [f"g{n}"])
            soak.record(Outcome("bridge", "half_close", "done"))
        except Exception as e:  # any failure is a finding: recorded and reported
            soak.record(Outcome("bridge", "session", "failed", f"{type(e).__name__}: {e}"[:300]))
            with contextlib.suppress(OSError):
                session.sock.close()


# -- memory ------------------------------------------------------------------------------------------------------
def metrics(url: str) -> dict[str, float]:
    """/metrics as {sample: value}."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def sample_memory(server: LiveServer, bridge_pid: int, every: float, stop: threading.Event,
                  samples: list[dict[str, float]]) -> None:
    started = time.monotonic()
    processes = {"server": psutil.Process(server.proc.pid), "bridge": psutil.Process(bridge_pid)}
    while not stop.is_set():
        row = {"t_s": round(time.monotonic() - started, 1)}
        for name, process in processes.items():
            with contextlib.suppress(psutil.Error):
                row[f"{name}_rss_mb"] = round(process.memory_info().rss / MB, 2)
        with contextlib.suppress(httpx.HTTPError):
            cache = sum(v for k, v in metrics(server.url).items() if k.startswith("edgespec_prompt_cache_bytes"))
            row["cache_mb"] = round(cache / MB, 2)
        samples.append(row)
        stop.wait(every)


def windows(samples: list[dict[str, float]]) -> list[dict[str, object]]:
    rows = []
    for start in range(0, int(samples[-1]["t_s"]) + 1, WINDOW_S):
        rss = [s["server_rss_mb"] for s in samples if start <= s["t_s"] < start + WINDOW_S and "server_rss_mb" in s]
        bridge = [s["bridge_rss_mb"] for s in samples if start <= s["t_s"] < start + WINDOW_S and "bridge_rss_mb" in s]
        cache = [s["cache_mb"] for s in samples if start <= s["t_s"] < start + WINDOW_S and "cache_mb" in s]
        if rss:
            rows.append({"minutes": f"{start // 60}-{(start + WINDOW_S) // 60}", "samples": len(rss),
                         "rss_min_mb": min(rss), "rss_median_mb": statistics.median(rss), "rss_max_mb": max(rss),
                         "bridge_rss_median_mb": statistics.median(bridge) if bridge else None,
                         "cache_max_mb": max(cache) if cache else None})
    return rows


def flatness(samples: list[dict[str, float]], flat_mb: float) -> dict[str, object]:
    """The server's RSS over the second half of the run: a linear fit's slope (MB per 10 minutes) and max - min,
    also with the prompt cache's bytes taken out."""
    half = samples[-1]["t_s"] / 2
    tail = [s for s in samples if s["t_s"] >= half and "server_rss_mb" in s and "cache_mb" in s]
    if len(tail) < 3:
        return {"flat": False, "why": "too few samples"}
    t = np.array([s["t_s"] for s in tail]) / WINDOW_S
    rss = np.array([s["server_rss_mb"] for s in tail])
    net = rss - np.array([s["cache_mb"] for s in tail])
    slope, net_slope = float(np.polyfit(t, rss, 1)[0]), float(np.polyfit(t, net, 1)[0])
    growth = slope * float(t[-1] - t[0])  # what the fit grows over the half: a leak, where noise averages out
    return {"from_minute": round(half / 60, 1), "samples": len(tail), "slope_mb_per_10min": round(slope, 2),
            "fit_growth_mb": round(growth, 2), "max_minus_min_mb": round(float(rss.max() - rss.min()), 2),
            "slope_without_cache_mb_per_10min": round(net_slope, 2), "flat_within_mb": flat_mb,
            "flat": abs(growth) <= flat_mb}


# -- agreement with /metrics -------------------------------------------------------------------------------------
def agreement(outcomes: list[Outcome], final: dict[str, float], model: str,
              bridge_counts: dict[str, int]) -> list[dict[str, object]]:
    """/metrics and the bridge's stats against what the clients saw."""
    http = [o for o in outcomes if o.transport == "http"]
    bridge = Counter((o.kind, o.outcome) for o in outcomes if o.transport == "bridge")

    def served(outcome: str) -> float:
        return final.get(f'edgespec_requests_total{{model="{model}",outcome="{outcome}"}}', 0.0)

    rows = [("requests done", served("done"), sum(o.outcome == "done" for o in http)),
            ("requests cancelled", served("cancelled"), sum(o.outcome == "cancelled" for o in http)),
            ("requests refused by the engine", served("client_error"), sum(o.engine_refused for o in http)),
            ("requests failed", served("error"), 0)]
    for code in sorted({c for _, _, c, _ in BAD}):
        rows.append((f"400 {code}", final.get(f'edgespec_error_responses_total{{status="400",code="{code}"}}', 0.0),
                     sum(o.outcome == "refused" and o.code == code for o in http)))
    others = sum(v for k, v in final.items() if k.startswith("edgespec_error_responses_total") and
                 not k.startswith('edgespec_error_responses_total{status="400"'))
    rows.append(("other error replies", others, 0))
    # A bridge generation ends done in generate/chat, at each half-close and under each duplicate id's refusal.
    rows += [("bridge requests done", bridge_counts.get("done", 0),
              bridge["generate", "done"] + bridge["chat", "done"] + bridge["half_close", "done"] +
              bridge["bad_duplicate", "refused"]),
             ("bridge requests cancelled", bridge_counts.get("cancelled", 0), bridge["cancel", "cancelled"])]
    return [{"what": what, "metrics": int(server), "clients": clients, "agree": int(server) == clients}
            for what, server, clients in rows]


def _table(rows: list[dict[str, object]]) -> str:
    keys = list(rows[0])
    cells = [[str(k) for k in keys], *[["-" if r[k] is None else str(r[k]) for k in keys] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(keys))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long to run (default %(default)s)")
    parser.add_argument("--clients", type=int, default=3, help="concurrent HTTP clients (plus one bridge client)")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--flat-mb", type=float, default=5.0,
                        help="the largest growth of the server's RSS over the second half (its linear fit's), in MB, "
                             "called flat (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.json")
    args = parser.parse_args()
    if args.minutes <= 0 or args.clients < 1 or args.sample_s <= 0:
        parser.error("--minutes and --sample-s must be > 0, --clients >= 1")

    socket_path = str(Path(tempfile.mkdtemp(prefix="edgespec-soak-")) / "bridge.sock")
    print("starting edgespec serve and edgespec bridge (one thread each) ...", file=sys.stderr, flush=True)
    with LiveServer.start() as server, \
            listening_bridge("--socket", socket_path, address=f"unix:{socket_path}") as bridge:
        model = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]
        soak = Soak(model["n_ctx"], time.monotonic() + args.minutes * 60)
        samples: list[dict[str, float]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_memory, args=(server, bridge.pid, args.sample_s, stop, samples),
                                   daemon=True)
        sampler.start()
        clients = [threading.Thread(target=http_client, args=(soak, server.url, args.seed + i), daemon=True)
                   for i in range(args.clients)]
        clients.append(threading.Thread(target=bridge_client, args=(soak, socket_path, args.seed + 1000),
                                        daemon=True))
        print(f"soaking {model['id']} for {args.minutes:g} minutes: {args.clients} HTTP clients and a bridge "
              "client", file=sys.stderr, flush=True)
        for thread in clients:
            thread.start()
        for thread in clients:  # each ends its last request first: bounded by TIMEOUT_S
            thread.join(args.minutes * 60 + TIMEOUT_S + 60)
        hung = sum(thread.is_alive() for thread in clients)
        stop.set()
        sampler.join(60)
        final = metrics(server.url)
        server_log = server.log()
        stats = BridgeSession(socket_path)
        stats.send({"id": "final", "cmd": "stats"})
        bridge_counts = stats.until(lambda e: e.get("id") == "final")["models"][model["id"]]["requests"]
        stats.sock.close()

    by_kind = Counter((o.transport, o.kind, o.outcome) for o in soak.outcomes)
    failures = [asdict(o) for o in soak.outcomes if o.outcome == "failed"]
    agree = agreement(soak.outcomes, final, model["id"], bridge_counts)
    rss = windows(samples)
    flat = flatness(samples, args.flat_mb)
    tracebacks = server_log.count("Traceback")
    print("\nServer RSS per 10 minutes (MB), the bridge's median and the prompt cache's largest (MB):")
    print(_table(rss))
    print("\nRequests by kind and outcome:")
    print(_table([{"transport": t, "kind": k, "outcome": o, "count": n} for (t, k, o), n in sorted(by_kind.items())]))
    print(f"\nEach request ended exactly once: {'yes' if not soak.violations else 'NO'} "
          f"({len(soak.outcomes)} requests, {len(soak.violations)} violations, {len(failures)} failures, "
          f"{hung} clients hung, {tracebacks} tracebacks in the server log)")
    for text in [*soak.violations[:10], *(f["code"] for f in failures[:10])]:
        print(f"  {text}")
    print("\n/metrics against the clients' counts:")
    print(_table(agree))
    print(f"\nServer RSS from minute {flat.get('from_minute')} on: slope {flat.get('slope_mb_per_10min')} MB per 10 "
          f"minutes ({flat.get('slope_without_cache_mb_per_10min')} without the prompt cache), the fit grows "
          f"{flat.get('fit_growth_mb')} MB, max - min {flat.get('max_minus_min_mb')} MB: "
          f"{'FLAT' if flat['flat'] else 'NOT FLAT'} (a fit growing at most {args.flat_mb:g} MB)")
    ok = not soak.violations and not failures and not hung and not tracebacks and all(r["agree"] for r in agree)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "model": model["id"], "n_ctx": model["n_ctx"], "minutes": args.minutes, "clients": args.clients,
        "seed": args.seed, "checks_pass": ok, "rss_flat": flat, "rss_windows": rss, "samples": samples,
        "requests": [{"transport": t, "kind": k, "outcome": o, "count": n} for (t, k, o), n in sorted(by_kind.items())],
        "violations": soak.violations, "failures": failures, "hung_clients": hung, "server_tracebacks": tracebacks,
        "metrics_agreement": agree, "metrics": final}, indent=1) + "\n")
    print(f"\nsaved {args.out}")
    return 0 if ok and flat["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
