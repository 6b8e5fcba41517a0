"""A cheaper model with the same vocabulary drafts for the target: a smaller or more quantized model in its
own cache, or the target itself with layers skipped (a view over the target's KV memory)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..engine.arena import KVArena
from ..engine.sampling import SamplingParams, sample
from .base import Draft


class DraftModelDrafter:
    """Runs the draft autoregressively in its cache, which the shared arena keeps in step.

    ``min_confidence``: stop drafting at the first position where the draft's own top-1 probability is below
    it; that position's token is not proposed. Losslessness does not
    depend on where a draft stops, only the cost: a token the draft itself doubts is rarely accepted.
    """

    costs_per_token = True

    def __init__(self, arena: KVArena, cache: str = "draft", name: str = "draft", min_confidence: float = 0.0,
                 prepare: Callable[[], None] | None = None) -> None:
        self.arena = arena
        self.cache = cache
        self.name = name
        self.min_confidence = min_confidence
        self._prepare = prepare  # a self-draft's SelfDraft.prepare

    def begin(self, context: Sequence[int]) -> None:
        """Ready a self-draft and prefill a draft model's cache with the prompt: work the request's time to first
        token pays once, which charged to the first draft pass would make the γ controller think a draft token
        costs what a prefill does."""
        if self._prepare is not None:
            self._prepare()
        self.arena.catch_up(self.cache)

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        if max_tokens <= 0:
            return Draft([])
        logits = self.arena.extend(self.cache, [], 1)
        while True:
            if params.greedy:
                token = int(logits[0].argmax())
                confidence = _top_probability(logits[0]) if self.min_confidence > 0 else 1.0
            else:
                q = params.probs(logits[0])[0]
                token = sample(q, rng)
                confidence = float(q.max())
            if confidence < self.min_confidence:
                return Draft(tokens, np.stack(probs) if probs else None, passes=len(tokens) + 1)
            if not params.greedy:
                probs.append(q)
            tokens.append(token)
            if len(tokens) == max_tokens:
                break
            logits = self.arena.extend(self.cache, [token], 1)
        return Draft(tokens, np.stack(probs) if probs else None)


def _top_probability(logits: np.ndarray) -> float:
    x = logits - logits.max()
    return float(1.0 / np.exp(x, dtype=np.float64).sum())
