"""Suffix-trie drafting (after SuffixDecoding, arXiv 2411.04975): candidates scored by how often they followed.

Two tries of token windows: one over this request (prompt + output so far), one over earlier outputs of the
process (``OutputStore``: bounded in bytes, the least recently used output evicted first). For every match length
m, the trie node of the context's last m tokens has children: what followed those m tokens each time they
occurred, with counts. A candidate tree grows best-first from that node, each child's probability its parent's
times child count / parent's continued count, up to ``factor`` × m nodes (a longer match earns a longer draft) and
down to ``min_prob``; the match length and trie whose tree has the largest expected accepted length (the sum of its
probabilities) is proposed.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property

import numpy as np

from ..engine.sampling import SamplingParams
from ..errors import InvalidParameterError
from .base import Draft, best_first

_SHIFT = 20  # child key: node << _SHIFT | token (vocabularies up to ~1M tokens)


class SuffixTrie:
    """Every window of up to ``depth`` tokens of its documents, with counts; nodes in flat arrays.

    A node is a window prefix; ``count`` how many windows pass through it, ``cont`` how many of those go on to a
    child (a window ending at a document's end does not), ``owner`` the document that last added a window through
    it. Appending one token to a document extends the ≤ depth windows ending at its previous token: O(depth) per
    token, at most ``depth`` new nodes. Removing a document walks its windows back down.
    """

    def __init__(self, depth: int = 16) -> None:
        if depth < 2:
            raise InvalidParameterError(f"a suffix trie needs depth >= 2, got {depth}")
        self.depth = depth
        self._child: dict[int, int] = {}
        self._count = array("i", [0])  # node 0 is the root
        self._cont = array("i", [0])
        self._depth = array("b", [0])
        self._first = array("i", [-1])  # first child, then each child's next sibling: a node's children in order
        self._next = array("i", [-1])
        self._prev = array("i", [-1])  # doubly linked: a child leaves its parent's list in O(1)
        self._parent = array("i", [-1])
        self._token = array("i", [-1])
        self._owner = array("i", [-1])
        self._free: list[int] = []
        self._open: list[int] = []  # nodes of the windows ending at the current document's last token
        self._document = 0

    @property
    def nodes(self) -> int:
        """Nodes in use, the root excepted: what the trie's memory grows with."""
        return len(self._count) - 1 - len(self._free)

    def start_document(self, document: int = 0) -> None:
        """Later ``extend`` calls append to a new document, ``document`` its id (what ``owner`` gives)."""
        self._open = []
        self._document = document

    def owner(self, node: int) -> int:
        """The id of the document that last added a window through ``node``."""
        return self._owner[node]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the current document."""
        depth = self.depth
        for token in tokens:
            opened = [self._step(0, token)]
            for node in self._open:
                if self._depth[node] < depth:
                    opened.append(self._step(node, token))
            self._open = opened

    def remove_document(self, tokens: Sequence[int]) -> None:
        """Take back every window a document (added whole by ``start_document`` + ``extend``) put in."""
        for i in range(len(tokens)):
            node = 0
            for token in tokens[i:i + self.depth]:
                child = self._child[node << _SHIFT | token]
                self._cont[node] -= 1
                self._count[child] -= 1
                if self._count[child] == 0:
                    self._unlink(node, child, token)
                node = child

    def find(self, suffix: Sequence[int]) -> int | None:
        """The node of ``suffix`` (a window prefix), or None."""
        node = 0
        for token in suffix:
            found = self._child.get(node << _SHIFT | token)
            if found is None:
                return None
            node = found
        return node

    def children(self, node: int) -> list[tuple[int, int, float]]:
        """(token, child node, child count / node's continued count) for each child of ``node``."""
        cont = self._cont[node]
        out = []
        child = self._first[node]
        while child >= 0:
            out.append((self._token[child], child, self._count[child] / cont))
            child = self._next[child]
        return out

    def grow(self, node: int, size: int, min_prob: float) -> Draft:
        """The best-first tree of up to ``size`` continuations of ``node`` (see the module docstring)."""

        def children(at: int) -> list[tuple[int, float, int]]:
            return [(token, share, child) for token, child, share in self.children(at)] \
                if self._depth[at] < self.depth else []

        return best_first(node, size, min_prob, children)

    # -- nodes ----------------------------------------------------------------------------------------
    def _step(self, node: int, token: int) -> int:
        key = node << _SHIFT | token
        child = self._child.get(key)
        if child is None:
            child = self._new(node, token)
            self._child[key] = child
        self._count[child] += 1
        self._cont[node] += 1
        self._owner[child] = self._document
        return child

    def _new(self, parent: int, token: int) -> int:
        values = (0, 0, self._depth[parent] + 1, -1, self._first[parent], -1, parent, token, -1)
        arrays = (self._count, self._cont, self._depth, self._first, self._next, self._prev, self._parent, self._token,
                  self._owner)
        if self._free:
            node = self._free.pop()
            for a, v in zip(arrays, values, strict=True):
                a[node] = v
        else:
            node = len(self._count)
            for a, v in zip(arrays, values, strict=True):
                a.append(v)
        if self._first[parent] >= 0:
            self._prev[self._first[parent]] = node
        self._first[parent] = node
        return node

    def _unlink(self, parent: int, child: int, token: int) -> None:
        del self._child[parent << _SHIFT | token]
        before, after = self._prev[child], self._next[child]
        if before >= 0:
            self._next[before] = after
        else:
            self._first[parent] = after
        if after >= 0:
            self._prev[after] = before
        self._free.append(child)


# What a stored output costs at most, by construction (tests/unit/test_tree_drafting.py traces a long session against
# it). A trie node: 33 bytes of array columns (plus their over-allocation and the copy while one grows), its dict
# entry's key and value ints (64 bytes), and the dict's table: a dict holding n entries grows to ≤ 6n slots of 20
# bytes (index and entry), never shrinks on deletion, and holds its old and new tables while it grows: ≤ 240 bytes
# an entry at that moment. A kept token: 4 bytes in an array. An output: its array, its entry in the LRU order.
NODE_BYTES = 350
TOKEN_BYTES = 5
OUTPUT_BYTES = 256


class OutputStore:
    """Earlier outputs in one suffix trie, within ``max_bytes``: the least recently used output is evicted first.

    An output is used when it is added and when the suffix drafter proposes from a match it holds (``used``: the
    latest output that added the matched tokens and the proposed token after them is credited). The bound holds at
    every token: before a token is added, least recently used outputs go until its ≤ ``depth`` new nodes fit; an
    output that alone outgrows the bound keeps the prefix that fits. The trie is built on first use.
    """

    def __init__(self, max_bytes: int = 64 << 20, depth: int = 16) -> None:
        if max_bytes < NODE_BYTES * depth + OUTPUT_BYTES:
            raise InvalidParameterError(f"max_bytes must be at least {NODE_BYTES * depth + OUTPUT_BYTES} (one token "
                                        f"of output at depth {depth}), got {max_bytes}")
        self.max_bytes, self.depth = max_bytes, depth
        self._outputs: OrderedDict[int, array[int]] = OrderedDict()  # least recently used first
        self._tokens = 0
        self._serial = 0

    @cached_property
    def trie(self) -> SuffixTrie:
        return SuffixTrie(self.depth)

    def __len__(self) -> int:
        return len(self._outputs)

    @property
    def nbytes(self) -> int:
        """What the kept outputs take at most (module constants): never above ``max_bytes``."""
        return self.trie.nodes * NODE_BYTES + self._tokens * TOKEN_BYTES + len(self._outputs) * OUTPUT_BYTES

    def add(self, tokens: Sequence[int]) -> None:
        if len(tokens) < 2:
            return
        self._serial += 1
        kept: array[int] = array("i")
        self._outputs[self._serial] = kept
        self.trie.start_document(self._serial)
        for token in tokens:
            while not self._room_for_a_token() and len(self._outputs) > 1:
                self._evict()
            if not self._room_for_a_token():
                break  # this output alone fills the store: its prefix is kept
            self.trie.extend((token,))
            kept.append(token)
            self._tokens += 1

    def used(self, tokens: Sequence[int]) -> None:
        """A draft was proposed from ``tokens`` (a match and what followed it): the latest output that added them
        becomes the most recently used. (An older output holding them too is not credited.)"""
        node = self.trie.find(tokens)
        if node is not None and (output := self.trie.owner(node)) in self._outputs:
            self._outputs.move_to_end(output)

    def _room_for_a_token(self) -> bool:
        """Whether one more token (≤ ``depth`` new nodes) keeps the store within its bound."""
        return self.nbytes + NODE_BYTES * self.depth + TOKEN_BYTES <= self.max_bytes

    def _evict(self) -> None:
        _, oldest = self._outputs.popitem(last=False)
        self.trie.remove_document(oldest)
        self._tokens -= len(oldest)


class SuffixDrafter:
    """Proposes the best suffix-trie candidate tree over this request and earlier outputs (module docstring).

    ``store``: the earlier outputs, shared by every drafter of the process that is given the same one (the
    engine's); each request's output joins it when the next request begins.
    """

    name = "suffix"
    costs_per_token = False

    def __init__(self, store: OutputStore | None = None, depth: int = 16, factor: float = 2.0,
                 min_prob: float = 0.1, max_match: int = 12) -> None:
        if factor <= 0 or not 0 <= min_prob <= 1 or not 1 <= max_match < depth:
            raise InvalidParameterError("need factor > 0, 0 <= min_prob <= 1 and 1 <= max_match < depth")
        self.store = store if store is not None else OutputStore(depth=depth)
        self.depth, self.factor, self.min_prob, self.max_match = depth, factor, min_prob, max_match
        self._request = SuffixTrie(depth)
        self._seen: list[int] = []
        self._prompt_length = 0

    def begin(self, context: Sequence[int]) -> None:
        """A new request: the last one's output joins the earlier outputs; this one's trie starts from its prompt."""
        self.store.add(self._seen[self._prompt_length:])
        self._request = SuffixTrie(self.depth)
        self._seen = []
        self._prompt_length = len(context)
        self.update(context)

    def update(self, context: Sequence[int]) -> None:
        """This request's trie catches up with ``context`` (the committed sequence): done by ``propose`` too."""
        new = context[len(self._seen):]
        self._request.extend(new)
        self._seen.extend(new)

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self.update(context)
        best = Draft([])
        best_score = 0.0
        best_trie, best_match = self._request, 0
        if max_tokens <= 0:
            return best
        for trie in (self._request, self.store.trie):
            for m in range(1, min(self.max_match, len(context)) + 1):
                node = trie.find(context[-m:])
                if node is None:
                    break  # a longer suffix cannot be there if this one is not (every window's suffixes are)
                size = min(max_tokens, int(self.factor * m))
                # A tree's score is at most its size, and at most one per level below the node (the probabilities
                # of a level's nodes add up to at most 1): a tree that cannot beat the best is not grown.
                if min(size, trie.depth - m) <= best_score:
                    continue
                draft = trie.grow(node, size, self.min_prob)
                score = sum(draft.scores or ())
                if score > best_score:
                    best, best_score, best_trie, best_match = draft, score, trie, m
        best.key = best_match  # the matched length
        if best_trie is not self._request:
            self.store.used([*context[-best_match:], best.tokens[0]])
        return best
