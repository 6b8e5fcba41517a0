"""Prompt lookup: the incremental index must propose exactly what a full rescan would."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.drafters import NgramDrafter
from edgespec.drafters.ngram import AGREED, ALONE, DIFFERED
from edgespec.engine.sampling import SamplingParams
from edgespec.errors import InvalidParameterError

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def rescan(context: list[int], n_max: int, n_min: int, limit: int) -> tuple[list[int], int]:
    """Reference: longest suffix first, most recent earlier occurrence, by brute force; the key from the match length
    and whether the occurrence before it was followed by the same token."""
    for n in range(min(n_max, len(context)), n_min - 1, -1):
        suffix = context[-n:]
        after = [start + n for start in range(len(context) - n - 1, -1, -1) if context[start:start + n] == suffix]
        if after:
            evidence = ALONE if len(after) == 1 else AGREED if context[after[1]] == context[after[0]] else DIFFERED
            return context[after[0]:after[0] + limit], (n, evidence)
    return [], 0


def test_proposes_the_continuation_of_the_longest_match() -> None:
    d = NgramDrafter(n_max=3)
    context = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    d.begin(context)
    draft = d.propose(context, 4, GREEDY, RNG)
    assert draft.tokens == [4, 5, 9, 9] and draft.key == (2, ALONE)


def test_the_key_says_whether_the_matchs_previous_occurrence_was_followed_alike() -> None:
    """The text's own evidence on a match: the token after its previous occurrence against the one after its
    latest."""
    d = NgramDrafter(n_max=2)
    for context, evidence in (([7, 1, 2, 8, 1, 2, 8, 1, 2], AGREED), ([7, 1, 2, 5, 1, 2, 8, 1, 2], DIFFERED)):
        d.begin(context)
        draft = d.propose(context, 2, GREEDY, RNG)
        assert draft.tokens == [8, 1] and draft.key == (2, evidence)


def test_no_match_proposes_nothing() -> None:
    d = NgramDrafter()
    d.begin([1, 2, 3])
    assert d.propose([1, 2, 3], 8, GREEDY, RNG).tokens == []


@pytest.mark.parametrize("seed", range(5))
def test_incremental_index_equals_rescan(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = [int(t) for t in rng.integers(0, 6, size=300)]  # small alphabet: many repeats
    d = NgramDrafter(n_max=4, n_min=1)
    d.begin(tokens[:50])
    for end in range(50, 300, 7):  # the sequence grows in uneven steps, as accepted tokens do
        context = tokens[:end]
        draft = d.propose(context, 5, GREEDY, RNG)
        assert (draft.tokens, draft.key if draft.tokens else 0) == rescan(context, 4, 1, 5)


def test_bad_parameters() -> None:
    with pytest.raises(InvalidParameterError):
        NgramDrafter(n_max=2, n_min=3)


@pytest.mark.parametrize("seed", range(5))
def test_begin_continues_from_the_shared_prefix(seed: int) -> None:
    """A new sequence sharing a prefix with the last (a chat's next turn, an edited message, a shorter
    prompt) proposes exactly what a drafter that never saw the last one proposes."""
    rng = np.random.default_rng(seed)
    reused = NgramDrafter(n_max=4, n_min=1)
    for _ in range(8):
        if reused._seen and rng.random() < 0.8:
            cut = int(rng.integers(0, len(reused._seen) + 1))
            tokens = reused._seen[:cut] + [int(t) for t in rng.integers(0, 6, size=int(rng.integers(0, 40)))]
        else:
            tokens = [int(t) for t in rng.integers(0, 6, size=int(rng.integers(1, 60)))]
        if not tokens:
            continue
        fresh = NgramDrafter(n_max=4, n_min=1)
        fresh.begin(tokens)
        reused.begin(tokens)
        for _ in range(10):  # then the sequence grows as output does
            assert reused.propose(tokens, 5, GREEDY, RNG) == fresh.propose(tokens, 5, GREEDY, RNG)
            tokens = tokens + [int(t) for t in rng.integers(0, 6, size=3)]
        assert reused._index == fresh._index
