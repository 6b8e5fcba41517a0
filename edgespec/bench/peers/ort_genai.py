"""onnxruntime-genai on a model folder in its own format (genai_config.json + ONNX), plain or with its
speculative n-gram decoding. The prompt goes in as the run's token ids; greedy search; the run's threads."""

from __future__ import annotations

import json
import time
from typing import Any

from ...extras import require
from ..worker import WARM_UP, Result, Setup, timed


def load_model(model_dir: str, threads: int) -> tuple[Any, Any]:
    """onnxruntime_genai and its model from ``model_dir``, on ``threads`` threads (one inter-op thread)."""
    og = require("onnxruntime_genai", "export-hf", "the onnxruntime-genai peer")
    config = og.Config(model_dir)
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    return og, og.Model(config)


class OrtGenaiRunner:
    def __init__(self, options: dict[str, object], setup: Setup) -> None:
        self.setup, self.model_dir = setup, str(options["model_dir"])
        self.og, self.model = load_model(self.model_dir, setup.threads)
        self.speculative = {k: options[k] for k in ("ngram_size", "max_draft_tokens") if k in options}
        self.generate(WARM_UP, 2)
        self._chat: Any = None  # bench --chat: the conversation's generator

    def info(self) -> dict[str, object]:
        return {"engine": f"onnxruntime-genai {self.og.__version__}", "model_file": self.model_dir}

    def verify_curve(self) -> None:
        return None  # its passes are not exposed

    def generate(self, tokens: list[int], max_tokens: int) -> Result:
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(tokens) + max_tokens, batch_size=1)
        if self.speculative:
            params.set_speculative_options(**self.speculative)
        start = time.perf_counter()
        generator = og.Generator(self.model, params)
        generator.append_tokens(tokens)
        result = self._decode(generator, start, max_tokens)
        if self.speculative:
            stats = generator.get_speculative_stats()
            result.drafted, result.accepted = stats["draft_tokens_evaluated"], stats["draft_tokens_accepted"]
            result.extra["speculative_stats"] = stats
        return result

    def chat_turn(self, messages: list[dict[str, str]], tokens: list[int], max_tokens: int) -> Result:
        """One generator for the whole conversation (its own chat example's way): it keeps its KV across
        ``append_tokens``; what differs from its sequence (a re-tokenized answer) is rewound first."""
        og = self.og
        start = time.perf_counter()
        if self._chat is None:
            params = og.GeneratorParams(self.model)
            params.set_search_options(do_sample=False, max_length=self.setup.n_ctx, batch_size=1)
            self._chat = og.Generator(self.model, params)
        held = [int(t) for t in self._chat.get_sequence(0)]
        keep = 0
        while keep < min(len(held), len(tokens) - 1) and held[keep] == tokens[keep]:
            keep += 1
        if keep < len(held):
            self._chat.rewind_to(keep)
        self._chat.append_tokens(tokens[keep:])
        return self._decode(self._chat, start, max_tokens)

    def _decode(self, generator: Any, start: float, max_tokens: int) -> Result:
        out: list[int] = []
        arrivals: list[tuple[int, float]] = []
        while not generator.is_done() and len(out) < max_tokens:
            generator.generate_next_token()
            new = [int(t) for t in generator.get_next_tokens()]
            out.extend(new)
            arrivals.append((len(out), time.perf_counter() - start))
            if any(t in self.setup.eog for t in new):
                break
        result = timed(out, arrivals, self.setup.eog, max_tokens)
        result.first_tokens = result.arrivals[0][0] if result.arrivals else 0  # a first step may speculate
        return result

    def close(self) -> None:
        del self.model


def open_runner(options: dict[str, object], setup: Setup) -> OrtGenaiRunner:
    return OrtGenaiRunner(options, setup)
