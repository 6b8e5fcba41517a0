"""Choosing γ, the number of draft tokens to verify, from measured costs and measured acceptance.

On a CPU, verifying k tokens in one pass costs far more than one token (measured here: ~1.5× for k=2,
~4× for k=16), so a rejected draft token is not free. Each step the controller picks the k that
maximises   E[tokens | k] − λ · E[seconds | k]   where λ is the rate the engine is achieving now
(Dinkelbach's method for maximising a ratio: at the fixed point λ is the best achievable tokens/s).

  E[tokens | k]  = 1 + Σ_{i≤k} Π_{j≤i} a_j       a_j: P(draft token j accepted | tokens 1..j-1 accepted)
  E[seconds | k] = verify(k+1) + c·verify(1)·k + overhead     c: a draft token's cost / one target pass

k = 0 (plain decoding) is always a candidate, so speculation only happens when it is expected to pay.
Acceptance a_j is tracked per drafter, per draft "key" (n-gram match length) and per streak (whether the
drafter's previous draft was accepted whole: inside a copied passage the next draft is likely right too),
with decay so it follows the text being generated (also on declined steps: old rejections fade).
The verify-cost curve is calibrated at load and refined online.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .verify import positions_tested

MAX_GAMMA = 16
_DECAY = 0.97  # per observation: acceptance statistics remember roughly the last 30 drafts of a key
_PRIOR_MEAN = 0.6  # optimistic enough that a new drafter or key gets tried
_PRIOR_WEIGHT = 2.0
_PRIOR = np.full(MAX_GAMMA, _PRIOR_MEAN)
_EMA = 0.1
# Every this many declined drafts of a key, verify one token anyway: estimates of a key that is never tried
# would never recover from an unlucky start, and speculation would stay off for good. Costs ≤ ~1.5%. Not for
# a drafter so dear that even a draft accepted whole would not pay (a layer-skip draft at c ≈ 1).
_EXPLORE_EVERY = 32


def expected_step(acceptance: np.ndarray, shape: np.ndarray, scale: float, draft_cost: float, overhead: float,
                  k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """E[tokens | k] and E[seconds | k] of one step verifying k = 0..k_max draft tokens (the module docstring's
    formulas): ``acceptance[j]`` is a_j, ``shape[k] * scale`` one target pass over k tokens, ``draft_cost`` the
    cost of a drafted token. The one copy of the rule: the controller, `edgespec tune` and the skip-set search
    all rate γ with it."""
    survive = np.concatenate(([1.0], np.cumprod(np.asarray(acceptance, dtype=float)[:k_max])))
    k = np.arange(len(survive))
    return np.cumsum(survive), np.asarray(shape[1:len(k) + 1], dtype=float) * scale + k * draft_cost + overhead


@dataclass
class CostCurve:
    """Seconds for one target pass over k tokens, k = 1..MAX_GAMMA+1, as shape × scale.

    The shape (relative cost of k tokens vs 1) comes from calibration; the scale follows every verify
    observed, so a context that grows (attention gets dearer) or a machine that gets busier moves the
    whole curve, not just the k values in use.
    """

    shape: np.ndarray  # index k: cost(k) / cost(1); index 0 unused
    scale: float  # seconds for k = 1

    @classmethod
    def measure(cls, run: Callable[[int], None], rounds: int = 3,
                statistic: Callable[[list[float]], float] = np.median) -> CostCurve:
        """Time ``run(k)`` (one target pass over k tokens, rolled back after) for every k, interleaved.

        The median resists a busy moment; ``np.min`` gives the fastest pass seen (for bounds)."""
        samples: list[list[float]] = [[] for _ in range(MAX_GAMMA + 2)]
        run(1)  # warm-up
        for _ in range(rounds):
            for k in range(1, MAX_GAMMA + 2):
                t = time.perf_counter()
                run(k)
                samples[k].append(time.perf_counter() - t)
        seconds = np.array([statistic(s) if s else np.nan for s in samples])
        curve = cls(shape=seconds / seconds[1], scale=float(seconds[1]))
        curve._bound()
        return curve

    def _bound(self) -> None:
        """Keep the shape physical. Verifying more tokens never costs less, and k tokens in one pass never cost
        more than k passes of one (the engine could always do that instead). Timings taken on a busy machine can
        say otherwise (measured under load: k = 5 at 1.36 against k = 3 at 2.05; k = 14 at 83× one token), and
        a curve that dips makes the controller verify long drafts that are rarely accepted, while one that
        soars makes it conclude that no draft could ever pay, and never try one to find out."""
        k = np.arange(len(self.shape))
        self.shape[1:] = np.minimum(np.maximum.accumulate(self.shape[1:]), k[1:])

    def seconds(self, k: int) -> float:
        return float(self.shape[k] * self.scale)

    def observe(self, k: int, seconds: float) -> None:
        self.scale += _EMA * (seconds / self.shape[k] - self.scale)
        if k > 1:  # refine the shape slowly where it is exercised
            self.shape[k] += _EMA / 4 * (seconds / self.scale - self.shape[k])
            self._bound()

    def as_dict(self) -> dict[int, float]:
        return {k: round(self.seconds(k), 6) for k in range(1, len(self.shape))}


@dataclass
class _Acceptance:
    """Decayed counts of drafted / accepted tokens per draft position (0-based)."""

    trials: np.ndarray = field(default_factory=lambda: np.zeros(MAX_GAMMA))
    accepts: np.ndarray = field(default_factory=lambda: np.zeros(MAX_GAMMA))

    def observe(self, drafted: int, accepted: int) -> None:
        self.fade()
        tested = positions_tested(drafted, accepted)
        self.trials[:tested] += 1
        self.accepts[:accepted] += 1

    def fade(self) -> None:
        """Weigh what was seen so far a little less (toward the prior, as the text moves on)."""
        self.trials *= _DECAY
        self.accepts *= _DECAY

    def rates(self, prior: np.ndarray) -> np.ndarray:
        return (self.accepts + prior * _PRIOR_WEIGHT) / (self.trials + _PRIOR_WEIGHT)


class GammaController:
    """Picks γ per step and learns from every step's outcome."""

    def __init__(self, curve: CostCurve, priors: dict[str, list[float]] | None = None,
                 draft_costs: dict[str, float] | None = None, overhead: float = 0.0) -> None:
        """``priors`` (per drafter, acceptance per draft position), ``draft_costs`` (seconds per drafted token
        when one target pass costs ``curve.scale``) and ``overhead`` seed what would otherwise be learned from
        scratch: ``edgespec tune`` measures them (edgespec/tuning.py)."""
        self.curve = curve
        # Positions beyond those measured take the last measured rate.
        self._priors = {name: np.array([*p, *[p[-1]] * MAX_GAMMA][:MAX_GAMMA], dtype=float)
                        for name, p in (priors or {}).items() if p}
        self._pooled: dict[str, _Acceptance] = {}
        self._keyed: dict[tuple[str, int, bool], _Acceptance] = {}
        self._streak: dict[str, bool] = {}  # per drafter: was its last verified draft accepted whole?
        self._declined: dict[tuple[str, int, bool], int] = {}
        # Per drafter: a drafted token's cost as a share of one single-token target pass (c). Kept as a ratio, not
        # in seconds, because both get dearer as the context grows: a draft cost frozen in seconds while the
        # verify scale rose made a layer-skip draft that cannot pay look as if it could (c 0.97, verify(2) 1.2×).
        self._draft_ratio = {name: s / curve.scale for name, s in (draft_costs or {}).items()}
        self._overhead = overhead  # seconds per step outside drafting and verifying
        self._tokens = 0.0  # decayed totals giving λ, the rate being achieved
        self._seconds = 0.0

    # -- decisions --------------------------------------------------------------------------------------
    def rate(self) -> float:
        if self._seconds > 0:
            return self._tokens / self._seconds
        return 1.0 / self.curve.seconds(1)

    def acceptance(self, drafter: str, key: int) -> np.ndarray:
        pooled = self._pooled.get(drafter)
        base = self._priors.get(drafter, _PRIOR)
        prior = pooled.rates(base) if pooled else base
        keyed = self._keyed.get(self._key(drafter, key))
        return keyed.rates(prior) if keyed else prior

    def _key(self, drafter: str, key: int) -> tuple[str, int, bool]:
        return drafter, key, self._streak.get(drafter, False)

    def choose(self, drafter: str, key: int, available: int, draft_cost_sunk: bool) -> int:
        """How many of ``available`` draft tokens to verify (0: decode plainly this step)."""
        available = min(available, MAX_GAMMA)
        if available <= 0:
            return 0
        ks = np.arange(available + 1)
        draft_cost = 0.0 if draft_cost_sunk else self._draft_ratio.get(drafter, 0.0) * self.curve.scale
        tokens, seconds = expected_step(self.acceptance(drafter, key), self.curve.shape, self.curve.scale,
                                        draft_cost, self._overhead, available)
        value = tokens - self.rate() * seconds
        k = int(np.argmax(value))
        if k == 0:
            if np.all(ks + 1 - self.rate() * seconds <= value[0]):
                return 0  # even a draft accepted whole would not pay (a dear one): nothing to explore
            stats_key = self._key(drafter, key)
            # A declined draft teaches nothing, and the text it would have drafted from moves on: what a few
            # rejections taught fades back toward the prior, so one unlucky passage (or request) cannot keep
            # speculation off for the rest of a session (Spec-Bench, GGUF: mean γ 0.07 instead of 0.52, τ 1.05,
            # while γ = 4 ran 1.5× on reasoning questions).
            for stats in (self._keyed.get(stats_key), self._pooled.get(drafter)):
                if stats is not None:
                    stats.fade()
            self._declined[stats_key] = self._declined.get(stats_key, 0) + 1
            if self._declined[stats_key] >= _EXPLORE_EVERY:
                self._declined[stats_key] = 0
                return 1
        return k

    # -- learning ---------------------------------------------------------------------------------------
    def observe(self, drafter: str | None, key: int, drafted: int, accepted: int,
                draft_s: float, verify_s: float, passes: int | None = None) -> None:
        """One verify step: ``drafted`` tokens verified, ``accepted`` kept (plus the target's own token).

        ``passes``: draft forward passes spent, when more than ``drafted`` (a draft that stopped on low
        confidence): the extra pass is charged, and its doubted position counts as a rejected one.
        """
        self.curve.observe(drafted + 1, verify_s)
        self._tokens = self._tokens * _DECAY + accepted + 1
        self._seconds = self._seconds * _DECAY + draft_s + verify_s + self._overhead
        tried = max(drafted, passes or 0)
        if drafter is None or tried == 0:
            return
        ratio = self._draft_ratio.get(drafter)
        per_token = draft_s / tried / self.curve.scale
        self._draft_ratio[drafter] = per_token if ratio is None else ratio + _EMA * (per_token - ratio)
        self._pooled.setdefault(drafter, _Acceptance()).observe(tried, accepted)
        self._keyed.setdefault(self._key(drafter, key), _Acceptance()).observe(tried, accepted)
        self._streak[drafter] = accepted == tried

    def observe_overhead(self, seconds: float) -> None:
        """Time spent per step outside drafting and verifying (accepting, detokenizing, bookkeeping)."""
        self._overhead += _EMA * (seconds - self._overhead)
