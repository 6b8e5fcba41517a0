"""Recycled logits (after Token Recycling): each token's likeliest successors, taken from the target's own verify
passes. Every verify pass computes a row of logits after each token it feeds; the engine already has them, so
keeping their top-k costs no target work. A token's entry is overwritten by the latest row that followed it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import InvalidParameterError
from ..sampling import SamplingParams
from .base import Draft, best_first


def top_successors(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the ``k`` likeliest tokens (best first) and their probabilities (softmax over the whole row)."""
    rows = np.asarray(logits, dtype=np.float32)
    top = np.argpartition(rows, -k, axis=1)[:, -k:]
    top_logits = np.take_along_axis(rows, top, axis=1)
    order = np.argsort(-top_logits, axis=1)
    top, top_logits = np.take_along_axis(top, order, axis=1), np.take_along_axis(top_logits, order, axis=1)
    peak = top_logits[:, :1]
    norm = np.exp(rows - peak, dtype=np.float32).sum(axis=1, keepdims=True)
    return top.astype(np.int32), np.exp(top_logits - peak) / norm


class RecycledDrafter:
    """A table of ``k`` successors per token with the target's probability for each (``observe``), drafted as a
    best-first tree: a node's score is the product of the probabilities down its path."""

    name = "recycled"
    costs_per_token = False

    def __init__(self, n_vocab: int, k: int = 4, min_prob: float = 0.05, max_draft: int = 16) -> None:
        if k < 1 or n_vocab < k or not 0 <= min_prob <= 1:
            raise InvalidParameterError(f"need 1 <= k <= n_vocab and 0 <= min_prob <= 1, got k={k}, "
                                        f"n_vocab={n_vocab}, min_prob={min_prob}")
        self.k, self.min_prob, self.max_draft = k, min_prob, max_draft
        self.successors = np.full((n_vocab, k), -1, dtype=np.int32)  # best first; -1: never seen
        self.probs = np.zeros((n_vocab, k), dtype=np.float32)

    @property
    def nbytes(self) -> int:
        return self.successors.nbytes + self.probs.nbytes

    def begin(self, context: Sequence[int]) -> None:
        """Nothing per request: what the target said after a token holds across requests."""

    def observe(self, tokens: Sequence[int], logits: np.ndarray) -> None:
        """Row i of ``logits`` is the target's distribution after ``tokens[i]`` (in its context then)."""
        if len(tokens):
            self.learn(tokens, *top_successors(logits, self.k))

    def learn(self, tokens: Sequence[int], successors: np.ndarray, probs: np.ndarray) -> None:
        """Each token's entry replaced by ``top_successors``' row for it (``observe``, or rows recorded earlier)."""
        index = np.asarray(tokens)
        self.successors[index] = np.asarray(successors)[:, :self.k]
        self.probs[index] = np.asarray(probs)[:, :self.k]

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        if max_tokens <= 0 or not context:
            return Draft([])

        def children(token: int) -> Iterable[tuple[int, float, int]]:
            return ((int(t), float(p), int(t)) for t, p in zip(self.successors[token], self.probs[token], strict=True)
                    if t >= 0)

        return best_first(context[-1], min(max_tokens, self.max_draft), self.min_prob, children)
