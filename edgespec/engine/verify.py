"""The acceptance rules that make speculative decoding lossless.

Both functions take the target's logits for the k+1 positions of one verify pass (row i is the target's
distribution for the token after draft token i-1; row 0 follows the last committed token) and return
``(n_accepted, next_token)``: the first ``n_accepted`` draft tokens are kept and ``next_token`` comes from
the target, so every verify pass yields at least one token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .sampling import SamplingParams, sample


def positions_tested(drafted: int, accepted: int) -> int:
    """How many draft positions a verify pass tested: each up to and including the first rejected one (a
    position after a rejection was never compared). Positions below ``accepted`` passed."""
    return min(drafted, accepted + 1)


def verify_greedy(draft: Sequence[int], target_logits: np.ndarray) -> tuple[int, int]:
    """Keep the longest prefix of the draft that equals the target's argmax, then the target's own argmax."""
    best = target_logits.argmax(axis=1)
    n = 0
    while n < len(draft) and best[n] == draft[n]:
        n += 1
    return n, int(best[n])


def accepted_tree_path(tokens: Sequence[int], parents: Sequence[int],
                       target_token: Callable[[int], int | None]) -> list[int]:
    """The longest root-to-node path of a draft tree (``Draft``'s layout: node i follows ``parents[i]``, -1 the
    committed sequence) whose every token is ``target_token`` of its parent: the target's token after that node
    (-1: after the committed sequence; None: not known). Among paths as long, the one through earlier nodes."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    best: list[int] = []
    stack: list[tuple[int, list[int]]] = [(-1, [])]
    while stack:
        node, path = stack.pop()
        if len(path) > len(best):
            best = path
        want = target_token(node)
        stack.extend((c, [*path, c]) for c in reversed(children.get(node, [])) if tokens[c] == want)
    return best


def verify_tree_greedy(tokens: Sequence[int], parents: Sequence[int],
                       target_logits: np.ndarray) -> tuple[list[int], int]:
    """Greedy verification of a draft tree. ``target_logits`` row 0 follows the last committed token, row i + 1
    follows node i, each computed over the node's own path only. Returns the accepted nodes (``accepted_tree_path``
    with the target's argmax) and the target's own next token after them: exactly what target-only greedy decoding
    would produce, one token at a time. A chain (parents i - 1) gives ``verify_greedy``'s answer."""
    best = target_logits.argmax(axis=1)
    path = accepted_tree_path(tokens, parents, lambda node: int(best[node + 1]))
    return path, int(best[path[-1] + 1 if path else 0])


def verify_tree_sampled(tokens: Sequence[int], parents: Sequence[int], target_logits: np.ndarray,
                        params: SamplingParams, rng: np.random.Generator) -> tuple[list[int], int]:
    """Speculative sampling over a tree of deterministic candidates (every drafter that builds trees proposes without
    sampling: q is one-hot on each node). From the committed text down: draw the target's token from the row after
    the current node; a child holding that token is accepted and the walk goes on from it, else the draw is the
    target's own next token. That is SpecInfer's multi-candidate rule with one-hot q — trying the children one by
    one, each accepted with the probability the residual gives it, the rejected ones' mass removed — in one draw:
    child c is taken with probability p(c), nothing with 1 − Σ p(children), and the replacement then follows p with
    the children removed. Every output token is a draw from the target's distribution given the tokens before it,
    so the output follows the target's distribution as long as each row is what a one-token pass gives."""
    children: dict[int, dict[int, int]] = {}
    for i, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
        children.setdefault(parent, {}).setdefault(token, i)  # equal siblings share a path: the first stands for both
    path: list[int] = []
    node = -1
    while True:
        token = sample(params.probs(target_logits[node + 1])[0], rng)
        child = children.get(node, {}).get(token)
        if child is None:
            return path, token
        path.append(child)
        node = child


def verify_sampled(
    draft: Sequence[int],
    draft_probs: np.ndarray | None,
    target_logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Leviathan et al. 2023 / Chen et al. 2023 speculative sampling.

    Draft token x_i is accepted with probability min(1, p_i(x) / q_i(x)); at the first rejection the
    replacement is drawn from norm(max(0, p_i - q_i)). If all are accepted, a bonus token is drawn from
    p_k. ``draft_probs`` is None for drafters that propose deterministically (n-gram lookup): q is then
    one-hot, so acceptance is p_i(x) and the residual is p_i with x removed.
    """
    p = params.probs(target_logits)
    for i, token in enumerate(draft):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, token])
        if rng.random() * q_x < p[i, token]:  # u < p/q without dividing by a possibly tiny q
            continue
        if draft_probs is None:
            residual = p[i].copy()
            residual[token] = 0.0
        else:
            residual = np.maximum(p[i] - draft_probs[i], 0.0)
        if residual.sum() <= 0.0:  # p == q up to rounding: a rejection had probability ~0
            residual = p[i]
        return i, sample(residual, rng)
    return len(draft), sample(p[len(draft)], rng)
