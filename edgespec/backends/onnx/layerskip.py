"""Layer-skip self-drafting on an ONNX model: the target minus some layers, sharing its sessions and its KV memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ...errors import EdgespecError, InvalidParameterError


class LayerOwner(Protocol):
    """What the view needs of the model whose layers it runs (``OnnxModel``)."""

    n_layer: int
    n_ctx: int
    manifest: dict

    def forward(self, layers: Sequence[int], tokens: list[int], start: int, n_logits: int) -> np.ndarray: ...

    def ready_segments(self, layers: Sequence[int]) -> object: ...


class LayerSkipView:
    """The target minus some layers, sharing its sessions and its KV buffer (a ``SharedCache`` for the arena).

    It writes the KV of the layers it runs at the positions it decodes; the arena makes it adopt the
    target's committed entries instead of recomputing them, and the target's verify pass overwrites
    the positions the view wrote speculatively.
    """

    def __init__(self, model: LayerOwner, skip: Sequence[int]) -> None:
        self.model = model
        self.skip = check_skip(skip, model.n_layer)
        self.layers = tuple(i for i in range(model.n_layer) if i not in set(self.skip))
        self.n_ctx = model.n_ctx
        self._end = 0
        # What `edgespec calibrate-skip` measured for this very set: (top-1 agreement with the target, draft
        # pass / target pass). The γ controller starts from it instead of from an optimistic guess.
        entry = model.manifest.get("layer_skip") or {}
        self.calibrated: tuple[float, float] | None = (
            (float(entry["agreement"]), float(entry["cost_ratio"]))
            if entry.get("skip") == self.skip and "agreement" in entry and "cost_ratio" in entry else None)

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        if start != self._end:
            raise EdgespecError(f"internal: draft decode at {start}, but its cache ends at {self._end}")
        logits = self.model.forward(self.layers, tokens, start, n_logits)
        self._end = start + len(tokens)
        return logits

    def truncate(self, keep: int) -> None:
        self._end = min(self._end, keep)

    def adopt(self, end: int) -> None:
        """Take the owner's first ``end`` positions as this view's own (they are in the shared memory)."""
        self._end = end

    def prepare(self) -> None:
        """Split the owner's fused segments at the skip set if they are not yet (once, ~1.5 s)."""
        self.model.ready_segments(self.layers)

    def cache_end(self) -> int:
        return self._end


def default_skip(n_layer: int) -> list[int]:
    """Without a calibrated set: every other layer of the middle third (measured on SmolLM2 to agree on
    ~60% of greedy tokens for 6 of 30 layers; `edgespec calibrate-skip` finds a better set)."""
    lo, hi = n_layer // 3, 2 * n_layer // 3
    return list(range(lo + 1, hi, 2))


def check_skip(skip: Sequence[int], n_layer: int) -> list[int]:
    try:
        layers = sorted({int(i) for i in skip})
    except (TypeError, ValueError) as e:
        raise InvalidParameterError(f"layer_skip must be a list of layer indices, got {skip!r}") from e
    bad = [i for i in layers if not 0 <= i < n_layer]
    if bad:
        raise InvalidParameterError(f"layer_skip has layer {bad[0]}, outside 0..{n_layer - 1}")
    if len(layers) >= n_layer:
        raise InvalidParameterError(f"layer_skip skips all {n_layer} layers: the draft would be the embedding alone")
    return layers
