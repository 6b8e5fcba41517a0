"""Hybrid drafting: prompt lookup when the text repeats, the layer-skip self-draft otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Drafter


class HybridDrafter:
    """An ordered list of drafters; the engine asks each in turn and verifies the first non-empty draft.

    The first stage is free: the engine gives it an n-gram lookup that needs a match of two or more tokens
    (a lone repeated token is no evidence of a copied passage). With γ auto the controller also declines a
    lookup whose match length has not been paying; the next stage (the layer-skip draft, a forward pass per
    token) then gets its turn. Each stage keeps its own name, so the γ controller learns acceptance and
    cost per stage.
    """

    name = "hybrid"
    costs_per_token = False

    def __init__(self, stages: Sequence[Drafter]) -> None:
        self.stages = tuple(stages)

    def begin(self, context: Sequence[int]) -> None:
        for stage in self.stages:
            stage.begin(context)
