"""The backend contract: what the engine needs from a model, and the rules every backend shares.

A backend (llama.cpp in ``llamacpp/model.py``, ONNX Runtime in ``onnx/model.py``, the scripted fake in
tests/fake_backend.py) is a class implementing ``Backend`` plus a module-level ``open_model`` and ``claims``
registered in ``edgespec/backends/registry.py``. The engine and the arena import this module, never a concrete backend.
Capabilities are asked, not ``isinstance``-checked: ``self_draft()`` returns None where a backend cannot run a
subset of its layers, ``draft_head()`` where it has no trained head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..engine.arena import OwnedCache, SharedCache
from ..errors import InvalidParameterError

if TYPE_CHECKING:
    from ..drafters import Drafter

GPU_DEVICES = ("cuda", "metal")
DEVICES = ("auto", "cpu", *GPU_DEVICES)


@dataclass(frozen=True)
class ModelOptions:
    """Load options every backend accepts (``layer_skip`` only means something to one that can skip layers)."""

    n_ctx: int = 4096
    n_threads: int | None = None
    device: str = "cpu"
    exact_numerics: bool = True
    layer_skip: Sequence[int] | None = None


@runtime_checkable
class SelfDraft(SharedCache, Protocol):
    """A target run with some layers skipped, over the target's own KV memory (see ``KVArena``)."""

    # What a skip-set search measured for this very set: (top-1 agreement with the target, draft pass /
    # target pass); None when nothing was measured. The γ controller starts from it.
    calibrated: tuple[float, float] | None

    def prepare(self) -> None:
        """Make ready to draft, at the start of a request that drafts with it: one-time work belongs here, not in
        a draft pass, whose time the γ controller takes for the draft's cost."""
        ...


@runtime_checkable
class Backend(OwnedCache, Protocol):
    """One model with one KV cache: decode rows → logits, roll back, and its vocabulary.

    ``decode``, ``truncate``, ``cache_end``, ``save_state`` and ``load_state`` (from ``OwnedCache``) are called by
    ``KVArena`` only.
    """

    path: Path
    n_vocab: int
    n_threads: int
    # What the self-check (``selfcheck.check``) leaves on a model: 0 where passes run unpadded, B where every pass is
    # padded to B rows to be exact; and whether a verified tree's rows equal one-token decoding (mode tree).
    pass_rows: int
    exact_trees: bool

    @property
    def chat_template(self) -> str | None: ...

    @property
    def description(self) -> str: ...

    @property
    def exact_reuse(self) -> bool:
        """Whether a kept cache prefix plus a decoded tail gives a fresh prefill's logits bit for bit (the prompt
        cache reuses entries only then)."""
        ...

    @property
    def bos(self) -> int: ...

    @property
    def eos(self) -> int: ...

    def is_eog(self, token: int) -> bool: ...

    def max_pass_rows(self, start: int) -> int:
        """How many tokens one pass starting at position ``start`` may carry and still give each token the logits
        it gets decoded alone (llama.cpp padded to a fixed shape: see ``LlamaModel.set_pass_rows``)."""
        ...

    def token_text(self, token: int) -> bytes:
        """A token's text as the vocabulary stores it (control tokens by name): what vocabularies compare."""
        ...

    def piece(self, token: int) -> bytes:
        """A token's bytes as output text (control tokens render as nothing)."""
        ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...

    def check_same_vocab(self, other: Backend) -> None:
        """Raise ``VocabMismatchError`` unless both map every token id to the same text."""
        ...

    def self_draft(self) -> SelfDraft | None:
        """This model with some layers skipped, drafting over its own KV memory; None if it cannot skip layers."""
        ...

    def draft_head(self) -> Drafter | None:
        """The trained draft head exported for this model (``edgespec export head``), drafting from this model's own
        hidden states; None where there is none or the backend cannot hand over its hidden states."""
        ...

    def close(self) -> None: ...


def check_options(device: str, n_ctx: int, n_batch: int, n_threads: int | None) -> None:
    """The options every backend shares, checked alike."""
    if device not in DEVICES:
        raise InvalidParameterError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if n_ctx < 16:
        raise InvalidParameterError(f"n_ctx must be >= 16, got {n_ctx}")
    if n_batch < 1:
        raise InvalidParameterError(f"n_batch must be >= 1, got {n_batch}")
    if n_threads is not None and n_threads < 1:
        raise InvalidParameterError(f"n_threads must be >= 1, got {n_threads}")


def split_batches(n: int, step: int) -> list[tuple[int, int]]:
    """Cut n tokens into runs of at most ``step`` so that the LAST run holds the final ``step`` tokens: every
    row whose logits are wanted (at most ``step``, at the end) then comes out of the last forward pass."""
    tail = max(0, n - step)
    return [(s, min(s + step, tail)) for s in range(0, tail, step)] + [(tail, n)]


def padded_pass_limit(start: int, rows: int, kv_step: int, most: int | None = None) -> int:
    """How many tokens a pass padded to ``rows`` rows may carry from position ``start`` where the attended cache
    length is rounded up to a multiple of ``kv_step`` (llama.cpp's n_kv). The pass's cells end at start + rows;
    its token at start + i, decoded alone (padded alike), ends at start + i + rows. Both round to the same n_kv
    only while start + i + rows stays within the step that start + rows is in: the pass stops before the first
    token that would not.

    A token tree padded to a multiple of ``rows`` (``most`` > rows: at most that many nodes) obeys the same bound:
    n nodes take at most n + rows - 1 cells, where its deepest possible node (depth n - 1) decoded alone ends."""
    step_end = -(-(start + rows) // kv_step) * kv_step
    return max(1, min(rows if most is None else most, step_end - rows - start + 1))
