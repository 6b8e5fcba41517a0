"""The one vocabulary check every backend shares: speculation exchanges token ids, so they must mean the same."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import VocabMismatchError


class Vocabulary(Protocol):
    path: Path
    n_vocab: int

    def token_text(self, token: int) -> bytes: ...


def check_same_vocab(a: Vocabulary, b: Vocabulary) -> None:
    """Raise unless both models map every token id to the same text."""
    if a.n_vocab != b.n_vocab:
        raise VocabMismatchError(f"vocabulary sizes differ: {a.path.name} has {a.n_vocab} tokens, "
                                 f"{b.path.name} has {b.n_vocab}")
    for token in range(a.n_vocab):
        mine, theirs = a.token_text(token), b.token_text(token)
        if mine != theirs:
            raise VocabMismatchError(f"vocabularies differ at token {token}: {mine!r} in {a.path.name}, "
                                     f"{theirs!r} in {b.path.name}")
