"""Sampling parameters and the logits → probabilities transform.

The same transform is applied to the target's logits (p) and to a draft model's logits (q): speculative
sampling is only lossless when both distributions are shaped by the same temperature and truncation.
Order follows Hugging Face: temperature, then top-k, top-p and min-p on the tempered distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidParameterError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    seed: int | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidParameterError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidParameterError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p < 1.0):
            raise InvalidParameterError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """Rows of logits (n × vocab, or one vector) → rows of probabilities in float64."""
        x = np.atleast_2d(np.asarray(logits, dtype=np.float64))
        # The maximum is subtracted before dividing, so that any temperature > 0 is safe: a tiny one (1e-320) turns
        # every gap to the maximum into -inf, probability exactly 0 (its true value, far below float64's
        # smallest), instead of turning the logits themselves into inf and the probabilities into NaN.
        with np.errstate(over="ignore"):
            x = (x - x.max(axis=1, keepdims=True)) / self.temperature
        if self.top_k and self.top_k < x.shape[1]:
            kth = np.partition(x, -self.top_k, axis=1)[:, -self.top_k, None]
            x = np.where(x < kth, -np.inf, x)
        p = np.exp(x)
        p /= p.sum(axis=1, keepdims=True)
        if self.top_p < 1.0:
            p = _top_p(p, self.top_p)
        if self.min_p > 0.0:
            p = np.where(p < self.min_p * p.max(axis=1, keepdims=True), 0.0, p)
            p /= p.sum(axis=1, keepdims=True)
        return p


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (the token crossing it included)."""
    order = np.argsort(-p, axis=1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=1)
    mass_before = np.cumsum(sorted_p, axis=1) - sorted_p
    keep_sorted = mass_before < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    p = np.where(keep, p, 0.0)
    return p / p.sum(axis=1, keepdims=True)


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from a probability vector (inverse CDF; robust to rounding at the top end)."""
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(p) - 1))
