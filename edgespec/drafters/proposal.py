"""Which draft a step verifies: the mode's drafters asked in order, each draft cut to the γ the controller chooses.

One copy of the rule for the engine (``Engine._speculate``) and for ``edgespec replay``, which plays it over recorded
outputs: a replay of another rule would predict another engine.

A free draft that rests on a one-token match (lookup's weakest key: its first token right ~20% of the time on
Spec-Bench), or that the controller declined, gets a second opinion: the next drafter (the draft head) is asked as
well, where its draft could gain more than the free one. Where its draft starts with the same token the two agree,
and the free draft is verified under a name of its own (``agreed``), so that the controller learns what agreement
is worth: on the development half's recorded outputs lookup's one-token matches were right 67% of the time where
the head agreed and 18% where it did not (1.86 tokens of the chain against 0.65). Where they disagree, the draft
the controller expects to gain more is verified. Measured side by side with the rule before it (the development half,
both start orders: docs/drafting-experiments.md): +1.4% and +0.6% tok/s, τ +0.02–0.03, the same output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..controller.gamma import GammaController
from ..engine.sampling import SamplingParams
from . import Draft, Drafter
from .base import DraftKey

WEAK_MATCH = 1  # a free draft keyed by a match this long (lookup's one-token matches) gets a second opinion


def agreed(first: str, second: str) -> str:
    """The name the controller learns a free drafter's drafts under where the next drafter agreed with them."""
    return f"{first}+{second}"


def propose(drafters: Sequence[Drafter], context: Sequence[int], gamma: int | str, controller: GammaController | None,
            room: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
    """The draft to verify after ``context``, already cut to the chosen γ (empty: decode plainly): the drafters are
    asked in order, and the first that proposes something is verified, bar a free draft's second opinion (the
    module's docstring). ``controller`` None: a fixed ``gamma``."""
    if room <= 0:
        return Draft([])
    for i, drafter in enumerate(drafters):
        draft, whole = _propose_one(drafter, context, gamma, controller, room, params, rng)
        draft.source = drafter.name
        # A free draft declined, or resting on a weak match: the next drafter is asked too.
        if (controller is not None and not drafter.costs_per_token and whole.tokens and i + 1 < len(drafters)
                and (not draft.tokens or _match_length(whole.key) == WEAK_MATCH)):
            return _second_opinion(drafter.name, draft, whole, drafters[i + 1], context, controller, room, params,
                                   rng)
        if draft.tokens or draft.passes:  # a draft that spent passes is charged even when it came back empty
            return draft
    return Draft([])


def _match_length(key: DraftKey) -> int:
    """A lookup key's match length: the key itself, or the first of (match length, evidence)."""
    return key[0] if isinstance(key, tuple) else key


def _second_opinion(first: str, cut: Draft, whole: Draft, drafter: Drafter, context: Sequence[int],
                    controller: GammaController, room: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
    """The draft to verify of a free draft (``whole``, which the controller ``cut``) and ``drafter``'s."""
    # Beside a free draft that would be verified, the other is asked only if its draft could gain more; and then a
    # decline is no reason to explore it (nor to fade what was learned of it).
    if cut.tokens and controller.gain(drafter.name, 0, 1, draft_cost_sunk=False) <= controller.gain(
            first, whole.key, len(cut)):
        return cut
    draft, drafted = _propose_one(drafter, context, "auto", controller, room, params, rng, explore=not cut.tokens)
    draft.source = drafter.name
    if drafted.tokens and drafted.tokens[0] == whole.tokens[0]:
        name = agreed(first, drafter.name)
        k = controller.choose(name, whole.key, len(whole), True, whole.tokens)
        if k:
            return Draft(whole.tokens[:k], key=whole.key, source=name, passes=draft.passes)
    if not cut.tokens or (draft.tokens and controller.gain(drafter.name, draft.key, len(draft)) >=
                          controller.gain(first, whole.key, len(cut))):
        return draft
    cut.passes = draft.passes  # the other drafter's passes were spent this step
    return cut


def _propose_one(drafter: Drafter, context: Sequence[int], gamma: int | str, controller: GammaController | None,
                 room: int, params: SamplingParams, rng: np.random.Generator,
                 explore: bool = True) -> tuple[Draft, Draft]:
    """The drafter's draft cut to what is worth verifying, and the draft as it made it."""
    if drafter.costs_per_token:  # each draft token costs a forward pass: choose γ before drafting
        k = gamma if controller is None else controller.choose(drafter.name, 0, room, draft_cost_sunk=False,
                                                               explore=explore)
        draft = drafter.propose(context, min(int(k), room), params, rng)
        if controller is None or not draft.key or not draft.tokens:
            return draft, draft
        # A drafter that says how sure it is this step (the draft head's key): the draft, paid for now, is cut to
        # what that key's acceptance makes worth verifying. Only verified positions are learned from (a cut
        # draft claims no extra passes, which would count as rejected positions).
        cut = controller.choose(drafter.name, draft.key, len(draft), draft_cost_sunk=True)
        if cut == len(draft):
            return draft, draft
        return (Draft(draft.tokens[:cut], key=draft.key) if cut else Draft([])), draft
    draft = drafter.propose(context, room, params, rng)  # free to draft: choose γ by cutting it
    k = gamma if controller is None else controller.choose(drafter.name, draft.key, len(draft), True, draft.tokens)
    return draft.truncated(int(k)), draft
