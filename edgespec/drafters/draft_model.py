"""A smaller (or more quantized) model with the same vocabulary drafts for the target."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..arena import KVArena
from ..sampling import SamplingParams, sample
from .base import Draft


class DraftModelDrafter:
    """Runs the draft model autoregressively in its own cache, which the shared arena keeps in step."""

    name = "draft"
    costs_per_token = True

    def __init__(self, arena: KVArena, cache: str = "draft") -> None:
        self.arena = arena
        self.cache = cache

    def begin(self, context: Sequence[int]) -> None:
        """Nothing to do: the arena feeds the draft cache whatever committed tokens it lacks."""

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
            else:
                q = params.probs(logits[0])[0]
                token = sample(q, rng)
                probs.append(q)
            tokens.append(token)
            if len(tokens) == max_tokens:
                break
            logits = self.arena.extend(self.cache, [token], 1)
        return Draft(tokens, np.stack(probs) if probs else None)
