"""llama-cpp-python's own high-level API: ``Llama.generate``, optionally with ``LlamaPromptLookupDecoding``,
or with its RAM prompt cache (``LlamaRAMCache``) for conversations.

Everything is llama-cpp-python's default except the thread count (the run's) and the weight layout: the
repacked/AMX layouts crashed on this project's Xeon, so they are off, as in edgespec.
"""

from __future__ import annotations

import json
import time

import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from ..worker import WARM_UP, Result, Setup, timed


class LlamaCppRunner:
    def __init__(self, options: dict[str, object], setup: Setup) -> None:
        default_params = llama_cpp.llama_cpp.llama_model_default_params

        def plain_layouts() -> llama_cpp.llama_model_params:
            params = default_params()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_cpp.llama_model_default_params = plain_layouts  # read by Llama.__init__
        n_pred = options.get("prompt_lookup")
        draft = LlamaPromptLookupDecoding(num_pred_tokens=int(n_pred)) if n_pred else None  # type: ignore[arg-type]
        # logits_all: with a draft model and without it, prompts longer than n_batch fail.
        self.llm = llama_cpp.Llama(setup.model, n_ctx=setup.n_ctx, n_threads=setup.threads,
                                   n_threads_batch=setup.threads, draft_model=draft, logits_all=draft is not None,
                                   seed=setup.seed, n_gpu_layers=0 if setup.device == "cpu" else -1,
                                   verbose=False)
        self.setup = setup
        self.generate(WARM_UP, 2)
        self.llm.reset()  # forget the warm-up's tokens: the next prompt shares no prefix with them
        # What Llama.create_completion does with a cache set (its best configuration for chat): restore the
        # saved state sharing the longest prefix, when longer than what the context holds; save after.
        self.cache = llama_cpp.LlamaRAMCache() if options.get("prompt_cache") else None

    def info(self) -> dict[str, object]:
        return {"engine": f"llama-cpp-python {llama_cpp.__version__}", "model_file": self.setup.model}

    def verify_curve(self) -> None:
        return None  # its passes are not exposed

    def generate(self, tokens: list[int], max_tokens: int) -> Result:
        return self._generate(tokens, max_tokens, time.perf_counter())

    def generate_constrained(self, tokens: list[int], max_tokens: int, schema: dict) -> Result:
        """The schema as llama-cpp-python's own GBNF grammar (its JSON-schema converter), as its
        ``create_completion(response_format=...)`` makes it, applied by llama.cpp's grammar sampler."""
        start = time.perf_counter()
        grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
        return self._generate(tokens, max_tokens, start, grammar)

    def _generate(self, tokens: list[int], max_tokens: int, start: float,
                  grammar: llama_cpp.LlamaGrammar | None = None) -> Result:
        """Greedy from ``tokens``, timed from ``start``."""
        out: list[int] = []
        arrivals: list[tuple[int, float]] = []
        for token in self.llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                       reset=True, grammar=grammar):
            out.append(token)
            arrivals.append((len(out), time.perf_counter() - start))
            if token in self.setup.eog or len(out) == max_tokens:
                break
        return timed(out, arrivals, self.setup.eog, max_tokens)

    def chat_turn(self, messages: list[dict[str, str]], tokens: list[int], max_tokens: int) -> Result:
        """The prompt as token ids (the run's template); ``generate`` itself keeps the prefix the context
        already holds, and the RAM cache restores a longer one when there is one."""
        if self.cache is None:
            return self.generate(tokens, max_tokens)
        start = time.perf_counter()
        try:
            saved = self.cache[tokens]
        except KeyError:
            saved = None
        prefix = llama_cpp.Llama.longest_token_prefix
        if saved is not None and prefix(saved.input_ids.tolist(), tokens) > prefix(self.llm._input_ids.tolist(),
                                                                                     tokens):
            self.llm.load_state(saved)
        restore_s = time.perf_counter() - start
        result = self.generate(tokens, max_tokens)
        result.ttft_s += restore_s
        result.arrivals = [(n, t + restore_s) for n, t in result.arrivals or []]
        saved_at = time.perf_counter()
        self.cache[tokens + result.tokens] = self.llm.save_state()
        result.extra["cache_save_s"] = time.perf_counter() - saved_at  # after the answer: not in its latency
        return result

    def close(self) -> None:
        self.llm.close()


def open_runner(options: dict[str, object], setup: Setup) -> LlamaCppRunner:
    return LlamaCppRunner(options, setup)
