"""The one interface every drafter implements (n-gram lookup, a draft model, layer-skip, suffix trees, recycled
logits): ``propose`` returns a ``Draft``, a token tree whose most common shape is a chain."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from ..engine.sampling import SamplingParams
from ..errors import EdgespecError

ROOT = -1  # the parent index of a node that follows the last committed token


DraftKey = int | tuple[int, ...]


@dataclass
class Draft:
    """Proposed tokens for the positions after the committed sequence: a chain, or a tree of candidates.

    A tree is ``tokens`` plus ``parents``: node i follows node ``parents[i]`` (``ROOT``: the last committed token),
    and every parent comes before its children, so any prefix of the nodes is a tree too. A chain is the tree whose
    node i follows node i - 1 (``parents`` None). Several children of one node are alternative guesses for the same
    position; the target accepts the root-to-node path it would have generated itself.
    """

    tokens: list[int]
    # One q-distribution per token when the drafter sampled them; None when it proposes deterministically
    # (lookup, or a greedy draft model): q is then one-hot on the token. Chains only: tree nodes are never sampled.
    probs: np.ndarray | None = None
    # The context the proposal came from (n-gram: the matched length and what the text said of the match). Acceptance
    # is tracked per key, so the γ controller learns e.g. that 1-token matches rarely pay while 4-token matches do.
    # A tuple is read coarse to fine: until a key's own drafts have been judged, the controller leans on its
    # prefixes' statistics (a new (3, AGREED) on what (3,) taught), not on the drafter's pooled ones.
    key: DraftKey = 0
    # Forward passes the drafter spent (a model drafter that stopped early on low confidence spent one more
    # than it proposed); None: one per token. The γ controller charges them all.
    passes: int | None = None
    # Which drafter proposed it (hybrid mode asks two in turn); set by the engine.
    source: str = ""
    # Per node, the index of the node it follows (ROOT: the committed sequence); None: a chain.
    parents: list[int] | None = None
    # Per node, the drafter's estimate of the probability that the target accepts it (its whole path); None: none.
    scores: list[float] | None = None

    def __post_init__(self) -> None:
        if self.parents is not None:
            check_tree(self.parents, len(self.tokens))
        if self.scores is not None and len(self.scores) != len(self.tokens):
            raise EdgespecError(f"internal: {len(self.scores)} scores for {len(self.tokens)} draft tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents is None or all(p == i - 1 for i, p in enumerate(self.parents))

    def parent_list(self) -> list[int]:
        """Every node's parent, a chain's included."""
        return list(range(-1, len(self.tokens) - 1)) if self.parents is None else list(self.parents)

    def truncated(self, k: int) -> Draft:
        """The first ``k`` nodes (a chain's first k tokens): still a tree, since parents come first."""
        if k >= len(self.tokens):
            return self
        return Draft(self.tokens[:k], None if self.probs is None else self.probs[:k], self.key, self.passes,
                     self.source, None if self.parents is None else self.parents[:k],
                     None if self.scores is None else self.scores[:k])


def check_tree(parents: Sequence[int], n: int) -> None:
    """Raise unless ``parents`` gives each of ``n`` nodes a parent that comes before it (or ROOT)."""
    if len(parents) != n:
        raise EdgespecError(f"internal: {len(parents)} parents for {n} draft tokens")
    for i, p in enumerate(parents):
        if not ROOT <= p < i:
            raise EdgespecError(f"internal: draft node {i} has parent {p}: a parent must come before its child")


State = TypeVar("State")


def best_first(root: State, size: int, min_score: float,
               children: Callable[[State], Iterable[tuple[int, float, State]]]) -> Draft:
    """The tree of the ``size`` likeliest nodes grown from ``root``: ``children(state)`` gives (token, probability
    given the parent, the child's state); a node's score is the product of the probabilities down its path, and
    nodes scoring under ``min_score`` are left out. Parents come before children, the likeliest first."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    order = itertools.count()  # ties: the node offered first
    heap: list[tuple[float, int, int, int, State]] = []

    def expand(state: State, parent: int, score: float) -> None:
        for token, p, child in children(state):
            if score * p >= min_score:
                heapq.heappush(heap, (-score * p, next(order), token, parent, child))

    expand(root, ROOT, 1.0)
    while heap and len(tokens) < size:
        neg, _, token, parent, child = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        scores.append(-neg)
        expand(child, len(tokens) - 1, -neg)
    return Draft(tokens, parents=parents, scores=scores)


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 for a child of the root."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p == ROOT else out[p] + 1)
    return out


class Drafter(Protocol):
    name: str
    # True when proposing γ tokens costs γ forward passes (a model), so γ must be chosen before drafting;
    # False when the whole proposal is free (lookup) and γ is chosen by truncating it afterwards.
    costs_per_token: bool

    def begin(self, context: Sequence[int]) -> None:
        """A new sequence starts with ``context`` (the prompt)."""

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Propose up to ``max_tokens`` tokens (tree nodes) to follow ``context`` (the committed sequence)."""
        ...
