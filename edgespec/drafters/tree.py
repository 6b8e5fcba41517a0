"""Putting candidate drafts together into the one tree a verify pass checks, and choosing its size.

``merge`` overlays drafts into one trie (equal paths become one node, which keeps the best score and the name of the
drafter that gave it). ``shape`` keeps the nodes worth their rows: the forced ones (the lookup chain the γ
controller already cut), then the further nodes, taken best-first from the frontier, in the number that maximises
what the pass is worth: the expected tokens (each node's score is its estimated probability of being accepted,
i.e. the tokens it adds) less the pass's cost at the rate being achieved, Σ score − λ · verify(rows) — the γ
controller's objective, over trees. ``subtree`` lays the result out most likely path first: a backend whose rows
depend on their KV cells (llama.cpp) gets its likeliest path where sequential decoding would put it.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..controller.gamma import GammaController
from ..engine.arena import MAX_TREE_LEAVES, common_prefix
from ..engine.sampling import SamplingParams
from .base import ROOT, Draft
from .ngram import NgramDrafter
from .recycled import RecycledDrafter
from .suffix import SuffixDrafter

_PRIOR = 1.0  # a branch drafter's estimates are taken at face value until verification has weighed a few (one node)
_DECAY = 0.99  # per verify step
# Every this many steps one branch drafter that does not pay for its own time is consulted anyway, the drafters in
# turn, so that what each would add keeps being measured (the γ controller's exploration, for drafting time). One at a
# time, because a node two drafters offer is credited to one: explored together, the suffix trie took the credit for
# branches the recycled table offered too, and the table never won its way back (docs/tree-drafting.md).
_EXPLORE_EVERY = 8


Origin = tuple[str, float]  # the drafter that scored a node best, and its own estimate given the node's parent


def merge(drafts: Sequence[tuple[str, Draft, Sequence[float]]]) -> tuple[Draft, list[Origin]]:
    """One tree holding every (name, draft, estimate per node)'s paths, and per node the origin of its best score.
    A draft without scores counts each node as certain (1.0)."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    origins: list[Origin] = []
    index: dict[tuple[int, int], int] = {}
    for name, draft, estimates in drafts:
        mapped: list[int] = []
        own = draft.scores or [1.0] * len(draft)
        for token, parent, score, estimate in zip(draft.tokens, draft.parent_list(), own, estimates, strict=True):
            at = ROOT if parent == ROOT else mapped[parent]
            node = index.get((at, token))
            if node is None:
                node = index[(at, token)] = len(tokens)
                tokens.append(token)
                parents.append(at)
                scores.append(score)
                origins.append((name, estimate))
            elif score > scores[node]:
                scores[node], origins[node] = score, (name, estimate)
            mapped.append(node)
    return Draft(tokens, parents=parents, scores=scores), origins


def shape(tree: Draft, forced: int, budget: int, max_leaves: int,
          pass_cost: Callable[[int], float] | None) -> list[int]:
    """The nodes to verify (indices into ``tree``, parents first): its first ``forced`` nodes, then a best-first
    prefix of the others, up to ``budget`` nodes and ``max_leaves`` root-to-leaf paths: the one maximising
    Σ score − ``pass_cost(rows)``, the cost in tokens of a verify pass of that many rows (λ × its seconds), or all
    of them without a cost. Every prefix is weighed, not only while each node pays for its own row: on a CPU a first
    draft row can cost far more than the next few (the replay's avx512-onnx-int8 curve, a calibration of an earlier
    build: +18% a pass, then +1%, +5%), so nodes that together pay for the pass can each look too dear alone."""
    scores = tree.scores or [1.0] * len(tree)
    parents = tree.parent_list()
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    chosen = list(range(min(forced, budget)))
    taken = set(chosen)
    leaves = sum(1 for i in chosen if not any(c in taken for c in children.get(i, ())))
    heap = [(-scores[c], c) for p in [ROOT, *chosen] for c in children.get(p, ()) if c not in taken]
    heapq.heapify(heap)
    while heap and len(chosen) < budget:
        _, node = heapq.heappop(heap)
        new_leaf = parents[node] == ROOT or any(c in taken for c in children.get(parents[node], ()))
        if new_leaf and leaves >= max_leaves:
            continue
        leaves += new_leaf
        chosen.append(node)
        taken.add(node)
        for c in children.get(node, ()):
            heapq.heappush(heap, (-scores[c], c))
    if pass_cost is None:
        return chosen
    first = min(forced, budget)
    # rows: the draft nodes plus the committed token fed with them
    worth = np.cumsum([0.0, *(scores[i] for i in chosen)]) - [pass_cost(n + 1) for n in range(len(chosen) + 1)]
    return chosen[:first + int(np.argmax(worth[first:]))]


