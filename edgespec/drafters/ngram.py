"""Prompt lookup: if the last n tokens occurred earlier in prompt + output, propose what followed them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InvalidParameterError
from ..sampling import SamplingParams
from .base import Draft


class NgramDrafter:
    """Longest-suffix n-gram lookup over the committed sequence, with an incremental index.

    For each n in [n_min, n_max] a dict maps every n-gram seen so far to the position right after its
    most recent occurrence. Each committed token adds n_max - n_min + 1 entries; a lookup is at most
    that many dict probes. Nothing is rescanned.
    """

    name = "ngram"
    costs_per_token = False

    def __init__(self, n_max: int = 5, n_min: int = 1, max_draft: int = 16) -> None:
        if not 1 <= n_min <= n_max:
            raise InvalidParameterError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_min, self.n_max, self.max_draft = n_min, n_max, max_draft
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        self._indexed = 0

    def begin(self, context: Sequence[int]) -> None:
        self._index = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self._indexed = 0
        self._update(context)

    def _update(self, context: Sequence[int]) -> None:
        # The n-gram ending just before position j maps to j; the n-gram ending at the last token is only
        # added once its continuation exists, so a lookup never finds the suffix itself.
        for j in range(max(self._indexed, 1), len(context)):
            for n in range(self.n_min, min(self.n_max, j) + 1):
                self._index[n][tuple(context[j - n:j])] = j
        self._indexed = max(self._indexed, len(context))

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self._update(context)
        limit = min(max_tokens, self.max_draft)
        if limit <= 0:
            return Draft([])
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):
            start = self._index[n].get(tuple(context[-n:]))
            if start is not None:
                return Draft(list(context[start:start + limit]), key=n)
        return Draft([])
