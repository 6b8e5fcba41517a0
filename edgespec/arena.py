"""One KV arena for every cache taking part in a generation.

The arena owns the committed token sequence (prompt + accepted output) and knows, for each cache
(the target's, a draft model's), which tokens its KV entries hold. Speculative tokens are appended to a
cache with ``extend``; ``commit`` adds the tokens the verifier accepted and rolls every cache back to
the longest prefix that still agrees with the committed sequence, all in one call. Draft tokens the
target accepted stay in the draft's cache (same token, same position, same KV), so no cache recomputes
what is already right. It is the only code that removes cache entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from .errors import ContextOverflowError, EdgespecError


class Cache(Protocol):
    """What the arena needs from a model with a KV cache (``LlamaModel`` is one)."""

    n_ctx: int

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray: ...

    def truncate(self, keep: int) -> None: ...

    def cache_end(self) -> int: ...


class KVArena:
    def __init__(self, caches: dict[str, Cache]) -> None:
        if "target" not in caches:
            raise EdgespecError("internal: an arena needs a 'target' cache")
        self.caches = caches
        self.tokens: list[int] = []  # committed: prompt + accepted output
        self.held: dict[str, list[int]] = {name: [] for name in caches}  # tokens whose KV each cache holds
        self._agreed: dict[str, int] = {name: 0 for name in caches}  # held[:n] is known to match self.tokens

    @property
    def n_ctx(self) -> int:
        return min(cache.n_ctx for cache in self.caches.values())

    def reset(self, prompt: Sequence[int]) -> None:
        """Start a new sequence: every cache is emptied.

        Entries shared with the previous sequence are deliberately not reused: llama.cpp computes a
        long prompt batch with other kernels than a short tail, so a reused prefix plus a recomputed tail
        would not be bit-identical to a fresh prefill, and greedy output could drift from target-only.
        """
        self.tokens = list(prompt)
        for name, cache in self.caches.items():
            cache.truncate(0)
            self.held[name] = []
            self._agreed[name] = 0

    def extend(self, name: str, speculative: Sequence[int], n_logits: int) -> np.ndarray:
        """Feed cache ``name`` the committed tokens it lacks, then ``speculative``; return the logits of
        the last ``n_logits`` positions fed (n_logits × vocab, a view valid until the next decode)."""
        held = self.held[name]
        cache = self.caches[name]
        feed = self.tokens[len(held):] + list(speculative)
        if not feed:  # callers always have a token to feed: the target's last (bonus) token is never held
            raise EdgespecError(f"internal: nothing to feed cache {name!r}")
        if len(held) + len(feed) > cache.n_ctx:
            raise ContextOverflowError(
                f"the {name} context is full ({cache.n_ctx} tokens); load the model with a larger n_ctx")
        logits = cache.decode(feed, len(held), n_logits)
        held.extend(feed)
        return logits

    def commit(self, accepted: Iterable[int]) -> None:
        """Append accepted tokens to the sequence and roll every cache back to what still agrees with it."""
        self.tokens.extend(accepted)
        self._trim_all()

    def _trim_all(self) -> None:
        for name, cache in self.caches.items():
            held = self.held[name]
            keep = self._agreed[name]  # only the tail fed since the last commit needs comparing
            limit = min(len(held), len(self.tokens))
            while keep < limit and held[keep] == self.tokens[keep]:
                keep += 1
            if keep < len(held):
                cache.truncate(keep)
                del held[keep:]
            self._agreed[name] = keep
            # The invariant the whole engine rests on: each cache holds exactly a prefix of the sequence.
            end = cache.cache_end()
            if end != keep:
                raise EdgespecError(f"internal: cache {name!r} ends at {end}, the arena expected {keep}")
