"""Prompt lookup: the incremental index must propose exactly what a full rescan would."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.drafters import NgramDrafter
from edgespec.errors import InvalidParameterError
from edgespec.sampling import SamplingParams

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def rescan(context: list[int], n_max: int, n_min: int, limit: int) -> tuple[list[int], int]:
    """Reference: longest suffix first, most recent earlier occurrence, by brute force."""
    for n in range(min(n_max, len(context)), n_min - 1, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == suffix:
                return context[start + n:start + n + limit], n
    return [], 0


def test_proposes_the_continuation_of_the_longest_match() -> None:
    d = NgramDrafter(n_max=3)
    context = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    d.begin(context)
    draft = d.propose(context, 4, GREEDY, RNG)
    assert draft.tokens == [4, 5, 9, 9] and draft.key == 2


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
    with pytest.raises(InvalidParameterError):
        NgramDrafter(history=-1)


def answer(d: NgramDrafter, prompt: list[int], output: list[int]) -> None:
    """One request as the engine makes it: begin with the prompt, propose as the output grows."""
    d.begin(prompt)
    d.propose(prompt + output, 4, GREEDY, RNG)


def test_earlier_answers_propose_what_followed_a_longer_match() -> None:
    d = NgramDrafter(n_max=3)
    answer(d, [100, 101], [7, 8, 9, 10, 11])
    context = [50, 8, 51, 7, 8]  # its own 1-token match ([8] -> 51) is shorter than the answer's [7, 8]
    d.begin(context)
    draft = d.propose(context, 8, GREEDY, RNG)
    assert (draft.tokens, draft.key) == ([9, 10, 11], -2)  # stops where that answer ended
    sampled = d.propose(context, 8, SamplingParams(temperature=0.8), RNG)  # a seeded sample: its own text only
    assert (sampled.tokens, sampled.key) == ([51, 7, 8], 1)
    context = [7, 8, 5, 7, 8]  # a match as long in the sequence itself wins
    d.begin(context)
    draft = d.propose(context, 8, GREEDY, RNG)
    assert (draft.tokens, draft.key) == ([5, 7, 8], 2)


def test_earlier_answers_do_not_run_into_each_other() -> None:
    d = NgramDrafter(n_max=3)
    answer(d, [1], [20, 21, 22])
    answer(d, [2], [23, 24])
    for context in ([30, 22], [30, 21, 22]):  # an answer's last tokens: nothing of it follows them
        d.begin(context)
        assert d.propose(context, 8, GREEDY, RNG).tokens == []
    d.begin([30, 22, 23])  # no n-gram spans two answers
    assert d.propose([30, 22, 23], 8, GREEDY, RNG).tokens == [24]


def test_earlier_answers_keep_the_newest_within_the_limit() -> None:
    d = NgramDrafter(n_max=2, history=12)
    answers = [[10 * i + j for j in range(5)] for i in range(1, 5)]
    for i, out in enumerate(answers):
        answer(d, [i], out)
    d.begin([0])  # the last answer joins: 4 answers of 5 tokens + separators exceed 12, the oldest go
    kept = NgramDrafter(n_max=2, history=12)
    for out in answers[2:]:
        kept._index_answer(out)
    assert d._answer_tokens == kept._answer_tokens and d._answer_index == kept._answer_index
    assert (10,) not in d._answer_index  # dropped
    assert d.propose([0, 40], 3, GREEDY, RNG).tokens == [41, 42, 43]


@pytest.mark.parametrize("seed", range(5))
def test_begin_continues_from_the_shared_prefix(seed: int) -> None:
    """A new sequence sharing a prefix with the last (a chat's next turn, an edited message, a shorter
    prompt) proposes exactly what a drafter that never saw the last one proposes."""
    rng = np.random.default_rng(seed)
    reused = NgramDrafter(n_max=4, n_min=1, history=0)  # earlier answers: test_earlier_answers_*
    for _ in range(8):
        if reused._seen and rng.random() < 0.8:
            cut = int(rng.integers(0, len(reused._seen) + 1))
            tokens = reused._seen[:cut] + [int(t) for t in rng.integers(0, 6, size=int(rng.integers(0, 40)))]
        else:
            tokens = [int(t) for t in rng.integers(0, 6, size=int(rng.integers(1, 60)))]
        if not tokens:
            continue
        fresh = NgramDrafter(n_max=4, n_min=1, history=0)
        fresh.begin(tokens)
        reused.begin(tokens)
        for _ in range(10):  # then the sequence grows as output does
            assert reused.propose(tokens, 5, GREEDY, RNG) == fresh.propose(tokens, 5, GREEDY, RNG)
            tokens = tokens + [int(t) for t in rng.integers(0, 6, size=3)]
        assert reused._index == fresh._index
