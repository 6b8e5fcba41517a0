"""Tool calling through a live `edgespec serve` (the official openai and ollama clients, real HTTP) and the bridge, on
the shipped SmolLM2-135M, whose template has no tools (the generic form): a two-round call streamed and not, greedy
speculation equal to the target alone, the errors, and Ollama's ``format`` and ``tools``."""

from __future__ import annotations

import json
import subprocess

import httpx
import jsonschema
import ollama
import openai
import pytest

from edgespec.engine.engine import Engine
from tests.live import LiveServer
from tests.server.test_bridge import ENDINGS, Lines, bridge  # noqa: F401  (the bridge fixture)

MODEL = "smollm2-135m"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = json.dumps({"temperature": 21, "sky": "sunny"})


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _streamed(stream: openai.Stream) -> tuple[str, list[dict], str | None]:
    """A streamed chat's content, tool calls (gathered from their deltas by index) and finish reason."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True])
def test_two_round_tool_call(client: openai.OpenAI, stream: bool) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=64, temperature=0, stream=stream)
    if stream:
        content, calls, finish = _streamed(first)
    else:
        message = first.choices[0].message
        content, finish = message.content or "", first.choices[0].finish_reason
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in message.tool_calls or []]
    assert finish == "tool_calls" and content == "" and len(calls) == 1
    (call,) = calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(json.loads(call["arguments"]), WEATHER)
    # The client sends the call back with its result; the model answers in words.
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                            max_tokens=24, temperature=0, stream=stream)
    if stream:
        content, calls, finish = _streamed(second)
    else:
        content, calls, finish = second.choices[0].message.content, second.choices[0].message.tool_calls or [], \
            second.choices[0].finish_reason
    assert content and calls == [] and finish in ("stop", "length")


def test_speculation_gives_the_target_alone_s_call(client: openai.OpenAI, server: LiveServer,
                                                   solo_engine: Engine) -> None:
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 64,
            "temperature": 0}
    replies = [httpx.post(server.url + "/v1/chat/completions", json={**body, "speculative": {"mode": mode}},
                          timeout=120).json() for mode in ("ngram", "none")]
    spec, alone = ([(c["function"], c["type"]) for c in r["choices"][0]["message"]["tool_calls"]] for r in replies)
    assert spec == alone and replies[0]["usage"]["completion_tokens"] == replies[1]["usage"]["completion_tokens"]
    assert replies[0]["usage"]["speculative"]["mode"] == "ngram"
    reference = solo_engine.chat(ASK, tools=TOOLS, max_tokens=64, mode="none")
    assert [(c.name, c.arguments) for c in reference.tool_calls] == [
        (f["name"], json.loads(f["arguments"])) for f, _ in spec]


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "function", "function": {"parameters": WEATHER}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_bad_tools_are_400s_naming_the_parameter(server: LiveServer, extra: dict, param: str) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, "temperature": 0}
    reply = httpx.post(server.url + "/v1/chat/completions", json={**body, **extra}, timeout=120)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.text
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).status_code == 200


def test_tool_choice_none_and_a_call_cut_by_max_tokens(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none",
                                           max_tokens=8, temperature=0)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    for stream in (False, True):
        cut = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                             max_tokens=6, temperature=0, stream=stream)
        content, calls, finish = _streamed(cut) if stream else (
            cut.choices[0].message.content, cut.choices[0].message.tool_calls, cut.choices[0].finish_reason)
        assert finish == "length" and not calls and content and content.lstrip().startswith("{")
    after = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=64, temperature=0)
    assert after.choices[0].finish_reason == "tool_calls"


def test_ollama_format_and_tools(server: LiveServer) -> None:
    client = ollama.Client(host=server.url, timeout=120)
    greedy = {"temperature": 0, "num_predict": 48}
    as_json = client.chat(model=MODEL, messages=ASK, format="json", options=greedy)
    text = as_json.message.content or ""  # a JSON object, whole unless num_predict cut it
    assert isinstance(json.loads(text), dict) if as_json.done_reason == "stop" else text.lstrip().startswith("{")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    for stream in (False, True):
        parts = client.chat(model=MODEL, messages=ASK, format=schema, options=greedy, stream=stream)
        text = "".join(p.message.content or "" for p in parts) if stream else parts.message.content
        jsonschema.validate(json.loads(text or ""), schema)
    # Ollama's tools carry no tool_choice: "auto", which the generic form answers with a call or words.
    for stream in (False, True):
        reply = client.chat(model=MODEL, messages=ASK, tools=TOOLS, options={**greedy, "num_predict": 64},
                            stream=stream)
        last = list(reply)[-1] if stream else reply
        assert last.done and last.done_reason == "stop"
        (call,) = last.message.tool_calls or []
        assert call.function.name == "get_weather"
        jsonschema.validate(dict(call.function.arguments), WEATHER)
    answer = client.chat(model=MODEL, options={**greedy, "num_predict": 16}, messages=[
        *ASK, {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": call.function.name, "arguments": dict(call.function.arguments)}}]},
        {"role": "tool", "tool_name": "get_weather", "content": RESULT}])
    assert answer.message.content and not answer.message.tool_calls


def test_bridge_chat_with_tools(bridge: tuple[subprocess.Popen[bytes], Lines]) -> None:  # noqa: F811
    _, lines = bridge
    lines.send(id="t", cmd="chat", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=64)
    *tokens, end = lines.until("t", ENDINGS, timeout=120)
    assert end["event"] == "stats" and end["finish_reason"] == "tool_calls" and end["content"] == ""
    assert "".join(e["text"] for e in tokens) == end["text"]  # token events carry the raw text
    (call,) = end["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    lines.send(id="bad", cmd="chat", messages=ASK, tools=TOOLS, tool_choice="maybe")
    error = lines.until("bad", ENDINGS)[-1]
    assert error["event"] == "error" and error["code"] == "invalid_parameter" and "tool_choice" in error["message"]
