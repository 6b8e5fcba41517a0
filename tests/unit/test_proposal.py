"""Which draft a step verifies (edgespec/drafters/proposal.py): the drafters asked in order, and a weak free draft's
second opinion. Stub drafters and a real γ controller; the engine around it is tested in
tests/unit/test_engine_fake.py."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from edgespec.controller.cost import MAX_GAMMA, CostCurve
from edgespec.controller.gamma import GammaController
from edgespec.drafters import Draft
from edgespec.drafters.base import DraftKey
from edgespec.drafters.ngram import AGREED, ALONE, DIFFERED
from edgespec.drafters.proposal import WEAK_MATCH, agreed, propose
from edgespec.engine.sampling import SamplingParams

PARAMS, RNG = SamplingParams(), np.random.default_rng(0)
WEAK_KEY = (WEAK_MATCH, DIFFERED)  # lookup's key for a one-token match whose previous occurrence said otherwise


class _Stub:
    """A drafter that proposes ``tokens`` under ``key``; ``costs_per_token`` as a model drafter's (a pass a token)."""

    def __init__(self, name: str, tokens: list[int], key: DraftKey, costs_per_token: bool) -> None:
        self.name, self.tokens, self.key, self.costs_per_token = name, tokens, key, costs_per_token
        self.asked = 0

    def begin(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self.asked += 1
        return Draft(self.tokens[:max_tokens], key=self.key)


def _controller() -> GammaController:
    """A cost curve where a row costs 5% of a pass: every draft with a fair chance pays."""
    return GammaController(CostCurve(np.array([np.nan, *(1 + 0.05 * k for k in range(MAX_GAMMA + 1))]), 0.01))


def _propose(drafters: Sequence[_Stub], controller: GammaController | None) -> Draft:
    return propose(drafters, [1, 2, 3], "auto" if controller else 3, controller, 8, PARAMS, RNG)


def test_a_weak_free_draft_the_next_drafter_agrees_with_is_verified_under_a_name_of_its_own() -> None:
    lookup, head = _Stub("ngram", [5, 6, 7], WEAK_KEY, False), _Stub("head", [5, 9], 3, True)
    draft = _propose([lookup, head], _controller())
    assert head.asked == 1 and draft.source == agreed("ngram", "head") == "ngram+head"
    assert draft.tokens and draft.tokens == [5, 6, 7][:len(draft)] and draft.key == WEAK_KEY


def test_where_they_disagree_the_draft_expected_to_gain_more_is_verified() -> None:
    lookup, head = _Stub("ngram", [5, 6, 7], WEAK_KEY, False), _Stub("head", [8], 3, True)
    controller = _controller()
    # A free drafter is taken at a lower estimate, a model drafter at its mean: unknown both, the head wins.
    assert _propose([lookup, head], controller).source == "head"
    for _ in range(40):  # then the head is seen to be wrong every time it drafts
        controller.observe("head", 3, 1, 0, 0.0001, 0.0105)
    # Beside a draft that gains more than its own could, it is not even asked (its pass would be wasted).
    draft = _propose([lookup, head], controller)
    assert draft.source == "ngram" and draft.tokens == [5, 6, 7][:len(draft)] and draft.tokens
    assert head.asked == 1


@pytest.mark.parametrize("key", [(2, ALONE), (5, AGREED), 3])
def test_a_free_draft_on_a_longer_match_is_verified_without_asking_the_next_drafter(key: DraftKey) -> None:
    lookup, head = _Stub("ngram", [5, 6, 7], key, False), _Stub("head", [5], 3, True)
    draft = _propose([lookup, head], _controller())
    assert head.asked == 0 and draft.source == "ngram" and draft.tokens


def test_with_a_fixed_gamma_the_first_draft_is_verified() -> None:
    lookup, head = _Stub("ngram", [5, 6, 7], WEAK_KEY, False), _Stub("head", [5], 3, True)
    draft = _propose([lookup, head], None)
    assert head.asked == 0 and draft.tokens == [5, 6, 7] and draft.source == "ngram"


def test_a_weak_free_draft_stays_when_the_next_drafter_has_nothing() -> None:
    lookup, head = _Stub("ngram", [5, 6, 7], WEAK_KEY, False), _Stub("head", [], 0, True)
    draft = _propose([lookup, head], _controller())
    assert head.asked == 1 and draft.source == "ngram" and draft.tokens == [5, 6, 7][:len(draft)]
    assert _propose([lookup], _controller()).source == "ngram"  # no next drafter: nothing to wait for
