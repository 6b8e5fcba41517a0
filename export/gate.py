"""The quality gate every re-quantized export passes: the quality bar (``edgespec.catalog.models``: top-1 agreement
with its source ≥ 0.99 and mean KL(source ‖ export) ≤ 0.01) on the fixed prompts, or the export is refused (``--force``
keeps it anyway).
The top-1 agreement it is given counts picks within the source's own near-ties as agreeing
(``quality.source_ties``: a flip the source's own two numerics make is rounding, not quality).

Measured on SmolLM2-135M: Q4_0 re-quantized from the shipped Q4_1 agrees on 0.844 of top-1 tokens and writes
nonsense on the demo prompt, while Q8_0 and the carried Q4_1 write correct text — a model that fails the gate
is not a faithful copy of its source.
"""

from __future__ import annotations

from edgespec.catalog.models import MAX_KL, MIN_TOP1, below_quality_bar
from edgespec.errors import EdgespecError


class QualityGateError(EdgespecError):
    """An export agrees too little with its source."""


def check(what: str, top1: float, kl: float, force: bool) -> str:
    """The gate's line for the user; raises ``QualityGateError`` on failing numbers unless ``force``."""
    failed = below_quality_bar(top1, kl)
    if failed is None:
        return f"quality gate passed (top-1 ≥ {MIN_TOP1}, KL ≤ {MAX_KL})"
    if not force:
        raise QualityGateError(f"{what} is refused by the quality gate: {failed} against its source. Nothing "
                               f"was kept; choose a finer quantization, or pass --force to keep it anyway")
    return f"quality gate FAILED ({failed}), kept because of --force"
