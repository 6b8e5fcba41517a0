"""Which draft a step verifies: the mode's drafters asked in order, each draft cut to the γ the controller chooses.

One copy of the rule for the engine (``Engine._speculate``) and for ``edgespec replay``, which plays it over recorded
outputs: a replay of another rule would predict another engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .drafters import Draft, Drafter
from .gamma import GammaController
from .sampling import SamplingParams


def propose(drafters: Sequence[Drafter], context: Sequence[int], gamma: int | str, controller: GammaController | None,
            room: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
    """The draft to verify after ``context``, already cut to the chosen γ (empty: decode plainly): the drafters are
    asked in order, and the first that proposes something is verified. ``controller`` None: a fixed ``gamma``."""
    if room <= 0:
        return Draft([])
    for drafter in drafters:
        draft = _propose_one(drafter, context, gamma, controller, room, params, rng)
        if draft.tokens or draft.passes:  # a draft that spent passes is charged even when it came back empty
            draft.source = drafter.name
            return draft
    return Draft([])


def _propose_one(drafter: Drafter, context: Sequence[int], gamma: int | str, controller: GammaController | None,
                 room: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
    if drafter.costs_per_token:  # each draft token costs a forward pass: choose γ before drafting
        k = gamma if controller is None else controller.choose(drafter.name, 0, room, draft_cost_sunk=False)
        draft = drafter.propose(context, min(int(k), room), params, rng)
        if controller is None or not draft.key or not draft.tokens:
            return draft
        # A drafter that says how sure it is this step (the draft head's key): the draft, paid for now, is cut to
        # what that key's acceptance makes worth verifying. Only verified positions are learned from (a cut
        # draft claims no extra passes, which would count as rejected positions).
        cut = controller.choose(drafter.name, draft.key, len(draft), draft_cost_sunk=True)
        if cut == len(draft):
            return draft
        return Draft(draft.tokens[:cut], key=draft.key) if cut else Draft([])
    draft = drafter.propose(context, room, params, rng)  # free to draft: choose γ by cutting it
    k = gamma if controller is None else controller.choose(drafter.name, draft.key, len(draft), True, draft.tokens)
    return draft.truncated(int(k))
