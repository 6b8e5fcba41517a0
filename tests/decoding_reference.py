"""Target-only decoding through the arena, one token a pass: the reference that tree and chain verification rows
must equal bit for bit (tests/model/test_tree_llama.py, tests/model/test_onnx_trees.py); and a count of the trees an
engine
verifies."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from edgespec.engine.arena import Cache, KVArena
from edgespec.engine.engine import Engine


def started(model: Cache, prompt: list[int]) -> KVArena:
    """An arena holding ``prompt``, with the first generated token committed (not yet fed)."""
    arena = KVArena({"target": model})
    arena.reset(prompt, reuse=False)
    arena.commit([int(arena.extend("target", [], 1)[0].argmax())])
    return arena


def one_at_a_time(model: Cache, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Rows after the first generated token and after each of ``tokens``, one token a pass: target-only decoding."""
    arena = started(model, prompt)
    rows = [arena.extend("target", [], 1)[0].copy()]
    for token in tokens:
        arena.commit([token])
        rows.append(arena.extend("target", [], 1)[0].copy())
    return np.stack(rows)


def decode_on(arena: KVArena, generated: list[int], n: int) -> np.ndarray:
    """``n`` more greedy tokens one at a time after a verify step (appended to ``generated``); their rows."""
    rows = []
    for _ in range(n):
        rows.append(arena.extend("target", [], 1)[0].copy())
        generated.append(int(rows[-1].argmax()))
        arena.commit([generated[-1]])
    return np.stack(rows)


@contextmanager
def counting_leaves(engine: Engine) -> Iterator[list[int]]:
    """While open: the number of leaves of each token tree the engine's target verifies."""
    leaves: list[int] = []
    verify_tree = engine.arena.extend_tree

    def counting(name: str, tokens: list[int], parents: list[int]) -> np.ndarray:
        leaves.append(len(set(range(len(tokens))) - set(parents)))
        return verify_tree(name, tokens, parents)

    engine.arena.extend_tree = counting  # type: ignore[method-assign]
    try:
        yield leaves
    finally:
        del engine.arena.extend_tree
