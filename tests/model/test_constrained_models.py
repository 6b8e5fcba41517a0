"""Constrained decoding on the real models, both backends: the shipped SmolLM2 GGUF on llama.cpp and its ONNX export.
Greedy output under a JSON schema is the same with and without speculation, token for token and logprob for logprob,
and it validates against the schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from edgespec.engine import constraints
from edgespec.engine.engine import Engine

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                         "colours": {"type": "array", "items": {"enum": ["black", "white", "orange", "grey"]},
                                     "maxItems": 3}},
          "required": ["name", "age", "colours"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Describe a cat as JSON with its name, age and colours. Then describe "
                                        "a second cat the same way."}]


@pytest.mark.parametrize("backend", ["engine", "onnx_engine"])
def test_greedy_constrained_output_is_the_same_with_and_without_speculation(request: pytest.FixtureRequest,
                                                                            backend: str) -> None:
    engine: Engine = request.getfixturevalue(backend)
    constraint = constraints.json_schema(SCHEMA)
    kwargs = {"max_tokens": 96, "constraint": constraint, "logprobs": True, "top_logprobs": 2}
    alone = engine.chat(MESSAGES, mode="none", **kwargs)
    spec = engine.chat(MESSAGES, mode="ngram", **kwargs)
    assert spec.tokens == alone.tokens and spec.logprobs == alone.logprobs
    assert alone.finish_reason == "stop", alone.text
    jsonschema.validate(json.loads(alone.text), SCHEMA)
    assert spec.stats.forced > 0  # the schema's keys were fed as forced drafts
    # The same engine serves an unconstrained request next as before.
    assert engine.chat(MESSAGES, max_tokens=8, mode="none").tokens == engine.chat(MESSAGES, max_tokens=8).tokens


def test_grammar_and_penalties_on_llama_cpp(engine: Engine) -> None:
    gbnf = 'root ::= "The answer is " ("yes" | "no") "."'
    kwargs = {"max_tokens": 24, "constraint": constraints.grammar(gbnf)}
    out = engine.chat(MESSAGES, mode="ngram", **kwargs)
    assert out.text in ("The answer is yes.", "The answer is no.") and out.finish_reason == "stop"
    penalties = {"max_tokens": 48, "repetition_penalty": 1.3, "presence_penalty": 0.5, "logprobs": True}
    alone = engine.chat(MESSAGES, mode="none", **penalties)
    assert engine.chat(MESSAGES, mode="ngram", **penalties).logprobs == alone.logprobs
