"""Choosing γ, the number of draft tokens to verify, from measured costs and measured acceptance.

On a CPU, verifying k tokens in one pass costs far more than one token (measured here: ~1.5× for k=2,
~4× for k=16), so a rejected draft token is not free. Each step the controller picks the k that
maximises   E[tokens | k] − λ · E[seconds | k]   where λ is the rate the engine is achieving now
(Dinkelbach's method for maximising a ratio: at the fixed point λ is the best achievable tokens/s).

  E[tokens | k]  = 1 + Σ_{i≤k} Π_{j≤i} a_j       a_j: P(draft token j accepted | tokens 1..j-1 accepted)
  E[seconds | k] = verify(k+1) + c·verify(1)·k + overhead     c: a draft token's cost / one target pass

k = 0 (plain decoding) is always a candidate, so speculation only happens when it is expected to pay, and λ is
never below plain decoding's rate (the best policy is at least that fast; a λ dragged down by drafts that lost
would lower the bar for the next one, and losses would feed on themselves).
Acceptance a_j is tracked per drafter, per draft "key" (n-gram: match length, and what the match's previous
occurrence said) and per streak (whether the drafter's previous draft was right as far as it was judged: inside a
copied passage the next draft is likely right too), with decay so it follows the text being generated; a key with
few samples leans on its coarser key's rates (a tuple key's prefix: the match length alone), then on the drafter's
pooled rates, which lean on a fixed prior only until the first steps of a session have been judged.

Free drafts (lookup) are judged whether they are verified or not: the tokens the target commits next say how
much of a draft was right, at no cost. So γ = 0 teaches as much as drafting does: a stretch of misses switches
speculation off without paying for the evidence, and it switches back on as soon as declined drafts start
matching (a copied passage after a stretch of misses). Because evidence is free, there is nothing to gain from
optimism: a free drafter's acceptance is taken half a standard deviation below its posterior mean, so a key with
little evidence is declined until its own drafts have been seen to match: caution costs a late start, and, the
evidence being decayed, a lasting discount (hence half a deviation, not one: _LOWER_Z). A
key well learned on an earlier text is believed on the next until that text's drafts contradict it (one controller
serves every request): a lookup key right on copied text was verified twice more on the scripted fresh text after
it in tests/unit/test_replay.py, ~0.3% of that text's time. A model drafter's declined draft is never made, so for it
the posterior mean, the fade of declined keys toward the prior and a one-token exploration every _EXPLORE_EVERY
declines remain.

Why the controller this replaced lost on a steep curve (`edgespec replay`, recorded Spec-Bench outputs): it
learned only from verified drafts, so declined keys faded back toward an optimistic prior (0.6) and were re-tried,
and it refined its cost curve only at the k in use, slowly: timed with a curve calibrated flatter than the true
one (a short calibration context, or a busy machine), it kept drafting where verifying cost more than it won.
The verify-cost curve (cost.py) is calibrated at load and follows what the verifies cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..drafters.base import DraftKey
from ..engine.arena import common_prefix
from ..engine.verify import positions_tested
from .cost import DECAY, EMA, MAX_GAMMA, CostCurve, expected_step

_PRIOR_MEAN = 0.6  # optimistic enough that a new model drafter or key gets tried (a free one takes a lower bound)
_PRIOR_WEIGHT = 2.0
_PRIOR = [_PRIOR_MEAN] * MAX_GAMMA
# A free drafter's acceptance is taken half a standard deviation below its posterior mean (about the 31st
# percentile). Not more: with DECAY a key's evidence never passes ~33 observations, so the margin is not only a late
# start but a lasting discount (~0.08 at one deviation for a rate near 0.5), which cut well-learned drafts short;
# replayed on every recorded stream set and cost curve (docs/controller.md), half a deviation was faster than one.
_LOWER_Z = 0.5
# Every this many declined drafts of a key, verify one token anyway: estimates of a key that is never tried
# would never recover from an unlucky start, and speculation would stay off for good. Costs ≤ ~1.5%. Not for
# a drafter so dear that even a draft accepted whole would not pay (a layer-skip draft at c ≈ 1).
_EXPLORE_EVERY = 32










_StatsKey = tuple[str, DraftKey, bool]  # drafter, draft key, streak


def _levels(stats_key: _StatsKey) -> list[_StatsKey]:
    """The statistics a draft's outcome teaches, coarse to fine: a tuple key's every prefix, or the key itself."""
    drafter, key, streak = stats_key
    if isinstance(key, int):
        return [stats_key]
    return [(drafter, key[:n], streak) for n in range(1, len(key) + 1)]


def _draft_key(value: object) -> DraftKey:
    """A draft key as JSON wrote it (a tuple as a list); ValueError for anything else."""
    if isinstance(value, list) and value:
        return tuple(int(x) for x in value)
    if isinstance(value, int):
        return value
    raise ValueError(f"not a draft key: {value!r}")


@dataclass
class _Acceptance:
    """Decayed counts of drafted / accepted tokens per draft position (0-based), as plain floats: they change every
    step, and on 16 numbers numpy's calls cost more than the arithmetic."""

    trials: list[float] = field(default_factory=lambda: [0.0] * MAX_GAMMA)
    accepts: list[float] = field(default_factory=lambda: [0.0] * MAX_GAMMA)

    def observe(self, drafted: int, accepted: int) -> None:
        """Fade what was seen, then count this draft: its first ``tested`` positions tried, ``accepted`` right."""
        self.fade()
        for i in range(positions_tested(drafted, accepted)):
            self.trials[i] += 1
        for i in range(accepted):
            self.accepts[i] += 1

    def fade(self) -> None:
        """Weigh what was seen so far a little less (toward the prior, as the text moves on)."""
        self.trials = [trials * DECAY for trials in self.trials]
        self.accepts = [accepts * DECAY for accepts in self.accepts]

    def as_lists(self) -> list[list[float]]:
        return [list(self.trials), list(self.accepts)]

    @classmethod
    def from_lists(cls, lists: object) -> _Acceptance:
        """The counts ``as_lists`` wrote; ValueError for anything else (a damaged or foreign file)."""
        trials, accepts = (np.array(x, dtype=float) for x in lists)  # type: ignore[union-attr]
        if trials.shape != (MAX_GAMMA,) or accepts.shape != (MAX_GAMMA,) or not (
                np.all(np.isfinite(trials)) and np.all(accepts >= 0) and np.all(accepts <= trials + 1e-9)):
            raise ValueError("not acceptance counts")
        return cls(trials.tolist(), accepts.tolist())

    def rates(self, prior: Sequence[float], lower_z: float = 0.0) -> list[float]:
        """Posterior mean of each position's rate, or ``lower_z`` standard deviations below it (at least 0; a mean is
        within [0, 1]: accepted ≤ trials, and so is the prior), for the first ``len(prior)`` positions."""
        rates = []
        for trials, accepts, p in zip(self.trials, self.accepts, prior, strict=False):
            n = trials + _PRIOR_WEIGHT
            mean = (accepts + p * _PRIOR_WEIGHT) / n
            rates.append(max(mean - lower_z * math.sqrt(mean * (1 - mean) / n), 0.0) if lower_z else mean)
        return rates


