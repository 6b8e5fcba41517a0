"""Prompt lookup: if the last n tokens occurred earlier in prompt + output, propose what followed them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..engine.arena import common_prefix
from ..engine.sampling import SamplingParams
from ..errors import InvalidParameterError
from .base import Draft

# What the text has said of a match before it is verified: the token that followed the matched n-gram's previous
# occurrence against the one after its latest (the index's undo log holds where the previous one was). On Spec-Bench's
# development half (280 target-only outputs, docs/drafting-experiments.md) lookup's first token was right 53% of the
# time where the two agreed, 15% where they differed and 31% where the match had occurred once, for one-token matches;
# 74 / 26 / 56% for two tokens, 95 / 38 / 80% for longer ones. A draft's key is (match length, evidence): the γ
# controller learns each key's acceptance, a new one leaning on its match length's, so a draft the text contradicts is
# declined (and the next drafter asked), one it confirms drafted long.
ALONE, AGREED, DIFFERED = 1, 2, 3


class NgramDrafter:
    """Longest-suffix n-gram lookup over the committed sequence, with an incremental index.

    For each n in [n_min, n_max] a dict maps every n-gram seen so far to the position right after its
    most recent occurrence. Each committed token adds n_max - n_min + 1 entries; a lookup is at most
    that many dict probes. Nothing is rescanned.

    A new sequence (``begin``) keeps what the index learned from the prefix it shares with the previous
    one (a chat's next turn re-sends the whole conversation): an undo log per position restores each
    entry a later position overwrote, so only the tokens after the shared prefix are indexed.
    """

    name = "ngram"
    costs_per_token = False

    def __init__(self, n_max: int = 5, n_min: int = 1, max_draft: int = 16) -> None:
        if not 1 <= n_min <= n_max:
            raise InvalidParameterError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_min, self.n_max, self.max_draft = n_min, n_max, max_draft
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self._seen: list[int] = []  # the tokens indexed so far
        # Per position j >= 1 (entry j - 1): what its entries replaced, (n, n-gram, previous position or None).
        self._undo: list[list[tuple[int, tuple[int, ...], int | None]]] = []

    def begin(self, context: Sequence[int]) -> None:
        """Start a sequence: the entries of positions inside the prefix shared with the last one are kept."""
        shared = common_prefix(self._seen, context)
        # Position j's entries read tokens before j only: those of j <= shared stay valid, except one
        # pointing at the new sequence's end (its continuation does not exist yet).
        while len(self._undo) > max(0, min(shared, len(context) - 1)):
            for n, gram, previous in reversed(self._undo.pop()):
                if previous is None:
                    del self._index[n][gram]
                else:
                    self._index[n][gram] = previous
        del self._seen[shared:]
        self._update(context)

    def _update(self, context: Sequence[int]) -> None:
        # The n-gram ending just before position j maps to j; the n-gram ending at the last token is only
        # added once its continuation exists, so a lookup never finds the suffix itself.
        seen = self._seen
        for j in range(len(self._undo) + 1, len(context)):
            log = []
            for n in range(self.n_min, min(self.n_max, j) + 1):
                gram = tuple(context[j - n:j])
                log.append((n, gram, self._index[n].get(gram)))
                self._index[n][gram] = j
            self._undo.append(log)
        seen.extend(context[len(seen):])

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self._update(context)
        limit = min(max_tokens, self.max_draft)
        if limit <= 0:
            return Draft([])
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):  # the longest match first
            start = self._index[n].get(tuple(context[-n:]))
            if start is not None:
                previous = self._undo[start - 1][n - self.n_min][2]  # where the n-gram's previous occurrence led
                evidence = ALONE if previous is None else AGREED if context[previous] == context[start] else DIFFERED
                return Draft(list(context[start:start + limit]), key=(n, evidence))
        return Draft([])
