"""One KV arena for every cache taking part in a generation.

The arena owns the committed token sequence (prompt + accepted output) and knows, for each cache
(the target's, a draft model's), which tokens its KV entries hold. Speculative tokens are appended to a
cache with ``extend``; ``commit`` adds the tokens the verifier accepted and rolls every cache back to
the longest prefix that still agrees with the committed sequence, all in one call. Draft tokens the
target accepted stay in the draft's cache (same token, same position, same KV), so no cache recomputes
what is already right. It is the only code that removes cache entries.

A cache may also be a *view* of another cache's memory (the ONNX backend's layer-skip draft runs a subset
of the target's layers over the target's KV buffer). A view never holds committed entries of its own: the
positions its owner holds are its positions too (for the layers it runs, the owner wrote them), so it must
never be fed them again — recomputing them with fewer layers would overwrite the owner's exact entries
with draft values. After every owner pass and every commit a view *adopts* the owner's entries; what it
wrote past them is speculative and is overwritten by the owner's next (verify) pass.

A new sequence (``reset``) keeps, in every cache, the entries it shares with the previous one (the longest
common prefix, on tokens) and feeds only the rest: a chat's next turn re-sends the whole conversation, and
prefilling it again would cost as much as the first time. This is exact on the backends' exact numerics:
an entry's KV does not depend on the batch it was computed in, so a kept prefix plus a decoded tail gives
bit-identical logits to a fresh prefill (measured on both backends, tests/model/test_prompt_cache.py). Where that
does not hold (llama.cpp's fast numerics) the engine asks for a fresh prefill. ``snapshot``/``restore``
carry a whole arena state out and back in (the prompt cache keeps several conversations that way).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from ..errors import ContextOverflowError, EdgespecError

# Prompt tokens fed per prefill pass: a cancelled request stops within one such pass (~1 s for 256 tokens of the
# 135M model on one CPU thread), and a pass this long already runs near full prefill speed.
PREFILL_CHUNK = 256


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class Cache(Protocol):
    """What the arena needs from a model with a KV cache (``LlamaModel`` is one)."""

    n_ctx: int

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray: ...

    def truncate(self, keep: int) -> None: ...

    def cache_end(self) -> int: ...


MAX_TREE_LEAVES = 16  # root-to-leaf paths in one verified tree (a tree cache's sequences: llama.cpp, one each)


class TreeCache(Cache, Protocol):
    """A cache that can verify a token tree in one pass (each node attending to its own path only)."""

    tree_passes: bool  # whether this instance can (an ONNX export: only graphs with the tree input)

    def decode_tree(self, tokens: list[int], parents: list[int], start: int) -> np.ndarray:
        """Feed a tree whose root nodes (parent -1) follow position ``start - 1``; node i goes at position
        start + its depth - 1. Returns one row of logits per node, valid until the next decode."""

    def keep_tree_path(self, nodes: list[int]) -> None:
        """After ``decode_tree``: keep the nodes of one root path (``nodes``, root first) at positions start..,
        and drop every other node's entries."""

    def max_tree_rows(self, start: int) -> int:
        """How many nodes a tree fed at ``start`` may have and each row still be exact (``max_pass_rows``'s rule)."""


class OwnedCache(Cache, Protocol):
    """A cache with memory of its own (not a view): its entries can be copied out and back in."""

    def save_state(self) -> CacheState | None:
        """A copy of the cache's entries, or None where that is not cheap (memory on a GPU)."""

    def load_state(self, state: CacheState) -> None:
        """Replace the cache's entries with a copy ``save_state`` made."""


@dataclass(frozen=True)
class CacheState:
    """One cache's entries, as its backend copies them out: ``data`` is opaque to everyone else."""

    n_tokens: int
    nbytes: int
    data: object


@dataclass(frozen=True)
class ArenaState:
    """A snapshot of every cache an arena owns (views share their owner's): what each held, and its entries."""

    held: dict[str, tuple[int, ...]]
    caches: dict[str, CacheState]

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens whose KV the target holds."""
        return self.held["target"]

    @property
    def nbytes(self) -> int:
        return sum(state.nbytes for state in self.caches.values())


class SharedCache(Cache, Protocol):
    """A cache over another cache's memory (see the module docstring)."""

    def adopt(self, end: int) -> None:
        """Take the owner's first ``end`` positions as this cache's own entries."""