def subtree(tree: Draft, nodes: Sequence[int]) -> tuple[Draft, list[int]]:
    """The tree of ``nodes`` (each one's parent among them or the root), laid out depth first, the child with the
    best score first: the likeliest path is nodes 0, 1, 2, ... Also each new node's index in ``tree``."""
    keep = set(nodes)
    scores = tree.scores or [1.0] * len(tree)
    parents = tree.parent_list()
    children: dict[int, list[int]] = {}
    for i in sorted(keep, key=lambda i: -scores[i]):
        children.setdefault(parents[i], []).append(i)
    order: list[int] = []
    stack = list(reversed(children.get(ROOT, [])))
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children.get(node, [])))
    position = {node: i for i, node in enumerate(order)}
    return Draft([tree.tokens[i] for i in order], key=tree.key, source=tree.source,
                 parents=[ROOT if parents[i] == ROOT else position[parents[i]] for i in order],
                 scores=[scores[i] for i in order]), order


class TreeDrafter:
    """Mode ``tree``: n-gram lookup's chain as the spine, cut by the γ controller exactly as in mode ``ngram``;
    the suffix tries' and the recycled table's candidates as branches (GOOSE's asymmetric shape), each kept while
    its score pays for its row (``shape``). A drafter's scores are its own estimates, so each is calibrated by what
    verification showed: its nodes' estimated probabilities given their parent, against how many were accepted."""

    name = "tree"
    costs_per_token = False

    def __init__(self, lookup: NgramDrafter, suffix: SuffixDrafter, recycled: RecycledDrafter,
                 clock: Callable[[], float] | None = None) -> None:
        self.lookup, self.suffix, self.recycled = lookup, suffix, recycled
        # Per branch drafter: decayed (accepted, estimated) over the nodes verification tested.
        self._calibration = {suffix.name: [0.0, 0.0], recycled.name: [0.0, 0.0]}
        # Per branch drafter, what consulting it is worth a step (``Worth``), and whether this step consulted it.
        self._worth = {suffix.name: Worth(), recycled.name: Worth()}
        self._consulted: set[str] = set()
        self._spine: list[int] = []
        self._steps = 0
        self._clock = clock  # what drafting time is read from; None: time.perf_counter (looked up at each call)

    def begin(self, context: Sequence[int]) -> None:
        self.lookup.begin(context)
        self.suffix.begin(context)

    def propose(self, context: Sequence[int], max_tokens: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """The Drafter interface: the tree with no cost curve, up to ``max_tokens`` nodes."""
        return self.propose_tree(context, max_tokens, None, MAX_TREE_LEAVES, params, rng)[0]

    def propose_tree(self, context: Sequence[int], budget: int, controller: GammaController | None,
                     max_leaves: int, params: SamplingParams, rng: np.random.Generator) -> tuple[Draft, list[Origin]]:
        """The tree to verify (laid out likeliest path first) and each node's origin. ``max_leaves`` 1: a chain.
        Each branch drafter is consulted while it pays for its own time (``Worth``), and in its turn of the
        exploration steps (every ``_EXPLORE_EVERY``)."""
        self._consulted, self._spine = set(), []
        if budget <= 0:
            return Draft([]), []
        spine = self.lookup.propose(context, budget, params, rng)
        pass_cost: Callable[[int], float] | None = None
        if controller is None:
            k, spine_rates = len(spine), np.ones(len(spine))
        else:
            k = controller.choose(self.lookup.name, spine.key, len(spine), True, spine.tokens)
            spine_rates = controller.acceptance(self.lookup.name, spine.key, k)
            rate, curve = controller.rate(), controller.curve

            def pass_cost(rows: int) -> float:  # a verify pass of ``rows`` rows, in tokens at the rate achieved
                return rate * curve.seconds(rows)
        drafts = [(self.lookup.name, Draft(spine.tokens[:k], scores=list(np.cumprod(spine_rates))),
                   list(spine_rates))]
        self._spine = spine.tokens[:k]
        self._steps += 1
        rate = None if controller is None else controller.rate()
        explored = (list(self._worth)[self._steps // _EXPLORE_EVERY % len(self._worth)]
                    if self._steps % _EXPLORE_EVERY == 0 else None)
        self._consulted = {name for name, worth in self._worth.items()
                           if rate is None or name == explored or worth.pays(rate)}
        # This request's suffix trie follows every step, as the recycled table does (``observe``): an exploration
        # step would otherwise pay the catch-up of every step it skipped, and never look worth its time.
        self.suffix.update(context)
        for drafter in (self.suffix, self.recycled):
            if drafter.name in self._consulted:
                start = self._now()
                proposed = drafter.propose(context, budget, params, rng)
                self._worth[drafter.name].spent(self._now() - start)
                drafts.append((drafter.name, *self._calibrated(drafter.name, proposed)))
        merged, origins = merge(drafts)
        tree, order = subtree(merged, shape(merged, k, budget, max_leaves, pass_cost))
        tree.key = spine.key
        return tree, [origins[i] for i in order]

    def _calibrated(self, name: str, draft: Draft) -> tuple[Draft, list[float]]:
        """The draft with scores scaled by what its drafter's estimates turned out to be worth, node by node given
        the parent; and its own estimates given the parent (what ``learn`` weighs the outcome against)."""
        got, estimated = self._calibration[name]
        factor = (got + _PRIOR) / (estimated + _PRIOR)
        raw = draft.scores or [1.0] * len(draft)
        parents = draft.parent_list()
        given_parent = [s / raw[p] if p != ROOT and raw[p] > 0 else s for s, p in zip(raw, parents, strict=True)]
        scores: list[float] = []
        for p, c in zip(parents, given_parent, strict=True):
            scores.append((1.0 if p == ROOT else scores[p]) * min(1.0, factor * c))
        return Draft(draft.tokens, parents=draft.parents, scores=scores), given_parent

    def learn(self, tree: Draft, origins: Sequence[Origin], path: Sequence[int]) -> None:
        """After verification: every branch node whose parent was accepted was tested; was it accepted too? And the
        tokens accepted past lookup's spine go to the branch drafter whose node they leave it at."""
        accepted = [tree.tokens[i] for i in path]
        on_spine = common_prefix(accepted, self._spine)
        for name in self._consulted:
            self._worth[name].gained(len(path) - on_spine if on_spine < len(path) and
                                     origins[path[on_spine]][0] == name else 0)
        on_path = set(path)
        for stats in self._calibration.values():
            stats[0] *= _DECAY
            stats[1] *= _DECAY
        for node, (parent, (name, estimate)) in enumerate(zip(tree.parent_list(), origins, strict=True)):
            if name in self._calibration and (parent == ROOT or parent in on_path):
                self._calibration[name][0] += node in on_path
                self._calibration[name][1] += estimate

    def observe(self, tokens: Sequence[int], logits: np.ndarray, rows: Sequence[int]) -> None:
        """The target's rows after ``tokens`` (``rows`` of a verify pass's ``logits``): the recycled table learns from
        them on every step, consulted or not, so that an exploration step judges it as it would be (an empty or
        stale table would never win its way back)."""
        self.recycled.observe(tokens, logits, rows)

    def _now(self) -> float:
        return (self._clock or time.perf_counter)()


class Worth:
    """What consulting a branch drafter is worth a step, against what it costs: decayed means, per step that
    consulted it, of the tokens accepted past the spine at its nodes and of the seconds its proposal took. It pays
    while those tokens are worth more than its seconds at the rate the engine achieves (λ, the γ controller's): the
    controller's objective, applied to drafting time."""

    def __init__(self) -> None:
        self.tokens = _PRIOR  # consulted until its own steps have shown what it adds
        self.seconds = 0.0

    def spent(self, seconds: float) -> None:
        """This step's proposal took ``seconds``."""
        self.tokens *= _DECAY
        self.seconds = self.seconds * _DECAY + seconds

    def gained(self, tokens: int) -> None:
        self.tokens += tokens

    def pays(self, rate: float) -> bool:
        return self.tokens >= rate * self.seconds
