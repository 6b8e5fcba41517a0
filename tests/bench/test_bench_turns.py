"""edgespec.bench.turns: the order in which the row-cost benchmarks feed their models (a scripted cache)."""

from __future__ import annotations

import numpy as np

from edgespec.bench.turns import passes_taking_turns


class Recorder:
    """A cache that records what it is asked and keeps its end as a model would."""

    n_vocab, n_ctx = 5000, 40

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.end = 0

    def decode(self, tokens: list[int], start: int, n_logits: int) -> np.ndarray:
        assert start == self.end and start + len(tokens) <= self.n_ctx
        self.calls.append(("decode", tuple(tokens), start, n_logits))
        self.end = start + len(tokens)
        return np.zeros((n_logits, self.n_vocab), dtype=np.float32)

    def truncate(self, keep: int) -> None:
        self.end = min(self.end, keep)


def test_every_model_sees_the_same_passes_in_turns_and_keeps_one_token_each() -> None:
    a, b = Recorder(), Recorder()
    seen = []
    for k, tokens, start, order in passes_taking_turns([a, b], context=10, rows=[1, 3], rounds=20):
        assert len(tokens) == k and all(1000 <= t < a.n_vocab for t in tokens)
        seen.append((start, order))
        for i in order:
            [a, b][i].decode(tokens, start, k)
    assert a.calls == b.calls and a.calls[0][2:] == (0, 1) and len(a.calls[0][1]) == 10
    assert [order for _, order in seen[:4]] == [[0, 1], [0, 1], [1, 0], [1, 0]]  # turned around each round
    starts = [start for start, _ in seen]
    # one token kept per pass; a round that would pass the end of the cache (40) starts again at the context's end
    assert starts[:6] == [10, 11, 12, 13, 14, 15] and starts.count(10) == 2 and max(starts) == 37
