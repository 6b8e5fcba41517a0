"""The KV arena: random accept/reject sequences leave caches equal to a fresh prefill of the same tokens."""

from __future__ import annotations

import numpy as np

from edgespec.engine.arena import KVArena
from edgespec.engine.engine import Engine


def _fresh_logits(arena: KVArena, name: str, tokens: list[int]) -> np.ndarray:
    arena.reset(tokens, reuse=False)
    return arena.extend(name, [], 1)[0].copy()


def test_random_accept_reject_then_fresh_prefill(pair_engine: Engine) -> None:
    arena = pair_engine.arena
    rng = np.random.default_rng(0)
    prompt = pair_engine.tokenize("The history of the printing press begins in the fifteenth century, when")
    arena.reset(prompt)
    arena.extend("target", [], 1)
    for _ in range(25):
        # The draft cache runs ahead by a few tokens, the target verifies some, a random prefix is kept.
        draft = [int(t) for t in rng.integers(100, 20_000, size=int(rng.integers(0, 6)))]
        for token in draft[:-1]:
            arena.extend("draft", [token], 1)
        arena.extend("target", draft, len(draft) + 1)
        keep = int(rng.integers(0, len(draft) + 1))
        arena.commit(draft[:keep] + [int(rng.integers(100, 20_000))])
        for name in ("target", "draft"):
            held = arena.held[name]
            assert held == arena.tokens[:len(held)]
            assert pair_engine.arena.caches[name].cache_end() == len(held)
    sequence = list(arena.tokens)
    incremental = {name: arena.extend(name, [], 1)[0].copy() for name in ("target", "draft")}
    for name in ("target", "draft"):
        fresh = _fresh_logits(arena, name, sequence)
        assert fresh.argmax() == incremental[name].argmax()
        np.testing.assert_allclose(incremental[name], fresh, atol=0.05)


def test_commit_rolls_back_only_the_rejected_tail(engine: Engine) -> None:
    arena = engine.arena
    arena.reset(engine.tokenize("one two three four"))
    arena.extend("target", [], 1)
    committed = len(arena.tokens)
    arena.extend("target", [11, 12, 13], 4)
    assert len(arena.held["target"]) == committed + 3
    arena.commit([11, 99])  # 11 accepted, 12 rejected and replaced by 99
    assert arena.held["target"] == arena.tokens[:committed + 1]
    assert engine.target.cache_end() == committed + 1
