"""Structured output at scale, as an app uses it: 50 prompts of mixed tasks through the official `openai` client and
`response_format` with a JSON schema, greedy and sampled, against a live `edgespec serve` speculating by default.
Every reply must be JSON that validates; greedy replies equal constrained target-only decoding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from edgespec.engine import constraints
from edgespec.engine.engine import Engine
from tests.live import LiveServer

PROMPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "constrained_prompts.jsonl"
MAX_TOKENS = 400
# Short tasks of other kinds beside the benchmark's extractions and tool calls: labels, numbers, lists, choices.
_LABEL = {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]}},
          "required": ["label"], "additionalProperties": False}
_ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
           "additionalProperties": False}
_LIST = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}},
         "required": ["items"], "additionalProperties": False}
_MORE = [
    *[(f"What is the sentiment of this review? {text}", _LABEL) for text in (
        "The battery died after two days and support never answered.",
        "Lovely little cafe, the staff remembered my order.",
        "It arrived on Tuesday.",
        "Best hiking boots I have owned, dry feet all week.",
        "The film was long and I forgot most of it.",
        "Terrible fit, returned it the same day.")],
    *[(f"Answer with a number. {question}", _ANSWER) for question in (
        "How many days are in a week?", "What is 12 plus 30?", "How many legs does a spider have?",
        "How many months have 31 days?", "What is 9 times 9?", "How many minutes are in two hours?")],
    *[(f"List them. {question}", _LIST) for question in (
        "Three primary colours.", "Four planets of the solar system.", "Three fruits that are red.",
        "Two programming languages.", "Three musical instruments.", "Five days of the week.")],
]


def _bounded(schema: Any) -> Any:
    """The schema with every string and array given an upper bound, so that a 135M model's reply must close within
    ``MAX_TOKENS`` (a small model may repeat an array item or a string for ever; the bound is part of the schema, so
    the reply still validates against the original)."""
    if isinstance(schema, dict):
        out = {key: _bounded(value) for key, value in schema.items()}
        if out.get("type") == "string" and "enum" not in out:
            out.setdefault("maxLength", 32)
        if out.get("type") == "array":
            out.setdefault("maxItems", 3)
        return out
    if isinstance(schema, list):
        return [_bounded(value) for value in schema]
    return schema


def _tasks() -> list[tuple[str, dict]]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    tasks = [(row["turns"][0], row["schema"]) for row in rows] + _MORE
    assert len(tasks) >= 50
    return tasks[:50]


TASKS = _tasks()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(client: openai.OpenAI, prompt: str, schema: dict, **sampling: Any) -> str:
    response_format = {"type": "json_schema", "json_schema": {"name": "reply", "schema": _bounded(schema),
                                                              "strict": True}}
    reply = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": prompt}],
                                           max_tokens=MAX_TOKENS, response_format=response_format, **sampling)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", (prompt, choice.message.content)
    jsonschema.validate(json.loads(choice.message.content), schema)
    return choice.message.content


def test_fifty_schema_replies_validate_greedy_and_equal_target_only(client: openai.OpenAI,
                                                                    solo_engine: Engine) -> None:
    for prompt, schema in TASKS:
        text = _ask(client, prompt, schema, temperature=0)
        constraint = constraints.json_schema(_bounded(schema))
        alone = solo_engine.chat([{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, mode="none",
                                 constraint=constraint)
        assert text == alone.text, prompt


def test_fifty_schema_replies_validate_sampled(client: openai.OpenAI) -> None:
    for i, (prompt, schema) in enumerate(TASKS):
        _ask(client, prompt, schema, temperature=0.8, top_p=0.95, seed=i)
