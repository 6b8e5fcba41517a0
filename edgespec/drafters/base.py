"""The one interface every drafter implements (n-gram lookup, a draft model, layer-skip)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..sampling import SamplingParams


@dataclass
class Draft:
    """Up to γ proposed tokens for the positions after the committed sequence."""

    tokens: list[int]
    # One q-distribution per token when the drafter sampled them; None when it proposes deterministically
    # (lookup, or a greedy draft model): q is then one-hot on the token.
    probs: np.ndarray | None = None
    # The context the proposal came from (n-gram: the matched length). Acceptance is tracked per key, so the γ
    # controller learns e.g. that 1-token matches rarely pay while 4-token matches do.
    key: int = 0
    # Forward passes the drafter spent (a model drafter that stopped early on low confidence spent one more
    # than it proposed); None: one per token. The γ controller charges them all.
    passes: int | None = None
    # Which drafter proposed it (hybrid mode asks two in turn); set by the engine.
    source: str = ""

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, k: int) -> Draft:
        if k >= len(self.tokens):
            return self
        return Draft(self.tokens[:k], None if self.probs is None else self.probs[:k], self.key, self.passes,
                     self.source)


class Drafter(Protocol):
    name: str
    # True when proposing γ tokens costs γ forward passes (a model), so γ must be chosen before drafting;
    # False when the whole proposal is free (lookup) and γ is chosen by truncating it afterwards.
    costs_per_token: bool

    def begin(self, context: Sequence[int]) -> None:
        """A new sequence starts with ``context`` (the prompt)."""

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Propose up to ``max_tokens`` tokens to follow ``context`` (the committed sequence)."""
        ...