class GammaController:
    """Picks γ per step and learns from every step's outcome."""

    def __init__(self, curve: CostCurve, priors: dict[str, list[float]] | None = None,
                 draft_costs: dict[str, float] | None = None, overhead: float = 0.0) -> None:
        """``priors`` (per drafter, acceptance per draft position), ``draft_costs`` (seconds per drafted token
        when one target pass costs ``curve.scale``) and ``overhead`` seed what would otherwise be learned from
        scratch: ``edgespec tune`` measures them (edgespec/tuning/store.py)."""
        self.curve = curve
        # Positions beyond those measured take the last measured rate.
        self._priors = {name: [float(x) for x in [*p, *[p[-1]] * MAX_GAMMA][:MAX_GAMMA]]
                        for name, p in (priors or {}).items() if p}
        self._pooled: dict[str, _Acceptance] = {}
        self._keyed: dict[_StatsKey, _Acceptance] = {}
        self._streak: dict[str, bool] = {}  # per drafter: was its last verified draft accepted whole?
        self._declined: dict[_StatsKey, int] = {}
        # Per free drafter: this step's draft (its statistics key and tokens), verified or not, until the
        # target's next tokens say how much of it was right.
        self._shadows: dict[str, tuple[_StatsKey, list[int]]] = {}
        self._free: set[str] = set()  # drafters whose drafts have been judged for free
        # Per drafter: a drafted token's cost as a share of one single-token target pass (c). Kept as a ratio, not
        # in seconds, because both get dearer as the context grows: a draft cost frozen in seconds while the
        # verify scale rose made a layer-skip draft that cannot pay look as if it could (c 0.97, verify(2) 1.2×).
        self._draft_ratio = {name: s / curve.scale for name, s in (draft_costs or {}).items()}
        # What each drafter's tokens cost before anything was learned (none: free until its first draft is timed): a
        # learned cost too high to explore fades back to it (``_fade_cost``).
        self._draft_prior = dict(self._draft_ratio)
        self._overhead = overhead  # seconds per step outside drafting and verifying
        self._tokens = 0.0  # decayed totals giving λ, the rate being achieved
        self._seconds = 0.0

    def learned(self) -> dict[str, object]:
        """What this controller learned — its drafters' acceptance per draft position, pooled and per key, a draft
        token's cost, and what each verified k cost — for the next process on the same model to start from
        (``start_from``): a one-shot ``edgespec generate`` otherwise spends its first steps relearning what every
        earlier run knew."""
        return {"pooled": {name: a.as_lists() for name, a in self._pooled.items()},
                "keyed": [[name, key, streak, a.as_lists()] for (name, key, streak), a in self._keyed.items()],
                "draft_ratio": dict(self._draft_ratio), "curve": self.curve.learned()}

    def start_from(self, learned: dict[str, object]) -> None:
        """Take what an earlier controller learned (``learned``'s dict); ValueError if it is not one, and then
        nothing is taken."""
        try:
            pooled = {str(n): _Acceptance.from_lists(v) for n, v in learned["pooled"].items()}  # type: ignore
            keyed = {(str(n), _draft_key(k), bool(s)): _Acceptance.from_lists(v)
                     for n, k, s, v in learned["keyed"]}  # type: ignore[union-attr]
            ratios = {str(n): float(r) for n, r in learned["draft_ratio"].items()}  # type: ignore[union-attr]
            if "curve" in learned:  # files written before the curve was learned per k lack it
                self.curve.start_from(learned["curve"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a controller's learned state: {e}") from e
        self._pooled.update(pooled)
        self._keyed.update(keyed)
        self._draft_ratio.update({n: r for n, r in ratios.items() if np.isfinite(r) and r >= 0})

    def forget(self, drafter: str) -> None:
        """Drop what was learned of ``drafter`` (``start_from`` took it for another drafter of that name: a draft
        head trained since)."""
        self._pooled.pop(drafter, None)
        self._draft_ratio.pop(drafter, None)
        for key in [key for key in self._keyed if key[0] == drafter]:
            del self._keyed[key]

    def begin(self) -> None:
        """A new sequence starts: no drafter has a previous draft in it, so none is on a streak (a streak carried
        over from the end of the last request made the first lookup draft of each new one look as good as a
        copied passage's)."""
        self._streak.clear()
        self._shadows.clear()

    # -- decisions --------------------------------------------------------------------------------------
    def rate(self) -> float:
        """λ: the rate achieved lately, but never below plain decoding's: the best policy is at least as fast
        as never drafting, and a λ lowered by drafts that lost would make the next long draft look cheaper."""
        plain = 1.0 / (self.curve.seconds(1) + self._overhead)
        return max(self._tokens / self._seconds, plain) if self._seconds > 0 else plain

    def acceptance(self, drafter: str, key: DraftKey, positions: int = MAX_GAMMA) -> list[float]:
        """Acceptance of the first ``positions`` draft positions for this key: a free drafter's lower estimate (its
        declined drafts are judged anyway, so caution costs only a late start), another's posterior mean (it learns
        only by drafting, so it needs the benefit of the doubt, and exploration). Each level's rates are the prior of
        the next finer one: the fixed prior, the drafter's pooled statistics, then the key's, coarse to fine."""
        lower_z = _LOWER_Z if drafter in self._free else 0.0
        base = self._priors.get(drafter, _PRIOR)[:positions]
        levels = [self._pooled.get(drafter), *map(self._keyed.get, _levels(self._key(drafter, key)))]
        known = [stats for stats in levels if stats is not None] or [_Acceptance()]
        for stats in known[:-1]:
            base = stats.rates(base)
        return known[-1].rates(base, lower_z)

    def _key(self, drafter: str, key: DraftKey) -> _StatsKey:
        return drafter, key, self._streak.get(drafter, False)

    def choose(self, drafter: str, key: DraftKey, available: int, draft_cost_sunk: bool,
               tokens: Sequence[int] | None = None, explore: bool = True) -> int:
        """How many of ``available`` draft tokens to verify (0: decode plainly this step). ``tokens``: the
        draft itself, when it is free (lookup): what the target commits next tells how much of it was right,
        whether it is verified or not (``observe``'s ``committed``). ``explore`` False: a model drafter asked for a
        second opinion, where another draft would be verified anyway, is declined without counting it a decline
        (no fading toward the prior, no exploration)."""
        available = min(available, MAX_GAMMA)
        if available <= 0:
            return 0
        stats_key = self._key(drafter, key)
        if tokens is not None:
            self._shadows[drafter] = (stats_key, list(tokens[:available]))
            self._free.add(drafter)
        value, seconds, rate = self._values(drafter, key, available, draft_cost_sunk)
        k = max(range(len(value)), key=value.__getitem__)  # the first best, as argmax
        if k == 0 and tokens is None and explore:
            if all(n + 1 - rate * s <= value[0] for n, s in enumerate(seconds)):
                if not draft_cost_sunk:  # its cost is what decided (a draft already made was just timed)
                    self._fade_cost(drafter)
                return 0  # even a draft accepted whole would not pay (a dear one): nothing to explore
            # A draft that was never made teaches nothing: what a few rejections taught fades back toward the
            # prior, and every _EXPLORE_EVERY declines one token is verified anyway, so one unlucky passage
            # cannot keep a model drafter off for the rest of a session.
            for stats in (*map(self._keyed.get, _levels(stats_key)), self._pooled.get(drafter)):
                if stats is not None:
                    stats.fade()
            self._declined[stats_key] = self._declined.get(stats_key, 0) + 1
            if self._declined[stats_key] >= _EXPLORE_EVERY:
                self._declined[stats_key] = 0
                return 1
        return k

    def _fade_cost(self, drafter: str) -> None:
        """A draft cost believed too high to explore fades toward the drafter's prior by one decay a declined step,
        as declined keys' rejections fade: a drafter that is never run is never timed again, so one dear stretch
        would otherwise be believed for good, and carried to every later process by the learned state (once
        the default's draft head believed at 1.25 target passes a token, ~0.1 measured, and declined at each of its
        1 222 turns in 26 answers, mode head running as lookup alone). A drafter calibrated dear (the layer-skip
        draft) keeps its calibrated cost and stays declined."""
        ratio, prior = self._draft_ratio.get(drafter), self._draft_prior.get(drafter, 0.0)
        if ratio is not None and ratio > prior:
            self._draft_ratio[drafter] = prior + DECAY * (ratio - prior)

    def gain(self, drafter: str, key: DraftKey, k: int, draft_cost_sunk: bool = True) -> float:
        """What verifying the first ``k`` tokens of a draft (already made, or still to be drafted and paid for) is
        expected to add over decoding plainly, in tokens (λ × its seconds taken off): how two drafts that could each
        be verified this step compare."""
        k = min(k, MAX_GAMMA)
        if k <= 0:
            return 0.0
        value = self._values(drafter, key, k, draft_cost_sunk)[0]
        return value[k] - value[0]

    def _values(self, drafter: str, key: DraftKey, available: int,
                draft_cost_sunk: bool) -> tuple[list[float], list[float], float]:
        """Per k = 0..available: expected tokens less λ × expected seconds; the seconds; λ."""
        draft_cost = 0.0 if draft_cost_sunk else self._draft_ratio.get(drafter, 0.0) * self.curve.scale
        tokens_k, seconds = expected_step(self.acceptance(drafter, key, available), self.curve.shape,
                                          self.curve.scale, draft_cost, self._overhead, available)
        rate = self.rate()
        return [t - rate * s for t, s in zip(tokens_k, seconds, strict=True)], seconds, rate

    # -- learning ---------------------------------------------------------------------------------------
    def observe(self, drafter: str | None, key: DraftKey, drafted: int, accepted: int,
                draft_s: float, verify_s: float, passes: int | None = None,
                committed: Sequence[int] | None = None) -> None:
        """One verify step: ``drafted`` tokens verified, ``accepted`` kept (plus the target's own token).

        ``passes``: draft forward passes spent, when more than ``drafted`` (a draft that stopped on low
        confidence): the extra pass is charged, and its doubted position counts as a rejected one.
        ``committed``: the tokens this step committed (the accepted ones and the target's): they judge the free
        drafts ``choose`` saw this step, the declined ones too.
        """
        self.curve.observe(drafted + 1, verify_s)
        self._tokens = self._tokens * DECAY + accepted + 1
        self._seconds = self._seconds * DECAY + draft_s + verify_s + self._overhead
        judged = self._judge_shadows(committed) if committed is not None else set()
        self._shadows.clear()
        tried = max(drafted, passes or 0)
        if drafter is None or tried == 0:
            return
        ratio = self._draft_ratio.get(drafter)
        per_token = draft_s / tried / self.curve.scale
        # One proposal raises a known cost by a tenth (EMA) at most: a stall is one sample, a real change is in all.
        if ratio:
            per_token = min(per_token, 2 * ratio)
        self._draft_ratio[drafter] = per_token if ratio is None else ratio + EMA * (per_token - ratio)
        if drafter not in judged:
            self._learn(drafter, self._key(drafter, key), tried, accepted)

    def _judge_shadows(self, committed: Sequence[int]) -> set[str]:
        """Score each free draft of this step against what the target committed: its position j was tested if
        all before it matched and the target's token at j is known. Returns the drafters judged."""
        for drafter, (stats_key, tokens) in self._shadows.items():
            matched = common_prefix(tokens, committed)
            tested = min(len(tokens), matched + 1 if matched < len(committed) else matched)
            if tested:
                self._learn(drafter, stats_key, tested, matched)
        return set(self._shadows)

    def _learn(self, drafter: str, stats_key: _StatsKey, tested: int, accepted: int) -> None:
        self._pooled.setdefault(drafter, _Acceptance()).observe(tested, accepted)
        for level in _levels(stats_key):
            self._keyed.setdefault(level, _Acceptance()).observe(tested, accepted)
        self._streak[drafter] = accepted == tested

    def observe_overhead(self, seconds: float) -> None:
        """Time spent per step outside drafting and verifying (accepting, detokenizing, bookkeeping)."""
        self._overhead += EMA * (seconds - self._overhead)
