"""Hybrid drafting: prompt lookup when the text repeats, the layer-skip self-draft otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Drafter


class HybridDrafter:
    """An ordered list of drafters; the engine asks each in turn and verifies the first non-empty draft.

    The engine gives it the n-gram lookup first (free) and the layer-skip draft second (a forward pass per
    token): wherever n-gram mode would draft, hybrid drafts the same; when the lookup finds nothing, or the
    γ controller declines it (its match length has not been paying), the layer-skip draft gets its turn,
    itself gated by the controller. Each stage keeps its own name, so the controller learns acceptance and
    cost per stage, and hybrid falls back to plain decoding when neither pays.
    """

    name = "hybrid"
    costs_per_token = False

    def __init__(self, stages: Sequence[Drafter]) -> None:
        self.stages = tuple(stages)

    def begin(self, context: Sequence[int]) -> None:
        for stage in self.stages:
            stage.begin(context)