class KVArena:
    def __init__(self, caches: dict[str, Cache], views: dict[str, str] | None = None) -> None:
        """``views`` maps the name of each cache that shares memory to the name of the cache owning it."""
        if "target" not in caches:
            raise EdgespecError("internal: an arena needs a 'target' cache")
        self.views = dict(views or {})
        for view, owner in self.views.items():
            if view not in caches or owner not in caches or owner in self.views:
                raise EdgespecError(f"internal: view {view!r} of {owner!r} must name two caches, the owner no view")
        self.caches = caches
        self.tokens: list[int] = []  # committed: prompt + accepted output
        self.held: dict[str, list[int]] = {name: [] for name in caches}  # tokens whose KV each cache holds
        self._agreed: dict[str, int] = {name: 0 for name in caches}  # held[:n] is known to match self.tokens
        self._tree: tuple[str, list[int], int] | None = None  # a tree fed by extend_tree, until keep_path

    @property
    def n_ctx(self) -> int:
        return min(cache.n_ctx for cache in self.caches.values())

    def reset(self, prompt: Sequence[int], reuse: bool = True) -> int:
        """Start a new sequence; return how many of its tokens the target's cache already holds.

        Every cache keeps the entries it shares with ``prompt`` (none when ``reuse`` is False), except the
        last prompt token's: feeding it gives the logits the generation starts from.
        """
        self.tokens = list(prompt)
        for name, cache in self.caches.items():
            self._agreed[name] = 0
            if name not in self.views and cache.cache_end() != len(self.held[name]):
                # Another arena (a second engine over the same model) used this cache since: trust none of it.
                cache.truncate(0)
                self.held[name] = []
        self._trim_all(len(self.tokens) - 1 if reuse else 0)
        return len(self.held["target"])

    def snapshot(self) -> ArenaState | None:
        """The caches' entries and what they hold; None when a cache cannot copy its entries out."""
        owners = [name for name in self.caches if name not in self.views]
        states = {name: cast(OwnedCache, self.caches[name]).save_state() for name in owners}
        if any(state is None for state in states.values()):
            return None
        return ArenaState({name: tuple(self.held[name]) for name in owners}, states)  # type: ignore[arg-type]

    def restore(self, state: ArenaState) -> None:
        """Put a snapshot's entries back; the committed sequence is set by the next ``reset``."""
        for name, cache_state in state.caches.items():
            cast(OwnedCache, self.caches[name]).load_state(cache_state)
            self.held[name] = list(state.held[name])
            self._agreed[name] = 0
        self.tokens = list(max(state.held.values(), key=len))  # each cache held a prefix of one sequence
        self._trim_all()

    def extend(self, name: str, speculative: Sequence[int], n_logits: int) -> np.ndarray:
        """Feed cache ``name`` the committed tokens it lacks, then ``speculative``; return the logits of
        the last ``n_logits`` positions fed (n_logits × vocab, a view valid until the next decode)."""
        feed = self.tokens[len(self.held[name]):] + list(speculative)
        if not feed:  # callers always have a token to feed: the target's last (bonus) token is never held
            raise EdgespecError(f"internal: nothing to feed cache {name!r}")
        return self._feed(name, feed, n_logits)

    def extend_tree(self, name: str, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Feed cache ``name`` the committed tokens it lacks, then a draft tree (``Draft``'s layout: parent -1 is the
        committed sequence), in one pass where each node sees only its own path. Returns the logits after the last
        committed token (row 0) and after each node (row i + 1). The cache holds the whole tree until ``keep_path``
        names the accepted nodes; nothing else may touch it in between."""
        lacking = self.tokens[len(self.held[name]):]
        if not lacking:  # as in extend: the target's last (bonus) token is never held
            raise EdgespecError(f"internal: nothing to feed cache {name!r}")
        if name in self.views:
            raise EdgespecError(f"internal: cache {name!r} is a view; trees are verified by the target")
        held, cache = self.held[name], cast(TreeCache, self.caches[name])
        # The lacking tokens lead the tree as a chain; the draft's roots hang off its last one.
        feed = [*lacking, *tokens]
        n = len(lacking)
        parents_fed = [*range(-1, n - 1), *(n - 1 if p < 0 else p + n for p in parents)]
        if len(held) + len(feed) > cache.n_ctx:  # every node takes a cell, not only the accepted ones
            raise ContextOverflowError(
                f"the {name} context is full ({cache.n_ctx} tokens); load the model with a larger n_ctx")
        logits = cache.decode_tree(feed, parents_fed, len(held))
        self._tree = (name, feed, n)
        return logits[n - 1:]

    def keep_path(self, name: str, path: Sequence[int]) -> None:
        """After ``extend_tree``: the cache keeps the lacking committed tokens and the draft nodes ``path`` (the
        accepted ones, root first); every other node's entries are removed. ``commit`` then finds them held."""
        if self._tree is None or self._tree[0] != name:
            raise EdgespecError(f"internal: keep_path({name!r}) without a tree fed to it")
        _, feed, n = self._tree
        self._tree = None
        nodes = [*range(n), *(i + n for i in path)]
        cast(TreeCache, self.caches[name]).keep_tree_path(nodes)
        self.held[name].extend(feed[i] for i in nodes)
        self._sync_views(name)

    def catch_up(self, name: str) -> None:
        """Feed cache ``name`` the committed tokens it lacks but the last (the next ``extend`` feeds that one for
        its logits): a draft model's prefill of the prompt, done when a request starts rather than inside its
        first draft pass. A view holds what its owner holds and is never fed committed tokens."""
        feed = self.tokens[len(self.held[name]):-1]
        if feed and name not in self.views:
            self._feed(name, feed, 1)

    def prefill(self, name: str, cancel: threading.Event | None = None) -> bool:
        """Feed cache ``name`` the committed tokens it lacks, PREFILL_CHUNK per pass, while more than a chunk is
        left (the rest goes in with the pass that wants logits: ``extend``, or ``catch_up``). Between two passes
        a set ``cancel`` stops it (returning False; True once done): an abandoned long prompt holds the engine for
        one chunk at most. Chunks change no output: on exact numerics an entry's KV does not depend on the pass
        that computed it (the property prompt reuse rests on too)."""
        held = self.held[name]
        while name not in self.views and len(self.tokens) - len(held) > PREFILL_CHUNK:
            if cancel is not None and cancel.is_set():
                return False
            self._feed(name, self.tokens[len(held):len(held) + PREFILL_CHUNK], 1)
        return True

    def _feed(self, name: str, feed: list[int], n_logits: int) -> np.ndarray:
        held = self.held[name]
        cache = self.caches[name]
        if len(held) + len(feed) > cache.n_ctx:
            raise ContextOverflowError(
                f"the {name} context is full ({cache.n_ctx} tokens); load the model with a larger n_ctx")
        logits = cache.decode(feed, len(held), n_logits)
        held.extend(feed)
        self._sync_views(name)
        return logits

    def commit(self, accepted: Iterable[int]) -> None:
        """Append accepted tokens to the sequence and roll every cache back to what still agrees with it."""
        self.tokens.extend(accepted)
        self._trim_all()

    def _sync_views(self, owner: str) -> None:
        """The views of ``owner`` hold exactly what it holds: its pass overwrote whatever they wrote past it."""
        for view, of in self.views.items():
            if of == owner:
                self.held[view] = list(self.held[owner])
                self._agreed[view] = self._agreed[owner]
                self.caches[view].adopt(len(self.held[view]))  # type: ignore[attr-defined]

    def _trim_all(self, cap: int | None = None) -> None:
        """Roll each cache back to the longest prefix it shares with the sequence (and at most ``cap``)."""
        for name, cache in self.caches.items():
            if name in self.views:
                continue
            held = self.held[name]
            keep = self._agreed[name]  # only the tail fed since the last commit needs comparing
            limit = min(len(held), len(self.tokens), len(held) if cap is None else cap)
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
            self._sync_views(name)
