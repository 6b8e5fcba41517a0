"""Structured output, penalties and log-probabilities through the OpenAI server (the official client, real HTTP) and
the bridge: a JSON schema's reply validates, logprobs come back in OpenAI's shapes, streamed and not, and equal the
engine's own; a bad schema is a 400 naming its parameter, and the server serves the next request as before."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from edgespec.engine import constraints
from edgespec.engine.engine import Engine
from tests.live import LiveServer

SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Name a large city and its population as JSON."}]


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_json_schema_reply_validates_with_logprobs(client: openai.OpenAI, solo_engine: Engine) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    reply = client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=64, temperature=0,
                                           response_format=response_format, logprobs=True, top_logprobs=2)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    reference = solo_engine.chat(MESSAGES, max_tokens=64, mode="none", logprobs=True, top_logprobs=2,
                                 constraint=constraints.response_format(response_format))
    assert choice.message.content == reference.text and reference.logprobs is not None
    content = choice.logprobs.content
    assert [c.logprob for c in content] == [lp.logprob for lp in reference.logprobs]
    assert "".join(c.token for c in content) == reference.text
    # where the schema allows one token, it is the only one with a probability
    assert all(1 <= len(c.top_logprobs) <= 2 and c.top_logprobs[0].logprob >= c.logprob for c in content)
    # Streamed: the same text and logprobs, chunk by chunk.
    stream = client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=64, temperature=0,
                                            response_format=response_format, logprobs=True, top_logprobs=2,
                                            stream=True)
    streamed = [c for chunk in stream for choice in chunk.choices if choice.logprobs
                for c in choice.logprobs.content]
    assert [c.logprob for c in streamed] == [c.logprob for c in content]


def test_completions_logprobs_json_mode_and_penalties(client: openai.OpenAI, server: LiveServer) -> None:
    out = client.completions.create(model="smollm2-135m", prompt="The capital of France is", max_tokens=6,
                                    temperature=0, logprobs=3, presence_penalty=0.5, frequency_penalty=0.5)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert lp.text_offset[0] == 0 and all(len(t) <= 3 for t in lp.top_logprobs)
    chat = client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=48, temperature=0,
                                          response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    body = {"model": "smollm2-135m", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    for extra in ({"grammar": 'root ::= "yes" | "no"'}, {"guided_choice": ["yes", "no"]}, {"guided_regex": "[0-9]+"},
                  {"json_schema": SCHEMA}, {"repeat_penalty": 1.2, "repeat_last_n": 16}, {"n_probs": 2}):
        reply = httpx.post(server.url + "/v1/chat/completions", json={**body, **extra}, timeout=120)
        assert reply.status_code == 200, (extra, reply.text)


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format"),
    ({"grammar": "root ::= ("}, "grammar"), ({"guided_regex": "a(b"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"), ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"grammar": 'root ::= "a"', "guided_regex": "a"}, "guided_regex"),
    ({"presence_penalty": 5}, "presence_penalty"), ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs")])
def test_invalid_constraints_and_values_are_400s_naming_the_parameter(server: LiveServer, extra: dict,
                                                                      param: str) -> None:
    body = {"model": "smollm2-135m", "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    reply = httpx.post(server.url + "/v1/chat/completions", json={**body, **extra}, timeout=120)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.text
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).status_code == 200
