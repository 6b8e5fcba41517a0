"""One process per configuration: its peak RSS is its own, and a peer's libraries never meet another's.

The parent sends ``{"tokens", "max_tokens"}`` requests over a pipe; the worker answers each with one
result dict (``Result``), or ``{"error": ...}``. ``None`` ends it. A request with a ``"schema"`` (a JSON schema) asks
for output that validates against it (``ConstrainedRunner``). A chat request (``bench --chat``) also
carries ``"messages"``: the runner continues its conversation (``ChatRunner``), or with ``"fresh"`` a new
runner, opened for that one turn and closed after it, plays it with nothing cached.

A configuration at a git revision (``NAME@REV``, configs.py) runs in a process that imports that revision's edgespec
package, written to a scratch folder for the worker's life, its kernels built there (seconds).
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import resource
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol, cast

from ..errors import EdgespecError
from .configs import RUNNERS, Config
from .questions import BenchError
from .revision import write_package

# Each runner's untimed first generation: ids every vocabulary has (byte-level BPE's byte tokens, SentencePiece's
# specials and bytes), so the benchmark runs on any model, a test's 1024-token one too
WARM_UP = [1, 50, 100, 200]


@dataclass(frozen=True)
class Setup:
    """What every configuration of a run shares: the same model file, context, threads, stop tokens, seed."""

    model: str  # a GGUF path
    threads: int
    n_ctx: int
    eog: tuple[int, ...]  # end-of-generation token ids: generation stops at the first, which is not output
    seed: int
    device: str = "cpu"  # where the models run (cpu, cuda, metal): every configuration on the same one
    fast_numerics: bool = False  # edgespec's configurations load with exact_numerics=False (--fast-numerics)


@dataclass
class Result:
    """One generation. Fields a runner cannot observe stay None (e.g. a peer's acceptance)."""

    tokens: list[int]
    ttft_s: float  # request to first token: prefill plus one decode
    decode_s: float  # first token to last
    first_tokens: int = 1  # tokens that arrived with the first (a peer's first step may already speculate)
    steps: int | None = None  # target passes after the first token
    drafted: int | None = None
    accepted: int | None = None
    forced: int | None = None  # tokens a constraint forced (edgespec's: no drafter's, not in drafted)
    gamma_hist: list[int] | None = None  # steps by the number of draft tokens verified in them
    draft_steps: dict[str, int] | None = None  # steps whose draft came from each drafter (``GenerationStats``)
    mode: str | None = None  # edgespec's mode for the generation ("tree": ``drafted`` counts tree nodes)
    position_trials: list[int] | None = None
    position_accepts: list[int] | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    model_draft_s: float = 0.0  # drafting time that is model compute (a draft model), not engine overhead
    peak_rss_mb: float = 0.0
    # (tokens received so far, seconds since the request) at each arrival: the chat bench compares answers of
    # different lengths at the length they share. Every chat runner fills it in.
    arrivals: list[tuple[int, float]] | None = None
    extra: dict[str, object] = field(default_factory=dict)


class Runner(Protocol):
    def info(self) -> dict[str, object]:
        """Versions, ``model_file``, and what else the configuration should record."""

    def verify_curve(self) -> dict[str, float] | None:
        """{k: fastest seconds seen for one target pass over k tokens}, where the engine exposes its passes."""

    def generate(self, tokens: list[int], max_tokens: int) -> Result: ...

    def close(self) -> None: ...


class ChatRunner(Runner, Protocol):
    def chat_turn(self, messages: list[dict[str, str]], tokens: list[int], max_tokens: int) -> Result:
        """The conversation's next answer: ``tokens`` are ``messages`` rendered by the run's chat template;
        whatever the engine kept from earlier turns it may reuse, as it would for a user."""


class ConstrainedRunner(Runner, Protocol):
    def generate_constrained(self, tokens: list[int], max_tokens: int, schema: dict) -> Result:
        """``generate``, the output held to the JSON schema ``schema`` by the engine's own constrained decoding;
        turning the schema into the engine's grammar counts in the time to first token, as a request pays it."""


def cut_at_eog(tokens: list[int], eog: tuple[int, ...], max_tokens: int) -> list[int]:
    """Tokens up to (not including) the first end-of-generation token, at most ``max_tokens``."""
    for i, t in enumerate(tokens):
        if t in eog:
            return tokens[:i][:max_tokens]
    return tokens[:max_tokens]


def timed(out: list[int], arrivals: list[tuple[int, float]], eog: tuple[int, ...], max_tokens: int) -> Result:
    """A peer's generation timed by its ``arrivals``: the answer cut at the first end-of-generation token, time to
    first token at the first arrival, decoding from there to the last; counts capped at the answer (an
    end-of-generation token arrives but is not output)."""
    tokens = cut_at_eog(out, eog, max_tokens)
    first, last = (arrivals[0][1], arrivals[-1][1]) if arrivals else (0.0, 0.0)
    return Result(tokens=tokens, ttft_s=first, decode_s=last - first,
                  arrivals=[(min(n, len(tokens)), t) for n, t in arrivals])


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _error(e: Exception) -> dict[str, str]:
    """What the parent reports: the message of a user-fixable error; the traceback of anything else (a bug)."""
    if isinstance(e, EdgespecError):
        return {"error": str(e), "traceback": ""}
    return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def _chat_turn(runner: ChatRunner, request: dict, open_runner: Callable[[], ChatRunner]) -> Result:
    if not request.get("fresh"):
        return runner.chat_turn(request["messages"], request["tokens"], request["max_tokens"])
    fresh = open_runner()
    try:
        return fresh.chat_turn(request["messages"], request["tokens"], request["max_tokens"])
    finally:
        fresh.close()


def _main(config: Config, options: dict[str, object], setup: Setup, conn: Connection) -> None:
    try:
        module = importlib.import_module(RUNNERS[config.runner])
        runner: Runner = module.open_runner(options, setup)
        conn.send({"ready": True, **runner.info()})
    except Exception as e:  # reported to the parent, which names the configuration
        conn.send(_error(e))
        return
    while (request := conn.recv()) is not None:
        try:
            if request == "verify_curve":
                conn.send({"verify_curve": runner.verify_curve()})
                continue
            if "messages" in request:
                result = _chat_turn(runner, request, lambda: module.open_runner(options, setup))  # type: ignore[arg-type]
            elif request.get("schema") is not None:
                result = cast(ConstrainedRunner, runner).generate_constrained(request["tokens"], request["max_tokens"],
                                                                              request["schema"])
            else:
                result = runner.generate(request["tokens"], request["max_tokens"])
        except Exception as e:
            conn.send(_error(e))
            return
        result.peak_rss_mb = _peak_rss_mb()
        conn.send(asdict(result))
    runner.close()


def _main_at(package: str, config: dict, options: dict[str, object], setup: dict, conn: Connection) -> None:
    """``_main`` of the edgespec package under the folder ``package`` (another revision's): this process imported
    this checkout's edgespec to get here, so it forgets it first; the revision's own classes carry the configuration
    (the fields it knows)."""
    try:
        for name in [m for m in sys.modules if m.partition(".")[0] == "edgespec"]:
            del sys.modules[name]
        sys.path.insert(0, package)
        other = importlib.import_module("edgespec.bench.worker")
        if not Path(str(other.__file__)).resolve().is_relative_to(Path(package).resolve()):
            raise BenchError(f"the revision's edgespec is not the one imported ({other.__file__})")
        # Its kernels are built apart, in the scratch folder: a build removes the others in its folder, so one in the
        # environment's would take this checkout's away (rebuilt at its next load, and so on, turn about).
        kernels = importlib.import_module("edgespec.kernels.library")
        kernels.kernels_dir = lambda: Path(package) / "kernels-build"
        run_config, run_setup = (cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
                                 for cls, values in ((other.Config, config), (other.Setup, setup)))
    except Exception as e:  # reported to the parent, which names the configuration
        conn.send(_error(e))
        return
    other._main(run_config, options, run_setup, conn)


class Worker:
    """The parent's handle on one configuration's process."""

    def __init__(self, config: Config, options: dict[str, object], setup: Setup) -> None:
        self.config = config
        self._package: Path | None = None  # the revision's edgespec, for a configuration at one
        target: Callable[..., None] = _main
        args: tuple[object, ...] = (config, options, setup)
        if config.revision:
            self._package = Path(tempfile.mkdtemp(prefix="edgespec-at-"))
            try:
                write_package(config.revision, self._package)
            except ValueError as e:
                shutil.rmtree(self._package, ignore_errors=True)
                raise BenchError(f"configuration {config.name}: {e}") from None
            target, args = _main_at, (str(self._package), asdict(config), options, asdict(setup))
        self._conn, child = mp.get_context("spawn").Pipe()
        self._process = mp.get_context("spawn").Process(target=target, args=(*args, child), daemon=True,
                                                        name=f"bench-{config.name}")
        self._process.start()
        child.close()
        self.info: dict = {}

    def wait_ready(self) -> None:
        """Wait until this worker has loaded its model."""
        self.info = self._receive()

    def _receive(self) -> dict:
        try:
            message = self._conn.recv()
        except EOFError:
            raise BenchError(f"configuration {self.config.name}: its worker died "
                             f"(exit code {self._process.exitcode})") from None
        if "error" in message:
            self.close()
            raise BenchError(f"configuration {self.config.name}: {message['error']}\n{message['traceback']}".rstrip())
        return message

    def generate(self, tokens: list[int], max_tokens: int, schema: dict | None = None) -> dict:
        """One generation; with ``schema``, held to that JSON schema."""
        self._conn.send({"tokens": tokens, "max_tokens": max_tokens, "schema": schema})
        return self._receive()

    def chat_turn(self, messages: list[dict[str, str]], tokens: list[int], max_tokens: int, fresh: bool) -> dict:
        """The next turn of this configuration's conversation, or with ``fresh`` the same turn played by a new
        runner (a fresh engine, nothing cached)."""
        self._conn.send({"messages": messages, "tokens": tokens, "max_tokens": max_tokens, "fresh": fresh})
        return self._receive()

    def verify_curve(self) -> dict[str, float] | None:
        """Have the worker's engine time its verify passes (None: the runner does not expose them)."""
        self._conn.send("verify_curve")
        return self._receive()["verify_curve"]

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(None)
            self._process.join(timeout=30)
            if self._process.is_alive():
                self._process.kill()
        if self._package is not None:
            shutil.rmtree(self._package, ignore_errors=True)
