"""What a verify pass costs: seconds for one target pass over k tokens, as a shape (k = 1 is 1.0) times a scale, and
what one step verifying k draft tokens is expected to gain and cost (``expected_step``, the rule the controller,
`edgespec tune` and the skip-set search all rate γ with).

On a CPU, verifying k tokens in one pass costs far more than one token (measured here: ~1.5× for k=2, ~4× for
k=16), so the shape matters as much as the acceptance. The curve is calibrated at load; online, its scale follows
every single-token pass and each k verified is believed at what its verifies cost (``CostCurve.observe``), the
calibration's form filling in the k not verified lately."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

MAX_GAMMA = 16
# Shared with the acceptance statistics (gamma.py): what is learned per observation is aged by DECAY (roughly the
# last 30 observations remembered), and a running estimate moves by EMA toward each new sample.
DECAY = 0.97
EMA = 0.1
_CURVE_EMA = 0.2  # per verify of a k: its cost follows a change within ~5 verifies of it


def expected_step(acceptance: Sequence[float], shape: Sequence[float], scale: float, draft_cost: float,
                  overhead: float, k_max: int) -> tuple[list[float], list[float]]:
    """E[tokens | k] and E[seconds | k] of one step verifying k = 0..k_max draft tokens (the module docstring's
    formulas): ``acceptance[j]`` is a_j, ``shape[k] * scale`` one target pass over k tokens, ``draft_cost`` the
    cost of a drafted token. The one copy of the rule: the controller, `edgespec tune` and the skip-set search
    all rate γ with it. Plain floats: the controller asks every step, for a few k, where numpy's calls cost more
    than the arithmetic (~60 µs a step in the decode loop)."""
    tokens, survive = [1.0], 1.0
    for a in acceptance[:k_max]:
        survive *= float(a)
        tokens.append(tokens[-1] + survive)
    return tokens, [float(shape[k + 1]) * scale + k * draft_cost + overhead for k in range(len(tokens))]


@dataclass
class CostCurve:
    """Seconds for one target pass over k tokens, k = 1..MAX_GAMMA+1, as shape × scale.

    The scale (one token's pass) follows every single-token pass, so a context that grows (attention gets dearer)
    or a machine that gets busier moves the whole curve. The shape (cost(k) / cost(1)) starts from calibration and
    is learned per k from the verifies themselves: where a k has been verified lately its own running estimate
    counts, and the k not yet verified (or not lately) take the calibration's form, its excess over one row scaled
    by one steepness fitted to the k that were (see ``observe``).
    """

    shape: np.ndarray  # index k: cost(k) / cost(1); index 0 unused
    scale: float  # seconds for k = 1 (and for every k up to flat_rows)
    # Passes of up to this many tokens cost the same by construction (a target that pads every pass to this many
    # rows: ``pad_to``).
    flat_rows: int = 1
    # The prior for k not verified lately: 1 + steepness · (calibrated shape − 1), fitted to the k that were.
    steepness: float = 1.0
    # Per k from 1 (index k − 1), as plain floats: they change every verify, and on 17 numbers numpy's calls cost more
    # than the arithmetic (in the decode loop, caches cold after a pass: ~130 µs a verify with arrays).
    _excess: list[float] = field(init=False, repr=False)  # the calibration's excess over one row
    _cost: list[float] = field(init=False, repr=False)  # running estimate of cost(k) / cost(1)
    _seen: list[float] = field(init=False, repr=False)  # decayed count of verifies behind that estimate
    _anchor: float = field(init=False, repr=False)  # the calibration's weight in the steepness (``_refit``)

    def __post_init__(self) -> None:
        self.shape[1:] = physical(self.shape[1:].tolist(), [1.0] * (len(self.shape) - 1))
        self._cost = self.shape[1:].tolist()
        self._set_excess([cost - 1 for cost in self._cost])
        self._seen = [0.0] * len(self._cost)

    def _set_excess(self, excess: list[float]) -> None:
        """The calibration's excess per k, and the weight its form gets in the steepness: one verify at its least
        steep k (``_refit``)."""
        self._excess = excess
        self._anchor = min((e * e for e in excess if e > 0), default=0.0)

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
        return cls(shape=seconds / seconds[1], scale=float(seconds[1]))

    def seconds(self, k: int) -> float:
        return float(self.shape[k] * self.scale)

    def pad_to(self, rows: int) -> None:
        """The target pads every pass of up to ``rows`` tokens to ``rows`` rows (a GPU's fixed-shape passes): those
        passes are one shape, so they cost the same and each of them times the scale. What a calibration or the
        verifies measured for them otherwise is noise around that (H200: 1.564 ms for 1-4 tokens, padded to 4)."""
        self.flat_rows = max(1, rows)
        flat = min(self.flat_rows, len(self._cost))
        self._cost[:flat] = [1.0] * flat
        self._set_excess([0.0] * flat + self._excess[flat:])
        self._seen[:flat] = [0.0] * flat
        self._refit()

    def observe(self, k: int, seconds: float) -> None:
        """Learn from one pass over k tokens: a single token's sets the scale, a batch's the shape.

        Both from every pass would not be identifiable: verifies at one k fit any shape once the scale absorbs the
        rest, so a curve once learned flat (a long context, where the padded single-token pass costs nearly what a
        batch does) explained every later, steeper verify by a dearer pass and stayed flat while the controller
        drafted every step (a Spec-Bench run, stem's question 142 after the extraction questions: 316
        tokens drafted, 27 accepted, 0.68× its target alone in the same run). A scale left stale by steps that all
        draft errs the safe way: a context that grew makes batches look steep, drafting stops, and the next plain
        step renews the scale.

        Each k verified keeps its own estimate. One factor times the calibration's form, fitted to every k at once
        (this curve's rule before), believed the EPYC's loop paid 1.2-4× what it did for 3+ rows
        (docs/controller.md): the calibration there is flat at 2 rows and its excess is not proportional to the
        loop's, so the factor that fitted the k in use (divided by a calibrated excess of a few %) overshot the
        others, and lookup drafted too short. The factor now only fills in the k not verified lately, fitted by
        least squares so that the k with the largest calibrated excess (the best-measured form) weigh most and a k
        calibrated at 1.00 not at all.
        """
        if k <= self.flat_rows:
            self.scale += EMA * (seconds - self.scale)
            return
        # Every batch verify ages what the others taught: a k not verified for ~30 verifies falls back to the prior.
        self._seen = [seen * DECAY for seen in self._seen]
        i, seconds = k - 1, float(seconds)  # plain floats stay plain (a numpy scalar's arithmetic is slower)
        self._seen[i] += 1
        # A running mean over the first verifies of a k, then an average of its latest ~5 (a stall on a shared
        # machine moves it for a few verifies; a context or load that changes what a k costs is followed as fast);
        # a verify that ran past k single passes counts as k, as the engine could always have run them one by one.
        self._cost[i] += max(1 / self._seen[i], _CURVE_EMA) * (min(seconds / self.scale, k) - self._cost[i])
        self._refit()

    def _refit(self) -> None:
        """The shape from the per-k estimates, each weighed against the prior as one verify's worth.

        The steepness counts the calibration's own form (steepness 1) as one verify at its least steep k: as what
        the verifies taught fades, the k not verified lately return to the calibration's form and get tried again.
        Without it the fit's weights faded alike and kept their ratio, so one stalled verify of a k believed for
        good: on the AVX-512 EPYC (a calibration flat at two rows, whose verifies cannot move the steepness) a
        steepness of 13.7 learned from a three-row verify long gone priced 3-6 rows at 2-4× a pass, and lookup's
        drafts of 0.6-0.9 acceptance were cut to one token for whole sessions, carried from process to process.
        """
        rows = list(zip(self._seen, self._cost, self._excess, strict=True))
        fit = sum(seen * excess * excess for seen, _, excess in rows) + self._anchor
        if fit > 0:
            self.steepness = max(0.0, (sum(seen * excess * (cost - 1) for seen, cost, excess in rows)
                                       + self._anchor) / fit)
        blended = []
        for seen, cost, excess in rows:
            prior = 1 + self.steepness * excess
            blended.append(prior + seen / (seen + 1) * (cost - prior))
        self.shape[1:] = physical(blended, [seen + 1 for seen in self._seen])

    def learned(self) -> dict[str, list[float]]:
        """What the verifies taught of each k's cost, for the next process on the same model (``start_from``)."""
        return {"cost": list(self._cost), "seen": list(self._seen)}

    def start_from(self, learned: object) -> None:
        """Take what ``learned`` wrote (ratios: the scale is this process's); ValueError for anything else."""
        try:
            cost, seen = (np.array(learned[name], dtype=float) for name in ("cost", "seen"))  # type: ignore[index]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a cost curve's learned state: {e}") from e
        if cost.shape != seen.shape or cost.shape != (len(self.shape) - 1,) or not (
                np.all(np.isfinite(cost)) and np.all(cost >= 0) and np.all(np.isfinite(seen)) and np.all(seen >= 0)):
            raise ValueError("not a cost curve's learned state")
        self._cost, self._seen = cost.tolist(), seen.tolist()
        self._refit()

    def as_dict(self) -> dict[int, float]:
        return {k: round(self.seconds(k), 6) for k in range(1, len(self.shape))}


def physical(shape: list[float], weight: list[float], rows: Sequence[int] | None = None) -> list[float]:
    """``shape`` (the cost of ``rows`` tokens each, default 1, 2, 3, ...: from k = 1, the unit, kept) made physical,
    each other point moved as little as its ``weight`` says (a weighted isotonic fit, pooling adjacent violators):
    verifying more tokens never costs less, and k tokens in one pass never cost more than k passes of one (the engine
    could always do that instead). Timings on a busy machine say otherwise (measured under load: k = 5 at 1.36
    against k = 3 at 2.05; k = 14 at 83× one token): a curve that dips makes the controller verify long drafts that
    are rarely accepted, one that soars makes it conclude that no draft could ever pay, and never try one to find out.
    Pooling, not raising every later point to the highest before it, keeps one noisy or overestimated k from lifting
    all the k after it."""
    ks = rows if rows is not None else range(1, len(shape) + 1)
    return _nondecreasing([1.0, *(min(value, k) for k, value in zip(ks[1:], shape[1:], strict=True))], weight)


def _nondecreasing(values: list[float], weight: list[float]) -> list[float]:
    """``values`` with each run that decreases pooled into its weighted mean (a weighted isotonic fit, pooling adjacent
    violators); the first value is a fixed unit and never moves (its weight is not read)."""
    if all(a <= b for a, b in pairwise(values)):
        return values
    pooled, weights, points = [values[0]], [math.inf], [1]
    for value, w in zip(values[1:], weight[1:], strict=True):
        pooled.append(value)
        weights.append(w)
        points.append(1)
        while len(pooled) > 1 and pooled[-2] > pooled[-1]:
            v2, w2, n2 = pooled.pop(), weights.pop(), points.pop()
            if not math.isinf(weights[-1]):
                pooled[-1] = (pooled[-1] * weights[-1] + v2 * w2) / (weights[-1] + w2)
            weights[-1] += w2
            points[-1] += n2
    return [value for value, n in zip(pooled, points, strict=True) for _ in range(n)]
