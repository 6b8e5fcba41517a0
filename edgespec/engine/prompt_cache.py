"""Saved arena states of recent conversations, so that several chats (and a system prompt they share) can
alternate on one engine without each request re-reading its whole conversation.

The arena itself keeps the one sequence it last ran and reuses what a new prompt shares with it. Before a
request makes it drop entries, the engine saves the arena's state here; a later request restores the state
sharing the longest prefix with its prompt when that beats what the arena holds. States are kept least
recently used first out, within a byte budget (``--cache-mb``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidParameterError
from .arena import ArenaState, common_prefix

DEFAULT_CACHE_MB = 256  # SmolLM2-135M's F32 KV: 45 KB a token, so ~5800 tokens of saved conversations


class PromptCache:
    def __init__(self, max_mb: float = DEFAULT_CACHE_MB) -> None:
        self.max_bytes = 0
        self._states: list[ArenaState] = []  # least recently used first
        self.resize(max_mb)

    def resize(self, max_mb: float) -> None:
        """Set the budget (0 disables saving), evicting what no longer fits."""
        if isinstance(max_mb, bool) or not isinstance(max_mb, int | float) or not max_mb >= 0:
            raise InvalidParameterError(f"cache_mb must be a number >= 0, got {max_mb!r}")
        self.max_bytes = int(max_mb * (1 << 20))
        self._evict()

    @property
    def nbytes(self) -> int:
        return sum(state.nbytes for state in self._states)

    def __len__(self) -> int:
        return len(self._states)

    def best(self, prompt: Sequence[int], longer_than: int = 0) -> tuple[ArenaState | None, int]:
        """The saved state sharing the longest prefix with ``prompt`` if that is more than ``longer_than``
        tokens (it becomes the most recently used), and how long that prefix is."""
        best, shared = None, longer_than
        for state in self._states:
            n = common_prefix(state.tokens, prompt)
            if n > shared:
                best, shared = state, n
        if best is None:
            return None, 0
        self._states.remove(best)
        self._states.append(best)
        return best, shared

    def put(self, state: ArenaState) -> None:
        """Save a state; saved states it extends (the same conversation, earlier) are dropped."""
        if state.nbytes > self.max_bytes or not state.tokens:
            return
        self._states = [s for s in self._states if common_prefix(s.tokens, state.tokens) < len(s.tokens)]
        self._states.append(state)
        self._evict()

    def _evict(self) -> None:
        while self._states and self.nbytes > self.max_bytes:
            self._states.pop(0)
