"""Constraints, penalties and log-probabilities on the scripted backend: speculation changes none of them.

Greedy speculative output equals constrained target-only output token for token (drafts the grammar forces fed at no
drafting cost, drafts it refuses cut before the pass), penalties and log-probabilities are the same with and without
speculation, and sampling under a grammar follows the constrained distribution (chi-square).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence

import jsonschema
import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec.engine import constraints
from edgespec.engine.engine import Completion, Engine
from edgespec.engine.rules import Penalties, Rules
from edgespec.engine.sampling import SamplingParams
from edgespec.errors import InvalidParameterError
from tests.fake_backend import BOS, N_VOCAB, PEAK, FakeClock, FakeModel, Logits, bigram, encode

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(time, "perf_counter", c)
    return c


def noisy_script(text: str, seed: int = 0) -> Logits:
    """Continues ``text`` (a peak on its next byte) over noise that depends on the last token: where a constraint
    masks the scripted byte, the likeliest allowed token is well defined and differs from step to step."""
    sequence = [BOS, *encode(text)]
    noise = np.random.default_rng(seed).normal(0.0, 1.0, (N_VOCAB, N_VOCAB)).astype(np.float32)

    def logits(context: Sequence[int]) -> np.ndarray:
        row = noise[context[-1]].copy()
        if len(context) < len(sequence):
            row[sequence[len(context)]] += PEAK
        return row

    return logits


# The model writes a record whose name has capitals and spaces (the schema refuses them); the prompt holds the same
# text, so lookup drafts it, and the grammar must cut those drafts.
TEXT = 'rec {"name": "abc Def", "n": 12} rec {"name": "abc Def", "n": 12} rec {"name": "abc Def", "n": 12}'
PROMPT = [BOS, *encode(TEXT[:70])]


def run(mode: str, gamma: int | str, **kwargs: object) -> Completion:
    clock = time.perf_counter  # the fixture's FakeClock: the fake's passes advance it
    assert isinstance(clock, FakeClock)
    engine = Engine(FakeModel(noisy_script(TEXT), n_ctx=512, clock=clock), mode=mode, gamma=gamma)
    return engine.generate(PROMPT, **{"max_tokens": 60, **kwargs})  # type: ignore[arg-type]


# The regex forces `ec {"name": "` after the first token, `", "n": ` after the name: long forced runs.
RECORD = r'rec \{"name": "[a-z]+", "n": [0-9]+\}'


@pytest.mark.parametrize("gamma", [1, 4, "auto"])
@pytest.mark.parametrize("kind", ["schema", "regex"])
def test_greedy_speculation_under_a_constraint_equals_constrained_target_only(monkeypatch: pytest.MonkeyPatch,
                                                                              gamma: int | str, kind: str) -> None:
    constraint = constraints.json_schema(SCHEMA) if kind == "schema" else constraints.regex(RECORD)
    alone = run("none", 0, constraint=constraint, logprobs=True, top_logprobs=3)
    cuts: list[tuple[int, int]] = []
    valid_prefix = Rules.valid_prefix

    def spy(self: Rules, tokens: Sequence[int]) -> int:
        n = valid_prefix(self, tokens)
        cuts.append((len(tokens), n))
        return n

    monkeypatch.setattr(Rules, "valid_prefix", spy)
    spec = run("ngram", gamma, constraint=constraint, logprobs=True, top_logprobs=3)
    assert spec.tokens == alone.tokens and spec.text == alone.text and spec.finish_reason == alone.finish_reason
    assert spec.logprobs == alone.logprobs  # bit-identical rows, the same processing
    jsonschema.validate(json.loads(spec.text.removeprefix("rec ")), SCHEMA)
    assert any(n < k for k, n in cuts)  # a draft was cut where the grammar refused it (" Def")
    if kind == "regex":
        assert spec.stats.forced > 0  # the forced runs were fed as drafts, outside the drafter's statistics
    assert spec.stats.accepted > 0  # and the drafter's own drafts were verified and kept


def test_without_a_constraint_the_text_breaks_the_schema() -> None:
    """The check above means something: unconstrained, the scripted text is not valid for the schema."""
    out = run("none", 0)
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        jsonschema.validate(json.loads(out.text), SCHEMA)


@pytest.mark.parametrize("constraint", [
    constraints.regex(r"rec \{[a-z\" :,]+\}"),
    constraints.choice(["rec yes", "rec no", 'rec {"name"']),
    constraints.grammar('root ::= "rec " obj\nobj ::= "{" [^}]* "}"'),
    constraints.json_object(),
])
def test_every_constraint_kind_is_exact_under_speculation(constraint: constraints.Constraint) -> None:
    alone = run("none", 0, constraint=constraint)
    assert run("ngram", 3, constraint=constraint).tokens == alone.tokens
    assert run("ngram", "auto", constraint=constraint).tokens == alone.tokens


def test_a_grammar_that_cannot_finish_within_max_tokens_ends_with_length() -> None:
    out = run("ngram", 3, max_tokens=5, constraint=constraints.json_schema(SCHEMA))
    assert out.finish_reason == "length" and len(out.tokens) == 5


def test_a_finished_grammar_stops_the_generation() -> None:
    out = run("ngram", 3, constraint=constraints.choice(["rec yes", "rec no"]))
    assert out.text in ("rec yes", "rec no") and out.finish_reason == "stop"


@pytest.mark.parametrize("penalties", [
    {"presence_penalty": 1.5}, {"frequency_penalty": 0.7}, {"repetition_penalty": 1.3},
    {"repetition_penalty": 1.3, "repeat_last_n": 8}, {"presence_penalty": -0.5, "frequency_penalty": 0.3,
                                                      "repetition_penalty": 0.9}])
def test_penalties_are_the_same_with_and_without_speculation(penalties: dict[str, float]) -> None:
    alone = run("none", 0, logprobs=True, **penalties)
    plain = run("none", 0)
    assert alone.tokens != plain.tokens or alone.logprobs != plain.logprobs  # the penalty did something
    for gamma in (2, "auto"):
        spec = run("ngram", gamma, logprobs=True, **penalties)
        assert spec.tokens == alone.tokens and spec.logprobs == alone.logprobs


def test_logprobs_are_the_same_with_and_without_speculation_and_are_the_rows_own() -> None:
    alone = run("none", 0, logprobs=True, top_logprobs=5)
    spec = run("ngram", "auto", logprobs=True, top_logprobs=5)
    assert spec.tokens == alone.tokens and spec.logprobs == alone.logprobs and spec.stats.accepted > 0
    assert alone.logprobs is not None and len(alone.logprobs) == len(alone.tokens)
    model = noisy_script(TEXT)
    context = list(PROMPT)
    for token, lp in zip(alone.tokens, alone.logprobs, strict=True):
        x = model(context).astype(np.float64)
        expected = x - x.max() - np.log(np.exp(x - x.max()).sum())
        assert lp.token == token and lp.logprob == pytest.approx(expected[token], abs=1e-9)
        assert [t for t, _ in lp.top] == list(np.argsort(-expected, kind="stable")[:5])
        context.append(token)


def test_no_rules_without_a_request_for_them() -> None:
    """The decode loop does no extra work for a request that asks for none of this."""
    engine = Engine(FakeModel(noisy_script(TEXT), n_ctx=512))
    assert engine._rules(PROMPT, None, Penalties(), False, 0) is None
    assert engine._rules(PROMPT, None, Penalties(repetition=1.5, last_n=0), False, 0) is None
    assert run("ngram", 2, max_tokens=4).logprobs is None


@pytest.mark.parametrize(("make", "arg", "param"), [
    (constraints.json_schema, {"type": "objectx"}, "json_schema"),
    (constraints.json_schema, "{not json", "json_schema"),
    (constraints.regex, "a(b", "regex"),
    (constraints.choice, [], "choice"),
    (constraints.grammar, "root ::= (", "grammar"),
    (constraints.response_format, {"type": "xml"}, "response_format"),
])
def test_invalid_constraints_are_refused_naming_the_parameter(make, arg, param) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"^{param}"):
        make(arg)
    # and the engine goes on serving
    assert run("ngram", 2, constraint=constraints.choice(["rec yes"])).text == "rec yes"


@pytest.mark.parametrize("kwargs", [{"presence_penalty": 3.0}, {"repetition_penalty": 0.0}, {"top_logprobs": 21},
                                    {"repeat_last_n": -2}, {"constraint": "json"}, {"logprobs": 1}])
def test_bad_penalties_and_logprobs_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidParameterError):
        run("ngram", 2, **kwargs)


RUNS = 3000
SUPPORT = encode("abcxy")


def test_sampled_output_under_a_grammar_follows_the_constrained_distribution() -> None:
    """A draft model proposes from its own distribution, x and y included: the grammar cuts those, the verify rule
    uses the drafter's q masked and renormalized, and every position follows the target's masked distribution."""
    target = FakeModel(bigram(1, SUPPORT))
    engine = Engine(target, FakeModel(bigram(2, SUPPORT)), mode="draft", gamma=3)
    constraint = constraints.regex("[abc]{4}")
    params = SamplingParams(1.0)
    prompt = [BOS, *encode("ab")]
    seen: list[Counter[int]] = [Counter() for _ in range(4)]
    drafted = 0
    for seed in range(RUNS):
        out = engine.generate(prompt, max_tokens=4, temperature=1.0, seed=seed, constraint=constraint)
        for i, token in enumerate(out.tokens):
            seen[i][token] += 1
        drafted += out.stats.drafted
    assert drafted > RUNS / 2  # tokens after the first came through verification of (cut) drafts
    allowed = np.zeros(N_VOCAB, dtype=bool)
    allowed[encode("abc")] = True
    d = np.zeros(N_VOCAB)
    d[prompt[-1]] = 1.0
    for i in range(4):
        d = sum(d[t] * params.probs(np.where(allowed, target.logits([t]), -np.inf))[0] for t in np.flatnonzero(d))
        support = list(np.flatnonzero(d))
        assert set(seen[i]) <= set(support)
        _, p_value = chisquare([seen[i][t] for t in support], [RUNS * d[t] for t in support])
        assert p_value > 1e-4, (i, dict(seen[i]))
