"""Sampled speculative output follows the target's distribution, end to end on the real model.

For every sampled token at a speculative position we compute the target's exact distribution for that
position (a target-only pass over the same prefix) and its randomized CDF value u. If the token was
drawn from that distribution, u is uniform on (0, 1) (probability integral transform): a KS test checks
it, and a chi-square test checks the frequencies of the most common tokens.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare, kstest

from edgespec.engine.engine import Engine
from edgespec.engine.sampling import SamplingParams

RUNS = 250
PARAMS = SamplingParams(temperature=0.8, top_k=40)


def assert_sampling_matches_target(engine: Engine, mode: str, runs: int = RUNS, params: SamplingParams = PARAMS,
                                   max_tokens: int = 3, gamma: int = 2) -> None:
    """Sample ``max_tokens`` tokens ``runs`` times with drafter ``mode`` at ``gamma`` and test them against the
    target's exact distributions: KS on the randomized CDF values of every token after the first, chi-square on
    the second token."""
    prompt = engine.chat_tokens([{"role": "user", "content": "Name a colour and a fruit."}])
    outputs, drafted = [], 0
    for seed in range(runs):
        out = engine.generate(prompt, max_tokens=max_tokens, temperature=params.temperature, top_k=params.top_k,
                              seed=seed, mode=mode, gamma=gamma)
        outputs.append(out.tokens)
        drafted += out.stats.drafted
    assert drafted >= runs  # positions 2 and 3 went through speculative verification

    cache: dict[tuple[int, ...], np.ndarray] = {}

    def target_probs(prefix: list[int]) -> np.ndarray:
        key = tuple(prefix)
        if key not in cache:
            engine.arena.reset(prefix)
            cache[key] = params.probs(engine.arena.extend("target", [], 1)[0])[0]
        return cache[key]

    rng = np.random.default_rng(0)
    u_values, second = [], []
    for tokens in outputs:
        for i in range(1, len(tokens)):
            p, t = target_probs(prompt + tokens[:i]), tokens[i]
            assert p[t] > 0, "a token outside the target's top-k support was produced"
            u_values.append(p[:t].sum() + rng.random() * p[t])
        if len(tokens) > 1:
            second.append(tuple(tokens[:2]))
    assert kstest(u_values, "uniform").pvalue > 1e-3

    # Chi-square on the second token, given the most frequent first token.
    first = max({t[0] for t in second}, key=lambda f: sum(1 for t in second if t[0] == f))
    after = [t[1] for t in second if t[0] == first]
    p = target_probs(prompt + [first])
    frequent = [t for t in np.argsort(-p)[:5] if p[t] * len(after) >= 5]
    if len(frequent) >= 2:
        observed = [after.count(t) for t in frequent]
        expected = [p[t] * len(after) for t in frequent]
        observed[-1] += len(after) - sum(observed)  # the last bucket also holds every other token
        expected[-1] += len(after) - sum(expected)
        assert chisquare(observed, expected).pvalue > 1e-3


def test_draft_model_sampling_matches_target(pair_engine: Engine) -> None:
    assert_sampling_matches_target(pair_engine, "draft")

