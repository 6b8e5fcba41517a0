"""edgespec itself: ``edgespec.load`` with a configuration's mode, γ and model."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

import edgespec
from edgespec.cli.main import generate_engine
from edgespec.controller.cost import MAX_GAMMA
from edgespec.engine import constraints
from edgespec.engine.engine import StreamChunk
from edgespec.errors import EdgespecError

from ..worker import WARM_UP, Result, Setup


class NativeRunner:
    def __init__(self, options: dict[str, object], setup: Setup) -> None:
        tuned = bool(options.get("tuned"))
        self.model = str(options.get("model") or setup.model)  # a GGUF, or an ONNX folder for that backend
        flags = options.get("generate_flags")
        if isinstance(flags, list):  # `edgespec generate FLAGS`, with the threads and context every config shares
            numerics = ["--fast-numerics"] if setup.fast_numerics else []
            self.engine = generate_engine([*flags, "--threads", str(setup.threads), "--ctx", str(setup.n_ctx),
                                           "--device", setup.device, *numerics])
            self.model = str(self.engine.target.path)
        else:
            self.engine = edgespec.load(self.model, draft=options.get("draft"),
                                        mode=None if tuned else str(options.get("mode", "none")),
                                        gamma=None if tuned else options.get("gamma", "auto"),  # type: ignore[arg-type]
                                        n_ctx=setup.n_ctx, n_threads=setup.threads, device=setup.device,
                                        exact_numerics=not setup.fast_numerics, tuning=tuned)
        if tuned and self.engine.tuning is None:
            raise EdgespecError("no tuning for this model, thread count and device: run `edgespec tune` first")
        self.engine.generate(WARM_UP, max_tokens=2)  # also creates the γ controller, outside any timing
        self._guidance_ready = False

    def info(self) -> dict[str, object]:
        e = self.engine
        options = getattr(e.target, "options", None)  # llama.cpp's; an ONNX export's numerics are its graphs'
        info: dict[str, object] = {"engine": f"edgespec {edgespec.__version__}", "mode": e.mode, "gamma": e.gamma,
                                   "tuned": e.tuning is not None,
                                   "exact_numerics": getattr(options, "exact_numerics", None),
                                   "model_file": str(getattr(e.target, "path", self.model))}
        manifest = getattr(e.target, "manifest", None)
        if isinstance(manifest, dict):  # an ONNX export: which products it runs (its export timed them here)
            info["onnx_weights"] = manifest.get("quant_options", {}).get("weights")
            info["huge_page_mb"] = round(getattr(e.target, "huge_page_bytes", 0) / 2**20)
        return info

    def verify_curve(self) -> dict[str, float]:
        # The fastest pass seen for each k, after a 2-token context (longer contexts only cost more): the cost
        # curve that bounds what this engine could achieve.
        curve = self.engine.calibrate(rounds=3, statistic=np.min, context=WARM_UP[:2])
        return {str(k): v for k, v in curve.as_dict().items()}

    def generate(self, tokens: list[int], max_tokens: int) -> Result:
        return _result(self.engine.stream(tokens, max_tokens=max_tokens))

    def generate_constrained(self, tokens: list[int], max_tokens: int, schema: dict) -> Result:
        if not self._guidance_ready:  # the vocabulary llguidance reads is built once per engine: not in a timing
            self.engine.generate(WARM_UP, max_tokens=2, constraint=constraints.json_object())
            self._guidance_ready = True
        start = time.perf_counter()
        chunks = self.engine.stream(tokens, max_tokens=max_tokens, constraint=constraints.json_schema(schema))
        compiled_s = time.perf_counter() - start  # the schema compiled, its matcher made: before the prefill's clock
        result = _result(chunks)
        result.ttft_s += compiled_s
        return result

    def chat_turn(self, messages: list[dict[str, str]], tokens: list[int], max_tokens: int) -> Result:
        """Through the public chat API, as an application calls it (the template is edgespec's own, so
        ``tokens`` are not needed): whatever the engine kept of the conversation is its to reuse."""
        start = time.perf_counter()
        arrivals: list[tuple[int, float]] = []
        result = _result(_timed(self.engine.stream_chat(messages, max_tokens=max_tokens), start, arrivals))
        # From the call on (rendering and tokenizing the conversation included), as a user waits for it.
        result.ttft_s, result.decode_s = arrivals[0][1], arrivals[-1][1] - arrivals[0][1]
        result.arrivals = arrivals
        return result

    def close(self) -> None:
        self.engine.close()


def _timed(chunks: Iterator[StreamChunk], start: float, arrivals: list[tuple[int, float]]
           ) -> Iterator[StreamChunk]:
    received = 0
    for chunk in chunks:
        received += len(chunk.tokens)
        arrivals.append((received, time.perf_counter() - start))
        yield chunk


def _result(chunks: Iterator[StreamChunk]) -> Result:
    out: list[int] = []
    hist = [0] * (MAX_GAMMA + 1)
    first = True
    for chunk in chunks:
        out.extend(chunk.tokens)
        if not first:  # every chunk after the first is one verify step
            hist[chunk.drafted] += 1
        first = False
        stats = chunk.stats
    assert stats is not None  # the last chunk carries the stats
    return Result(tokens=out, ttft_s=stats.prefill_s, decode_s=stats.decode_s, steps=stats.steps,
                  drafted=stats.drafted, accepted=stats.accepted, forced=stats.forced, gamma_hist=hist, mode=stats.mode,
                  draft_steps=dict(stats.draft_steps),
                  position_trials=stats.position_trials, position_accepts=stats.position_accepts,
                  draft_s=stats.draft_s, verify_s=stats.verify_s,
                  model_draft_s=stats.draft_s if stats.mode in ("draft", "layerskip", "hybrid", "head") else 0.0)


def open_runner(options: dict[str, object], setup: Setup) -> NativeRunner:
    return NativeRunner(options, setup)
