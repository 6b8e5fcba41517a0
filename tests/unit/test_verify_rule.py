"""The acceptance rule alone, in numpy: speculative sampling must reproduce the target distribution exactly."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec.engine.sampling import SamplingParams, sample
from edgespec.engine.verify import verify_greedy, verify_sampled, verify_tree_sampled

DRAWS = 120_000
T1 = SamplingParams(temperature=1.0)

# Adversarial (p, q) pairs: q puts mass where p has little, q misses part of p's support, p is one-hot.
PAIRS = {
    "opposite": ([0.7, 0.2, 0.05, 0.05], [0.05, 0.05, 0.2, 0.7]),
    "q-misses-support": ([0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]),
    "p-one-hot": ([0.0, 1.0, 0.0, 0.0], [0.4, 0.3, 0.2, 0.1]),
    "near-equal": ([0.3, 0.3, 0.2, 0.2], [0.31, 0.29, 0.2, 0.2]),
    "peaked-q": ([0.1, 0.1, 0.1, 0.1, 0.6], [0.96, 0.01, 0.01, 0.01, 0.01]),
}


def _logits(p: list[float]) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(p, dtype=np.float64))


def _tv(counts: np.ndarray, p: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


def _check(counts: np.ndarray, p: np.ndarray) -> None:
    # Total variation within sampling error (~sqrt(k/n)), and no chi-square evidence against p.
    assert _tv(counts, p) < 0.01
    support = p > 0
    assert counts[~support].sum() == 0, "a token with target probability 0 was produced"
    if support.sum() > 1:
        assert chisquare(counts[support], p[support] * counts.sum()).pvalue > 1e-4


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_one_token_draft_reproduces_p(name: str) -> None:
    p, q = (np.asarray(x) for x in PAIRS[name])
    rng = np.random.default_rng(0)
    target = np.stack([_logits(p), _logits(p)])  # row 0 verifies the draft, row 1 is the bonus position
    counts = np.zeros(len(p))
    for _ in range(DRAWS):
        x = sample(q, rng)
        n, token = verify_sampled([x], q[None, :], target, T1, rng)
        counts[x if n == 1 else token] += 1
    _check(counts, p)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_deterministic_draft_reproduces_p(name: str) -> None:
    """n-gram drafts carry no q: q is one-hot on the proposed token, whatever it is."""
    p = np.asarray(PAIRS[name][0])
    rng = np.random.default_rng(1)
    target = np.stack([_logits(p), _logits(p)])
    counts = np.zeros(len(p))
    for i in range(DRAWS // 2):
        x = i % len(p)  # every token gets proposed, likely or not
        n, token = verify_sampled([x], None, target, T1, rng)
        counts[x if n == 1 else token] += 1
    _check(counts, p)


def test_two_token_draft_reproduces_the_joint_distribution() -> None:
    """A toy Markov target and draft: the first two output tokens must follow P(x1) P(x2 | x1)."""
    rng = np.random.default_rng(2)
    v = 4
    target_p = rng.dirichlet(np.ones(v), size=v)  # row: previous token
    draft_q = rng.dirichlet(np.ones(v) * 0.5, size=v)
    start = 0
    counts = np.zeros((v, v))
    for _ in range(DRAWS):
        d1 = sample(draft_q[start], rng)
        d2 = sample(draft_q[d1], rng)
        logits = np.log(np.stack([target_p[start], target_p[d1], target_p[d2]]))
        n, token = verify_sampled([d1, d2], np.stack([draft_q[start], draft_q[d1]]), logits, T1, rng)
        out = [d1, d2][:n] + [token]
        if len(out) == 1:  # the second token comes from the next step: the target alone
            out.append(sample(target_p[out[0]], rng))
        counts[out[0], out[1]] += 1
    joint = target_p[start][:, None] * target_p
    _check(counts.ravel(), joint.ravel())


# Siblings at both depths, a likely and an unlikely one, a repeated token under another parent, and a node
# (token 3 after 1) whose own child is drafted too: the walk can end at every depth, on every branch.
TREE_TOKENS = [0, 1, 3, 2, 3, 0, 1]
TREE_PARENTS = [-1, -1, -1, 0, 0, 1, 4]


@pytest.mark.parametrize("params", [T1, SamplingParams(temperature=0.7, top_k=3)], ids=["t1", "t0.7-top3"])
def test_sampled_tree_verification_reproduces_the_joint_distribution(params: SamplingParams) -> None:
    """A toy Markov target: whichever branch is accepted and however deep, the first three output tokens follow
    P(x1) P(x2 | x1) P(x3 | x2) of the (tempered, truncated) target."""
    rng = np.random.default_rng(5)
    v = 4
    # Row: the previous token. Each row's least likely token (cut by top-k 3) is one the tree does not draft there.
    logits = np.log([[0.05, 0.25, 0.4, 0.3], [0.5, 0.2, 0.25, 0.05], [0.45, 0.3, 0.05, 0.2], [0.2, 0.5, 0.25, 0.05]])
    p = params.probs(logits)
    start = 2
    rows = np.stack([logits[start], *(logits[t] for t in TREE_TOKENS)])  # row i + 1 follows node i: its token's row
    counts = np.zeros((v, v, v))
    depth = Counter()
    for _ in range(DRAWS // 2):
        path, token = verify_tree_sampled(TREE_TOKENS, TREE_PARENTS, rows, params, rng)
        out = [TREE_TOKENS[i] for i in path] + [token]
        depth[len(path)] += 1
        while len(out) < 3:  # later tokens come from the next steps: the target alone
            out.append(sample(p[out[-1]], rng))
        counts[tuple(out[:3])] += 1
    assert {1, 2, 3} <= set(depth)  # accepted down to every depth
    joint = (p[start][:, None, None] * p[:, :, None] * p[None, :, :]).ravel()
    counts = counts.ravel()
    assert counts[joint == 0].sum() == 0, "a sequence with target probability 0 was produced"
    assert chisquare(counts[joint > 0], joint[joint > 0] * counts.sum()).pvalue > 1e-4


def test_truncation_is_applied_to_p_and_q_alike() -> None:
    """With top-k/top-p the output follows the truncated target distribution, whatever q was."""
    params = SamplingParams(temperature=0.7, top_k=3, top_p=0.9)
    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.0])
    p = params.probs(logits)[0]
    assert p[3] == p[4] == 0.0
    q = params.probs(np.array([0.0, 0.5, 1.0, 1.5, 2.0]))[0]
    rng = np.random.default_rng(3)
    counts = np.zeros(len(p))
    for _ in range(DRAWS // 2):
        x = sample(q, rng)
        n, token = verify_sampled([x], q[None, :], np.stack([logits, logits]), params, rng)
        counts[x if n == 1 else token] += 1
    _check(counts, p)


def test_greedy_rule() -> None:
    logits = np.full((4, 5), -1.0)
    for row, best in enumerate([2, 4, 1, 0]):
        logits[row, best] = 1.0
    assert verify_greedy([2, 4, 1], logits) == (3, 0)  # all accepted, bonus from the last row
    assert verify_greedy([2, 3, 1], logits) == (1, 4)  # first mismatch replaced by the target's choice
    assert verify_greedy([], logits) == (0, 2)


def test_sampling_params_validate() -> None:
    from edgespec.errors import InvalidParameterError

    for bad in (dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(min_p=1.0)):
        with pytest.raises(InvalidParameterError):
            SamplingParams(**bad)


def test_min_p_and_top_p_keep_the_right_tokens() -> None:
    p = SamplingParams(temperature=1.0, min_p=0.3).probs(np.log([0.5, 0.3, 0.14, 0.06]))[0]
    assert np.count_nonzero(p) == 2  # 0.14 < 0.3 * 0.5
    p = SamplingParams(temperature=1.0, top_p=0.75).probs(np.log([0.5, 0.3, 0.14, 0.06]))[0]
    assert np.count_nonzero(p) == 2  # 0.5 alone is short of 0.75; with 0.3 it crosses
    assert np.isclose(p.sum(), 1.0)
