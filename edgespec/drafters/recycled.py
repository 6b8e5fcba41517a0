"""Recycled logits (after Token Recycling): each token's likeliest successors, taken from the target's own verify
passes. Every verify pass computes a row of logits after each token it feeds; the engine already has them, so
keeping their top-k costs no target work. A token's entry is overwritten by the latest row that followed it. The
table is built on first use: an engine whose mode tree is never used holds none."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property

import numpy as np

from ..engine.sampling import SamplingParams
from ..errors import InvalidParameterError
from .base import Draft, best_first


def top_successors(logits: np.ndarray, k: int, min_prob: float = 0.0,
                   rows: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row (of ``rows`` of ``logits``, default all), the ``k`` likeliest tokens (best first) and their
    probabilities (softmax over the whole row); with ``min_prob``, only those at least that likely (the rest: -1
    and 0).

    A probability needs the row's normaliser Σ exp(logit − max), and every logit counts in it at float32 rounding
    (a real model's logits lie within ~27 of the row's max, where exp still reaches 2⁻²⁴ of the sum: 99.8% of
    SmolLM2's): one exp per logit is the exact price. It is paid in a one-row scratch, not in rows × vocab copies.
    With ``min_prob``, the normaliser also says which logits can qualify (p ≥ min_prob ⇔ logit ≥ max + log(min_prob
    × normaliser)): one comparison over the row finds those few (at most 1 / min_prob) instead of a partition of it,
    and the rows are read where they are (no copy of the chosen ones).
    """
    logits = np.asarray(logits, dtype=np.float32)
    rows = range(len(logits)) if rows is None else rows
    top = np.full((len(rows), k), -1, dtype=np.int32)
    probs = np.zeros((len(rows), k), dtype=np.float32)
    scratch = np.empty(logits.shape[1], dtype=np.float32)
    for i, r in enumerate(rows):
        row = logits[r]
        peak = row.max()
        norm = np.exp(np.subtract(row, peak, out=scratch), out=scratch).sum()
        if min_prob > 0.0:
            found = np.flatnonzero(row >= peak + np.log(min_prob * norm))
        else:
            found = np.argpartition(row, -k)[-k:]
        found = found[np.argsort(-row[found], kind="stable")][:k]
        top[i, :len(found)] = found
        probs[i, :len(found)] = np.exp(row[found] - peak) / norm
    return top, probs


def last_occurrences(tokens: Sequence[int]) -> np.ndarray:
    """The index of each distinct token's last occurrence in ``tokens``: the rows a table update keeps."""
    last = {int(token): i for i, token in enumerate(tokens)}  # a later occurrence overwrites an earlier one
    return np.array(sorted(last.values()), dtype=np.intp)


class RecycledDrafter:
    """A table of ``k`` successors per token with the target's probability for each (``observe``), drafted as a
    best-first tree: a node's score is the product of the probabilities down its path."""

    name = "recycled"
    costs_per_token = False

    def __init__(self, n_vocab: int, k: int = 4, min_prob: float = 0.05, max_draft: int = 16) -> None:
        if k < 1 or n_vocab < k or not 0 <= min_prob <= 1:
            raise InvalidParameterError(f"need 1 <= k <= n_vocab and 0 <= min_prob <= 1, got k={k}, "
                                        f"n_vocab={n_vocab}, min_prob={min_prob}")
        self.n_vocab, self.k, self.min_prob, self.max_draft = n_vocab, k, min_prob, max_draft

    @cached_property
    def successors(self) -> np.ndarray:
        """Per token its ``k`` successors, best first; -1: never seen."""
        return np.full((self.n_vocab, self.k), -1, dtype=np.int32)

    @cached_property
    def probs(self) -> np.ndarray:
        """The target's probability of each successor."""
        return np.zeros((self.n_vocab, self.k), dtype=np.float32)

    @property
    def nbytes(self) -> int:
        """What the table takes once built."""
        return self.n_vocab * self.k * (np.dtype(np.int32).itemsize + np.dtype(np.float32).itemsize)

    def begin(self, context: Sequence[int]) -> None:
        """Nothing per request: what the target said after a token holds across requests."""

    def observe(self, tokens: Sequence[int], logits: np.ndarray, rows: Sequence[int] | None = None) -> None:
        """Row ``rows[i]`` of ``logits`` (default: row i) is the target's distribution after ``tokens[i]`` (in its
        context then). Of a token fed more than once (two branches of a tree), only its last row is worked out: it
        is the one kept."""
        if len(tokens):
            kept = last_occurrences(tokens)
            # Successors below min_prob are never drafted (best_first's floor): they are not looked for.
            self._store(np.asarray(tokens)[kept], *top_successors(logits, self.k, self.min_prob,
                                                                  kept if rows is None else np.asarray(rows)[kept]))

    def learn(self, tokens: Sequence[int], successors: np.ndarray, probs: np.ndarray) -> None:
        """Each token's entry replaced by ``top_successors``' row for it (rows recorded earlier: the replay); a
        token given several rows keeps its last (numpy leaves the winner of a repeated index unspecified)."""
        rows = last_occurrences(tokens)
        self._store(np.asarray(tokens)[rows], np.asarray(successors)[rows], np.asarray(probs)[rows])

    def _store(self, distinct: np.ndarray, successors: np.ndarray, probs: np.ndarray) -> None:
        self.successors[distinct] = successors[:, :self.k]
        self.probs[distinct] = probs[:, :self.k]

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        if max_tokens <= 0 or not context:
            return Draft([])

        def children(token: int) -> Iterable[tuple[int, float, int]]:
            return ((int(t), float(p), int(t)) for t, p in zip(self.successors[token], self.probs[token], strict=True)
                    if t >= 0)

        return best_first(context[-1], min(max_tokens, self.max_draft), self.min_prob, children)
